//! The memory store's pools of shares.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use super::{allocate, Grant, Holding, Pool, ShareRequest};

/// How often, at most, expired pools are swept out (µs): a sweep walks every pool.
const SWEEP_EVERY_US: u64 = 1_000_000;

/// The memory store's pools: behind one lock taken once per batch of reports (a report
/// message every few seconds per Envoy, never a request's path).
#[derive(Debug, Default)]
pub struct Pools {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    pools: HashMap<String, Pool>,
    swept_us: u64,
}

impl Pools {
    /// [`allocate`] on each request's pool, in order; a pool past its expiry starts afresh.
    pub fn share(&self, requests: &[ShareRequest], now_us: u64) -> Vec<Grant> {
        let mut inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        if now_us.saturating_sub(inner.swept_us) >= SWEEP_EVERY_US {
            inner.pools.retain(|_, pool| pool.expires_us > now_us);
            inner.swept_us = now_us;
        }
        requests
            .iter()
            .map(|request| {
                let pool = inner.pools.entry(request.key.clone()).or_default();
                if pool.expires_us <= now_us {
                    *pool = Pool::default();
                }
                allocate(pool, request, now_us)
            })
            .collect()
    }

    /// The holders of pool `key` that still hold something at `now_us`, sorted by id.
    pub fn holders(&self, key: &str, now_us: u64) -> Vec<(String, Holding)> {
        let inner = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut holders: Vec<(String, Holding)> = inner
            .pools
            .get(key)
            .filter(|pool| pool.expires_us > now_us)
            .map(|pool| {
                pool.holders
                    .iter()
                    .filter(|(_, h)| h.counted(now_us) != (0, 0))
                    .cloned()
                    .collect()
            })
            .unwrap_or_default();
        holders.sort_by(|a, b| a.0.cmp(&b.0));
        holders
    }
}
