//! The accuracy study in small (about 50,000 requests; the full one is
//! `cargo run --release --example accuracy`): Cloudflare's sliding-window
//! counter against the exact sliding log, on the same seeded traffic.

#[allow(dead_code)]
#[path = "../examples/accuracy/study.rs"]
mod study;

use std::time::Duration;

use study::{Kind, Shape, Trace};

const SHAPE: Shape = Shape {
    seed: 7,
    sources: 700,
    duration: Duration::from_secs(5 * 60),
    limit: 20,
    window: Duration::from_secs(60),
};

#[test]
fn the_sliding_window_counter_stays_close_to_the_exact_log() {
    let trace = Trace::generate(SHAPE);
    assert!(trace.requests.len() > 40_000, "{}", trace.requests.len());
    let n = trace.requests.len() as f64;
    let (cloudflare, _) = study::cloudflare_method(&trace, SHAPE);
    let report = study::run(&trace, SHAPE);
    let steady = &report.counter_by_kind[Kind::Steady as usize];
    let share = |wrong: u64| wrong as f64 / n;
    eprintln!("Cloudflare's method: {cloudflare:?}");
    eprintln!("as a limiter: {:?}", report.counter);

    // The judge is right: the exact log, judged the same way, is never wrong.
    assert_eq!(report.log.wrong(), 0);
    // Steady pollers below the limit are exactly what the counter's even
    // spread assumes: never limited, never let past.
    assert!(steady.requests > 10_000);
    assert_eq!(steady.wrong(), 0, "{steady:?}");
    // A hard bound: each fixed window admits at most the limit, so no
    // sliding window ever holds more than twice the limit.
    assert!(
        report.counter.worst_overshoot <= 1.0,
        "{:?}",
        report.counter
    );
    // Regression bounds for this trace. Measured: 3.3 % wrong decisions by
    // Cloudflare's method; as a limiter 7.2 %, of which 0.9 % wrongly
    // allowed, nearly all from sources sitting at the limit or bursting
    // through it. Broken weightings blow through them: weighting the
    // previous window by its elapsed part instead of its remaining part
    // gives 25.7 % wrong; ignoring it (a plain fixed window) lets 10.2 %
    // through wrongly; half its weight, 3.1 %.
    assert!(share(cloudflare.wrong()) < 0.05, "{cloudflare:?}");
    assert!(share(report.counter.wrong()) < 0.10, "{:?}", report.counter);
    assert!(
        share(report.counter.wrongly_allowed) < 0.02,
        "{:?}",
        report.counter
    );
}
