//! An open-loop load at a fixed rate (no wrk2 here): `CONNS` keep-alive connections, each
//! sending `GET <PREFIX><n>` (n one of `KEYS` at random, or with `ORDER` = `cycle` every key
//! in turn: connection i sends i, i + CONNS, i + 2 CONNS, ... modulo `KEYS`, so together they
//! go through all the keys once every `KEYS / RATE` s) on its own fixed schedule, together
//! `RATE` requests per second, for `SECONDS`. Latency counts from the moment a request was due,
//! not when it went out, so a server that falls behind shows its queue (no coordinated
//! omission). Prints one line: `sent rps p50_ms p90_ms p99_ms max_ms non2xx late_pct`.
//!
//! Usage: `cargo run --release --example paced_load -- 127.0.0.1:8080 RATE [SECONDS] [CONNS]
//! [KEYS] [PREFIX] [ORDER]`
// Tests and load tools compute ratios and figures; the library's cast lints (Cargo.toml)
// guard its token arithmetic, not these.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

struct Args {
    addr: String,
    rate: f64,
    seconds: f64,
    conns: usize,
    keys: u64,
    prefix: String,
    /// Keys in turn (`cycle`) rather than at random.
    cycle: bool,
}

fn args() -> Option<Args> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    let num = |i: usize, default: f64| a.get(i).map_or(Some(default), |v| v.parse().ok());
    Some(Args {
        addr: a.first()?.clone(),
        rate: num(1, f64::NAN).filter(|r| *r > 0.0)?,
        seconds: num(2, 10.0)?,
        conns: num(3, 64.0)? as usize,
        keys: num(4, 10_000.0)? as u64,
        prefix: a.get(5).cloned().unwrap_or_else(|| "/check/k".into()),
        cycle: match a.get(6).map(String::as_str) {
            None | Some("random") => false,
            Some("cycle") => true,
            Some(_) => return None,
        },
    })
}

/// Per connection: (latencies in µs, non-2xx answers, requests sent later than 1 ms past due).
type Tally = (Vec<u32>, u64, u64);

fn run_connection(args: &Args, index: usize, start: Instant) -> std::io::Result<Tally> {
    let stream = TcpStream::connect(&args.addr)?;
    stream.set_nodelay(true)?;
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    let interval = Duration::from_secs_f64(args.conns as f64 / args.rate);
    // Connections start spread over one interval, so the load is even, not in waves.
    let mut due = start + interval.mul_f64(index as f64 / args.conns as f64);
    let end = start + Duration::from_secs_f64(args.seconds);
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64 ^ (index as u64).wrapping_mul(0x2545_f491_4f6c_dd1d);
    let (mut latencies, mut bad, mut late) = (Vec::new(), 0, 0);
    let mut line = String::new();
    let mut next = index as u64;
    while due < end {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        } else if now - due > Duration::from_millis(1) {
            late += 1;
        }
        let key = if args.cycle {
            let key = next % args.keys;
            next += args.conns as u64;
            key
        } else {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % args.keys
        };
        let request = format!("GET {}{} HTTP/1.1\r\nHost: bench\r\n\r\n", args.prefix, key);
        writer.write_all(request.as_bytes())?;
        line.clear();
        reader.read_line(&mut line)?;
        let ok = line
            .split_whitespace()
            .nth(1)
            .is_some_and(|s| s.starts_with('2'));
        let mut length = 0usize;
        loop {
            line.clear();
            if reader.read_line(&mut line)? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
            let header = line.trim_end();
            if header.is_empty() {
                break;
            }
            if let Some((name, value)) = header.split_once(':') {
                if name.eq_ignore_ascii_case("content-length") {
                    length = value.trim().parse().unwrap_or(0);
                }
            }
        }
        std::io::copy(&mut (&mut reader).take(length as u64), &mut std::io::sink())?;
        latencies.push(due.elapsed().as_micros().min(u32::MAX as u128) as u32);
        bad += u64::from(!ok);
        due += interval;
    }
    Ok((latencies, bad, late))
}

fn main() {
    let Some(args) = args() else {
        eprintln!("usage: paced_load ADDR RATE [SECONDS] [CONNS] [KEYS] [PREFIX] [random|cycle]");
        std::process::exit(2);
    };
    let args = std::sync::Arc::new(args);
    let start = Instant::now() + Duration::from_millis(200);
    let threads: Vec<_> = (0..args.conns)
        .map(|i| {
            let args = args.clone();
            std::thread::spawn(move || run_connection(&args, i, start))
        })
        .collect();
    let (mut all, mut bad, mut late) = (Vec::new(), 0, 0);
    for thread in threads {
        match thread.join() {
            Ok(Ok((latencies, b, l))) => {
                all.extend(latencies);
                bad += b;
                late += l;
            }
            Ok(Err(e)) => eprintln!("a connection failed: {e}"),
            Err(_) => eprintln!("a connection thread panicked"),
        }
    }
    if all.is_empty() {
        eprintln!("no request completed");
        std::process::exit(1);
    }
    all.sort_unstable();
    let pct = |p: f64| all[((all.len() - 1) as f64 * p).round() as usize] as f64 / 1000.0;
    println!(
        "{} {:.0} {:.2} {:.2} {:.2} {:.2} {} {:.1}",
        all.len(),
        all.len() as f64 / args.seconds,
        pct(0.50),
        pct(0.90),
        pct(0.99),
        pct(1.0),
        bad,
        100.0 * late as f64 / all.len() as f64
    );
}
