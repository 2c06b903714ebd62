//! What runs beside the service for envoyproxy/ratelimit's sake, started by the running
//! process (`crate::app::server`):
//!
//! - [`metrics`]: its metrics' Prometheus listener and statsd duty;
//! - [`xds`]: the client of its xDS config source, decoding each set of resources it receives
//!   into rules ([`xds::rules`]) and handing them to the process's reload.

pub mod metrics;
pub mod xds;
