//! envoyproxy/ratelimit (ERL) compatibility, the part the core holds: each part is named
//! after the layer it belongs to, and is judged as that layer:
//!
//! - [`config`]: its `[envoy]` table (descriptor rules, `[envoy.metrics]`, `[envoy.xds]`), its
//!   YAML and config directory, and its environment ([`config::env`]: one table of its
//!   variables, read in one place).
//! - [`observe`]: its counters under its names, served as Prometheus series and statsd lines.
//! - [`policy`]: its descriptor tree, matched as it matches, and each rule's stats key.
//!
//! Its wire (a request of one of its domains planned, answered and counted as it does them;
//! its metrics' listener, statsd duty and xDS client) is the `tollgate-erl` package.

pub mod config;
pub mod observe;
pub mod policy;
