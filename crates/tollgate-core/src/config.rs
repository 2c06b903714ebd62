//! Configuration: built-in defaults < TOML file < `TOLLGATE_*` environment, checked into a
//! typed [`Config`]. Every refusal is a [`ConfigError`] naming the offending key, so the CLI
//! can print one line and exit 2.
//!
//! - `schema`: the types, their defaults and bounds;
//! - `load`: the file and the environment, and [`ConfigError`];
//! - `validate`: what serde cannot check in the settings, and the warnings `validate` prints;
//! - `summary`: what `tollgate validate` prints, passwords redacted;
//! - `grpc_tls`: TLS on the gRPC listener, its files read and checked at start;
//! - `tls_files`: a TLS triple (CA, certificate, key), as `store.tls`, `envoy.xds` and
//!   `grpc_tls` name it;
//! - `store_links`: what each connection to Redis uses (TLS, password), for the store,
//!   `validate` and its summary alike;
//! - `[envoy]` (envoyproxy/ratelimit's rules, YAML, xDS source, metrics and environment) is
//!   the wing's: `crate::erl::config`.
//! - `trace`: `[tracing]`, the export of the decisions' spans.
//! - `rlqs`: `[rlqs]`, Envoy's quota service and its bucket rules.
//! - `regions`: `[region]` and `[home]`, one limit across regions, and a limit's `scope`.
//!
//! Limits and exemptions are checked once, where they are built from their tables
//! (`crate::policy::limit`, `crate::policy::exempt`).

pub mod grpc_tls;
mod load;
mod pem;
pub mod regions;
pub mod rlqs;
mod schema;
pub mod store_links;
pub mod store_tls;
mod summary;
pub mod tls_files;
pub mod trace;
mod validate;

pub use load::ConfigError;
pub use schema::*;
pub use summary::redact_url;
pub use validate::{check_burst, check_refill, valid_name};
