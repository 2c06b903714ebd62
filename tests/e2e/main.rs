//! The end-to-end tier (`cargo test --features e2e --test e2e`): the real nginx, Traefik and
//! Envoy in front of tollgate, the deployment files, Redis Cluster and Sentinel, faults under load.
//! One module per concern; `cargo test --features e2e --test e2e <module>::` runs one.
// Tests and load tools compute ratios and figures; the library's cast lints (Cargo.toml)
// guard its token arithmetic, not these.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]

#[path = "../support/mod.rs"]
mod support;

mod cluster;
mod deploy_artifacts;
mod dodge;
mod envoy;
mod envoy_gateway;
mod erl_metrics;
mod erl_redis;
mod faults;
mod held_ids;
mod helm_chart;
mod import_ingress;
mod ingress_examples;
mod metrics_exposition;
mod nginx;
mod regions;
mod rlqs;
mod rlqs_flood;
mod sentinel;
mod slow_redis;
mod tracing;
mod traefik;
