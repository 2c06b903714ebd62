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
use crate::support::{assert_denied, HttpClient, RedisServer, TempDir, Tollgate};
use serde_json::Value;

mod kubernetes;
mod sidecar_nginx;

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
