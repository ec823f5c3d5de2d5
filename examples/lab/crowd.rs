//! The crowd: who calls when, in simulated microseconds.
//!
//! Steady callers send one request every `1 / rate` seconds from a random
//! phase, with ±10% jitter. Bursty callers send `burst` requests a
//! millisecond apart, with exponentially distributed gaps chosen so that on
//! average they offer the same rate as a steady caller. Everything comes from
//! one seeded generator, so a run is reproducible.

/// One request: when (µs from the start) and from whom.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Arrival {
    pub at: u64,
    pub caller: u32,
}

/// How a caller behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Steady,
    Bursty,
}

/// The shape of the crowd.
#[derive(Debug, Clone)]
pub struct Crowd {
    /// Distinct callers; caller `i` is bursty when `i < bursty`.
    pub callers: u32,
    pub bursty: u32,
    /// Requests per second each caller offers on average.
    pub rate: f64,
    /// Requests in one burst.
    pub burst: u32,
    /// Simulated length, µs.
    pub length: u64,
    pub seed: u64,
}

impl Crowd {
    pub fn kind(&self, caller: u32) -> Kind {
        if caller < self.bursty {
            Kind::Bursty
        } else {
            Kind::Steady
        }
    }

    /// Every request of the run, in time order.
    pub fn arrivals(&self) -> Vec<Arrival> {
        let mut rng = SplitMix(self.seed);
        let mut all = Vec::new();
        let period = 1e6 / self.rate;
        for caller in 0..self.callers {
            match self.kind(caller) {
                Kind::Steady => {
                    let mut t = rng.unit() * period;
                    while (t as u64) < self.length {
                        all.push(Arrival {
                            at: t as u64,
                            caller,
                        });
                        t += period * (0.9 + 0.2 * rng.unit());
                    }
                }
                Kind::Bursty => {
                    let mean_gap = period * f64::from(self.burst);
                    let mut t = rng.exponential(mean_gap);
                    while (t as u64) < self.length {
                        for i in 0..self.burst {
                            let at = t as u64 + u64::from(i) * 1_000;
                            if at < self.length {
                                all.push(Arrival { at, caller });
                            }
                        }
                        t += rng.exponential(mean_gap);
                    }
                }
            }
        }
        all.sort_unstable();
        all
    }
}

/// SplitMix64: small, fast, and good enough for arrival times.
struct SplitMix(u64);

impl SplitMix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn exponential(&mut self, mean: f64) -> f64 {
        -mean * (1.0 - self.unit()).ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crowd_offers_about_its_rate() {
        let crowd = Crowd {
            callers: 20,
            bursty: 10,
            rate: 1.0,
            burst: 5,
            length: 600_000_000,
            seed: 7,
        };
        let all = crowd.arrivals();
        let per_sec = all.len() as f64 / 600.0;
        assert!((17.0..23.0).contains(&per_sec), "{per_sec}");
        assert!(all.windows(2).all(|w| w[0].at <= w[1].at));
    }
}
