//! What the operator asked for: limits and their matchers, exemptions, per-key overrides (from
//! files and, at run time, from the store), and the descriptor rules of the gRPC service,
//! compiled into one [`Policy`] that a reload swaps whole.

pub mod descriptors;
pub mod exempt;
pub mod header_names;
pub mod limit;
pub mod matcher;
pub mod overrides;
pub mod regions;
pub mod rlqs;
pub mod runtime_overrides;

use std::collections::HashSet;
use std::sync::Arc;

use crate::base::redact::Salt;
use crate::config::{Config, ConfigError, OnMissing, ResponseConfig};
use crate::erl::config::RuleConfig;
use crate::erl::policy::ErlRules;
use crate::kinds::concurrency::Lease;
use crate::kinds::reserve::Reserve;
use crate::kinds::{BucketRequest, Meter};
use crate::observe::metrics::Metrics;
use crate::request::{ClientIpPolicy, OriginalRequest};
use exempt::{ExemptRule, Exemptions};
use limit::{Limit, LimitInput};
use runtime_overrides::RuntimeOverrides;

/// Everything a check needs that a reload may change.
pub struct Policy {
    pub exemptions: Exemptions,
    pub limits: Vec<Limit>,
    pub client_ip: ClientIpPolicy,
    pub response: ResponseConfig,
    /// `response.ratelimit_names`, checked.
    pub ratelimit_names: header_names::RatelimitHeaders,
    pub key_prefix: String,
    /// The bearer token mutating admin requests need; `None` refuses them.
    pub admin_token: Option<String>,
    /// What key values are fingerprinted with for readers without the token.
    pub salt: Salt,
    /// Names the admin API answers to besides IP literals and `localhost`: lower-case,
    /// without a trailing dot.
    pub admin_hosts: Vec<String>,
    /// Overrides set through the admin API: they beat the file's, and every policy a reload
    /// installs shares the running one's ([`crate::limiter::Limiter::replace_policy`]).
    pub runtime: Arc<RuntimeOverrides>,
    /// envoyproxy/ratelimit's rules: they alone decide the descriptors of their domains.
    pub erl: ErlRules,
    /// Envoy's quota service: which limit and key a bucket id stands for.
    pub rlqs: rlqs::RlqsRules,
    /// The regions whose shares this instance keeps (`[home]`).
    pub home: Option<regions::Home>,
}

impl Policy {
    /// Builds every exemption and limit of a loaded config (which checked the rest) and
    /// resolves their counters; the first refused one is the error.
    pub fn compile(config: &Config, metrics: &Metrics) -> Result<Policy, ConfigError> {
        Policy::compile_fed(config, metrics, None)
    }

    /// [`Policy::compile`] with the envoyproxy/ratelimit rules an xDS server sent (`fed`),
    /// served after the config's own. `None` with `envoy.xds` set: none has arrived yet.
    pub fn compile_fed(
        config: &Config,
        metrics: &Metrics,
        fed: Option<&[RuleConfig]>,
    ) -> Result<Policy, ConfigError> {
        let exemptions = Exemptions::compile(&config.exempt, metrics)?;
        let mut names = HashSet::new();
        let mut limits = Vec::with_capacity(config.limits.len());
        for limit_config in &config.limits {
            let mut limit = Limit::try_from(LimitInput {
                config: limit_config,
                ipv6_prefix: config.client_ip.ipv6_prefix,
                borrow: config.store.borrow
                    && config.store.backend == crate::config::Backend::Redis,
            })?;
            if !names.insert(limit_config.name.clone()) {
                return Err(ConfigError::new(
                    format!("limits.{}.name", limit.name),
                    format!("duplicate limit name {:?}", limit.name),
                ));
            }
            // A global limit borrows soundly (its slices count against the region's share in
            // force, docs/DESIGN.md, "One limit across regions"), but only when it says
            // `borrow = true`: the demand a region reports does not count the checks admitted
            // from slices, so shares follow demand less closely (docs/regions.md).
            if let Some(global) = crate::kinds::global::Global::of(config, limit_config) {
                limit.meter = Meter::Global(global);
                if limit_config.borrow != Some(true) {
                    limit.borrow = false;
                }
            }
            limit.counters = metrics.limit_counters(&limit.name);
            limits.push(limit);
        }
        let rules = crate::erl::config::with_fed(&config.envoy, fed.unwrap_or_default())?;
        let (mut erl, erl_limits) = ErlRules::compile(&rules, limits.len(), &mut names)?;
        erl.awaiting_config = config.envoy.xds.is_some() && fed.is_none();
        erl.ready_while_awaiting = config
            .envoy
            .xds
            .as_ref()
            .is_some_and(|xds| xds.ready_before_config);
        erl.shadow_mode = config.envoy.shadow_mode;
        erl.quota_mode = config.envoy.quota_mode;
        erl.dynamic_metadata = config.envoy.dynamic_metadata;
        erl.response_headers = config.envoy.response_headers;
        for limit_config in &erl_limits {
            let mut limit = Limit::try_from(LimitInput {
                config: limit_config,
                ipv6_prefix: config.client_ip.ipv6_prefix,
                borrow: config.store.borrow
                    && config.store.backend == crate::config::Backend::Redis,
            })
            .map_err(|e| e.within("envoy"))?;
            limit.counters = metrics.limit_counters(&limit.name);
            limits.push(limit);
        }
        let rlqs = rlqs::RlqsRules::compile(&config.rlqs, &limits)?;
        // Read once: the token may come from a file.
        let admin_token = config.admin_token()?;
        Ok(Policy {
            exemptions,
            limits,
            client_ip: ClientIpPolicy::from(&config.client_ip),
            response: config.response.clone(),
            ratelimit_names: header_names::RatelimitHeaders::compile(
                &config.response.ratelimit_names,
            )?,
            key_prefix: config.store.key_prefix.clone(),
            salt: match (config.fingerprint_salt()?, &admin_token) {
                (Some(salt), _) => Salt::configured(&salt),
                (None, Some(token)) => Salt::from_admin_token(token),
                (None, None) => Salt::per_process(),
            },
            admin_token,
            admin_hosts: config
                .admin_hosts
                .iter()
                .map(|host| host.trim_end_matches('.').to_ascii_lowercase())
                .collect(),
            runtime: Arc::new(RuntimeOverrides::new(Some(
                metrics.runtime_overrides.clone(),
            ))),
            erl,
            rlqs,
            home: config.home.as_ref().map(regions::Home::new),
        })
    }

    /// The `[[exempt]]` rule that admits this request, if any.
    pub fn exempt(&self, request: &OriginalRequest<'_>) -> Option<&ExemptRule> {
        self.exemptions.first_match(request)
    }

    /// The buckets this request must draw from, in limit order, each tagged with the index of
    /// its limit and carrying its key's policy (an override's numbers, if any: a runtime one
    /// before the file's). Fails with the
    /// index of a limit whose key is missing under `on_missing = "deny"`.
    pub fn applicable(&self, request: &OriginalRequest<'_>) -> Result<Vec<BucketRequest>, usize> {
        let mut buckets = Vec::with_capacity(self.limits.len());
        let runtime = self.runtime.view();
        for (index, limit) in self.limits.iter().enumerate() {
            if limit.descriptor.is_some() || !limit.matcher.matches(request) {
                continue;
            }
            let anonymous = limit.on_missing == OnMissing::Anonymous;
            let tail = match request.bucket_tail(&limit.key, anonymous, self.client_ip.ipv6_prefix)
            {
                Ok(tail) => tail,
                Err(_) if limit.on_missing == OnMissing::Deny => return Err(index),
                Err(_) => continue,
            };
            let Some(numbers) = limit.numbers_for(&runtime, &tail) else {
                continue;
            };
            buckets.push(limit.bucket(
                limit.store_key(&self.key_prefix, &tail),
                index,
                numbers,
                limit.check_cost(request),
            ));
        }
        Ok(buckets)
    }

    /// The limit (its index), store key and lease member of a lease id this policy's `/check`
    /// handed out ([`Limit::lease_id`]); why not when the id is malformed or names no
    /// concurrency limit.
    pub fn lease_of(&self, id: &str) -> Result<(usize, String, String), String> {
        let (limit, tail, member) = self.held_parts(
            id,
            "a lease id (<limit>.<key>.<id>, as X-Tollgate-Lease gives it)",
            |meter| meter.lease().is_some(),
            "is not a concurrency limit",
        )?;
        let member = Lease::member_of(member).ok_or("has a malformed lease")?;
        Ok((
            limit,
            self.limits[limit].store_key(&self.key_prefix, &tail),
            member,
        ))
    }

    /// The reservation an `X-Tollgate-Reservation` id names (`<limit>.<key>.<id>:<estimate>`),
    /// or why it names none.
    pub fn reservation_of(&self, id: &str) -> Result<Found, String> {
        let (limit, tail, member) = self.held_parts(
            id,
            "a reservation id (<limit>.<key>.<id>:<estimate>, as X-Tollgate-Reservation gives it)",
            |meter| meter.reserve().is_some(),
            "does not reserve",
        )?;
        let Some(reserve) = self.limits[limit].meter.reserve() else {
            return Err("does not reserve".into());
        };
        let (reserve, estimate) = reserve
            .of_member(member)
            .ok_or("has a malformed reservation")?;
        Ok(Found {
            limit,
            tail,
            reserve,
            estimate,
        })
    }

    /// The parts of an id of something a check holds (`<limit>.<key in hex>.<member>`): the
    /// limit's index, its key tail and the member, or why the id is not `shape` or names no
    /// limit whose meter is `kind` (`not_kind` says so).
    fn held_parts<'i>(
        &self,
        id: &'i str,
        shape: &str,
        kind: impl Fn(&Meter) -> bool,
        not_kind: &str,
    ) -> Result<(usize, Vec<u8>, &'i str), String> {
        let mut fields = id.trim().split('.');
        let (Some(name), Some(tail), Some(member), None) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            return Err(format!("is not {shape}"));
        };
        let Some(limit) = self.limits.iter().position(|limit| limit.name == name) else {
            return Err(format!("names no limit {name:?}"));
        };
        if !kind(&self.limits[limit].meter) {
            return Err(format!("limit {name:?} {not_kind}"));
        }
        let tail = unhex(tail).ok_or("has a malformed key")?;
        Ok((limit, tail, member))
    }
}

/// A reservation found again from its id ([`Policy::reservation_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The limit's index in the policy.
    pub limit: usize,
    /// The key tail of its bucket.
    pub tail: Vec<u8>,
    /// The limit's reservation settings, with this reservation's id.
    pub reserve: Reserve,
    pub estimate: u64,
}

/// Bytes from pairs of hex digits.
fn unhex(text: &str) -> Option<Vec<u8>> {
    if !text.len().is_multiple_of(2) {
        return None;
    }
    text.as_bytes()
        .chunks_exact(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect()
}
