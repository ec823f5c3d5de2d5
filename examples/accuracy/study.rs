//! The accuracy study, shared by `examples/accuracy` and its small test
//! version in `tests/accuracy.rs`: a seeded traffic trace, and the
//! sliding-window counter judged against the exact sliding log.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::{Key, MemoryStore, Policy, Quota, Store};

/// SplitMix64: tiny, seeded, and the same on every platform and version,
/// so a figure quoted from one run can be reproduced exactly.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn between(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// An exponential wait with the given mean.
    pub fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

/// How a source sends; rates are in requests per window, as a multiple of
/// the limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A poller: one request every interval (±10 % jitter), 0.2-0.9 × limit.
    Steady,
    /// A poller near the limit: 0.9-1.1 × limit.
    Near,
    /// A person browsing: random (Poisson) arrivals, 0.1-0.6 × limit.
    Random,
    /// Quiet (0.1 × limit, random), with bursts of 5-40 s at 2-6 × limit.
    Bursty,
    /// A scraper far above the limit: random arrivals, 1.5-4 × limit.
    Heavy,
}

impl Kind {
    pub const ALL: [Kind; 5] = [
        Kind::Steady,
        Kind::Near,
        Kind::Random,
        Kind::Bursty,
        Kind::Heavy,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Kind::Steady => "steady",
            Kind::Near => "near the limit",
            Kind::Random => "random",
            Kind::Bursty => "bursty",
            Kind::Heavy => "heavy",
        }
    }
}

/// The traffic to replay, in time order.
#[derive(Debug, Clone)]
pub struct Trace {
    /// `(time µs from the start, source)`.
    pub requests: Vec<(u64, u32)>,
    pub kinds: Vec<Kind>,
}

/// What to generate.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub seed: u64,
    pub sources: u32,
    pub duration: Duration,
    pub limit: u32,
    pub window: Duration,
}

impl Trace {
    /// 55 % steady, 20 % near the limit, 15 % random, 7 % bursty and 3 %
    /// heavy sources.
    pub fn generate(shape: Shape) -> Self {
        let mut rng = Rng::new(shape.seed);
        let end = shape.duration.as_secs_f64();
        let per_sec = f64::from(shape.limit) / shape.window.as_secs_f64();
        let mut requests = Vec::new();
        let mut kinds = Vec::new();
        for source in 0..shape.sources {
            let kind = match rng.unit() {
                p if p < 0.55 => Kind::Steady,
                p if p < 0.75 => Kind::Near,
                p if p < 0.90 => Kind::Random,
                p if p < 0.97 => Kind::Bursty,
                _ => Kind::Heavy,
            };
            kinds.push(kind);
            let mut random = |from: f64, to: f64, rate: f64, rng: &mut Rng| {
                let mut t = from + rng.exponential(1.0 / rate);
                while t < to {
                    requests.push(((t * 1e6) as u64, source));
                    t += rng.exponential(1.0 / rate);
                }
            };
            let poll = |rate: f64, rng: &mut Rng| {
                let every = 1.0 / rate;
                let mut t = rng.between(0.0, every);
                let mut out = Vec::new();
                while t < end {
                    out.push(((t * 1e6) as u64, source));
                    t += every * rng.between(0.9, 1.1);
                }
                out
            };
            match kind {
                Kind::Steady => requests.extend(poll(per_sec * rng.between(0.2, 0.9), &mut rng)),
                Kind::Near => requests.extend(poll(per_sec * rng.between(0.9, 1.1), &mut rng)),
                Kind::Random => random(0.0, end, per_sec * rng.between(0.1, 0.6), &mut rng),
                Kind::Heavy => random(0.0, end, per_sec * rng.between(1.5, 4.0), &mut rng),
                Kind::Bursty => {
                    random(0.0, end, per_sec * 0.1, &mut rng);
                    let mut t = rng.exponential(180.0);
                    while t < end {
                        let length = rng.between(5.0, 40.0);
                        let rate = per_sec * rng.between(2.0, 6.0);
                        random(t, (t + length).min(end), rate, &mut rng);
                        t += length + rng.exponential(180.0);
                    }
                }
            }
        }
        requests.sort_unstable();
        Self { requests, kinds }
    }
}

/// One store's decisions judged against the exact rate of what it admitted.
#[derive(Debug, Clone, Default)]
pub struct Errors {
    pub requests: u64,
    pub admitted: u64,
    /// Allowed although the source already had `limit` admitted in
    /// `(now − window, now]`.
    pub wrongly_allowed: u64,
    /// Limited although fewer than `limit` were admitted in that window.
    pub wrongly_limited: u64,
    /// Sources that ever had more than `limit` admitted in one window.
    pub sources_over_limit: u32,
    /// The most any source had admitted in one window, over the limit.
    pub worst_overshoot: f64,
}

impl Errors {
    pub fn wrong(&self) -> u64 {
        self.wrongly_allowed + self.wrongly_limited
    }
}

/// The judge: per source, the times a store admitted, exactly.
#[derive(Debug)]
struct Judge {
    window: u64,
    limit: u64,
    admitted: Vec<VecDeque<u64>>,
    over: Vec<bool>,
    /// Totals, then per source kind.
    errors: Errors,
    by_kind: [Errors; 5],
}

impl Judge {
    fn new(sources: usize, window: u64, limit: u64) -> Self {
        Self {
            window,
            limit,
            admitted: vec![VecDeque::new(); sources],
            over: vec![false; sources],
            errors: Errors::default(),
            by_kind: Default::default(),
        }
    }

    /// Records one decision; returns the exact count before it.
    fn judge(&mut self, now: u64, source: usize, kind: Kind, allowed: bool) -> u64 {
        let mine = &mut self.admitted[source];
        while mine.front().is_some_and(|&t| t + self.window <= now) {
            mine.pop_front();
        }
        let exact = mine.len() as u64;
        let mut fresh_over = false;
        let (wrongly_allowed, wrongly_limited) = if allowed {
            mine.push_back(now);
            (exact + 1 > self.limit, false)
        } else {
            (false, exact < self.limit)
        };
        let overshoot = (exact + 1) as f64 / self.limit as f64 - 1.0;
        if wrongly_allowed && !self.over[source] {
            self.over[source] = true;
            fresh_over = true;
        }
        for e in [&mut self.errors, &mut self.by_kind[kind as usize]] {
            e.requests += 1;
            e.admitted += u64::from(allowed);
            e.wrongly_allowed += u64::from(wrongly_allowed);
            e.wrongly_limited += u64::from(wrongly_limited);
            e.sources_over_limit += u32::from(fresh_over);
            if wrongly_allowed {
                e.worst_overshoot = e.worst_overshoot.max(overshoot);
            }
        }
        exact
    }
}

/// The study's results.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub requests: u64,
    /// The sliding-window counter, judged exactly; then per kind of source,
    /// in the order of [`Kind::ALL`].
    pub counter: Errors,
    pub counter_by_kind: [Errors; 5],
    /// The exact sliding log, by the same judge: must be all zeros.
    pub log: Errors,
    /// Side by side, each store keeping its own state: how often the two
    /// disagreed.
    pub counter_allowed_log_limited: u64,
    pub log_allowed_counter_limited: u64,
    /// Mean |estimate − exact| / limit over the counter's admissions.
    pub mean_estimate_error: f64,
}

/// Cloudflare's measurement: both estimators see every request of a source,
/// rejected or not, and a request is limited when the rate including it is
/// above the limit: the approximate rate `prev × weight + cur` (the same
/// weighting as [`tollgate`]'s counter) against the exact count in
/// `(now − window, now]`. No store is involved: nothing feeds back.
pub fn cloudflare_method(trace: &Trace, shape: Shape) -> (Errors, [Errors; 5]) {
    let window = shape.window.as_micros() as u64;
    let limit = u64::from(shape.limit);
    let start = 1_700_000_000_000_000 - 1_700_000_000_000_000 % window;
    let sources = trace.kinds.len();
    let mut seen: Vec<VecDeque<u64>> = vec![VecDeque::new(); sources];
    let mut windows: Vec<(u64, u64, u64)> = vec![(0, 0, 0); sources];
    let mut over = vec![false; sources];
    let mut total = Errors::default();
    let mut by_kind: [Errors; 5] = Default::default();
    for &(at, source) in &trace.requests {
        let now = start + at;
        let s = source as usize;
        let mine = &mut seen[s];
        while mine.front().is_some_and(|&t| t + window <= now) {
            mine.pop_front();
        }
        let exact = mine.len() as u64 + 1;
        mine.push_back(now);
        let index = now / window;
        let (w, cur, prev) = &mut windows[s];
        if *w != index {
            (*prev, *cur) = if *w + 1 == index { (*cur, 0) } else { (0, 0) };
            *w = index;
        }
        *cur += 1;
        let weight = (window - now % window) as f64 / window as f64;
        let allowed = *prev as f64 * weight <= (limit as f64) - (*cur as f64);
        let exact_allows = exact <= limit;
        let fresh_over = allowed && !exact_allows && !over[s];
        over[s] |= fresh_over;
        for e in [&mut total, &mut by_kind[trace.kinds[s] as usize]] {
            e.requests += 1;
            e.admitted += u64::from(allowed);
            if allowed && !exact_allows {
                e.wrongly_allowed += 1;
                e.worst_overshoot = e.worst_overshoot.max(exact as f64 / limit as f64 - 1.0);
            }
            e.sources_over_limit += u32::from(fresh_over);
            e.wrongly_limited += u64::from(!allowed && exact_allows);
        }
    }
    (total, by_kind)
}

/// The value of a future that is ready at once, as the memory store's are.
fn ready<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    match future
        .as_mut()
        .poll(&mut Context::from_waker(Waker::noop()))
    {
        Poll::Ready(value) => value,
        Poll::Pending => panic!("the memory store answers at once"),
    }
}

/// Replays `trace` into a sliding-window counter and a sliding log (each a
/// `MemoryStore` on one `ManualClock`), `limit` per `window` per source.
pub fn run(trace: &Trace, shape: Shape) -> Report {
    let quota = Quota::new(shape.limit, shape.window).unwrap();
    let window = shape.window.as_micros() as u64;
    let limit = u64::from(shape.limit);
    // Start on a window boundary far from the epoch, as real clocks are.
    let start = 1_700_000_000_000_000 - 1_700_000_000_000_000 % window;
    let clock = ManualClock::new(start);
    let counter = MemoryStore::with_clock(clock.clone());
    let log = MemoryStore::with_clock(clock.clone());
    let counter_policy = Policy::sliding_window("acc", quota);
    // The resource limit is never reached: a plain per-source exact log.
    let everyone = Quota::new(1_000_000, shape.window).unwrap();
    let log_policy = Policy::sliding_log("acc", everyone, quota);
    let sources = trace.kinds.len();
    let keys: Vec<Key> = (0..sources).map(|s| Key::new(format!("s{s}"))).collect();

    let mut counter_judge = Judge::new(sources, window, limit);
    let mut log_judge = Judge::new(sources, window, limit);
    // The counter's own view per source: (window index, current, previous).
    let mut windows: Vec<(u64, u64, u64)> = vec![(0, 0, 0); sources];
    let mut report = Report {
        requests: trace.requests.len() as u64,
        ..Report::default()
    };
    let mut estimate_error = 0.0;

    for &(at, source) in &trace.requests {
        let now = start + at;
        clock.set(now);
        let (s, kind) = (source as usize, trace.kinds[source as usize]);
        let by_counter = ready(counter.check(&counter_policy, &keys[s], 1))
            .unwrap()
            .allowed;
        let by_log = ready(log.check(&log_policy, &keys[s], 1)).unwrap().allowed;
        match (by_counter, by_log) {
            (true, false) => report.counter_allowed_log_limited += 1,
            (false, true) => report.log_allowed_counter_limited += 1,
            _ => {}
        }
        let exact = counter_judge.judge(now, s, kind, by_counter);
        log_judge.judge(now, s, kind, by_log);

        let index = now / window;
        let (w, cur, prev) = &mut windows[s];
        if *w != index {
            (*prev, *cur) = if *w + 1 == index { (*cur, 0) } else { (0, 0) };
            *w = index;
        }
        if by_counter {
            let weight = (window - now % window) as f64 / window as f64;
            let estimate = *prev as f64 * weight + *cur as f64;
            estimate_error += (estimate - exact as f64).abs() / limit as f64;
            *cur += 1;
        }
    }
    report.mean_estimate_error = estimate_error / counter_judge.errors.admitted.max(1) as f64;
    report.counter = counter_judge.errors;
    report.counter_by_kind = counter_judge.by_kind;
    report.log = log_judge.errors;
    report
}
