//! Paced checks of one tenant in three regions (bench/regions.sh), and the figures of what
//! the regions admitted together against one limit of `RATE`/s, burst `BURST`:
//!
//! - the first third of the run: 80/15/5 of twice the limit;
//! - the rest: the demand moves, all of twice the limit to the third region.
//!
//! Each region's checks (`GET /check` with `X-Tenant: acme`) are paced over one keep-alive
//! connection to its tollgate. Prints: the worst excess of any window (every run of
//! admissions, its span from the first's sending to the latest answer) over `burst + rate ×
//! W`, as one line `excess <n>`; utilisation (admitted ÷ `rate × W`) after `WARMUP` s in the
//! skewed phase and in the shifted phase from `SETTLE` s after the shift; and, per second
//! after the shift, the admitted share of `rate`, until it reaches 0.9 (the time to follow).
//!
//! Usage: `cargo run --release --example regions_load -- REGION1,REGION2,REGION3 RATE BURST
//! [SECONDS] [WARMUP] [SETTLE]`
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]

#[path = "support/http.rs"]
mod http;
#[path = "support/paced.rs"]
mod paced;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use paced::paced;

/// (sent, answered, admitted), seconds from the start.
type Seen = Arc<Mutex<Vec<(f64, f64, bool)>>>;

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: regions_load R1,R2,R3 RATE BURST [SECONDS] [WARMUP] [SETTLE]";
    let regions: Vec<SocketAddr> = a
        .first()
        .expect(usage)
        .split(',')
        .map(|r| r.parse().expect("a region's address"))
        .collect();
    assert_eq!(regions.len(), 3, "{usage}");
    let rate: f64 = a.get(1).expect(usage).parse().expect("a rate");
    let burst: f64 = a.get(2).expect(usage).parse().expect("a burst");
    let seconds: f64 = a.get(3).map_or(60.0, |s| s.parse().expect("seconds"));
    let warmup: f64 = a
        .get(4)
        .map_or(5.0, |s| s.parse().expect("warm-up seconds"));
    let settle: f64 = a.get(5).map_or(5.0, |s| s.parse().expect("settle seconds"));
    let shift = seconds / 3.0;
    let start = Instant::now() + Duration::from_millis(200);
    let seen: [Seen; 3] = Default::default();
    let plans = [0.80, 0.15, 0.05].map(|part| vec![(0.0, shift, 2.0 * rate * part)]);
    let mut plans = plans;
    plans[2].push((shift, seconds, 2.0 * rate));
    let threads: Vec<_> = regions
        .iter()
        .zip(plans)
        .zip(&seen)
        .map(|((region, plan), seen)| drive(*region, plan, start, seen.clone()))
        .collect();
    for thread in threads {
        thread.join().expect("a load thread");
    }
    let all: Vec<(f64, f64, bool)> = seen
        .iter()
        .flat_map(|s| s.lock().expect("seen").clone())
        .collect();
    let admitted = |from: f64, to: f64| {
        all.iter()
            .filter(|(sent, _, ok)| *ok && *sent >= from && *sent < to)
            .count() as f64
    };
    println!("excess {:.3}", worst_excess(&all, rate, burst));
    println!(
        "skewed {:.3}",
        admitted(warmup, shift) / (rate * (shift - warmup))
    );
    println!(
        "shifted {:.3}",
        admitted(shift + settle, seconds) / (rate * (seconds - shift - settle))
    );
    let mut followed = None;
    let mut t = shift;
    while t + 1.0 <= seconds {
        if admitted(t, t + 1.0) >= 0.9 * rate {
            followed = Some(t - shift);
            break;
        }
        t += 0.5;
    }
    println!(
        "followed {}",
        followed.map_or("never".to_string(), |f| format!("{f:.1}"))
    );
    let per_second: Vec<String> = (0..((seconds - shift) as usize).min(20))
        .map(|s| {
            let t = shift + s as f64;
            format!("{:.2}", admitted(t, t + 1.0) / rate)
        })
        .collect();
    println!("after_shift {}", per_second.join(" "));
    println!("total {} sent {}", admitted(0.0, seconds), all.len());
}

/// The largest excess over `burst + rate × W` of a run of admissions: sorted by sending,
/// admissions `i..=j` were decided between the first's sending and the latest answer.
fn worst_excess(all: &[(f64, f64, bool)], rate: f64, burst: f64) -> f64 {
    let mut admitted: Vec<(f64, f64)> = all
        .iter()
        .filter(|s| s.2)
        .map(|&(sent, answered, _)| (sent, answered))
        .collect();
    admitted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut worst = f64::NEG_INFINITY;
    for i in 0..admitted.len() {
        let mut latest = admitted[i].1;
        for (count, seen) in admitted[i..].iter().enumerate() {
            latest = latest.max(seen.1);
            let span = latest - admitted[i].0;
            worst = worst.max((count + 1) as f64 - (burst + rate * span));
        }
    }
    worst
}

/// One region's checks: `(from, to, rate)` segments, paced.
fn drive(
    region: SocketAddr,
    plan: Vec<(f64, f64, f64)>,
    start: Instant,
    seen: Seen,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut connection: http::Connection = None;
        paced(&plan, start, |sent_at| {
            let ask = "GET /check HTTP/1.1\r\nHost: app\r\nX-Tenant: acme\r\n\r\n";
            if let Some(ok) = http::request(&mut connection, region, ask) {
                let t = Instant::now()
                    .saturating_duration_since(start)
                    .as_secs_f64();
                seen.lock().expect("seen").push((sent_at, t, ok));
            }
        });
    })
}
