//! One decision of the in-process memory store on an existing key: ns per decision on one
//! thread, and total throughput with two threads on different keys (sharded, so it should
//! scale). Run with `cargo bench --bench memory_store`.

use std::hint::black_box;
use std::sync::Arc;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use tollgate_core::kinds::BucketRequest;
use tollgate_core::store::memory::MemoryStore;

fn request(key: &str) -> BucketRequest {
    // Never runs dry: the benchmark measures the decision, not denials.
    BucketRequest::bucket(key, 1e12, 1e12)
}

/// `iters` decisions on each of `threads` threads, each on its own existing key.
fn run_threads(store: &Arc<MemoryStore>, threads: usize, iters: u64) -> Duration {
    let started = Instant::now();
    std::thread::scope(|scope| {
        for t in 0..threads {
            let store = Arc::clone(store);
            scope.spawn(move || {
                // Eight keys per thread, so two threads rarely meet on one shard by chance.
                let reqs: Vec<[BucketRequest; 1]> = (0..8)
                    .map(|k| [request(&format!("tg:bench:thread-{t}-{k}"))])
                    .collect();
                for i in 0..iters {
                    black_box(store.decide_sync(black_box(&reqs[(i % 8) as usize])));
                }
            });
        }
    });
    started.elapsed()
}

fn decisions(c: &mut Criterion) {
    let store = Arc::new(MemoryStore::new(100_000));
    for i in 0..10_000 {
        store.decide_sync(&[request(&format!("tg:bench:{i}"))]);
    }

    let mut group = c.benchmark_group("memory_store");
    group.throughput(Throughput::Elements(1));
    let existing = [request("tg:bench:42")];
    group.bench_function("one_decision_existing_key_1_thread", |b| {
        b.iter(|| black_box(store.decide_sync(black_box(&existing))))
    });
    // Reported per decision of all threads together: with linear scaling, 2 threads show
    // half the time per decision of one thread on the same wall clock.
    for threads in [1usize, 2] {
        group.throughput(Throughput::Elements(threads as u64));
        group.bench_function(format!("decisions_{threads}_threads"), |b| {
            b.iter_custom(|iters| run_threads(&store, threads, iters))
        });
    }
    group.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    targets = decisions
}
criterion_main!(benches);
