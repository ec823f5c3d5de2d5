//! Decisions of concurrent requests sent together, in one script call.
//!
//! A decision that finds fewer than [`MAX_IN_FLIGHT`] calls on their way to
//! the server sends its own script at once, from its own task, as it would
//! without batching. Past that, decisions queue; when a call comes back, its
//! slot goes to whatever has queued, sent as a single `EVALSHA` of the
//! strategy's batch wrapper (`lua/batch.lua`), which runs every decision
//! exactly as its script would alone, one after the other. Batching thus
//! never makes a request wait for company, only for a free slot, and Redis
//! parses, dispatches, replies and reads `TIME` once per batch rather than
//! once per decision.

use std::sync::{Arc, Mutex, MutexGuard};

use redis::{ErrorKind, RedisError, RedisResult, Value};
use tokio::sync::oneshot;

use super::connection::Connection;
use super::script::{LuaScript, SCRIPTS};

/// Calls on their way to one server before decisions queue: enough that a
/// lone decision rarely waits, few enough that a crowd forms batches.
const MAX_IN_FLIGHT: usize = 4;

/// The most decisions in one call, which bounds how long one script keeps
/// Redis busy (tens of microseconds).
const MAX_BATCH: usize = 64;

/// Sends decisions for one server, alone or in batches.
#[derive(Debug, Clone)]
pub(crate) struct Batcher {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    conn: Connection,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    in_flight: usize,
    queue: Vec<Job>,
}

/// One decision waiting for a slot.
struct Job {
    script: &'static LuaScript,
    keys: Vec<String>,
    args: Vec<String>,
    reply: oneshot::Sender<RedisResult<Value>>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("script", &self.script.name)
            .finish()
    }
}

impl Batcher {
    pub(crate) fn new(conn: Connection) -> Self {
        Self {
            shared: Arc::new(Shared {
                conn,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// Runs the charging `script` with `keys` and `args`, alone or in a batch.
    pub(crate) async fn eval(
        &self,
        script: &'static LuaScript,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> RedisResult<Value> {
        let route = {
            let mut state = self.shared.lock();
            if state.in_flight < MAX_IN_FLIGHT {
                state.in_flight += 1;
                Route::Alone(keys, args)
            } else {
                let (reply, answer) = oneshot::channel();
                state.queue.push(Job {
                    script,
                    keys,
                    args,
                    reply,
                });
                Route::Queued(answer)
            }
        };
        match route {
            Route::Alone(keys, args) => {
                // Hands the slot on when this call ends, or is cancelled.
                let _slot = Slot(self.shared.clone());
                self.shared.conn.eval(script, &keys, &args, false).await
            }
            Route::Queued(answer) => answer.await.unwrap_or_else(|_| {
                Err(RedisError::from((
                    ErrorKind::Io,
                    "the batch was dropped before Redis answered",
                )))
            }),
        }
    }
}

/// Where one decision goes: out at once, or into the queue.
enum Route {
    Alone(Vec<String>, Vec<String>),
    Queued(oneshot::Receiver<RedisResult<Value>>),
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The next batch for a slot that just came free, or `None` (and the
    /// slot released) when nothing waits.
    fn next_batch(&self) -> Option<Vec<Job>> {
        let mut state = self.lock();
        // A decision whose request has given up (the layer's deadline) is
        // not charged.
        state.queue.retain(|job| !job.reply.is_closed());
        if state.queue.is_empty() {
            state.in_flight -= 1;
            return None;
        }
        let n = state.queue.len().min(MAX_BATCH);
        Some(state.queue.drain(..n).collect())
    }
}

/// A call's slot: when the call ends, what queued meanwhile goes out in it.
struct Slot(Arc<Shared>);

impl Drop for Slot {
    fn drop(&mut self) {
        let Some(batch) = self.0.next_batch() else {
            return;
        };
        let shared = self.0.clone();
        let flush = async move {
            let mut batch = batch;
            loop {
                send(&shared.conn, batch).await;
                match shared.next_batch() {
                    Some(next) => batch = next,
                    None => return,
                }
            }
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(flush);
            }
            // No runtime to send from: the waiting decisions fail (their
            // senders drop with the future) and the slot is freed.
            Err(_) => {
                drop(flush);
                self.0.lock().in_flight -= 1;
            }
        }
    }
}

/// Sends one batch, a call per script (usually one), and hands out replies.
async fn send(conn: &Connection, mut jobs: Vec<Job>) {
    while !jobs.is_empty() {
        let script = jobs[0].script;
        let (same, rest): (Vec<Job>, Vec<Job>) = jobs
            .into_iter()
            .partition(|j| std::ptr::eq(j.script, script));
        jobs = rest;
        send_one_script(conn, script, same).await;
    }
}

async fn send_one_script(conn: &Connection, script: &'static LuaScript, mut jobs: Vec<Job>) {
    let batch = SCRIPTS.batch_of(script);
    let Some(batch) = batch.filter(|_| jobs.len() > 1) else {
        for job in jobs {
            let reply = conn.eval(job.script, &job.keys, &job.args, false).await;
            let _ = job.reply.send(reply);
        }
        return;
    };
    let mut keys = Vec::with_capacity(jobs.iter().map(|j| j.keys.len()).sum());
    let mut args = Vec::with_capacity(1 + jobs.iter().map(|j| 2 + j.args.len()).sum::<usize>());
    args.push(jobs.len().to_string());
    for job in &mut jobs {
        args.push(job.keys.len().to_string());
        args.push(job.args.len().to_string());
        keys.append(&mut job.keys);
        args.append(&mut job.args);
    }
    match conn.eval(batch, &keys, &args, false).await {
        Ok(Value::Array(replies)) if replies.len() == jobs.len() => {
            for (job, reply) in jobs.into_iter().zip(replies) {
                let _ = job.reply.send(failed(reply));
            }
        }
        Ok(other) => {
            let err = RedisError::from((
                ErrorKind::Parse,
                "malformed batch reply",
                format!("{other:?}"),
            ));
            for job in jobs {
                let _ = job.reply.send(Err(err.clone()));
            }
        }
        Err(err) => {
            for job in jobs {
                let _ = job.reply.send(Err(err.clone()));
            }
        }
    }
}

/// A decision's reply, or the error `lua/batch.lua` caught for it
/// (`{'err', message}`; a message starts with its code, e.g. `WRONGTYPE`).
fn failed(reply: Value) -> RedisResult<Value> {
    if let Value::Array(items) = &reply {
        if let [Value::BulkString(tag), Value::BulkString(message)] = items.as_slice() {
            if tag.as_slice() == b"err" {
                let message = String::from_utf8_lossy(message);
                let (code, detail) = message.split_once(' ').unwrap_or((&message, ""));
                return Err(redis::make_extension_error(
                    code.to_owned(),
                    Some(detail.to_owned()),
                ));
            }
        }
    }
    Ok(reply)
}
