//! The shapes of state the memory store keeps, one per kind of strategy
//! state: plain data with the few operations on it that several places
//! need. The algorithms that read and write them live with their strategy
//! (`strategy/<name>.rs`); the shard stores them as [`State`].

use std::collections::VecDeque;

/// One key's state: one variant per shape of state, the memory store's one
/// registration of each; the strategy's file (`strategy/<name>.rs`) reads
/// and writes its own variant.
#[derive(Debug, Clone)]
pub(crate) enum State {
    Window(Window),
    /// A uniform gate: when it opens again, µs.
    Gate(u64),
    /// A sliding log (resource or consumer).
    Log(Log),
    /// A sliding-window counter.
    Counter(Counter),
    /// A GCRA bucket: its theoretical arrival time, µs, and what refunds
    /// gave back.
    Tat(Bucket),
    /// A leaky bucket's `next_free`, µs, and what refunds gave back.
    Leaky(Bucket),
    InFlight(InFlight),
    /// A caller's entry in its policy's penalty box.
    Penalty(crate::penalty::Record),
}

/// A bucket's state: its TAT (the leaky bucket's `next_free`), and the µs
/// refunds have moved it back since the state was made, which only grows
/// while the state lives.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Bucket {
    pub tat: u64,
    pub given: u64,
}

/// One quota's window: what was spent and when the window ends (µs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Window {
    pub count: u64,
    pub reset_at: u64,
}

/// One quota's stored counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counter {
    /// Start of the window `cur` counts, µs since the epoch.
    pub start: u64,
    /// Units spent in that window.
    pub cur: u64,
    /// Units spent in the window before it.
    pub prev: u64,
}

impl Counter {
    /// When the counters stop mattering: the end of the next window.
    pub(crate) fn stale_at(&self, window: u64) -> u64 {
        self.start + 2 * window
    }
}

/// One log: `(time µs, request id)` per unit spent, oldest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Log {
    entries: VecDeque<(u64, u64)>,
}

impl Log {
    /// Index of the first entry inside `(now - window, ..]`.
    pub(crate) fn first_inside(&self, now: u64, window: u64) -> usize {
        match now.checked_sub(window) {
            Some(cutoff) => self.entries.partition_point(|&(at, _)| at <= cutoff),
            None => 0,
        }
    }

    /// Units inside the window.
    pub(crate) fn count(&self, now: u64, window: u64) -> u64 {
        (self.entries.len() - self.first_inside(now, window)) as u64
    }

    /// The newest entry's time, if any.
    pub(crate) fn newest(&self) -> Option<u64> {
        self.entries.back().map(|&(at, _)| at)
    }

    /// Time of the `k`-th oldest entry inside the window (1-based).
    pub(crate) fn kth_inside(&self, now: u64, window: u64, k: u64) -> u64 {
        self.entries[self.first_inside(now, window) + k as usize - 1].0
    }

    /// Drops entries that left the window.
    pub(crate) fn trim(&mut self, now: u64, window: u64) {
        let outside = self.first_inside(now, window);
        self.entries.drain(..outside);
    }

    /// Logs `cost` units at `now` for request `id`, keeping time order.
    pub(crate) fn add(&mut self, now: u64, id: u64, cost: u64) {
        let at = self.entries.partition_point(|&(t, _)| t <= now);
        for _ in 0..cost {
            self.entries.insert(at, (now, id));
        }
    }

    /// Removes up to `cost` entries logged at `at` for request `id`.
    pub(crate) fn remove(&mut self, at: u64, id: u64, cost: u64) {
        let mut left = cost;
        self.entries.retain(|&e| {
            let hit = left > 0 && e == (at, id);
            left -= u64::from(hit);
            !hit
        });
    }

    /// Keeps at most `units` of the entries logged at `at` for request `id`:
    /// a settle to fewer units than were charged. The Redis log's members
    /// name each unit, and a settle removes those from `units` on; this log
    /// keeps the same number.
    pub(crate) fn keep(&mut self, at: u64, id: u64, units: u64) {
        let mut kept = 0;
        self.entries.retain(|&e| {
            if e != (at, id) {
                return true;
            }
            kept += 1;
            kept <= units
        });
    }

    /// How many entries the log holds, inside the window or not.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether nothing is logged.
    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// One admitted request: its id, start (µs) and cost (members in Redis).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Slot {
    pub id: u64,
    pub started: u64,
    pub cost: u64,
}

/// The requests of one key in flight.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct InFlight {
    pub slots: Vec<Slot>,
}
