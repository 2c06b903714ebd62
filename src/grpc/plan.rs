//! A `RateLimitRequest` turned into the buckets to decide. Its domain says how: a domain of
//! envoyproxy/ratelimit rules is planned as it plans (`tollgate_erl::grpc::plan`); any other draws every
//! applicable `[[limits]]` of every descriptor, keyed through [`tollgate_core::base::keys`], with a
//! descriptor's buckets remembered so the answer can report each descriptor. Malformed
//! requests are refused here with a gRPC status.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::Status;

use tollgate_core::base::keys::{self, KeyPart, Source};
use tollgate_core::config::{Charge, OnMissing, OVER_COST};
use tollgate_core::kinds::BucketRequest;
use tollgate_core::policy::descriptors::value_of;
use tollgate_core::policy::Policy;
use tollgate_erl::grpc::plan::{self as erl, entry_pairs, ErlPlan};

/// Most descriptors one request may carry; Envoy sends one per rate limit action set.
pub const MAX_DESCRIPTORS: usize = 64;
/// Most entries one descriptor may carry.
pub const MAX_ENTRIES: usize = 16;

/// What one request must draw, by the rules of its domain.
#[derive(Debug)]
pub enum Plan {
    /// The `[[limits]]` that match each descriptor.
    Rules(RulesPlan),
    /// envoyproxy/ratelimit's rules of the request's domain.
    Erl(ErlPlan),
}

/// The plan of a domain of `[[limits]]`.
#[derive(Debug, Default)]
pub struct RulesPlan {
    /// One bucket per distinct key: a key drawn by several descriptors is charged their costs
    /// added up, once, so the store never sees one key twice in a call.
    pub buckets: Vec<BucketRequest>,
    /// For each descriptor of the request, the indices of its buckets.
    pub per_descriptor: Vec<Vec<usize>>,
    /// A descriptor lacking a key value of a limit with `on_missing = "deny"`: (descriptor,
    /// limit).
    pub missing: Option<(usize, usize)>,
}

/// Builds the plan, or refuses a malformed request with `INVALID_ARGUMENT`.
pub fn plan(policy: &Policy, request: &RateLimitRequest) -> Result<Plan, Status> {
    let erl_domain = policy.erl.has_domain(&request.domain);
    check_shape(request, erl_domain)?;
    if policy.erl.awaiting_config {
        return Err(Status::unavailable(
            "no rate limit configuration loaded (waiting for the xDS server)",
        ));
    }
    if erl_domain {
        return erl::plan(policy, &policy.erl, request).map(Plan::Erl);
    }
    let mut plan = RulesPlan {
        per_descriptor: Vec::with_capacity(request.descriptors.len()),
        ..RulesPlan::default()
    };
    for (index, descriptor) in request.descriptors.iter().enumerate() {
        let mut drawn = Vec::new();
        // Envoy asks with negative hits to give hits back; tollgate never refunds on request,
        // so such a descriptor draws nothing.
        if !descriptor.is_negative_hits {
            add_descriptor(policy, request, descriptor, index, &mut plan, &mut drawn);
        }
        plan.per_descriptor.push(drawn);
    }
    Ok(Plan::Rules(plan))
}

/// `erl_domain`: a domain of envoyproxy/ratelimit rules, where (as there) a descriptor
/// without entries, or with an entry without a key, is valid and limited by nothing.
fn check_shape(request: &RateLimitRequest, erl_domain: bool) -> Result<(), Status> {
    if request.domain.is_empty() {
        return Err(Status::invalid_argument("the domain must not be empty"));
    }
    if request.descriptors.is_empty() {
        return Err(Status::invalid_argument(
            "the request carries no descriptor",
        ));
    }
    if request.descriptors.len() > MAX_DESCRIPTORS {
        return Err(Status::invalid_argument(format!(
            "{} descriptors; at most {MAX_DESCRIPTORS} are decided in one request",
            request.descriptors.len()
        )));
    }
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        if descriptor.entries.is_empty() && !erl_domain {
            return Err(Status::invalid_argument(format!(
                "descriptor {i} has no entries"
            )));
        }
        if descriptor.entries.len() > MAX_ENTRIES {
            return Err(Status::invalid_argument(format!(
                "descriptor {i} has {} entries; at most {MAX_ENTRIES}",
                descriptor.entries.len()
            )));
        }
        if !erl_domain && descriptor.entries.iter().any(|entry| entry.key.is_empty()) {
            return Err(Status::invalid_argument(format!(
                "descriptor {i} has an entry without a key"
            )));
        }
    }
    Ok(())
}

fn add_descriptor<'a>(
    policy: &'a Policy,
    request: &RateLimitRequest,
    descriptor: &'a RateLimitDescriptor,
    index: usize,
    plan: &mut RulesPlan,
    drawn: &mut Vec<usize>,
) {
    let entries = entry_pairs(&descriptor.entries);
    let hits = erl::descriptor_hits(request, descriptor);
    let runtime = policy.runtime.view();
    for (limit_index, limit) in policy.limits.iter().enumerate() {
        let Some(rule) = &limit.descriptor else {
            continue;
        };
        if !rule.applies(&request.domain, entries.clone()) {
            continue;
        }
        let anonymous = limit.on_missing == OnMissing::Anonymous;
        let value = |part: &'a KeyPart| match part {
            KeyPart::Descriptor(key) => value_of(entries.clone(), key).map(str::as_bytes),
            KeyPart::Const(text) => Some(text.as_bytes()),
            _ => None,
        };
        // No address among descriptor values: the IPv6 prefix plays no part.
        let tail = match keys::build_tail(&limit.key, Source::Descriptor(&value), anonymous, 128) {
            Ok(tail) => tail,
            Err(_) if limit.on_missing == OnMissing::Deny => {
                plan.missing.get_or_insert((index, limit_index));
                continue;
            }
            Err(_) => continue,
        };
        // A key's override, runtime before file, as on `/check`.
        let Some(numbers) = limit.numbers_for(&runtime, &tail) else {
            continue;
        };
        let key = limit.store_key(&policy.key_prefix, &tail);
        // A reported limit is charged by `POST /report`, and a look (hits 0) charges nothing:
        // cost 0 admits while one whole request is left.
        let cost = match limit.charge {
            Charge::Report => 0,
            Charge::Request if hits == 0 => 0,
            Charge::Request => hits.max(limit.cost).min(OVER_COST),
        };
        let bucket = match plan.buckets.iter().position(|b| b.key == key) {
            Some(same) => {
                let merged = &mut plan.buckets[same];
                merged.cost = merged.cost.saturating_add(cost).min(OVER_COST);
                same
            }
            None => {
                plan.buckets
                    .push(limit.bucket(key, limit_index, numbers, cost));
                plan.buckets.len() - 1
            }
        };
        if !drawn.contains(&bucket) {
            drawn.push(bucket);
        }
    }
}

#[cfg(test)]
mod tests {
    use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;

    use super::*;
    use tollgate_core::config::Config;
    use tollgate_core::observe::metrics::Metrics;

    /// The plan of a domain of `[[limits]]`.
    fn plan(policy: &Policy, request: &RateLimitRequest) -> Result<RulesPlan, Status> {
        match super::plan(policy, request)? {
            Plan::Rules(plan) => Ok(plan),
            Plan::Erl(_) => panic!(
                "{:?} is no domain of envoyproxy/ratelimit rules",
                request.domain
            ),
        }
    }

    fn policy(limits: &str) -> Policy {
        use figment::providers::Format as _;
        let config: Config = figment::Figment::new()
            .merge(figment::providers::Toml::string(limits))
            .extract()
            .expect("a config");
        Policy::compile(&config, &Metrics::new()).expect("a valid config")
    }

    fn descriptor(entries: &[(&str, &str)]) -> RateLimitDescriptor {
        RateLimitDescriptor {
            entries: entries
                .iter()
                .map(|(key, value)| Entry {
                    key: key.to_string(),
                    value: value.to_string(),
                })
                .collect(),
            ..RateLimitDescriptor::default()
        }
    }

    fn request(descriptors: Vec<RateLimitDescriptor>) -> RateLimitRequest {
        RateLimitRequest {
            domain: "edge".into(),
            descriptors,
            hits_addend: 0,
        }
    }

    const LIMITS: &str = r#"
        [[limits]]
        name = "user"
        rate = 1
        burst = 10
        key = ["descriptor:user"]
        [[limits]]
        name = "user-on-path"
        rate = 1
        burst = 10
        key = ["descriptor:user"]
        [limits.match]
        descriptors = { path = ["/a"] }
        [[limits]]
        name = "http"
        rate = 1
        burst = 10
        key = ["ip"]
    "#;

    #[test]
    fn each_descriptor_draws_the_limits_of_exactly_its_keys() {
        let policy = policy(LIMITS);
        let plan = plan(
            &policy,
            &request(vec![
                descriptor(&[("user", "u")]),
                descriptor(&[("path", "/a"), ("user", "u")]),
                descriptor(&[("path", "/b"), ("user", "u")]),
            ]),
        )
        .unwrap();
        let keys: Vec<&str> = plan.buckets.iter().map(|b| b.key.as_str()).collect();
        assert_eq!(keys, ["tollgate:user:{u}", "tollgate:user-on-path:{u}"]);
        assert_eq!(plan.per_descriptor, [vec![0], vec![1], vec![]]);
    }

    #[test]
    fn a_key_drawn_twice_is_one_bucket_charged_both_costs() {
        let policy = policy(LIMITS);
        let mut heavy = descriptor(&[("user", "u")]);
        heavy.hits_addend = Some(envoy_types::pb::google::protobuf::UInt64Value { value: 5 });
        let plan = plan(&policy, &request(vec![descriptor(&[("user", "u")]), heavy])).unwrap();
        assert_eq!(plan.buckets.len(), 1);
        assert_eq!(plan.buckets[0].cost, 6);
        assert_eq!(plan.per_descriptor, [vec![0], vec![0]]);
    }

    #[test]
    fn negative_hits_draw_nothing_and_oversized_requests_are_refused() {
        let policy = policy(LIMITS);
        let mut refund = descriptor(&[("user", "u")]);
        refund.is_negative_hits = true;
        assert!(plan(&policy, &request(vec![refund]))
            .unwrap()
            .buckets
            .is_empty());
        let many = vec![descriptor(&[("user", "u")]); MAX_DESCRIPTORS + 1];
        assert!(plan(&policy, &request(many)).is_err());
        let pairs: Vec<(String, String)> = (0..=MAX_ENTRIES)
            .map(|i| (format!("k{i}"), "v".into()))
            .collect();
        let wide: Vec<(&str, &str)> = pairs
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert!(plan(&policy, &request(vec![descriptor(&wide)])).is_err());
    }
}
