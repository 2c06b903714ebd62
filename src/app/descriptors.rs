//! The process's file descriptor limit. Every connection holds one, on every listener alike:
//! once the soft `RLIMIT_NOFILE` is reached, `accept` fails on all of them, `/check` included.
//! The soft limit (often 1,024) is raised to the hard one at start, as servers do, and the
//! gRPC connection cap defaults to half of what is then in force, leaving the other half to
//! the HTTP listeners, Redis and files.

use tollgate_core::config::DEFAULT_GRPC_MAX_CONNECTIONS;

/// Raises the soft descriptor limit to the hard one (logged once, at info) and returns the
/// soft limit in force afterwards; `None` when it cannot be read.
pub fn raise_soft_limit() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid, writable rlimit for the call to fill.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        log::warn!(
            "cannot read the file descriptor limit: {}",
            std::io::Error::last_os_error()
        );
        return None;
    }
    let before = limit.rlim_cur;
    if before >= limit.rlim_max {
        return Some(before);
    }
    let raised = libc::rlimit {
        rlim_cur: limit.rlim_max,
        rlim_max: limit.rlim_max,
    };
    // SAFETY: `raised` is a valid rlimit; a soft limit up to the hard one needs no privilege.
    if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
        log::warn!(
            "cannot raise the file descriptor limit from {before}: {}",
            std::io::Error::last_os_error()
        );
        return Some(before);
    }
    log::info!(
        "file descriptor limit raised from {before} to {} (the hard limit)",
        limit.rlim_max
    );
    Some(limit.rlim_max)
}

/// `grpc_max_connections` when it is not set: half of `soft_limit`, at most
/// [`DEFAULT_GRPC_MAX_CONNECTIONS`] (and that when the limit is unknown).
pub fn default_grpc_max_connections(soft_limit: Option<u64>) -> u32 {
    soft_limit
        .map(|limit| limit / 2)
        .and_then(|half| u32::try_from(half).ok())
        .map_or(DEFAULT_GRPC_MAX_CONNECTIONS, |half| {
            half.clamp(1, DEFAULT_GRPC_MAX_CONNECTIONS)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_cap_is_half_the_limit_within_bounds() {
        assert_eq!(default_grpc_max_connections(Some(1_024)), 512);
        assert_eq!(default_grpc_max_connections(Some(1)), 1);
        assert_eq!(
            default_grpc_max_connections(Some(1_048_576)),
            DEFAULT_GRPC_MAX_CONNECTIONS
        );
        assert_eq!(
            default_grpc_max_connections(Some(u64::MAX)),
            DEFAULT_GRPC_MAX_CONNECTIONS
        );
        assert_eq!(
            default_grpc_max_connections(None),
            DEFAULT_GRPC_MAX_CONNECTIONS
        );
    }

    #[test]
    fn after_the_raise_the_soft_limit_is_the_hard_one() {
        let soft = raise_soft_limit().expect("readable on Linux");
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `limit` is a valid, writable rlimit for the call to fill.
        let read = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
        assert_eq!(read, 0);
        assert_eq!(limit.rlim_cur, soft);
        assert_eq!(limit.rlim_cur, limit.rlim_max);
    }
}
