//! Request conditions shared by `[limits.match]` and `[[exempt]]`: hosts, methods, a path
//! prefix and header values. Every given condition must hold.

use std::borrow::Cow;

use http::HeaderName;

use crate::base::normalise;
use crate::config::{ConfigError, MatchConfig};
use crate::request::OriginalRequest;

/// Compiled conditions; an empty one matches every request. Serialized as the admin API
/// shows it: only the conditions given.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Matcher {
    #[serde(skip_serializing_if = "Vec::is_empty")]
    hosts: Vec<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    methods: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    path_prefix: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    headers: Vec<HeaderRule>,
}

/// One header and the values it may have.
#[derive(Debug, Clone, serde::Serialize)]
struct HeaderRule {
    /// Lowercase.
    name: String,
    values: Vec<String>,
    /// `""` is among the values: an absent or empty header matches.
    #[serde(skip)]
    absent_matches: bool,
}

impl Matcher {
    /// Checks and compiles `config`; `at` is its dotted key, for errors.
    pub fn compile(config: &MatchConfig, at: &str) -> Result<Matcher, ConfigError> {
        for (i, method) in config.methods.iter().enumerate() {
            if method.is_empty() || !method.bytes().all(|b| b.is_ascii_alphabetic()) {
                return Err(ConfigError::new(
                    format!("{at}.methods[{i}]"),
                    "must be an HTTP method name like GET",
                ));
            }
        }
        for (i, host) in config.hosts.iter().enumerate() {
            if host.is_empty() || !host.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(ConfigError::new(
                    format!("{at}.hosts[{i}]"),
                    "must be a host name",
                ));
            }
        }
        if let Some(prefix) = &config.path_prefix {
            if !prefix.starts_with('/') {
                return Err(ConfigError::new(
                    format!("{at}.path_prefix"),
                    "must start with /",
                ));
            }
        }
        let mut headers = Vec::with_capacity(config.headers.len());
        for (name, values) in &config.headers {
            let key = format!("{at}.headers.{name}");
            let Ok(header) = HeaderName::try_from(name.as_str()) else {
                return Err(ConfigError::new(key, "is not a valid header name"));
            };
            if values.is_empty() {
                return Err(ConfigError::new(
                    key,
                    "needs at least one value (\"\" for an absent or empty header)",
                ));
            }
            headers.push(HeaderRule {
                name: header.as_str().to_string(),
                values: values.clone(),
                absent_matches: values.iter().any(String::is_empty),
            });
        }
        Ok(Matcher {
            // Spelled like a request's host is normalised: lower-case, no trailing dot.
            hosts: config
                .hosts
                .iter()
                .map(|h| h.strip_suffix('.').unwrap_or(h).to_ascii_lowercase())
                .collect(),
            methods: config
                .methods
                .iter()
                .map(|m| m.to_ascii_uppercase())
                .collect(),
            // Spelled like a request's path is normalised, so `/api/./v1/` still matches.
            path_prefix: config
                .path_prefix
                .as_deref()
                .map(|prefix| normalise::path(Cow::Borrowed(prefix)).into_owned()),
            headers,
        })
    }

    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
            && self.methods.is_empty()
            && self.path_prefix.is_none()
            && self.headers.is_empty()
    }

    pub fn matches(&self, request: &OriginalRequest<'_>) -> bool {
        // The request's host and path are normalised (lower-case host without port or trailing
        // dot; path without dot segments, doubled slashes or escaped unreserved characters).
        (self.hosts.is_empty() || self.hosts.iter().any(|h| *h == request.host))
            && (self.methods.is_empty()
                || self
                    .methods
                    .iter()
                    .any(|m| m.eq_ignore_ascii_case(&request.method)))
            && self
                .path_prefix
                .as_deref()
                .is_none_or(|prefix| request.path.starts_with(prefix))
            && self.headers.iter().all(|rule| rule.matches(request))
    }
}

impl HeaderRule {
    /// Exact, case-sensitive comparison of the first value, surrounding blanks ignored.
    fn matches(&self, request: &OriginalRequest<'_>) -> bool {
        match request.header(&self.name).map(<[u8]>::trim_ascii) {
            None | Some(b"") => self.absent_matches,
            Some(value) => self.values.iter().any(|v| v.as_bytes() == value),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use http::header::{HeaderMap, HeaderValue};

    use super::*;

    fn tiers(values: &[&str]) -> Matcher {
        let config = MatchConfig {
            headers: BTreeMap::from([(
                "X-Plan".to_string(),
                values.iter().map(|v| v.to_string()).collect(),
            )]),
            ..MatchConfig::default()
        };
        Matcher::compile(&config, "limits.t.match").expect("valid")
    }

    fn matches(matcher: &Matcher, plan: Option<&str>) -> bool {
        let mut headers = HeaderMap::new();
        if let Some(plan) = plan {
            headers.insert(
                HeaderName::from_static("x-plan"),
                HeaderValue::from_str(plan).unwrap(),
            );
        }
        let request = OriginalRequest::new(&headers, "GET", "/", "192.0.2.1".parse().unwrap());
        matcher.matches(&request)
    }

    #[test]
    fn a_header_rule_admits_only_the_listed_values() {
        let gold = tiers(&["gold", "platinum"]);
        assert!(matches(&gold, Some("gold")));
        assert!(matches(&gold, Some("platinum")));
        assert!(!matches(&gold, Some("Gold")), "values are case-sensitive");
        assert!(!matches(&gold, Some("free")));
        assert!(!matches(&gold, None));
    }

    #[test]
    fn the_empty_value_stands_for_an_absent_or_empty_header() {
        let free = tiers(&["free", ""]);
        assert!(matches(&free, None));
        assert!(matches(&free, Some("")));
        assert!(matches(&free, Some("free")));
        assert!(!matches(&free, Some("gold")));
    }

    #[test]
    fn the_match_rules_are_spelled_like_the_normalised_request() {
        let config = MatchConfig {
            hosts: vec!["API.example.com.".into()],
            methods: vec!["post".into()],
            path_prefix: Some("/api/./v1/".into()),
            ..MatchConfig::default()
        };
        let matcher = Matcher::compile(&config, "m").expect("valid");
        let original = |host: &str, uri: &str| {
            let mut headers = HeaderMap::new();
            for (name, value) in [
                ("x-forwarded-method", "POST"),
                ("x-forwarded-host", host),
                ("x-forwarded-uri", uri),
            ] {
                headers.insert(
                    HeaderName::from_static(name),
                    HeaderValue::from_str(value).unwrap(),
                );
            }
            let request = OriginalRequest::new(&headers, "GET", "/", "127.0.0.1".parse().unwrap());
            matcher.matches(&request)
        };
        for (host, uri) in [
            ("api.example.com", "/api/v1/items"),
            ("Api.Example.com.:8443", "//api/%76%31/items"),
            ("api.example.com.", "/x/../api/v1/./items"),
        ] {
            assert!(original(host, uri), "{host} {uri}");
        }
        assert!(!original("api.example.com", "/api/v2/items"));
    }

    #[test]
    fn bad_header_rules_are_refused_naming_the_header() {
        let mut config = MatchConfig::default();
        config.headers.insert("bad header".into(), vec!["x".into()]);
        let error = Matcher::compile(&config, "exempt.a").unwrap_err();
        assert_eq!(error.key, "exempt.a.headers.bad header");
        let mut config = MatchConfig::default();
        config.headers.insert("x-plan".into(), Vec::new());
        assert_eq!(
            Matcher::compile(&config, "m").unwrap_err().key,
            "m.headers.x-plan"
        );
    }
}
