//! Which limits apply to a rate limit descriptor: `match.domains`, `match.descriptors` and the
//! limit's `descriptor:<key>` parts. A limit applies to a descriptor when its domain matches,
//! the descriptor carries each required key with one of its values, and the descriptor's entry
//! keys are exactly the limit's descriptor parts plus the required keys: the nested
//! descriptors of envoyproxy/ratelimit match the same way, one limit per full path.
//!
//! A descriptor's entries come in as `(key, value)` pairs, borrowed from whatever message
//! carried them: the wire's types stay with the service that decodes them.

use crate::base::keys::KeyPart;
use crate::config::{ConfigError, LimitConfig};

/// The descriptor side of one limit; absent for limits of `/check`.
#[derive(Debug, Clone)]
pub struct DescriptorRule {
    domains: Vec<String>,
    /// Entry key and the values it may have (`match.descriptors`).
    required: Vec<(String, Vec<String>)>,
    /// Every entry key a descriptor must carry, and no other: sorted.
    keys: Vec<String>,
}

impl DescriptorRule {
    /// Whether a limit belongs to the gRPC service: it keys on a descriptor or matches a domain
    /// or descriptor entries.
    pub fn is_descriptor_limit(config: &LimitConfig) -> bool {
        !config.matching.domains.is_empty()
            || !config.matching.descriptors.is_empty()
            || config
                .key
                .iter()
                .any(|part| part.starts_with("descriptor:"))
    }

    /// The rule of a validated limit, or `None` for a limit of `/check`.
    pub fn compile(config: &LimitConfig) -> Option<DescriptorRule> {
        if !Self::is_descriptor_limit(config) {
            return None;
        }
        let required: Vec<(String, Vec<String>)> = config
            .matching
            .descriptors
            .iter()
            .map(|(key, values)| (key.clone(), values.clone()))
            .collect();
        let mut keys: Vec<String> = config
            .key
            .iter()
            .filter_map(|part| part.strip_prefix("descriptor:").map(str::to_string))
            .chain(required.iter().map(|(key, _)| key.clone()))
            .collect();
        keys.sort_unstable();
        Some(DescriptorRule {
            domains: config.matching.domains.clone(),
            required,
            keys,
        })
    }

    /// What `validate` refuses in a descriptor limit; `at` is `limits.<name>`.
    pub fn check(config: &LimitConfig, at: &str) -> Result<(), ConfigError> {
        if !Self::is_descriptor_limit(config) {
            return Ok(());
        }
        let matching = &config.matching;
        if !matching.hosts.is_empty()
            || !matching.methods.is_empty()
            || matching.path_prefix.is_some()
            || !matching.headers.is_empty()
        {
            return Err(ConfigError::new(
                format!("{at}.match"),
                "hosts, methods, path_prefix and headers describe HTTP requests; a limit of the gRPC service matches domains and descriptors",
            ));
        }
        if config.cost_header.is_some() {
            return Err(ConfigError::new(
                format!("{at}.cost_header"),
                "a gRPC request carries its cost in hits_addend",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for (i, part) in config.key.iter().enumerate() {
            match KeyPart::parse(part) {
                Ok(KeyPart::Descriptor(key)) if matching.descriptors.contains_key(&key) => {
                    return Err(ConfigError::new(
                        format!("{at}.key[{i}]"),
                        format!("entry {key:?} is also in match.descriptors; name it once"),
                    ));
                }
                Ok(KeyPart::Descriptor(key)) if !seen.insert(key.clone()) => {
                    return Err(ConfigError::new(
                        format!("{at}.key[{i}]"),
                        format!("entry {key:?} is named twice"),
                    ));
                }
                Ok(KeyPart::Descriptor(_) | KeyPart::Const(_)) => {}
                _ => {
                    return Err(ConfigError::new(
                        format!("{at}.key[{i}]"),
                        "a limit of the gRPC service keys on descriptor:<key> and const:<text> parts only",
                    ))
                }
            }
        }
        for (i, domain) in matching.domains.iter().enumerate() {
            if domain.is_empty() {
                return Err(ConfigError::new(
                    format!("{at}.match.domains[{i}]"),
                    "must not be empty",
                ));
            }
        }
        for (key, values) in &matching.descriptors {
            let at = format!("{at}.match.descriptors.{key}");
            if key.is_empty() {
                return Err(ConfigError::new(at, "an entry key must not be empty"));
            }
            if values.is_empty() || values.iter().any(String::is_empty) {
                return Err(ConfigError::new(
                    at,
                    "needs at least one value, none empty (to key on every value, use a descriptor:<key> part)",
                ));
            }
        }
        Ok(())
    }

    /// Whether the limit applies to a descriptor with these entries in this domain.
    pub fn applies<'e, E>(&self, domain: &str, entries: E) -> bool
    where
        E: IntoIterator<Item = (&'e str, &'e str)> + Clone,
    {
        if !self.domains.is_empty() && !self.domains.iter().any(|d| d == domain) {
            return false;
        }
        // Same count, and every expected key present: with no key expected twice, the keys
        // are exactly the expected ones (a repeated entry key leaves one expected key out).
        if entries.clone().into_iter().count() != self.keys.len()
            || !self.keys.iter().all(|key| {
                entries
                    .clone()
                    .into_iter()
                    .any(|(entry_key, _)| entry_key == key)
            })
        {
            return false;
        }
        self.required.iter().all(|(key, values)| {
            value_of(entries.clone(), key).is_some_and(|value| values.iter().any(|v| v == value))
        })
    }
}

/// The hits a descriptor charges: its own `hits_addend` (0 included: look, do not charge, as
/// Envoy sends it for a check before the response whose charge comes once the stream is
/// done), else the request's (`request_hits`), 0 counting as 1.
pub fn hits_of(request_hits: u32, hits_addend: Option<u64>) -> u64 {
    hits_addend.unwrap_or(u64::from(request_hits).max(1))
}

/// The value of the first entry with this key.
pub fn value_of<'e>(
    entries: impl IntoIterator<Item = (&'e str, &'e str)>,
    key: &str,
) -> Option<&'e str> {
    entries
        .into_iter()
        .find(|&(entry_key, _)| entry_key == key)
        .map(|(_, value)| value)
}

#[cfg(test)]
mod tests {
    use figment::providers::Format as _;

    use super::*;

    /// Built from TOML, as an operator writes it.
    fn limit(key: &[&str], domains: &[&str], descriptors: &[(&str, &[&str])]) -> LimitConfig {
        let descriptors: Vec<String> = descriptors
            .iter()
            .map(|(k, values)| format!("{k:?} = {values:?}"))
            .collect();
        let toml = format!(
            "name = \"d\"\nrate = 1\nburst = 1\nkey = {key:?}\n[match]\ndomains = {domains:?}\ndescriptors = {{ {} }}\n",
            descriptors.join(", ")
        );
        figment::Figment::new()
            .merge(figment::providers::Toml::string(&toml))
            .extract()
            .expect("a limit")
    }

    fn entries<'e>(
        pairs: &'e [(&'e str, &'e str)],
    ) -> impl Iterator<Item = (&'e str, &'e str)> + Clone {
        pairs.iter().copied()
    }

    #[test]
    fn a_limit_applies_only_to_descriptors_with_exactly_its_keys() {
        let config = limit(&["descriptor:user"], &["edge"], &[("path", &["/a", "/b"])]);
        let rule = DescriptorRule::compile(&config).unwrap();
        assert!(rule.applies("edge", entries(&[("path", "/a"), ("user", "u1")])));
        assert!(rule.applies("edge", entries(&[("user", "u1"), ("path", "/b")])));
        assert!(!rule.applies("other", entries(&[("path", "/a"), ("user", "u1")])));
        assert!(!rule.applies("edge", entries(&[("path", "/c"), ("user", "u1")])));
        assert!(!rule.applies("edge", entries(&[("user", "u1")])));
        assert!(!rule.applies(
            "edge",
            entries(&[("path", "/a"), ("user", "u1"), ("extra", "x")])
        ));
        assert!(!rule.applies("edge", entries(&[("user", "u1"), ("user", "u2")])));
    }

    #[test]
    fn http_parts_and_conditions_are_refused_in_descriptor_limits() {
        let refused =
            |config: LimitConfig| DescriptorRule::check(&config, "limits.d").unwrap_err().key;
        assert_eq!(
            refused(limit(&["descriptor:a", "ip"], &[], &[])),
            "limits.d.key[1]"
        );
        let mut with_host = limit(&["descriptor:a"], &[], &[]);
        with_host.matching.hosts = vec!["x".into()];
        assert_eq!(refused(with_host), "limits.d.match");
        assert_eq!(
            refused(limit(&["descriptor:a"], &[], &[("a", &["1"])])),
            "limits.d.key[0]"
        );
        assert_eq!(
            refused(limit(&["const:x"], &[], &[("a", &[])])),
            "limits.d.match.descriptors.a"
        );
        assert!(DescriptorRule::check(&limit(&["ip"], &[], &[]), "limits.d").is_ok());
        assert!(DescriptorRule::compile(&limit(&["ip"], &[], &[])).is_none());
    }
}
