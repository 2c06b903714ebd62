//! The running process: the listeners (HTTP in `server`, gRPC in `grpc_server`), signals,
//! reload, drain, the instance heartbeat, and the client of envoyproxy/ratelimit's xDS
//! config source (`xds`).

pub mod drain;
pub mod grpc_server;
pub mod heartbeat;
pub mod lifecycle;
pub mod reload;
pub mod server;
pub mod xds;
