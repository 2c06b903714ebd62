//! Costs known after the response (`POST /report`), without HTTP: the body is read into
//! charges against `charge = "report"` limits, every refusal naming the field at fault, and the
//! store's answer is turned into what the caller learns (what is left, when to retry).
use serde::Serialize;
use serde_json::{Map, Value};

use super::Limiter;
use crate::base::rate::ceil_secs;
use crate::base::rate::{count_f64, whole};
use crate::config::{Charge, MAX_COST};
use crate::kinds::reserve::{Settle, Settled};
use crate::kinds::{BucketOutcome, BucketRequest, ReportCharge};
use crate::policy::limit::Limit;
use crate::policy::Policy;
use crate::store::{Store, StoreError};

/// Most charges one request may carry: a body is answered in one store round trip per slot.
pub const MAX_CHARGES: usize = 1_000;

/// Why a report was refused; `Display` is the message for the caller.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReportError {
    /// The body is not what `/report` takes: 400, naming the field.
    #[error("{field}: {reason}")]
    Malformed { field: String, reason: String },
    /// No limit of that name: 400.
    #[error("{field}: no limit named {name:?}")]
    UnknownLimit { field: String, name: String },
    /// The limit is charged by `/check`: 404.
    #[error("{field}: limit {name:?} is not charge = \"report\"")]
    NotReported { field: String, name: String },
}

fn malformed(field: String, reason: impl Into<String>) -> ReportError {
    ReportError::Malformed {
        field,
        reason: reason.into(),
    }
}

/// A parsed body: the charges, and whether it was a list (the answer takes the same shape).
#[derive(Debug)]
pub struct Reports {
    /// What the store must charge, in body order (keys an override makes unlimited left out).
    pub charges: Vec<ReportCharge>,
    /// Every item of the body, in order: charged, unlimited (charged nothing), a reservation
    /// to settle or a lease to give back.
    pub items: Vec<Item>,
    pub listed: bool,
}

/// One item of a report body.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    Charge(ReportCharge),
    /// An override makes the key unlimited by this limit (at this index): as `/check` never
    /// draws from its bucket, a report charges nothing.
    Unlimited {
        limit: usize,
    },
    /// `{"reservation": id, "cost": N}`: the actual cost replaces the reservation's estimate.
    Settle(Settle),
    /// `{"lease": id}`: a concurrency limit's lease given back, as `POST /release` does.
    Release {
        limit: usize,
        key: String,
        member: String,
    },
}

impl Reports {
    fn of(items: Vec<Item>, listed: bool) -> Reports {
        let charges = items
            .iter()
            .filter_map(|item| match item {
                Item::Charge(charge) => Some(charge.clone()),
                _ => None,
            })
            .collect();
        Reports {
            charges,
            items,
            listed,
        }
    }
}

/// Reads a `/report` body against `policy`: one object `{"limit", "key", "cost"}` or a list.
pub fn parse(body: &[u8], policy: &Policy) -> Result<Reports, ReportError> {
    let value: Value = serde_json::from_slice(body)
        .map_err(|e| malformed("body".into(), format!("not JSON ({e})")))?;
    match value {
        Value::Object(item) => Ok(Reports::of(vec![charge(&item, "", policy)?], false)),
        Value::Array(items) if items.is_empty() => {
            Err(malformed("body".into(), "an empty list charges nothing"))
        }
        Value::Array(items) if items.len() > MAX_CHARGES => Err(malformed(
            "body".into(),
            format!("at most {MAX_CHARGES} charges per request"),
        )),
        Value::Array(items) => {
            let items = items
                .iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::Object(item) => charge(item, &format!("[{i}]."), policy),
                    _ => Err(malformed(format!("[{i}]"), "must be an object")),
                })
                .collect::<Result<_, _>>()?;
            Ok(Reports::of(items, true))
        }
        _ => Err(malformed(
            "body".into(),
            "must be an object {\"limit\", \"key\", \"cost\"} or a list of them",
        )),
    }
}

fn charge(item: &Map<String, Value>, at: &str, policy: &Policy) -> Result<Item, ReportError> {
    if item.contains_key("reservation") {
        return settle(item, at, policy);
    }
    if item.contains_key("lease") {
        return release(item, at, policy);
    }
    if let Some(unknown) = item
        .keys()
        .find(|k| !matches!(k.as_str(), "limit" | "key" | "cost"))
    {
        return Err(malformed(format!("{at}{unknown}"), "unknown field"));
    }
    let name = match item.get("limit") {
        Some(Value::String(name)) => name,
        Some(_) => return Err(malformed(format!("{at}limit"), "must be a string")),
        None => return Err(malformed(format!("{at}limit"), "is required")),
    };
    let cost = cost_of(item, at)?;
    let values = match item.get("key") {
        Some(Value::Array(values)) => values
            .iter()
            .enumerate()
            .map(|(i, v)| match v {
                Value::String(text) => Ok(text.clone()),
                _ => Err(malformed(format!("{at}key[{i}]"), "must be a string")),
            })
            .collect::<Result<Vec<_>, _>>()?,
        Some(_) => {
            return Err(malformed(
                format!("{at}key"),
                "must be a list of strings, one per key part",
            ))
        }
        None => return Err(malformed(format!("{at}key"), "is required")),
    };
    let (index, limit) = policy
        .limits
        .iter()
        .enumerate()
        .find(|(_, limit)| limit.name == *name)
        .ok_or_else(|| ReportError::UnknownLimit {
            field: format!("{at}limit"),
            name: name.clone(),
        })?;
    if limit.charge != Charge::Report {
        return Err(ReportError::NotReported {
            field: format!("{at}limit"),
            name: name.clone(),
        });
    }
    let tail = limit
        .tail_of_given(&values, policy.client_ip.ipv6_prefix)
        .map_err(|(i, why)| key_error(limit, &values, i, why, at))?;
    // The key's own numbers, as `/check` finds them: an override binds its reports too.
    let Some(numbers) = limit.numbers_for(&policy.runtime.view(), &tail) else {
        return Ok(Item::Unlimited { limit: index });
    };
    let mut bucket = limit.bucket(
        limit.store_key(&policy.key_prefix, &tail),
        index,
        numbers,
        cost,
    );
    // A reserving limit charged by key: a request that holds no reservation (its check failed
    // open, or it came by another way) still pays, as a debt like any report.
    bucket.meter = bucket.meter.reported();
    Ok(Item::Charge(ReportCharge {
        bucket,
        max_debt: count_f64(limit.max_debt),
    }))
}

/// The `cost` field: an integer in 0..=MAX_COST.
fn cost_of(item: &Map<String, Value>, at: &str) -> Result<u64, ReportError> {
    let cost = match item.get("cost") {
        Some(Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| malformed(format!("{at}cost"), "must be an integer >= 0"))?,
        Some(_) => return Err(malformed(format!("{at}cost"), "must be an integer >= 0")),
        None => return Err(malformed(format!("{at}cost"), "is required")),
    };
    if cost > MAX_COST {
        return Err(malformed(
            format!("{at}cost"),
            format!("must be at most {MAX_COST}"),
        ));
    }
    Ok(cost)
}

/// The id field `name` of an item that holds only it and `others`.
fn id_field<'i>(
    item: &'i Map<String, Value>,
    name: &str,
    others: &[&str],
    at: &str,
) -> Result<&'i str, ReportError> {
    if let Some(unknown) = item
        .keys()
        .find(|k| k.as_str() != name && !others.contains(&k.as_str()))
    {
        return Err(malformed(format!("{at}{unknown}"), "unknown field"));
    }
    match item.get(name) {
        Some(Value::String(id)) => Ok(id),
        _ => Err(malformed(format!("{at}{name}"), "must be a string")),
    }
}

/// `{"reservation": id, "cost": N}`.
fn settle(item: &Map<String, Value>, at: &str, policy: &Policy) -> Result<Item, ReportError> {
    let id = id_field(item, "reservation", &["cost"], at)?;
    let cost = cost_of(item, at)?;
    let found = policy
        .reservation_of(id)
        .map_err(|why| malformed(format!("{at}reservation"), format!("{id:?} {why}")))?;
    let limit = &policy.limits[found.limit];
    // Settled with the numbers a check finds for the key now (an override binds it too); a
    // key made unlimited since keeps the limit's own, so the reservation is still settled.
    let numbers = limit
        .numbers_for(&policy.runtime.view(), &found.tail)
        .unwrap_or_else(|| limit.own_numbers());
    let mut bucket = limit.bucket(
        limit.store_key(&policy.key_prefix, &found.tail),
        found.limit,
        numbers,
        cost,
    );
    bucket.meter = found.reserve.into();
    Ok(Item::Settle(Settle {
        bucket,
        estimate: found.estimate,
        max_debt: count_f64(limit.max_debt),
    }))
}

/// `{"lease": id}`.
fn release(item: &Map<String, Value>, at: &str, policy: &Policy) -> Result<Item, ReportError> {
    let id = id_field(item, "lease", &[], at)?;
    let (limit, key, member) = policy
        .lease_of(id)
        .map_err(|why| malformed(format!("{at}lease"), format!("{id:?} {why}")))?;
    Ok(Item::Release { limit, key, member })
}

fn key_error(limit: &Limit, values: &[String], index: usize, why: String, at: &str) -> ReportError {
    if values.len() != limit.key.len() {
        return malformed(format!("{at}key"), why);
    }
    malformed(format!("{at}key[{index}]"), why)
}

/// What the caller learns about one charged limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Charged {
    pub limit: String,
    /// Whole tokens (or quota) left; 0 when used up or in debt. Absent for an unlimited key.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remaining: Option<u64>,
    /// When used up: seconds until `/check` admits again.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
    /// An override makes the key unlimited by this limit: nothing was charged.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub unlimited: bool,
    /// A reservation: whether this settle settled it (false: settled before or expired, and
    /// nothing changed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub settled: Option<bool>,
    /// A lease: whether it was still held (and is now given back).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub released: Option<bool>,
}

/// What the store said to the items that are not charges, in body order: each settle's and
/// each release's answer.
#[derive(Debug, Clone, Default)]
struct Others {
    settled: Vec<Settled>,
    released: Vec<bool>,
}

/// Why a report body was not recorded (each answered 503: the caller retries).
#[derive(Debug, thiserror::Error)]
pub enum Unrecorded {
    #[error("the store did not record the report ({0}); nothing was charged for certain: retry")]
    Charges(StoreError),
    #[error("the store did not answer ({0}): retry (a settle or release is idempotent)")]
    Others(StoreError),
}

impl<S: Store> Limiter<S> {
    /// Records a parsed report body: its charges in one store call (not atomic across keys:
    /// nothing is ever refused), then each settle and release in its own atomic call (each
    /// idempotent by id, so a retry after a failure never charges or gives back twice).
    /// Returns each reported limit's state afterwards, in body order.
    pub async fn report(
        &self,
        policy: &Policy,
        reports: &Reports,
    ) -> Result<Vec<Charged>, Unrecorded> {
        let outcomes = if reports.charges.is_empty() {
            Vec::new()
        } else {
            self.store.report(&reports.charges).await.map_err(|error| {
                log::warn!("a report was not recorded (answered 503): {error}");
                Unrecorded::Charges(error)
            })?
        };
        let unrecorded = |error: StoreError| {
            log::warn!("a settle or release was not recorded (answered 503): {error}");
            Unrecorded::Others(error)
        };
        let mut others = Others::default();
        for item in &reports.items {
            match item {
                Item::Settle(settle) => {
                    let done = self.store.settle(settle).await.map_err(unrecorded)?;
                    let counters = &policy.limits[settle.bucket.limit].counters;
                    if done.held {
                        counters.reservations_settled.inc();
                    } else {
                        counters.reservations_not_held.inc();
                    }
                    others.settled.push(done);
                }
                Item::Release { limit, key, member } => {
                    let held = self.release(policy, *limit, key, member).await;
                    others.released.push(held.map_err(unrecorded)?);
                }
                Item::Charge(_) | Item::Unlimited { .. } => {}
            }
        }
        Ok(answer(policy, reports, &outcomes, &others))
    }

    /// Gives back the lease `member` of the concurrency key `key` of the limit at `limit`;
    /// whether it was held (releasing is idempotent).
    pub async fn release(
        &self,
        policy: &Policy,
        limit: usize,
        key: &str,
        member: &str,
    ) -> Result<bool, StoreError> {
        let held = self.store.release(key, member).await?;
        if held {
            policy.limits[limit].counters.leases_released.inc();
        }
        Ok(held)
    }
}

/// The state of each reported limit after its report, in body order; `outcomes` are the
/// store's answers to `reports.charges`, `others` to the settles and releases.
fn answer(
    policy: &Policy,
    reports: &Reports,
    outcomes: &[BucketOutcome],
    others: &Others,
) -> Vec<Charged> {
    let mut outcomes = outcomes.iter();
    let mut settled = others.settled.iter();
    let mut released = others.released.iter();
    let used_up = |limit: usize| Charged {
        limit: policy.limits[limit].name.clone(),
        remaining: Some(0),
        retry_after: Some(1),
        unlimited: false,
        settled: None,
        released: None,
    };
    reports
        .items
        .iter()
        .map(|item| match item {
            Item::Unlimited { limit } => Charged {
                limit: policy.limits[*limit].name.clone(),
                remaining: None,
                retry_after: None,
                unlimited: true,
                settled: None,
                released: None,
            },
            Item::Settle(settle) => {
                let bucket = &settle.bucket;
                let Some(done) = settled.next() else {
                    return used_up(bucket.limit);
                };
                Charged {
                    settled: Some(done.held),
                    ..charged(policy, bucket, &done.outcome)
                }
            }
            Item::Release { limit, .. } => Charged {
                limit: policy.limits[*limit].name.clone(),
                remaining: None,
                retry_after: None,
                unlimited: false,
                settled: None,
                released: Some(released.next().copied().unwrap_or(false)),
            },
            Item::Charge(charge) => {
                let bucket = &charge.bucket;
                // The store answers every charge; a short answer is read as used up.
                match outcomes.next() {
                    Some(outcome) => charged(policy, bucket, outcome),
                    None => used_up(bucket.limit),
                }
            }
        })
        .collect()
}

/// What is left of `bucket` after a charge or a settle, and when to retry if nothing is.
fn charged(policy: &Policy, bucket: &BucketRequest, outcome: &BucketOutcome) -> Charged {
    let retry_after = (!outcome.enough).then(|| {
        let wait = match outcome.window {
            Some(window) => window.ends_in_s,
            // One whole request, as `/check` asks of a reported limit.
            None => ceil_secs((1.0 - outcome.tokens) / bucket.rate),
        };
        wait.max(1)
    });
    Charged {
        limit: policy.limits[bucket.limit].name.clone(),
        remaining: Some(whole(outcome.tokens)),
        retry_after,
        unlimited: false,
        settled: None,
        released: None,
    }
}
