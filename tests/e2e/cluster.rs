//! tollgate on a real Redis Cluster (3 masters, 3 replicas): it starts before the cluster
//! exists, stays exact when one request draws from buckets in different slots, and follows a
//! master failover without a restart.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::support::cluster::{drive, drive_until, Outcome, RedisCluster};
use crate::support::Tollgate;

/// (name, rate, burst, key header). `per-user` and `per-user-minute` share a slot (same hash
/// tag); `per-tenant` lives in another slot, so every request spans slots.
const LIMITS: &[(&str, f64, f64, &str)] = &[
    ("per-user", 5.0, 10.0, "x-user"),
    ("per-user-minute", 2.0, 15.0, "x-user"),
    ("per-tenant", 20.0, 20.0, "x-tenant"),
];

/// How soon tollgate decides through Redis again once Redis answers, as docs/FAILURE-MODES.md
/// states it (its target; measured: 15 to 290 ms).
const RECOVERY: Duration = Duration::from_secs(1);

/// How long after the Cluster is healthy again the test allows for checks to be decided by it
/// again: three times the documented recovery. The Cluster's own failover (noticing the dead
/// master, electing its replica) is Redis's, and is not timed against tollgate.
const RECOVERY_BUDGET: Duration = Duration::from_secs(3);

fn config(seeds: &[String]) -> String {
    let seeds: Vec<String> = seeds.iter().map(|s| format!("\"{s}\"")).collect();
    let mut config = format!(
        "[store]\nbackend = \"redis\"\ncluster = [{}]\ntimeout_ms = 1000\non_error = \"deny\"\n\
         key_prefix = \"tgtest\"\n",
        seeds.join(", ")
    );
    for (name, rate, burst, header) in LIMITS {
        config.push_str(&format!(
            "\n[[limits]]\nname = \"{name}\"\nrate = {rate}\nburst = {burst}\n\
             key = [\"header:{header}\"]\n"
        ));
    }
    config
}

fn names(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}{i}")).collect()
}

fn allowed(o: &Outcome) -> bool {
    o.status == 200 && o.decided
}

/// For every bucket: allowed <= burst + rate * elapsed + 1. Returns the largest use of the bound
/// seen (allowed / bound) and the totals, for the report.
fn assert_exact(
    phase: &str,
    outcomes: &[Outcome],
    elapsed: Duration,
    users: usize,
    tenants: usize,
) {
    let secs = elapsed.as_secs_f64();
    let mut per_user = vec![0u64; users];
    let mut per_tenant = vec![0u64; tenants];
    for o in outcomes.iter().filter(|o| allowed(o)) {
        per_user[o.user] += 1;
        per_tenant[o.tenant] += 1;
    }
    for (name, rate, burst, header) in LIMITS {
        let counts = if *header == "x-user" {
            &per_user
        } else {
            &per_tenant
        };
        let bound = burst + rate * secs + 1.0;
        let max = counts.iter().copied().max().unwrap_or(0);
        assert!(
            counts.iter().all(|&n| n as f64 <= bound),
            "{phase}: {name} admitted {max} > bound {bound:.1} over {secs:.2}s: {counts:?}"
        );
        eprintln!(
            "{phase}: {name}: max admitted per bucket {max} <= bound {bound:.1} \
             (burst {burst} + {rate}/s x {secs:.2}s + 1)"
        );
    }
    let total_allowed: u64 = per_user.iter().sum();
    let denied = outcomes.iter().filter(|o| o.status == 429).count();
    let errors = outcomes.iter().filter(|o| o.status == 503).count();
    eprintln!(
        "{phase}: {} checks in {secs:.2}s: {total_allowed} allowed, {denied} denied, {errors} store errors",
        outcomes.len()
    );
    assert!(denied > 0, "{phase}: the load must exceed the limits");
    // Not vacuous: the tenant buckets (the cross-slot limit) really were used up.
    let tenant_bound = 20.0 + 20.0 * secs;
    assert!(
        per_tenant.iter().sum::<u64>() as f64 >= 0.5 * tenant_bound * tenants as f64
            || per_user.iter().sum::<u64>() as f64 >= 0.5 * (10.0 + 5.0 * secs) * users as f64,
        "{phase}: far fewer admissions than the limits allow: {per_user:?} {per_tenant:?}"
    );
}

#[test]
fn cluster_is_exact_across_slots_and_follows_a_master_failover() {
    let ports = RedisCluster::pick_ports();
    let seeds: Vec<String> = ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}"))
        .collect();
    let config = config(&seeds);

    // Lazy start: tollgate serves (per on_error) before any node exists.
    let first = Tollgate::start(&config);
    let early = first.check(&[("x-user", "early"), ("x-tenant", "early")]);
    assert_eq!(early.status, 503, "no cluster yet: on_error = deny");

    let mut cluster = RedisCluster::start_on(&ports);
    let others = [Tollgate::start(&config), Tollgate::start(&config)];
    let connected_after = Instant::now();
    assert!(
        crate::support::wait_until(Duration::from_secs(15), || {
            let r = first.check(&[("x-user", "warmup"), ("x-tenant", "warmup")]);
            r.status == 200 && r.header("ratelimit").is_some()
        }),
        "the tollgate started before the cluster never connected"
    );
    eprintln!(
        "lazy start: first store decision {:.2}s after the cluster came up",
        connected_after.elapsed().as_secs_f64()
    );
    let targets = [first.addr, others[0].addr, others[1].addr];

    // Phase 1: exactness with a multi-limit rule spanning slots, keys on every master.
    let (users, tenants) = (names("p1-user-", 24), names("p1-tenant-", 3));
    let (outcomes, elapsed) = drive(&targets, 9, Duration::from_secs(4), &users, &tenants);
    assert!(
        outcomes.iter().all(|o| o.status != 0),
        "tollgate always answers"
    );
    assert_exact("steady", &outcomes, elapsed, users.len(), tenants.len());
    let errors = outcomes.iter().filter(|o| o.status == 503).count();
    assert!(
        errors * 50 <= outcomes.len(),
        "steady state: {errors} of {} checks failed",
        outcomes.len()
    );
    let sizes = cluster.on_masters(&["DBSIZE"]);
    eprintln!("keys per master: {sizes:?}");
    assert_eq!(sizes.len(), 3);
    assert!(
        sizes
            .iter()
            .all(|s| s.trim().parse::<u64>().unwrap_or(0) > 0),
        "buckets spread over every master: {sizes:?}"
    );

    // Scripts vanish (flush here, and the promoted replica never had them): EVAL takes over.
    cluster.on_masters(&["SCRIPT", "FLUSH"]);

    // Phase 2: a master dies; its replica is promoted; tollgate follows without a restart.
    let victim = cluster.master_ports()[0];
    let heir = cluster
        .replica_of(victim)
        .expect("the victim has a replica");
    let (users2, tenants2) = (names("p2-user-", 24), names("p2-tenant-", 3));
    // The load runs until well past the recovery budget after the Cluster healed, however long
    // Redis takes to elect the replica (a busy machine may need a second election).
    let stop = Arc::new(AtomicBool::new(false));
    let load_start = Instant::now();
    let load = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            drive_until(
                &targets,
                6,
                &stop,
                Duration::from_secs(60),
                &users2,
                &tenants2,
            )
        })
    };
    std::thread::sleep(Duration::from_millis(1500));
    let killed_at = load_start.elapsed();
    cluster.kill(victim);
    assert!(
        cluster.wait_healthy(3, Duration::from_secs(15)),
        "the replica was not promoted"
    );
    let healed_at = load_start.elapsed();
    assert!(
        cluster.master_ports().contains(&heir),
        "{heir} is a master now"
    );
    std::thread::sleep(RECOVERY_BUDGET + Duration::from_secs(2));
    stop.store(true, Ordering::Release);
    let (outcomes, _) = load.join().expect("load thread");
    let recovered_by = healed_at + RECOVERY_BUDGET;
    assert!(
        outcomes.iter().all(|o| o.status != 0),
        "tollgate always answers"
    );
    let failed: Vec<&Outcome> = outcomes
        .iter()
        .filter(|o| !allowed(o) && o.status != 429)
        .collect();
    let window = match (failed.first(), failed.last()) {
        (Some(_), Some(_)) => {
            let first = failed.iter().map(|o| o.at).min().unwrap_or_default();
            let last = failed.iter().map(|o| o.at).max().unwrap_or_default();
            format!("{:.2}s..{:.2}s", first.as_secs_f64(), last.as_secs_f64())
        }
        _ => "none".into(),
    };
    let slowest = outcomes.iter().map(|o| o.latency).max().unwrap_or_default();
    eprintln!(
        "failover: master killed at {:.2}s, cluster healthy at {:.2}s; {} of {} checks failed \
         (503), in {window}; slowest answer {:.0} ms",
        killed_at.as_secs_f64(),
        healed_at.as_secs_f64(),
        failed.len(),
        outcomes.len(),
        slowest.as_secs_f64() * 1000.0
    );
    // A rare timeout on this shared machine may fall outside; the failover's errors may not.
    let outside = failed
        .iter()
        .filter(|o| o.at < killed_at || o.at > recovered_by)
        .count();
    assert!(
        outside * 100 <= outcomes.len(),
        "errors only inside the failover window: {outside} outside"
    );
    let in_window = outcomes
        .iter()
        .filter(|o| o.at >= killed_at && o.at <= recovered_by)
        .count();
    let last_failure_after_healing = failed
        .iter()
        .filter(|o| o.at >= healed_at)
        .map(|o| o.at - healed_at)
        .max();
    eprintln!(
        "failover: {} of {in_window} checks from the kill to {RECOVERY_BUDGET:?} after healing \
         failed; {outside} failures outside; the last failure {last_failure_after_healing:?} \
         after healing",
        failed.len() - outside
    );
    assert!(
        outcomes.iter().any(|o| o.at > recovered_by && allowed(o)),
        "checks are decided by the store again within {RECOVERY_BUDGET:?} of the failover \
         (3 x the documented {RECOVERY:?})"
    );

    // Phase 3: exact again on the new topology (fresh keys: a replica may lose the last writes).
    let (users, tenants) = (names("p3-user-", 24), names("p3-tenant-", 3));
    let (outcomes, elapsed) = drive(&targets, 9, Duration::from_secs(4), &users, &tenants);
    assert!(
        outcomes.iter().all(|o| o.status != 0),
        "tollgate always answers"
    );
    assert_exact(
        "after failover",
        &outcomes,
        elapsed,
        users.len(),
        tenants.len(),
    );
    let errors = outcomes.iter().filter(|o| o.status == 503).count();
    assert!(
        errors * 50 <= outcomes.len(),
        "after failover: {errors} of {} checks failed",
        outcomes.len()
    );
}

/// Checks that queue together on one thread go to the Cluster in one call per slot (a script
/// may touch one slot only), each decided exactly: 20 users spread over the masters, 5
/// checks each, all queued at once, burst 3.
#[test]
fn checks_queued_together_are_batched_per_slot_and_stay_exact() {
    use crate::support::redis_store;
    use tollgate_core::kinds::BucketRequest;
    use tollgate_core::store::redis::Topology;
    use tollgate_core::store::Store;

    let cluster = RedisCluster::start();
    let seeds = cluster.seeds();
    let (store, runtime) =
        redis_store(&Topology::Cluster { seeds: &seeds }, Duration::from_secs(5));
    let users = names("batch-user-", 20);
    let requests: Vec<Vec<BucketRequest>> = (0..5)
        .flat_map(|_| users.iter())
        .map(|user| {
            vec![BucketRequest::bucket(
                format!("tollgate:per-user:{{{user}}}"),
                0.001,
                3.0,
            )]
        })
        .collect();
    // The connection and the slot map first, so that the batch meets a ready Cluster.
    runtime
        .block_on(store.decide(&requests[0]))
        .expect("a first check");
    let decisions = runtime.block_on(futures_util::future::join_all(
        requests[1..].iter().map(|buckets| store.decide(buckets)),
    ));
    let mut admitted = std::collections::HashMap::new();
    admitted.insert(users[0].clone(), 1);
    for (buckets, decision) in requests[1..].iter().zip(decisions) {
        let decision = decision.expect("every check decided: no cross-slot call");
        if decision.allowed {
            *admitted.entry(buckets[0].key.clone()).or_insert(0) += 1;
        }
    }
    let total: usize = admitted.values().sum();
    assert_eq!(total, 20 * 3, "each user's burst exactly: {admitted:?}");
    let sizes = cluster.on_masters(&["DBSIZE"]);
    assert!(
        sizes
            .iter()
            .all(|s| s.trim().parse::<u64>().unwrap_or(0) > 0),
        "the users' buckets spread over every master: {sizes:?}"
    );
    let calls: u64 = cluster
        .on_masters(&["INFO", "commandstats"])
        .iter()
        .flat_map(|stats| stats.lines())
        .filter_map(|line| {
            let rest = line.trim().strip_prefix("cmdstat_eval")?;
            let rest = rest.strip_prefix("sha").unwrap_or(rest);
            rest.strip_prefix(":calls=")?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    assert!(
        calls < 40,
        "99 checks queued together took {calls} script calls"
    );
}

/// A concurrency limit on a Cluster, in a request whose other limit lives in another slot: a
/// denial there refunds the lease taken in this slot, an admission keeps it, and a release
/// reaches the lease's slot.
#[test]
fn a_lease_spanning_slots_is_refunded_when_another_slot_denies() {
    use crate::support::redis_store;
    use tollgate_core::kinds::concurrency::Lease;
    use tollgate_core::kinds::BucketRequest;
    use tollgate_core::store::redis::Topology;
    use tollgate_core::store::Store;

    let cluster = RedisCluster::start();
    let seeds = cluster.seeds();
    let (store, runtime) =
        redis_store(&Topology::Cluster { seeds: &seeds }, Duration::from_secs(5));
    let lease_key = "tollgate:conc:{lease-user}";
    let request = |id: u128| {
        vec![
            BucketRequest::lease(lease_key, 2, Lease { ttl_ms: 60_000, id }),
            BucketRequest::bucket("tollgate:budget:{other-tenant}", 0.001, 1.0).limit(1),
        ]
    };
    let first = runtime
        .block_on(store.decide(&request(1)))
        .expect("decided");
    assert!(first.allowed, "a slot and a token: admitted");
    let second = runtime
        .block_on(store.decide(&request(2)))
        .expect("decided");
    assert!(!second.allowed, "the budget in the other slot denies");
    let free = |store: &tollgate_core::store::redis::RedisStore| {
        // A peek counts the slots free in the lease's own slot.
        runtime
            .block_on(store.peek(&request(0)[0]))
            .expect("peek")
            .tokens
    };
    assert_eq!(free(&store), 1.0, "the denied request's lease was refunded");
    let member = format!("{:032x}", 1u128);
    assert!(runtime
        .block_on(store.release(lease_key, &member))
        .expect("release"));
    assert!(!runtime
        .block_on(store.release(lease_key, &member))
        .expect("again"));
    assert_eq!(free(&store), 2.0, "both slots free");
}

/// A reservation on a Cluster, in a request whose other limit lives in another slot: a denial
/// there refunds the estimate and drops the reservation in this slot (a settle then finds
/// nothing), an admission keeps it, and a settle reaches the reservation's slot.
#[test]
fn a_reservation_spanning_slots_is_refunded_when_another_slot_denies() {
    use crate::support::redis_store;
    use tollgate_core::kinds::reserve::{Reserve, Settle};
    use tollgate_core::kinds::BucketRequest;
    use tollgate_core::store::redis::Topology;
    use tollgate_core::store::Store;

    let cluster = RedisCluster::start();
    let seeds = cluster.seeds();
    let (store, runtime) =
        redis_store(&Topology::Cluster { seeds: &seeds }, Duration::from_secs(5));
    let bucket_key = "tollgate:tokens:{reserving-user}";
    let request = |id: u128| {
        vec![
            BucketRequest::reserve(
                bucket_key,
                0.001,
                10.0,
                Reserve {
                    ttl_ms: 60_000,
                    id,
                    refund: false,
                },
            )
            .cost(4),
            BucketRequest::bucket("tollgate:budget:{other-tenant}", 0.001, 1.0).limit(1),
        ]
    };
    let first = runtime
        .block_on(store.decide(&request(1)))
        .expect("decided");
    assert!(first.allowed, "an estimate and a token: admitted");
    let second = runtime
        .block_on(store.decide(&request(2)))
        .expect("decided");
    assert!(!second.allowed, "the budget in the other slot denies");
    let held = runtime
        .block_on(store.reserved(&request(0)[0]))
        .expect("peek");
    assert_eq!(
        (held.held, held.tokens),
        (1, 4),
        "only the admitted one is held"
    );
    let settle = |id: u128, actual: u64| Settle {
        bucket: request(id)[0].clone().cost(actual),
        estimate: 4,
        max_debt: 0.0,
    };
    let refunded = runtime
        .block_on(store.settle(&settle(2, 0)))
        .expect("settle");
    assert!(
        !refunded.held,
        "the denied request's reservation went with its refund"
    );
    let settled = runtime
        .block_on(store.settle(&settle(1, 1)))
        .expect("settle");
    assert!(settled.held);
    assert!(
        (settled.outcome.tokens - 9.0).abs() < 0.01,
        "the refund and the settle gave back all but the cost: {settled:?}"
    );
}

/// Borrowed tokens on a Cluster: three instances' slices of buckets spread over every
/// master, each bucket's held tokens in its own slot. Per bucket, the admissions (from slices
/// and from the store) stay within `burst + rate * t`, and slices did answer checks.
#[test]
fn borrowed_tokens_on_a_cluster_stay_within_each_bucket() {
    use crate::support::redis_store;
    use tollgate_core::kinds::{BucketRequest, Meter};
    use tollgate_core::limiter::borrow::{Lender, Plan};
    use tollgate_core::store::redis::Topology;
    use tollgate_core::store::Store;

    const RATE: f64 = 200.0;
    const BURST: f64 = 50.0;
    let cluster = RedisCluster::start();
    let seeds = cluster.seeds();
    let (store, runtime) =
        redis_store(&Topology::Cluster { seeds: &seeds }, Duration::from_secs(5));
    let lenders: Vec<Lender> = (0..3)
        .map(|_| Lender::new(1_000, 100_000).with_min_demand(2))
        .collect();
    let keys: Vec<String> = (0..6).map(|i| format!("tollgate:hot:{{k{i}}}")).collect();
    let bucket = |key: &str| BucketRequest {
        key: key.to_owned(),
        rate: RATE,
        burst: BURST,
        cost: 1,
        shadow: false,
        limit: 0,
        meter: Meter::Bucket,
    };
    runtime
        .block_on(store.decide(&[bucket(&keys[0])]))
        .expect("the slot map first");
    let mut admitted = vec![1.0; 1];
    admitted.resize(keys.len(), 0.0);
    let mut local = 0;
    let began = Instant::now();
    for i in 0..3_000 {
        let request = [bucket(&keys[i % keys.len()])];
        let allowed = match lenders[i % 3].plan(&request, &[true]).0 {
            Plan::Local(_) => {
                local += 1;
                true
            }
            Plan::Store(asking) => {
                let decision = runtime
                    .block_on(store.decide(asking.buckets()))
                    .expect("the cluster decides");
                asking.learn(&decision.slices);
                decision.allowed
            }
        };
        if allowed {
            admitted[i % keys.len()] += 1.0;
        }
    }
    let bound = BURST + RATE * began.elapsed().as_secs_f64();
    eprintln!(
        "borrowing on a cluster: {admitted:?} admitted (bound {bound:.1}), {local} from slices"
    );
    for (key, count) in keys.iter().zip(&admitted) {
        assert!(*count <= bound + 1.0, "{key}: {count} > {bound:.1}");
    }
    assert!(local > 0, "slices answered checks");
}
