//! Making room past `max_buckets`: the refilled buckets first (lossless), then those closest
//! to full.

use super::shard::Shard;

/// Drops every bucket that has refilled (lossless: an absent bucket reads as full).
pub fn drop_refilled(shards: &mut [&mut Shard], now_us: u64) -> usize {
    let mut freed = 0;
    for shard in shards {
        let before = shard.buckets.len() + shard.leases.len();
        shard.buckets.retain(|_, entry| entry.full_at_us > now_us);
        // A concurrency key whose leases all expired is as good as absent; a held lease is
        // never dropped (that would admit one more than the limit).
        shard
            .leases
            .retain(|_, set| set.iter().any(|(_, until)| *until > now_us));
        freed += before - shard.buckets.len() - shard.leases.len();
        // Expired reservations of a bucket gone full have nothing left to give back: they
        // move to the late ones (as Redis would find them), which go after their grace.
        let idle: Vec<String> = shard
            .reservations
            .iter()
            .filter(|(key, set)| {
                !set.iter().any(|r| r.until > now_us) && !shard.buckets.contains_key(key.as_str())
            })
            .map(|(key, _)| key.clone())
            .collect();
        for key in idle {
            shard.sweep(&key, now_us, |r| r.refund);
        }
        shard.late.retain(|_, set| {
            set.retain(|r| r.until > now_us);
            !set.is_empty()
        });
    }
    freed
}

/// Drops exactly `count` buckets (or all there are), those that would be full soonest.
pub fn drop_closest_to_full(shards: &mut [&mut Shard], count: usize) -> usize {
    let mut full_at: Vec<u64> = shards
        .iter()
        .flat_map(|shard| shard.buckets.values().map(|entry| entry.full_at_us))
        .collect();
    let count = count.min(full_at.len());
    if count == 0 {
        return 0;
    }
    let (_, &mut threshold, _) = full_at.select_nth_unstable(count - 1);
    // Every bucket before the threshold goes, and as many at it as make up `count`: ties are
    // common (buckets drained at the same moment), and dropping all of them could empty the
    // store.
    let below = full_at.iter().filter(|&&at| at < threshold).count();
    let mut ties = count - below;
    let mut freed = 0;
    for shard in shards {
        let before = shard.buckets.len();
        shard.buckets.retain(|_, entry| {
            let drop = entry.full_at_us < threshold
                || (entry.full_at_us == threshold && ties > 0 && {
                    ties -= 1;
                    true
                });
            !drop
        });
        freed += before - shard.buckets.len();
    }
    freed
}
