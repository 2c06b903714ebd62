//! The names of the `ratelimit` header family, checked once when the policy is built so that
//! rendering an answer never parses a name.

use http::HeaderName;

use crate::config::{ConfigError, RatelimitNames};

#[derive(Debug, Clone)]
pub struct RatelimitHeaders {
    pub limit: HeaderName,
    pub remaining: HeaderName,
    pub reset: HeaderName,
}

impl RatelimitHeaders {
    pub fn compile(names: &RatelimitNames) -> Result<RatelimitHeaders, ConfigError> {
        let parse = |field: &str, text: &str| {
            HeaderName::from_bytes(text.as_bytes()).map_err(|_| {
                ConfigError::new(
                    format!("response.ratelimit_names.{field}"),
                    format!("{text:?} is not a header name"),
                )
            })
        };
        Ok(RatelimitHeaders {
            limit: parse("limit", &names.limit)?,
            remaining: parse("remaining", &names.remaining)?,
            reset: parse("reset", &names.reset)?,
        })
    }
}
