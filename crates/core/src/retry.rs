//! How long to wait before trying a step again: exponential backoff with full jitter, bounded by
//! a deadline. Only steps that are safe to repeat are retried (reads, writes that carry a
//! deduplication token, connects, a commit that resumes from the ledger); the callers in
//! `chpart-server`, `chpart-remote` and `chpart-protocol` decide which, from the error's class.
//!
//! [`decide`] is the whole decision, pure: from the try number, the time since the first try
//! and whether the error is transient, "retry after this wait" or "give up". [`retry_async`]
//! and [`retry_blocking`] are the one loop around it, for async and blocking callers: each
//! caller passes its classification and says (logs) what a retry means for it.

use std::future::Future;
use std::time::{Duration, Instant};

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

/// What to do after a try failed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Next {
    /// Try again after this wait.
    RetryAfter(Duration),
    /// Return the error.
    GiveUp(GiveUp),
}

/// Why a step is not tried again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GiveUp {
    /// The error is not transient: trying again would fail again, or is not safe.
    NotTransient,
    /// The deadline has passed.
    Deadline,
}

/// The decision after failed try number `retries + 1` of a step, `elapsed` after its first
/// try: a transient error is retried after a wait of `jitter` (in `[0, 1)`) times
/// `min(cap, first * 2^retries)` ("full jitter": clients that failed together do not retry
/// together), cut to end at the deadline; past the deadline, or for any other error, give up.
pub fn decide(
    policy: &RetryPolicy,
    retries: u32,
    elapsed: Duration,
    transient: bool,
    jitter: f64,
) -> Next {
    if !transient {
        return Next::GiveUp(GiveUp::NotTransient);
    }
    let left = match policy.deadline.checked_sub(elapsed) {
        Some(left) if !left.is_zero() => left,
        _ => return Next::GiveUp(GiveUp::Deadline),
    };
    let ceiling = policy
        .first
        .saturating_mul(1u32 << retries.min(20))
        .min(policy.cap);
    Next::RetryAfter(ceiling.mul_f64(jitter).min(left))
}

/// The waits between the tries of one step.
#[derive(Debug, Clone)]
pub struct Backoff {
    policy: RetryPolicy,
    retries: u32,
    state: u64,
}

impl Backoff {
    /// The wait before the next try after a transient error, given the time since the first;
    /// `None` once the deadline has passed (give up). See [`decide`].
    pub fn next_delay(&mut self, elapsed: Duration) -> Option<Duration> {
        self.next(elapsed, true).wait()
    }

    /// [`decide`] for the try that just failed, with a fresh draw of jitter; counts the retry.
    pub fn next(&mut self, elapsed: Duration, transient: bool) -> Next {
        let jitter = (self.next_random() >> 11) as f64 / (1u64 << 53) as f64;
        let next = decide(&self.policy, self.retries, elapsed, transient, jitter);
        if let Next::RetryAfter(_) = next {
            self.retries += 1;
        }
        next
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

impl Next {
    /// The wait, if the step is tried again.
    pub fn wait(self) -> Option<Duration> {
        match self {
            Next::RetryAfter(wait) => Some(wait),
            Next::GiveUp(_) => None,
        }
    }
}

/// A retry the driver is about to wait for, shown to the caller (to log it) before the wait.
#[derive(Debug)]
pub struct Retry<'a, E> {
    /// The retry's number, from 1.
    pub number: u32,
    /// The wait before it.
    pub wait: Duration,
    /// The transient error of the try that failed.
    pub error: &'a E,
}

/// The error a retried step ended with, and why it was not tried again.
#[derive(Debug)]
pub struct Failed<E> {
    /// The last try's error.
    pub error: E,
    /// Why there is no further try.
    pub why: GiveUp,
    /// Retries made before it (tries minus one).
    pub retries: u32,
    /// Time since the first try.
    pub elapsed: Duration,
}

/// One step of a retry loop: the decision after `result`, or its value.
enum Step<T, E> {
    Done(Result<T, Failed<E>>),
    Wait(Duration),
}

/// The state shared by [`retry_async`] and [`retry_blocking`].
struct Driver {
    started: Instant,
    backoff: Backoff,
}

impl Driver {
    fn new(policy: RetryPolicy) -> Driver {
        Driver {
            started: Instant::now(),
            backoff: policy.backoff(clock_seed()),
        }
    }

    fn after<T, E>(
        &mut self,
        result: Result<T, E>,
        transient: &impl Fn(&E) -> bool,
        on_retry: &mut impl FnMut(Retry<'_, E>),
    ) -> Step<T, E> {
        let error = match result {
            Ok(value) => return Step::Done(Ok(value)),
            Err(error) => error,
        };
        let elapsed = self.started.elapsed();
        match self.backoff.next(elapsed, transient(&error)) {
            Next::RetryAfter(wait) => {
                on_retry(Retry {
                    number: self.backoff.retries(),
                    wait,
                    error: &error,
                });
                Step::Wait(wait)
            }
            Next::GiveUp(why) => Step::Done(Err(Failed {
                error,
                why,
                retries: self.backoff.retries(),
                elapsed,
            })),
        }
    }
}

/// Runs `op` until it succeeds, fails with an error `transient` refuses, or `policy`'s
/// deadline passes, waiting between tries with `sleep` (e.g. `tokio::time::sleep`);
/// `on_retry` hears of each retry before its wait.
pub async fn retry_async<T, E, Op, Fut, Sleep, Slept>(
    policy: RetryPolicy,
    transient: impl Fn(&E) -> bool,
    mut on_retry: impl FnMut(Retry<'_, E>),
    sleep: Sleep,
    mut op: Op,
) -> Result<T, Failed<E>>
where
    Op: FnMut() -> Fut,
    Fut: Future<Output = Result<T, E>>,
    Sleep: Fn(Duration) -> Slept,
    Slept: Future<Output = ()>,
{
    let mut driver = Driver::new(policy);
    loop {
        match driver.after(op().await, &transient, &mut on_retry) {
            Step::Done(result) => return result,
            Step::Wait(wait) => sleep(wait).await,
        }
    }
}

/// [`retry_async`] for a blocking `op`: waits by blocking the thread.
pub fn retry_blocking<T, E>(
    policy: RetryPolicy,
    transient: impl Fn(&E) -> bool,
    mut on_retry: impl FnMut(Retry<'_, E>),
    mut op: impl FnMut() -> Result<T, E>,
) -> Result<T, Failed<E>> {
    let mut driver = Driver::new(policy);
    loop {
        match driver.after(op(), &transient, &mut on_retry) {
            Step::Done(result) => return result,
            Step::Wait(wait) => std::thread::sleep(wait),
        }
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
    fn decide_table() {
        use GiveUp::{Deadline, NotTransient};
        use Next::{GiveUp as Stop, RetryAfter};
        let policy = RetryPolicy::within(Duration::from_secs(10));
        let s = Duration::from_secs;
        // (row, retries so far, time since the first try, transient?, jitter, decision)
        let rows: Vec<(&str, u32, Duration, bool, f64, Next)> = vec![
            ("first failure", 0, s(0), true, 1.0, RetryAfter(100 * MS)),
            (
                "jitter scales the wait",
                0,
                s(0),
                true,
                0.5,
                RetryAfter(50 * MS),
            ),
            (
                "no jitter, no wait",
                0,
                s(0),
                true,
                0.0,
                RetryAfter(Duration::ZERO),
            ),
            ("doubles", 1, s(1), true, 1.0, RetryAfter(200 * MS)),
            ("doubles again", 3, s(2), true, 1.0, RetryAfter(800 * MS)),
            ("capped at 5 s", 10, s(2), true, 1.0, RetryAfter(s(5))),
            (
                "huge retry count stays capped",
                1000,
                s(2),
                true,
                1.0,
                RetryAfter(s(5)),
            ),
            ("cut to the deadline", 10, s(7), true, 1.0, RetryAfter(s(3))),
            (
                "10 ms left",
                2,
                Duration::from_millis(9_990),
                true,
                1.0,
                RetryAfter(10 * MS),
            ),
            ("at the deadline", 2, s(10), true, 1.0, Stop(Deadline)),
            ("past the deadline", 2, s(11), true, 1.0, Stop(Deadline)),
            ("not transient", 0, s(0), false, 1.0, Stop(NotTransient)),
            (
                "not transient after retries",
                4,
                s(3),
                false,
                1.0,
                Stop(NotTransient),
            ),
        ];
        for (row, retries, elapsed, transient, jitter, expected) in rows {
            assert_eq!(
                decide(&policy, retries, elapsed, transient, jitter),
                expected,
                "{row}"
            );
        }
        assert_eq!(
            decide(&RetryPolicy::NONE, 0, Duration::ZERO, true, 1.0),
            Stop(Deadline),
            "no policy"
        );
    }

    #[test]
    fn the_blocking_driver_retries_transient_errors_only() {
        let policy = RetryPolicy {
            deadline: Duration::from_secs(5),
            first: MS,
            cap: MS,
        };
        // Two transient failures, then success: two retries heard, the value returned.
        let mut tries = 0;
        let mut heard = Vec::new();
        let got = retry_blocking(
            policy,
            |e: &&str| *e == "transient",
            |r| heard.push((r.number, *r.error)),
            || {
                tries += 1;
                if tries < 3 {
                    Err("transient")
                } else {
                    Ok(tries)
                }
            },
        );
        assert_eq!(got.unwrap(), 3);
        assert_eq!(heard, vec![(1, "transient"), (2, "transient")]);

        // A permanent error after a transient one ends the step at once.
        let mut tries = 0;
        let failed = retry_blocking(
            policy,
            |e: &&str| *e == "transient",
            |_| {},
            || {
                tries += 1;
                Err::<(), _>(if tries == 1 { "transient" } else { "permanent" })
            },
        )
        .unwrap_err();
        assert_eq!(
            (failed.error, failed.why, failed.retries),
            ("permanent", GiveUp::NotTransient, 1)
        );

        // No deadline: the first transient error is returned, with no retry.
        let failed = retry_blocking(
            RetryPolicy::NONE,
            |_: &&str| true,
            |_| panic!("no retry"),
            || Err::<(), _>("transient"),
        )
        .unwrap_err();
        assert_eq!((failed.why, failed.retries), (GiveUp::Deadline, 0));
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
