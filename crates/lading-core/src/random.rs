//! Randomness, injected beside the [`Clock`](crate::time::Clock): which of a queue's head
//! entries a worker tries first, where an acceptor starts, backoff jitter. Spread, not
//! secrecy: tokens and lock names take the operating system's randomness instead.
//!
//! A test gives a [`Seeded`] source to make a run repeatable; everything else uses
//! [`os_seeded`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// A source of pseudo-random numbers.
pub trait Random: Send + Sync + 'static {
    /// The next 64 random bits.
    fn next_u64(&self) -> u64;

    /// A number in `0..n` (0 when `n` is 0).
    fn below(&self, n: usize) -> usize {
        if n == 0 {
            return 0;
        }
        (self.next_u64() % n as u64) as usize
    }

    /// A number in `[0, 1)`.
    fn unit(&self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// SplitMix64 over one atomic counter: cheap, shared by every thread without a lock, and the
/// same sequence for the same seed.
#[derive(Debug)]
pub struct Seeded(AtomicU64);

impl Seeded {
    pub fn new(seed: u64) -> Arc<Seeded> {
        Arc::new(Seeded(AtomicU64::new(seed)))
    }
}

impl Random for Seeded {
    fn next_u64(&self) -> u64 {
        let x = self
            .0
            .fetch_add(0x9E37_79B9_7F4A_7C15, Ordering::Relaxed)
            .wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

pub type SharedRandom = Arc<dyn Random>;

/// A [`Seeded`] source with a seed from the operating system: processes started together
/// do not spread the same way.
pub fn os_seeded() -> SharedRandom {
    let mut seed = [0u8; 8];
    // /dev/urandom is always there on the systems Lading runs on; the time is a fallback.
    let from_os = std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut seed));
    let seed = match from_os {
        Ok(()) => u64::from_le_bytes(seed),
        Err(_) => {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64)
                ^ u64::from(std::process::id())
        }
    };
    Seeded::new(seed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_gives_the_same_numbers_and_they_spread() {
        let (a, b) = (Seeded::new(7), Seeded::new(7));
        let xs: Vec<u64> = (0..5).map(|_| a.next_u64()).collect();
        let ys: Vec<u64> = (0..5).map(|_| b.next_u64()).collect();
        assert_eq!(xs, ys);
        let c = Seeded::new(8);
        assert_ne!(xs, (0..5).map(|_| c.next_u64()).collect::<Vec<_>>());
        let r = Seeded::new(1);
        let mut seen = [0usize; 4];
        for _ in 0..4000 {
            seen[r.below(4)] += 1;
        }
        assert!(seen.iter().all(|&n| (800..1200).contains(&n)), "{seen:?}");
        assert_eq!(r.below(0), 0);
        assert!((0..1000).map(|_| r.unit()).all(|u| (0.0..1.0).contains(&u)));
    }
}
