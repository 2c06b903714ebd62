//! The running process: the listeners (HTTP in `server`, gRPC in `grpc_server`), signals,
//! reload, drain, and the instance heartbeat.

pub mod drain;
pub mod grpc_server;
pub mod heartbeat;
pub mod lifecycle;
pub mod reload;
pub mod server;
