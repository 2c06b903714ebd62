use super::*;
use crate::erl::config::metrics::{MAX_KEYS, NEAR_LIMIT_RATIO};

fn counts(stats: &ErlStats, key: &str) -> [u64; 5] {
    let shard = stats.shards[shard_of(key)].read().unwrap();
    let counters = shard.get(key).expect("the key counted");
    std::array::from_fn(|i| counters.counts[i].load(Ordering::Relaxed))
}

fn hits(limit: u64, before: u64, hits: u64) -> Hits {
    Hits {
        limit,
        before,
        hits,
        shadow: false,
    }
}

/// envoyproxy/ratelimit test/limiter/base_limiter_test.go and its Redis cache tests: a
/// limit of 10 (near threshold 8) hit one at a time, then with an addend across both
/// thresholds.
#[test]
fn hits_are_counted_as_envoyproxy_ratelimit_counts_them() {
    let stats = ErlStats::new(NEAR_LIMIT_RATIO, false, MAX_KEYS);
    for before in 0..12 {
        stats.count(StatsName::fixed("d.k"), hits(10, before, 1));
    }
    // [total, over, near, within, shadow]: 8 plain, 2 near (9th, 10th), 2 over.
    assert_eq!(counts(&stats, "d.k"), [12, 2, 2, 10, 0]);

    // From 7, 5 more: 2 over (the 11th, 12th), the 2 between 8 and 10 near; the 8th is
    // neither, as there.
    stats.count(StatsName::fixed("d.jump"), hits(10, 7, 5));
    assert_eq!(counts(&stats, "d.jump"), [5, 2, 2, 0, 0]);
    // From 6, 3 more: within, 1 of them (the 9th) beyond the near threshold.
    stats.count(StatsName::fixed("d.near"), hits(10, 6, 3));
    assert_eq!(counts(&stats, "d.near"), [3, 0, 1, 3, 0]);
    // A shadow rule over its limit counts shadow_mode as much as over_limit.
    stats.count(
        StatsName::fixed("d.shadow"),
        Hits {
            shadow: true,
            ..hits(1, 1, 4)
        },
    );
    assert_eq!(counts(&stats, "d.shadow"), [4, 4, 0, 0, 4]);
    // requests_per_unit 0: every hit over.
    stats.count(StatsName::fixed("d.zero"), hits(0, 0, 2));
    assert_eq!(counts(&stats, "d.zero"), [2, 2, 0, 0, 0]);
    // No hits, no series.
    stats.count(StatsName::fixed("d.none"), hits(10, 0, 0));
    assert!(!stats.render().contains("d.none"));
}

#[test]
fn series_are_named_and_labelled_as_the_built_in_mapping_does() {
    let stats = ErlStats::new(NEAR_LIMIT_RATIO, false, MAX_KEYS);
    stats.count(StatsName::fixed("edge.path"), hits(1, 1, 1));
    stats.count(
        StatsName::fixed("edge.rule.masked_remote_address_0_0_0_0/0"),
        hits(1, 1, 2),
    );
    stats.count(
        StatsName::fixed("edge.rule.masked_remote_address_0_0_0_0/0.deeper"),
        hits(1, 1, 3),
    );
    stats.count(StatsName::fixed("edge.q\"uote"), hits(5, 0, 1));
    stats.request_served(std::time::Duration::from_millis(30));
    stats.service_error();
    stats.config_loaded(true);
    let text = stats.render();
    for line in [
        "ratelimit_service_rate_limit_over_limit{domain=\"edge\",key1=\"path\"} 1",
        // Segments past key2 add to key2's series.
        "ratelimit_service_rate_limit_over_limit{domain=\"edge\",key1=\"rule\",\
         key2=\"masked_remote_address_0_0_0_0/0\"} 5",
        "ratelimit_service_rate_limit_within_limit{domain=\"edge\",key1=\"q\\\"uote\"} 1",
        "ratelimit_service_should_rate_limit_error{err_type=\"service_error\"} 1",
        "ratelimit_service_total_requests{grpc_method=\"ShouldRateLimit\"} 1",
        "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",\
         le=\"0.025\"} 0",
        "ratelimit_service_response_time_seconds_bucket{grpc_method=\"ShouldRateLimit\",\
         le=\"0.05\"} 1",
        "ratelimit_service_response_time_seconds_sum{grpc_method=\"ShouldRateLimit\"} 0.03",
        "ratelimit_service_config_load_success 1",
    ] {
        assert!(text.lines().any(|l| l == line), "{line} not in\n{text}");
    }
    assert!(!text.contains("redis_error"), "{text}");
    assert!(!text.contains("config_load_error"), "{text}");
}

#[test]
fn statsd_lines_carry_the_increase_since_the_last_flush() {
    let stats = ErlStats::new(NEAR_LIMIT_RATIO, false, MAX_KEYS);
    stats.count(StatsName::fixed("d.k_v"), hits(2, 0, 1));
    stats.store_error();
    let flush = || {
        let mut lines = Vec::new();
        stats.statsd_lines(|l| lines.push(l.to_string()));
        lines.sort();
        lines
    };
    assert_eq!(
        flush(),
        [
            "ratelimit.service.call.should_rate_limit.redis_error:1|c",
            "ratelimit.service.rate_limit.d.k_v.total_hits:1|c",
            "ratelimit.service.rate_limit.d.k_v.within_limit:1|c",
        ]
    );
    assert!(flush().is_empty());
    stats.count(StatsName::fixed("d.k_v"), hits(2, 1, 2));
    assert_eq!(
        flush(),
        [
            "ratelimit.service.rate_limit.d.k_v.near_limit:1|c",
            "ratelimit.service.rate_limit.d.k_v.over_limit:1|c",
            "ratelimit.service.rate_limit.d.k_v.total_hits:2|c",
        ]
    );
}

fn render_sample(stats: &ErlStats, stat: &str, labels: &str) -> Option<u64> {
    let prefix = format!("ratelimit_service_rate_limit_{stat}{{{labels}}} ");
    stats
        .render()
        .lines()
        .find_map(|line| line.strip_prefix(&prefix)?.parse().ok())
}

#[test]
fn keys_carrying_request_values_are_capped_and_overflow_into_their_rule() {
    let stats = ErlStats::new(NEAR_LIMIT_RATIO, false, 3);
    for user in ["a", "b", "c", "d", "e"] {
        let key = format!("d.user_{user}");
        stats.count(
            StatsName::from_request(&key, "d.user.overflow"),
            hits(10, 0, 1),
        );
    }
    // The first three have keys of their own; the others count in the rule's overflow.
    assert_eq!(counts(&stats, "d.user_c"), [1, 0, 0, 1, 0]);
    assert_eq!(counts(&stats, "d.user.overflow"), [2, 0, 0, 2, 0]);
    assert!(!stats.render().contains("user_d"));
    // A key already held still counts; a key the configuration spells is never capped.
    stats.count(
        StatsName::from_request("d.user_a", "d.user.overflow"),
        hits(10, 1, 1),
    );
    assert_eq!(counts(&stats, "d.user_a"), [2, 0, 0, 2, 0]);
    stats.count(StatsName::fixed("d.plain"), hits(10, 0, 1));
    assert_eq!(counts(&stats, "d.plain"), [1, 0, 0, 1, 0]);
    assert_eq!(stats.keys(), 5);
    assert_eq!(
        render_sample(
            &stats,
            "total_hits",
            "domain=\"d\",key1=\"user\",key2=\"overflow\""
        ),
        Some(2)
    );
}

/// A key idle for IDLE_SWEEPS sweeps goes; its counts stay in its series while another
/// key of the series lives (the series never goes down), and go with the last one. Its
/// place under the cap is free again, and statsd sees one increase per hit throughout.
#[test]
fn idle_keys_are_dropped_and_their_series_never_go_down() {
    let stats = ErlStats::new(NEAR_LIMIT_RATIO, false, 2);
    let name = |key| StatsName::from_request(key, "d.r.s.overflow");
    let mut sent: HashMap<String, u64> = HashMap::new();
    let mut flush = |stats: &ErlStats| {
        stats.statsd_lines(|line| {
            let (key, n) = line.rsplit_once(':').unwrap();
            *sent.entry(key.to_string()).or_default() +=
                n.strip_suffix("|c").unwrap().parse::<u64>().unwrap();
        });
    };
    // Two keys of one series (segments past key2 add to it).
    let series = "domain=\"d\",key1=\"r\",key2=\"s\"";
    stats.count(name("d.r.s.one"), hits(10, 0, 3));
    stats.count(name("d.r.s.two"), hits(10, 0, 2));
    assert_eq!(render_sample(&stats, "total_hits", series), Some(5));
    let mut last = 5;
    for _ in 0..=IDLE_SWEEPS {
        stats.count(name("d.r.s.two"), hits(10, 0, 1));
        flush(&stats);
        stats.sweep();
        let now = render_sample(&stats, "total_hits", series).unwrap();
        assert_eq!(now, last + 1, "the series went down or skipped");
        last = now;
    }
    assert_eq!(stats.keys(), 1, "d.r.s.one was dropped");
    // Its place is free: a new key has its own counters, not the overflow's.
    stats.count(name("d.r.s.three"), hits(10, 0, 1));
    assert_eq!(counts(&stats, "d.r.s.three"), [1, 0, 0, 1, 0]);
    assert_eq!(render_sample(&stats, "total_hits", series), Some(last + 1));
    // All idle: the series goes with its last key.
    for _ in 0..=IDLE_SWEEPS {
        flush(&stats);
        stats.sweep();
    }
    assert_eq!(stats.keys(), 0);
    assert_eq!(render_sample(&stats, "total_hits", series), None);
    assert!(stats.retired.lock().unwrap().is_empty());
    // Back: from 0, as after a restart; statsd saw every hit once.
    stats.count(name("d.r.s.one"), hits(10, 0, 1));
    flush(&stats);
    assert_eq!(render_sample(&stats, "total_hits", series), Some(1));
    let total = |key: &str| sent[&format!("ratelimit.service.rate_limit.{key}.total_hits")];
    assert_eq!(total("d.r.s.one"), 4);
    assert_eq!(total("d.r.s.two"), 2 + u64::from(IDLE_SWEEPS) + 1);
    assert_eq!(total("d.r.s.three"), 1);
}

/// Keys the configuration spells stay however long they are idle.
#[test]
fn keys_the_configuration_spells_are_never_dropped() {
    let stats = ErlStats::new(NEAR_LIMIT_RATIO, false, MAX_KEYS);
    stats.count(StatsName::fixed("d.k"), hits(10, 0, 1));
    for _ in 0..=IDLE_SWEEPS * 2 {
        stats.sweep();
    }
    assert_eq!(counts(&stats, "d.k"), [1, 0, 0, 1, 0]);
}
