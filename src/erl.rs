//! envoyproxy/ratelimit (ERL) compatibility: one wing beside the core, its parts named after
//! the layer each belongs to, so each is judged as that layer and imports only the core below
//! it (`tests/fast/layers.rs`):
//!
//! - [`config`]: its `[envoy]` table (descriptor rules, `[envoy.metrics]`, `[envoy.xds]`), its
//!   YAML and config directory, the resources of its xDS source, and its environment
//!   ([`config::env`]: one table of its variables, read in one place).
//! - [`observe`]: its counters under its names, served as Prometheus series and statsd lines.
//! - [`policy`]: its descriptor tree, matched as it matches, and each rule's stats key.
//! - [`grpc`]: a request of one of its domains planned, answered and counted as it does
//!   them; its `/json` forms.
//! - [`app`]: what runs beside the service: its metrics' listener and statsd duty, its xDS
//!   client.
//!
//! Its seam with the core: rules in (its rules become limits of the policy), buckets out (a
//! request of one of its domains becomes buckets the limiter decides), a verdict to shape
//! (the limiter's verdict answered as it answers).

pub mod app;
pub mod config;
pub mod grpc;
pub mod observe;
pub mod policy;
