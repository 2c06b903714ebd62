//! Command-line tools beside the server: importers and the terminal view of the top list.

pub mod import;
pub mod ingress_nginx;
pub mod top_view;
