use super::*;

fn applied(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
    let mut config = Config::default();
    apply(&mut config, &ErlEnv::of(pairs))?;
    Ok(config)
}

#[test]
fn the_header_names_count_only_when_the_headers_are_enabled() {
    let off = applied(&[("LIMIT_LIMIT_HEADER", "X-Limit")]).unwrap();
    assert!(!off.envoy.response_headers);
    assert_eq!(off.response.ratelimit_names.limit, "RateLimit-Limit");
    let on = applied(&[
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "1"),
        ("LIMIT_RESET_HEADER", "X-Reset"),
    ])
    .unwrap();
    assert!(on.envoy.response_headers);
    assert_eq!(on.response.ratelimit_names.limit, "RateLimit-Limit");
    assert_eq!(on.response.ratelimit_names.reset, "X-Reset");
    let refused = applied(&[
        ("LIMIT_RESPONSE_HEADERS_ENABLED", "true"),
        ("LIMIT_REMAINING_HEADER", "Bad Name"),
    ]);
    assert_eq!(refused.unwrap_err().key, "LIMIT_REMAINING_HEADER");
    let refused = applied(&[("LIMIT_RESPONSE_HEADERS_ENABLED", "yes")]);
    assert_eq!(refused.unwrap_err().key, "LIMIT_RESPONSE_HEADERS_ENABLED");
}

#[test]
fn merge_domain_config_is_a_go_bool() {
    assert!(
        applied(&[("MERGE_DOMAIN_CONFIG", "T")])
            .unwrap()
            .envoy
            .merge_domains
    );
    assert!(
        !applied(&[("MERGE_DOMAIN_CONFIG", "false")])
            .unwrap()
            .envoy
            .merge_domains
    );
    let refused = applied(&[("MERGE_DOMAIN_CONFIG", "on")]);
    assert_eq!(refused.unwrap_err().key, "MERGE_DOMAIN_CONFIG");
}
