//! One shard of the memory store: its keys' stored states, and what their kinds keep beside
//! them.

use std::collections::HashMap;

use crate::kinds::twin::{Beside, Stored};

pub struct Entry {
    pub bucket: Stored,
    pub full_at_us: u64,
}

#[derive(Default)]
pub struct Shard {
    pub buckets: HashMap<String, Entry>,
    /// Leases, reservations and borrowed groups, by key (each kind's own).
    pub beside: Beside,
}
