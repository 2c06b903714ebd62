//! Command-line tools beside the server: importers, the offline replay of an access log, and
//! the terminal view of the top list.

pub mod import;
pub mod ingress_nginx;
pub mod replay;
pub mod top_view;
