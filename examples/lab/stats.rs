//! From events to numbers: per-second counts, the busiest sliding window,
//! and how fairly the admissions were shared.

use crate::events::Event;

/// What one strategy did with the crowd.
#[derive(Debug, Clone)]
pub struct Summary {
    pub admitted: u64,
    pub rejected: u64,
    /// Admitted per simulated second, rejected per simulated second.
    pub admitted_per_sec: Vec<u64>,
    pub rejected_per_sec: Vec<u64>,
    /// Most admissions in any window of the quota's length, wherever it starts.
    pub max_in_window: u64,
    /// Jain's fairness index over the callers' admitted counts: 1 when every
    /// caller got the same, 1/n when one caller got everything.
    pub jain: f64,
    /// Callers that got at least one request through.
    pub served: u32,
    /// Admitted per caller, steady and bursty callers apart (means).
    pub steady_mean: f64,
    pub bursty_mean: f64,
}

/// Aggregates `events` for `callers` callers over at least `secs` seconds
/// (longer when a shaped request left the bucket after the end); `window` is
/// the quota's window in µs; callers below `bursty` are the bursty ones.
pub fn summarize(events: &[Event], callers: u32, bursty: u32, secs: usize, window: u64) -> Summary {
    let last = events.iter().map(|e| (e.at / 1_000_000) as usize + 1).max();
    let secs = secs.max(last.unwrap_or(0));
    let mut admitted_per_sec = vec![0; secs];
    let mut rejected_per_sec = vec![0; secs];
    let mut per_caller = vec![0u64; callers as usize];
    let mut times = Vec::new();
    for e in events {
        let sec = (e.at / 1_000_000) as usize;
        if e.admitted {
            admitted_per_sec[sec] += 1;
            if let Some(n) = per_caller.get_mut(e.caller as usize) {
                *n += 1;
            }
            times.push(e.at);
        } else {
            rejected_per_sec[sec] += 1;
        }
    }
    let admitted = times.len() as u64;
    Summary {
        admitted,
        rejected: events.len() as u64 - admitted,
        admitted_per_sec,
        rejected_per_sec,
        max_in_window: max_in_window(&mut times, window),
        jain: jain(&per_caller),
        served: per_caller.iter().filter(|&&n| n > 0).count() as u32,
        steady_mean: mean(&per_caller[(bursty as usize).min(per_caller.len())..]),
        bursty_mean: mean(&per_caller[..(bursty as usize).min(per_caller.len())]),
    }
}

/// The most timestamps in any half-open interval `[t, t + window)`.
pub fn max_in_window(times: &mut [u64], window: u64) -> u64 {
    times.sort_unstable();
    let (mut start, mut best) = (0, 0);
    for end in 0..times.len() {
        while times[end] - times[start] >= window {
            start += 1;
        }
        best = best.max(end + 1 - start);
    }
    best as u64
}

/// Jain's index: (Σx)² / (n · Σx²); 1 for an empty crowd or nobody served.
pub fn jain(xs: &[u64]) -> f64 {
    let sum: f64 = xs.iter().map(|&x| x as f64).sum();
    let squares: f64 = xs.iter().map(|&x| (x as f64).powi(2)).sum();
    if xs.is_empty() || squares == 0.0 {
        return 1.0;
    }
    sum * sum / (xs.len() as f64 * squares)
}

fn mean(xs: &[u64]) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.iter().sum::<u64>() as f64 / xs.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_boundary_burst_shows_in_the_sliding_window() {
        // Ten at the end of one window and ten at the start of the next.
        let mut times: Vec<u64> = (0..10)
            .map(|i| 990_000 + i)
            .chain((0..10).map(|i| 1_000_000 + i))
            .collect();
        assert_eq!(max_in_window(&mut times, 1_000_000), 20);
        let mut spread: Vec<u64> = (0..20).map(|i| i * 100_000).collect();
        assert_eq!(max_in_window(&mut spread, 1_000_000), 10);
    }

    #[test]
    fn jain_is_one_when_equal_and_one_over_n_when_one_takes_all() {
        assert!((jain(&[3, 3, 3, 3]) - 1.0).abs() < 1e-9);
        assert!((jain(&[12, 0, 0, 0]) - 0.25).abs() < 1e-9);
    }
}
