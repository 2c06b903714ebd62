//! `[[exempt]]`: requests admitted before any limit is looked at, without a store call and
//! without rate-limit headers (health checks, the office network, internal jobs).

use std::collections::HashSet;

use ipnet::IpNet;
use prometheus::IntCounter;

use crate::config::{valid_name, ConfigError, ExemptConfig};
use crate::observe::metrics::{detached_counter, Metrics};
use crate::policy::matcher::Matcher;
use crate::request::OriginalRequest;

/// One compiled rule (serialized as the admin API shows it).
#[derive(serde::Serialize)]
pub struct ExemptRule {
    pub name: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    cidrs: Vec<IpNet>,
    #[serde(rename = "match")]
    matcher: Matcher,
    /// `tollgate_exempt_total{rule}`; detached until [`Exemptions::compile`] registers it.
    #[serde(skip)]
    pub counter: IntCounter,
}

impl TryFrom<&ExemptConfig> for ExemptRule {
    type Error = ConfigError;

    fn try_from(config: &ExemptConfig) -> Result<ExemptRule, ConfigError> {
        if !valid_name(&config.name) {
            return Err(ConfigError::new(
                "exempt.name",
                format!(
                    "{:?} must match [a-z0-9_-]+ (at most 64 characters)",
                    config.name
                ),
            ));
        }
        let at = format!("exempt.{}", config.name);
        let matcher = Matcher::compile(&config.matching(), &at)?;
        if config.cidrs.is_empty() && matcher.is_empty() {
            return Err(ConfigError::new(
                at,
                "has no condition and would exempt every request: give cidrs, hosts, methods, \
                 path_prefix or headers",
            ));
        }
        Ok(ExemptRule {
            name: config.name.clone(),
            cidrs: config.cidrs.clone(),
            matcher,
            counter: detached_counter(),
        })
    }
}

impl ExemptRule {
    fn matches(&self, request: &OriginalRequest<'_>) -> bool {
        (self.cidrs.is_empty() || self.cidrs.iter().any(|n| n.contains(&request.client_ip)))
            && self.matcher.matches(request)
    }
}

/// Every rule, in config order.
#[derive(Default)]
pub struct Exemptions {
    rules: Vec<ExemptRule>,
}

impl Exemptions {
    /// Builds every rule (names unique) and resolves their counters.
    pub fn compile(configs: &[ExemptConfig], metrics: &Metrics) -> Result<Exemptions, ConfigError> {
        let mut names = HashSet::new();
        let mut rules = Vec::with_capacity(configs.len());
        for config in configs {
            let mut rule = ExemptRule::try_from(config)?;
            if !names.insert(config.name.as_str()) {
                return Err(ConfigError::new(
                    format!("exempt.{}.name", config.name),
                    format!("duplicate exempt rule name {:?}", config.name),
                ));
            }
            rule.counter = metrics.exempt_counter(&rule.name);
            rules.push(rule);
        }
        Ok(Exemptions { rules })
    }

    /// The first rule that admits this request.
    pub fn first_match(&self, request: &OriginalRequest<'_>) -> Option<&ExemptRule> {
        self.rules.iter().find(|rule| rule.matches(request))
    }

    /// Every rule, in config order.
    pub fn rules(&self) -> &[ExemptRule] {
        &self.rules
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}
