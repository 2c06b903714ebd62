use std::io::Write as _;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::keys::{nginx_key, KeyError};
use super::translate::{go_duration_secs, rate_per};
use super::*;
use tollgate_core::config::Config;
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::policy::Policy;

static FILES: AtomicUsize = AtomicUsize::new(0);

/// Writes `text` to a fresh temporary file and returns its path.
fn file(text: &str, ext: &str) -> std::path::PathBuf {
    let n = FILES.fetch_add(1, Ordering::Relaxed);
    let path =
        std::env::temp_dir().join(format!("tollgate-ingress-{}-{n}.{ext}", std::process::id()));
    let mut f = std::fs::File::create(&path).expect("temp file");
    f.write_all(text.as_bytes()).expect("write");
    path
}

fn ingress(name: &str, annotations: &[(&str, &str)], rules: &str) -> String {
    let mut text = format!(
        "apiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: {name}\n  namespace: shop\n  annotations:\n"
    );
    for (key, value) in annotations {
        text.push_str(&format!(
            "    nginx.ingress.kubernetes.io/{key}: \"{value}\"\n"
        ));
    }
    text.push_str("spec:\n");
    text.push_str(rules);
    text
}

const API_RULES: &str = "  rules:\n  - host: api.example.com\n    http:\n      paths:\n      - path: /v1\n        pathType: Prefix\n        backend:\n          service:\n            name: api\n            port:\n              number: 80\n";

fn convert(yaml: &str) -> Imported {
    let path = file(yaml, "yaml");
    let imported = import(&[&path], None, DEFAULT_PREFIX).expect("converts");
    let _ = std::fs::remove_file(path);
    imported
}

fn refuse(yaml: &str) -> IngressImportError {
    let path = file(yaml, "yaml");
    let error = import(&[&path], None, DEFAULT_PREFIX).expect_err("refused");
    let _ = std::fs::remove_file(path);
    error
}

/// The TOML loaded through the real config loader and compiled, as `validate` does.
fn load(toml: &str) -> (Config, Policy) {
    let path = file(toml, "toml");
    let config = Config::load(Some(&path)).unwrap_or_else(|e| panic!("{e}\n{toml}"));
    let _ = std::fs::remove_file(path);
    let policy = Policy::compile(&config, &Metrics::new()).unwrap_or_else(|e| panic!("{e}"));
    (config, policy)
}

#[test]
fn limit_rps_is_per_client_ip_with_burst_five_times_the_limit_by_default() {
    let out = convert(&ingress("api", &[("limit-rps", "10")], API_RULES));
    let (config, _) = load(&out.output);
    let limit = &config.limits[0];
    assert_eq!(limit.name, "shop-api-rps");
    assert_eq!(limit.key, vec!["ip".to_string()]);
    assert_eq!(limit.burst, 50);
    assert_eq!(limit.rate.per_second().unwrap(), 10.0);
}

#[test]
fn limit_rpm_refills_per_minute_and_the_multiplier_scales_the_burst() {
    let out = convert(&ingress(
        "api",
        &[("limit-rpm", "120"), ("limit-burst-multiplier", "3")],
        API_RULES,
    ));
    let (config, _) = load(&out.output);
    let limit = &config.limits[0];
    assert_eq!(limit.name, "shop-api-rpm");
    assert_eq!(limit.burst, 360);
    assert_eq!(limit.rate.per_second().unwrap(), 2.0);
}

#[test]
fn limit_rps_and_limit_rpm_together_both_apply() {
    let out = convert(&ingress(
        "api",
        &[("limit-rps", "5"), ("limit-rpm", "100")],
        API_RULES,
    ));
    let (config, policy) = load(&out.output);
    let names: Vec<&str> = config.limits.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["shop-api-rps", "shop-api-rpm"]);
    // Neither has a condition the other lacks: a request in scope draws from both.
    assert_eq!(policy.limits.len(), 2);
    assert!(config.limits.iter().all(|l| l.key == ["ip"]));
}

#[test]
fn limits_are_scoped_to_the_ingress_hosts_and_paths() {
    let rules = "  rules:\n  - host: api.example.com\n    http:\n      paths:\n      - path: /v1\n        pathType: Prefix\n        backend: {}\n  - host: www.example.com\n    http:\n      paths:\n      - path: /v1\n        pathType: Prefix\n        backend: {}\n";
    let out = convert(&ingress("api", &[("limit-rps", "1")], rules));
    let (config, _) = load(&out.output);
    let matching = &config.limits[0].matching;
    assert_eq!(matching.hosts, ["api.example.com", "www.example.com"]);
    assert_eq!(matching.path_prefix.as_deref(), Some("/v1"));
}

#[test]
fn an_ingress_with_several_paths_gets_a_limit_per_path_and_says_so() {
    let rules = "  rules:\n  - host: api.example.com\n    http:\n      paths:\n      - path: /a\n        pathType: Prefix\n        backend: {}\n      - path: /b\n        pathType: Exact\n        backend: {}\n";
    let out = convert(&ingress("api", &[("limit-rps", "1")], rules));
    let (config, _) = load(&out.output);
    let prefixes: Vec<_> = config
        .limits
        .iter()
        .map(|l| l.matching.path_prefix.clone().unwrap())
        .collect();
    assert_eq!(prefixes, ["/a", "/b"]);
    assert!(out.notes.iter().any(|n| n.contains("one limit per path")));
    assert!(out.notes.iter().any(|n| n.contains("Exact")));
}

#[test]
fn limit_whitelist_becomes_an_exempt_rule_of_those_cidrs_in_the_same_scope() {
    let out = convert(&ingress(
        "api",
        &[
            ("limit-rps", "1"),
            ("limit-whitelist", "10.0.0.0/8, 192.168.1.7"),
        ],
        API_RULES,
    ));
    let (config, _) = load(&out.output);
    let rule = &config.exempt[0];
    let cidrs: Vec<String> = rule.cidrs.iter().map(ToString::to_string).collect();
    assert_eq!(cidrs, ["10.0.0.0/8", "192.168.1.7/32"]);
    assert_eq!(rule.hosts, ["api.example.com"]);
    assert_eq!(rule.path_prefix.as_deref(), Some("/v1"));
}

#[test]
fn the_default_503_becomes_429_and_the_change_is_named() {
    let out = convert(&ingress("api", &[("limit-rps", "1")], API_RULES));
    let (config, _) = load(&out.output);
    assert_eq!(config.response.deny_status, 429);
    assert!(out
        .output
        .contains("was 503: clients that got 503 now get 429"));
    assert!(out.notes.iter().any(|n| n.contains("503")));
}

#[test]
fn a_4xx_limit_req_status_code_is_kept_as_deny_status() {
    let out = convert(&ingress(
        "api",
        &[("limit-rps", "1"), ("limit-req-status-code", "420")],
        API_RULES,
    ));
    let (config, _) = load(&out.output);
    assert_eq!(config.response.deny_status, 420);
    assert!(out.notes.is_empty(), "{:?}", out.notes);
}

#[test]
fn the_controller_configmap_status_code_is_read() {
    let yaml = format!(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ingress-nginx-controller\n  namespace: ingress-nginx\ndata:\n  limit-req-status-code: \"429\"\n---\n{}",
        ingress("api", &[("limit-rps", "1")], API_RULES)
    );
    let out = convert(&yaml);
    let (config, _) = load(&out.output);
    assert_eq!(config.response.deny_status, 429);
    assert!(out.notes.is_empty(), "{:?}", out.notes);
}

#[test]
fn global_rate_limit_is_n_per_window_keyed_by_remote_addr_by_default() {
    let out = convert(&ingress(
        "api",
        &[
            ("global-rate-limit", "100"),
            ("global-rate-limit-window", "1m"),
        ],
        API_RULES,
    ));
    let (config, _) = load(&out.output);
    let limit = &config.limits[0];
    assert_eq!(limit.name, "shop-api-global");
    assert_eq!(limit.key, ["ip"]);
    assert_eq!(limit.burst, 100);
    assert!(out.output.contains("rate = \"100/min\""));
    // global-rate-limit answers 429 by default: nothing changes for clients.
    assert_eq!(config.response.deny_status, 429);
    assert!(out.notes.is_empty(), "{:?}", out.notes);
}

#[test]
fn global_rate_limit_windows_follow_go_durations() {
    assert_eq!(go_duration_secs("1m30s"), Ok(90));
    assert_eq!(go_duration_secs("1.5h"), Ok(5400));
    assert_eq!(go_duration_secs("500ms"), Ok(0));
    assert!(go_duration_secs("1 minute").is_err());
    assert!(go_duration_secs("").is_err());
    assert_eq!(rate_per(10, 120), "\"5/min\"   # 10 per 120 s");
    assert_eq!(rate_per(7, 90), "\"280/hour\"   # 7 per 90 s");
    assert!(
        rate_per(7, 97).starts_with("0.0721649"),
        "{}",
        rate_per(7, 97)
    );
    assert_eq!(rate_per(30, 1), "\"30/s\"");
}

#[test]
fn global_rate_limit_key_maps_nginx_variables_to_key_parts() {
    let parts = |text: &str| nginx_key(text).map(|k| k.parts);
    assert_eq!(parts("$remote_addr"), Ok(vec!["ip".to_string()]));
    assert_eq!(
        parts("$http_x_api_key"),
        Ok(vec!["header:x-api-key".to_string()])
    );
    assert_eq!(parts("${host}"), Ok(vec!["host".to_string()]));
    assert_eq!(parts("everyone"), Ok(vec!["const:everyone".to_string()]));
    // Literals between variables only separate them.
    assert_eq!(
        parts("$remote_addr-$http_x_api_key:$host"),
        Ok(vec![
            "ip".to_string(),
            "header:x-api-key".to_string(),
            "host".to_string()
        ])
    );
    assert_eq!(
        parts("$cookie_session"),
        Err(KeyError::Unsupported("cookie_session".into()))
    );
    assert!(matches!(parts("${host"), Err(KeyError::Malformed(_))));
    assert!(matches!(parts("a$"), Err(KeyError::Malformed(_))));
}

#[test]
fn a_header_key_falls_back_to_the_client_ip_when_the_header_is_absent() {
    let out = convert(&ingress(
        "api",
        &[
            ("global-rate-limit", "10"),
            ("global-rate-limit-window", "1s"),
            ("global-rate-limit-key", "$http_x_api_key"),
        ],
        API_RULES,
    ));
    let (config, _) = load(&out.output);
    assert_eq!(config.limits[0].key, ["header:x-api-key"]);
    let fallback = &config.limits[1];
    assert_eq!(fallback.key, ["ip"]);
    assert_eq!(fallback.matching.headers["x-api-key"], [""]);
}

#[test]
fn a_combined_key_keys_an_absent_header_as_one_shared_value() {
    let out = convert(&ingress(
        "api",
        &[
            ("global-rate-limit", "10"),
            ("global-rate-limit-window", "10s"),
            ("global-rate-limit-key", "$remote_addr$http_x_api_key"),
        ],
        API_RULES,
    ));
    let (config, _) = load(&out.output);
    assert_eq!(config.limits.len(), 1);
    assert_eq!(config.limits[0].key, ["ip", "header:x-api-key"]);
    assert_eq!(
        config.limits[0].on_missing,
        tollgate_core::config::OnMissing::Anonymous
    );
}

#[test]
fn global_rate_limit_ignored_cidrs_become_an_exempt_rule() {
    let out = convert(&ingress(
        "api",
        &[
            ("global-rate-limit", "10"),
            ("global-rate-limit-window", "1m"),
            ("global-rate-limit-ignored-cidrs", "172.16.0.0/12"),
        ],
        API_RULES,
    ));
    let (config, _) = load(&out.output);
    assert_eq!(config.exempt[0].cidrs[0].to_string(), "172.16.0.0/12");
}

#[test]
fn limit_connections_and_limit_rate_are_named_not_carried() {
    let out = convert(&ingress(
        "api",
        &[
            ("limit-rps", "1"),
            ("limit-connections", "10"),
            ("limit-rate", "1024"),
            ("limit-rate-after", "10m"),
        ],
        API_RULES,
    ));
    load(&out.output);
    for annotation in ["limit-connections", "limit-rate:", "limit-rate-after"] {
        assert!(
            out.output
                .contains(&format!("# nginx.ingress.kubernetes.io/{annotation}")),
            "{annotation} in\n{}",
            out.output
        );
        assert!(out.notes.iter().any(|n| n.contains(annotation)));
    }
}

#[test]
fn a_list_and_several_documents_are_all_read() {
    let list = format!(
        "apiVersion: v1\nkind: List\nitems:\n- {}",
        ingress("one", &[("limit-rps", "1")], API_RULES)
            .lines()
            .collect::<Vec<_>>()
            .join("\n  ")
    );
    let docs = format!(
        "{list}\n---\n{}\n---\napiVersion: v1\nkind: Service\nmetadata:\n  name: x\n",
        ingress("two", &[("limit-rpm", "60")], API_RULES)
    );
    let out = convert(&docs);
    let (config, _) = load(&out.output);
    let names: Vec<&str> = config.limits.iter().map(|l| l.name.as_str()).collect();
    assert_eq!(names, ["shop-one-rps", "shop-two-rpm"]);
}

#[test]
fn no_annotations_yield_an_empty_but_valid_config() {
    let out = convert(&ingress("plain", &[], API_RULES));
    let (config, _) = load(&out.output);
    assert!(config.limits.is_empty());
}

#[test]
fn malformed_values_name_the_object_and_the_annotation() {
    for (annotations, annotation) in [
        (vec![("limit-rps", "ten")], "limit-rps"),
        (vec![("limit-rpm", "-3")], "limit-rpm"),
        (
            vec![("limit-rps", "1"), ("limit-whitelist", "10.0.0.0/33")],
            "limit-whitelist",
        ),
        (
            vec![("limit-rps", "1"), ("limit-req-status-code", "abc")],
            "limit-req-status-code",
        ),
        (
            vec![
                ("global-rate-limit", "5"),
                ("global-rate-limit-window", "5 minutes"),
            ],
            "global-rate-limit-window",
        ),
        (
            vec![
                ("global-rate-limit", "5"),
                ("global-rate-limit-window", "1m"),
                ("global-rate-limit-key", "${host"),
            ],
            "global-rate-limit-key",
        ),
    ] {
        let error = refuse(&ingress("api", &annotations, API_RULES));
        let line = error.to_string();
        assert!(
            line.contains("Ingress shop/api") && line.contains(annotation),
            "{line}"
        );
        assert!(!line.contains('\n'), "{line}");
    }
}

#[test]
fn malformed_yaml_names_the_file() {
    let path = file("kind: Ingress\nmetadata: [unclosed\n", "yaml");
    let error = import(&[&path], None, DEFAULT_PREFIX).expect_err("refused");
    assert!(
        error.object.contains(&path.display().to_string()),
        "{error}"
    );
    let _ = std::fs::remove_file(path);
}

#[test]
fn long_names_are_shortened_to_valid_unique_limit_names() {
    let long = "a".repeat(70);
    let out = convert(&format!(
        "{}---\n{}",
        ingress(&long, &[("limit-rps", "1")], API_RULES),
        ingress(&format!("{long}b"), &[("limit-rps", "1")], API_RULES)
    ));
    let (config, _) = load(&out.output);
    assert_eq!(config.limits.len(), 2);
    assert_ne!(config.limits[0].name, config.limits[1].name);
}

#[test]
fn proxy_snippets_name_each_limited_ingress() {
    let path = file(&ingress("api", &[("limit-rps", "1")], API_RULES), "yaml");
    let nginx = import(&[&path], Some(Proxy::Nginx), DEFAULT_PREFIX)
        .unwrap()
        .output;
    assert!(nginx.contains("server_name api.example.com;"), "{nginx}");
    assert!(nginx.contains("location /v1 {"), "{nginx}");
    assert!(nginx.contains("auth_request /_tollgate;"));
    let traefik = import(&[&path], Some(Proxy::Traefik), DEFAULT_PREFIX)
        .unwrap()
        .output;
    assert!(traefik.contains("forwardAuth:"), "{traefik}");
    assert!(traefik.contains("shop-tollgate@kubernetescrd"), "{traefik}");
    let envoy = import(&[&path], Some(Proxy::Envoy), DEFAULT_PREFIX)
        .unwrap()
        .output;
    assert!(envoy.contains("kind: SecurityPolicy"), "{envoy}");
    assert!(envoy.contains("path: /check"), "{envoy}");
    let _ = std::fs::remove_file(path);
}

#[test]
fn a_custom_annotations_prefix_is_read() {
    let yaml = ingress("api", &[], API_RULES).replace(
        "  annotations:\n",
        "  annotations:\n    example.com/limit-rps: \"4\"\n",
    );
    let path = file(&yaml, "yaml");
    let out = import(&[&path], None, "example.com").expect("converts");
    let (config, _) = load(&out.output);
    assert_eq!(config.limits[0].burst, 20);
    let default = import(&[&path], None, DEFAULT_PREFIX).expect("converts");
    assert!(load(&default.output).0.limits.is_empty());
    let _ = std::fs::remove_file(path);
}

#[test]
fn limit_allowlist_is_the_current_name_of_limit_whitelist() {
    let out = convert(&ingress(
        "api",
        &[("limit-rps", "1"), ("limit-allowlist", "192.0.2.0/24")],
        API_RULES,
    ));
    let (config, _) = load(&out.output);
    assert_eq!(config.exempt[0].cidrs[0].to_string(), "192.0.2.0/24");
}

#[test]
fn a_burst_multiplier_of_zero_admits_one_request_at_a_time_as_nginx_burst_0_does() {
    let out = convert(&ingress(
        "api",
        &[("limit-rps", "3"), ("limit-burst-multiplier", "0")],
        API_RULES,
    ));
    let (config, _) = load(&out.output);
    assert_eq!(config.limits[0].burst, 1);
    assert!(out.notes.iter().any(|n| n.contains("burst 0")));
}

#[test]
fn a_regex_path_is_scoped_by_its_literal_prefix() {
    let rules = "  rules:\n  - host: api.example.com\n    http:\n      paths:\n      - path: /api/v1(/|$)(.*)\n        pathType: ImplementationSpecific\n        backend: {}\n";
    let out = convert(&ingress(
        "api",
        &[("limit-rps", "1"), ("use-regex", "true")],
        rules,
    ));
    let (config, _) = load(&out.output);
    assert_eq!(
        config.limits[0].matching.path_prefix.as_deref(),
        Some("/api/v1")
    );
}
