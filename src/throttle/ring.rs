//! The ring of per-slot bloom filters that remembers who called lately.
//!
//! Memory is fixed when the ring is built: `slots` filters plus two union
//! filters, each of `bits` bits. Nothing on the request path allocates, locks
//! or reads a clock: it hashes the key once, probes the current slot's filter
//! and, when that misses, the union of the older slots.
//!
//! ```text
//!   slots (one per minute)            unions (double-buffered)
//!   [m-29][m-28] ... [m-1][m ← current]  live = m-29 | ... | m-1
//! ```
//!
//! Rotation (once per slot, from the sync round, never from a request)
//! rebuilds the spare union from the slots that stay, flips it live, clears
//! the oldest slot and makes it current. Clearing happens only to filters no
//! request reads any more, so a caller seen in the window is never missed
//! because of a rotation in progress.

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};

use fastbloom::AtomicBloomFilter;

/// The parameters every app server must share for their filters to merge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Shape {
    /// Bits per filter, a multiple of 64.
    pub(crate) bits: usize,
    /// Bit positions set per key.
    pub(crate) hashes: u32,
    /// Seed of the key hash.
    pub(crate) seed: u128,
}

impl Shape {
    /// The smallest filter that holds `capacity` keys at `false_positive_rate`.
    pub(crate) fn for_capacity(capacity: usize, false_positive_rate: f64, seed: u128) -> Self {
        let bits = fastbloom::optimal_size(capacity, false_positive_rate).div_ceil(64) * 64;
        Self {
            bits,
            hashes: fastbloom::optimal_hashes(bits, capacity),
            seed,
        }
    }

    /// 64-bit words per filter.
    pub(crate) fn words(&self) -> usize {
        self.bits / 64
    }

    /// An empty filter of this shape.
    pub(crate) fn empty(&self) -> AtomicBloomFilter {
        self.filled(vec![0; self.words()])
    }

    /// A filter of this shape over `words` (which must number [`Self::words`]).
    pub(crate) fn filled(&self, words: Vec<u64>) -> AtomicBloomFilter {
        debug_assert_eq!(words.len(), self.words());
        AtomicBloomFilter::from_vec(words)
            .seed(&self.seed)
            .hashes(self.hashes)
    }

    /// The false-positive rate of one filter holding `items` distinct keys.
    pub(crate) fn false_positive_rate(&self, items: usize) -> f64 {
        let density = fastbloom::expected_density(self.hashes, self.bits, items);
        fastbloom::expected_false_pos(self.hashes, density)
    }
}

/// Hashes a key's bytes as a plain byte stream, so the hash is the same on
/// every platform and Rust version (`Hash for [u8]` would add a
/// platform-sized length prefix).
struct Bytes<'a>(&'a [u8]);

impl Hash for Bytes<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write(self.0);
    }
}

/// See the module docs.
#[derive(Debug)]
pub(crate) struct Ring {
    shape: Shape,
    slots: Box<[AtomicBloomFilter]>,
    /// Whether a slot gained bits since it was last written to Redis.
    dirty: Box<[AtomicBool]>,
    unions: [AtomicBloomFilter; 2],
    live_union: AtomicUsize,
    current: AtomicUsize,
    /// The absolute slot number (clock / slot length) that `current` holds.
    /// Written only by [`Ring::advance`], which the sync round serialises.
    slot_no: AtomicU64,
}

#[cfg_attr(not(feature = "redis"), allow(dead_code))]
impl Ring {
    /// An empty ring of `slots` filters, standing at absolute slot `slot_no`.
    pub(crate) fn new(shape: Shape, slots: usize, slot_no: u64) -> Self {
        Self {
            shape,
            slots: (0..slots).map(|_| shape.empty()).collect(),
            dirty: (0..slots).map(|_| AtomicBool::new(false)).collect(),
            unions: [shape.empty(), shape.empty()],
            live_union: AtomicUsize::new(0),
            current: AtomicUsize::new((slot_no % slots as u64) as usize),
            slot_no: AtomicU64::new(slot_no),
        }
    }

    /// How many slots the window has.
    pub(crate) fn slots(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn shape(&self) -> Shape {
        self.shape
    }

    /// The key's hash; every filter of the ring (and of every app server
    /// with the same shape) derives its bit positions from it.
    pub(crate) fn hash(&self, key: &[u8]) -> u64 {
        self.slots[0].source_hash(&Bytes(key))
    }

    /// Whether the key was seen in the window (false positives possible,
    /// false negatives not).
    pub(crate) fn seen(&self, hash: u64) -> bool {
        self.current_filter().contains_hash(hash) || self.live_union().contains_hash(hash)
    }

    /// Notes the key in the current slot, as [`Ring::admit`] does.
    #[cfg(test)]
    pub(crate) fn record(&self, hash: u64) {
        let idx = self.current.load(Relaxed);
        let slot = &self.slots[idx];
        if !slot.contains_hash(hash) && !slot.insert_hash(hash) {
            self.dirty[idx].store(true, Relaxed);
        }
    }

    /// The request path: known callers always pass and are noted; unknown
    /// ones pass (and are noted) only when not `throttling`.
    pub(crate) fn admit(&self, hash: u64, throttling: bool) -> bool {
        let idx = self.current.load(Relaxed);
        let slot = &self.slots[idx];
        if slot.contains_hash(hash) {
            return true;
        }
        if throttling && !self.live_union().contains_hash(hash) {
            return false;
        }
        if !slot.insert_hash(hash) {
            self.dirty[idx].store(true, Relaxed);
        }
        true
    }

    /// The absolute slot number the current filter belongs to.
    pub(crate) fn slot_no(&self) -> u64 {
        self.slot_no.load(Relaxed)
    }

    /// Moves the ring forward to absolute slot `to`, forgetting slots that
    /// fall out of the window. Going backwards (a clock step back) is ignored.
    pub(crate) fn advance(&self, to: u64) {
        let from = self.slot_no();
        if to <= from {
            return;
        }
        let n = self.slots.len() as u64;
        // Slots `to - n + 1 ..= from` keep their data; the spare union gets
        // all of them (including `from`, about to stop being current).
        let keep_from = (to + 1).saturating_sub(n);
        let spare = 1 - self.live_union.load(Relaxed);
        let union = &self.unions[spare];
        union.clear();
        for no in keep_from.max((from + 1).saturating_sub(n))..=from {
            union.union(&self.slots[(no % n) as usize]);
        }
        self.live_union.store(spare, Relaxed);
        // Only now clear the slots being reused: nobody reads them any more.
        for no in (from + 1).max(to.saturating_sub(n - 1))..=to {
            let idx = (no % n) as usize;
            self.slots[idx].clear();
            self.dirty[idx].store(false, Relaxed);
        }
        self.current.store((to % n) as usize, Relaxed);
        self.slot_no.store(to, Relaxed);
        // Catch up with requests that noted callers in `from` while the
        // union was being rebuilt.
        if from >= keep_from {
            union.union(&self.slots[(from % n) as usize]);
        }
    }

    /// The index of absolute slot `no`, if it is still in the window.
    pub(crate) fn index_of(&self, no: u64) -> Option<usize> {
        let cur = self.slot_no();
        let n = self.slots.len() as u64;
        (no <= cur && no + n > cur).then(|| (no % n) as usize)
    }

    /// A slot's bits, for sending to Redis.
    pub(crate) fn words(&self, idx: usize) -> impl Iterator<Item = u64> + '_ {
        self.slots[idx].iter()
    }

    /// ORs another server's bits for slot `idx` in. A past slot's bits also
    /// go into the live union, so they are recognised at once. Returns
    /// whether this slot holds bits that `words` lacks.
    pub(crate) fn merge(&self, idx: usize, words: Vec<u64>) -> bool {
        let ours_extra = self.slots[idx]
            .iter()
            .zip(&words)
            .any(|(ours, theirs)| ours & !theirs != 0);
        let other = self.shape.filled(words);
        self.slots[idx].union(&other);
        if idx != self.current.load(Relaxed) {
            self.live_union().union(&other);
        }
        ours_extra
    }

    /// Clears and returns slot `idx`'s dirty flag.
    pub(crate) fn take_dirty(&self, idx: usize) -> bool {
        self.dirty[idx].swap(false, Relaxed)
    }

    /// Sets slot `idx`'s dirty flag (its write did not go through).
    pub(crate) fn mark_dirty(&self, idx: usize) {
        self.dirty[idx].store(true, Relaxed);
    }

    /// How many distinct callers the whole window holds, from the fill ratio
    /// of `union | current`: `n ≈ -(m / k) · ln(1 - X / m)` (Swamidass and
    /// Baldi, 2007). `f64::INFINITY` when every bit is set.
    pub(crate) fn estimate(&self) -> f64 {
        let ones: u64 = self
            .live_union()
            .iter()
            .zip(self.current_filter().iter())
            .map(|(a, b)| u64::from((a | b).count_ones()))
            .sum();
        estimate_from_ones(ones, self.shape)
    }

    fn current_filter(&self) -> &AtomicBloomFilter {
        &self.slots[self.current.load(Relaxed)]
    }

    fn live_union(&self) -> &AtomicBloomFilter {
        &self.unions[self.live_union.load(Relaxed)]
    }
}

/// The fill-ratio estimate of how many distinct keys set `ones` bits.
pub(crate) fn estimate_from_ones(ones: u64, shape: Shape) -> f64 {
    let m = shape.bits as f64;
    let x = ones as f64;
    if x >= m {
        return f64::INFINITY;
    }
    -(m / f64::from(shape.hashes)) * (1.0 - x / m).ln()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(slots: usize) -> Ring {
        Ring::new(Shape::for_capacity(10_000, 0.01, 7), slots, 100)
    }

    fn h(r: &Ring, s: &str) -> u64 {
        r.hash(s.as_bytes())
    }

    #[test]
    fn a_caller_stays_known_for_exactly_the_window() {
        let r = ring(30);
        let alice = h(&r, "alice");
        r.record(alice);
        for minute in 101..130 {
            r.advance(minute);
            assert!(r.seen(alice), "minute {minute}");
        }
        r.advance(130);
        assert!(!r.seen(alice), "forgotten after 30 slots");
    }

    #[test]
    fn jumps_longer_than_the_window_forget_everything() {
        let r = ring(5);
        let bob = h(&r, "bob");
        r.record(bob);
        r.advance(103);
        assert!(r.seen(bob));
        r.advance(1_000);
        assert!(!r.seen(bob));
        assert_eq!(r.estimate(), 0.0);
    }

    #[test]
    fn throttling_admits_known_callers_only() {
        let r = ring(3);
        let (old, new) = (h(&r, "old"), h(&r, "new"));
        assert!(r.admit(old, false));
        r.advance(101);
        assert!(r.admit(old, true), "seen last slot");
        assert!(!r.admit(new, true));
        assert!(!r.seen(new), "a refused caller is not noted");
    }

    #[test]
    fn estimate_tracks_distinct_callers() {
        let r = ring(30);
        for i in 0..3000 {
            r.record(h(&r, &format!("c{i}")));
            r.record(h(&r, &format!("c{i}")));
        }
        r.advance(101);
        for i in 2000..5000 {
            r.record(h(&r, &format!("c{i}")));
        }
        let est = r.estimate();
        assert!((est - 5000.0).abs() < 150.0, "{est}");
    }

    #[test]
    fn merge_reports_whether_we_hold_more() {
        let r = ring(3);
        let idx = r.index_of(100).unwrap();
        r.record(h(&r, "x"));
        let ours: Vec<u64> = r.words(idx).collect();
        assert!(!r.merge(idx, ours.clone()), "same bits");
        assert!(r.merge(idx, vec![0; ours.len()]), "we have more");
        assert_eq!(r.index_of(97), None);
        assert_eq!(r.index_of(101), None);
    }
}
