//! envoyproxy/ratelimit (ERL) compatibility, its wire: the parts that speak its protocols.
//! Its model (the `[envoy]` table and environment, the rule tree, the counters) is the
//! core's `erl` module, since the core's `Config` and `Policy` hold them. Each part is named
//! after the server's layer it belongs to and imports only the core:
//!
//! - [`grpc`]: a request of one of its domains planned, answered and counted as it does
//!   them; its `/json` forms.
//! - [`app`]: what runs beside the service: its metrics' listener and statsd duty, its xDS
//!   client.
//!
//! Its seam with the core: rules in (its rules become limits of the policy), buckets out (a
//! request of one of its domains becomes buckets the limiter decides), a verdict to shape
//! (the limiter's verdict answered as it answers).

pub mod app;
pub mod grpc;
