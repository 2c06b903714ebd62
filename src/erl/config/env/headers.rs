//! envoyproxy/ratelimit's variables for domains split over several files and for the quota
//! headers of its answers, read by [`super::apply_erl_env`]:
//!
//! - none of them: gRPC answers carry no quota headers unless `response.grpc_headers` says
//!   otherwise, as envoyproxy/ratelimit sends none;
//! - `MERGE_DOMAIN_CONFIG`: `envoy.merge_domains`;
//! - `LIMIT_RESPONSE_HEADERS_ENABLED`: `envoy.response_headers`, and then `LIMIT_LIMIT_HEADER`,
//!   `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER` rename the headers
//!   (`response.ratelimit_names`); as there, the names count only when it is true.

use crate::config::{Config, ConfigError};

pub fn apply(
    config: &mut Config,
    var: &impl Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    let flag = |name: &str| {
        var(name).map_or(Ok(false), |text| {
            crate::base::go::parse_bool(&text)
                .ok_or_else(|| ConfigError::new(name, format!("{text:?} is not a bool")))
        })
    };
    config.envoy.merge_domains |= flag("MERGE_DOMAIN_CONFIG")?;
    // envoyproxy/ratelimit adds no quota headers of its own unless told to; Envoy Gateway turns
    // on Envoy's own `X-RateLimit-*`, which tollgate's would then duplicate.
    config.response.grpc_headers.get_or_insert_with(Vec::new);
    if !flag("LIMIT_RESPONSE_HEADERS_ENABLED")? {
        return Ok(());
    }
    config.envoy.response_headers = true;
    let names = &mut config.response.ratelimit_names;
    for (variable, name) in [
        ("LIMIT_LIMIT_HEADER", &mut names.limit),
        ("LIMIT_REMAINING_HEADER", &mut names.remaining),
        ("LIMIT_RESET_HEADER", &mut names.reset),
    ] {
        if let Some(text) = var(variable) {
            if !is_header_name(&text) {
                return Err(ConfigError::new(
                    variable,
                    format!("{text:?} is not a header name"),
                ));
            }
            *name = text;
        }
    }
    Ok(())
}

/// An HTTP field name: one or more token characters (RFC 9110, "tchar").
pub fn is_header_name(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn applied(pairs: &[(&str, &str)]) -> Result<Config, ConfigError> {
        let mut config = Config::default();
        apply(&mut config, &|name: &str| {
            pairs
                .iter()
                .find(|(k, _)| *k == name)
                .map(|(_, v)| v.to_string())
        })?;
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
}
