//! tollgate: a rate-limit sidecar for ingress controllers.
//!
//! nginx `auth_request`, Traefik `ForwardAuth` and Envoy `ext_authz` call `/check` once per
//! client request; tollgate finds the limiter key in the forwarded headers, runs an atomic
//! token bucket in Redis (one Lua script, one round trip, Redis's clock) and answers 200 or 429
//! with the rate-limit headers the ingress passes on.
//!
//! # Layout
//!
//! One request flows top to bottom:
//!
//! - [`http`]: `/check`, `/healthz`, `/readyz`, `/metrics`; [`http::response`] renders a
//!   verdict as the whole answer: status, headers, body; the admin API ([`http::limits`],
//!   [`http::buckets`]: peek and reset, [`http::overrides`]) shares [`http::admin`].
//! - [`request`]: what `/check` reads: original method, path, host, client IP (XFF walk).
//! - [`limits`]: limits built from their config, cost; which limits apply to a request;
//!   [`exempt`] admits a request before any limit; [`matcher`] holds the match rules both
//!   use; [`overrides`] gives single keys their own policy; [`rate`] reads `"100/min"`;
//!   [`runtime_overrides`] holds the ones set through the admin API, kept in the store.
//! - [`keys`]: every store key is built here (escaping, hashing of hostile values).
//! - [`limiter`]: the decision without HTTP: one atomic store call, `on_error` fallbacks;
//!   [`deny_cache`] answers the denials Redis would surely repeat, without asking it.
//! - [`store`]: the [`store::Store`] trait; [`store::redis`] (Lua via `EVALSHA`, deadlines,
//!   circuit breaker; one node, a Cluster or a Sentinel-managed master; the checks queued on
//!   one thread together share one script call) and
//!   [`store::memory`] (sharded, bounded); [`store::bucket`] is the arithmetic twin of
//!   `lua/token_bucket.lua` and `lua/report.lua`, [`store::calendar`] of their UTC periods;
//!   [`store::redis::resets`] tells every instance's deny cache of a reset bucket.
//! - [`decision`]: the verdict as a value: remaining, reset, retry-after.
//! - [`report`]: `POST /report` without HTTP: charges known after the response.
//! - [`metrics`]: the Prometheus registry; every metric name in one place. Each limit's
//!   denials also count into [`top`] (the most denied keys, bounded memory, `GET /v1/top`)
//!   and, when asked, into [`denial_log`]; [`top_view`] is `tollgate top`.
//! - [`clock`]: time as a parameter ([`clock::Clock`]), so tests advance it, never sleep.
//! - [`config`]: defaults < TOML file < `TOLLGATE_*` environment: the schema, loading,
//!   validation of the settings and the summary `validate` prints, one file each.
//! - [`grpc`]: Envoy's rate limit service (`ShouldRateLimit`): descriptors become buckets for
//!   the same [`limiter`]; [`import`] converts envoyproxy/ratelimit's YAML to tollgate TOML.
//! - [`state`]: what every worker shares; [`server`]: the listeners, served until a shutdown
//!   future resolves; [`lifecycle`]: signals, reload, graceful drain, heartbeat.

pub mod clock;
pub mod config;
pub mod decision;
pub mod denial_log;
pub mod deny_cache;
pub mod exempt;
pub mod grpc;
pub mod http;
pub mod import;
pub mod keys;
pub mod lifecycle;
pub mod limiter;
pub mod limits;
pub mod matcher;
pub mod metrics;
pub mod overrides;
pub mod rate;
pub mod report;
pub mod request;
pub mod runtime_overrides;
pub mod server;
pub mod state;
pub mod store;
pub mod top;
pub mod top_view;
