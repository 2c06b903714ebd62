//! tollgate: a rate-limit sidecar for ingress controllers.
//!
//! nginx `auth_request`, Traefik `ForwardAuth` and Envoy `ext_authz` call `/check` once per
//! client request, and Envoy's rate limit filter calls `ShouldRateLimit`; tollgate finds the
//! limiter key, runs an atomic token bucket in Redis (one Lua script, one round trip, Redis's
//! clock) and answers allow or deny with the rate-limit headers the proxy passes on.
//!
//! This package is the server and its command line, above two libraries: `tollgate-core`
//! (the decision without a protocol: config, request, policy, store, limiter, answer) and
//! `tollgate-erl` (envoyproxy/ratelimit's wire).
//!
//! # Layout
//!
//! Layers above the core's, bottom to top; each module imports only the layers below it (CI
//! checks that no import cycle exists):
//!
//! - [`otlp`]: the spans' way out: the OTLP trace messages and the exporter, which batches
//!   the core's finished spans and sends them to a collector over HTTP or gRPC. Beside the
//!   core's `answer` (neither uses the other), started by `state`.
//! - [`state`]: what every handler shares (config, store, limiter, metrics), swapped whole
//!   on reload.
//! - [`http`] and [`grpc`]: the protocols: `/check`, probes, metrics and the admin API;
//!   Envoy's `ShouldRateLimit` (and envoyproxy/ratelimit's `/json`, `/healthcheck`);
//!   [`grpc::rlqs`], Envoy's quota service (`StreamRateLimitQuotas`).
//! - [`app`]: the running process: [`app::server`] (the listeners),
//!   [`app::signals`], [`app::reload`], [`app::drain`], [`app::heartbeat`],
//!   [`app::region`] (a region's reporter to the home of its global limits).
//! - [`cli`]: [`cli::import`] (envoyproxy/ratelimit YAML to TOML), [`cli::ingress_nginx`]
//!   (its annotations to TOML), [`cli::replay`] (an access log against a config),
//!   [`cli::top_view`] (`tollgate top`).

pub mod app;
pub mod cli;
pub mod grpc;
pub mod http;
pub mod otlp;
pub mod state;
