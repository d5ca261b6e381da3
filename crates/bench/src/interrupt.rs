//! Ctrl-C and SIGTERM as a flag, so an interrupted benchmark still cleans up.
//!
//! The benchmark owns a ClickHouse server, an sshd and gigabytes of files in a temporary
//! directory. Dying on the default SIGINT action would skip every destructor: the services stop
//! on their own (they watch a pipe from this process), but the files would stay. With the
//! handler installed, long loops (generation, waiting for a child) poll [`requested`], kill
//! what they started and return an error, and the normal unwinding removes the rest.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    // Only an atomic store: anything more is not async-signal-safe.
    REQUESTED.store(true, Ordering::SeqCst);
}

/// Routes SIGINT and SIGTERM to the flag. Call once, early in `main`.
pub fn install() {
    let handler: extern "C" fn(libc::c_int) = on_signal;
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(signal, handler as libc::sighandler_t);
        }
    }
}

/// Whether an interrupt arrived.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}
