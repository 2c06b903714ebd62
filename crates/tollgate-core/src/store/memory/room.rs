//! Making room past `max_buckets`: the refilled buckets first (lossless), then those closest
//! to full.

use super::shard::Shard;

/// Drops every bucket that has refilled (lossless: an absent bucket reads as full).
pub fn drop_refilled(shards: &mut [&mut Shard], now_us: u64) -> usize {
    let mut freed = 0;
    for shard in shards {
        let Shard { buckets, beside } = &mut **shard;
        let before = buckets.len();
        buckets.retain(|_, entry| entry.full_at_us > now_us);
        freed += before - buckets.len();
        freed += beside.drop_expired(now_us, |key| buckets.contains_key(key));
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
