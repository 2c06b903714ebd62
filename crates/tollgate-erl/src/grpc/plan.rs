//! The plan of a request whose domain has envoyproxy/ratelimit rules: one rule (or none) per
//! descriptor, found as envoyproxy/ratelimit finds it; `replaces` applied across the request;
//! one bucket per descriptor with a rate, all decided in the one store call.

use envoy_types::pb::envoy::extensions::common::ratelimit::v3::rate_limit_descriptor::Entry;
use envoy_types::pb::envoy::extensions::common::ratelimit::v3::RateLimitDescriptor;
use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;
use tonic::Status;

use tollgate_core::base::keys::{self, Source};
use tollgate_core::base::rate::count_f64;
use tollgate_core::config::OVER_COST;
use tollgate_core::erl::config::UNITS;
use tollgate_core::erl::policy::{ErlRules, Kind, Rule};
use tollgate_core::kinds::BucketRequest;
use tollgate_core::policy::descriptors::hits_of;
use tollgate_core::policy::limit::Numbers;
use tollgate_core::policy::Policy;

/// The plan of a request of a domain of envoyproxy/ratelimit rules.
#[derive(Debug, Default)]
pub struct ErlPlan {
    /// One bucket per distinct key, as in any plan.
    pub buckets: Vec<BucketRequest>,
    /// What decides each descriptor of the request, in its order.
    pub descriptors: Vec<ErlDescriptor>,
}

/// What one descriptor is decided by.
#[derive(Debug, Clone, PartialEq)]
pub struct ErlDescriptor {
    pub kind: Kind,
    /// The configured rule; `None` for the descriptor's own `limit` (or no rule).
    pub rule: Option<usize>,
    pub requests_per_unit: u32,
    pub unit: i32,
    pub unit_secs: u64,
    pub shadow: bool,
    pub quota: bool,
    /// What the descriptor charges (0: looks only).
    pub hits: u64,
    /// Its bucket in [`ErlPlan::buckets`], for [`Kind::Bucket`].
    pub bucket: usize,
}

impl ErlDescriptor {
    fn none() -> ErlDescriptor {
        ErlDescriptor {
            kind: Kind::NoLimit,
            rule: None,
            requests_per_unit: 0,
            unit: 0,
            unit_secs: 1,
            shadow: false,
            quota: false,
            hits: 0,
            bucket: 0,
        }
    }

    /// Whether a `requests_per_unit: 0` rule turns this descriptor over the limit.
    pub fn zero_over(&self) -> bool {
        self.kind == Kind::Zero && self.hits > 0
    }
}

/// The plan of `request`, of a domain of `rules`.
pub fn plan(
    policy: &Policy,
    rules: &ErlRules,
    request: &RateLimitRequest,
) -> Result<ErlPlan, Status> {
    let mut plan = ErlPlan {
        buckets: Vec::new(),
        descriptors: Vec::with_capacity(request.descriptors.len()),
    };
    let mut found = Vec::with_capacity(request.descriptors.len());
    for (i, descriptor) in request.descriptors.iter().enumerate() {
        let hits = descriptor_hits(request, descriptor);
        let mut chosen = ErlDescriptor {
            hits,
            quota: rules.quota_mode,
            ..ErlDescriptor::none()
        };
        // Envoy gives hits back with negative hits; tollgate never refunds on request (nor
        // charges them, as envoyproxy/ratelimit does): such a descriptor draws nothing.
        if descriptor.is_negative_hits {
            found.push((chosen, None));
            continue;
        }
        if let Some(own) = &descriptor.limit {
            // Envoy's own limit for this descriptor wins over the configuration, never in
            // shadow or quota mode, unnamed.
            let Some(&(_, _, unit_secs)) = UNITS.iter().find(|(_, n, _)| *n == own.unit) else {
                return Err(Status::invalid_argument(format!(
                    "descriptor {i}: its limit has no unit"
                )));
            };
            chosen.kind = if own.requests_per_unit == 0 {
                Kind::Zero
            } else {
                Kind::Bucket
            };
            chosen.requests_per_unit = own.requests_per_unit;
            chosen.unit = own.unit;
            chosen.unit_secs = unit_secs;
            found.push((chosen, None));
            continue;
        }
        let matched = rules.lookup(&request.domain, entry_pairs(&descriptor.entries));
        if let Some(rule_index) = matched.as_ref().and_then(|m| m.rule) {
            let rule: &Rule = &rules.rules[rule_index];
            chosen.kind = rule.kind;
            chosen.rule = Some(rule_index);
            chosen.requests_per_unit = rule.requests_per_unit;
            chosen.unit = rule.unit;
            chosen.unit_secs = rule.unit_secs;
            chosen.shadow = rule.shadow;
            chosen.quota = rule.quota || rules.quota_mode;
        }
        found.push((chosen, matched));
    }
    replace(rules, &mut found);
    let blocked = found
        .iter()
        .any(|(d, _)| d.zero_over() && !d.shadow && !d.quota);
    let runtime = policy.runtime.view();
    for (index, (mut chosen, matched)) in found.into_iter().enumerate() {
        if chosen.kind == Kind::Bucket {
            let descriptor = &request.descriptors[index];
            let entries = &descriptor.entries;
            let (limit, tail) = match (&matched, chosen.rule) {
                (Some(matched), Some(rule)) => (
                    rules.rules[rule].limit,
                    entry_tail(
                        &mut entries
                            .iter()
                            .enumerate()
                            .map(|(i, e)| rules.keyed_value(matched, i, &e.value)),
                    ),
                ),
                _ => {
                    let mut tail =
                        entry_tail(&mut entries.iter().map(|entry| entry.value.as_bytes()));
                    tail.extend_from_slice(
                        format!("|{}/{}", chosen.requests_per_unit, chosen.unit_secs).as_bytes(),
                    );
                    (rules.request_limit.unwrap_or(0), tail)
                }
            };
            let limit_ref = &policy.limits[limit];
            let numbers = if chosen.rule.is_some() {
                limit_ref.numbers_for(&runtime, &tail)
            } else {
                let count = u64::from(chosen.requests_per_unit);
                Some(Numbers {
                    rate: count_f64(count) / count_f64(chosen.unit_secs),
                    burst: count,
                    overridden: false,
                })
            };
            match numbers {
                // An override made this key unlimited.
                None => {
                    chosen.kind = Kind::Unlimited;
                    chosen.quota = false;
                }
                Some(numbers) => {
                    let key = limit_ref.store_key(&policy.key_prefix, &tail);
                    // A request a `requests_per_unit: 0` rule denies only looks at the others.
                    let (cost, shadow) = if blocked {
                        (0, true)
                    } else {
                        (chosen.hits.min(OVER_COST), chosen.shadow || chosen.quota)
                    };
                    chosen.bucket = match plan.buckets.iter().position(|b| b.key == key) {
                        Some(same) => {
                            let merged = &mut plan.buckets[same];
                            merged.cost = merged.cost.saturating_add(cost).min(OVER_COST);
                            same
                        }
                        None => {
                            // A plain bucket whatever the limit, with the rule's shadow.
                            let bucket =
                                BucketRequest::bucket(key, numbers.rate, count_f64(numbers.burst))
                                    .cost(cost)
                                    .limit(limit);
                            plan.buckets
                                .push(if shadow { bucket.shadow() } else { bucket });
                            plan.buckets.len() - 1
                        }
                    };
                }
            }
        }
        plan.descriptors.push(chosen);
    }
    Ok(plan)
}

/// A descriptor's entries as the core takes them: `(key, value)` pairs borrowed from the
/// message, nothing copied.
pub fn entry_pairs(entries: &[Entry]) -> impl ExactSizeIterator<Item = (&str, &str)> + Clone + '_ {
    entries
        .iter()
        .map(|entry| (entry.key.as_str(), entry.value.as_str()))
}

/// The hits a descriptor of `request` adds, as the core counts them from Envoy's two fields.
pub fn descriptor_hits(request: &RateLimitRequest, descriptor: &RateLimitDescriptor) -> u64 {
    hits_of(
        request.hits_addend,
        descriptor.hits_addend.as_ref().map(|addend| addend.value),
    )
}

/// A named rule that another rule of the request `replaces` applies to nothing.
fn replace<T>(rules: &ErlRules, found: &mut [(ErlDescriptor, T)]) {
    let replacing = |name: &str| {
        found.iter().any(|(d, _)| {
            d.rule
                .is_some_and(|r| rules.rules[r].replaces.iter().any(|n| n == name))
        })
    };
    let mut off = Vec::new();
    for (i, (descriptor, _)) in found.iter().enumerate() {
        let Some(rule) = descriptor.rule else {
            continue;
        };
        let rule = &rules.rules[rule];
        if matches!(descriptor.kind, Kind::Bucket | Kind::Zero)
            && !rule.name.is_empty()
            && replacing(&rule.name)
        {
            off.push(i);
        }
    }
    for i in off {
        found[i].0 = ErlDescriptor::none();
    }
}

/// The tail of a bucket keyed on a descriptor's values in order, an empty one keyed as an
/// absent part under `on_missing = "anonymous"` (so an override written with `""` finds it).
fn entry_tail(values: &mut dyn Iterator<Item = &[u8]>) -> Vec<u8> {
    // Anonymous: no value is refused, so there is no error to lose.
    keys::build_tail(&[], Source::Entries(values), true, 128).unwrap_or_default()
}
