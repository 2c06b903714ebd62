//! `GET /v1/buckets/{limit}?key=<part>&key=<part>` (peek) and `DELETE` (reset) on the admin
//! listener.
//!
//! The `key` values are the limit's key parts in order, raw, as `/check` reads them (an `ip`
//! part as the client's address, a `host` or `path` as sent). The store key is built exactly as
//! for a check ([`Limit::tail_of_given`], [`Limit::numbers_for`], [`Limit::store_key`]), so a peek
//! reads and a reset deletes the very bucket the next check draws from. A peek charges nothing;
//! a reset needs the admin token and makes every instance's deny cache forget the bucket.
//!
//! The `{limit}` and `key` values are read by [`NamedKey::parse`], as for every admin endpoint.

use std::borrow::Cow;

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;
use serde_json::json;

use super::admin::{self, AdminError, Caller, NamedKey, Operator};
use crate::base::calendar::Period;
use crate::base::redact::Salt;
use crate::kinds::{BucketOutcome, BucketRequest, Meter, Reserved};
use crate::limiter::decision::LimitState;
use crate::policy::limit::Limit;
use crate::policy::overrides::Override;
use crate::policy::Policy;
use crate::state::AppState;
use crate::store::Store;

/// The bucket a request names.
struct Named<'p> {
    limit: &'p Limit,
    values: Vec<String>,
    bucket: BucketRequest,
    /// The key's override, if it has one.
    own: Option<Override>,
}

/// Parses `{limit}` and the `key` values into the bucket a check would draw from.
fn named<'p>(policy: &'p Policy, name: &str, query: &str) -> Result<Named<'p>, AdminError> {
    let NamedKey {
        index,
        limit,
        values,
        tail,
    } = NamedKey::parse(policy, name, query)?;
    // As a check finds them: a runtime override before the file's, else the limit's own.
    let numbers = limit.numbers_for(&policy.runtime.view(), &tail);
    let cost = match (limit.charge, limit.meter) {
        // What the least estimate would reserve.
        (crate::config::Charge::Report, Meter::Reserve(_)) => limit.reserve,
        (crate::config::Charge::Report, _) => 0,
        (crate::config::Charge::Request, _) => limit.cost,
    };
    let own = match numbers {
        None => Some(Override::Unlimited),
        Some(numbers) if numbers.overridden => Some(Override::Bucket {
            rate: numbers.rate,
            burst: numbers.burst,
        }),
        Some(_) => None,
    };
    let numbers = numbers.unwrap_or_else(|| limit.own_numbers());
    let mut bucket = limit.bucket(
        limit.store_key(&policy.key_prefix, &tail),
        index,
        numbers,
        cost,
    );
    if limit.borrow {
        // Read as a borrowing check reads it: held tokens do not refill.
        bucket.meter = Meter::Borrow(crate::kinds::borrow::Borrow::default());
    }
    Ok(Named {
        limit,
        values,
        bucket,
        own,
    })
}

#[derive(Serialize)]
struct Peek<'a> {
    limit: &'a str,
    /// The key values as the caller may see them (fingerprints for callers without the token).
    key: Vec<Cow<'a, str>>,
    #[serde(flatten)]
    state: PeekState,
    /// What the next check with the limit's cost would get: "allowed" or "denied".
    next_check: &'static str,
    cost: u64,
    /// The key's own policy: "unlimited", its rate and burst, or none.
    #[serde(rename = "override", skip_serializing_if = "Option::is_none")]
    own: Option<serde_json::Value>,
    /// The key's shares among Envoy's quota filters (RLQS), for a limit `[[rlqs.buckets]]`
    /// names.
    #[serde(skip_serializing_if = "Option::is_none")]
    shares: Option<serde_json::Value>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum PeekState {
    Bucket {
        /// Tokens held now (exact; may be negative for a reported limit in debt).
        tokens: f64,
        /// Whole tokens, as `X-RateLimit-Remaining` shows them.
        remaining: u64,
        burst: f64,
        rate_per_s: f64,
        /// Seconds until full, as `X-RateLimit-Reset` shows it.
        full_in_s: u64,
    },
    Quota {
        quota: f64,
        used: f64,
        remaining: u64,
        period: Period,
        period_ends_in_s: u64,
    },
    Concurrency {
        concurrency: f64,
        /// Leases held now (unexpired, unreleased).
        held: f64,
        remaining: u64,
        lease_ttl_s: u64,
    },
    Borrowing {
        /// Tokens in the bucket now, the borrowed ones taken out.
        tokens: f64,
        remaining: u64,
        burst: f64,
        rate_per_s: f64,
        full_in_s: u64,
        /// Tokens borrowed by every instance and held now (used or not), and this
        /// instance's share of them still unused.
        borrowed: u64,
        borrowed_here: u64,
    },
    Reserving {
        /// Tokens held now, the reservations' estimates already taken out.
        tokens: f64,
        remaining: u64,
        burst: f64,
        rate_per_s: f64,
        full_in_s: u64,
        /// Reservations held now (unexpired, unsettled), and their estimates' sum.
        reservations: u64,
        reserved: u64,
        reservation_ttl_s: u64,
    },
}

fn peek_state(
    bucket: &BucketRequest,
    outcome: &BucketOutcome,
    reserved: Option<Reserved>,
    borrowed_here: u64,
) -> PeekState {
    let state = LimitState::of(bucket, outcome);
    match bucket.meter {
        Meter::Borrow(_) => PeekState::Borrowing {
            tokens: outcome.tokens,
            remaining: state.remaining(),
            burst: bucket.burst,
            rate_per_s: bucket.rate,
            full_in_s: state.reset_secs(),
            borrowed: reserved.map_or(0, |r| r.tokens),
            borrowed_here,
        },
        Meter::Bucket => PeekState::Bucket {
            tokens: outcome.tokens,
            remaining: state.remaining(),
            burst: bucket.burst,
            rate_per_s: bucket.rate,
            full_in_s: state.reset_secs(),
        },
        Meter::Quota(period) => PeekState::Quota {
            quota: bucket.burst,
            used: bucket.burst - outcome.tokens,
            remaining: state.remaining(),
            period,
            period_ends_in_s: state.reset_secs(),
        },
        Meter::Concurrency(lease) => PeekState::Concurrency {
            concurrency: bucket.burst,
            held: bucket.burst - outcome.tokens,
            remaining: state.remaining(),
            lease_ttl_s: lease.ttl_ms / 1000,
        },
        Meter::Reserve(reserve) => {
            let reserved = reserved.unwrap_or_default();
            PeekState::Reserving {
                tokens: outcome.tokens,
                remaining: state.remaining(),
                burst: bucket.burst,
                rate_per_s: bucket.rate,
                full_in_s: state.reset_secs(),
                reservations: reserved.held,
                reserved: reserved.tokens,
                reservation_ttl_s: reserve.ttl_ms / 1000,
            }
        }
    }
}

fn override_view(own: Option<Override>) -> Option<serde_json::Value> {
    own.map(|own| match own {
        Override::Unlimited => json!("unlimited"),
        Override::Bucket { rate, burst } => json!({ "rate_per_s": rate, "burst": burst }),
    })
}

fn shown_key<'a>(values: &'a [String], salt: &Salt, caller: Caller) -> Vec<Cow<'a, str>> {
    values
        .iter()
        .map(|value| salt.shown(value, caller))
        .collect()
}

fn json(body: serde_json::Result<String>) -> HttpResponse {
    HttpResponse::Ok()
        .content_type("application/json")
        .body(body.unwrap_or_default())
}

/// What the Envoys of a pool may hold now (each assignment counted until it expires), in
/// all and per holder (an Envoy's bucket: `<instance>.<stream>.<bucket>`).
#[expect(
    clippy::cast_precision_loss,
    reason = "units and microseconds shown as decimals"
)]
fn shares_view(
    bucket: &BucketRequest,
    now_us: u64,
    holders: &[(String, crate::store::shares::Holding)],
) -> serde_json::Value {
    let fill = crate::limiter::shares::units(&crate::policy::limit::Numbers {
        rate: bucket.rate,
        burst: 0,
        overridden: false,
    })
    .fill_interval_s as f64;
    let (mut rate, mut size) = (0u64, 0u64);
    let listed: Vec<serde_json::Value> = holders
        .iter()
        .filter_map(|(id, holding)| {
            let (r, s) = holding.counted(now_us);
            if (r, s) == (0, 0) {
                return None;
            }
            rate += r;
            size += s;
            let until = holding
                .rate_steps
                .iter()
                .chain(&holding.size_steps)
                .map(|(_, until)| *until)
                .max()
                .unwrap_or(now_us);
            Some(json!({
                "holder": id,
                "rate_per_s": r as f64 / fill,
                "burst": s,
                "demand_per_s": holding.demand_milli as f64 / 1000.0,
                "expires_in_s": until.saturating_sub(now_us) as f64 / 1e6,
            }))
        })
        .collect();
    json!({
        "envoys": listed.len(),
        "rate_per_s": rate as f64 / fill,
        "burst": size,
        "holders": listed,
    })
}

/// `GET /v1/buckets/{limit}`: the bucket as the next check would find it, charging nothing.
pub async fn peek(
    request: HttpRequest,
    name: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AdminError> {
    let policy = state.limiter.policy();
    let caller = Caller::of(&request, policy.admin_token.as_deref());
    let named = named(&policy, &name, request.query_string())?;
    let key = shown_key(&named.values, &policy.salt, caller);
    if named.own == Some(Override::Unlimited) {
        // No check ever draws from this bucket.
        return Ok(json(serde_json::to_string_pretty(&json!({
            "limit": named.limit.name,
            "key": key,
            "next_check": "allowed",
            "override": "unlimited",
        }))));
    }
    let _slot = admin::ReadSlot::take(&state.admin_reads)?;
    let outcome = state.limiter.store().peek(&named.bucket).await?;
    let reserved = match named.bucket.meter {
        Meter::Reserve(_) | Meter::Borrow(_) => {
            Some(state.limiter.store().reserved(&named.bucket).await?)
        }
        _ => None,
    };
    let shared = policy
        .rlqs
        .rules
        .iter()
        .any(|rule| policy.limits.get(rule.limit).map(|l| &l.name) == Some(&named.limit.name));
    let shares = if shared {
        let pool = crate::store::shares_key(&named.bucket.key);
        let (now, holders) = state.limiter.store().shares_of(&pool).await?;
        Some(shares_view(&named.bucket, now, &holders))
    } else {
        None
    };
    Ok(json(serde_json::to_string_pretty(&Peek {
        limit: &named.limit.name,
        key,
        state: peek_state(
            &named.bucket,
            &outcome,
            reserved,
            state
                .limiter
                .lender()
                .map_or(0, |lender| lender.held(&named.bucket.key)),
        ),
        next_check: if outcome.enough { "allowed" } else { "denied" },
        cost: named.bucket.cost,
        own: override_view(named.own),
        shares,
    })))
}

/// `DELETE /v1/buckets/{limit}`: the bucket reads full at the next check on every instance.
pub async fn reset(
    _: Operator,
    request: HttpRequest,
    name: web::Path<String>,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AdminError> {
    let policy = state.limiter.policy();
    let named = named(&policy, &name, request.query_string())?;
    let existed = state.limiter.store().reset(&named.bucket.key).await?;
    // This instance forgets at once; the others when the reset channel tells them.
    state.limiter.forget_denials(&named.bucket.key);
    log::info!(
        "bucket of limit {:?} for key [{}] reset by the operator",
        named.limit.name,
        shown_key(&named.values, &policy.salt, Caller::Anonymous).join(", ")
    );
    Ok(json(serde_json::to_string_pretty(&json!({
        "limit": named.limit.name,
        "key": named.values,
        "reset": true,
        "was_full": !existed,
    }))))
}
