//! A store that decides in memory and keeps nothing else: no overrides,
//! blocks or runtime limits. The `Store` trait's defaults refuse those, as
//! a store of a user's own that cannot keep them would.

use tollgate::decision::Receipt;
use tollgate::store::BoxFuture;
use tollgate::{Decision, Key, MemoryStore, Policy, Store, StoreError};

#[derive(Debug, Clone, Default)]
pub struct CountersOnly(pub MemoryStore);

impl Store for CountersOnly {
    fn check<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        cost: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        self.0.check(policy, key, cost)
    }

    fn peek<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        self.0.peek(policy, key)
    }

    fn refund<'a>(
        &'a self,
        policy: &'a Policy,
        key: &'a Key,
        receipt: &'a Receipt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        self.0.refund(policy, key, receipt)
    }
}
