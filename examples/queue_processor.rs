//! A keeper beside the zoo: drains the zoo's `/queue/tigerfeeding` work queue.
//!
//! ```text
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --example zoo --all-features
//! REDIS_URL=redis://127.0.0.1:6379/ cargo run --all-features --example queue_processor
//! curl -X POST -d 'two buckets of meat' http://127.0.0.1:3000/queue/tigerfeeding
//! ```
//!
//! Environment: `REDIS_URL` (required), `ZOO_QUEUE_RATE` (entries per second,
//! default 1), `ZOO_QUEUE_KIND` (`stream`, the default, or `list`, as the zoo
//! was started with), `KEEPER` (this worker's consumer name, default
//! `keeper-<pid>`; run several with different names), `KEEPER_MIN_IDLE_SECS`
//! (reclaim entries a crashed keeper left for this long, default 30).
//!
//! With a stream, entries are read through the consumer group `keepers`,
//! acknowledged and deleted when fed; stop a keeper mid-batch (Ctrl-C) and
//! another reclaims what it had read. With a list, popped entries are simply
//! taken: the gate without the bookkeeping.

use std::num::NonZeroU32;
use std::process::ExitCode;
use std::time::Duration;

use tollgate::queue::{ListQueue, QueueSpec, StreamProcessor};
use tollgate::Quota;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> Result<T, String> {
    match std::env::var(name) {
        Ok(v) if !v.trim().is_empty() => v
            .trim()
            .parse()
            .map_err(|_| format!("{name}={v:?} is not valid")),
        _ => Ok(default),
    }
}

async fn run() -> Result<(), String> {
    let url = std::env::var("REDIS_URL")
        .map_err(|_| "set REDIS_URL to the Redis the zoo uses".to_owned())?;
    let rate: u32 = env_or("ZOO_QUEUE_RATE", 1)?;
    let rate = Quota::per_second(NonZeroU32::new(rate).ok_or("ZOO_QUEUE_RATE must be at least 1")?);
    let kind: String = env_or("ZOO_QUEUE_KIND", "stream".to_owned())?;
    let keeper: String = env_or("KEEPER", format!("keeper-{}", std::process::id()))?;
    let min_idle = Duration::from_secs(env_or("KEEPER_MIN_IDLE_SECS", 30)?);
    // The capacity is the zoo's business; the key depends on the name only.
    let spec = QueueSpec::new("tigerfeeding.queue", NonZeroU32::MIN).map_err(|e| e.to_string())?;
    let client = redis::Client::open(url.as_str()).map_err(|e| e.to_string())?;
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };

    match kind.as_str() {
        "stream" => {
            let mut processor = StreamProcessor::builder(&spec, "keepers", &keeper)
                .map_err(|e| e.to_string())?
                .rate(rate)
                .min_idle(min_idle)
                .connect(&client)
                .await
                .map_err(|e| format!("cannot reach Redis at {url}: {e}"))?;
            println!(
                "{keeper} draining stream {} at {} per second",
                spec.stream_key(),
                rate.limit()
            );
            let fed = processor
                .run(
                    |entry| {
                        let keeper = keeper.clone();
                        async move {
                            println!(
                                "{keeper}: fed {} for {}: {:?}",
                                entry.id,
                                entry.job.get_str("key").unwrap_or("?"),
                                entry.job.get_str("body").unwrap_or("<binary>"),
                            );
                            Ok::<(), std::convert::Infallible>(())
                        }
                    },
                    shutdown,
                )
                .await
                .map_err(|e| e.to_string())?;
            println!("{keeper}: {fed} feedings done");
        }
        "list" => {
            let conn = client
                .get_connection_manager()
                .await
                .map_err(|e| format!("cannot reach Redis at {url}: {e}"))?;
            let queue = ListQueue::new(conn, spec.clone());
            println!(
                "{keeper} draining list {} at {} per second",
                spec.list_key(),
                rate.limit()
            );
            let mut tick = tokio::time::interval(rate.window() / rate.limit());
            tokio::pin!(shutdown);
            loop {
                tokio::select! {
                    () = &mut shutdown => break,
                    _ = tick.tick() => {}
                }
                match queue.pop(1).await {
                    Ok(entries) => {
                        for entry in entries {
                            println!(
                                "{keeper}: fed {} for {}",
                                entry.id,
                                entry.job.get_str("key").unwrap_or("?")
                            );
                        }
                    }
                    Err(e) => eprintln!("{keeper}: {e}"),
                }
            }
        }
        other => return Err(format!("ZOO_QUEUE_KIND={other:?} must be stream or list")),
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| "info,tollgate=info".into()),
        )
        .init();
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("queue_processor: {e}");
            ExitCode::from(2)
        }
    }
}
