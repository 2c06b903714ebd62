//! The running process: the listeners (HTTP in `server`, gRPC in `grpc_server`, its TLS in
//! `grpc_tls`, the bounds on its connections in `grpc_connections`, the descriptor limit in
//! `descriptors`), signals, reload, drain, the instance heartbeat, a region's reporter
//! (`region`); and, started here,
//! envoyproxy/ratelimit's xDS client and metrics duties (`tollgate_erl::app`).

pub mod descriptors;
pub mod drain;
pub mod grpc_connections;
pub mod grpc_server;
pub mod grpc_tls;
pub mod heartbeat;
pub mod region;
pub mod reload;
pub mod server;
pub mod signals;
