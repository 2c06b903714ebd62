//! What a policy costs a check in process, without HTTP: finding the buckets of a request
//! (`Policy::applicable`, where overrides are looked up) and rendering the answer's headers,
//! for one limit without overrides, the same limit with 100,000 overrides (the key overridden,
//! and not), 1,000 runtime overrides (the key overridden, and not), and an exempt request. Run with `cargo bench --bench policies`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use figment::providers::{Format, Serialized, Toml};
use http::header::{HeaderMap, HeaderName, HeaderValue};
use tollgate_core::config::Config;
use tollgate_core::kinds::BucketOutcome;
use tollgate_core::limiter::decision::{Decision, LimitState, Verdict};
use tollgate_core::observe::metrics::Metrics;
use tollgate_core::policy::Policy;
use tollgate_core::request::OriginalRequest;

const LIMIT: &str =
    "[[limits]]\nname = \"per-key\"\nrate = 100\nburst = 1000\nkey = [\"header:x-api-key\"]\n";

fn policy(extra: &str) -> Policy {
    let config: Config = figment::Figment::from(Serialized::defaults(Config::default()))
        .merge(Toml::string(&format!("{LIMIT}{extra}")))
        .extract()
        .expect("bench config parses");
    Policy::compile(&config, &Metrics::new()).expect("bench config is valid")
}

fn headers(key: &str) -> HeaderMap {
    let mut map = HeaderMap::new();
    map.insert(
        HeaderName::from_static("x-api-key"),
        HeaderValue::from_str(key).expect("ascii"),
    );
    map
}

/// `applicable`, then the headers of an allowed answer with the bucket's own numbers.
fn check(policy: &Policy, map: &HeaderMap) -> usize {
    let request = OriginalRequest::new(map, "GET", "/", "192.0.2.1".parse().expect("ip"));
    if policy.exempt(&request).is_some() {
        return 0;
    }
    let buckets = policy.applicable(&request).expect("no on_missing deny");
    let decision = Decision {
        allowed: true,
        limits: buckets
            .iter()
            .map(|b| {
                let paid = BucketOutcome {
                    tokens: b.burst - 1.0,
                    enough: true,
                    window: None,
                };
                LimitState::of(b, &paid)
            })
            .collect(),
        degraded: false,
        leases: Vec::new(),
        reservations: Vec::new(),
    };
    let response = tollgate::http::response::render(&Verdict::Decided(decision), policy);
    response.headers().len()
}

fn policies(c: &mut Criterion) {
    let dir = std::env::temp_dir().join(format!("tollgate-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("keys.toml");
    let entries: String = (0..100_000)
        .map(|i| {
            format!(
                "[[overrides]]\nkey = [\"k{i}\"]\nrate = {}\nburst = {}\n",
                200 + i,
                2000 + i
            )
        })
        .collect();
    std::fs::write(&file, entries).expect("write overrides");
    let plain = policy("");
    let overridden = policy(&format!("overrides_file = \"{}\"\n", file.display()));
    let exempt = policy("[[exempt]]\nname = \"batch\"\nheaders = { \"x-api-key\" = [\"k7\"] }\n");
    let _ = std::fs::remove_dir_all(&dir);
    // Runtime overrides (the admin API's) for 1,000 keys, k7 among them.
    let runtime = policy("");
    for i in 0..1000 {
        let entry = tollgate_core::policy::runtime_overrides::Entry {
            expires_at_ms: None,
            key: vec![format!("k{i}")],
            rate: None,
            burst: Some(3000),
            quota: None,
            unlimited: false,
        };
        let tail = format!("k{i}").into_bytes().into_boxed_slice();
        runtime
            .runtime
            .insert("per-key", tail, entry)
            .expect("below the cap");
    }

    let (k7, other) = (headers("k7"), headers("someone-else"));
    let mut group = c.benchmark_group("policies");
    group.bench_function("no_overrides", |b| {
        b.iter(|| black_box(check(&plain, black_box(&k7))))
    });
    group.bench_function("100k_overrides_key_overridden", |b| {
        b.iter(|| black_box(check(&overridden, black_box(&k7))))
    });
    group.bench_function("100k_overrides_key_not_overridden", |b| {
        b.iter(|| black_box(check(&overridden, black_box(&other))))
    });
    group.bench_function("1k_runtime_overrides_key_overridden", |b| {
        b.iter(|| black_box(check(&runtime, black_box(&k7))))
    });
    group.bench_function("1k_runtime_overrides_key_not_overridden", |b| {
        b.iter(|| black_box(check(&runtime, black_box(&other))))
    });
    group.bench_function("exempt", |b| {
        b.iter(|| black_box(check(&exempt, black_box(&k7))))
    });
    group.finish();
}

criterion_group!(benches, policies);
criterion_main!(benches);
