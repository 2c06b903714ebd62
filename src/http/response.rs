//! [`Verdict`] → HTTP response: status, `RateLimit-Policy` / `RateLimit` (IETF draft),
//! `X-RateLimit-*`, `Retry-After`, and a problem+json body on denials (or, when the caller
//! asks with `X-Tollgate-Deny-Status: 403`, a body-less 403 naming the status in
//! `X-Tollgate-Status`).

use actix_web::http::header::{HeaderMap, HeaderName};
use actix_web::http::StatusCode;
use actix_web::{HttpResponse, HttpResponseBuilder};
use serde::Serialize;

use tollgate_core::answer::{each_header, Carrier, QuotaValue, Refusal};
use tollgate_core::limiter::decision::{Decision, Verdict};
use tollgate_core::policy::Policy;

// Names as constants: a `&str` name is parsed and validated on every insert (4% of a
// memory-store check's instructions in `bench/profile.sh`).
const X_TOLLGATE_STATUS: HeaderName = HeaderName::from_static("x-tollgate-status");
/// The leases an allowed check took, comma-separated: what `POST /release` gives back.
pub const X_TOLLGATE_LEASE: HeaderName = HeaderName::from_static("x-tollgate-lease");
/// The reservations an allowed check took, comma-separated: what `POST /report` settles.
pub const X_TOLLGATE_RESERVATION: HeaderName = HeaderName::from_static("x-tollgate-reservation");
const X_TOLLGATE_DENY_STATUS: HeaderName = HeaderName::from_static("x-tollgate-deny-status");
const RETRY_AFTER: HeaderName = actix_web::http::header::RETRY_AFTER;

/// How a refusal (a denial, or failing closed) is answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DenyForm {
    /// Its own status (`deny_status`, or 503) with a problem+json body.
    AsIs,
    /// `403`, the status in `X-Tollgate-Status`, no body. nginx's `auth_request` passes a 403
    /// on quietly, where it turns any other refusal into a 500 (an error log line, and the
    /// client's keep-alive dropped); without a body nginx also keeps its connection to
    /// tollgate. The nginx configs ask for it and map the status back at the client.
    Forbidden,
}

impl DenyForm {
    /// `Forbidden` when the check request says `X-Tollgate-Deny-Status: 403`. Any other value
    /// is ignored: a caller can only pick another refusal, never turn one into a 2xx.
    pub fn requested(headers: &HeaderMap) -> DenyForm {
        match headers.get(X_TOLLGATE_DENY_STATUS) {
            Some(value) if value.as_bytes().trim_ascii() == b"403" => DenyForm::Forbidden,
            _ => DenyForm::AsIs,
        }
    }
}

/// The answer to a check, refusals in their own form.
pub fn render(verdict: &Verdict, policy: &Policy) -> HttpResponse {
    render_as(verdict, policy, DenyForm::AsIs)
}

/// The answer to a check, refusals in `form`.
pub fn render_as(verdict: &Verdict, policy: &Policy, form: DenyForm) -> HttpResponse {
    let Some(refusal) = Refusal::of(verdict) else {
        return admitted(verdict, policy);
    };
    let status = status_of(refusal, policy);
    let mut response = refusal_start(status, form);
    match refusal {
        Refusal::OverLimit(decision) => denied(response, status, decision, policy, form),
        Refusal::MissingKey { limit } => {
            if form == DenyForm::Forbidden {
                return response.finish();
            }
            let name = &policy.limits[limit].name;
            problem(
                &mut response,
                status,
                "about:blank",
                format!("the request lacks the key of limit {name:?}"),
                vec![name.as_str()],
                None,
            )
        }
        Refusal::StoreFailed => {
            let retry_after = refusal.retry_after(policy);
            if let Some(seconds) = retry_after {
                response.insert_header((RETRY_AFTER, seconds));
            }
            if form == DenyForm::Forbidden {
                return response.finish();
            }
            problem(
                &mut response,
                status,
                "about:blank",
                "the rate-limit store is unavailable".into(),
                Vec::new(),
                retry_after,
            )
        }
    }
}

/// An admitted request: an empty 200 (nginx keeps its keep-alive connection to tollgate only
/// without a body), with a decision's quota headers and the ids of what it took.
fn admitted(verdict: &Verdict, policy: &Policy) -> HttpResponse {
    let mut response = HttpResponse::Ok();
    if let Verdict::Decided(decision) = verdict {
        answer_headers(&mut response, decision, policy, false);
        if !decision.leases.is_empty() {
            response.insert_header((X_TOLLGATE_LEASE, decision.leases.join(",")));
        }
        if !decision.reservations.is_empty() {
            response.insert_header((X_TOLLGATE_RESERVATION, decision.reservations.join(",")));
        }
    }
    response.finish()
}

/// A refusal's status: `response.deny_status` (429 unless configured) for a denial or a
/// missing key, 503 when the store failed.
fn status_of(refusal: Refusal<'_>, policy: &Policy) -> StatusCode {
    match refusal {
        Refusal::OverLimit(_) | Refusal::MissingKey { .. } => {
            StatusCode::from_u16(policy.response.deny_status)
                .unwrap_or(StatusCode::TOO_MANY_REQUESTS)
        }
        Refusal::StoreFailed => StatusCode::SERVICE_UNAVAILABLE,
    }
}

/// The start of a refusal with `status`, in the form the caller asked for.
fn refusal_start(status: StatusCode, form: DenyForm) -> HttpResponseBuilder {
    match form {
        DenyForm::AsIs => HttpResponse::build(status),
        DenyForm::Forbidden => {
            let mut response = HttpResponse::Forbidden();
            response.insert_header((X_TOLLGATE_STATUS, status.as_str()));
            response
        }
    }
}

fn denied(
    mut response: HttpResponseBuilder,
    status: StatusCode,
    decision: &Decision,
    policy: &Policy,
    form: DenyForm,
) -> HttpResponse {
    let retry_after = answer_headers(&mut response, decision, policy, true);
    if form == DenyForm::Forbidden {
        return response.finish();
    }
    let violated: Vec<&str> = decision
        .violated(policy)
        .map(|(_, limit)| limit.name.as_str())
        .collect();
    let detail = match retry_after {
        Some(seconds) => {
            format!(
                "rate limit exceeded ({}); retry in {seconds} s",
                violated.join(", ")
            )
        }
        None => match decision
            .violated(policy)
            .find(|(s, _)| s.wait_secs().is_none())
        {
            Some((state, limit)) => format!(
                "request cost {} exceeds the {} {} of limit {:?}: it can never pass",
                state.cost,
                if state.window.is_some() {
                    "quota"
                } else {
                    "burst"
                },
                state.capacity(),
                limit.name
            ),
            None => format!("rate limit exceeded ({})", violated.join(", ")),
        },
    };
    problem(
        &mut response,
        status,
        QUOTA_EXCEEDED,
        detail,
        violated,
        retry_after,
    )
}

/// The problem type of a request over a limit (draft-ietf-httpapi-ratelimit-headers, its
/// IANA HTTP problem type).
pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

/// RFC 9457 problem details.
#[derive(Serialize)]
struct Problem<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    title: &'a str,
    status: u16,
    detail: String,
    /// The names of the limits that refused the request.
    #[serde(rename = "violated-policies", skip_serializing_if = "<[_]>::is_empty")]
    violated_policies: &'a [&'a str],
    /// Deprecated: `violated-policies` under its earlier name, kept for one release.
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    limits: &'a [&'a str],
    #[serde(skip_serializing_if = "Option::is_none")]
    retry_after: Option<u64>,
}

/// A problem answer of type `kind` (`about:blank` or [`QUOTA_EXCEEDED`]) naming the `violated`
/// limits.
fn problem(
    response: &mut HttpResponseBuilder,
    status: StatusCode,
    kind: &'static str,
    detail: String,
    violated: Vec<&str>,
    retry_after: Option<u64>,
) -> HttpResponse {
    let body = Problem {
        kind,
        title: status.canonical_reason().unwrap_or("Denied"),
        status: status.as_u16(),
        detail,
        violated_policies: &violated,
        limits: &violated,
        retry_after,
    };
    response
        .content_type("application/problem+json")
        .body(serde_json::to_string(&body).unwrap_or_default())
}

/// The quota headers of the families configured in `response.headers`.
/// The answer's headers (see [`each_header`]); the `Retry-After` given.
fn answer_headers(
    response: &mut HttpResponseBuilder,
    decision: &Decision,
    policy: &Policy,
    refused: bool,
) -> Option<u64> {
    each_header(decision, policy, refused, Carrier::Http, |name, value| {
        response.insert_header((name, Quota(value)));
    })
}

/// A quota value as actix writes it: the answer layer knows no HTTP framework.
struct Quota(QuotaValue);

impl actix_web::http::header::TryIntoHeaderValue for Quota {
    type Error = actix_web::http::header::InvalidHeaderValue;

    fn try_into_value(self) -> Result<actix_web::http::header::HeaderValue, Self::Error> {
        match self.0 {
            QuotaValue::Number(number) => Ok(number.into()),
            QuotaValue::Text(text) => text.try_into_value(),
        }
    }
}

#[cfg(test)]
mod tests {
    use actix_web::body::{BodySize, MessageBody};
    use actix_web::http::header::HeaderValue;

    use super::*;
    use tollgate_core::config::Config;
    use tollgate_core::observe::metrics::Metrics;

    fn policy(toml: &str) -> Policy {
        use figment::providers::Format as _;
        let config: Config = figment::Figment::new()
            .merge(figment::providers::Toml::string(toml))
            .extract()
            .expect("a config");
        Policy::compile(&config, &Metrics::new()).expect("a valid config")
    }

    fn asking(value: &'static str) -> DenyForm {
        let mut headers = HeaderMap::new();
        headers.insert(X_TOLLGATE_DENY_STATUS, HeaderValue::from_static(value));
        DenyForm::requested(&headers)
    }

    fn header<'r>(response: &'r HttpResponse, name: &str) -> Option<&'r str> {
        response.headers().get(name).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn only_a_request_for_403_changes_the_form_of_a_refusal() {
        assert_eq!(DenyForm::requested(&HeaderMap::new()), DenyForm::AsIs);
        assert_eq!(asking("403"), DenyForm::Forbidden);
        assert_eq!(asking(" 403 "), DenyForm::Forbidden);
        for other in ["200", "204", "401", "429", "4030", "", "yes"] {
            assert_eq!(asking(other), DenyForm::AsIs, "{other:?}");
        }
    }

    #[test]
    fn a_forbidden_refusal_is_a_bodiless_403_naming_the_real_status() {
        let policy = policy(
            "[response]\ndeny_status = 420\n\n[[limits]]\nname = \"per-key\"\nrate = 1\n\
             burst = 1\nkey = [\"header:x-api-key\"]\non_missing = \"deny\"\n",
        );
        let missing = render_as(
            &Verdict::MissingKey { limit: 0 },
            &policy,
            DenyForm::Forbidden,
        );
        assert_eq!(missing.status(), StatusCode::FORBIDDEN);
        assert_eq!(header(&missing, "x-tollgate-status"), Some("420"));
        assert_eq!(missing.body().size(), BodySize::Sized(0));

        let closed = render_as(
            &Verdict::StoreFailed { allow: false },
            &policy,
            DenyForm::Forbidden,
        );
        assert_eq!(closed.status(), StatusCode::FORBIDDEN);
        assert_eq!(header(&closed, "x-tollgate-status"), Some("503"));
        assert_eq!(header(&closed, "retry-after"), Some("1"));
        assert_eq!(closed.body().size(), BodySize::Sized(0));
    }

    #[test]
    fn refusals_keep_their_own_status_and_body_unless_asked() {
        let policy = policy("");
        let closed = render(&Verdict::StoreFailed { allow: false }, &policy);
        assert_eq!(closed.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&closed, "x-tollgate-status"), None);
        assert!(matches!(closed.body().size(), BodySize::Sized(n) if n > 0));
        let allowed = render_as(&Verdict::Unlimited, &policy, DenyForm::Forbidden);
        assert_eq!(allowed.status(), StatusCode::OK, "an allow stays an allow");
        assert_eq!(header(&allowed, "x-tollgate-status"), None);
    }
}
