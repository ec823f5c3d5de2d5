//! Giving a pass's charge back when the request stops needing it, without
//! blocking: a client that leaves a leaky bucket's queue, or a concurrency
//! slot whose response ended, failed or was cancelled.

use std::future::Future;
use std::sync::Arc;
use std::task::{Context, Waker};

use super::{Limiter, Pass};
use crate::decision::Receipt;
use crate::error::StoreError;
use crate::key::Key;
use crate::store::Store;

/// Gives a receipt back to the store that charged it when dropped, unless
/// disarmed first. A store that gives back at once, or commits to sending
/// it (`Store::refund_now`: the memory store, a Redis release queued for
/// a later batch), needs nothing more; otherwise the store call runs in a
/// spawned task, bounded by the layer's deadline. If it fails (Redis is
/// down) the charge simply times out in the store (a concurrency slot
/// after its timeout, a leaky bucket's place when its turn passes), so
/// nothing leaks and nothing waits.
///
/// Boxed, so that every response future, most of which hold no guard,
/// stays a pointer smaller rather than carrying room for one.
pub(crate) struct ReleaseGuard(Option<Box<Release>>);

struct Release {
    limiter: Arc<Limiter>,
    store: Arc<dyn Store>,
    key: Key,
    receipt: Receipt,
}

impl ReleaseGuard {
    /// A guard that gives `pass`'s charge back, without blocking, if it is
    /// dropped while armed: for a leaky bucket's pass while it waits its turn
    /// (the client may leave), for a concurrency slot until the response body
    /// ends. `None` when there is nothing to give back.
    pub(crate) fn for_pass(limiter: &Arc<Limiter>, pass: &Pass) -> Option<Self> {
        let gives_back = pass.delay().is_some() || limiter.config.holds_until_response_ends;
        if !gives_back {
            return None;
        }
        Self::for_charge(limiter, pass)
    }

    /// [`for_pass`](Self::for_pass) past its quick "nothing to give back",
    /// the answer for nearly every pass.
    fn for_charge(limiter: &Arc<Limiter>, pass: &Pass) -> Option<Self> {
        let (store, key, receipt) = limiter.charge_of(pass)?;
        if receipt.is_empty() {
            return None;
        }
        Some(Self(Some(Box::new(Release {
            limiter: limiter.clone(),
            store: store.clone(),
            key: key.clone(),
            receipt: receipt.clone(),
        }))))
    }

    /// The request is about to run: a place in a leaky bucket's queue is now
    /// spent (`None`), a concurrency slot stays held until the body ends.
    pub(crate) fn keep_if_held(mut self) -> Option<Self> {
        let held = self
            .0
            .as_ref()
            .is_some_and(|r| r.limiter.config.holds_until_response_ends);
        if held {
            Some(self)
        } else {
            self.0 = None;
            None
        }
    }

    /// Gives the charge back now (once; later calls and the drop do nothing).
    pub(crate) fn release(&mut self) {
        let Some(release) = self.0.take() else {
            return;
        };
        let Release {
            limiter,
            store,
            key,
            receipt,
        } = *release;
        // A store that gives back at once (in process), or that commits to
        // sending it (a Redis batch's queue), needs no task.
        if let Some(given) = store.refund_now(limiter.charged_under(&receipt), &key, &receipt) {
            match given {
                Ok(()) => tracing::trace!(
                    policy = limiter.name(),
                    "rate limit charge released, or queued to be"
                ),
                Err(err) => limiter.note_error(&key, &err),
            }
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            tracing::warn!(
                policy = limiter.name(),
                "no Tokio runtime to release a rate limit charge on; it expires in the store instead"
            );
            return;
        };
        let mut release = Box::pin(async move {
            let policy = limiter.charged_under(&receipt);
            let release = store.refund(policy, &key, &receipt);
            match tokio::time::timeout(limiter.config.deadline, release).await {
                Ok(Ok(())) => tracing::trace!(policy = policy.name(), "rate limit charge released"),
                // Counted, and logged as the store's failures are: once
                // per outage. The charge expires in the store instead.
                Ok(Err(err)) => limiter.note_error(&key, &err),
                Err(_) => limiter.note_error(&key, &StoreError::timeout()),
            }
        });
        // Polled once here, a release that completes at once needs no task
        // (spawning one costs more than the release itself); one that has
        // to wait finishes in a task, polled again there.
        if release
            .as_mut()
            .poll(&mut Context::from_waker(Waker::noop()))
            .is_pending()
        {
            runtime.spawn(release);
        }
    }
}

impl Drop for ReleaseGuard {
    fn drop(&mut self) {
        self.release();
    }
}
