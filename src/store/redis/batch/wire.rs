//! A batch on the wire: its decisions encoded as `lua/batch.lua`'s KEYS and
//! ARGV, each repeating what it can of the one before (`=` all, `#` all but
//! the request id, `-1` the keys or the arguments), and the batch's reply
//! split and handed to each decision.

use redis::{ToRedisArgs, Value};

use super::held::{unheard_pass, Unheard};
use super::{Answer, Job};
use crate::error::StoreError;
use crate::store::redis::args;
use crate::store::redis::connection::Connection;
use crate::store::redis::reply::{self, lone_answer};
use crate::store::redis::script::{LuaScript, SCRIPTS};

/// Sends `jobs`, calls of `script` or of scripts that batch with it, and
/// hands out replies: the passes that hold a slot and came back to no one.
pub(super) async fn send_one_script(
    conn: &Connection,
    script: &'static LuaScript,
    mut jobs: Vec<Job>,
) -> Vec<Unheard> {
    let mut unheard = Vec::new();
    let batch = script.batch();
    let Some(batch) = batch.filter(|_| jobs.len() > 1) else {
        for mut job in jobs {
            if !job.gives_back {
                args::with_until(&mut job.args, job.until);
            }
            let reply = conn.eval(job.script, &job.keys, &job.args, false).await;
            let answer = lone_answer(job.script, reply);
            unheard.extend(deliver(job, answer));
        }
        return unheard;
    };
    // What each decision repeats of the one before (see lua/batch.lua).
    let repeats: Vec<Repeat> = (0..jobs.len())
        .map(|i| match i.checked_sub(1).map(|p| &jobs[p]) {
            Some(p) if p.args == jobs[i].args && p.keys == jobs[i].keys => Repeat::All,
            Some(p) if p.keys == jobs[i].keys && differ_in_id_alone(p, &jobs[i]) => Repeat::Id,
            Some(p) if p.args == jobs[i].args => Repeat::Args,
            Some(p) if p.keys == jobs[i].keys => Repeat::Keys,
            _ => Repeat::Nothing,
        })
        .collect();
    let mut keys = Vec::with_capacity(jobs.len());
    let mut key_counts = Vec::with_capacity(jobs.len());
    // Where each decision's keys start in `keys`, to give a slot back with.
    let mut key_starts = Vec::with_capacity(jobs.len());
    for (job, repeat) in jobs.iter_mut().zip(&repeats) {
        key_counts.push(job.keys.len());
        if matches!(repeat, Repeat::All | Repeat::Id | Repeat::Keys) {
            key_starts.push(key_starts.last().copied().unwrap_or(0));
        } else {
            key_starts.push(keys.len());
            keys.extend(job.keys.drain(..));
        }
    }
    let mut args = Vec::with_capacity(2 + jobs.len() * 6);
    args.push(Part::Count(jobs.len()));
    // The earliest deadline of its charges (see lua/batch.lua): a batch
    // that comes later than its first request waits charges none.
    let until = jobs
        .iter()
        .filter(|j| !j.gives_back && j.until > 0)
        .map(|j| j.until)
        .min()
        .unwrap_or(0);
    args.push(Part::Int(until));
    for ((job, repeat), &nk) in jobs.iter().zip(&repeats).zip(&key_counts) {
        match repeat {
            Repeat::All => args.push(Part::Text("=")),
            Repeat::Id => {
                let at = SCRIPTS.id_at(job.script).unwrap_or(0);
                args.extend([Part::Text("#"), Part::Int(job.args[at])]);
            }
            Repeat::Args => args.extend([Part::Count(nk), Part::Text("-1")]),
            Repeat::Keys => {
                args.extend([Part::Text("-1"), Part::Count(job.args.len())]);
                args.extend(job.args.iter().map(|&a| Part::Int(a)));
            }
            Repeat::Nothing => {
                args.extend([Part::Count(nk), Part::Count(job.args.len())]);
                args.extend(job.args.iter().map(|&a| Part::Int(a)));
            }
        }
    }
    let reply = conn.eval(batch, &keys, &args, false).await;
    let answers = match reply {
        Ok(reply) => answers(reply, jobs.len()),
        Err(err) => Err(Failure::Redis(batch, err)),
    };
    match answers {
        Ok(answers) => {
            for (i, (job, answer)) in jobs.into_iter().zip(answers).enumerate() {
                if let Some(mut pass) = deliver(job, answer) {
                    let start = key_starts[i];
                    pass.keys = keys[start..start + key_counts[i]].iter().cloned().collect();
                    unheard.push(pass);
                }
            }
        }
        Err(failure) => {
            for job in jobs {
                drop(deliver(job, Err(failure.to_store_error())));
            }
        }
    }
    unheard
}

/// Hands a job its answer. A give-back whose caller is not listening (it
/// gave up, or never waited) has its failure logged here, as its caller
/// would have; a pass that holds a slot and that no one hears comes back,
/// to be given back (its keys, if they went into the batch's, left empty).
pub(super) fn deliver(job: Job, answer: Answer) -> Option<Unheard> {
    let Job {
        script,
        keys,
        args,
        reply,
        gives_back,
        ..
    } = job;
    match reply.send(answer) {
        Ok(()) => None,
        Err(Err(err)) => {
            if gives_back {
                tracing::warn!(script = script.name, error = %err,
                    "rate limit release failed; the charge expires in the store instead");
            }
            None
        }
        Err(Ok(ints)) => unheard_pass(script, keys, &args, &ints),
    }
}
/// Why a whole batch failed, told to each of its decisions.
enum Failure {
    /// The batch script's call failed.
    Redis(&'static LuaScript, redis::RedisError),
    Protocol(String),
}

impl Failure {
    fn to_store_error(&self) -> StoreError {
        match self {
            Failure::Redis(batch, err) => batch.error(err.clone()),
            Failure::Protocol(why) => StoreError::protocol(why.clone()),
        }
    }
}

/// What a decision in a batch shares with the one before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Repeat {
    Nothing,
    Args,
    /// All but the request id: a flood of the sliding log or the
    /// concurrency limit (checks or releases), which sends the id alone.
    Id,
    /// The keys only: the app's clock, or another cost.
    Keys,
    All,
}

/// Whether job `b` has the script and arguments of job `a` but for its
/// request id (see [`Scripts::id_at`](crate::store::redis::script::Scripts::id_at)).
fn differ_in_id_alone(a: &Job, b: &Job) -> bool {
    let Some(at) = SCRIPTS.id_at(b.script) else {
        return false;
    };
    std::ptr::eq(a.script, b.script)
        && a.args.len() == b.args.len()
        && at < b.args.len()
        && a.args[..at] == b.args[..at]
        && a.args[at + 1..] == b.args[at + 1..]
}

/// One argument of a batch call.
enum Part {
    Text(&'static str),
    Count(usize),
    Int(i64),
}

impl ToRedisArgs for Part {
    fn write_redis_args<W: ?Sized + redis::RedisWrite>(&self, out: &mut W) {
        match self {
            Part::Text(text) => out.write_arg(text.as_bytes()),
            Part::Count(n) => out.write_arg(itoa::Buffer::new().format(*n).as_bytes()),
            Part::Int(n) => out.write_arg(itoa::Buffer::new().format(*n).as_bytes()),
        }
    }
}

/// Splits `lua/batch.lua`'s reply into each decision's integers or the
/// error it met.
fn answers(reply: Value, n: usize) -> Result<Vec<Answer>, Failure> {
    let Value::BulkString(bytes) = reply else {
        return Err(Failure::Protocol(format!(
            "malformed batch reply {reply:?}"
        )));
    };
    let mut answers = Vec::with_capacity(n);
    let mut rest = &bytes[..];
    while !rest.is_empty() {
        let (answer, after) = reply::batch_entry(rest).map_err(Failure::Protocol)?;
        answers.push(answer);
        rest = after;
    }
    if answers.len() != n {
        return Err(Failure::Protocol(format!(
            "{} replies in a batch of {n}",
            answers.len()
        )));
    }
    Ok(answers)
}
