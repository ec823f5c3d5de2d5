//! Sharing the current slot's filter through Redis, once per round.
//!
//! A round costs one `EVALSHA` when this server has no new callers, two when
//! it has, and one more the round after a slot ends (its last bits) and on
//! the first round (reading the whole window, for a server that just
//! started). That is per app server and per round, whatever the request rate.
//!
//! 1. **Look** ([`bloom_merge.lua`] with nothing to write): the stored value,
//!    if its version moved since this server last merged; ORed in locally.
//! 2. **Publish**, only if this server holds bits the stored value lacks: the
//!    merged bits with the version just read. If another server wrote in
//!    between, the script writes nothing and answers with the new value,
//!    which is merged; this server gives up until the next round instead of
//!    retrying, so more servers never means a storm of retries.
//!
//! The bits travel compressed ([`codec`](super::codec)); the OR happens here,
//! not in Lua, and the version check is what makes it safe.
//!
//! [`bloom_merge.lua`]: https://docs.rs/crate/tollgate/latest/source/lua/bloom_merge.lua

use std::collections::HashMap;
use std::sync::Arc;

use redis::Value;

use super::codec;
use super::ring::Ring;
use super::RoundCounts;
use crate::error::{StoreError, StoreErrorKind};
use crate::store::redis::connection::Connection;
use crate::store::redis::script::{BLOOM_MERGE as MERGE, BLOOM_READ as READ};
use crate::store::redis::server::Scripting;

/// The Redis side of a throttle: where its slots live and what this server
/// last merged of each.
#[derive(Debug)]
pub(crate) struct RedisSync {
    conn: Connection,
    /// Whether the read may use `EVALSHA_RO` (Redis 7.0 on).
    scripting: Arc<Scripting>,
    /// `{prefix}:{~throttle|name}`
    tag: String,
    /// Expiry of every written slot: the window plus one slot.
    ttl_ms: u64,
    /// Per absolute slot number, the stored version last merged.
    versions: HashMap<u64, i64>,
    /// Whether the whole window was read once.
    warmed: bool,
    /// A slot that just ended and may still hold unpublished bits.
    closing: Option<u64>,
}

impl RedisSync {
    pub(crate) fn new(
        conn: Connection,
        scripting: Arc<Scripting>,
        tag: String,
        ttl_ms: u64,
    ) -> Self {
        Self {
            conn,
            scripting,
            tag,
            ttl_ms,
            versions: HashMap::new(),
            warmed: false,
            closing: None,
        }
    }

    fn key(&self, slot_no: u64) -> String {
        format!("{}:m:{slot_no}", self.tag)
    }

    /// Remembers that slot `slot_no` ended, to publish its last bits once.
    pub(crate) fn slot_ended(&mut self, slot_no: u64) {
        self.closing = Some(slot_no);
    }

    /// One round; see the module docs.
    pub(crate) async fn round(
        &mut self,
        ring: &Ring,
        counts: &mut RoundCounts,
    ) -> Result<(), StoreError> {
        if !self.warmed {
            self.warm_up(ring, counts).await?;
        }
        if let Some(no) = self.closing.take()
            && let Some(idx) = ring.index_of(no)
        {
            self.publish(ring, no, idx, counts).await?;
        }
        let no = ring.slot_no();
        let idx = ring
            .index_of(no)
            .expect("the current slot is in the window");
        self.look(ring, no, idx, counts).await?;
        self.publish(ring, no, idx, counts).await?;
        let oldest = ring.slot_no().saturating_sub(ring.slots() as u64);
        self.versions.retain(|&no, _| no > oldest);
        Ok(())
    }

    /// Reads every slot of the window (one script call), so a server that
    /// starts while the service is throttling knows the sessions in progress.
    async fn warm_up(&mut self, ring: &Ring, counts: &mut RoundCounts) -> Result<(), StoreError> {
        let cur = ring.slot_no();
        let nos: Vec<u64> = (0..ring.slots() as u64)
            .filter_map(|back| cur.checked_sub(back))
            .collect();
        let keys: Vec<String> = nos.iter().map(|&no| self.key(no)).collect();
        counts.calls += 1;
        let reply = self
            .scripting
            .eval_read_only::<String>(&self.conn, &READ, &keys, &[])
            .await?;
        let items = array(reply)?;
        if items.len() != 2 * nos.len() {
            return Err(StoreError::protocol(format!(
                "bloom_read answered {} items for {} slots",
                items.len(),
                nos.len()
            )));
        }
        for (no, pair) in nos.iter().zip(items.chunks_exact(2)) {
            let version = int(&pair[0])?;
            if version < 0 {
                continue;
            }
            let Some(idx) = ring.index_of(*no) else {
                continue;
            };
            self.absorb(ring, *no, idx, version, &pair[1])?;
            counts.merged += 1;
        }
        self.warmed = true;
        Ok(())
    }

    /// Merges what is stored for slot `no`, if it changed since last time.
    async fn look(
        &mut self,
        ring: &Ring,
        no: u64,
        idx: usize,
        counts: &mut RoundCounts,
    ) -> Result<(), StoreError> {
        let expected = self.versions.get(&no).copied().unwrap_or(-1);
        let reply = self.call(no, expected, Vec::new(), counts).await?;
        match reply {
            Reply::Unchanged => Ok(()),
            Reply::Moved(version, bits) => {
                self.absorb(ring, no, idx, version, &Value::BulkString(bits))?;
                counts.merged += 1;
                Ok(())
            }
            Reply::Gone => {
                self.versions.remove(&no);
                Ok(())
            }
            Reply::Written(_) => Err(StoreError::protocol("bloom_merge wrote nothing sent")),
        }
    }

    /// Writes this server's bits for slot `no` if it holds any the stored
    /// value lacks; on a conflict, merges the newer value and gives up.
    async fn publish(
        &mut self,
        ring: &Ring,
        no: u64,
        idx: usize,
        counts: &mut RoundCounts,
    ) -> Result<(), StoreError> {
        if !ring.take_dirty(idx) {
            return Ok(());
        }
        // Until the write is known to have gone through (the round may also
        // be cancelled at its deadline), the slot stays dirty.
        let unsent = Unsent { ring, idx };
        let expected = self.versions.get(&no).copied().unwrap_or(-1);
        let bits = codec::encode(ring.words(idx));
        let reply = self.call(no, expected, bits, counts).await?;
        std::mem::forget(unsent);
        match reply {
            Reply::Written(version) => {
                self.versions.insert(no, version);
                counts.written += 1;
            }
            Reply::Moved(version, bits) => {
                counts.conflicts += 1;
                self.absorb(ring, no, idx, version, &Value::BulkString(bits))?;
                counts.merged += 1;
            }
            Reply::Gone => {
                counts.conflicts += 1;
                ring.mark_dirty(idx);
                self.versions.remove(&no);
            }
            Reply::Unchanged => {
                return Err(StoreError::protocol("bloom_merge ignored the bits sent"))
            }
        }
        Ok(())
    }

    async fn call(
        &self,
        no: u64,
        expected: i64,
        bits: Vec<u8>,
        counts: &mut RoundCounts,
    ) -> Result<Reply, StoreError> {
        counts.calls += 1;
        let args = [
            expected.to_string().into_bytes(),
            bits,
            self.ttl_ms.to_string().into_bytes(),
        ];
        let reply = self
            .conn
            .eval(&MERGE, &[self.key(no)], &args, false)
            .await?;
        Reply::parse(reply)
    }

    /// ORs a stored value into slot `idx` and remembers its version. A value
    /// of another shape is an error (servers configured differently).
    fn absorb(
        &mut self,
        ring: &Ring,
        no: u64,
        idx: usize,
        version: i64,
        bits: &Value,
    ) -> Result<(), StoreError> {
        let Value::BulkString(bytes) = bits else {
            return Err(StoreError::protocol(format!(
                "expected filter bits, got {bits:?}"
            )));
        };
        let words = codec::decode(bytes, ring.shape().words())
            .map_err(|e| StoreError::new(StoreErrorKind::Protocol, e))?;
        if ring.merge(idx, words) {
            ring.mark_dirty(idx);
        }
        self.versions.insert(no, version);
        Ok(())
    }
}

/// Marks a slot dirty again when dropped: a publish that did not finish.
struct Unsent<'a> {
    ring: &'a Ring,
    idx: usize,
}

impl Drop for Unsent<'_> {
    fn drop(&mut self) {
        self.ring.mark_dirty(self.idx);
    }
}

/// `bloom_merge.lua`'s answer.
enum Reply {
    Written(i64),
    Unchanged,
    Moved(i64, Vec<u8>),
    Gone,
}

impl Reply {
    fn parse(value: Value) -> Result<Self, StoreError> {
        let items = array(value)?;
        let head: Vec<i64> = items.iter().take(2).map(int).collect::<Result<_, _>>()?;
        match (head.as_slice(), items.get(2)) {
            ([1, v], None) => Ok(Reply::Written(*v)),
            ([0, _], None) => Ok(Reply::Unchanged),
            ([-1, -1], None) => Ok(Reply::Gone),
            ([-1, v], Some(Value::BulkString(bits))) if *v >= 0 => {
                Ok(Reply::Moved(*v, bits.clone()))
            }
            _ => Err(StoreError::protocol(format!(
                "malformed bloom_merge reply {head:?}"
            ))),
        }
    }
}

fn array(value: Value) -> Result<Vec<Value>, StoreError> {
    match value {
        Value::Array(items) => Ok(items),
        other => Err(StoreError::protocol(format!(
            "expected an array, got {other:?}"
        ))),
    }
}

fn int(value: &Value) -> Result<i64, StoreError> {
    match value {
        Value::Int(i) => Ok(*i),
        other => Err(StoreError::protocol(format!(
            "expected an integer, got {other:?}"
        ))),
    }
}
