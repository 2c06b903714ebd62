//! Paced traffic through three Envoys whose quota filter asks tollgate (bench/rlqs.sh), and
//! the figures of what they admitted together. Three tenants at once, each its own pool of
//! `RATE`/s, burst `BURST`, each Envoy's requests paced over one keep-alive connection:
//!
//! - `skew`: 80/15/5 of five times the limit, for the whole run;
//! - `equal`: five thirds of the limit through each Envoy;
//! - `shift`: equal (a third each of 3× the limit) for the first half, then 80/15/5.
//!
//! Serves the application on `BACKEND` itself (a 200 for every request). Prints, per
//! tenant: utilisation (admitted ÷ `rate × W` after `WARMUP` s), the worst excess of any
//! window (1, 2, 5, 10, 20 s and the whole run, every 0.25 s) over `burst + rate × W`, each
//! Envoy's part; for `shift`, the rounds (5 s) after the shift until the 80% Envoy takes
//! over 70% of what is admitted; and what static per-Envoy copies of the limit would admit.
//!
//! Usage: `cargo run --release --example rlqs_load -- ENVOY1,ENVOY2,ENVOY3 BACKEND RATE BURST
//! [SECONDS] [WARMUP]`
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]

#[path = "support/http.rs"]
mod http;
#[path = "support/paced.rs"]
mod paced;

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use paced::paced;

type Seen = Arc<Mutex<Vec<(f64, bool)>>>;

fn main() {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let usage = "usage: rlqs_load ENVOY1,ENVOY2,ENVOY3 BACKEND RATE BURST [SECONDS] [WARMUP]";
    let envoys: Vec<SocketAddr> = a
        .first()
        .expect(usage)
        .split(',')
        .map(|e| e.parse().expect("an Envoy address"))
        .collect();
    assert_eq!(envoys.len(), 3, "{usage}");
    let backend: SocketAddr = a.get(1).expect(usage).parse().expect("the backend address");
    let rate: f64 = a.get(2).expect(usage).parse().expect("a rate");
    let burst: f64 = a.get(3).expect(usage).parse().expect("a burst");
    let seconds: f64 = a.get(4).map_or(60.0, |s| s.parse().expect("seconds"));
    let warmup: f64 = a
        .get(5)
        .map_or(15.0, |s| s.parse().expect("warm-up seconds"));
    serve_backend(backend);

    let start = Instant::now() + Duration::from_millis(200);
    let half = seconds / 2.0;
    let mut threads = Vec::new();
    let mut tenant = |name: &'static str, plans: [Vec<(f64, f64, f64)>; 3]| {
        let seen: [Seen; 3] = Default::default();
        for ((envoy, plan), seen) in envoys.iter().zip(plans).zip(&seen) {
            threads.push(drive(*envoy, name, plan, start, seen.clone()));
        }
        (name, seen)
    };
    let skew = tenant(
        "skew",
        [0.80, 0.15, 0.05].map(|part| vec![(0.0, seconds, 5.0 * rate * part)]),
    );
    let equal = tenant(
        "equal",
        [(); 3].map(|()| vec![(0.0, seconds, 5.0 * rate / 3.0)]),
    );
    let shift = tenant(
        "shift",
        [0.80, 0.15, 0.05].map(|part| vec![(0.0, half, rate), (half, seconds, 3.0 * rate * part)]),
    );
    for thread in threads {
        thread.join().expect("a load thread");
    }

    for ((name, seen), demand) in [
        (&skew, [4.0 * rate, 0.75 * rate, 0.25 * rate]),
        (&equal, [5.0 * rate / 3.0; 3]),
    ] {
        let all: Vec<&Seen> = seen.iter().collect();
        let admitted = admitted(&all, warmup, seconds) as f64;
        let utilisation = admitted / (rate * (seconds - warmup));
        let parts =
            [0, 1, 2].map(|e| self::admitted(&[&seen[e]], warmup, seconds) as f64 / admitted);
        let statics: f64 = demand.iter().map(|d| d.min(rate)).sum::<f64>() / rate;
        println!(
            "{name}: utilisation {utilisation:.3} over {:.0} s; parts {:.3}/{:.3}/{:.3}; worst excess {}; static copies would admit {statics:.2}x the limit",
            seconds - warmup,
            parts[0],
            parts[1],
            parts[2],
            worst_excess(&all, seconds, rate, burst)
        );
    }
    let (_, seen) = &shift;
    let all: Vec<&Seen> = seen.iter().collect();
    let mut rounds = None;
    let mut t = half;
    let mut n = 0;
    while t + 5.0 <= seconds {
        n += 1;
        let total = admitted(&all, t, t + 5.0) as f64;
        let first = admitted(&[&seen[0]], t, t + 5.0) as f64;
        if first > 0.7 * total {
            rounds = Some(n);
            break;
        }
        t += 5.0;
    }
    let after = admitted(&all, half + 15.0, seconds) as f64 / (rate * (seconds - half - 15.0));
    println!(
        "shift: the 80% Envoy had over 70% of what was admitted in round {} after the shift; utilisation {after:.3} from 3 rounds after it; worst excess {}",
        rounds.map_or("none".to_string(), |r| r.to_string()),
        worst_excess(&all, seconds, rate, burst)
    );
}

/// One tenant's traffic through one Envoy: `(from, to, rate)` segments, paced.
fn drive(
    envoy: SocketAddr,
    tenant: &'static str,
    plan: Vec<(f64, f64, f64)>,
    start: Instant,
    seen: Seen,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut connection: http::Connection = None;
        let ask = format!("GET / HTTP/1.1\r\nHost: app\r\nX-Tenant: {tenant}\r\n\r\n");
        paced(&plan, start, |_| {
            if let Some(ok) = http::request(&mut connection, envoy, &ask) {
                let t = Instant::now()
                    .saturating_duration_since(start)
                    .as_secs_f64();
                seen.lock().expect("seen").push((t, ok));
            }
        });
    })
}

/// The application: `200 ok` to every request, keep-alive.
fn serve_backend(addr: SocketAddr) {
    let listener = TcpListener::bind(addr).expect("bind the backend");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || {
                let Ok(writer) = stream.try_clone() else {
                    return;
                };
                let mut writer = writer;
                let mut reader = BufReader::new(stream);
                let mut line = String::new();
                loop {
                    line.clear();
                    match reader.read_line(&mut line) {
                        Ok(0) | Err(_) => return,
                        Ok(_) if line.trim_end().is_empty() => {
                            let ok = "HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nok\n";
                            if writer.write_all(ok.as_bytes()).is_err() {
                                return;
                            }
                        }
                        Ok(_) => {}
                    }
                }
            });
        }
    });
}

fn admitted(seen: &[&Seen], from: f64, to: f64) -> usize {
    seen.iter()
        .map(|s| {
            s.lock()
                .expect("seen")
                .iter()
                .filter(|(t, ok)| *ok && *t >= from && *t < to)
                .count()
        })
        .sum()
}

/// The largest `admitted − (burst + rate × W)` over the windows, and where: `(excess, W, start)`.
fn worst_window(seen: &[&Seen], end: f64, rate: f64, burst: f64) -> (f64, f64, f64) {
    let mut worst = (f64::NEG_INFINITY, 0.0, 0.0);
    for w in [1.0, 2.0, 5.0, 10.0, 20.0, end] {
        let mut t = 0.0;
        while t + w <= end + 1e-9 {
            let excess = admitted(seen, t, t + w) as f64 - (burst + rate * w);
            if excess > worst.0 {
                worst = (excess, w, t);
            }
            t += 0.25;
        }
    }
    worst
}

/// [`worst_window`] as printed: the excess, and the window when it is positive.
fn worst_excess(seen: &[&Seen], end: f64, rate: f64, burst: f64) -> String {
    let (excess, w, t) = worst_window(seen, end, rate, burst);
    if excess > 0.0 {
        format!("{excess:.1} (the {w:.0} s from {t:.2} s)")
    } else {
        format!("{excess:.1}")
    }
}
