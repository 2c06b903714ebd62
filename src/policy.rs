//! What the operator asked for: limits and their matchers, exemptions, per-key overrides (from
//! files and, at run time, from the store), and the descriptor rules of the gRPC service.

pub mod descriptors;
pub mod exempt;
pub mod limits;
pub mod matcher;
pub mod overrides;
pub mod runtime_overrides;
