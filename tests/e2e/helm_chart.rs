//! The Helm chart (`charts/tollgate`), offline: Helm v4 as a library lints it strictly and
//! renders every mode; each rendered object passes `kubernetes-validate --strict`; the
//! standalone and sidecar modes carry the containers the kustomize overlays carry (`kubectl
//! kustomize`); the rendered configs pass `tollgate validate`; the README's values table is
//! the one `values.yaml` gives.

use std::collections::BTreeSet;
use std::process::Command;

use crate::support::deploy::{assert_kubernetes_valid, repo_path, run, text, yaml_documents};
use crate::support::TempDir;
use serde_json::{json, Value};

/// The ingress pods' CIDR the standalone mode is given, as `k8s/standalone` spells its
/// placeholder (the overlay's container and the chart's are compared).
const INGRESS_CIDR: &str = "REPLACE-WITH-INGRESS-POD-CIDR";

/// The standalone mode's values but for `more`: the one value it cannot render without.
fn standalone(more: Value) -> Value {
    let mut values = json!({"clientIp": {"trustedProxies": [INGRESS_CIDR]}});
    for (key, value) in more.as_object().expect("a map") {
        values[key] = value.clone();
    }
    values
}

/// A rule file for the ratelimit mode, as envoyproxy/ratelimit reads it.
const ERL_RULES: &str = "domain: edge\ndescriptors:\n  - key: tenant\n    rate_limit:\n      unit: minute\n      requests_per_unit: 2\n";

/// What the chart renders for these values: (lint report, objects, notes).
struct Rendered {
    lint: Value,
    objects: Vec<Value>,
    notes: String,
}

fn render(values: &Value) -> Rendered {
    let output = run(
        Command::new("python3")
            .arg(repo_path("tests/python/helm_chart.py"))
            .arg(repo_path("charts/tollgate"))
            .arg(values.to_string()),
        "",
    );
    assert!(output.status.success(), "{}", text(&output));
    let mut out: Value = serde_json::from_slice(&output.stdout).expect("JSON");
    let objects = out["objects"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .map(|o| o["object"].take())
        .collect();
    Rendered {
        lint: out["lint"].take(),
        objects,
        notes: out["notes"].as_str().unwrap_or_default().to_string(),
    }
}

/// Every mode, with every optional object turned on somewhere.
fn every_mode() -> Vec<(&'static str, Value)> {
    let monitoring = json!({
        "podMonitor": {"enabled": true},
        "prometheusRule": {"enabled": true},
        "dashboard": {"enabled": true},
    });
    vec![
        ("standalone (defaults)", standalone(json!({}))),
        (
            "standalone, everything on",
            standalone(json!({
                "grpc": {"enabled": true},
                "adminToken": {"existingSecret": "tollgate-admin"},
                "autoscaling": {"enabled": true},
                "networkPolicy": {"enabled": true, "from": [{"podSelector": {"matchLabels": {"app": "ingress"}}}]},
                "monitoring": {"serviceMonitor": {"enabled": true}, "prometheusRule": {"enabled": true}, "dashboard": {"enabled": true}},
            })),
        ),
        (
            "ratelimit",
            json!({
                "mode": "ratelimit",
                "redis": {"authKey": "auth"},
                "ratelimit": {"rules": {"edge.yaml": ERL_RULES}},
                "networkPolicy": {"enabled": true},
                "monitoring": monitoring,
            }),
        ),
        (
            "sidecar",
            json!({"mode": "sidecar", "monitoring": monitoring}),
        ),
    ]
}

fn find<'a>(objects: &'a [Value], kind: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind)
        .unwrap_or_else(|| panic!("no {kind} rendered"))
}

#[test]
fn the_chart_lints_strictly_in_every_mode() {
    for (mode, values) in every_mode() {
        let lint = render(&values).lint;
        assert_eq!(lint["errors"], json!([]), "{mode}: {lint}");
        // Severity 2 is a warning, 3 an error; `--strict` fails on both. 1 is information
        // ("icon is recommended").
        let findings: Vec<_> = lint["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["severity"].as_u64().unwrap_or(3) >= 2)
            .collect();
        assert!(findings.is_empty(), "{mode}: {findings:?}");
    }
}

/// The chart's output for `values`, or why it refused them: (succeeded, stdout and stderr).
fn try_render(values: &Value) -> (bool, String) {
    let output = run(
        Command::new("python3")
            .arg(repo_path("tests/python/helm_chart.py"))
            .arg(repo_path("charts/tollgate"))
            .arg(values.to_string()),
        "",
    );
    (output.status.success(), text(&output))
}

/// Behind an ingress, tollgate's caller is an ingress pod: trusting only loopback (the
/// chart's config) would key every client on that pod's address, one `per-ip` bucket for
/// all. The standalone mode refuses to render until told whom to trust, unless the config
/// is the user's own; the sidecar mode (called over loopback) renders as it is.
#[test]
fn the_standalone_mode_refuses_to_trust_only_loopback_behind_an_ingress() {
    let (rendered, says) = try_render(&json!({}));
    assert!(!rendered, "the defaults rendered");
    assert!(
        says.contains("clientIp.trustedProxies") && says.contains("CIDR"),
        "{says}"
    );
    for own in [
        json!({"config": {"existingConfigMap": "mine"}}),
        json!({"config": {"toml": "[client_ip]\nfrom = \"peer\"\n"}}),
        json!({"mode": "sidecar"}),
    ] {
        let (rendered, says) = try_render(&own);
        assert!(rendered, "{own}: {says}");
    }

    let cidr = ["10.244.0.0/16", "fd00:10:244::/56"];
    let rendered = render(&json!({"clientIp": {"trustedProxies": cidr}}));
    let deployment = find(&rendered.objects, "Deployment");
    let container = tollgate_in(&deployment["spec"]["template"]["spec"], "containers");
    let env = container["env"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "TOLLGATE_CLIENT_IP__TRUSTED_PROXIES")
        .expect("the CIDRs given to the container");
    let value = env["value"].as_str().unwrap();
    assert!(
        rendered.notes.contains("10.244.0.0/16"),
        "the notes say whom it trusts: {}",
        rendered.notes
    );
    // tollgate reads them so, over the config's loopback.
    let toml = find(&rendered.objects, "ConfigMap")["data"]["tollgate.toml"]
        .as_str()
        .unwrap()
        .to_string();
    let dir = TempDir::new("helm-trusted");
    let output = run(
        crate::support::tollgate_command()
            .args(["validate", "--config"])
            .arg(dir.write("tollgate.toml", &toml))
            .env("TOLLGATE_CLIENT_IP__TRUSTED_PROXIES", value),
        "",
    );
    assert!(output.status.success(), "{}", text(&output));
    assert!(
        text(&output).contains(r#"trusted ["10.244.0.0/16", "fd00:10:244::/56"]"#),
        "{}",
        text(&output)
    );
}

#[test]
fn values_outside_the_schema_are_refused() {
    for (values, says) in [
        (json!({"mode": "proxy"}), "/mode"),
        (json!({"replicas": 3}), "replicas"),
        (json!({"ports": {"http": 0}}), "/ports/http"),
    ] {
        let output = run(
            Command::new("python3")
                .arg(repo_path("tests/python/helm_chart.py"))
                .arg(repo_path("charts/tollgate"))
                .arg(values.to_string()),
            "",
        );
        assert!(!output.status.success(), "{values} rendered");
        assert!(text(&output).contains(says), "{values}: {}", text(&output));
    }
}

#[test]
fn every_rendered_object_passes_kubernetes_validate_strict() {
    let dir = TempDir::new("helm-validate");
    let mut files = Vec::new();
    for (index, (mode, values)) in every_mode().into_iter().enumerate() {
        for (n, object) in render(&values).objects.iter().enumerate() {
            let api = object["apiVersion"].as_str().unwrap();
            if api.starts_with("monitoring.coreos.com/") {
                // CRDs have no schema offline: their shape is checked below.
                assert!(object["spec"].is_object(), "{mode}: {object}");
                continue;
            }
            let name = format!("{index}-{n}.json");
            files.push(dir.write(&name, &object.to_string()));
        }
    }
    assert!(files.len() >= 15, "objects: {}", files.len());
    assert_kubernetes_valid(&files, files.len());
}

/// What `kubectl kustomize` makes of an overlay.
fn kustomize(overlay: &str) -> Vec<Value> {
    let output = run(
        Command::new("kubectl")
            .arg("kustomize")
            .arg(repo_path(overlay)),
        "",
    );
    assert!(output.status.success(), "{}", text(&output));
    let dir = TempDir::new("kustomize");
    yaml_documents(&dir.write("out.yaml", &String::from_utf8_lossy(&output.stdout)))
}

/// The fields of a container that decide how it runs.
fn essentials(container: &Value) -> Value {
    let fields = [
        "name",
        "args",
        "env",
        "ports",
        "startupProbe",
        "livenessProbe",
        "readinessProbe",
        "lifecycle",
        "resources",
        "securityContext",
        "restartPolicy",
    ];
    let mut out = serde_json::Map::new();
    for field in fields {
        out.insert(field.into(), container[field].clone());
    }
    let mounts: Vec<_> = container["volumeMounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| json!({"mountPath": m["mountPath"], "readOnly": m["readOnly"]}))
        .collect();
    out.insert("volumeMounts".into(), json!(mounts));
    Value::Object(out)
}

fn tollgate_in(pod_spec: &Value, list: &str) -> Value {
    pod_spec[list]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["name"] == "tollgate"))
        .cloned()
        .unwrap_or_else(|| panic!("no tollgate in {list}"))
}

#[test]
fn the_standalone_mode_renders_what_the_kustomize_overlay_renders() {
    let chart = render(&standalone(json!({}))).objects;
    let kustomized = kustomize("k8s/standalone");
    let ours = find(&chart, "Deployment");
    let theirs = find(&kustomized, "Deployment");
    assert_eq!(
        essentials(&tollgate_in(
            &ours["spec"]["template"]["spec"],
            "containers"
        )),
        essentials(&tollgate_in(
            &theirs["spec"]["template"]["spec"],
            "containers"
        )),
    );
    for field in [
        "securityContext",
        "enableServiceLinks",
        "automountServiceAccountToken",
        "terminationGracePeriodSeconds",
    ] {
        assert_eq!(
            ours["spec"]["template"]["spec"][field], theirs["spec"]["template"]["spec"][field],
            "pod {field}"
        );
    }
    assert_eq!(ours["spec"]["strategy"], theirs["spec"]["strategy"]);
    assert_eq!(ours["spec"]["replicas"], theirs["spec"]["replicas"]);
    let annotations = &ours["spec"]["template"]["metadata"]["annotations"];
    for key in [
        "prometheus.io/scrape",
        "prometheus.io/port",
        "prometheus.io/path",
    ] {
        assert_eq!(
            annotations[key], theirs["spec"]["template"]["metadata"]["annotations"][key],
            "{key}"
        );
    }
    assert_eq!(
        find(&chart, "Service")["spec"]["ports"],
        find(&kustomized, "Service")["spec"]["ports"]
    );
    assert_eq!(
        find(&chart, "PodDisruptionBudget")["spec"]["maxUnavailable"],
        find(&kustomized, "PodDisruptionBudget")["spec"]["maxUnavailable"]
    );
}

/// The ingress-nginx values the sidecar mode's notes print, as YAML.
fn sidecar_values(notes: &str) -> Value {
    let (_, values) = notes
        .split_once("# ingress-nginx values:")
        .expect("the notes print ingress-nginx values");
    let dir = TempDir::new("sidecar-values");
    yaml_documents(&dir.write("values.yaml", values))
        .pop()
        .expect("one document")
}

#[test]
fn the_sidecar_notes_carry_the_kustomize_sidecar_container() {
    let rendered = render(&json!({"mode": "sidecar"}));
    let values = sidecar_values(&rendered.notes);
    let ours = &values["controller"]["extraInitContainers"][0];
    let edge = kustomize("k8s/sidecar")
        .into_iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the edge Deployment");
    let theirs = tollgate_in(&edge["spec"]["template"]["spec"], "initContainers");
    assert_eq!(essentials(ours), essentials(&theirs));
    // The volume the container mounts is the ConfigMap the chart rendered.
    let config_map = find(&rendered.objects, "ConfigMap");
    assert_eq!(
        values["controller"]["extraVolumes"][0]["configMap"]["name"],
        config_map["metadata"]["name"]
    );
    assert!(
        !rendered.objects.iter().any(|o| o["kind"] == "Deployment"),
        "the sidecar mode installs no workload of its own"
    );
}

#[test]
fn the_alerts_and_dashboard_are_the_kustomize_ones() {
    let rendered = render(&standalone(
        json!({"monitoring": {"prometheusRule": {"enabled": true}, "dashboard": {"enabled": true}}}),
    ));
    let rule = yaml_documents(&repo_path("k8s/monitoring/prometheusrule.yaml")).remove(0);
    assert_eq!(
        find(&rendered.objects, "PrometheusRule")["spec"],
        rule["spec"]
    );
    let dashboard = rendered
        .objects
        .iter()
        .find(|o| o["kind"] == "ConfigMap" && o["data"]["tollgate.json"].is_string())
        .expect("the dashboard ConfigMap");
    let ours: Value =
        serde_json::from_str(dashboard["data"]["tollgate.json"].as_str().unwrap()).unwrap();
    let theirs: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_path("k8s/monitoring/grafana-dashboard.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(ours, theirs);
    assert_eq!(dashboard["metadata"]["labels"]["grafana_dashboard"], "1");
}

#[test]
fn the_rendered_configs_pass_tollgate_validate() {
    // standalone: tollgate.toml with the URL the Secret gives.
    let rendered = render(&standalone(json!({})));
    let toml = find(&rendered.objects, "ConfigMap")["data"]["tollgate.toml"]
        .as_str()
        .unwrap()
        .to_string();
    let dir = TempDir::new("helm-config");
    let output = run(
        crate::support::tollgate_command()
            .args(["validate", "--config"])
            .arg(dir.write("tollgate.toml", &toml))
            .env(
                "TOLLGATE_STORE__URL",
                "redis://:secret@redis.example.internal:6379/0",
            ),
        "",
    );
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains("per-ip"), "{}", text(&output));

    // ratelimit: the container's own environment, the rules where it mounts them.
    let rendered =
        render(&json!({"mode": "ratelimit", "ratelimit": {"rules": {"edge.yaml": ERL_RULES}}}));
    let deployment = find(&rendered.objects, "Deployment");
    let container = tollgate_in(&deployment["spec"]["template"]["spec"], "containers");
    let mount = container["volumeMounts"][0]["mountPath"].as_str().unwrap();
    let rules = find(&rendered.objects, "ConfigMap")["data"]["edge.yaml"]
        .as_str()
        .unwrap()
        .to_string();
    let root = TempDir::new("helm-erl");
    let config_dir = root.path().join(mount.trim_start_matches('/'));
    std::fs::create_dir_all(&config_dir).unwrap();
    std::fs::write(config_dir.join("edge.yaml"), rules).unwrap();
    let mut command = crate::support::tollgate_command();
    command.arg("validate");
    for var in container["env"].as_array().unwrap() {
        let name = var["name"].as_str().unwrap();
        let value = match (name, var["value"].as_str()) {
            ("RUNTIME_ROOT", Some(root_dir)) => root
                .path()
                .join(root_dir.trim_start_matches('/'))
                .display()
                .to_string(),
            (_, Some(value)) => value.to_string(),
            // From the Secret.
            ("REDIS_URL", None) => "redis.example.internal:6379".to_string(),
            (other, None) => panic!("{other} from a source the test does not fill"),
        };
        command.env(name, value);
    }
    let output = run(&mut command, "");
    assert!(output.status.success(), "{}", text(&output));
    assert!(text(&output).contains("edge"), "{}", text(&output));
}

#[test]
fn the_readme_values_table_is_the_one_values_yaml_gives() {
    let output = run(
        Command::new("python3")
            .arg(repo_path("tests/python/helm_chart.py"))
            .arg("--values-table")
            .arg(repo_path("charts/tollgate")),
        "",
    );
    assert!(output.status.success(), "{}", text(&output));
    let table = String::from_utf8_lossy(&output.stdout);
    let readme = std::fs::read_to_string(repo_path("charts/tollgate/README.md")).unwrap();
    assert!(
        readme.contains(table.trim()),
        "charts/tollgate/README.md's table differs from values.yaml: regenerate it with\n\
         python3 tests/python/helm_chart.py --values-table charts/tollgate"
    );
    let rows: BTreeSet<_> = table.lines().skip(2).collect();
    assert!(rows.len() >= 40, "rows: {}", rows.len());
}
