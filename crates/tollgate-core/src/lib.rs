//! tollgate's core: a rate-limit decision without a protocol. What a check reads, what the
//! operator asked for, the store that counts, the limiter that decides and what an answer
//! says; no HTTP framework, gRPC stack or protobuf (the server package brings those, at its
//! edges).
//!
//! # Layout
//!
//! Layers, bottom to top; each module imports only the layers below it (a test in the server
//! package reads the sources and checks it, and that no import cycle exists):
//!
//! - [`base`]: value types: [`base::clock`] (time as a parameter, so tests advance it),
//!   [`base::rate`] (`"100/min"`), [`base::keys`] (the spelling of every store key),
//!   [`base::normalise`] (paths, hosts and IPs spelled the way the proxies route them),
//!   [`base::redact`] (what a reader without the admin token sees of a key: salted
//!   fingerprints), [`base::timings`] (every interval of the background duties, in one value
//!   handed down from start-up), [`base::read`] (an operator's file read up to a cap).
//! - [`config`]: defaults < TOML file < `TOLLGATE_*` environment: schema, loading, validation,
//!   the summary `validate` prints; [`config::tls_files`] (a TLS triple, as the store, xDS and
//!   the gRPC listener name it); [`config::regions`] (`[region]`, `[home]`, a limit's scope).
//! - [`request`]: what a check reads: original method, path, host, client IP (XFF walk),
//!   normalised the way the proxies route; headers read through [`request::Headers`], which
//!   each protocol lends its own map to.
//! - [`observe`]: [`observe::metrics`] (every metric name in one place), [`observe::top`] (the
//!   most denied keys, bounded memory), [`observe::denial_log`], [`observe::trace`] (a
//!   decision's span: the caller's trace context, sampling; finished spans are handed to the
//!   server's exporter).
//! - [`kinds`]: what a store key counts, a limit's kind, one file each: [`kinds::bucket`],
//!   [`kinds::quota`], [`kinds::concurrency`], [`kinds::reserve`], [`kinds::borrow`],
//!   [`kinds::global`] (a global limit's key in a region: floor + the home's share). Each
//!   is built and checked from its config, spelled to the Lua scripts and read back, stepped
//!   in the memory store (the scripts' arithmetic twin), shown by a peek, reported and
//!   settled in its own file; [`kinds::Meter`] hands every question to its kind in one
//!   place. Below the store, so the kinds know no connection, lock or shard, and the policy
//!   and the admin API ask them without naming the store.
//! - [`store`]: the [`store::Store`] trait; [`store::memory`] (sharded, bounded) and
//!   [`store::redis`] (Lua via `EVALSHA`, deadlines, circuit breaker, coalescing; one node,
//!   Cluster or Sentinel); [`store::rlqs`] the RLQS share allocator, twin of
//!   `lua/rlqs.lua`; [`store::region`] a region's demand hash and reporter lease.
//! - [`policy`]: what the operator asked for, compiled into one [`policy::Policy`]:
//!   [`policy::limit`] (a limit as it runs; `limit/build`: built from its config and
//!   checked), [`policy::matcher`], [`policy::exempt`], [`policy::overrides`]
//!   (files), [`policy::runtime_overrides`] (admin API, kept in the store),
//!   [`policy::descriptors`] (the gRPC service's rules), [`policy::rlqs`] (which limit and
//!   key an Envoy quota bucket id stands for), [`policy::regions`] (at home: which global
//!   limit and key a region's bucket id stands for, its pool what the floors leave).
//! - [`limiter`]: the decision without HTTP: one atomic store call, `on_error` fallbacks;
//!   [`limiter::deny_cache`], [`limiter::borrow`] (slices of hot keys' tokens, admitted
//!   from without a store call), [`limiter::decision`] (the verdict as a value),
//!   [`limiter::report`] (charges known after the response), [`limiter::rlqs`] (a key's
//!   numbers as the units of its RLQS pool, a grant as Envoy's token bucket),
//!   [`limiter::region`] (a region's demand, lease and share writes: the reporter's doors).
//! - [`answer`]: what an answer says whatever protocol carries it (a refusal and why, the
//!   quota headers).
//!
//! Beside the layers, envoyproxy/ratelimit's model ([`erl`]): its `[envoy]` table and
//! environment, its rule tree, its counters. They are here because the one `Config` holds
//! the table and the one `Policy` the compiled tree; its wire (protobuf, gRPC, xDS) is the
//! `tollgate-erl` package.

pub mod answer;
pub mod base;
pub mod config;
pub mod erl;
pub mod kinds;
pub mod limiter;
pub mod observe;
pub mod policy;
pub mod request;
pub mod store;
