//! `GET /v1/limits` on the admin listener: the effective limits and exemptions, as the running
//! policy holds them (after environment overrides and the last reload). Overrides appear only
//! as counts, since their keys are client credentials; exempt rules' header values (a shared
//! secret that bypasses every limit) only to the admin token's holder, as fingerprints to
//! anyone else; the admin token never appears.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Serialize;

use crate::state::AppState;
use tollgate_core::base::redact::Caller;
use tollgate_core::base::redact::Salt;
use tollgate_core::config::{Charge, OnMissing};
use tollgate_core::kinds::{Configured, Kind, LimitView as KindView};
use tollgate_core::policy::exempt::ExemptRule;
use tollgate_core::policy::limit::Limit;
use tollgate_core::policy::matcher::Matcher;
use tollgate_core::policy::Policy;

#[derive(Serialize)]
struct Limits<'p> {
    limits: Vec<LimitView<'p>>,
    exempt: Vec<serde_json::Value>,
}

#[derive(Serialize)]
struct LimitView<'p> {
    name: &'p str,
    #[serde(flatten)]
    kind: KindView,
    key: Vec<String>,
    #[serde(rename = "match")]
    matcher: &'p Matcher,
    cost: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    cost_header: Option<&'p str>,
    charge: Charge,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_debt: Option<u64>,
    shadow: bool,
    on_missing: OnMissing,
    /// Applies to Envoy's rate limit service (descriptors), not to `/check`.
    grpc: bool,
    overrides: OverrideCounts,
}

/// How many keys have their own policy, by where it comes from.
#[derive(Serialize)]
struct OverrideCounts {
    /// `[[limits.overrides]]` and the `overrides_file`'s entries (distinct keys).
    file: usize,
    /// Set through `/v1/overrides` and held in the store, unexpired, as this instance knows them.
    runtime: usize,
}

impl<'p> From<&'p Limit> for LimitView<'p> {
    fn from(limit: &'p Limit) -> Self {
        LimitView {
            name: &limit.name,
            kind: limit.meter.limit_view(&Configured {
                rate: limit.rate,
                burst: limit.burst,
                reserve: limit.reserve,
                reserve_header: limit.reserve_header.as_deref(),
            }),
            key: limit.key.iter().map(ToString::to_string).collect(),
            matcher: &limit.matcher,
            cost: limit.cost,
            cost_header: limit.cost_header.as_deref(),
            charge: limit.charge,
            max_debt: (limit.charge == Charge::Report).then_some(limit.max_debt),
            shadow: limit.shadow,
            on_missing: limit.on_missing,
            grpc: limit.descriptor.is_some(),
            overrides: OverrideCounts {
                file: limit.overrides.len(),
                runtime: 0,
            },
        }
    }
}

/// The policy as the admin API shows it to `caller`: an exempt rule's header values grant a
/// bypass, so only the token holder sees them; anyone else sees their fingerprints.
pub fn render(policy: &Policy, caller: Caller) -> serde_json::Result<String> {
    let exempt = policy
        .exemptions
        .rules()
        .iter()
        .map(|rule| exempt_view(rule, &policy.salt, caller))
        .collect::<serde_json::Result<_>>()?;
    serde_json::to_string_pretty(&Limits {
        limits: policy
            .limits
            .iter()
            .map(|limit| {
                let mut view = LimitView::from(limit);
                view.overrides.runtime = policy.runtime.list(&limit.name).len();
                view
            })
            .collect(),
        exempt,
    })
}

/// One exempt rule, its `match.headers` values redacted for `caller`.
fn exempt_view(
    rule: &ExemptRule,
    salt: &Salt,
    caller: Caller,
) -> serde_json::Result<serde_json::Value> {
    let mut view = serde_json::to_value(rule)?;
    let headers = view
        .get_mut("match")
        .and_then(|matcher| matcher.get_mut("headers"))
        .and_then(serde_json::Value::as_array_mut);
    for header in headers.into_iter().flatten() {
        let values = header
            .get_mut("values")
            .and_then(serde_json::Value::as_array_mut);
        for value in values.into_iter().flatten() {
            if let Some(text) = value.as_str() {
                *value = serde_json::Value::String(salt.secret(text, caller).into_owned());
            }
        }
    }
    Ok(view)
}

pub async fn limits(request: HttpRequest, state: web::Data<AppState>) -> HttpResponse {
    let policy = state.limiter.policy();
    let caller = super::admin::caller(&request, policy.admin_token.as_deref());
    match render(&policy, caller) {
        Ok(body) => HttpResponse::Ok()
            .content_type("application/json")
            .body(body),
        // Every field is a plain value: serializing cannot fail; answer something defined.
        Err(error) => HttpResponse::InternalServerError().body(error.to_string()),
    }
}
