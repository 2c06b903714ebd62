//! The ingress examples that cannot run here as they ship: the ingress-nginx Ingress (no
//! cluster); and the shape of the Envoy ext_authz config, which `envoy.rs` also runs in a
//! real Envoy.
//!
//! The Ingress's snippets are run for real: spliced into an nginx config shaped like the one
//! ingress-nginx generates for `auth-url` (its auth location's headers, `auth_request` in the
//! Ingress's location), in front of tollgate and a counting backend.

use crate::support::proxies::scenarios::{
    assert_denied_with_quota_headers, assert_path_and_method_limit, Stack, API_WRITES_BURST_1,
    PER_IP_BURST_2,
};
use crate::support::proxies::{read_shipped, yaml_text as text, Nginx};
use serde_yaml::Value;

fn yaml(relative: &str) -> Value {
    serde_yaml::from_str(&read_shipped(relative))
        .unwrap_or_else(|e| panic!("{relative} is not valid YAML: {e}"))
}

fn ingress_nginx_stack(on_error: &str, limits: &str) -> Stack<Nginx> {
    Stack::start(on_error, limits, |tollgate, backend| {
        Nginx::start_ingress_nginx(tollgate, backend)
    })
}

#[test]
fn the_ingress_nginx_example_turns_a_denial_into_a_real_429_with_quota_headers() {
    let stack = ingress_nginx_stack("deny", PER_IP_BURST_2);
    for remaining in [1, 0] {
        let allowed = stack.get("/", &[]);
        assert_eq!(allowed.status, 200, "{allowed:?}");
        let ratelimit = allowed.header("ratelimit").unwrap_or_default();
        assert!(
            ratelimit.starts_with(&format!("\"per-ip\";r={remaining};")),
            "{allowed:?}"
        );
    }
    assert_denied_with_quota_headers(&stack.get("/", &[]), "per-ip");
    assert_eq!(stack.backend.count(), 2);
}

#[test]
fn the_ingress_nginx_example_keeps_clients_from_dodging_a_matched_limit() {
    assert_path_and_method_limit(&ingress_nginx_stack("deny", API_WRITES_BURST_1));
}

#[test]
fn the_ingress_nginx_example_fails_closed_when_tollgate_is_unreachable() {
    let mut stack = ingress_nginx_stack("deny", PER_IP_BURST_2);
    assert_eq!(stack.get("/", &[]).status, 200);
    stack.stop_tollgate();
    assert_eq!(stack.get("/", &[]).status, 503);
    assert_eq!(stack.backend.count(), 1);
}

#[test]
fn the_ingress_nginx_example_is_one_valid_networking_v1_ingress() {
    let ingress = yaml("k8s/ingress-nginx/ingress.yaml");
    assert_eq!(text(&ingress, &["apiVersion"]), "networking.k8s.io/v1");
    assert_eq!(text(&ingress, &["kind"]), "Ingress");
    assert_eq!(text(&ingress, &["spec", "ingressClassName"]), "nginx");
    // Offline validation against the Kubernetes 1.31 schema.
    let output = std::process::Command::new("kubernetes-validate")
        .args(["-k", "1.31.0", "--strict"])
        .arg(crate::support::proxies::repo_path(
            "k8s/ingress-nginx/ingress.yaml",
        ))
        .output()
        .expect("`kubernetes-validate` is not installed: run scripts/test.sh, which installs it");
    assert!(
        output.status.success(),
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The Envoy config: the client's own held ids removed, then ext_authz, before the router;
/// fail-open, the quota headers allowed through on both answers, and the cluster it names
/// defined.
#[test]
fn the_envoy_config_has_the_ext_authz_filter_tollgate_needs() {
    let envoy = yaml("config/envoy/envoy.yaml");
    let resources = &envoy["static_resources"];
    let manager = &resources["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"];
    assert_eq!(manager["use_remote_address"], Value::Bool(true));
    let filters = manager["http_filters"].as_sequence().expect("http_filters");
    let names: Vec<&str> = filters.iter().filter_map(|f| f["name"].as_str()).collect();
    assert_eq!(
        names,
        [
            "envoy.filters.http.header_mutation",
            "envoy.filters.http.ext_authz",
            "envoy.filters.http.router"
        ]
    );

    let authz = &filters[1]["typed_config"];
    assert_eq!(
        text(authz, &["@type"]),
        "type.googleapis.com/envoy.extensions.filters.http.ext_authz.v3.ExtAuthz"
    );
    assert_eq!(authz["failure_mode_allow"], Value::Bool(true));
    let service = &authz["http_service"];
    assert_eq!(text(service, &["path_prefix"]), "/check");
    let patterns = |node: &Value| -> Vec<String> {
        node["patterns"]
            .as_sequence()
            .expect("patterns")
            .iter()
            .filter_map(|p| {
                p["exact"]
                    .as_str()
                    .or(p["prefix"].as_str())
                    .map(str::to_string)
            })
            .collect()
    };
    let request = patterns(&authz["allowed_headers"]);
    assert!(
        request.contains(&"x-forwarded-for".to_string()),
        "{request:?}"
    );
    let on_deny = patterns(&service["authorization_response"]["allowed_client_headers"]);
    for header in [
        "content-type",
        "retry-after",
        "ratelimit",
        "ratelimit-policy",
        "x-ratelimit-",
    ] {
        assert!(
            on_deny.iter().any(|p| p == header),
            "{header} on denials: {on_deny:?}"
        );
    }
    let on_success =
        patterns(&service["authorization_response"]["allowed_client_headers_on_success"]);
    for header in ["ratelimit", "ratelimit-policy"] {
        assert!(
            on_success.iter().any(|p| p == header),
            "{header} on success: {on_success:?}"
        );
    }

    let cluster = text(service, &["server_uri", "cluster"]);
    let clusters: Vec<&str> = resources["clusters"]
        .as_sequence()
        .expect("clusters")
        .iter()
        .filter_map(|c| c["name"].as_str())
        .collect();
    assert!(clusters.contains(&cluster), "{cluster} not in {clusters:?}");
}

/// The ingress docs: the index, then each proxy's page in the order it lists them, which is
/// the order of the code blocks the test below expects.
const INGRESS_DOCS: [&str; 9] = [
    "docs/INGRESS.md",
    "docs/ingress/nginx.md",
    "docs/ingress/traefik.md",
    "docs/ingress/ingress-nginx.md",
    "docs/ingress/envoy-ext-authz.md",
    "docs/ingress/envoy-ratelimit.md",
    "docs/ingress/envoy-rlqs.md",
    "docs/ingress/envoy-gateway.md",
    "docs/ingress/leases-and-reservations.md",
];

/// The fenced code blocks of `lang` in the ingress docs, in order: those at the start of a
/// line. An indented block (inside a list item) is an illustration, not a shipped config.
fn doc_blocks(lang: &str) -> Vec<String> {
    for entry in std::fs::read_dir(crate::support::proxies::repo_path("docs/ingress"))
        .expect("docs/ingress/")
    {
        let name = entry.expect("a page").file_name();
        let page = format!("docs/ingress/{}", name.to_string_lossy());
        assert!(
            INGRESS_DOCS.contains(&page.as_str()),
            "{page} is not in INGRESS_DOCS"
        );
    }
    let doc = INGRESS_DOCS.map(read_shipped).join("\n");
    let fence = format!("\n```{lang}\n");
    doc.split(&fence)
        .skip(1)
        .map(|rest| rest.split("```").next().unwrap_or_default().to_string())
        .collect()
}

/// A config's lines without comments, trailing comments or spacing differences.
fn directive_lines(config: &str) -> Vec<String> {
    config
        .lines()
        .map(|line| {
            let line = line.split(" #").next().unwrap_or_default();
            line.split_whitespace().collect::<Vec<_>>().join(" ")
        })
        .filter(|line| !line.is_empty() && !line.starts_with('#'))
        .collect()
}

fn assert_doc_lines_are_shipped(doc_block: &str, shipped: &str) {
    let shipped = directive_lines(&read_shipped(shipped));
    for line in directive_lines(doc_block) {
        assert!(
            shipped.contains(&line),
            "the ingress docs show {line:?}, which is not in the shipped file"
        );
    }
}

#[test]
fn the_configs_shown_in_the_docs_are_the_shipped_ones() {
    let nginx = doc_blocks("nginx");
    assert_eq!(nginx.len(), 1);
    assert_doc_lines_are_shipped(&nginx[0], "config/nginx/tollgate.conf");
    assert_eq!(
        directive_lines(&nginx[0]).len(),
        directive_lines(&read_shipped("config/nginx/tollgate.conf")).len(),
        "the docs show the whole nginx config"
    );
    let yaml_blocks = doc_blocks("yaml");
    assert_eq!(
        yaml_blocks.len(),
        4,
        "Traefik static, Traefik dynamic, Envoy ext_authz filter, Envoy ratelimit filter"
    );
    assert_doc_lines_are_shipped(&yaml_blocks[0], "config/traefik/traefik.yml");
    assert_doc_lines_are_shipped(&yaml_blocks[1], "config/traefik/dynamic.yml");
    let shown: Value = serde_yaml::from_str(&yaml_blocks[2]).expect("the Envoy snippet parses");
    let envoy = yaml("config/envoy/envoy.yaml");
    let shipped = &envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]
        ["typed_config"]["http_filters"];
    for at in 0..2 {
        assert_eq!(
            &shown[at], &shipped[at],
            "the Envoy filters in the docs are the shipped ones"
        );
    }
    let shown: Value =
        serde_yaml::from_str(&yaml_blocks[3]).expect("the Envoy ratelimit snippet parses");
    let ratelimit = yaml("config/envoy/ratelimit.yaml");
    let shipped = find_named(&ratelimit, "envoy.filters.http.ratelimit")
        .expect("the shipped ratelimit config has the filter");
    assert_eq!(
        &shown[0], shipped,
        "the Envoy ratelimit filter in the docs is the shipped one"
    );
}

/// The first mapping anywhere in `value` whose `name` is `name`.
fn find_named<'a>(value: &'a Value, name: &str) -> Option<&'a Value> {
    match value {
        Value::Mapping(map) => {
            if map.get("name").and_then(Value::as_str) == Some(name) {
                return Some(value);
            }
            map.values().find_map(|v| find_named(v, name))
        }
        Value::Sequence(items) => items.iter().find_map(|v| find_named(v, name)),
        _ => None,
    }
}
