//! Helpers shared by the engine's integration tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::time::Duration;

/// The test configuration: defaults with a short cycle time, so idle ranks
/// answer quickly.
pub fn config() -> kolo::Config {
    kolo::Config::default().cycle_time(Duration::from_micros(500))
}

/// A small deterministic generator (xorshift64*).
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value in `0..n`.
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }

    /// Shuffles `items` (Fisher-Yates).
    pub fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// The error of a result that must have failed.
pub fn expect_err<T: std::fmt::Debug>(result: Result<T, kolo::Error>, what: &str) -> kolo::Error {
    match result {
        Ok(v) => panic!("{what}: expected an error, got Ok({v:?})"),
        Err(e) => e,
    }
}
