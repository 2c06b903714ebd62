//! What goes wrong in an admin call, as a type that renders itself: every admin handler is a
//! chain of `?` over [`AdminError`], and [`Operator`] refuses a mutating call before its
//! handler runs.

use std::future::{ready, Ready};

use actix_web::dev::Payload;
use actix_web::http::header::{self, HeaderValue};
use actix_web::http::StatusCode;
use actix_web::{web, FromRequest, HttpRequest, HttpResponse, ResponseError};

use super::{problem, Caller};
use crate::state::AppState;
use tollgate_core::answer::STORE_FAILED_RETRY_AFTER_S;
use tollgate_core::limiter::peek::Unanswered;

/// An admin call's failure, answered as `application/problem+json`.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// A mutating call while no admin token is configured: 403.
    #[error("{what} is disabled: set admin_token (or admin_token_file, or the environment variable TOLLGATE_ADMIN_TOKEN)")]
    Disabled { what: String },
    /// A mutating call without the token: 401 with `WWW-Authenticate: Bearer`.
    #[error("needs Authorization: Bearer <admin_token>")]
    Unauthorized,
    /// Something wrong in the request: 400, naming the field at fault.
    #[error("{detail}")]
    BadRequest { detail: String, field: String },
    /// No such limit or entry: 404.
    #[error("{detail}")]
    NotFound {
        detail: String,
        field: Option<String>,
    },
    /// The change does not fit (an override table at its cap): 409.
    #[error("{0}")]
    Conflict(String),
    /// The store did not answer, or too many reads are in flight: 503, `Retry-After: 1`.
    #[error("{0}")]
    Unavailable(String),
}

impl AdminError {
    pub fn bad(field: impl Into<String>, detail: impl Into<String>) -> AdminError {
        AdminError::BadRequest {
            detail: detail.into(),
            field: field.into(),
        }
    }
}

/// A store call that failed: 503 with `Retry-After: 1`. Calls whose retry needs a word of
/// its own (that a release is idempotent, that nothing was charged) say so themselves.
impl From<Unanswered> for AdminError {
    fn from(error: Unanswered) -> AdminError {
        AdminError::Unavailable(error.to_string())
    }
}

impl ResponseError for AdminError {
    fn status_code(&self) -> StatusCode {
        match self {
            AdminError::Disabled { .. } => StatusCode::FORBIDDEN,
            AdminError::Unauthorized => StatusCode::UNAUTHORIZED,
            AdminError::BadRequest { .. } => StatusCode::BAD_REQUEST,
            AdminError::NotFound { .. } => StatusCode::NOT_FOUND,
            AdminError::Conflict(_) => StatusCode::CONFLICT,
            AdminError::Unavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    fn error_response(&self) -> HttpResponse {
        let field = match self {
            AdminError::BadRequest { field, .. } => Some(field.clone()),
            AdminError::NotFound { field, .. } => field.clone(),
            _ => None,
        };
        let mut response = problem(self.status_code(), self.to_string(), field);
        let extra = match self {
            AdminError::Unauthorized => {
                Some((header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer")))
            }
            // As a check refused because the store failed.
            AdminError::Unavailable(_) => Some((
                header::RETRY_AFTER,
                HeaderValue::from(STORE_FAILED_RETRY_AFTER_S),
            )),
            _ => None,
        };
        if let Some((name, value)) = extra {
            response.headers_mut().insert(name, value);
        }
        response
    }
}

/// Proof that the caller holds the admin token: a handler taking it runs only for the
/// operator. Refused with 403 naming the setting when no token is configured, 401 otherwise.
pub struct Operator;

impl FromRequest for Operator {
    type Error = AdminError;
    type Future = Ready<Result<Operator, AdminError>>;

    fn from_request(request: &HttpRequest, _: &mut Payload) -> Self::Future {
        let token = request
            .app_data::<web::Data<AppState>>()
            .and_then(|state| state.limiter.policy().admin_token.clone());
        let Some(token) = token else {
            let what = format!(
                "{} {}",
                request.method(),
                request
                    .match_pattern()
                    .unwrap_or_else(|| request.path().into())
            );
            return ready(Err(AdminError::Disabled { what }));
        };
        ready(match super::caller(request, Some(&token)) {
            Caller::Operator => Ok(Operator),
            Caller::Anonymous => Err(AdminError::Unauthorized),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(response: &HttpResponse, name: header::HeaderName) -> Option<&str> {
        response.headers().get(name).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn each_error_renders_its_status_headers_and_field() {
        let unauthorized = AdminError::Unauthorized.error_response();
        assert_eq!(unauthorized.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(
            header(&unauthorized, header::WWW_AUTHENTICATE),
            Some("Bearer")
        );
        let busy = AdminError::Unavailable("retry".into()).error_response();
        assert_eq!(busy.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(header(&busy, header::RETRY_AFTER), Some("1"));
        let disabled = AdminError::Disabled {
            what: "PUT /v1/overrides/{limit}".into(),
        };
        assert_eq!(disabled.error_response().status(), StatusCode::FORBIDDEN);
        assert!(disabled.to_string().contains("admin_token"));
        let bad = AdminError::bad("key[0]", "is empty").error_response();
        assert_eq!(bad.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            header(&bad, header::CONTENT_TYPE),
            Some("application/problem+json")
        );
        assert_eq!(
            AdminError::Conflict("full".into())
                .error_response()
                .status(),
            StatusCode::CONFLICT
        );
    }
}
