//! A memory store that counts its checks, reached only through the awaited
//! `Store` methods (it has no `check_now`), to prove which requests reached
//! a store, and to stand for a store that must be awaited.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use tollgate::clock::ManualClock;
use tollgate::decision::Receipt;
use tollgate::store::BoxFuture;
use tollgate::{Decision, Key, MemoryStore, Policy, Store, StoreError};

/// A memory store that counts the calls it gets, to prove which requests
/// never reached the store.
#[derive(Debug, Clone)]
pub struct Counting {
    inner: MemoryStore,
    checks: Arc<AtomicUsize>,
}

impl Counting {
    pub fn new() -> Self {
        Self {
            inner: MemoryStore::with_clock(ManualClock::new(1_000_000)),
            checks: Arc::default(),
        }
    }

    pub fn checks(&self) -> usize {
        self.checks.load(Ordering::SeqCst)
    }
}

impl Store for Counting {
    fn check<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        self.checks.fetch_add(1, Ordering::SeqCst);
        self.inner.check(policy, key, cost)
    }

    fn peek<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        self.inner.peek(policy, key)
    }

    fn refund<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        receipt: &'a Receipt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.inner.refund(policy, key, receipt)
    }
}
