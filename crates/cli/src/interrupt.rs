//! Ctrl-C for commands that report what they measured when interrupted
//! (`bench`): the first Ctrl-C (SIGINT) only raises a flag that their loops
//! poll; a second one ends the process at once, as usual. Elsewhere
//! (non-Unix) Ctrl-C keeps its default effect.

use std::sync::atomic::{AtomicBool, Ordering};

static REQUESTED: AtomicBool = AtomicBool::new(false);

/// The error of a command stopped by Ctrl-C after printing what it had;
/// the process exits with 130 (128 + SIGINT), as shells expect.
#[derive(Debug)]
pub struct Interrupted;

impl std::fmt::Display for Interrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("interrupted (Ctrl-C); the results above are what was measured before it")
    }
}

impl std::error::Error for Interrupted {}

/// Whether Ctrl-C was pressed since [`catch`].
pub fn requested() -> bool {
    REQUESTED.load(Ordering::Relaxed)
}

#[cfg(unix)]
extern "C" fn on_sigint(_: libc::c_int) {
    // Only async-signal-safe calls here: an atomic swap and _exit.
    if REQUESTED.swap(true, Ordering::Relaxed) {
        // SAFETY: _exit is async-signal-safe and takes no pointers.
        unsafe { libc::_exit(130) };
    }
}

/// From now on, Ctrl-C sets [`requested`] instead of ending the process.
pub fn catch() {
    #[cfg(unix)]
    {
        let handler = on_sigint as extern "C" fn(libc::c_int);
        // SAFETY: the handler only touches an atomic and calls _exit, both
        // async-signal-safe; installing it has no other precondition.
        unsafe { libc::signal(libc::SIGINT, handler as libc::sighandler_t) };
    }
}
