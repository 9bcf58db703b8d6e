//! Helpers for the shim's unit tests, which run as threads of one test process while the shim
//! itself is single-threaded.

use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::{Duration, Instant};

/// Set in the process `alone` starts.
const ALONE: &str = "SCUTE_SHIM_TEST_ALONE";

/// Tests that fork (libcontainer's helpers) run in a test process of their own. A fork copies
/// every descriptor the other test threads hold, so their pipes would not see EOF while the copy
/// lives, and every lock they hold, so a panic in the child could wait for ever on a backtrace
/// lock another thread held at the fork. In that process this returns true and the test runs;
/// everywhere else it runs `test` (its full path) there, checks that it ran and passed, and
/// returns false.
pub fn alone(test: &str) -> bool {
    if std::env::var_os(ALONE).is_some() {
        return true;
    }
    let out = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([test, "--exact", "--test-threads=1", "--nocapture"])
        .env(ALONE, "1")
        .output()
        .expect("starting the test binary");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && text.contains("1 passed"),
        "{test}, in a process of its own ({}):\n{text}",
        out.status
    );
    false
}

/// Waits (up to 10 s) until `fd` is readable or at its end. Spawning the process of `alone` gives
/// the child a copy of every descriptor until it execs, so an end of file can come a moment late.
pub fn wait_readable(fd: BorrowedFd<'_>) {
    let mut pfd = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    unsafe { libc::poll(&mut pfd, 1, 10_000) };
}

/// Retries `check` (every 10 ms, up to 10 s) until it holds, for the same reason as
/// `wait_readable`: a peer that went away may be seen as gone a moment late.
pub fn eventually(mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}
