//! Redis faults under load: killed, restarted empty, `SCRIPT FLUSH`, `CLIENT PAUSE`,
//! `DEBUG SLEEP`, a black hole on an established connection, and a port whose backlog is full.
//! Each fault hits three tollgates at once, one per `on_error` (allow, deny, local), all sharing
//! one Redis. Every single `/check` must answer within `timeout_ms + 20 ms`, with no 5xx but the
//! configured 503; tollgate must be back on Redis within 1 s of Redis returning, with no restart,
//! and the bucket must be exact again.
//!
//! Each test prints one line per mode (max latency, recovery); run with `--nocapture` to see them.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use crate::support::chaos::{self, FullBacklog, Load, Proxy, Sample, UpWatch};
use crate::support::limit;
use crate::support::{wait_until, RedisServer, Tollgate};
use tollgate_core::config::OnError;

const TIMEOUT_MS: u64 = 50;
/// The promise: every answer within the store timeout plus 20 ms.
const LATENCY_BOUND: Duration = Duration::from_millis(TIMEOUT_MS + 20);
/// The promise: back on Redis within this long after Redis answers again.
const RECOVERY_BOUND: Duration = Duration::from_secs(1);
/// How long each fault lasts.
const FAULT_FOR: Duration = Duration::from_secs(2);

/// Slow refill, so an exactness probe of 13 quick requests sees exactly the burst of 10 pass.
const LIMITS: &str = "[[limits]]\nname = \"per-ip\"\nrate = 0.5\nburst = 10\nkey = [\"ip\"]\n";
const BURST: usize = 10;

/// The scenarios run one at a time: each already runs three tollgates under load on a small
/// machine, and the latency bound is about tollgate, not about CPU contention between tests.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

const MODES: [OnError; 3] = [OnError::Allow, OnError::Deny, OnError::Local];

/// What each `on_error` answer looks like from outside.
trait Expected: Copy {
    fn name(self) -> &'static str;
    fn store_decided(self, sample: &Sample) -> bool;
    fn allowed_statuses(self) -> &'static [u16];
}

impl Expected for OnError {
    fn name(self) -> &'static str {
        match self {
            OnError::Allow => "allow",
            OnError::Deny => "deny",
            OnError::Local => "local",
            OnError::Error => "error",
        }
    }

    /// Whether this answer came from Redis rather than from the `on_error` path. `local`
    /// answers look alike either way (quota headers included), so for it only
    /// `tollgate_store_up` tells.
    fn store_decided(self, sample: &Sample) -> bool {
        match self {
            OnError::Allow | OnError::Local => sample.quota_headers,
            // `/check` answers `error` as `deny`.
            OnError::Deny | OnError::Error => sample.status != 503,
        }
    }

    fn allowed_statuses(self) -> &'static [u16] {
        match self {
            OnError::Deny | OnError::Error => &[200, 429, 503],
            OnError::Allow | OnError::Local => &[200, 429],
        }
    }
}

struct Gate {
    mode: OnError,
    tollgate: Tollgate,
    log: PathBuf,
}

fn config(url: &str, mode: OnError) -> String {
    format!(
        "[store]\nbackend = \"redis\"\nurl = \"{url}\"\ntimeout_ms = {TIMEOUT_MS}\n\
         on_error = \"{m}\"\nkey_prefix = \"tg-{m}\"\n\n{LIMITS}",
        m = mode.name()
    )
}

fn start_gates(url: &str) -> Vec<Gate> {
    MODES
        .iter()
        .map(|&mode| {
            let (tollgate, log) = chaos::tollgate_logged(&config(url, mode), &[]);
            Gate {
                mode,
                tollgate,
                log,
            }
        })
        .collect()
}

/// Waits until every gate decides through Redis.
fn wait_healthy(gates: &[Gate]) {
    for gate in gates {
        assert!(
            wait_until(Duration::from_secs(5), || {
                gate.tollgate
                    .check(&[("X-Forwarded-For", "192.0.2.1")])
                    .header("ratelimit")
                    .is_some()
                    && gate.tollgate.metric("tollgate_store_up") == 1.0
            }),
            "{:?} never reached Redis",
            gate.mode
        );
    }
}

/// Sends 13 quick checks from a fresh address; returns how many passed. Each must be decided
/// by Redis (quota headers present). A check answered per `on_error` charged nothing and is
/// sent again: after Redis restarted, a worker whose connection sat idle meets the dead
/// socket at its first call (answered per `on_error`) and reconnects at once.
fn exact_probe(tollgate: &Tollgate, ip: &str) -> usize {
    let mut client = tollgate.client();
    let mut passed = 0;
    for _ in 0..BURST + 3 {
        let mut response = client
            .get("/check", &[("X-Forwarded-For", ip)])
            .expect("answer");
        for _ in 0..3 {
            if response.header("ratelimit").is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
            response = client
                .get("/check", &[("X-Forwarded-For", ip)])
                .expect("answer");
        }
        assert!(
            response.header("ratelimit").is_some(),
            "probe not decided by the store: {response:?}"
        );
        passed += usize::from(response.status == 200);
    }
    passed
}

struct Outcome {
    samples: Vec<Sample>,
    up_changes: Vec<(Instant, f64)>,
}

/// Runs load on every gate, calls `fault` (which breaks Redis, waits, heals it and returns when
/// Redis answers again), keeps the load on 1.5 s more, and returns what each gate saw.
fn under_load(gates: &[Gate], fault: impl FnOnce() -> Instant) -> (Instant, Vec<Outcome>) {
    let loads: Vec<(Load, UpWatch)> = gates
        .iter()
        .enumerate()
        .map(|(i, gate)| {
            (
                Load::start(gate.tollgate.addr, Duration::from_millis(2), i as u32),
                UpWatch::start(gate.tollgate.admin),
            )
        })
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let healed_at = fault();
    std::thread::sleep(Duration::from_millis(1500));
    let outcomes = loads
        .into_iter()
        .map(|(load, watch)| Outcome {
            samples: load.finish(),
            up_changes: watch.finish(),
        })
        .collect();
    (healed_at, outcomes)
}

fn log_lines(gate: &Gate, needle: &str) -> usize {
    std::fs::read_to_string(&gate.log)
        .unwrap_or_default()
        .lines()
        .filter(|line| line.contains(needle))
        .count()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Store calls that failed, of every kind (`tollgate_store_errors_total`).
fn store_errors(tollgate: &Tollgate) -> usize {
    let metrics = tollgate.metrics();
    ["timeout", "connection", "script", "other"]
        .iter()
        .map(|kind| {
            crate::support::metric_value(
                &metrics,
                &format!("tollgate_store_errors_total{{kind=\"{kind}\"}}"),
            )
        })
        .sum::<f64>() as usize
}

/// The common assertions; `failing` says whether the fault makes Redis calls fail.
fn assert_survived(
    fault: &str,
    gates: &[Gate],
    healed_at: Instant,
    outcomes: &[Outcome],
    failing: bool,
) {
    for (gate, outcome) in gates.iter().zip(outcomes) {
        let mode = gate.mode;
        let samples = &outcome.samples;
        assert!(samples.len() > 200, "{fault}/{mode:?}: too little load");
        let slowest = samples.iter().map(|s| s.latency).max().unwrap_or_default();
        // Where the slowest answer fell, relative to Redis answering again (negative: before).
        let slowest_at = samples.iter().max_by_key(|s| s.latency).map_or(0.0, |s| {
            s.at.saturating_duration_since(healed_at).as_secs_f64() * 1000.0
                - healed_at.saturating_duration_since(s.at).as_secs_f64() * 1000.0
        });
        let over: Vec<&Sample> = samples
            .iter()
            .filter(|s| s.latency > LATENCY_BOUND)
            .collect();
        let bad_status: Vec<u16> = samples
            .iter()
            .map(|s| s.status)
            .filter(|s| !mode.allowed_statuses().contains(s))
            .collect();
        let degraded = samples.iter().filter(|s| !mode.store_decided(s)).count();
        // Recovery: the first answer Redis decided among requests sent after Redis was back, and
        // the moment `tollgate_store_up` returned to 1.
        let back_by_answer = samples
            .iter()
            .filter(|s| mode != OnError::Local && s.at >= healed_at && mode.store_decided(s))
            .map(|s| s.at + s.latency - healed_at)
            .next();
        let went_down = outcome.up_changes.iter().any(|(_, v)| *v == 0.0);
        let back_by_gauge = outcome
            .up_changes
            .iter()
            .filter(|(at, v)| *at >= healed_at && *v == 1.0)
            .map(|(at, _)| at.duration_since(healed_at))
            .next()
            .or_else(|| (!went_down).then_some(Duration::ZERO));
        eprintln!(
            "{fault:<22} on_error={:<5} requests={:<5} degraded={:<5} max={:>6.1} ms \
             (at {slowest_at:>+6.0} ms) recovery: answers {:>7} ms, store_up {:>7} ms",
            mode.name(),
            samples.len(),
            degraded,
            ms(slowest),
            back_by_answer.map_or("-".into(), |d| format!("{:.0}", ms(d))),
            back_by_gauge.map_or("-".into(), |d| format!("{:.0}", ms(d))),
        );
        assert!(
            over.is_empty(),
            "{fault}/{mode:?}: {} {SLOW} {LATENCY_BOUND:?}, max {slowest:?}",
            over.len()
        );
        assert!(
            bad_status.is_empty(),
            "{fault}/{mode:?}: unexpected statuses {bad_status:?}"
        );
        if failing && mode != OnError::Local {
            assert!(degraded > 0, "{fault}/{mode:?}: the fault was never seen");
        }
        // A fault so brief that fewer calls failed than the breaker needs to open (a quick
        // restart, now that a new connection costs one round trip) was ridden out: nothing
        // to recover from, which is the better outcome.
        // `local` answers look the same either way, so for it the failed calls are counted
        // by tollgate itself.
        let failed_calls = match mode {
            OnError::Local => store_errors(&gate.tollgate),
            _ => degraded,
        };
        let ridden_out =
            !went_down && failed_calls < tollgate_core::store::breaker::FAILURE_THRESHOLD as usize;
        if failing && !ridden_out {
            assert!(
                went_down,
                "{fault}/{mode:?}: tollgate_store_up never showed 0"
            );
            assert_eq!(
                log_lines(gate, "circuit open"),
                1,
                "{fault}/{mode:?}: one log line when the circuit opens"
            );
            assert_eq!(
                log_lines(gate, "circuit closed"),
                1,
                "{fault}/{mode:?}: one log line when the circuit closes"
            );
            let back = back_by_gauge.expect("store_up back to 1");
            assert!(
                back <= RECOVERY_BOUND,
                "{fault}/{mode:?}: store_up back after {back:?}"
            );
            if mode != OnError::Local {
                let back = back_by_answer.expect("a store-decided answer after the fault");
                assert!(
                    back <= RECOVERY_BOUND,
                    "{fault}/{mode:?}: Redis decided again only after {back:?}"
                );
            }
        } else if !failing {
            assert_eq!(degraded, 0, "{fault}/{mode:?}: {STARVED} Redis");
            assert!(!went_down, "{fault}/{mode:?}: store_up dropped");
        }
        assert_eq!(
            exact_probe(&gate.tollgate, "203.0.113.77"),
            BURST,
            "{fault}/{mode:?}: not exact after the fault"
        );
    }
}

/// Runs a scenario; if it failed only on the latency bound, runs it once more. A shared CI
/// machine can stall any process for tens of milliseconds (a healthy Redis sees such
/// outliers too); a real regression, like a blocking call, fails both runs.
fn retry_once_if_only_slow(scenario: impl Fn()) {
    let first = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&scenario));
    let Err(panic) = first else { return };
    let message = panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_default();
    if !message.contains(SLOW) && !message.contains(STARVED) {
        std::panic::resume_unwind(panic);
    }
    eprintln!("only timing failed ({message}); running the scenario once more");
    scenario();
}

const SLOW: &str = "answers slower than";
/// A healthy Redis whose answer still missed the 50 ms budget: on a machine starved of CPU
/// (the suite beside CPU burners) one call in hundreds does. A defect repeats; starvation
/// rarely strikes the same scenario twice.
const STARVED: &str = "answers not decided by";

fn debug_redis() -> RedisServer {
    RedisServer::start_with(&["--enable-debug-command", "yes"])
}

#[test]
fn redis_killed_under_load_then_restarted() {
    let _serial = serial();
    retry_once_if_only_slow(|| {
        let mut redis = debug_redis();
        let gates = start_gates(&redis.url());
        wait_healthy(&gates);
        let (healed_at, outcomes) = under_load(&gates, || {
            redis.kill();
            std::thread::sleep(FAULT_FOR);
            // Measured from the start of the new process: tollgate may reach it before the
            // harness's own readiness poll does.
            let started = Instant::now();
            redis.restart();
            started
        });
        assert_survived("killed", &gates, healed_at, &outcomes, true);
    });
}

#[test]
fn redis_restarted_empty_starts_buckets_full() {
    let _serial = serial();
    retry_once_if_only_slow(|| {
        let mut redis = debug_redis();
        let gates = start_gates(&redis.url());
        wait_healthy(&gates);
        for gate in &gates {
            assert_eq!(exact_probe(&gate.tollgate, "203.0.113.9"), BURST);
        }
        let (healed_at, outcomes) = under_load(&gates, || {
            let started = Instant::now();
            redis.restart();
            started
        });
        assert_survived("restarted empty", &gates, healed_at, &outcomes, true);
        // Documented: the bucket state lived only in Redis, so an emptied Redis starts full.
        // A client the deny cache was turning away stays turned away until its cached window
        // ends (at most the 2 s this bucket needs to refill one token); after that, a kept
        // bucket would grant 1 or 2 requests, an emptied one grants the whole burst.
        std::thread::sleep(Duration::from_millis(2100));
        for gate in &gates {
            assert_eq!(exact_probe(&gate.tollgate, "203.0.113.9"), BURST);
        }
    });
}

#[test]
fn script_flush_is_invisible() {
    let _serial = serial();
    retry_once_if_only_slow(|| {
        let redis = debug_redis();
        let gates = start_gates(&redis.url());
        wait_healthy(&gates);
        let (healed_at, outcomes) = under_load(&gates, || {
            for _ in 0..5 {
                redis.cli(&["SCRIPT", "FLUSH"]);
                std::thread::sleep(Duration::from_millis(200));
            }
            Instant::now()
        });
        assert_survived("SCRIPT FLUSH x5", &gates, healed_at, &outcomes, false);
    });
}

#[test]
fn client_pause_of_two_seconds() {
    let _serial = serial();
    retry_once_if_only_slow(|| {
        let redis = debug_redis();
        let gates = start_gates(&redis.url());
        wait_healthy(&gates);
        let (healed_at, outcomes) = under_load(&gates, || {
            let paused_at = Instant::now();
            redis.cli(&["CLIENT", "PAUSE", &FAULT_FOR.as_millis().to_string()]);
            std::thread::sleep(FAULT_FOR.saturating_sub(paused_at.elapsed()));
            Instant::now()
        });
        assert_survived("CLIENT PAUSE 2 s", &gates, healed_at, &outcomes, true);
    });
}

#[test]
fn debug_sleep_of_two_seconds() {
    let _serial = serial();
    retry_once_if_only_slow(|| {
        let redis = debug_redis();
        let gates = start_gates(&redis.url());
        wait_healthy(&gates);
        let port = redis.port;
        let (healed_at, outcomes) = under_load(&gates, || {
            let sleeper = std::thread::spawn(move || {
                crate::support::redis_cli(
                    port,
                    &["DEBUG", "SLEEP", &FAULT_FOR.as_secs().to_string()],
                )
            });
            let _ = sleeper.join();
            Instant::now()
        });
        assert_survived("DEBUG SLEEP 2", &gates, healed_at, &outcomes, true);
    });
}

#[test]
fn black_hole_on_the_established_connection() {
    let _serial = serial();
    retry_once_if_only_slow(|| {
        let redis = debug_redis();
        let proxy = Proxy::start(redis.port);
        let gates = start_gates(&proxy.url());
        wait_healthy(&gates);
        let open_files = |gate: &Gate| {
            std::fs::read_dir(format!("/proc/{}/fd", gate.tollgate.pid())).map_or(0, |d| d.count())
        };
        let files_before: Vec<usize> = gates.iter().map(open_files).collect();
        let (healed_at, outcomes) = under_load(&gates, || {
            // The connection in use goes silent for good, and new ones are accepted and ignored:
            // what a Redis host that vanished looks like until its address answers again.
            proxy.freeze();
            std::thread::sleep(FAULT_FOR);
            proxy.thaw();
            Instant::now()
        });
        assert_survived("black hole", &gates, healed_at, &outcomes, true);
        // Each renewal replaced the connection: the abandoned ones are closed, not leaked.
        for (gate, before) in gates.iter().zip(files_before) {
            let after = open_files(gate);
            assert!(
                after <= before + 4,
                "{:?}: {before} open files before, {after} after",
                gate.mode
            );
        }
    });
}

#[test]
fn port_with_a_full_backlog() {
    let _serial = serial();
    retry_once_if_only_slow(|| {
        let mut redis = debug_redis();
        let port = redis.port;
        let gates = start_gates(&redis.url());
        wait_healthy(&gates);
        let (healed_at, outcomes) = under_load(&gates, || {
            redis.kill();
            // Connection attempts now hang in SYN_SENT: nothing refuses, nothing answers.
            let hole = FullBacklog::on_port(port);
            std::thread::sleep(FAULT_FOR);
            drop(hole);
            let started = Instant::now();
            redis = chaos::redis_on_port(port, &[]);
            started
        });
        assert_survived("full backlog", &gates, healed_at, &outcomes, true);
    });
}

/// `on_error = "local"` with two instances: each learned N = 2 from the heartbeat while Redis
/// was up, so after Redis dies each admits burst / 2 for a client, and together they admit the
/// burst (the split assumes the ingress spreads a client's requests over the instances).
#[test]
fn local_fallback_splits_each_limit_among_live_instances() {
    let _serial = serial();
    let mut redis = RedisServer::start();
    let limits = &limit("per-ip", 0.01, 20, &["ip"]);
    let config = crate::support::redis_config(&redis, "on_error = \"local\"", limits);
    let a = Tollgate::start(&config);
    let b = Tollgate::start(&config);
    assert!(
        wait_until(Duration::from_secs(5), || redis
            .cli(&["ZCARD", "tollgate:instances"])
            .trim()
            == "2"),
        "both instances should announce themselves"
    );
    // The first instance learns N = 2 at its next heartbeat (every 2 s).
    std::thread::sleep(Duration::from_millis(2300));
    redis.kill();
    let admitted = |tollgate: &Tollgate| {
        let mut client = tollgate.client();
        (0..15)
            .filter(|_| {
                client
                    .get("/check", &[("X-Forwarded-For", "198.51.100.20")])
                    .expect("answer")
                    .status
                    == 200
            })
            .count()
    };
    let (on_a, on_b) = (admitted(&a), admitted(&b));
    assert_eq!((on_a, on_b), (10, 10), "each instance admits burst / 2");
    assert_eq!(a.metric("tollgate_store_up"), 0.0);
    assert!(a.metric("tollgate_checks_total{result=\"error_denied\"}") >= 5.0);
}
