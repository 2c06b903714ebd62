//! What tollgate tells its operators: Prometheus metrics, the most denied keys, the denial log.

pub mod denial_log;
pub mod metrics;
pub mod top;
