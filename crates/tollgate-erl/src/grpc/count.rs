//! What one decided request adds to envoyproxy/ratelimit's counters
//! ([`tollgate_core::erl::observe`]): per descriptor its rule's stats key and how its hits
//! stood against the limit, read from the verdict.

use envoy_types::pb::envoy::service::ratelimit::v3::RateLimitRequest;

use super::plan::{entry_pairs, ErlPlan};
use tollgate_core::erl::observe::{ErlStats, Hits, StatsName};
use tollgate_core::erl::policy::{request_limit_overflow_key, request_limit_stats_key, Kind};
use tollgate_core::limiter::decision::Verdict;
use tollgate_core::policy::Policy;

/// Counts a request of a domain of envoyproxy/ratelimit rules. Descriptors without a limit (none, unlimited, replaced, or only looking) count nothing, as
/// there. A bucket's counter before the request is what its level says was used: tollgate
/// charges all or nothing, so a descriptor not charged because another was over stood where
/// its level shows.
pub fn count(
    stats: &ErlStats,
    verdict: &Verdict,
    plan: &ErlPlan,
    policy: &Policy,
    request: &RateLimitRequest,
) {
    let failed = matches!(
        verdict,
        Verdict::StoreFailed { .. } | Verdict::StoreError { .. }
    );
    if failed {
        stats.store_error();
    }
    let decision = match verdict {
        Verdict::Decided(decision) => Some(decision),
        _ => None,
    };
    let mut scratch = String::new();
    let mut own_overflow = String::new();
    for (descriptor, wanted) in plan.descriptors.iter().zip(&request.descriptors) {
        if !matches!(descriptor.kind, Kind::Bucket | Kind::Zero) || descriptor.hits == 0 {
            continue;
        }
        let name = match descriptor.rule {
            Some(rule) => {
                let stats = &policy.erl.rules[rule].stats;
                StatsName {
                    key: stats.spell(entry_pairs(&wanted.entries), &mut scratch),
                    overflow: stats.overflow(),
                }
            }
            None => {
                request_limit_stats_key(
                    &request.domain,
                    entry_pairs(&wanted.entries),
                    &mut scratch,
                );
                if own_overflow.is_empty() {
                    request_limit_overflow_key(&request.domain, &mut own_overflow);
                }
                StatsName::from_request(&scratch, &own_overflow)
            }
        };
        if failed {
            stats.count_undecided(name, descriptor.hits);
            continue;
        }
        let state = decision.and_then(|d| d.limits.get(descriptor.bucket));
        let (limit, before) = match (descriptor.kind, state, decision) {
            (Kind::Bucket, Some(state), Some(decision)) => {
                let limit = state.capacity();
                let used = limit.saturating_sub(state.remaining());
                let charged = decision.allowed && state.enough && state.cost > 0;
                let before = if charged {
                    used.saturating_sub(state.cost)
                } else {
                    used
                };
                (limit, before)
            }
            _ => (u64::from(descriptor.requests_per_unit), 0),
        };
        stats.count(
            name,
            Hits {
                limit,
                before,
                hits: descriptor.hits,
                shadow: descriptor.shadow,
            },
        );
    }
}
