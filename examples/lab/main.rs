//! The strategy lab: each strategy's behaviour under one crowd, charted.
//!
//! ```text
//! cargo run --release --example lab                  # memory store, a few seconds
//! REDIS_URL=redis://127.0.0.1:7000/ cargo run --release --example lab
//! LAB_LIMIT=50 LAB_SECS=120 LAB_BURST=20 cargo run --release --example lab
//! ```
//!
//! For every strategy in `examples/support/lineup.rs`, a crowd of callers
//! (by default twice as many as the limit allows per window, half of them
//! bursty) calls one gated resource for `LAB_SECS` of simulated time. Time
//! is a [`ManualClock`] moved to each arrival, so a minute runs in
//! milliseconds and every run with the same seed is the same. Every decision
//! is recorded (in memory, or with `REDIS_URL` in a Redis Stream per
//! strategy, read back with `XRANGE`), aggregated per second, and drawn into
//! `LAB_OUT` (default `lab-out/`): one SVG per strategy, `overlay.svg` with
//! all of them, and `summary.md` with the table printed at the end.
//!
//! Environment (defaults in brackets): `LAB_LIMIT` [10] per `LAB_WINDOW_MS`
//! [1000]; `LAB_CALLERS` [2 x limit]; `LAB_BURSTY` bursty callers [half];
//! `LAB_BURST` requests per burst [5]; `LAB_RATE` requests per second each
//! caller offers on average [one per window]; `LAB_HOLD_MS` how long an
//! admitted request keeps its concurrency slot [one window]; `LAB_SECS`
//! [60]; `LAB_SEED` [1]; `LAB_OUT` [lab-out]; `REDIS_URL` [unset: memory].
//!
//! A leaky bucket's admission counts when the request leaves the bucket
//! (after its wait), and a concurrency slot is given back `LAB_HOLD_MS`
//! after admission, in time order with the arrivals.

mod chart;
mod crowd;
mod events;
#[path = "../support/lineup.rs"]
mod lineup;
mod stats;

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tollgate::clock::ManualClock;
use tollgate::decision::Receipt;
use tollgate::{Key, MemoryStore, Policy, Quota, RedisStore, Store, Strategy};

/// 2023-11-14T22:00:00Z, in µs: where simulated time starts (a whole hour,
/// so every window up to an hour starts on a boundary).
const START_MICROS: u64 = 1_699_999_200_000_000;

use crate::crowd::Crowd;
use crate::events::{Event, Log};
use crate::stats::Summary;

/// The lab's settings, read from the environment and checked up front.
struct Config {
    limit: u32,
    window: Duration,
    /// How long an admitted request keeps a concurrency slot.
    hold: Duration,
    crowd: Crowd,
    out: PathBuf,
    redis_url: Option<String>,
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}={v:?} is not valid")),
        _ => Ok(default),
    }
}

impl Config {
    fn from_env() -> Result<Self, String> {
        let limit: u32 = env_or("LAB_LIMIT", 10)?;
        let window = Duration::from_millis(env_or("LAB_WINDOW_MS", 1000)?);
        let callers: u32 = env_or("LAB_CALLERS", limit.saturating_mul(2))?;
        let bursty: u32 = env_or("LAB_BURSTY", callers / 2)?;
        let burst: u32 = env_or("LAB_BURST", 5)?;
        let rate: f64 = env_or("LAB_RATE", 1.0 / window.as_secs_f64().max(1e-3))?;
        let secs: u64 = env_or("LAB_SECS", 60)?;
        let seed: u64 = env_or("LAB_SEED", 1)?;
        let hold = Duration::from_millis(env_or("LAB_HOLD_MS", window.as_millis() as u64)?);
        if callers == 0
            || bursty > callers
            || burst == 0
            || !rate.is_finite()
            || rate <= 0.0
            || secs == 0
        {
            return Err(
                "need LAB_CALLERS > 0, LAB_BURSTY <= LAB_CALLERS, LAB_BURST > 0, LAB_RATE > 0 and LAB_SECS > 0"
                    .into(),
            );
        }
        Quota::with_window(
            std::num::NonZeroU32::new(limit).ok_or("LAB_LIMIT must be at least 1")?,
            window,
        )
        .map_err(|e| e.to_string())?;
        Ok(Self {
            limit,
            window,
            hold,
            crowd: Crowd {
                callers,
                bursty,
                rate,
                burst,
                length: secs * 1_000_000,
                seed,
            },
            out: PathBuf::from(env_or("LAB_OUT", "lab-out".to_owned())?),
            redis_url: std::env::var("REDIS_URL")
                .ok()
                .filter(|u| !u.trim().is_empty()),
        })
    }

    fn quota(&self) -> Quota {
        Quota::new(self.limit, self.window).expect("checked in from_env")
    }

    /// The limit as units per second, for the charts' flat line.
    fn limit_per_sec(&self) -> f64 {
        f64::from(self.limit) / self.window.as_secs_f64()
    }

    fn secs(&self) -> usize {
        (self.crowd.length / 1_000_000) as usize
    }
}

/// Where the lab keeps limits and events.
enum Backend {
    Memory,
    Redis {
        conn: redis::aio::MultiplexedConnection,
        prefix: String,
    },
}

impl Backend {
    async fn open(config: &Config) -> Result<Self, String> {
        let Some(url) = &config.redis_url else {
            return Ok(Backend::Memory);
        };
        let client = redis::Client::open(url.as_str()).map_err(|e| format!("{url}: {e}"))?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("cannot connect to Redis at {url}: {e}"))?;
        Ok(Backend::Redis {
            conn,
            prefix: format!("tollgate-lab-{}", std::process::id()),
        })
    }

    fn name(&self) -> &'static str {
        match self {
            Backend::Memory => "memory",
            Backend::Redis { .. } => "Redis",
        }
    }

    /// A fresh store on `clock`, and an empty event log, for one strategy.
    async fn open_run(
        &self,
        strategy: &str,
        clock: ManualClock,
    ) -> Result<(Arc<dyn Store>, Log), String> {
        match self {
            Backend::Memory => Ok((Arc::new(MemoryStore::with_clock(clock)), Log::memory())),
            Backend::Redis { conn, prefix } => {
                let store = RedisStore::from_connection(conn.clone())
                    .prefix(prefix.clone())
                    .clock(clock)
                    .build()
                    .map_err(|e| e.to_string())?;
                let stream = format!("{prefix}:lab:{strategy}:events");
                let log = Log::redis(conn.clone(), stream)
                    .await
                    .map_err(|e| e.to_string())?;
                Ok((Arc::new(store), log))
            }
        }
    }
}

async fn run() -> Result<(), String> {
    let config = Config::from_env()?;
    let backend = Backend::open(&config).await?;
    let arrivals = config.crowd.arrivals();
    // A fixed start, a whole hour since the epoch: strategies that align
    // their windows to the clock (the sliding-window counter) then see the
    // same phase on every run, so a seed reproduces a run exactly. Redis
    // expiries are relative to the simulated now, so any start works.
    let start = START_MICROS;
    std::fs::create_dir_all(&config.out)
        .map_err(|e| format!("cannot create {}: {e}", config.out.display()))?;

    let mut results: Vec<(String, Summary)> = Vec::new();
    for policy in lineup::lineup(config.quota()) {
        let clock = ManualClock::new(start);
        let (store, mut log) = backend.open_run(policy.name(), clock.clone()).await?;
        simulate(
            &config, &policy, &*store, &clock, start, &arrivals, &mut log,
        )
        .await
        .map_err(|e| format!("{}: {e}", policy.name()))?;
        let events = log
            .read_all()
            .await
            .map_err(|e| format!("reading the events back: {e}"))?;
        let summary = stats::summarize(
            &events,
            config.crowd.callers,
            config.crowd.bursty,
            config.secs(),
            config.window.as_micros() as u64,
        );
        let path = config.out.join(format!("{}.svg", policy.name()));
        chart::draw(
            &path,
            &format!(
                "{}: {} callers, {} store",
                policy.name(),
                config.crowd.callers,
                backend.name()
            ),
            &[
                chart::Line {
                    label: "admitted".into(),
                    per_sec: &summary.admitted_per_sec,
                    color: chart::color(0),
                },
                chart::Line {
                    label: "rejected".into(),
                    per_sec: &summary.rejected_per_sec,
                    color: chart::color(7),
                },
            ],
            config.limit_per_sec(),
        )?;
        results.push((policy.name().to_owned(), summary));
    }

    let lines: Vec<chart::Line<'_>> = results
        .iter()
        .enumerate()
        .map(|(i, (name, s))| chart::Line {
            label: name.clone(),
            per_sec: &s.admitted_per_sec,
            color: chart::color(i),
        })
        .collect();
    chart::draw(
        &config.out.join("overlay.svg"),
        &format!(
            "admitted per second, {} callers, {} per {:?}",
            config.crowd.callers, config.limit, config.window
        ),
        &lines,
        config.limit_per_sec(),
    )?;

    let table = report(&config, backend.name(), arrivals.len(), &results);
    print!("{table}");
    let summary = config.out.join("summary.md");
    std::fs::write(&summary, &table).map_err(|e| format!("{}: {e}", summary.display()))?;
    println!(
        "\ncharts: {}/{{overlay,<strategy>}}.svg",
        config.out.display()
    );
    Ok(())
}

/// Runs the crowd against one strategy, recording every decision in `log`.
///
/// A leaky bucket's admitted request is recorded when it leaves the bucket
/// (arrival plus its wait); a concurrency slot is given back `config.hold`
/// after admission, in time order with the arrivals.
async fn simulate(
    config: &Config,
    policy: &Policy,
    store: &dyn Store,
    clock: &ManualClock,
    start: u64,
    arrivals: &[crowd::Arrival],
    log: &mut Log,
) -> Result<(), String> {
    let resource = Key::new("tigerfeeding");
    let holds = matches!(policy.strategy(), Strategy::Concurrency);
    let hold = config.hold.as_micros() as u64;
    let mut releases: BinaryHeap<Reverse<(u64, usize)>> = BinaryHeap::new();
    let mut held: Vec<Receipt> = Vec::new();
    for arrival in arrivals {
        while let Some(&Reverse((at, i))) = releases.peek() {
            if at > arrival.at {
                break;
            }
            releases.pop();
            clock.set(start + at);
            store
                .refund(policy, &resource, &held[i])
                .await
                .map_err(|e| format!("releasing a slot: {e}"))?;
        }
        clock.set(start + arrival.at);
        let decision = store
            .check(policy, &resource, 1)
            .await
            .map_err(|e| e.to_string())?;
        let wait = decision.delay.map_or(0, |d| d.as_micros() as u64);
        if decision.allowed && holds {
            releases.push(Reverse((arrival.at + hold, held.len())));
            held.push(decision.receipt.clone());
        }
        log.record(Event {
            at: arrival.at + wait,
            caller: arrival.caller,
            admitted: decision.allowed,
        })
        .await
        .map_err(|e| format!("recording an event: {e}"))?;
    }
    Ok(())
}

/// The summary table, in Markdown.
fn report(config: &Config, store: &str, requests: usize, results: &[(String, Summary)]) -> String {
    let c = &config.crowd;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Crowd: {} callers ({} bursty, {} per burst; {} steady), each offering {:.2} requests/s on average, \
         {} requests in {} simulated seconds, against {} per {:?} on the {store} store (seed {}).\n",
        c.callers,
        c.bursty,
        c.burst,
        c.callers - c.bursty,
        c.rate,
        requests,
        config.secs(),
        config.limit,
        config.window,
        c.seed,
    );
    let _ = writeln!(
        out,
        "| strategy | admitted | rejected | max in any {:?} (limit {}) | fairness (Jain) | callers served | admitted per steady / bursty caller |",
        config.window, config.limit
    );
    let _ = writeln!(out, "|---|---:|---:|---:|---:|---:|---:|");
    for (name, s) in results {
        let _ = writeln!(
            out,
            "| {name} | {} | {} | {}{} | {:.3} | {}/{} | {:.1} / {:.1} |",
            s.admitted,
            s.rejected,
            s.max_in_window,
            if s.max_in_window > u64::from(config.limit) {
                " (over)"
            } else {
                ""
            },
            s.jain,
            s.served,
            c.callers,
            s.steady_mean,
            s.bursty_mean,
        );
    }
    out
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("lab: {e}");
            ExitCode::from(2)
        }
    }
}
