//! What recording one denial in the top-offenders summary costs, in ns, against what a denied
//! check costs on the memory store: the recording's share of `/check` without the noise of a
//! whole HTTP benchmark. Run with `cargo bench --bench top`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion};
use tollgate_core::kinds::BucketRequest;
use tollgate_core::observe::top::KeyTop;
use tollgate_core::store::memory::MemoryStore;

fn denied_request(key: &str) -> [BucketRequest; 1] {
    // Drained after the first call: every later decision is a denial.
    [BucketRequest::bucket(key, 1e-6, 1.0)]
}

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("denial");
    let store = MemoryStore::new(100_000);
    let one = denied_request("tg:per-key:{flood}");
    store.decide_sync(&one);
    group.bench_function("memory_store_denial", |b| {
        b.iter(|| black_box(store.decide_sync(black_box(&one))))
    });

    let top = KeyTop::default();
    group.bench_function("record_one_key_flood", |b| {
        b.iter(|| top.record(black_box("flood")))
    });

    // Distinct keys: every record evicts the smallest counter of a full summary.
    let keys: Vec<String> = (0..10_000).map(|i| format!("client-{i}")).collect();
    let mut next = 0;
    group.bench_function("record_10k_distinct_keys", |b| {
        b.iter(|| {
            next = (next + 1) % keys.len();
            top.record(black_box(&keys[next]))
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
