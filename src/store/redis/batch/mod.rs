//! Decisions of concurrent requests sent together, in one script call.
//!
//! A decision that finds fewer than [`MAX_IN_FLIGHT`] calls on their way to
//! the server (on Redis Cluster, [`MAX_IN_FLIGHT_PER_KEYS`] for its keys)
//! sends its own script at once, from its own task, as it would
//! without batching. Past that, decisions queue; when a call comes back, its
//! slot goes to whatever has queued, sent as a single `EVALSHA` of the
//! strategy's batch wrapper (`lua/batch.lua`), which runs every decision
//! exactly as its script would alone, one after the other. Batching thus
//! never makes a request wait for company, only for a free slot, and Redis
//! parses, dispatches, replies and reads `TIME` once per batch rather than
//! once per decision.
//!
//! A concurrency check's pass holds a slot until it is given back, so it
//! must not be lost with a request that gives up while the check is on its
//! way: sent alone, the check goes from a task of its own, and in a batch
//! the batch's task sees to it; either gives back a pass that no one hears.
//!
//! Here, the queue: slots and who gets them, and what goes out together.
//! [`wire`] encodes a batch for `lua/batch.lua` and hands out its replies;
//! [`held`] keeps the concurrency limit's passes from being lost.

use std::num::NonZeroUsize;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::oneshot;

use super::connection::Connection;
use super::reply::{lone_answer, Ints};
use super::script::Args;
use super::script::{LuaScript, SCRIPTS};
use crate::error::StoreError;
use crate::store::keys::KeyList;

mod held;
mod wire;

pub(crate) use held::eval_holding;
use held::{spawn_holding, Answered, Held};
use wire::{deliver, send_one_script};

/// Calls on their way to one server before decisions queue, by default:
/// enough that a lone decision rarely waits, few enough that a crowd forms
/// batches. [`RedisStoreBuilder::calls_in_flight`](super::RedisStoreBuilder::calls_in_flight)
/// sets another.
pub(crate) const MAX_IN_FLIGHT: NonZeroUsize = NonZeroUsize::new(4).unwrap();

/// Calls on their way for one set of keys on Redis Cluster (one caller, in
/// practice) before its decisions queue. Redis runs one caller's decisions
/// one after the other anyway, so one call at a time loses nothing and
/// batches most (`topology_bench` compares 1, 4 and no batching).
const MAX_IN_FLIGHT_PER_KEYS: usize = 1;

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
    /// Redis Cluster: a call holds decisions on one set of keys. Keys that
    /// share a slot may sit on two nodes while the slot migrates, and a
    /// call with keys on both is refused (`TRYAGAIN`) until the whole slot
    /// has moved; a call on one decision's keys is refused only while those
    /// keys are split, as the decision alone would be.
    one_key_set_per_call: bool,
    /// Calls on their way before decisions queue.
    max_in_flight: usize,
}

#[derive(Debug, Default)]
struct State {
    in_flight: usize,
    queue: Vec<Job>,
}

/// One decision waiting for a slot.
struct Job {
    script: &'static LuaScript,
    keys: KeyList,
    args: Args,
    reply: oneshot::Sender<Answer>,
    /// A give-back (a concurrency slot's release): sent even when its caller
    /// stopped waiting, for dropped it would hold the slot until the store's
    /// timeout, and ahead of the charges queued beside it, since it only
    /// frees room.
    gives_back: bool,
    /// A charge's `until` (lua/timed.lua), 0 for none: kept apart from
    /// `args`, so a flood's decisions still repeat the one before.
    until: i64,
}

/// A decision script's integers, or why there are none.
type Answer = Result<Ints, StoreError>;

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("script", &self.script.name)
            .finish()
    }
}

impl Batcher {
    /// A batcher for one server, with at most `max_in_flight` calls on
    /// their way before decisions queue: its calls mix any callers'
    /// decisions.
    pub(crate) fn new(conn: Connection, max_in_flight: NonZeroUsize) -> Self {
        Self::with(conn, max_in_flight.get(), false)
    }

    /// A batcher for one set of keys on Redis Cluster (see
    /// [`Shared::one_key_set_per_call`]).
    pub(crate) fn for_key_sets(conn: Connection) -> Self {
        Self::with(conn, MAX_IN_FLIGHT_PER_KEYS, true)
    }

    fn with(conn: Connection, max_in_flight: usize, one_key_set_per_call: bool) -> Self {
        Self {
            shared: Arc::new(Shared {
                conn,
                state: Mutex::new(State::default()),
                one_key_set_per_call,
                max_in_flight,
            }),
        }
    }

    /// Runs the charging `script` with `keys` and `args`, alone or in a
    /// batch: the integers it returns. Dropped while queued (its request gave
    /// up), the charge is never sent; reaching Redis after `until` (store
    /// time, µs; 0 for none), it charges nothing (lua/timed.lua).
    pub(crate) fn eval(
        &self,
        script: &'static LuaScript,
        keys: KeyList,
        args: Args,
        until: i64,
    ) -> impl std::future::Future<Output = Answer> + Send + '_ {
        self.run(script, keys, args, false, until)
    }

    /// Runs a give-back `script` (a concurrency slot's release) as
    /// [`eval`](Self::eval) runs a charge, except that once queued it is
    /// sent even if this call is dropped, and before the charges queued with
    /// it.
    pub(crate) fn give_back(
        &self,
        script: &'static LuaScript,
        keys: KeyList,
        args: Args,
    ) -> impl std::future::Future<Output = Answer> + Send + '_ {
        self.run(script, keys, args, true, 0)
    }

    /// Whether every slot is taken, so that a call would queue (a hint: it
    /// may change before the call is made).
    pub(crate) fn is_busy(&self) -> bool {
        self.shared.lock().in_flight >= self.shared.max_in_flight
    }

    /// Queues a give-back `script` if every slot is taken, and answers
    /// whether it did: queued, it goes out in its turn, ahead of the charges
    /// in the batch it joins, whatever becomes of the caller, which need not
    /// wait (a failure is logged when the batch comes back; with Redis hung,
    /// it waits in the queue like every call). With a slot free nothing is
    /// queued, and the caller sends it with [`give_back`](Self::give_back).
    pub(crate) fn queue_give_back(
        &self,
        script: &'static LuaScript,
        keys: KeyList,
        args: Args,
    ) -> bool {
        let mut state = self.shared.lock();
        if state.in_flight < self.shared.max_in_flight {
            return false;
        }
        // No one listens for the answer: `deliver` logs a failure.
        drop(state.enqueue(script, keys, args, true, 0));
        true
    }

    /// Takes a slot or a place in the queue now, when called, and returns
    /// the wait for the answer: a future that holds only what its route
    /// needs (an `async fn` would also keep its arguments), so a pending
    /// decision stays small. Dropped unpolled, its slot is handed on, and
    /// a queued charge is never sent (a give-back still is). A concurrency
    /// check that gets a slot is sent at once, from a task of its own, and
    /// a pass of it that no one reads is given back.
    fn run(
        &self,
        script: &'static LuaScript,
        keys: KeyList,
        mut args: Args,
        gives_back: bool,
        until: i64,
    ) -> impl std::future::Future<Output = Answer> + Send + '_ {
        // A pass that holds a slot must outlive its caller: what gives it
        // back if the caller goes before reading it.
        let mut held = SCRIPTS.give_back_of(script, &args).map(|_| {
            Box::new(Held {
                conn: self.shared.conn.clone(),
                script,
                keys: keys.clone(),
                args: args.clone(),
            })
        });
        let route = {
            let mut state = self.shared.lock();
            if state.in_flight < self.shared.max_in_flight {
                state.in_flight += 1;
                if !gives_back {
                    super::args::with_until(&mut args, until);
                }
                // Hands the slot on when the call ends, or is cancelled.
                Route::Alone(keys, args, Slot(self.shared.clone()))
            } else {
                let answer = state.enqueue(script, keys, args, gives_back, until);
                Route::Queued(Answered {
                    answer,
                    held: held.take(),
                })
            }
        };
        // Sent alone, such a pass goes from a task of its own; queued, the
        // batch's task sees to it. Either way, one the caller never reads
        // is given back.
        let route = match (route, held) {
            (Route::Alone(keys, args, slot), Some(held)) => {
                match tokio::runtime::Handle::try_current() {
                    Ok(runtime) => {
                        let conn = self.shared.conn.clone();
                        let slot = Some(slot);
                        let answer = spawn_holding(&runtime, conn, script, keys, args, slot);
                        Route::Queued(Answered {
                            answer,
                            held: Some(held),
                        })
                    }
                    Err(_) => Route::Alone(keys, args, slot),
                }
            }
            (route, _) => route,
        };
        async move {
            match route {
                Route::Alone(keys, args, _slot) => {
                    // Boxed: the call's future is most of this one's size,
                    // and a decision that queues (most, under load) would
                    // carry it for nothing.
                    let call = Box::pin(self.shared.conn.eval(script, &keys, &args, false));
                    lone_answer(script, call.await)
                }
                Route::Queued(answered) => answered.await,
            }
        }
    }
}

impl State {
    /// Queues a call for the next free slot: where its answer will come.
    fn enqueue(
        &mut self,
        script: &'static LuaScript,
        keys: KeyList,
        args: Args,
        gives_back: bool,
        until: i64,
    ) -> oneshot::Receiver<Answer> {
        let (reply, answer) = oneshot::channel();
        self.queue.push(Job {
            script,
            keys,
            args,
            reply,
            gives_back,
            until,
        });
        answer
    }
}

/// Where one decision goes: out at once, or into the queue (or out from a
/// task of its own: see [`spawn_holding`]).
enum Route {
    Alone(KeyList, Args, Slot),
    Queued(Answered),
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
        // not charged; a give-back always goes out.
        state
            .queue
            .retain(|job| job.gives_back || !job.reply.is_closed());
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
        let sending = Sending {
            shared: self.0.clone(),
            freed: false,
        };
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            // No runtime to send from: the batch fails (a give-back that no
            // one waits for is logged), and `sending` frees the slot.
            fail(batch, "no Tokio runtime to send the batch from");
            return;
        };
        runtime.spawn(async move {
            let mut batch = batch;
            loop {
                send(&sending.shared, batch).await;
                match sending.shared.next_batch() {
                    Some(next) => batch = next,
                    None => return sending.freed(),
                }
            }
        });
    }
}

/// The slot a batch's task holds. Should the task end with it still held
/// (its runtime shut down while the call was on its way, or there was no
/// runtime to send from), the slot is freed, and what queued fails if no
/// other call is left to take it: counted in flight for good, the slot
/// would hold back its server's calls, and on a cluster, with one call at a
/// time, every later decision on its keys.
struct Sending {
    shared: Arc<Shared>,
    freed: bool,
}

impl Sending {
    /// The task ended as it should: `next_batch` found nothing and freed
    /// the slot.
    fn freed(mut self) {
        self.freed = true;
    }
}

impl Drop for Sending {
    fn drop(&mut self) {
        if self.freed {
            return;
        }
        let orphans = {
            let mut state = self.shared.lock();
            state.in_flight -= 1;
            match state.in_flight {
                0 => std::mem::take(&mut state.queue),
                _ => Vec::new(),
            }
        };
        fail(orphans, "the batch's task ended before sending it");
    }
}

/// Tells each of `jobs` that it was never sent, and why.
fn fail(jobs: Vec<Job>, why: &'static str) {
    for job in jobs {
        // An error holds nothing: there is nothing to give back.
        drop(deliver(job, Err(unsent(why))));
    }
}

/// A call that never reached Redis, and why.
fn unsent(why: &'static str) -> StoreError {
    StoreError::from(redis::RedisError::from((redis::ErrorKind::Io, why)))
}

/// Sends one batch, a call per batch script (usually one), give-backs
/// first, and hands out replies.
async fn send(shared: &Shared, mut jobs: Vec<Job>) {
    // Give-backs only free room: they go ahead of the charges queued beside
    // them, each side in the order it queued.
    if jobs.windows(2).any(|w| !w[0].gives_back && w[1].gives_back) {
        jobs.sort_by_key(|j| !j.gives_back);
    }
    while !jobs.is_empty() {
        let script = jobs[0].script;
        let keys = (shared.one_key_set_per_call).then(|| jobs[0].keys.clone());
        let together = |j: &Job| {
            batch_together(j.script, script) && keys.as_ref().is_none_or(|keys| j.keys == *keys)
        };
        // Most batches hold one script (and set of keys): sent as they are.
        if jobs.iter().all(together) {
            let unheard = send_one_script(&shared.conn, script, jobs).await;
            return shared.give_back_later(unheard);
        }
        let (same, rest): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(together);
        jobs = rest;
        let unheard = send_one_script(&shared.conn, script, same).await;
        shared.give_back_later(unheard);
    }
}

/// Whether calls of scripts `a` and `b` go out in one batch call: those of
/// one script, and a concurrency limit's checks and releases, which share
/// `lua/concurrency_batch.lua`.
fn batch_together(a: &LuaScript, b: &LuaScript) -> bool {
    std::ptr::eq(a, b)
        || a.batch()
            .zip(b.batch())
            .is_some_and(|(a, b)| a.name == b.name)
}
#[cfg(all(test, feature = "deadpool"))]
mod tests {
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    use super::*;
    use crate::store::redis::connection::pool::PooledConnection;

    /// A batcher whose connection is never reached: a pool of a port
    /// nothing listens on, which connects only when a call is sent.
    fn unreachable_batcher() -> Batcher {
        let pool = deadpool_redis::Config::from_url("redis://127.0.0.1:1")
            .create_pool(Some(deadpool_redis::Runtime::Tokio1))
            .unwrap();
        let conn = Connection::Pool(Arc::new(PooledConnection::new(pool)));
        Batcher::new(conn, MAX_IN_FLIGHT)
    }

    #[test]
    fn a_batch_freed_with_no_runtime_fails_its_calls_and_frees_its_slot() {
        let batcher = unreachable_batcher();
        let script = crate::strategy::concurrency::release_script();
        let call = || batcher.eval(script, KeyList::new(), Args::new(), 0);
        // Every slot taken by a call made (not yet sent), then one queued.
        let mut alone: Vec<_> = (0..MAX_IN_FLIGHT.get()).map(|_| Box::pin(call())).collect();
        assert!(batcher.is_busy());
        let mut queued = pin!(call());
        assert!(batcher.queue_give_back(script, KeyList::new(), Args::new()));

        // A slot freed outside any runtime: the batch it would send fails.
        drop(alone.pop());
        let mut cx = Context::from_waker(Waker::noop());
        match queued.as_mut().poll(&mut cx) {
            Poll::Ready(Err(err)) => assert!(err.to_string().contains("no Tokio runtime"), "{err}"),
            other => panic!("the queued call should have failed: {other:?}"),
        }
        assert!(batcher.shared.lock().queue.is_empty());
        assert!(!batcher.is_busy(), "the slot is free again");
        assert_eq!(batcher.shared.lock().in_flight, MAX_IN_FLIGHT.get() - 1);
    }
}
