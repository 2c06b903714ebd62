//! Where buckets live. A [`Store`] decides several buckets at once, atomically: the request is
//! allowed only if every non-shadow bucket holds its cost, and only then is anything charged.
//! Two implementations share the semantics of `lua/token_bucket.lua`: [`redis::RedisStore`]
//! runs that script; [`memory::MemoryStore`] is its in-process twin.

pub mod breaker;
pub mod bucket;
pub mod memory;
pub mod redis;

use std::future::Future;

/// One bucket to draw from.
#[derive(Debug, Clone, PartialEq)]
pub struct BucketRequest {
    /// The full store key, built by [`crate::keys`].
    pub key: String,
    /// Tokens per second.
    pub rate: f64,
    /// Capacity.
    pub burst: f64,
    pub cost: u64,
    /// Reported, never denies.
    pub shadow: bool,
    /// The caller's tag for this bucket (the index of its limit); stores pass it through.
    pub limit: usize,
}

/// One bucket after a decision.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BucketOutcome {
    /// Tokens left after the call (after the charge, if the request was allowed).
    pub tokens: f64,
    /// Whether the bucket held its cost.
    pub enough: bool,
}

/// The store's answer for one request: allowed or not, and every bucket's state, in the order
/// of the request slice.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreDecision {
    pub allowed: bool,
    pub buckets: Vec<BucketOutcome>,
}

/// Why the store could not decide.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    #[error("store call timed out")]
    Timeout,
    #[error("store connection failed: {0}")]
    Connection(String),
    #[error("store script failed: {0}")]
    Script(String),
    #[error("store error: {0}")]
    Other(String),
    /// The circuit breaker is open: the store was not called.
    #[error("store marked down; retrying shortly")]
    Unavailable,
}

/// A place that holds buckets and decides requests against them atomically.
pub trait Store: Send + Sync + 'static {
    /// Decides all `buckets` together (see the module docs). An empty slice is allowed.
    fn decide(
        &self,
        buckets: &[BucketRequest],
    ) -> impl Future<Output = Result<StoreDecision, StoreError>>;

    /// Whether the store answers now (readiness).
    fn ping(&self) -> impl Future<Output = Result<(), StoreError>>;

    /// Whether the store may decide one request in parts and refund a part (a Redis Cluster,
    /// per slot): then a bucket can rise by more than its refill (see `deny_cache`).
    fn splits_requests(&self) -> bool {
        false
    }
}

/// The store chosen by `store.backend`.
pub enum AnyStore {
    Memory(memory::MemoryStore),
    Redis(Box<redis::RedisStore>),
}

impl Store for AnyStore {
    async fn decide(&self, buckets: &[BucketRequest]) -> Result<StoreDecision, StoreError> {
        match self {
            AnyStore::Memory(store) => store.decide(buckets).await,
            AnyStore::Redis(store) => store.decide(buckets).await,
        }
    }

    async fn ping(&self) -> Result<(), StoreError> {
        match self {
            AnyStore::Memory(store) => store.ping().await,
            AnyStore::Redis(store) => store.ping().await,
        }
    }

    fn splits_requests(&self) -> bool {
        match self {
            AnyStore::Memory(store) => store.splits_requests(),
            AnyStore::Redis(store) => store.splits_requests(),
        }
    }
}
