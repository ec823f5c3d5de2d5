//! One shard of the memory store: a table of entries, each a key's state
//! and its expiry, read and written by the strategies under the shard's
//! lock.

use hashbrown::HashTable;

use super::names::{Name, OwnedName};
use super::state::State;

/// How often a shard drops expired entries, in µs of its clock.
const SWEEP_EVERY_MICROS: u64 = 1_000_000;

#[derive(Debug, Default)]
pub(crate) struct Shard {
    /// Placed by each name's hash, kept in the entry: a lookup hashes
    /// nothing, and growing the table hashes nothing again.
    entries: HashTable<Entry>,
    next_sweep: u64,
}

#[derive(Debug)]
struct Entry {
    hash: u64,
    name: OwnedName,
    expires_at: u64,
    state: State,
}

impl Shard {
    /// Drops expired entries once per [`SWEEP_EVERY_MICROS`] of the clock.
    pub(super) fn sweep_if_due(&mut self, now: u64) {
        if now >= self.next_sweep {
            self.sweep(now);
        }
    }

    /// Drops every expired entry.
    pub(super) fn sweep(&mut self, now: u64) {
        self.entries.retain(|e| e.expires_at > now);
        self.next_sweep = now + SWEEP_EVERY_MICROS;
    }

    /// How many entries the shard holds, live or not yet swept.
    pub(super) fn len(&self) -> usize {
        self.entries.len()
    }

    fn entry(&self, name: Name<'_>) -> Option<&Entry> {
        self.entries.find(name.hash(), |e| e.name.is(&name))
    }

    #[inline]
    fn entry_mut(&mut self, name: Name<'_>) -> Option<&mut Entry> {
        self.entries.find_mut(name.hash(), |e| e.name.is(&name))
    }

    /// The live state under `name`; an expired entry reads as absent, as in Redis.
    pub(crate) fn get(&self, name: Name<'_>, now: u64) -> Option<&State> {
        self.entry(name)
            .filter(|e| e.expires_at > now)
            .map(|e| &e.state)
    }

    pub(crate) fn get_mut(&mut self, name: Name<'_>, now: u64) -> Option<&mut State> {
        self.entry_mut(name)
            .filter(|e| e.expires_at > now)
            .map(|e| &mut e.state)
    }

    /// Stores `state` under `name` until `expires_at` (µs).
    pub(crate) fn put(&mut self, name: Name<'_>, state: State, expires_at: u64) {
        match self.entry_mut(name) {
            Some(entry) => {
                entry.state = state;
                entry.expires_at = expires_at;
            }
            None => self.insert(name, state, expires_at),
        }
    }

    fn insert(&mut self, name: Name<'_>, state: State, expires_at: u64) {
        let entry = Entry {
            hash: name.hash(),
            name: name.owned(),
            expires_at,
            state,
        };
        self.entries.insert_unique(entry.hash, entry, |e| e.hash);
    }

    /// Reads `name`'s live state (`None` when absent or expired) and writes
    /// the state and expiry (µs) `decide` puts in its second argument
    /// (left `None`, the entry stays as it is). One probe for a key already
    /// stored, where [`get`](Self::get) then [`put`](Self::put) take two: a
    /// hot key's decision.
    #[inline]
    pub(crate) fn update<T>(
        &mut self,
        name: Name<'_>,
        now: u64,
        decide: impl FnOnce(Option<&State>, &mut Option<(State, u64)>) -> T,
    ) -> T {
        let mut write = None;
        let entry = self.entry_mut(name);
        let live = entry.as_deref().filter(|e| e.expires_at > now);
        let answer = decide(live.map(|e| &e.state), &mut write);
        match (write, entry) {
            (Some((state, expires_at)), Some(entry)) => {
                entry.state = state;
                entry.expires_at = expires_at;
            }
            (Some((state, expires_at)), None) => self.insert(name, state, expires_at),
            (None, _) => {}
        }
        answer
    }

    /// The live state under `name`, with its expiry (µs), to change in
    /// place: a strategy may move its state out and leave an empty one, so
    /// the entry is not given up and made again.
    pub(crate) fn get_mut_with_expiry(
        &mut self,
        name: Name<'_>,
        now: u64,
    ) -> Option<(&mut State, u64)> {
        self.entry_mut(name)
            .filter(|e| e.expires_at > now)
            .map(|e| (&mut e.state, e.expires_at))
    }

    /// Runs `decide` on this shard, then puts the entries under `names`
    /// back as they were: a decision as if charging, with nothing written
    /// (what Redis's no-writes twin of a script does).
    pub(crate) fn dry_run<'a, T>(
        &mut self,
        names: impl Iterator<Item = Name<'a>>,
        decide: impl FnOnce(&mut Self) -> T,
    ) -> T {
        let saved: Vec<(Name<'a>, Option<(State, u64)>)> = names
            .map(|name| {
                let entry = self.entry(name).map(|e| (e.state.clone(), e.expires_at));
                (name, entry)
            })
            .collect();
        let answer = decide(self);
        for (name, entry) in saved {
            match entry {
                Some((state, expires_at)) => self.put(name, state, expires_at),
                None => self.remove(name),
            }
        }
        answer
    }

    pub(crate) fn remove(&mut self, name: Name<'_>) {
        if let Ok(entry) = self.entries.find_entry(name.hash(), |e| e.name.is(&name)) {
            entry.remove();
        }
    }
}

/// Runs `f` on `n` empty slots, one per quota: on the stack for every
/// policy a layer accepts (at most 8 quotas), on the heap beyond.
pub(crate) fn with_slots<T: Copy, R>(n: usize, f: impl FnOnce(&mut [Option<T>]) -> R) -> R {
    let mut stack = [None; 8];
    match stack.get_mut(..n) {
        Some(slots) => f(slots),
        None => f(&mut vec![None; n]),
    }
}
