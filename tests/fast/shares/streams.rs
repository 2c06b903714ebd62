//! Envoys over time: sizes freed by expiry, escrow refills, holders on a new stream.

use super::*;

/// Envoy 1.40's bucket for one holder, as the simulation models it: a token bucket applied on
/// receipt, a changed one keeping its fill fraction, a first one (or one after a denial)
/// starting full; an expired assignment denies (Envoy's fallbacks are outside the bound).
#[derive(Debug, Default, Clone)]
struct Envoy {
    /// (tokens per fill interval, max tokens, expiry µs); None: no assignment or deny all.
    bucket: Option<(u64, u64, u64)>,
    tokens: f64,
    at: u64,
    since_report: u64,
    /// How often its stream was opened again (on another replica): each stream is a new
    /// holder, while Envoy keeps its bucket and the assignment it applies.
    stream: u32,
}

impl Envoy {
    fn refill(&mut self, now: u64) {
        if let Some((rate, size, _)) = self.bucket {
            let gained = rate as f64 / 3600.0 * (now - self.at) as f64 / S as f64;
            self.tokens = (self.tokens + gained).min(size as f64);
        }
        self.at = now;
    }

    fn apply(&mut self, grant: &Grant, now: u64, ttl_us: u64) {
        self.refill(now);
        if grant.size == 0 {
            self.bucket = None;
            self.tokens = 0.0;
            return;
        }
        self.tokens = match self.bucket {
            Some((_, old, until)) if until > now => grant.size as f64 * (self.tokens / old as f64),
            _ => grant.size as f64,
        };
        self.bucket = Some((grant.rate, grant.size, now + ttl_us));
    }

    /// Up to `wanted` requests at `now`; returns how many were admitted.
    fn spend(&mut self, wanted: u64, now: u64) -> u64 {
        self.refill(now);
        let live = matches!(self.bucket, Some((_, _, until)) if until > now);
        let mut admitted = 0;
        while live && admitted < wanted && self.tokens >= 1.0 {
            self.tokens -= 1.0;
            admitted += 1;
        }
        self.since_report += wanted;
        admitted
    }
}

/// The most any window of the admissions `(µs, count)` passes `burst + rate × W` by.
fn worst_excess(admissions: &[(u64, u64)], rate_per_s: f64, burst: f64) -> f64 {
    let mut worst = f64::MIN;
    for (i, (start, _)) in admissions.iter().enumerate() {
        let mut total = 0;
        for (end, count) in &admissions[i..] {
            total += count;
            let allowed = burst + rate_per_s * (end - start) as f64 / S as f64;
            worst = worst.max(total as f64 - allowed);
        }
    }
    worst
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Envoys modelled as Envoy 1.40 behaves, random reports, spending, cuts, growths and
    /// streams opened again (a replica died: the Envoy reports as a new holder while it keeps
    /// its bucket) on a manual clock: in every window, what they all admitted is at most
    /// `burst + rate × W`.
    #[test]
    fn simulated_envoys_never_admit_past_the_limit(
        rate_per_s in 1u64..20,
        burst in 1u64..60,
        events in prop::collection::vec((0usize..4, 0u64..4_000_000, 0u8..9, 0u64..80), 1..160),
    ) {
        let ttl_us = 10 * S;
        let mut pool = Pool::default();
        let mut envoys = vec![Envoy::default(); 4];
        let mut admissions = Vec::new();
        let mut now = 1_000 * S;
        for (holder, gap, kind, wanted) in events {
            now += gap;
            let envoy = &mut envoys[holder];
            if kind == 0 {
                envoy.stream += 1;
            } else if kind < 5 {
                let id = format!("h{holder}.{}", envoy.stream);
                let mut ask = request(&id, envoy.since_report, rate_per_s * 3600, burst);
                ask.hold_us = ttl_us + S;
                let grant = allocate(&mut pool, &ask, now);
                envoy.since_report = 0;
                envoy.apply(&grant, now, ttl_us);
            } else {
                let admitted = envoy.spend(wanted, now);
                if admitted > 0 {
                    admissions.push((now, admitted));
                }
            }
        }
        let excess = worst_excess(&admissions, rate_per_s as f64, burst as f64);
        prop_assert!(excess <= 1e-6, "{} past burst + rate × W: {:?}", excess, admissions);
    }
}

/// The smallest case the simulation found before the escrow existed: one Envoy spends its
/// full first bucket; once its assignment expired, the size it held went to a second Envoy
/// whose first bucket started full: 35 requests in 9.9 s of a 1/s, burst 25 limit.
#[test]
fn a_size_freed_by_an_expiry_is_handed_out_empty() {
    let ttl_us = 10 * S;
    let mut pool = Pool::default();
    let mut ask = |holder: &str, now: u64| {
        let mut ask = request(holder, 0, 3600, 25);
        ask.hold_us = ttl_us + S;
        allocate(&mut pool, &ask, now)
    };
    let (mut first, mut second) = (Envoy::default(), Envoy::default());
    let start = 1_000 * S;
    first.apply(&ask("h3", start), start, ttl_us);
    let spent = first.spend(24, start + 1_088_799);
    assert_eq!(spent, 24, "a full bucket of 23 and a token refilled");
    let later = start + 11 * S;
    let grant = ask("h2", later);
    second.apply(&grant, later, ttl_us);
    let admitted = spent + second.spend(11, later);
    let window = (later - start - 1_088_799) as f64 / S as f64;
    assert!(
        admitted as f64 <= 25.0 + window,
        "{admitted} admitted in {window} s; the second Envoy was given {grant:?}"
    );
    assert!(
        grant.size >= 1,
        "the escrow had refilled a token: {grant:?}"
    );
}

/// The rate of an assignment that expired refills the escrow from its expiry on, not from the
/// next report: an Envoy whose assignment expired refills nothing, so the pool's rate is all
/// the escrow's again. Here one holder held all but the reserve until 1,009 s; a newcomer
/// reporting at 1,012 s finds the 3 s since filled at the whole rate (20/s, capped at the
/// burst), where the reserve's 1/s (the rate free at the last report) would give it 4 tokens.
#[test]
fn an_expired_rate_refills_the_escrow_at_once() {
    let ask = |holder: &str| ShareRequest {
        hold_us: 9 * S,
        ..request(holder, 100, 72_000, 20)
    };
    let mut pool = Pool::default();
    let first = allocate(&mut pool, &ask("a.0"), 1_000 * S);
    assert_eq!((first.rate, first.size), (68_400, 19));
    // a's Envoy spends its 19 tokens; its stream ends (its replica died) and it never reports
    // again. The escrow holds 1 token and refills at the reserve's 1/s while a counts.
    let newcomer = allocate(&mut pool, &ask("b.0"), 1_012 * S);
    assert_eq!(
        newcomer.size, 19,
        "the escrow refilled at 20/s once a's assignment expired at 1,009 s: {newcomer:?}"
    );
}

/// A replica dies: three Envoys at equal demand open their streams again on the other
/// replica as new holders while their old assignments still count (9 s from their last
/// report). No new holder is denied: the first to report takes what the reserve refilled,
/// and each old assignment that expires before the others report frees its rate into the
/// escrow at that instant (counted only from the next report, the third Envoy was denied for
/// a round: sizes `[1, 1, 0]`). From the first report after every old one expired, each has
/// at least a third of the burst less rounding.
#[test]
fn holders_on_a_new_stream_are_served_and_regain_their_sizes() {
    let ask = |holder: &str| ShareRequest {
        hold_us: 9 * S,
        ..request(holder, 100, 72_000, 20)
    };
    let mut pool = Pool::default();
    let envoys = ["a", "b", "c"];
    for round in 0..4u64 {
        for (i, envoy) in envoys.iter().enumerate() {
            let now = 1_000 * S + round * 5 * S + i as u64 * 1_700_000;
            allocate(&mut pool, &ask(&format!("{envoy}.0")), now);
        }
    }
    // The old assignments were sent by 1,018.4 s: they count until 1,027.4 s at most.
    let mut sizes = Vec::new();
    for round in 0..4u64 {
        let mut of_round = Vec::new();
        for (i, envoy) in envoys.iter().enumerate() {
            let now = 1_021 * S + round * 5 * S + i as u64 * 1_700_000;
            of_round.push(allocate(&mut pool, &ask(&format!("{envoy}.1")), now).size);
        }
        sizes.push(of_round);
    }
    assert!(
        sizes.iter().flatten().all(|s| *s >= 1),
        "a new holder was denied: sizes per round after the move {sizes:?}"
    );
    // Reports from 1,031 s on come after every old assignment expired.
    assert!(
        sizes[2].iter().all(|s| *s >= 5),
        "sizes per round after the move: {sizes:?}"
    );
}
