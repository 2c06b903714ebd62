//! Where buckets live. A [`Store`] decides several buckets at once, atomically: the request is
//! allowed only if every non-shadow bucket holds its cost, and only then is anything charged.
//! Two implementations share the semantics of `lua/token_bucket.lua`: [`redis::RedisStore`]
//! runs that script; [`memory::MemoryStore`] is its in-process twin.
//!
//! What a key counts, and how each kind is decided, spelled to the scripts and read back, is
//! its kind's ([`crate::kinds`]); every kind is decided in the same atomic call. A request with
//! cost 0 (a `charge = "report"` limit, a gRPC look) is admitted while its key holds one whole
//! request and charges nothing; [`Store::report`] charges such keys later.

pub mod breaker;
pub mod memory;
pub mod redis;
pub mod region;
pub mod rlqs;

use std::future::Future;
use std::time::Instant;

use crate::kinds::global::Share;
use crate::kinds::reserve::{Settle, Settled};
use crate::kinds::Slice;
use crate::kinds::{BucketOutcome, BucketRequest, ReportCharge, Reserved};

/// The key beside bucket `key` holding its RLQS shares (same Cluster slot).
pub fn shares_key(key: &str) -> String {
    format!("{key}:s")
}

/// The key beside bucket `key` holding its reservations (same Cluster slot: the hash tag is
/// the bucket key's).
pub fn reservations_key(key: &str) -> String {
    format!("{key}:r")
}

/// The key beside bucket `key` holding its expired reservations, still open to one late
/// settle (`lua/stored.lua`'s sweep moves them there).
pub fn late_reservations_key(key: &str) -> String {
    format!("{key}:x")
}

/// The store's answer for one request: allowed or not, and every bucket's state, in the order
/// of the request slice.
#[derive(Debug, Clone, PartialEq)]
pub struct StoreDecision {
    pub allowed: bool,
    pub buckets: Vec<BucketOutcome>,
    /// The slices taken by borrowing buckets (none without one).
    pub slices: Vec<Slice>,
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
    /// The store will not run scripts at all (an ACL without `@scripting`, `EVAL` renamed
    /// away, a server without Lua): no retry helps until an operator acts.
    #[error(
        "the store refuses scripts ({0}); tollgate decides with Lua scripts: grant its user \
         +@scripting, restore EVAL/EVALSHA, or load the Lua module (Valkey 9.1 and later)"
    )]
    ScriptsRefused(String),
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

    /// Whether the store has answered since start: until it has, tollgate is not ready,
    /// whatever `on_error` says.
    fn has_answered(&self) -> bool {
        true
    }

    /// Applies charges known after the response, each unconditionally; returns every key's
    /// state afterwards, in order. Not atomic across keys (nothing is ever refused).
    fn report(
        &self,
        charges: &[ReportCharge],
    ) -> impl Future<Output = Result<Vec<BucketOutcome>, StoreError>> {
        let _ = charges;
        async { Err(StoreError::Other("this store takes no reports".into())) }
    }

    /// One key as the next check would find it, before any charge (`GET /v1/buckets`):
    /// `tokens` is a bucket's level now or what is left of a quota, `enough` whether
    /// `bucket.cost` could be paid. Charges nothing, writes nothing.
    fn peek(
        &self,
        bucket: &BucketRequest,
    ) -> impl Future<Output = Result<BucketOutcome, StoreError>> {
        let _ = bucket;
        async { Err(StoreError::Other("this store cannot peek".into())) }
    }

    /// Deletes one key, so it reads full (a quota: unused) at the next check; a shared store
    /// also tells every instance to forget its cached denials of the key. Returns whether the
    /// key existed.
    fn reset(&self, key: &str) -> impl Future<Output = Result<bool, StoreError>> {
        let _ = key;
        async { Err(StoreError::Other("this store cannot reset".into())) }
    }

    /// Gives back the lease `member` of the concurrency key `key`; whether it was held
    /// (false when it was released already or expired: releasing is idempotent).
    fn release(&self, key: &str, member: &str) -> impl Future<Output = Result<bool, StoreError>> {
        let _ = (key, member);
        async { Err(StoreError::Other("this store holds no leases".into())) }
    }

    /// Settles one reservation (see [`Settle`]), atomically and at most once per id.
    fn settle(&self, settle: &Settle) -> impl Future<Output = Result<Settled, StoreError>> {
        let _ = settle;
        async { Err(StoreError::Other("this store holds no reservations".into())) }
    }

    /// The reservations held now beside the reserving bucket `bucket` (peek); for a
    /// borrowing bucket, the tokens its live slices hold and how many groups hold them.
    fn reserved(
        &self,
        bucket: &BucketRequest,
    ) -> impl Future<Output = Result<Reserved, StoreError>> {
        let _ = bucket;
        async { Err(StoreError::Other("this store holds no reservations".into())) }
    }

    /// Reports of holders to pools of RLQS shares ([`rlqs::allocate`], each pool
    /// atomically), one result per request, in order, decided by `deadline` (RLQS's own,
    /// behind a breaker of its own: a report never spends a check's deadline or breaker).
    fn share(
        &self,
        requests: &[rlqs::ShareRequest],
        deadline: Instant,
    ) -> impl Future<Output = Vec<Result<rlqs::Grant, StoreError>>> {
        let _ = deadline;
        let refused = requests
            .iter()
            .map(|_| Err(StoreError::Other("this store holds no shares".into())))
            .collect();
        async { refused }
    }

    /// The holders of a pool of shares as stored (peek), sorted by id, and the store's now
    /// (µs) they are to be read at.
    fn shares_of(
        &self,
        key: &str,
    ) -> impl Future<Output = Result<(u64, Vec<(String, rlqs::Holding)>), StoreError>> {
        let _ = key;
        async { Err(StoreError::Other("this store holds no shares".into())) }
    }

    /// Writes the share the home assigned this region for `bucket`, a global limit's key
    /// ([`crate::kinds::global`]): its bucket is brought to now under the old share first, in
    /// the same atomic step. Returns the bucket's level (micro-tokens) and the store's now (µs).
    fn put_share(
        &self,
        bucket: &BucketRequest,
        share: Share,
    ) -> impl Future<Output = Result<(f64, u64), StoreError>> {
        let _ = (bucket, share);
        async {
            Err(StoreError::Other(
                "this store holds no global shares".into(),
            ))
        }
    }

    /// One operation of a region's bookkeeping (demand, the reporter's lease).
    fn region(
        &self,
        op: region::RegionOp,
    ) -> impl Future<Output = Result<region::RegionReply, StoreError>> {
        let _ = op;
        async {
            Err(StoreError::Other(
                "this store keeps no region's books".into(),
            ))
        }
    }

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

impl AnyStore {
    /// Readies the calling worker's own connection to Redis, if it has one (a no-op for
    /// the memory store).
    pub async fn warm_up(&self) {
        if let AnyStore::Redis(store) = self {
            store.warm_up().await;
        }
    }
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

    fn has_answered(&self) -> bool {
        match self {
            AnyStore::Memory(store) => store.has_answered(),
            AnyStore::Redis(store) => store.has_answered(),
        }
    }

    async fn report(&self, charges: &[ReportCharge]) -> Result<Vec<BucketOutcome>, StoreError> {
        match self {
            AnyStore::Memory(store) => store.report(charges).await,
            AnyStore::Redis(store) => store.report(charges).await,
        }
    }

    async fn peek(&self, bucket: &BucketRequest) -> Result<BucketOutcome, StoreError> {
        match self {
            AnyStore::Memory(store) => store.peek(bucket).await,
            AnyStore::Redis(store) => store.peek(bucket).await,
        }
    }

    async fn reset(&self, key: &str) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(store) => store.reset(key).await,
            AnyStore::Redis(store) => store.reset(key).await,
        }
    }

    async fn release(&self, key: &str, member: &str) -> Result<bool, StoreError> {
        match self {
            AnyStore::Memory(store) => store.release(key, member).await,
            AnyStore::Redis(store) => store.release(key, member).await,
        }
    }

    async fn settle(&self, settle: &Settle) -> Result<Settled, StoreError> {
        match self {
            AnyStore::Memory(store) => store.settle(settle).await,
            AnyStore::Redis(store) => store.settle(settle).await,
        }
    }

    async fn reserved(&self, bucket: &BucketRequest) -> Result<Reserved, StoreError> {
        match self {
            AnyStore::Memory(store) => store.reserved(bucket).await,
            AnyStore::Redis(store) => store.reserved(bucket).await,
        }
    }

    async fn share(
        &self,
        requests: &[rlqs::ShareRequest],
        deadline: Instant,
    ) -> Vec<Result<rlqs::Grant, StoreError>> {
        match self {
            AnyStore::Memory(store) => store.share(requests, deadline).await,
            AnyStore::Redis(store) => store.share(requests, deadline).await,
        }
    }

    async fn shares_of(
        &self,
        key: &str,
    ) -> Result<(u64, Vec<(String, rlqs::Holding)>), StoreError> {
        match self {
            AnyStore::Memory(store) => store.shares_of(key).await,
            AnyStore::Redis(store) => store.shares_of(key).await,
        }
    }

    async fn put_share(
        &self,
        bucket: &BucketRequest,
        share: Share,
    ) -> Result<(f64, u64), StoreError> {
        match self {
            AnyStore::Memory(store) => store.put_share(bucket, share).await,
            AnyStore::Redis(store) => store.put_share(bucket, share).await,
        }
    }

    async fn region(&self, op: region::RegionOp) -> Result<region::RegionReply, StoreError> {
        match self {
            AnyStore::Memory(store) => store.region(op).await,
            AnyStore::Redis(store) => store.region(op).await,
        }
    }

    fn splits_requests(&self) -> bool {
        match self {
            AnyStore::Memory(store) => store.splits_requests(),
            AnyStore::Redis(store) => store.splits_requests(),
        }
    }
}
