//! envoyproxy/ratelimit's variables that tollgate does not read, yet that would change what
//! envoyproxy/ratelimit does in a way a client or operator would see: each is refused when
//! set to ask for that, naming it, rather than ignored. (Its tuning variables, whose absence
//! changes no answer, are ignored; docs/REFERENCE.md lists both.)

use crate::base::go::parse_bool;
use crate::config::ConfigError;

/// Refuses the first of these variables set to what tollgate cannot do.
pub(super) fn refuse_unsupported(var: &impl Fn(&str) -> Option<String>) -> Result<(), ConfigError> {
    // The gRPC service on a unix socket in place of GRPC_HOST:GRPC_PORT: Envoy, pointed at the
    // socket, would find nothing there.
    if var("GRPC_UDS").is_some_and(|path| !path.is_empty()) {
        return Err(ConfigError::new(
            "GRPC_UDS",
            "a unix socket for gRPC is not supported: unset it and use GRPC_HOST/GRPC_PORT",
        ));
    }
    // Health failing while Redis is unreachable: tollgate's readiness stays 200 then unless
    // store.on_error is "deny", which also changes the answers.
    const HEALTH: &str = "REDIS_HEALTH_CHECK_ACTIVE_CONNECTION";
    if let Some(text) = var(HEALTH) {
        match parse_bool(&text) {
            None => {
                return Err(ConfigError::new(HEALTH, format!("{text:?} is not a bool")));
            }
            Some(true) => {
                return Err(ConfigError::new(
                    HEALTH,
                    "true is not supported: readiness follows store.on_error (\"deny\": \
                     not ready while Redis fails)",
                ));
            }
            Some(false) => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_variable_asking_for_what_tollgate_cannot_do_is_refused() {
        let only = |name: &'static str, value: &'static str| {
            move |asked: &str| (asked == name).then(|| value.to_string())
        };
        for (name, value) in [
            ("GRPC_UDS", "/tmp/ratelimit.sock"),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "true"),
            ("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "yes"),
        ] {
            let refused = refuse_unsupported(&only(name, value)).unwrap_err();
            assert_eq!(refused.key, name);
        }
        assert!(refuse_unsupported(&only("GRPC_UDS", "")).is_ok());
        assert!(refuse_unsupported(&only("REDIS_HEALTH_CHECK_ACTIVE_CONNECTION", "0")).is_ok());
    }
}
