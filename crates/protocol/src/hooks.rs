//! Test hooks compiled into the protocol: fault injection at named points of a command, so that
//! tests can stop a process exactly there (like `kill -9`) and prove that a re-run finishes the
//! load exactly once. Nothing here runs in a release build without the `test-hooks` feature.

/// Whether [`crash_point`] can fire in this build: in debug builds (what `cargo test` and the
/// test suites' `target/debug/chpart` are) and with the `test-hooks` feature; never in a
/// release build without it, so no environment variable can make production chpart abort.
pub const CRASH_POINTS: bool = cfg!(any(feature = "test-hooks", debug_assertions));

/// A test-only fault-injection hook: when `CHPART_TEST_CRASH_AT` is `<point>` or
/// `<point>:<n>`, the process aborts (like `kill -9`: no cleanup, no flush) the n-th time (1 by
/// default) it reaches that point. Tests use it to kill `commit` at every step and prove that
/// a re-run finishes exactly once. Compiled out of release builds ([`CRASH_POINTS`]).
#[cfg(not(any(feature = "test-hooks", debug_assertions)))]
#[inline(always)]
pub fn crash_point(_point: &str) {}

/// See the other `crash_point`: this is the one debug and `test-hooks` builds get.
#[cfg(any(feature = "test-hooks", debug_assertions))]
pub fn crash_point(point: &str) {
    use std::sync::atomic::{AtomicU32, Ordering};
    static SEEN: std::sync::Mutex<Vec<(String, u32)>> = std::sync::Mutex::new(Vec::new());
    static ARMED: AtomicU32 = AtomicU32::new(2); // 2 = unknown, 1 = armed, 0 = off
    if ARMED.load(Ordering::Relaxed) == 0 {
        return;
    }
    let Ok(spec) = std::env::var("CHPART_TEST_CRASH_AT") else {
        ARMED.store(0, Ordering::Relaxed);
        return;
    };
    ARMED.store(1, Ordering::Relaxed);
    let (want, nth) = match spec.split_once(':') {
        Some((p, n)) => (p.to_owned(), n.parse().unwrap_or(1)),
        None => (spec, 1),
    };
    if want != point {
        return;
    }
    let mut seen = SEEN.lock().unwrap_or_else(|e| e.into_inner());
    let count = match seen.iter_mut().find(|(p, _)| p == point) {
        Some((_, c)) => {
            *c += 1;
            *c
        }
        None => {
            seen.push((point.to_owned(), 1));
            1
        }
    };
    if count == nth {
        eprintln!(
            "chpart: CHPART_TEST_CRASH_AT={point}:{nth}: aborting here (test fault injection)"
        );
        std::process::abort();
    }
}
