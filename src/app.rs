//! The running process: the state workers share, the listeners, signals, reload and drain.

pub mod lifecycle;
pub mod server;
