//! What tollgate tells its operators: Prometheus metrics, the most denied keys, the denial log,
//! envoyproxy/ratelimit's own metrics for dashboards written against it, and the decisions'
//! spans.

pub mod denial_log;
pub mod metrics;
pub mod top;
pub mod trace;
