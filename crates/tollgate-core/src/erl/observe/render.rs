//! What the counters show: the Prometheus text exposition of their series, and the statsd
//! lines of what increased since the last flush.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::PoisonError;

use super::{
    ErlStats, NEAR_LIMIT, OVER_LIMIT, RESPONSE_TIME_BUCKETS, STATS, TOTAL_HITS, WITHIN_LIMIT,
};

impl ErlStats {
    /// The Prometheus text exposition of every series, named and labelled as
    /// envoyproxy/ratelimit's built-in statsd mapping names them: a key's first segment is
    /// `domain`, the next `key1` and, if there is one, the one after `key2` (further segments
    /// add to the same series). A series appears once it counted something.
    pub fn render(&self) -> String {
        let retired = self.retired.lock().unwrap_or_else(PoisonError::into_inner);
        let mut series: BTreeMap<Labels, [u64; 5]> = retired
            .iter()
            .map(|(labels, sums)| (labels.clone(), *sums))
            .collect();
        for shard in &self.shards {
            for (key, counters) in shard.read().unwrap_or_else(PoisonError::into_inner).iter() {
                let sums = series.entry(Labels::of(key)).or_default();
                for (sum, counter) in sums.iter_mut().zip(&counters.counts) {
                    *sum = sum.saturating_add(counter.load(Ordering::Relaxed));
                }
            }
        }
        drop(retired);
        let mut out = String::new();
        for (i, stat) in STATS.iter().enumerate() {
            let name = format!("ratelimit_service_rate_limit_{stat}");
            let mut header = false;
            for (labels, counts) in &series {
                if counts[i] == 0 {
                    continue;
                }
                if !header {
                    help(&mut out, &name, "counter", stat_help(i));
                    header = true;
                }
                let _ = writeln!(out, "{name}{{{}}} {}", labels.0, counts[i]);
            }
        }
        self.render_service(&mut out);
        out
    }

    fn render_service(&self, out: &mut String) {
        let service = &self.service;
        let load = |counter: &AtomicU64| counter.load(Ordering::Relaxed);
        let errors = [
            ("redis_error", load(&service.redis_error)),
            ("service_error", load(&service.service_error)),
        ];
        if errors.iter().any(|&(_, n)| n > 0) {
            let name = "ratelimit_service_should_rate_limit_error";
            help(
                out,
                name,
                "counter",
                "ShouldRateLimit calls that failed, by cause.",
            );
            for (kind, n) in errors.into_iter().filter(|&(_, n)| n > 0) {
                let _ = writeln!(out, "{name}{{err_type=\"{kind}\"}} {n}");
            }
        }
        let requests = load(&service.total_requests);
        if requests > 0 {
            let name = "ratelimit_service_total_requests";
            help(out, name, "counter", "gRPC calls served, by method.");
            let _ = writeln!(out, "{name}{{grpc_method=\"ShouldRateLimit\"}} {requests}");
            let name = "ratelimit_service_response_time_seconds";
            help(
                out,
                name,
                "histogram",
                "Time to answer a gRPC call, by method.",
            );
            let mut cumulative = 0;
            for (le, bucket) in RESPONSE_TIME_BUCKETS.iter().zip(&service.response_buckets) {
                cumulative += load(bucket);
                let _ = writeln!(
                    out,
                    "{name}_bucket{{grpc_method=\"ShouldRateLimit\",le=\"{le}\"}} {cumulative}"
                );
            }
            let count = load(&service.response_count);
            #[expect(
                clippy::cast_precision_loss,
                reason = "a sum of milliseconds shown as a float, as Prometheus holds it"
            )]
            let sum = self.observed(load(&service.response_ms_sum) as f64);
            let _ = writeln!(
                out,
                "{name}_bucket{{grpc_method=\"ShouldRateLimit\",le=\"+Inf\"}} {count}"
            );
            let _ = writeln!(out, "{name}_sum{{grpc_method=\"ShouldRateLimit\"}} {sum}");
            let _ = writeln!(
                out,
                "{name}_count{{grpc_method=\"ShouldRateLimit\"}} {count}"
            );
        }
        for (name, counter, what) in [
            (
                "ratelimit_service_config_load_success",
                &service.config_load_success,
                "Rule sets loaded.",
            ),
            (
                "ratelimit_service_config_load_error",
                &service.config_load_error,
                "Rule sets refused.",
            ),
        ] {
            let n = load(counter);
            if n > 0 {
                help(out, name, "counter", what);
                let _ = writeln!(out, "{name} {n}");
            }
        }
    }

    /// What increased since the last call, as statsd counter lines (`name:N|c`) under
    /// envoyproxy/ratelimit's stat names; each line is handed to `line` without its newline.
    /// Only one flush may run at a time (the statsd duty's loop).
    pub fn statsd_lines(&self, mut line: impl FnMut(&str)) {
        let mut text = String::new();
        let delta = |counter: &AtomicU64, flushed: &AtomicU64| {
            let now = counter.load(Ordering::Relaxed);
            let before = flushed.swap(now, Ordering::Relaxed);
            now.saturating_sub(before)
        };
        for shard in &self.shards {
            // Held for reading only: a key counted for the first time meanwhile waits.
            let map = shard.read().unwrap_or_else(PoisonError::into_inner);
            for (key, counters) in map.iter() {
                for (i, stat) in STATS.iter().enumerate() {
                    let n = delta(&counters.counts[i], &counters.flushed[i]);
                    if n > 0 {
                        text.clear();
                        let _ = write!(text, "ratelimit.service.rate_limit.{key}.{stat}:{n}|c");
                        line(&text);
                    }
                }
            }
        }
        let service = &self.service;
        let counters = [
            (
                "ratelimit.service.call.should_rate_limit.redis_error",
                &service.redis_error,
            ),
            (
                "ratelimit.service.call.should_rate_limit.service_error",
                &service.service_error,
            ),
            (
                "ratelimit_server.ShouldRateLimit.total_requests",
                &service.total_requests,
            ),
            (
                "ratelimit.service.config_load_success",
                &service.config_load_success,
            ),
            (
                "ratelimit.service.config_load_error",
                &service.config_load_error,
            ),
        ];
        for ((name, counter), flushed) in counters.into_iter().zip(&service.flushed) {
            let n = delta(counter, flushed);
            if n > 0 {
                text.clear();
                let _ = write!(text, "{name}:{n}|c");
                line(&text);
            }
        }
    }
}

fn help(out: &mut String, name: &str, kind: &str, what: &str) {
    let _ = writeln!(out, "# HELP {name} {what}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn stat_help(stat: usize) -> &'static str {
    match stat {
        TOTAL_HITS => "Hits of the rule (envoyproxy/ratelimit's stats key in the labels).",
        OVER_LIMIT => "Hits over the rule's limit.",
        NEAR_LIMIT => "Hits beyond the near-limit ratio of the rule's limit.",
        WITHIN_LIMIT => "Hits within the rule's limit.",
        _ => "Hits over the limit of a rule in shadow mode.",
    }
}

/// The labels of a stats key's series, rendered `domain="…",key1="…"[,key2="…"]`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(super) struct Labels(String);

impl Labels {
    pub(super) fn of(key: &str) -> Labels {
        let mut segments = key.splitn(4, '.');
        let mut text = String::new();
        for (name, value) in ["domain", "key1", "key2"].iter().zip(&mut segments) {
            if !text.is_empty() {
                text.push(',');
            }
            let _ = write!(text, "{name}=\"");
            escape(&mut text, value);
            text.push('"');
        }
        Labels(text)
    }
}

/// A label value in the exposition format: backslash, double quote and newline escaped.
fn escape(into: &mut String, value: &str) {
    for c in value.chars() {
        match c {
            '\\' => into.push_str("\\\\"),
            '"' => into.push_str("\\\""),
            '\n' => into.push_str("\\n"),
            c => into.push(c),
        }
    }
}
