//! The escrow's refill between two reports, and how long a pool's record must outlive it.

use super::{level, Escrow, Holding, ShareRequest, MAX_FILL_US, MICRO};

/// The escrow's tokens (millionths) at `now_us`, as a bucket capped at the unassigned size:
/// from its last update, each stretch between two step expiries of the pool as it was then
/// (`holders`, as read; nothing was sent in between) adds the rate no Envoy can be refilling
/// in that stretch, and is capped at that stretch's unassigned size (refill past the cap is
/// lost, as in a full bucket). A pool never written starts full, one written before the
/// escrow existed empty.
///
/// The rate of a stretch is the pool's rate less the counted rates of the holders whose
/// counted size is above 0: an Envoy applies at most what its holder counts, so one whose
/// counted size is 0 holds no token and refills none, and a rate step that expired refills
/// nothing from then on. The pool's rate is the smaller of the one given now and the one the
/// stored free rate was computed with (free plus what was counted then), so a changed limit
/// never credits the past stretches with more than either.
///
/// One sweep over the expiries in order: each changes only its own holder's part of the two
/// sums, so a report costs O(H log H) in the pool's holders, not O(H²).
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "the same double operations as the script; the result is capped at the unassigned size"
)]
pub(super) fn refilled(
    escrow: Option<Escrow>,
    fresh: bool,
    holders: &[(String, Holding)],
    request: &ShareRequest,
    now_us: u64,
) -> u64 {
    let cap = |used: u64| -> f64 {
        request
            .size_units
            .saturating_sub(used)
            .saturating_mul(MICRO) as f64
    };
    let used_at = |t: u64| {
        holders
            .iter()
            .map(|(_, h)| level(&h.size_steps, t))
            .fold(0u64, u64::saturating_add)
    };
    let Some(e) = escrow else {
        return if fresh {
            cap(used_at(now_us)) as u64
        } else {
            0
        };
    };
    let mut t = e.at_us;
    // Each holder's (size, rate) at `t`, and the sums they make: sizes, the rates of holders
    // that may hold a token, all rates.
    let mut parts: Vec<(u64, u64)> = Vec::with_capacity(holders.len());
    let (mut used, mut refilling, mut all_rate) = (0u64, 0u64, 0u64);
    let mut expiries: Vec<(u64, usize)> = Vec::new();
    for (i, (_, h)) in holders.iter().enumerate() {
        let (size, rate) = (level(&h.size_steps, t), level(&h.rate_steps, t));
        parts.push((size, rate));
        used = used.saturating_add(size);
        all_rate = all_rate.saturating_add(rate);
        if size > 0 {
            refilling = refilling.saturating_add(rate);
        }
        expiries.extend(
            h.rate_steps
                .iter()
                .chain(&h.size_steps)
                .map(|(_, until)| *until)
                .filter(|until| *until > t && *until < now_us)
                .map(|until| (until, i)),
        );
    }
    expiries.sort_unstable();
    let ceiling = e.free_rate.saturating_add(all_rate).min(request.rate_units);
    let fill = request.fill_interval_s.max(1) as f64;
    let mut tokens = e.micro as f64;
    let mut next = expiries.iter().peekable();
    loop {
        let tau = next.peek().map_or(now_us, |(until, _)| *until);
        let free = ceiling.saturating_sub(refilling);
        let refill = (free as f64 * tau.saturating_sub(t) as f64 / fill).floor();
        tokens = (tokens + refill).min(cap(used));
        t = tau;
        if next.peek().is_none() {
            break;
        }
        while let Some((_, i)) = next.next_if(|(until, _)| *until == tau) {
            let h = &holders[*i].1;
            let (size, rate) = (level(&h.size_steps, tau), level(&h.rate_steps, tau));
            let (was_size, was_rate) = parts[*i];
            used = used.saturating_sub(was_size).saturating_add(size);
            if was_size > 0 {
                refilling = refilling.saturating_sub(was_rate);
            }
            if size > 0 {
                refilling = refilling.saturating_add(rate);
            }
            parts[*i] = (size, rate);
        }
    }
    tokens.min(cap(used_at(now_us))) as u64
}

/// When the pool's record may vanish (µs): after every holder's steps and quiet time, plus
/// the time the escrow needs to refill the whole size at the pool's full rate, so an absent
/// record really means a full escrow (at most [`MAX_FILL_US`] later).
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "the same double operations as the script; capped at MAX_FILL_US"
)]
pub(super) fn expiry(
    holders: &[(String, Holding)],
    tokens: u64,
    request: &ShareRequest,
    now_us: u64,
) -> u64 {
    let mut last = now_us.saturating_add(request.hold_us);
    for (_, h) in holders {
        for (_, until) in h.rate_steps.iter().chain(&h.size_steps) {
            last = last.max(*until);
        }
        last = last.max(h.last_us.saturating_add(request.hold_us));
    }
    let missing = request
        .size_units
        .saturating_mul(MICRO)
        .saturating_sub(tokens) as f64;
    let fill_us = (missing * request.fill_interval_s.max(1) as f64
        / request.rate_units.max(1) as f64)
        .ceil()
        .min(MAX_FILL_US as f64);
    last.saturating_add(fill_us as u64)
}
