//! A request of one of envoyproxy/ratelimit's domains, over Envoy's rate limit service: planned
//! as it plans (its rules' buckets, decided by the core's limiter), answered as it answers,
//! and counted in its counters. The service that carries it is the core's neighbour in
//! `crate::grpc`, which asks [`plan::plan`] for the buckets and hands the verdict back here.
//!
//! - [`plan`]: one rule (or none) per descriptor, `replaces` applied, one bucket per rate;
//! - [`answer`]: the verdict shaped as envoyproxy/ratelimit shapes its answer;
//! - [`metadata`]: a rule's `metadata` merged into the answer's `dynamic_metadata`;
//! - [`count`]: what the request adds to its counters ([`tollgate_core::erl::observe`]);
//! - [`json`]: its `/json` forms of the request and the answer.

pub mod answer;
pub mod count;
pub mod json;
pub mod metadata;
pub mod plan;
