//! The deployment artifacts are checked offline: the Dockerfile with hadolint, every core
//! Kubernetes manifest with `kubernetes-validate --strict` against Kubernetes 1.31, the
//! Prometheus Operator objects parsed and their rules run through `promtool check rules`, the
//! shipped tollgate.toml through `tollgate validate`, and the sidecar's nginx.conf served for
//! real in front of tollgate and Redis.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use crate::support::deploy::{self, repo_path, run, text, yaml_documents};
use crate::support::{HttpClient, RedisServer, TempDir, Tollgate};
use serde_json::Value;

/// API groups whose kinds are CRDs (no schema offline): parsed and checked here instead.
const CRD_GROUPS: &[&str] = &["monitoring.coreos.com/"];

fn read(relative: &str) -> String {
    std::fs::read_to_string(repo_path(relative)).unwrap_or_else(|e| panic!("{relative}: {e}"))
}

/// Every Kubernetes object under k8s/ with the file it came from (kustomizations excluded).
fn k8s_objects() -> Vec<(std::path::PathBuf, Value)> {
    deploy::yaml_files(&repo_path("k8s"))
        .into_iter()
        .filter(|path| path.file_name().unwrap() != "kustomization.yaml")
        .flat_map(|path| {
            yaml_documents(&path)
                .into_iter()
                .filter(|doc| doc.get("apiVersion").is_some() && doc.get("kind").is_some())
                .map(move |doc| (path.clone(), doc))
        })
        .collect()
}

fn is_crd(object: &Value) -> bool {
    let api = object["apiVersion"].as_str().unwrap_or("");
    CRD_GROUPS.iter().any(|group| api.starts_with(group))
}

fn ours(path: &Path) -> bool {
    ["base", "sidecar", "standalone", "monitoring"]
        .iter()
        .any(|dir| path.starts_with(repo_path("k8s").join(dir)))
}

fn find<'a>(objects: &'a [(std::path::PathBuf, Value)], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .map(|(_, o)| o)
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} under k8s/"))
}

#[test]
fn dockerfile_passes_hadolint_without_a_finding() {
    let output = run(
        Command::new("hadolint")
            .args(["--failure-threshold", "info"])
            .arg(repo_path("Dockerfile")),
        "",
    );
    assert!(output.status.success(), "hadolint: {}", text(&output));
    assert!(text(&output).trim().is_empty(), "{}", text(&output));
}

#[test]
fn dockerfile_builds_a_small_non_root_image_that_drains_on_sigterm() {
    let dockerfile = read("Dockerfile");
    let instructions: Vec<&str> = dockerfile
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let froms: Vec<&&str> = instructions
        .iter()
        .filter(|l| l.starts_with("FROM "))
        .collect();
    assert_eq!(froms.len(), 2, "a builder stage and a runtime stage");
    assert!(
        froms[1].contains("distroless"),
        "small final image: {}",
        froms[1]
    );
    let user = instructions
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("USER in the final stage");
    let uid: u32 = user
        .split(':')
        .next()
        .unwrap()
        .parse()
        .expect("numeric USER");
    assert_ne!(uid, 0, "non-root");
    assert!(instructions.contains(&"EXPOSE 8080 9090"));
    assert!(instructions.contains(&"STOPSIGNAL SIGTERM"));
    assert!(instructions
        .iter()
        .any(|l| l.starts_with("COPY config/tollgate.toml ")));
    let runtime_copies = instructions
        .iter()
        .skip_while(|l| !l.starts_with("FROM gcr.io/distroless"))
        .filter(|l| l.starts_with("COPY "))
        .count();
    assert_eq!(
        runtime_copies, 3,
        "only the binary, its /bin/ratelimit link and the default config"
    );
    // Envoy Gateway runs envoyproxy/ratelimit's image as /bin/ratelimit.
    assert!(
        instructions
            .iter()
            .any(|l| l.contains("ln -s /usr/local/bin/tollgate /out/bin/ratelimit")),
        "the build stage links /bin/ratelimit to the binary"
    );
    assert!(
        instructions.contains(&"COPY --from=build /out/bin/ /bin/"),
        "the image provides /bin/ratelimit"
    );
}

#[test]
fn dockerignore_admits_exactly_what_the_build_copies() {
    let ignore = read(".dockerignore");
    let rules: Vec<&str> = ignore
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    assert_eq!(
        rules.first(),
        Some(&"*"),
        "everything else (target/, .git) stays out"
    );
    let admitted: Vec<&str> = rules
        .iter()
        .filter_map(|r| r.strip_prefix('!'))
        .map(|r| r.trim_end_matches('/'))
        .collect();
    let dockerfile = read("Dockerfile");
    for copy in dockerfile
        .lines()
        .filter(|l| l.starts_with("COPY ") && !l.contains("--from"))
    {
        let words: Vec<&str> = copy.split_whitespace().collect();
        for source in &words[1..words.len() - 1] {
            let top = source.split('/').next().unwrap();
            assert!(
                admitted.contains(source) || admitted.contains(&top),
                "{source} is copied but excluded by .dockerignore"
            );
        }
    }
}

#[test]
fn every_core_manifest_passes_kubernetes_validate_strict() {
    let objects = k8s_objects();
    let core: Vec<_> = objects.iter().filter(|(_, o)| !is_crd(o)).collect();
    let files: BTreeSet<_> = core.iter().map(|(path, _)| path.clone()).collect();
    assert!(core.len() >= 7, "manifests found: {}", core.len());
    let files: Vec<_> = files.into_iter().collect();
    deploy::assert_kubernetes_valid(&files, core.len());
}

#[test]
fn kustomizations_reference_only_files_that_exist() {
    for path in deploy::yaml_files(&repo_path("k8s"))
        .into_iter()
        .filter(|p| p.file_name().unwrap() == "kustomization.yaml" && ours(p))
    {
        let dir = path.parent().unwrap();
        let kustomization = &yaml_documents(&path)[0];
        assert_eq!(kustomization["kind"], "Kustomization");
        let resources = kustomization["resources"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let generated = ["configMapGenerator", "secretGenerator"]
            .iter()
            .flat_map(|g| kustomization[g].as_array().cloned().unwrap_or_default())
            .flat_map(|g| g["files"].as_array().cloned().unwrap_or_default());
        for entry in resources.iter().chain(generated.collect::<Vec<_>>().iter()) {
            let target = dir.join(entry.as_str().unwrap());
            assert!(
                target.is_file() || target.join("kustomization.yaml").is_file(),
                "{}: {} does not exist",
                path.display(),
                target.display()
            );
        }
    }
}

/// The pod templates of our workloads, by workload name.
fn pod_specs(objects: &[(std::path::PathBuf, Value)]) -> Vec<(String, Value)> {
    objects
        .iter()
        .filter(|(path, o)| ours(path) && o["kind"] == "Deployment")
        .map(|(_, o)| {
            (
                o["metadata"]["name"].as_str().unwrap().to_string(),
                o["spec"]["template"].clone(),
            )
        })
        .collect()
}

#[test]
fn pods_run_hardened_without_service_links_and_are_scraped_on_9090() {
    let objects = k8s_objects();
    let pods = pod_specs(&objects);
    assert_eq!(pods.len(), 2, "the sidecar and the standalone shapes");
    for (name, template) in &pods {
        let spec = &template["spec"];
        assert_eq!(spec["enableServiceLinks"], false, "{name}");
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true, "{name}");
        assert_eq!(
            spec["securityContext"]["seccompProfile"]["type"],
            "RuntimeDefault"
        );
        let annotations = &template["metadata"]["annotations"];
        assert_eq!(annotations["prometheus.io/scrape"], "true", "{name}");
        assert_eq!(annotations["prometheus.io/port"], "9090", "{name}");
        assert_eq!(annotations["prometheus.io/path"], "/metrics", "{name}");
        let containers = spec["containers"].as_array().unwrap().iter();
        let init = spec["initContainers"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        for container in containers.chain(init.iter()) {
            let which = format!("{name}/{}", container["name"]);
            let security = &container["securityContext"];
            assert_eq!(security["readOnlyRootFilesystem"], true, "{which}");
            assert_eq!(security["allowPrivilegeEscalation"], false, "{which}");
            assert_eq!(
                security["capabilities"]["drop"],
                serde_json::json!(["ALL"]),
                "{which}"
            );
            assert!(security["runAsUser"].as_u64().unwrap() > 0, "{which}");
            assert!(
                container["resources"]["requests"]["cpu"].is_string(),
                "{which}"
            );
            assert!(
                container["resources"]["limits"]["memory"].is_string(),
                "{which}"
            );
        }
    }
}

fn tollgate_container(template: &Value) -> (Value, bool) {
    let spec = &template["spec"];
    for (list, is_init) in [("initContainers", true), ("containers", false)] {
        if let Some(found) = spec[list]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["name"] == "tollgate"))
        {
            return (found.clone(), is_init);
        }
    }
    panic!("no tollgate container");
}

#[test]
fn tollgate_containers_read_redis_from_the_secret_and_are_probed() {
    let objects = k8s_objects();
    for (name, template) in pod_specs(&objects) {
        let (container, is_init) = tollgate_container(&template);
        if name == "edge" {
            assert!(is_init, "the sidecar is an init container");
            assert_eq!(
                container["restartPolicy"], "Always",
                "a native sidecar (>= 1.29)"
            );
        }
        let url = container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "TOLLGATE_STORE__URL")
            .expect("TOLLGATE_STORE__URL");
        assert_eq!(url["valueFrom"]["secretKeyRef"]["name"], "tollgate-redis");
        for (probe, path) in [
            ("startupProbe", "/healthz"),
            ("livenessProbe", "/healthz"),
            ("readinessProbe", "/readyz"),
        ] {
            assert_eq!(container[probe]["httpGet"]["path"], path, "{name} {probe}");
        }
        let ports: Vec<_> = container["ports"].as_array().unwrap().iter().collect();
        assert!(ports
            .iter()
            .any(|p| p["name"] == "metrics" && p["containerPort"] == 9090));
        let mount = &container["volumeMounts"][0];
        assert_eq!(mount["mountPath"], "/etc/tollgate");
        assert!(
            mount.get("subPath").is_none(),
            "a subPath mount never sees ConfigMap updates"
        );
    }
}

#[test]
fn the_disruption_budget_and_pod_monitor_select_the_tollgate_pods() {
    let objects = k8s_objects();
    let standalone = find(&objects, "Deployment", "tollgate");
    let labels = &standalone["spec"]["template"]["metadata"]["labels"];
    let pdb = find(&objects, "PodDisruptionBudget", "tollgate");
    for (key, value) in pdb["spec"]["selector"]["matchLabels"].as_object().unwrap() {
        assert_eq!(&labels[key], value, "PDB selector {key}");
    }
    let service = find(&objects, "Service", "tollgate");
    assert_eq!(service["spec"]["ports"][0]["port"], 8080);

    let monitor = find(&objects, "PodMonitor", "tollgate");
    assert_eq!(monitor["apiVersion"], "monitoring.coreos.com/v1");
    let selector = monitor["spec"]["selector"]["matchLabels"]
        .as_object()
        .unwrap();
    let endpoint = &monitor["spec"]["podMetricsEndpoints"][0];
    assert_eq!(endpoint["path"], "/metrics");
    for (name, template) in pod_specs(&objects) {
        for (key, value) in selector {
            assert_eq!(
                &template["metadata"]["labels"][key], value,
                "{name} not scraped"
            );
        }
        let (container, _) = tollgate_container(&template);
        assert!(container["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["name"] == endpoint["port"]));
    }
}

/// Names a running tollgate exports, after one check so every series exists.
fn exported_metric_names() -> BTreeSet<String> {
    let tollgate = Tollgate::start("");
    assert_eq!(tollgate.check(&[]).status, 200);
    deploy::exposed_names(&tollgate.metrics())
}

#[test]
fn alert_rules_pass_promtool_and_use_only_exported_metrics() {
    let objects = k8s_objects();
    let rule = find(&objects, "PrometheusRule", "tollgate");
    assert_eq!(rule["apiVersion"], "monitoring.coreos.com/v1");
    let dir = TempDir::new("rules");
    // `spec` of a PrometheusRule is a plain Prometheus rule file; JSON is valid YAML.
    let file = dir.write("rules.yaml", &rule["spec"].to_string());
    let output = run(
        Command::new("promtool").args(["check", "rules"]).arg(&file),
        "",
    );
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        text(&output).contains("SUCCESS: 4 rules found"),
        "{}",
        text(&output)
    );

    let exported = exported_metric_names();
    for alert in rule["spec"]["groups"][0]["rules"].as_array().unwrap() {
        let expr = alert["expr"].as_str().unwrap();
        let names = deploy::metric_names_in(expr);
        assert!(!names.is_empty(), "{expr}");
        for name in names {
            assert!(exported.contains(&name), "{name} in {expr} is not exported");
        }
    }
}

fn collect_exprs(value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, inner) in map {
                match inner {
                    Value::String(expr) if key == "expr" => out.push(expr.clone()),
                    _ => collect_exprs(inner, out),
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|item| collect_exprs(item, out)),
        _ => {}
    }
}

#[test]
fn grafana_dashboard_is_json_that_queries_only_exported_metrics() {
    let dashboard: Value = serde_json::from_str(&read("k8s/monitoring/grafana-dashboard.json"))
        .expect("the dashboard is valid JSON");
    let mut exprs = Vec::new();
    collect_exprs(&dashboard["panels"], &mut exprs);
    assert!(exprs.len() >= 8, "panels with queries: {}", exprs.len());
    let all: String = exprs.join("\n");
    for wanted in [
        "tollgate_checks_total",
        "tollgate_limit_decisions_total",
        "histogram_quantile(0.99, sum by (le) (rate(tollgate_check_duration_seconds_bucket",
        "tollgate_store_errors_total",
        "tollgate_store_up",
    ] {
        assert!(all.contains(wanted), "the dashboard shows {wanted}");
    }
    let exported = exported_metric_names();
    for expr in &exprs {
        for name in deploy::metric_names_in(expr) {
            assert!(exported.contains(&name), "{name} in {expr} is not exported");
        }
    }
}

#[test]
fn the_kubernetes_tollgate_toml_passes_tollgate_validate() {
    let output = run(
        crate::support::tollgate_command()
            .args(["validate", "--config"])
            .arg(repo_path("k8s/base/tollgate.toml"))
            // As the Secret sets it in the pod.
            .env(
                "TOLLGATE_STORE__URL",
                "redis://:secret@redis.example.internal:6379/0",
            ),
        "",
    );
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains("per-ip"), "{}", text(&output));
}

/// The shared Deployment is called by ingress pods: with the base config's loopback alone,
/// every client would be keyed on an ingress pod's address. Its container names whose
/// `X-Forwarded-For` to believe with a placeholder on which tollgate refuses to start, naming
/// the key, until the operator writes the ingress pods' CIDR there.
#[test]
fn the_standalone_deployment_starts_only_once_told_whom_to_trust() {
    let objects = k8s_objects();
    let standalone = find(&objects, "Deployment", "tollgate");
    let container = &standalone["spec"]["template"]["spec"]["containers"][0];
    let placeholder = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "TOLLGATE_CLIENT_IP__TRUSTED_PROXIES")
        .and_then(|e| e["value"].as_str())
        .expect("the standalone container sets whom to trust");
    let validate = |trusted: &str| {
        run(
            crate::support::tollgate_command()
                .args(["validate", "--config"])
                .arg(repo_path("k8s/base/tollgate.toml"))
                .env(
                    "TOLLGATE_STORE__URL",
                    "redis://:secret@redis.example.internal:6379/0",
                )
                .env("TOLLGATE_CLIENT_IP__TRUSTED_PROXIES", trusted),
            "",
        )
    };
    let refused = validate(placeholder);
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused));
    assert!(
        text(&refused).contains("client_ip.trusted_proxies"),
        "{}",
        text(&refused)
    );
    let replaced = validate(&placeholder.replace("REPLACE-WITH-INGRESS-POD-CIDR", "10.244.0.0/16"));
    assert!(replaced.status.success(), "{}", text(&replaced));
    assert!(
        text(&replaced).contains(r#"trusted ["10.244.0.0/16"]"#),
        "{}",
        text(&replaced)
    );
}

/// An nginx owned by one test, stopped on drop; its scratch directory goes after it.
struct Nginx {
    child: Child,
    _dir: TempDir,
}

impl Drop for Nginx {
    fn drop(&mut self) {
        // SIGTERM, not SIGKILL: the master must take its workers down with it.
        let pid = self.child.id().to_string();
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        if !crate::support::wait_until(Duration::from_secs(5), || {
            self.child.try_wait().is_ok_and(|s| s.is_some())
        }) {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// The shipped sidecar nginx.conf, pointed at test ports and a scratch directory.
fn sidecar_nginx_conf(port: u16, tollgate: &Tollgate, app: u16, dir: &TempDir) -> String {
    let mut conf = read("k8s/sidecar/nginx.conf");
    for (from, to) in [
        (
            "listen 8000;".to_string(),
            format!("listen 127.0.0.1:{port};"),
        ),
        (
            "server 127.0.0.1:8080;".into(),
            format!("server {};", tollgate.addr),
        ),
        (
            "server app.default.svc.cluster.local:80;".into(),
            format!("server 127.0.0.1:{app};"),
        ),
        ("/tmp/".into(), format!("{}/", dir.path().display())),
        ("access_log /dev/stdout;".into(), "access_log off;".into()),
    ] {
        assert!(conf.contains(&from), "nginx.conf no longer has {from:?}");
        conf = conf.replace(&from, &to);
    }
    conf
}

/// The shipped nginx.conf in front of `tollgate`, with a `200 ok` application behind it.
fn start_sidecar_nginx(tollgate: &Tollgate) -> (Nginx, std::net::SocketAddr) {
    let dir = TempDir::new("nginx");
    let port = crate::support::free_port();
    let conf = dir.write(
        "nginx.conf",
        &sidecar_nginx_conf(port, tollgate, deploy::ok_upstream(), &dir),
    );
    let child = Command::new("nginx")
        .args(["-e", "stderr", "-g", "daemon off;", "-p"])
        .arg(dir.path())
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .spawn()
        .expect("nginx is installed (scripts/test.sh)");
    let nginx = Nginx { child, _dir: dir };
    let addr = format!("127.0.0.1:{port}").parse().unwrap();
    assert!(crate::support::wait_until(Duration::from_secs(10), || {
        HttpClient::connect(addr).is_ok()
    }));
    (nginx, addr)
}

#[test]
fn the_sidecar_nginx_conf_hands_tollgate_429_and_headers_to_the_client() {
    let redis = RedisServer::start();
    let tollgate = Tollgate::start_with_env(
        &read("k8s/base/tollgate.toml"),
        &[("TOLLGATE_STORE__URL", &redis.url())],
    );
    let (_nginx, addr) = start_sidecar_nginx(&tollgate);

    let mut client = HttpClient::connect(addr).unwrap();
    let first = client.get("/orders?page=2", &[]).unwrap();
    assert_eq!((first.status, first.body.as_str()), (200, "ok"));
    assert!(first
        .header("ratelimit")
        .unwrap()
        .starts_with("\"per-ip\";r=99;"));
    assert_eq!(
        first.header("ratelimit-policy"),
        Some("\"per-ip\";q=100;w=5")
    );
    assert_eq!(first.header("x-ratelimit-limit"), Some("100"));

    let denied = (0..300)
        .map(|_| client.get("/orders", &[]).unwrap())
        .find(|r| r.status != 200)
        .expect("the burst of 100 runs out");
    assert_eq!(denied.status, 429, "a real 429, not nginx's 500");
    assert_eq!(denied.header("retry-after"), Some("1"));
    assert!(denied
        .header("ratelimit")
        .unwrap()
        .starts_with("\"per-ip\";r=0;"));
    assert_eq!(
        denied.header("ratelimit-policy"),
        Some("\"per-ip\";q=100;w=5")
    );
    assert_eq!(denied.header("x-ratelimit-remaining"), Some("0"));

    // tollgate refuses with the 403 the config asks for, which nginx passes on without
    // turning keep-alive off: the same connection goes on. nginx forwards the client's
    // address: another client has its own bucket.
    assert_ne!(denied.header("connection"), Some("close"));
    // Answered on the same connection: 429, or 200 if the bucket refilled a token (one per
    // 50 ms) before this request reached it.
    let next = client.get("/orders", &[]).unwrap().status;
    assert!(
        matches!(next, 429 | 200),
        "the same connection goes on: {next}"
    );
    let other = HttpClient::connect(addr)
        .unwrap()
        .get("/orders", &[("x-forwarded-for", "198.51.100.9")])
        .unwrap();
    assert_eq!(other.status, 200);
    assert!(other
        .header("ratelimit")
        .unwrap()
        .starts_with("\"per-ip\";r=99;"));
    assert!(tollgate.metric("tollgate_checks_total{result=\"denied\"}") >= 1.0);
}

#[test]
fn the_sidecar_nginx_conf_hands_a_503_to_the_client_when_redis_is_down_and_on_error_denies() {
    let mut redis = RedisServer::start();
    let tollgate = Tollgate::start_with_env(
        &read("k8s/base/tollgate.toml"),
        &[
            ("TOLLGATE_STORE__URL", &redis.url()),
            ("TOLLGATE_STORE__ON_ERROR", "deny"),
        ],
    );
    let (_nginx, addr) = start_sidecar_nginx(&tollgate);
    assert_eq!(
        HttpClient::connect(addr)
            .unwrap()
            .get("/", &[])
            .unwrap()
            .status,
        200
    );

    redis.kill();
    let refused = HttpClient::connect(addr).unwrap().get("/", &[]).unwrap();
    assert_eq!(refused.status, 503, "fail closed, visibly, not nginx's 500");
    assert_eq!(refused.header("retry-after"), Some("1"));
    assert!(refused.header("ratelimit").is_none());
}
