//! Decisions of concurrent requests sent together, in one script call.
//!
//! Each decision is queued; one task takes whatever has queued since it last
//! looked and sends it as a single `EVALSHA` of the strategy's batch wrapper
//! (`lua/batch.lua`), which runs every decision exactly as its script would
//! alone, one after the other. A decision that finds the queue empty goes out
//! at once, as its own script: batching never waits for company, it only
//! stops concurrent decisions from each paying for a command of their own.
//! Redis then parses, looks up and replies once per batch, and reads `TIME`
//! once, which is most of what a decision costs it.

use std::sync::Mutex;

use redis::{ErrorKind, RedisError, RedisResult, Value};
use tokio::sync::{mpsc, oneshot};

use super::connection::Connection;
use super::script::{LuaScript, SCRIPTS};

/// The most decisions in one call, which bounds how long one script keeps
/// Redis busy (tens of microseconds).
const MAX_BATCH: usize = 64;

/// Queues decisions for one server and sends them in batches.
#[derive(Debug)]
pub(crate) struct Batcher {
    conn: Connection,
    /// Feeds the task that sends; made on first use, and again if that
    /// task's runtime has gone.
    queue: Mutex<Option<mpsc::UnboundedSender<Job>>>,
}

/// One decision waiting to be sent.
struct Job {
    script: &'static LuaScript,
    keys: Vec<String>,
    args: Vec<String>,
    reply: oneshot::Sender<RedisResult<Value>>,
}

impl Batcher {
    pub(crate) fn new(conn: Connection) -> Self {
        Self {
            conn,
            queue: Mutex::new(None),
        }
    }

    /// Runs the charging `script` with `keys` and `args`, alone or in a batch.
    pub(crate) async fn eval(
        &self,
        script: &'static LuaScript,
        keys: Vec<String>,
        args: Vec<String>,
    ) -> RedisResult<Value> {
        let (reply, answer) = oneshot::channel();
        self.enqueue(Job {
            script,
            keys,
            args,
            reply,
        });
        answer.await.unwrap_or_else(|_| {
            Err(RedisError::from((
                ErrorKind::Io,
                "the batch was dropped before Redis answered",
            )))
        })
    }

    fn enqueue(&self, job: Job) {
        let mut queue = self.queue.lock().unwrap_or_else(|p| p.into_inner());
        let job = match queue.as_ref() {
            Some(q) => match q.send(job) {
                Ok(()) => return,
                Err(mpsc::error::SendError(job)) => job,
            },
            None => job,
        };
        // First use, or the sending task's runtime shut down.
        let (sender, receiver) = mpsc::unbounded_channel();
        tokio::spawn(drive(self.conn.clone(), receiver));
        let _ = sender.send(job);
        *queue = Some(sender);
    }
}

/// Takes what has queued and sends it, until the store is dropped.
async fn drive(conn: Connection, mut queue: mpsc::UnboundedReceiver<Job>) {
    let mut jobs = Vec::with_capacity(MAX_BATCH);
    while queue.recv_many(&mut jobs, MAX_BATCH).await > 0 {
        let batch = std::mem::replace(&mut jobs, Vec::with_capacity(MAX_BATCH));
        tokio::spawn(send(conn.clone(), batch));
    }
}

/// Sends one batch, a call per script (usually one), and hands out replies.
async fn send(conn: Connection, mut jobs: Vec<Job>) {
    while !jobs.is_empty() {
        let script = jobs[0].script;
        let (same, rest): (Vec<Job>, Vec<Job>) = jobs
            .into_iter()
            .partition(|j| std::ptr::eq(j.script, script));
        jobs = rest;
        if jobs.is_empty() {
            send_one_script(&conn, script, same).await;
        } else {
            tokio::spawn({
                let conn = conn.clone();
                async move { send_one_script(&conn, script, same).await }
            });
        }
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
