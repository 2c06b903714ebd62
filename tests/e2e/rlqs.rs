//! Envoy's quota filter (`rate_limit_quota`, RLQS) through tollgate, for real: three Envoy
//! 1.40 processes running the shipped `config/envoy/rlqs.yaml` (pointed at two tollgate
//! replicas on one Redis) share one limit per tenant. Every scenario runs at once on a
//! tenant of its own (a pool of its own), since Envoy reports only every 5 s:
//!
//! - `skew`: 80/15/5 of five times the limit: the shares follow demand;
//! - `shift`: equal demand, then 80/15/5 from 15 s on: the share moves within rounds;
//! - `stop`: one Envoy stops sending: its share goes to the others after its TTL;
//! - `lower`: an override lowers the limit: every Envoy is cut within one round;
//! - `kill`: the replica holding streams is killed at 30 s: the streams move to the other,
//!   every Envoy is served again and the bound holds throughout.
//!
//! The bound checked everywhere: what all Envoys admit in any window of W seconds is at most
//! `burst + rate × W` (the shipped `no_assignment_behavior` denies until tollgate's first
//! answer), give or take one request for timing responses at the client.
//!
//! An Envoy that crashes or stops answering fails the test with that said plainly, never as
//! tollgate admitting too little.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::support::envoy::Envoy;
use crate::support::http::admin_json;
use crate::support::proxies::backend::Backend;
use crate::support::{redis_config, wait_until, RedisServer, Tollgate};

const TOKEN: &str = "rlqs-e2e-admin-token";
const RATE: f64 = 20.0;
const BURST: f64 = 20.0;
/// Responses are timed when the client reads them: a window there may hold what Envoy admitted
/// in one a few milliseconds longer (at 20/s, 50 ms make one request).
const CLIENT_TIMING: f64 = 1.0;

fn config(redis: &RedisServer) -> String {
    let limits = format!(
        r#"
[[rlqs.buckets]]
domain = "edge"
match = {{ name = "per_tenant" }}
limit = "per-tenant"
key = ["tenant"]

[[limits]]
name = "per-tenant"
rate = {RATE}
burst = {BURST:.0}
key = ["descriptor:tenant"]
"#
    );
    format!(
        "admin_token = \"{TOKEN}\"\n{}",
        redis_config(redis, "override_poll_ms = 200\n", &limits)
    )
}

/// One request: seconds since the start, and its status (200 admitted, 429 the quota's denial,
/// [`NO_ANSWER`] when Envoy gave no HTTP answer at all).
type Seen = (f64, u16);

/// The status recorded for a request Envoy did not answer (refused, reset or timed out).
const NO_ANSWER: u16 = 0;

/// One tenant's traffic through one Envoy: `rate` requests per second from `from` to `to`
/// seconds after `start`, paced, over one keep-alive connection.
fn drive(
    envoy: SocketAddr,
    tenant: &'static str,
    plan: Vec<(f64, f64, f64)>,
    start: Instant,
    seen: Arc<Mutex<Vec<Seen>>>,
) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        let mut connection: Option<(TcpStream, BufReader<TcpStream>)> = None;
        for (from, to, rate) in plan {
            let mut sent = 0u64;
            loop {
                let at = from + sent as f64 / rate;
                if at >= to {
                    break;
                }
                let due = start + Duration::from_secs_f64(at);
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    std::thread::sleep(wait);
                }
                sent += 1;
                let status = request(&mut connection, envoy, tenant).unwrap_or(NO_ANSWER);
                let t = start.elapsed().as_secs_f64();
                seen.lock().unwrap().push((t, status));
            }
        }
    })
}

/// One GET with `X-Tenant`, reconnecting if need be: its status, if Envoy answered.
fn request(
    connection: &mut Option<(TcpStream, BufReader<TcpStream>)>,
    envoy: SocketAddr,
    tenant: &str,
) -> Option<u16> {
    for _ in 0..2 {
        if connection.is_none() {
            let stream = TcpStream::connect(envoy).ok()?;
            stream.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
            let reader = BufReader::new(stream.try_clone().ok()?);
            *connection = Some((stream, reader));
        }
        let (stream, reader) = connection.as_mut()?;
        let ask = format!("GET / HTTP/1.1\r\nHost: app\r\nX-Tenant: {tenant}\r\n\r\n");
        if stream.write_all(ask.as_bytes()).is_err() {
            *connection = None;
            continue;
        }
        match read_status(reader) {
            Some(status) => return Some(status),
            None => *connection = None,
        }
    }
    None
}

/// Reads one response (status line, headers, Content-Length body); its status.
fn read_status(reader: &mut BufReader<TcpStream>) -> Option<u16> {
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let status = line.split(' ').nth(1)?.parse().ok()?;
    let mut length = 0usize;
    loop {
        line.clear();
        reader.read_line(&mut line).ok()?;
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        if let Some((name, value)) = trimmed.split_once(':') {
            if name.eq_ignore_ascii_case("content-length") {
                length = value.trim().parse().ok()?;
            }
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(status)
}

/// Admitted responses of all `seen` lists in `[from, to)`.
fn admitted(seen: &[&Arc<Mutex<Vec<Seen>>>], from: f64, to: f64) -> usize {
    seen.iter()
        .map(|s| {
            s.lock()
                .unwrap()
                .iter()
                .filter(|(t, status)| *status == 200 && *t >= from && *t < to)
                .count()
        })
        .sum()
}

/// The largest excess over `burst + rate × W` of any window `[t, t + w)`, `t` every 0.25 s,
/// for `w` in 1, 2, 5, 10, 20 s and the whole run.
fn worst_excess(seen: &[&Arc<Mutex<Vec<Seen>>>], end: f64, rate: f64, burst: f64) -> f64 {
    let mut worst = f64::NEG_INFINITY;
    for w in [1.0, 2.0, 5.0, 10.0, 20.0, end] {
        let mut t = 0.0;
        while t + w <= end + 1e-9 {
            let excess = admitted(seen, t, t + w) as f64 - (burst + rate * w);
            worst = worst.max(excess);
            t += 0.25;
        }
    }
    worst
}

/// A tenant's traffic on the three Envoys.
struct Tenant {
    name: &'static str,
    seen: [Arc<Mutex<Vec<Seen>>>; 3],
}

impl Tenant {
    fn start(
        name: &'static str,
        envoys: &[SocketAddr; 3],
        plans: [Vec<(f64, f64, f64)>; 3],
        start: Instant,
        threads: &mut Vec<std::thread::JoinHandle<()>>,
    ) -> Tenant {
        let seen: [Arc<Mutex<Vec<Seen>>>; 3] = Default::default();
        for ((envoy, plan), seen) in envoys.iter().zip(plans).zip(&seen) {
            threads.push(drive(*envoy, name, plan, start, seen.clone()));
        }
        Tenant { name, seen }
    }

    fn all(&self) -> Vec<&Arc<Mutex<Vec<Seen>>>> {
        self.seen.iter().collect()
    }

    fn of(&self, envoy: usize, from: f64, to: f64) -> usize {
        admitted(&[&self.seen[envoy]], from, to)
    }

    /// Admitted per Envoy in each 5 s round from `from` to `to`.
    fn rounds(&self, from: f64, to: f64) -> Vec<[usize; 3]> {
        let mut rounds = Vec::new();
        let mut t = from;
        while t + 5.0 <= to + 1e-9 {
            rounds.push([0, 1, 2].map(|e| self.of(e, t, t + 5.0)));
            t += 5.0;
        }
        rounds
    }
}

/// Until the shipped config stopped using a token bucket for `no_assignment_behavior`, an
/// Envoy 1.40 crashed here in about half the runs (a null token bucket in its quota filter:
/// see `config/envoy/rlqs.yaml`); a crash is now named as such, never counted as tollgate
/// admitting too little.
#[test]
fn three_envoys_share_limits_across_two_replicas_within_the_bound() {
    let redis = RedisServer::start();
    let app = Backend::start();
    let config = config(&redis);
    let replicas: Vec<(Tollgate, SocketAddr)> = (0..2)
        .map(|_| crate::support::grpc::tollgate(&config))
        .collect();
    let grpc: Vec<SocketAddr> = replicas.iter().map(|(_, grpc)| *grpc).collect();
    let mut envoys: Vec<Envoy> = (0..3).map(|_| Envoy::rlqs(&grpc, app.addr)).collect();
    let addrs = [envoys[0].addr, envoys[1].addr, envoys[2].addr];

    let start = Instant::now();
    let mut threads = Vec::new();
    let end = 30.0;
    let skew = Tenant::start(
        "skew",
        &addrs,
        [
            vec![(0.0, end, 80.0)],
            vec![(0.0, end, 15.0)],
            vec![(0.0, end, 5.0)],
        ],
        start,
        &mut threads,
    );
    let shift = Tenant::start(
        "shift",
        &addrs,
        [
            vec![(0.0, 15.0, 20.0), (15.0, end, 48.0)],
            vec![(0.0, 15.0, 20.0), (15.0, end, 9.0)],
            vec![(0.0, 15.0, 20.0), (15.0, end, 3.0)],
        ],
        start,
        &mut threads,
    );
    let stop = Tenant::start(
        "stop",
        &addrs,
        [
            vec![(0.0, end, 20.0)],
            vec![(0.0, end, 20.0)],
            vec![(0.0, 8.0, 20.0)],
        ],
        start,
        &mut threads,
    );
    let lower = Tenant::start(
        "lower",
        &addrs,
        [
            vec![(0.0, end, 15.0)],
            vec![(0.0, end, 15.0)],
            vec![(0.0, end, 15.0)],
        ],
        start,
        &mut threads,
    );
    let (killed_at, kill_end) = (30.0, 55.0);
    let kill = Tenant::start(
        "kill",
        &addrs,
        [
            vec![(0.0, kill_end, 20.0)],
            vec![(0.0, kill_end, 20.0)],
            vec![(0.0, kill_end, 20.0)],
        ],
        start,
        &mut threads,
    );

    // At 12 s, the limit of tenant "lower" drops to 4/s, burst 4, through one replica.
    let lowered_at = 12.0;
    std::thread::sleep(
        (start + Duration::from_secs_f64(lowered_at)).saturating_duration_since(Instant::now()),
    );
    let put = admin_json(
        replicas[0].0.admin,
        "PUT",
        "/v1/overrides/per-tenant?key=lower",
        Some(TOKEN),
        r#"{"rate": "4/s", "burst": 4}"#,
    );
    assert_eq!(put.status, 200, "{put:?}");

    // At 30 s, the replica holding streams is killed.
    std::thread::sleep(
        (start + Duration::from_secs_f64(killed_at)).saturating_duration_since(Instant::now()),
    );
    let streams = |tollgate: &Tollgate| tollgate.metric("tollgate_rlqs_streams");
    // One stream per Envoy (a stream that ended is opened again at the Envoy's next report).
    let all_streaming = wait_until(Duration::from_secs(10), || {
        replicas.iter().map(|(t, _)| streams(t)).sum::<f64>() == 3.0
    });
    let before: Vec<f64> = replicas.iter().map(|(t, _)| streams(t)).collect();
    assert!(
        all_streaming,
        "one stream per Envoy: {before:?}; Envoys alive: {:?}",
        envoys.iter_mut().map(Envoy::exited).collect::<Vec<_>>()
    );
    let victim = usize::from(before[1] > before[0]);
    let mut replicas = replicas;
    let (mut killed, _) = replicas.remove(victim);
    killed.signal("KILL");
    killed.wait_exit(Duration::from_secs(5));
    let survivor = &replicas[0].0;
    assert!(
        wait_until(Duration::from_secs(15), || streams(survivor) == 3.0),
        "every Envoy's stream moved to the surviving replica: {}",
        streams(survivor)
    );

    for thread in threads {
        thread.join().expect("a load thread");
    }
    // An Envoy that crashed or stopped answering admits nothing: that is Envoy's failure, not
    // an admission of tollgate's, and is named as such before any figure is checked.
    for (i, envoy) in envoys.iter_mut().enumerate() {
        if let Some(status) = envoy.exited() {
            panic!(
                "Envoy {i} crashed during the run ({status}), so the figures say nothing of \
                 tollgate's shares: {}",
                envoy.crash_report().unwrap_or_else(|| envoy.log())
            );
        }
    }
    for tenant in [&skew, &shift, &stop, &lower, &kill] {
        for (i, seen) in tenant.seen.iter().enumerate() {
            let seen = seen.lock().unwrap();
            let unanswered = seen.iter().filter(|(_, s)| *s == NO_ANSWER).count();
            let other = seen
                .iter()
                .filter(|(_, s)| ![NO_ANSWER, 200, 429].contains(s))
                .count();
            assert!(
                unanswered == 0 && other == 0,
                "Envoy {i} left {unanswered} of tenant {}'s requests unanswered and answered \
                 {other} with neither 200 nor 429: Envoy's or the network's failure, not \
                 tollgate's shares; its log: {}",
                tenant.name,
                envoys[i].log()
            );
        }
    }

    let mut report = String::new();
    let mut check_bound = |tenant: &Tenant, end: f64, rate: f64, burst: f64| {
        let excess = worst_excess(&tenant.all(), end, rate, burst);
        report.push_str(&format!("{}: worst excess {excess:.0}; ", tenant.name));
        assert!(
            excess <= CLIENT_TIMING,
            "{}: a window admitted {excess} over burst + rate × W",
            tenant.name
        );
    };
    check_bound(&skew, end, RATE, BURST);
    check_bound(&shift, end, RATE, BURST);
    check_bound(&stop, end, RATE, BURST);
    check_bound(&lower, end, RATE, BURST);
    check_bound(&kill, kill_end, RATE, BURST);

    // skew: once the three Envoys have reported their demand and the first Envoy's share,
    // handed out before the others arrived, has expired (three rounds), each Envoy's part
    // follows its demand.
    let rounds = skew.rounds(15.0, end);
    let total: usize = rounds.iter().flatten().sum();
    let part = |e: usize| rounds.iter().map(|r| r[e]).sum::<usize>() as f64 / total as f64;
    let utilisation = total as f64 / (RATE * (end - 15.0));
    eprintln!("skew rounds {rounds:?}, utilisation {utilisation:.2}; {report}");
    assert!(
        part(0) > 0.70 && part(2) < 0.12,
        "skew parts {:?}",
        [0, 1, 2].map(part)
    );
    assert!(utilisation > 0.85, "skew utilisation {utilisation}");

    // shift: within three rounds of the shift, the 80% Envoy has most of the limit.
    let rounds = shift.rounds(15.0, end);
    eprintln!("shift rounds from 15 s: {rounds:?}");
    let last = rounds.last().expect("three rounds");
    assert!(
        last[0] as f64 > 0.65 * last.iter().sum::<usize>() as f64,
        "shift: {rounds:?}"
    );

    // stop: the third Envoy stopped at 8 s; by 25 s the other two share the whole limit.
    let pair = stop.of(0, 25.0, end) + stop.of(1, 25.0, end);
    eprintln!("stop: the two left admitted {pair} in the last 5 s");
    assert!(pair as f64 > 0.8 * RATE * 5.0, "stop: {pair}");

    // lower: one round after the override, all three together stay within 4/s, burst 4.
    let after = lowered_at + 6.0;
    let lowered: usize = (0..3).map(|e| lower.of(e, after, end)).sum();
    let bound = 4.0 + 4.0 * (end - after);
    eprintln!("lower: {lowered} admitted in [{after}, {end}) against {bound}");
    assert!(lowered as f64 <= bound + 3.0, "lower: {lowered} > {bound}");

    // kill: the streams moved; once the assignments made before the move have lapsed, every
    // Envoy is served. An Envoy whose stream first went to the dead replica again reopens it
    // a report later (5 s), and one that reopened first may hold most of the limit for an
    // assignment's life (TTL + 1 s) as the only holder: the last 10 s leave room for both.
    let rounds = kill.rounds(killed_at - 5.0, kill_end);
    eprintln!("kill rounds from {}: {rounds:?}", killed_at - 5.0);
    for e in 0..3 {
        assert!(
            kill.of(e, kill_end - 10.0, kill_end) > 0,
            "kill: Envoy {e} was served after the move: {rounds:?}"
        );
    }
    drop(envoys);
}
