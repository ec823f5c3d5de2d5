//! A store that is always down, as the layer sees an unreachable Redis.

use tollgate::decision::Receipt;
use tollgate::error::StoreErrorKind;
use tollgate::store::BoxFuture;
use tollgate::{Decision, Key, Policy, Store, StoreError};

/// Every call fails as an unreachable Redis's would.
#[derive(Debug)]
pub struct Down;

pub fn down<T>() -> BoxFuture<'static, Result<T, StoreError>> {
    Box::pin(async {
        Err(StoreError::new(
            StoreErrorKind::Unavailable,
            "connection refused",
        ))
    })
}

impl Store for Down {
    fn check<'a>(
        &'a self,
        _: &'a Policy,
        _: &'a Key,
        _: u64,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        down()
    }

    fn peek<'a>(
        &'a self,
        _: &'a Policy,
        _: &'a Key,
    ) -> BoxFuture<'a, Result<Decision, StoreError>> {
        down()
    }

    fn refund<'a>(
        &'a self,
        _: &'a Policy,
        _: &'a Key,
        _: &'a Receipt,
    ) -> BoxFuture<'a, Result<(), StoreError>> {
        down()
    }
}
