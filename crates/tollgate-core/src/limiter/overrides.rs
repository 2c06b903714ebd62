//! Runtime overrides written through the door: kept in the store (Redis, shared by every
//! instance) or in this instance's policy (the memory store).

use super::Limiter;
use crate::policy::runtime_overrides::sync::{self, WriteError};
use crate::policy::runtime_overrides::Entry;
use crate::policy::Policy;
use crate::store::AnyStore;

impl Limiter<AnyStore> {
    /// Sets `limit`'s override for the key tail `tail` for `ttl_ms` (0: until deleted).
    pub async fn put_override(
        &self,
        policy: &Policy,
        limit: &str,
        tail: Vec<u8>,
        entry: Entry,
        ttl_ms: u64,
    ) -> Result<(), WriteError> {
        sync::put(
            &self.store,
            &policy.runtime,
            &policy.key_prefix,
            limit,
            tail,
            entry,
            ttl_ms,
        )
        .await
    }

    /// Removes `limit`'s override for `tail`; whether one was in force.
    pub async fn delete_override(
        &self,
        policy: &Policy,
        limit: &str,
        tail: &[u8],
    ) -> Result<bool, WriteError> {
        sync::delete(
            &self.store,
            &policy.runtime,
            &policy.key_prefix,
            limit,
            tail,
        )
        .await
    }
}
