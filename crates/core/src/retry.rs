//! How long to wait before trying a step again: exponential backoff with full jitter, bounded by
//! a deadline. Only steps that are safe to repeat are retried (reads, writes that carry a
//! deduplication token, connects); the callers in `chpart-server` and `chpart-remote` decide
//! which, from the error's class. Pure: the randomness comes from a seed.

use std::time::Duration;

/// The bounds of retrying one step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// No retry starts after this much time since the step's first try (zero: never retry).
    pub deadline: Duration,
    /// The upper bound of the first wait.
    pub first: Duration,
    /// The upper bound of any wait.
    pub cap: Duration,
}

impl RetryPolicy {
    /// Never retry.
    pub const NONE: RetryPolicy = RetryPolicy {
        deadline: Duration::ZERO,
        first: Duration::ZERO,
        cap: Duration::ZERO,
    };

    /// Retries until `deadline`, waiting up to 100 ms at first, doubling, at most 5 s at a time.
    pub fn within(deadline: Duration) -> RetryPolicy {
        RetryPolicy {
            deadline,
            first: Duration::from_millis(100),
            cap: Duration::from_secs(5),
        }
    }

    /// The waits of one step, drawn from `seed`.
    pub fn backoff(&self, seed: u64) -> Backoff {
        Backoff {
            policy: *self,
            retries: 0,
            // xorshift needs a non-zero state.
            state: seed | 1,
        }
    }
}

/// The waits between the tries of one step.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: RetryPolicy,
    retries: u32,
    state: u64,
}

impl Backoff {
    /// The wait before the next try, given the time since the first; `None` once the deadline
    /// has passed (give up). A wait is uniform in `[0, min(cap, first * 2^n)]` ("full jitter":
    /// clients that failed together do not retry together), cut to end at the deadline.
    pub fn next_delay(&mut self, elapsed: Duration) -> Option<Duration> {
        let left = self.policy.deadline.checked_sub(elapsed)?;
        if left.is_zero() {
            return None;
        }
        let ceiling = self
            .policy
            .first
            .saturating_mul(1u32 << self.retries.min(20))
            .min(self.policy.cap);
        self.retries += 1;
        let fraction = (self.next_random() >> 11) as f64 / (1u64 << 53) as f64;
        Some(ceiling.mul_f64(fraction).min(left))
    }

    /// Retries so far.
    pub fn retries(&self) -> u32 {
        self.retries
    }

    fn next_random(&mut self) -> u64 {
        // xorshift64*
        let mut x = self.state;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.state = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
}

/// A seed that differs between processes and calls (the clock's nanoseconds and the pid).
pub fn clock_seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn waits_grow_within_their_ceiling_and_stop_at_the_deadline() {
        // (deadline, elapsed before each ask, the ceiling each wait must stay under; None: give up)
        let policy = RetryPolicy::within(Duration::from_secs(10));
        let rows: Vec<(Duration, Option<Duration>)> = vec![
            (Duration::ZERO, Some(100 * MS)),
            (Duration::from_secs(1), Some(200 * MS)),
            (Duration::from_secs(2), Some(400 * MS)),
            (Duration::from_secs(3), Some(800 * MS)),
            (Duration::from_secs(4), Some(1600 * MS)),
            (Duration::from_secs(5), Some(3200 * MS)),
            (Duration::from_secs(6), Some(Duration::from_secs(4))), // cap 5 s, but 4 s left
            (Duration::from_millis(9_990), Some(10 * MS)),          // only 10 ms left
            (Duration::from_secs(10), None),
            (Duration::from_secs(11), None),
        ];
        for seed in [1, 7, 42, u64::MAX, clock_seed()] {
            let mut backoff = policy.backoff(seed);
            for (i, (elapsed, ceiling)) in rows.iter().enumerate() {
                let delay = backoff.next_delay(*elapsed);
                match (delay, ceiling) {
                    (Some(d), Some(c)) => assert!(d <= *c, "seed {seed} row {i}: {d:?} > {c:?}"),
                    (None, None) => {}
                    other => panic!("seed {seed} row {i}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn no_policy_never_retries() {
        let mut backoff = RetryPolicy::NONE.backoff(3);
        assert_eq!(backoff.next_delay(Duration::ZERO), None);
        assert_eq!(backoff.retries(), 0);
    }

    #[test]
    fn jitter_spreads_the_waits_of_clients_that_failed_together() {
        let policy = RetryPolicy::within(Duration::from_secs(60));
        let firsts: Vec<Duration> = (1..=64u64)
            .map(|seed| {
                policy
                    .backoff(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15))
                    .next_delay(Duration::ZERO)
                    .unwrap()
            })
            .collect();
        let below_half = firsts.iter().filter(|d| **d < 50 * MS).count();
        assert!(
            (16..=48).contains(&below_half),
            "64 clients, {below_half} waited under half the ceiling: {firsts:?}"
        );
    }
}
