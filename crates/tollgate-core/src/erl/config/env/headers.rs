//! envoyproxy/ratelimit's variables for domains split over several files and for the quota
//! headers of its answers:
//!
//! - none of them: gRPC answers carry no quota headers unless `response.grpc_headers` says
//!   otherwise, as envoyproxy/ratelimit sends none;
//! - `MERGE_DOMAIN_CONFIG`: `envoy.merge_domains`;
//! - `LIMIT_RESPONSE_HEADERS_ENABLED`: `envoy.response_headers`, and then `LIMIT_LIMIT_HEADER`,
//!   `LIMIT_REMAINING_HEADER`, `LIMIT_RESET_HEADER` rename the headers
//!   (`response.ratelimit_names`); as there, the names count only when it is true.

use super::{
    ErlEnv, LIMIT_LIMIT_HEADER, LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER,
    LIMIT_RESPONSE_HEADERS_ENABLED, MERGE_DOMAIN_CONFIG,
};
use crate::config::{Config, ConfigError};

pub(super) fn apply(config: &mut Config, env: &ErlEnv) -> Result<(), ConfigError> {
    config.envoy.merge_domains |= env.flag(&MERGE_DOMAIN_CONFIG)?;
    // envoyproxy/ratelimit adds no quota headers of its own unless told to; Envoy Gateway turns
    // on Envoy's own `X-RateLimit-*`, which tollgate's would then duplicate.
    config.response.grpc_headers.get_or_insert_with(Vec::new);
    if !env.flag(&LIMIT_RESPONSE_HEADERS_ENABLED)? {
        return Ok(());
    }
    config.envoy.response_headers = true;
    let names = &mut config.response.ratelimit_names;
    for (row, name) in [
        (&LIMIT_LIMIT_HEADER, &mut names.limit),
        (&LIMIT_REMAINING_HEADER, &mut names.remaining),
        (&LIMIT_RESET_HEADER, &mut names.reset),
    ] {
        if let Some(text) = env.get(row) {
            if !is_header_name(text) {
                return Err(row.refuse(format!("{text:?} is not a header name")));
            }
            *name = text.to_string();
        }
    }
    Ok(())
}

/// An HTTP field name: one or more token characters (RFC 9110, "tchar").
fn is_header_name(text: &str) -> bool {
    !text.is_empty()
        && text
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b))
}

#[cfg(test)]
mod tests;
