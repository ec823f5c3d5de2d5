//! The concurrency limit's held passes: a check whose pass holds a slot
//! goes out from a task of its own (or in a batch's), so that a caller that
//! gives up while it is on its way never leaves the slot taken; a pass no
//! one heard of is given back.

use tokio::sync::oneshot;

use super::{unsent, Answer, Shared, Slot};
use crate::error::StoreError;
use crate::store::keys::KeyList;
use crate::store::redis::args;
use crate::store::redis::connection::Connection;
use crate::store::redis::reply::{self, lone_answer};
use crate::store::redis::script::Args;
use crate::store::redis::script::{LuaScript, SCRIPTS};

/// How long a slot-taking call sent from a task of its own may wait for
/// Redis (see [`spawn_holding`]): far beyond any request's deadline, so
/// only a Redis that hangs meets it, and the slot then times out in Redis.
const HOLDING_PATIENCE: std::time::Duration = std::time::Duration::from_secs(10);
/// Where a queued (or spawned) call's answer comes. For a call whose pass
/// holds a slot, dropped before the answer is read (its request gave up
/// just as the answer came), it gives the pass back: the channel is closed
/// first, so a pass that comes later finds no one and the sending side
/// gives it back instead. Each pass is given back once.
pub(super) struct Answered {
    pub(super) answer: oneshot::Receiver<Answer>,
    pub(super) held: Option<Box<Held>>,
}

/// What gives back a slot-taking call's pass: the call, and where to send.
pub(super) struct Held {
    pub(super) conn: Connection,
    pub(super) script: &'static LuaScript,
    pub(super) keys: KeyList,
    pub(super) args: Args,
}

impl std::future::Future for Answered {
    type Output = Answer;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Answer> {
        let got = std::task::ready!(std::pin::Pin::new(&mut self.answer).poll(cx));
        // Read: the caller has it now.
        self.held = None;
        std::task::Poll::Ready(
            got.unwrap_or_else(|_| Err(unsent("the call ended before Redis answered"))),
        )
    }
}

impl Drop for Answered {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else {
            return;
        };
        self.answer.close();
        let Ok(Ok(ints)) = self.answer.try_recv() else {
            return;
        };
        let Held {
            conn,
            script,
            keys,
            args,
        } = *held;
        if let Some(pass) = unheard_pass(script, keys, &args, &ints) {
            give_back_now(conn, pass);
        }
    }
}

/// Sends a give-back from a task (its caller cannot wait: it is gone).
fn give_back_now(conn: Connection, pass: Unheard) {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        return tracing::warn!(
            script = pass.script.name,
            "no Tokio runtime to release a rate limit charge on; it expires in the store instead"
        );
    };
    runtime.spawn(async move { send_give_back(&conn, pass).await });
}

/// Gives back a pass no one heard of, waiting at most
/// [`HOLDING_PATIENCE`] (nobody waits for it; a failure is logged, and the
/// slot then times out in Redis).
async fn send_give_back(conn: &Connection, pass: Unheard) {
    let Unheard { script, keys, args } = pass;
    let sent = tokio::time::timeout(HOLDING_PATIENCE, conn.eval(script, &keys, &args, false));
    let err = match sent.await {
        Ok(Ok(_)) => return,
        Ok(Err(err)) => script.error(err),
        Err(_) => StoreError::timeout(),
    };
    tracing::warn!(script = script.name, error = %err,
        "rate limit release failed; the charge expires in the store instead");
}
/// A pass that holds a slot, which no one heard of: what gives it back.
pub(super) struct Unheard {
    script: &'static LuaScript,
    pub(super) keys: KeyList,
    args: Args,
}

/// What gives back the slots `script` took with `args`, if they are slots
/// and its reply `ints` says it took them.
pub(super) fn unheard_pass(
    script: &LuaScript,
    keys: KeyList,
    args: &[i64],
    ints: &[i64],
) -> Option<Unheard> {
    let (script, args) = SCRIPTS.give_back_of(script, args)?;
    let took = reply::passed(ints) && args::cost_of(&args) > 0;
    took.then_some(Unheard { script, keys, args })
}

impl Shared {
    /// Queues the give-backs of passes no one heard of, for the next batch,
    /// which the caller's task sends: after the call that took the slots.
    pub(super) fn give_back_later(&self, unheard: Vec<Unheard>) {
        if unheard.is_empty() {
            return;
        }
        let mut state = self.lock();
        for Unheard { script, keys, args } in unheard {
            tracing::debug!(
                script = script.name,
                "a request gave up on a slot it took; giving it back"
            );
            drop(state.enqueue(script, keys, args, true, 0));
        }
    }
}

/// Sends a call whose pass holds a slot (a concurrency check) from a task of
/// its own, which keeps `slot` (if any) until the answer is in: its caller
/// may give up (a request cancelled while the check is on its way) without
/// losing the pass, which the task then gives back on `conn`, after it.
pub(super) fn spawn_holding(
    runtime: &tokio::runtime::Handle,
    conn: Connection,
    script: &'static LuaScript,
    keys: KeyList,
    args: Args,
    slot: Option<Slot>,
) -> oneshot::Receiver<Answer> {
    let (reply, answer) = oneshot::channel();
    runtime.spawn(async move {
        // Bounded, so that a Redis that hangs cannot pile up tasks (without
        // a batcher, one per request) past what this many seconds bring.
        let got =
            match tokio::time::timeout(HOLDING_PATIENCE, conn.eval(script, &keys, &args, false))
                .await
            {
                Ok(got) => lone_answer(script, got),
                Err(_) => Err(StoreError::timeout()),
            };
        let Err(Ok(ints)) = reply.send(got) else {
            return drop(slot);
        };
        if let Some(pass) = unheard_pass(script, keys, &args, &ints) {
            send_give_back(&conn, pass).await;
        }
        drop(slot);
    });
    answer
}

/// Runs a call whose pass holds a slot without a batcher (batching off) as
/// [`spawn_holding`] does: a caller that gives up never
/// leaves the slot taken.
pub(crate) async fn eval_holding(
    conn: &Connection,
    script: &'static LuaScript,
    keys: KeyList,
    args: Args,
) -> Answer {
    let Ok(runtime) = tokio::runtime::Handle::try_current() else {
        let reply = conn.eval(script, &keys, &args, false).await;
        return lone_answer(script, reply);
    };
    let held = Box::new(Held {
        conn: conn.clone(),
        script,
        keys: keys.clone(),
        args: args.clone(),
    });
    let answer = spawn_holding(&runtime, conn.clone(), script, keys, args, None);
    Answered {
        answer,
        held: Some(held),
    }
    .await
}
