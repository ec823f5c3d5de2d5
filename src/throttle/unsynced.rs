//! Without the `redis` feature a throttle keeps what it learns to this
//! server: where the Redis sync would be there is a type with no values, so
//! every sync path is statically unreachable.

use super::ring::Ring;
use super::RoundCounts;
use crate::error::StoreError;

/// No Redis to share callers through.
#[derive(Debug)]
pub(crate) enum RedisSync {}

impl RedisSync {
    pub(crate) fn slot_ended(&mut self, _slot_no: u64) {
        match *self {}
    }

    pub(crate) async fn round(
        &mut self,
        _ring: &Ring,
        _counts: &mut RoundCounts,
    ) -> Result<(), StoreError> {
        match *self {}
    }
}
