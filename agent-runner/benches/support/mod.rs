//! Shared by the runner's benchmarks: the floor process ([`floor`]), where the processes run
//! ([`placement`]) and what they read of a process in /proc ([`procfs`]). Each bench binary
//! uses a part, so unused items are allowed.
#![allow(dead_code)]

pub(crate) mod floor;
pub(crate) mod placement;
pub(crate) mod procfs;

/// A numeric environment knob of a benchmark (sizes, durations), or `default`.
pub(crate) fn knob(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// The value at fraction `p` (0.5 = median) of `sorted` (ascending); NaN when it is empty.
pub(crate) fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let index = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[index.min(sorted.len() - 1)]
}

/// xorshift64: a reproducible sequence (gaps, choices) without a dependency, so the floor and
/// the runner see the same one from the same seed.
pub(crate) struct XorShift(pub(crate) u64);

impl XorShift {
    /// The next value in `0..bound` (`0..1` for a bound of 0).
    pub(crate) fn below(&mut self, bound: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % bound.max(1)
    }
}
