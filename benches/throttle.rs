//! The throttle's per-request cost: `Throttle::admit` with filters sized for
//! 100,000 callers at 1 % and that many callers in the window.
//!
//! `cargo bench --all-features --bench throttle`

use std::hint::black_box;
use std::time::Duration;

use criterion::{criterion_group, criterion_main, Criterion};
use tollgate::clock::ManualClock;
use tollgate::throttle::Throttle;
use tollgate::Key;

const CALLERS: usize = 100_000;

fn throttle() -> (Throttle, ManualClock) {
    let clock = ManualClock::new(1_800_000_000_000_000);
    let throttle = Throttle::builder("bench")
        .threshold(1_000)
        .capacity(CALLERS)
        .false_positive_rate(0.01)
        .clock(clock.clone())
        .build()
        .unwrap();
    (throttle, clock)
}

fn keys(prefix: &str) -> Vec<Key> {
    (0..CALLERS)
        .map(|i| Key::new(format!("{prefix}-{i}")))
        .collect()
}

fn bench(c: &mut Criterion) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .build()
        .unwrap();
    let (throttle, clock) = throttle();
    let old = keys("old");
    let now = keys("now");
    for k in &old {
        throttle.admit(k);
    }
    clock.advance(Duration::from_secs(60));
    rt.block_on(throttle.sync_once()).unwrap();
    for k in &now[..CALLERS / 2] {
        throttle.admit(k);
    }
    rt.block_on(throttle.sync_once()).unwrap();
    assert!(throttle.is_throttling());
    let strangers = keys("stranger");

    let mut g = c.benchmark_group("throttle_admit");
    let mut i = 0;
    let mut next = |keys: &[Key]| {
        i = (i + 7919) % keys.len();
        keys[i].clone()
    };
    g.bench_function("seen_this_minute", |b| {
        b.iter_batched(
            || next(&now[..CALLERS / 2]),
            |k| black_box(throttle.admit(&k)),
            criterion::BatchSize::SmallInput,
        )
    });
    g.bench_function("seen_earlier_in_window", |b| {
        b.iter_batched(
            || next(&old),
            |k| black_box(throttle.admit(&k)),
            criterion::BatchSize::SmallInput,
        )
    });
    g.bench_function("stranger_refused", |b| {
        b.iter_batched(
            || next(&strangers),
            |k| black_box(throttle.admit(&k)),
            criterion::BatchSize::SmallInput,
        )
    });
    g.bench_function("baseline_key_clone", |b| {
        b.iter_batched(
            || next(&strangers),
            black_box,
            criterion::BatchSize::SmallInput,
        )
    });
    g.finish();

    c.bench_function("throttle_round_local_100k", |b| {
        b.iter(|| rt.block_on(throttle.sync_once()).unwrap())
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
