//! `GET /v1/top?window=1m|5m|15m&n=20` on the admin listener: per limit, the keys this
//! instance denied most in the window, with their share of the limit's denials. Key values
//! that are not IP addresses are fingerprints unless the caller holds the admin token.

use actix_web::{web, HttpRequest, HttpResponse};
use serde::Deserialize;
use serde_json::{json, Value};

use super::admin::AdminError;
use crate::state::AppState;
use tollgate_core::base::rate::ratio;
use tollgate_core::base::redact::Caller;
use tollgate_core::base::redact::Salt;
use tollgate_core::observe::top::{self, TopList};

/// Keys per limit when `n` is not given, and the most a caller may ask for.
pub const DEFAULT_N: usize = 20;
pub const MAX_N: usize = 100;

#[derive(Deserialize)]
struct TopQuery {
    window: Option<String>,
    n: Option<String>,
}

pub async fn top(
    request: HttpRequest,
    state: web::Data<AppState>,
) -> Result<HttpResponse, AdminError> {
    let (minutes, n) =
        parse(request.query_string()).map_err(|(field, detail)| AdminError::bad(field, detail))?;
    let policy = state.limiter.policy();
    let caller = super::admin::caller(&request, policy.admin_token.as_deref());
    let mut covered_s = 1;
    let limits: Vec<Value> = policy
        .limits
        .iter()
        .map(|limit| {
            let list = limit.counters.denied_keys.top(minutes, n);
            covered_s = list.covered_s;
            json!({
                "limit": limit.name,
                "denied": list.total,
                "keys": rows(&list, &policy.salt, caller),
            })
        })
        .collect();
    Ok(HttpResponse::Ok().json(json!({
        "window": format!("{minutes}m"),
        "covered_s": covered_s,
        "limits": limits,
    })))
}

/// `window` (default 1m) in minutes and `n` (default 20), or the field at fault and why.
fn parse(query: &str) -> Result<(u64, usize), (&'static str, String)> {
    let asked = web::Query::<TopQuery>::from_query(query)
        .map_err(|error| ("query", format!("unreadable query: {error}")))?
        .into_inner();
    let minutes = match asked.window.as_deref() {
        None => 1,
        Some(window) => window
            .strip_suffix('m')
            .and_then(|m| m.parse::<u64>().ok())
            .filter(|m| top::WINDOWS.contains(m))
            .ok_or((
                "window",
                format!("window {window:?}: expected 1m, 5m or 15m"),
            ))?,
    };
    let n = match asked.n.as_deref() {
        None => DEFAULT_N,
        Some(n) => n
            .parse::<usize>()
            .ok()
            .filter(|n| (1..=MAX_N).contains(n))
            .ok_or((
                "n",
                format!("n {n:?}: expected a whole number from 1 to {MAX_N}"),
            ))?,
    };
    Ok((minutes, n))
}

fn rows(list: &TopList, salt: &Salt, caller: Caller) -> Vec<Value> {
    list.keys
        .iter()
        .map(|(tail, denied)| {
            let key: Vec<String> = top::parts(tail)
                .iter()
                .map(|part| salt.shown(part, caller).into_owned())
                .collect();
            json!({
                "key": key,
                "denied": denied,
                "denied_per_min": round2(ratio(*denied * 60, list.covered_s)),
                "share": round2(ratio(*denied, list.total)),
            })
        })
        .collect()
}

fn round2(x: f64) -> f64 {
    (x * 100.0).round() / 100.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_and_sizes_are_read_or_refused() {
        assert_eq!(parse(""), Ok((1, DEFAULT_N)));
        assert_eq!(parse("window=15m&n=5"), Ok((15, 5)));
        assert_eq!(parse("window=5m"), Ok((5, DEFAULT_N)));
        for (query, field) in [
            ("window=2m", "window"),
            ("window=1h", "window"),
            ("window=", "window"),
            ("n=0", "n"),
            ("n=101", "n"),
            ("n=-1", "n"),
            ("n=ten", "n"),
        ] {
            assert_eq!(parse(query).map_err(|e| e.0), Err(field), "{query}");
        }
    }
}
