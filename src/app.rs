//! The running process: the state workers share, the listeners, signals, reload and drain.

pub mod grpc_server;
pub mod lifecycle;
pub mod server;
