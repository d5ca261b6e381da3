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

/// See the other `crash_point`: this is the one debug and `test-hooks` builds get. It also
/// pauses at the point when `CHPART_TEST_PAUSE_AT` names it (`<point>[:<n>]`, as above): with
/// `CHPART_TEST_PAUSE_DIR=<dir>`, the process creates `<dir>/paused` and waits (at most 120 s)
/// until `<dir>/resume` exists, so that a test injects a fault (a cut network, a killed server)
/// at exactly that step instead of racing the process to it.
#[cfg(any(feature = "test-hooks", debug_assertions))]
pub fn crash_point(point: &str) {
    static CRASH: Trigger = Trigger::new("CHPART_TEST_CRASH_AT");
    static PAUSE: Trigger = Trigger::new("CHPART_TEST_PAUSE_AT");
    if let Some(nth) = PAUSE.reached(point) {
        pause(point, nth);
    }
    if let Some(nth) = CRASH.reached(point) {
        eprintln!(
            "chpart: CHPART_TEST_CRASH_AT={point}:{nth}: aborting here (test fault injection)"
        );
        std::process::abort();
    }
}

/// A variable naming `<point>` or `<point>:<n>`: fires the n-th time (1 by default) the process
/// reaches that point.
#[cfg(any(feature = "test-hooks", debug_assertions))]
struct Trigger {
    var: &'static str,
    seen: std::sync::Mutex<Vec<(String, u32)>>,
    /// 2 = not read yet, 1 = set, 0 = unset.
    armed: std::sync::atomic::AtomicU32,
}

#[cfg(any(feature = "test-hooks", debug_assertions))]
impl Trigger {
    const fn new(var: &'static str) -> Trigger {
        Trigger {
            var,
            seen: std::sync::Mutex::new(Vec::new()),
            armed: std::sync::atomic::AtomicU32::new(2),
        }
    }

    /// `Some(n)` when this call is the n-th at `point` that the variable names.
    fn reached(&self, point: &str) -> Option<u32> {
        use std::sync::atomic::Ordering;
        if self.armed.load(Ordering::Relaxed) == 0 {
            return None;
        }
        let Ok(spec) = std::env::var(self.var) else {
            self.armed.store(0, Ordering::Relaxed);
            return None;
        };
        self.armed.store(1, Ordering::Relaxed);
        let (want, nth) = match spec.split_once(':') {
            Some((p, n)) => (p.to_owned(), n.parse().unwrap_or(1)),
            None => (spec, 1),
        };
        if want != point {
            return None;
        }
        let mut seen = self.seen.lock().unwrap_or_else(|e| e.into_inner());
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
        (count == nth).then_some(nth)
    }
}

#[cfg(any(feature = "test-hooks", debug_assertions))]
fn pause(point: &str, nth: u32) {
    let Ok(dir) = std::env::var("CHPART_TEST_PAUSE_DIR") else {
        eprintln!(
            "chpart: CHPART_TEST_PAUSE_AT={point}:{nth} without CHPART_TEST_PAUSE_DIR: not pausing"
        );
        return;
    };
    let dir = std::path::Path::new(&dir);
    if let Err(e) = std::fs::write(dir.join("paused"), point) {
        eprintln!(
            "chpart: CHPART_TEST_PAUSE_AT={point}:{nth}: cannot write {}/paused: {e}",
            dir.display()
        );
        return;
    }
    eprintln!(
        "chpart: CHPART_TEST_PAUSE_AT={point}:{nth}: paused until {}/resume exists",
        dir.display()
    );
    let until = std::time::Instant::now() + std::time::Duration::from_secs(120);
    while !dir.join("resume").exists() && std::time::Instant::now() < until {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A test-only shift of this machine's clock: `CHPART_TEST_CLOCK_SKEW_SECS=<n>` (may be
/// negative) makes [`crate::store::now_unix_ms`] read `n` seconds ahead of the real clock, as
/// on a driver whose clock is off the server's. Tests use it to prove that every age the
/// protocol decides on is measured on the server's clock. Always 0 where [`CRASH_POINTS`] is
/// false (a release build without `test-hooks`), so no environment variable can skew
/// production chpart.
pub fn clock_skew_ms() -> i64 {
    if !CRASH_POINTS {
        return 0;
    }
    static SKEW: std::sync::OnceLock<i64> = std::sync::OnceLock::new();
    *SKEW.get_or_init(|| {
        std::env::var("CHPART_TEST_CLOCK_SKEW_SECS")
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .map_or(0, |secs| secs.saturating_mul(1000))
    })
}
