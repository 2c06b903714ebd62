//! The fast tier: unit-sized and in-process behaviour, the real binary against a real
//! `redis-server` the harness starts. `cargo test` runs it in well under a minute after a build.
//! One module per concern; `cargo test --test fast <module>::` runs one.
// Tests and load tools compute ratios and figures; the library's cast lints (Cargo.toml)
// guard its token arithmetic, not these.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]

#[path = "../support/mod.rs"]
mod support;

mod admin_api;
mod admin_overrides;
mod admin_token;
mod borrow_instances;
mod borrow_store;
mod borrowing;
mod coalescing;
mod config_cli;
mod deny_cache;
mod erl_metrics;
mod erl_parity;
mod erl_rules;
mod exactness;
mod grpc;
mod grpc_connections;
mod grpc_tls;
mod hostile_input;
mod http_api;
mod import;
mod import_ingress;
mod layers;
mod leases;
mod lifecycle;
mod limiter;
mod override_log;
mod policies;
mod quotas;
mod redaction;
mod reference;
mod refund;
mod regions;
mod regions_model;
mod regions_store;
mod replay;
mod report_numbers;
mod reports;
mod reservations;
mod rlqs;
mod rlqs_bounds;
mod routes;
mod script_bytes;
mod security;
mod shares;
mod single_node;
mod smoke;
mod store_bounds;
mod store_formats;
mod store_scenarios;
mod store_scripts;
mod top;
mod top_tui;
mod tracing;
mod xds;
