//! What tollgate tells its operators: Prometheus metrics, the most denied keys, the denial log,
//! and envoyproxy/ratelimit's own metrics for dashboards written against it.
//! the decisions' spans.

pub mod denial_log;
pub mod metrics;
pub mod top;
pub mod trace;
