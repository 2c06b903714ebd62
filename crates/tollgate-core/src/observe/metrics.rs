//! The Prometheus registry and every metric tollgate exports. Label children used on
//! the hot path are resolved once, so a check only bumps atomics. No client key is ever a label.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};

use prometheus::{
    Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

use crate::observe::top::KeyTop;

pub const CHECKS_TOTAL: &str = "tollgate_checks_total";
pub const EXEMPT_TOTAL: &str = "tollgate_exempt_total";
pub const LIMIT_DECISIONS_TOTAL: &str = "tollgate_limit_decisions_total";
pub const RESERVATIONS_TOTAL: &str = "tollgate_reservations_total";
pub const LEASES_TOTAL: &str = "tollgate_leases_total";
pub const CHECK_DURATION_SECONDS: &str = "tollgate_check_duration_seconds";
pub const STORE_DURATION_SECONDS: &str = "tollgate_store_duration_seconds";
pub const STORE_ERRORS_TOTAL: &str = "tollgate_store_errors_total";
pub const STORE_UP: &str = "tollgate_store_up";
pub const CONFIG_RELOADS_TOTAL: &str = "tollgate_config_reloads_total";
pub const BUILD_INFO: &str = "tollgate_build_info";
pub const GRPC_REQUESTS_TOTAL: &str = "tollgate_grpc_requests_total";
pub const GRPC_DURATION_SECONDS: &str = "tollgate_grpc_duration_seconds";
pub const RUNTIME_OVERRIDES: &str = "tollgate_runtime_overrides";
pub const TRACE_SPANS_TOTAL: &str = "tollgate_trace_spans_total";
pub const RLQS_STREAMS: &str = "tollgate_rlqs_streams";
pub const RLQS_BUCKETS: &str = "tollgate_rlqs_buckets";
pub const RLQS_REPORTS_TOTAL: &str = "tollgate_rlqs_reports_total";
pub const RLQS_ASSIGNMENTS_TOTAL: &str = "tollgate_rlqs_assignments_total";
pub const RLQS_SHARE_UTILISATION: &str = "tollgate_rlqs_share_utilisation";
pub const RLQS_STORE_UP: &str = "tollgate_rlqs_store_up";
pub const RLQS_STORE_ERRORS_TOTAL: &str = "tollgate_rlqs_store_errors_total";
pub const RLQS_UNTRACKED_TOTAL: &str = "tollgate_rlqs_untracked_total";
pub const RLQS_POOL_FULL_TOTAL: &str = "tollgate_rlqs_pool_full_total";
pub const RLQS_REGIONS_REFUSED_TOTAL: &str = "tollgate_rlqs_regions_refused_total";
pub const REGION_LINK_UP: &str = "tollgate_region_link_up";
pub const REGION_ASSIGNMENT_AGE_SECONDS: &str = "tollgate_region_assignment_age_seconds";
pub const REGION_SHARE_RATE: &str = "tollgate_region_share_rate";
pub const REGION_SHARE_BURST: &str = "tollgate_region_share_burst";
pub const REGION_SHARE_UTILISATION: &str = "tollgate_region_share_utilisation";
pub const BORROWED_TOKENS_TOTAL: &str = "tollgate_borrowed_tokens_total";

/// The `decision` label of `tollgate_limit_decisions_total`, and the `event` labels of
/// `tollgate_reservations_total` and `tollgate_leases_total`: every series a limit has.
const DECISIONS: [&str; 3] = ["allowed", "denied", "shadow_denied"];
const RESERVATION_EVENTS: [&str; 3] = ["opened", "settled", "not_held"];
const LEASE_EVENTS: [&str; 2] = ["taken", "released"];

/// Sub-millisecond buckets: a check normally costs one Redis round trip.
const LATENCY_BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
];

/// `tollgate_checks_total` by result.
#[derive(Clone)]
pub struct CheckCounters {
    pub allowed: IntCounter,
    pub denied: IntCounter,
    pub exempt: IntCounter,
    pub error_allowed: IntCounter,
    pub error_denied: IntCounter,
    /// The store failed and `on_error = "error"` answered an error (the caller decides).
    pub error: IntCounter,
}

/// `tollgate_borrowed_tokens_total` by event (borrowing limits, all keys together): tokens
/// taken from the store in slices, spent from slices by checks answered here without a store
/// call, and given back unused.
#[derive(Clone)]
pub struct BorrowCounters {
    pub borrowed: IntCounter,
    pub used: IntCounter,
    pub returned: IntCounter,
}

/// A region's link to its home (one limit across regions), on the instance that reports.
#[derive(Clone)]
pub struct RegionMetrics {
    /// 1 while the last report was answered, else 0.
    pub link_up: IntGauge,
    /// Seconds since the last answer from the home.
    pub assignment_age: Gauge,
    /// By global limit: the shares this region holds now, summed over its keys.
    pub share_rate: GaugeVec,
    pub share_burst: GaugeVec,
    /// By global limit: requests reported in the last interval over what the shares and
    /// floors of those keys let through in it.
    pub utilisation: GaugeVec,
}

/// `tollgate_store_errors_total` by kind.
#[derive(Clone)]
pub struct StoreErrorCounters {
    pub timeout: IntCounter,
    pub connection: IntCounter,
    pub script: IntCounter,
    pub other: IntCounter,
}

/// `tollgate_grpc_requests_total` by answer: what tells Envoy's gRPC calls from `/check`
/// (`tollgate_checks_total` counts the decisions of both).
#[derive(Clone)]
pub struct GrpcCounters {
    pub ok: IntCounter,
    pub over_limit: IntCounter,
    /// Refused with a gRPC error status (a malformed request, no configuration yet).
    pub invalid: IntCounter,
    /// Answered an error status because the store failed (`on_error = "error"`).
    pub error: IntCounter,
    pub duration: Histogram,
}

/// `tollgate_trace_spans_total`: what became of the sampled spans.
#[derive(Clone)]
pub struct SpanCounters {
    pub exported: IntCounter,
    /// Dropped at once: the export queue was full (the collector slow or away).
    pub queue_full: IntCounter,
    /// Lost with a batch the collector did not take.
    pub export_failed: IntCounter,
}

/// Envoy's quota service (RLQS).
#[derive(Clone)]
pub struct RlqsMetrics {
    /// Open `StreamRateLimitQuotas` streams on this instance.
    pub streams: IntGauge,
    /// Bucket ids those streams hold.
    pub buckets: IntGauge,
    /// Bucket usage reports received.
    pub reports: IntCounter,
    /// Assignments sent, by action.
    pub token_bucket: IntCounter,
    pub deny_all: IntCounter,
    pub allow_all: IntCounter,
    pub abandon: IntCounter,
    /// Per limit: the part of its rate handed out in the pool last reported to.
    pub utilisation: GaugeVec,
    /// 1 while the store decides reports, 0 while their own breaker is open.
    pub store_up: IntGauge,
    /// Store calls for reports that failed (timed out, refused, broken).
    pub store_errors: IntCounter,
    /// Reported bucket ids a stream did not track (too large, or past its caps).
    pub untracked: IntCounter,
    /// Reports of a stream new to a full pool (`rlqs.max_holders`), given nothing.
    pub pool_full: IntCounter,
    /// Region streams refused at home: an unknown region, or a floor other than the table's.
    pub regions_refused: IntCounter,
}

/// `tollgate_limit_decisions_total` for one limit.
#[derive(Clone)]
pub struct LimitCounters {
    pub allowed: IntCounter,
    pub denied: IntCounter,
    pub shadow_denied: IntCounter,
    /// The keys this limit denied most (`GET /v1/top`): in memory, never a label.
    pub denied_keys: Arc<KeyTop>,
    /// `tollgate_reservations_total`: reservations this instance opened, settled, and settles
    /// that found theirs no longer held (settled before, or expired).
    pub reservations_opened: IntCounter,
    pub reservations_settled: IntCounter,
    pub reservations_not_held: IntCounter,
    /// `tollgate_leases_total`: leases this instance took and gave back.
    pub leases_taken: IntCounter,
    pub leases_released: IntCounter,
}

impl LimitCounters {
    /// Counters in no registry: a limit built from its config alone counts into these until
    /// [`Metrics::limit_counters`] gives it the exported ones.
    pub fn detached() -> LimitCounters {
        LimitCounters {
            allowed: detached_counter(),
            denied: detached_counter(),
            shadow_denied: detached_counter(),
            denied_keys: Arc::default(),
            reservations_opened: detached_counter(),
            reservations_settled: detached_counter(),
            reservations_not_held: detached_counter(),
            leases_taken: detached_counter(),
            leases_released: detached_counter(),
        }
    }
}

/// A counter in no registry (see [`LimitCounters::detached`]).
pub fn detached_counter() -> IntCounter {
    IntCounter::new("detached", "not registered").expect("valid metric")
}

#[derive(Clone)]
pub struct Metrics {
    registry: Registry,
    pub checks: CheckCounters,
    limit_decisions: IntCounterVec,
    reservations: IntCounterVec,
    leases: IntCounterVec,
    exempt: IntCounterVec,
    pub check_duration: Histogram,
    pub store_duration: Histogram,
    pub store_errors: StoreErrorCounters,
    pub store_up: IntGauge,
    pub reload_success: IntCounter,
    pub reload_failure: IntCounter,
    pub grpc: GrpcCounters,
    /// Runtime overrides this instance holds, by limit (expired ones until the store drops them).
    pub runtime_overrides: IntGaugeVec,
    pub trace_spans: SpanCounters,
    pub rlqs: RlqsMetrics,
    pub borrow: BorrowCounters,
    pub region: RegionMetrics,
    tops: Arc<Mutex<HashMap<String, Arc<KeyTop>>>>,
}

impl Metrics {
    pub fn new() -> Metrics {
        let registry = Registry::new();
        let checks = IntCounterVec::new(
            Opts::new(CHECKS_TOTAL, "Checks answered, by result."),
            &["result"],
        )
        .expect("valid metric");
        let limit_decisions = IntCounterVec::new(
            Opts::new(
                LIMIT_DECISIONS_TOTAL,
                "Per-limit outcomes of evaluated checks.",
            ),
            &["limit", "decision"],
        )
        .expect("valid metric");
        let reservations = IntCounterVec::new(
            Opts::new(
                RESERVATIONS_TOTAL,
                "Reservations of reserving limits: opened by checks, settled by reports, and \
                 settles that found theirs no longer held (settled before or expired).",
            ),
            &["limit", "event"],
        )
        .expect("valid metric");
        let leases = IntCounterVec::new(
            Opts::new(
                LEASES_TOTAL,
                "Leases of concurrency limits this instance took and gave back (POST /release); \
                 taken minus released, summed over instances, bounds those held or expired.",
            ),
            &["limit", "event"],
        )
        .expect("valid metric");
        let exempt = IntCounterVec::new(
            Opts::new(
                EXEMPT_TOTAL,
                "Checks admitted by an [[exempt]] rule, by rule.",
            ),
            &["rule"],
        )
        .expect("valid metric");
        let check_duration = Histogram::with_opts(
            HistogramOpts::new(CHECK_DURATION_SECONDS, "Time to answer one /check.")
                .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        let store_duration = Histogram::with_opts(
            HistogramOpts::new(
                STORE_DURATION_SECONDS,
                "Time a caller waited for one store call.",
            )
            .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        let store_errors = IntCounterVec::new(
            Opts::new(STORE_ERRORS_TOTAL, "Failed store calls, by kind."),
            &["kind"],
        )
        .expect("valid metric");
        let store_up = IntGauge::new(STORE_UP, "1 while the store answers, 0 while it fails.")
            .expect("valid metric");
        let reloads = IntCounterVec::new(
            Opts::new(
                CONFIG_RELOADS_TOTAL,
                "Configuration reloads (SIGHUP, config directory, xDS), by result.",
            ),
            &["result"],
        )
        .expect("valid metric");
        let build_info = IntGaugeVec::new(
            Opts::new(BUILD_INFO, "Always 1; the version label names the build."),
            &["version"],
        )
        .expect("valid metric");
        build_info
            .with_label_values(&[env!("CARGO_PKG_VERSION")])
            .set(1);
        store_up.set(1);
        let grpc_requests = IntCounterVec::new(
            Opts::new(
                GRPC_REQUESTS_TOTAL,
                "ShouldRateLimit calls of Envoy's rate limit service, by answer.",
            ),
            &["code"],
        )
        .expect("valid metric");
        let grpc_duration = Histogram::with_opts(
            HistogramOpts::new(GRPC_DURATION_SECONDS, "Time to answer one ShouldRateLimit.")
                .buckets(LATENCY_BUCKETS.to_vec()),
        )
        .expect("valid metric");
        let runtime_overrides = IntGaugeVec::new(
            Opts::new(
                RUNTIME_OVERRIDES,
                "Overrides set through the admin API that this instance holds, by limit.",
            ),
            &["limit"],
        )
        .expect("valid metric");
        let trace_spans = IntCounterVec::new(
            Opts::new(
                TRACE_SPANS_TOTAL,
                "Sampled spans, by result: exported, or dropped (queue_full, export_failed).",
            ),
            &["result"],
        )
        .expect("valid metric");
        let rlqs_streams = IntGauge::new(
            RLQS_STREAMS,
            "Open StreamRateLimitQuotas streams (Envoy's quota filter) on this instance.",
        )
        .expect("valid metric");
        let rlqs_buckets = IntGauge::new(
            RLQS_BUCKETS,
            "Quota bucket ids the open RLQS streams of this instance hold.",
        )
        .expect("valid metric");
        let rlqs_reports = IntCounter::new(
            RLQS_REPORTS_TOTAL,
            "Bucket usage reports received from Envoy's quota filter.",
        )
        .expect("valid metric");
        let rlqs_assignments = IntCounterVec::new(
            Opts::new(
                RLQS_ASSIGNMENTS_TOTAL,
                "Bucket actions sent to Envoy's quota filter, by action: token_bucket (a share), \
                 deny_all, allow_all, abandon.",
            ),
            &["action"],
        )
        .expect("valid metric");
        let rlqs_utilisation = GaugeVec::new(
            Opts::new(
                RLQS_SHARE_UTILISATION,
                "Per limit: the part of its rate the Envoys of the pool last reported to may \
                 hold (shares counted until they expire), 0 to 1.",
            ),
            &["limit"],
        )
        .expect("valid metric");
        let rlqs_store_up = IntGauge::new(
            RLQS_STORE_UP,
            "1 while the store decides RLQS reports, 0 while their own circuit breaker is open.",
        )
        .expect("valid metric");
        rlqs_store_up.set(1);
        let rlqs_store_errors = IntCounter::new(
            RLQS_STORE_ERRORS_TOTAL,
            "Store calls deciding RLQS reports that failed (timed out, refused, broken).",
        )
        .expect("valid metric");
        let rlqs_untracked = IntCounter::new(
            RLQS_UNTRACKED_TOTAL,
            "Reported quota bucket ids a stream did not track: larger than 4 KiB, or past the \
             stream's caps (answered without a share).",
        )
        .expect("valid metric");
        let rlqs_pool_full = IntCounter::new(
            RLQS_POOL_FULL_TOTAL,
            "Reports of a stream new to a pool that already had rlqs.max_holders holders \
             (given nothing until one leaves).",
        )
        .expect("valid metric");
        let rlqs_regions_refused = IntCounter::new(
            RLQS_REGIONS_REFUSED_TOTAL,
            "Region streams the home refused: a region not in [home] regions, or one saying \
             another floor than the home's table (that region keeps its floor).",
        )
        .expect("valid metric");
        let region_link_up = IntGauge::new(
            REGION_LINK_UP,
            "1 while this region's reporter has its last report answered by the home, else 0.",
        )
        .expect("valid metric");
        let region_age = Gauge::new(
            REGION_ASSIGNMENT_AGE_SECONDS,
            "Seconds since this region's reporter last had an answer from the home.",
        )
        .expect("valid metric");
        let region_rate = GaugeVec::new(
            Opts::new(
                REGION_SHARE_RATE,
                "Tokens per second of the shares this region holds now, by global limit \
                 (summed over keys; the floor not included).",
            ),
            &["limit"],
        )
        .expect("valid metric");
        let region_burst = GaugeVec::new(
            Opts::new(
                REGION_SHARE_BURST,
                "Tokens of the shares this region holds now, by global limit (summed over keys).",
            ),
            &["limit"],
        )
        .expect("valid metric");
        let region_utilisation = GaugeVec::new(
            Opts::new(
                REGION_SHARE_UTILISATION,
                "Requests this region reported in the last interval over what its floors and \
                 shares of those keys refill in it, by global limit.",
            ),
            &["limit"],
        )
        .expect("valid metric");
        let borrowed = IntCounterVec::new(
            Opts::new(
                BORROWED_TOKENS_TOTAL,
                "Tokens of borrowing limits, by event: borrowed from the store in slices, used \
                 by checks answered from a slice, returned unused.",
            ),
            &["event"],
        )
        .expect("valid metric");

        for collector in [
            Box::new(checks.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(rlqs_streams.clone()),
            Box::new(rlqs_buckets.clone()),
            Box::new(rlqs_reports.clone()),
            Box::new(rlqs_assignments.clone()),
            Box::new(rlqs_utilisation.clone()),
            Box::new(rlqs_store_up.clone()),
            Box::new(rlqs_store_errors.clone()),
            Box::new(rlqs_untracked.clone()),
            Box::new(rlqs_pool_full.clone()),
            Box::new(rlqs_regions_refused.clone()),
            Box::new(limit_decisions.clone()),
            Box::new(reservations.clone()),
            Box::new(leases.clone()),
            Box::new(exempt.clone()),
            Box::new(check_duration.clone()),
            Box::new(store_duration.clone()),
            Box::new(store_errors.clone()),
            Box::new(store_up.clone()),
            Box::new(reloads.clone()),
            Box::new(build_info),
            Box::new(grpc_requests.clone()),
            Box::new(grpc_duration.clone()),
            Box::new(runtime_overrides.clone()),
            Box::new(trace_spans.clone()),
            Box::new(borrowed.clone()),
            Box::new(region_link_up.clone()),
            Box::new(region_age.clone()),
            Box::new(region_rate.clone()),
            Box::new(region_burst.clone()),
            Box::new(region_utilisation.clone()),
        ] {
            registry
                .register(collector)
                .expect("metric names are unique");
        }

        Metrics {
            checks: CheckCounters {
                allowed: checks.with_label_values(&["allowed"]),
                denied: checks.with_label_values(&["denied"]),
                exempt: checks.with_label_values(&["exempt"]),
                error_allowed: checks.with_label_values(&["error_allowed"]),
                error_denied: checks.with_label_values(&["error_denied"]),
                error: checks.with_label_values(&["error"]),
            },
            limit_decisions,
            reservations,
            leases,
            exempt,
            check_duration,
            store_duration,
            store_errors: StoreErrorCounters {
                timeout: store_errors.with_label_values(&["timeout"]),
                connection: store_errors.with_label_values(&["connection"]),
                script: store_errors.with_label_values(&["script"]),
                other: store_errors.with_label_values(&["other"]),
            },
            store_up,
            reload_success: reloads.with_label_values(&["success"]),
            reload_failure: reloads.with_label_values(&["failure"]),
            tops: Arc::default(),
            borrow: BorrowCounters {
                borrowed: borrowed.with_label_values(&["borrowed"]),
                used: borrowed.with_label_values(&["used"]),
                returned: borrowed.with_label_values(&["returned"]),
            },
            grpc: GrpcCounters {
                ok: grpc_requests.with_label_values(&["ok"]),
                over_limit: grpc_requests.with_label_values(&["over_limit"]),
                invalid: grpc_requests.with_label_values(&["invalid"]),
                error: grpc_requests.with_label_values(&["error"]),
                duration: grpc_duration,
            },
            runtime_overrides,
            trace_spans: SpanCounters {
                exported: trace_spans.with_label_values(&["exported"]),
                queue_full: trace_spans.with_label_values(&["queue_full"]),
                export_failed: trace_spans.with_label_values(&["export_failed"]),
            },
            rlqs: RlqsMetrics {
                streams: rlqs_streams,
                buckets: rlqs_buckets,
                reports: rlqs_reports,
                token_bucket: rlqs_assignments.with_label_values(&["token_bucket"]),
                deny_all: rlqs_assignments.with_label_values(&["deny_all"]),
                allow_all: rlqs_assignments.with_label_values(&["allow_all"]),
                abandon: rlqs_assignments.with_label_values(&["abandon"]),
                utilisation: rlqs_utilisation,
                store_up: rlqs_store_up,
                store_errors: rlqs_store_errors,
                untracked: rlqs_untracked,
                pool_full: rlqs_pool_full,
                regions_refused: rlqs_regions_refused,
            },
            region: RegionMetrics {
                link_up: region_link_up,
                assignment_age: region_age,
                share_rate: region_rate,
                share_burst: region_burst,
                utilisation: region_utilisation,
            },
            registry,
        }
    }

    /// Counters for one limit, resolved when the limits are compiled (start and reload).
    pub fn limit_counters(&self, limit: &str) -> LimitCounters {
        // Every limit shows its runtime override count from the start, 0 until one is set
        // (touching an existing series keeps its value across a reload).
        self.runtime_overrides.with_label_values(&[limit]);
        self.rlqs.utilisation.with_label_values(&[limit]);
        self.region.share_rate.with_label_values(&[limit]);
        self.region.share_burst.with_label_values(&[limit]);
        self.region.utilisation.with_label_values(&[limit]);
        let [allowed, denied, shadow_denied] =
            DECISIONS.map(|decision| self.limit_decisions.with_label_values(&[limit, decision]));
        let [reservations_opened, reservations_settled, reservations_not_held] =
            RESERVATION_EVENTS.map(|event| self.reservations.with_label_values(&[limit, event]));
        let [leases_taken, leases_released] =
            LEASE_EVENTS.map(|event| self.leases.with_label_values(&[limit, event]));
        LimitCounters {
            allowed,
            denied,
            shadow_denied,
            denied_keys: self.denied_keys(limit),
            reservations_opened,
            reservations_settled,
            reservations_not_held,
            leases_taken,
            leases_released,
        }
    }

    /// Drops every series and the top-denied table of each limit not in `live`, after a
    /// policy swap (a reload, a config directory change, an xDS update): limits come and go,
    /// and without this every name ever compiled would stay in memory and in `/metrics`.
    pub fn retain_limits<'a>(&self, live: impl IntoIterator<Item = &'a str>) {
        let live: HashSet<&str> = live.into_iter().collect();
        let mut tops = self.tops.lock().unwrap_or_else(PoisonError::into_inner);
        // Every compiled limit has a top table, so its names are every limit with series.
        tops.retain(|name, _| {
            if live.contains(name.as_str()) {
                return true;
            }
            let name = name.as_str();
            // An absent label set is no error worth telling: it is gone either way.
            for decision in DECISIONS {
                let _ = self.limit_decisions.remove_label_values(&[name, decision]);
            }
            for event in RESERVATION_EVENTS {
                let _ = self.reservations.remove_label_values(&[name, event]);
            }
            for event in LEASE_EVENTS {
                let _ = self.leases.remove_label_values(&[name, event]);
            }
            let _ = self.runtime_overrides.remove_label_values(&[name]);
            let _ = self.rlqs.utilisation.remove_label_values(&[name]);
            let _ = self.region.share_rate.remove_label_values(&[name]);
            let _ = self.region.share_burst.remove_label_values(&[name]);
            let _ = self.region.utilisation.remove_label_values(&[name]);
            false
        });
    }

    /// The top-denied keys of `limit`: one per name, so they survive a reload.
    fn denied_keys(&self, limit: &str) -> Arc<KeyTop> {
        let mut tops = self.tops.lock().unwrap_or_else(PoisonError::into_inner);
        tops.entry(limit.to_owned()).or_default().clone()
    }

    /// `tollgate_exempt_total` for one rule, resolved when the rules are compiled.
    pub fn exempt_counter(&self, rule: &str) -> IntCounter {
        self.exempt.with_label_values(&[rule])
    }

    /// The Prometheus text exposition of every metric.
    pub fn render(&self) -> String {
        let mut out = Vec::with_capacity(4096);
        let encoder = TextEncoder::new();
        // Encoding into a Vec only fails on a malformed metric family, which we never build.
        let _ = encoder.encode(&self.registry.gather(), &mut out);
        String::from_utf8(out).unwrap_or_default()
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_limit_leaves_no_series_and_no_top_table() {
        let metrics = Metrics::new();
        for limit in ["gone", "kept"] {
            metrics.limit_counters(limit).denied.inc();
        }
        metrics.retain_limits(["kept", "new"]);
        let text = metrics.render();
        assert!(!text.contains("\"gone\""), "{text}");
        assert!(text.contains("limit=\"kept\""), "{text}");
        let tops = metrics.tops.lock().unwrap_or_else(PoisonError::into_inner);
        assert_eq!(tops.keys().collect::<Vec<_>>(), ["kept"]);
    }
}
