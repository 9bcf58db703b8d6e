//! The fork helper: libcontainer's work runs in a short-lived forked child of the shim, never in
//! the shim itself (its code and heap stay out of the long-lived shim, a panic in it cannot take
//! the shim down), and answers over a pipe.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::api_error::ApiError;
use crate::exits::exit_of;
use crate::pb::ErrorCode;

/// How long one libcontainer operation may take before its helper is killed.
const HELPER_TIMEOUT: Duration = Duration::from_secs(90);
/// Longest error message a helper sends back (the pipe must hold the whole answer).
const MAX_HELPER_MESSAGE: usize = 16 << 10;

/// What a helper sends back: the result, JSON, in one write to a pipe.
#[derive(Serialize, Deserialize)]
enum HelperAnswer<T> {
    Ok(T),
    Err { code: i32, message: String },
}

/// Runs `f` (libcontainer work) in a forked child of the shim and returns its result. The shim is
/// single-threaded, so the child is a faithful copy; it exits right after answering. The child
/// keeps only stdio, its answer pipe and `keep` open.
pub(crate) fn in_helper<T, F>(what: &str, keep: &[RawFd], f: F) -> Result<T, ApiError>
where
    T: Serialize + DeserializeOwned,
    F: FnOnce() -> Result<T, ApiError>,
{
    in_helper_group(what, keep, HELPER_TIMEOUT, false, f)
}

/// `in_helper` with its own time limit; with `own_group` the helper leads a process group of its
/// own and a timeout kills the whole group: what the helper started for the operation (CRIU's
/// `criu swrk`) must not outlive it and keep working on a container.
pub(crate) fn in_helper_group<T, F>(
    what: &str,
    keep: &[RawFd],
    timeout: Duration,
    own_group: bool,
    f: F,
) -> Result<T, ApiError>
where
    T: Serialize + DeserializeOwned,
    F: FnOnce() -> Result<T, ApiError>,
{
    let (rx, tx) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
        .map_err(|e| ApiError::internal(format!("{what}: pipe: {e}")))?;
    match unsafe { fork() } {
        Err(e) => Err(ApiError::internal(format!("{what}: fork: {e}"))),
        Ok(ForkResult::Child) => {
            drop(rx);
            // The shim's sockets and signalfd must not live on in what libcontainer starts (a
            // created container's init keeps its descriptors until it execs, maybe long after
            // the shim is gone, and would keep the shim's socket answering connects).
            let mut keep = keep.to_vec();
            keep.push(tx.as_raw_fd());
            close_fds_except(&keep);
            unsafe { libc::prctl(libc::PR_SET_NAME, c"shim-helper".as_ptr(), 0, 0, 0) };
            if own_group {
                let _ = nix::unistd::setpgid(Pid::from_raw(0), Pid::from_raw(0));
            }
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).unwrap_or_else(|_| {
                Err(ApiError::internal(format!(
                    "{what}: libcontainer panicked (see shim.log)"
                )))
            });
            let answer = match result {
                Ok(v) => HelperAnswer::Ok(v),
                Err(mut e) => {
                    if e.message.len() > MAX_HELPER_MESSAGE {
                        let mut cut = MAX_HELPER_MESSAGE;
                        while !e.message.is_char_boundary(cut) {
                            cut -= 1;
                        }
                        e.message.truncate(cut);
                    }
                    HelperAnswer::Err {
                        code: e.code as i32,
                        message: e.message,
                    }
                }
            };
            let body = serde_json::to_vec(&answer).unwrap_or_default();
            let _ = File::from(tx).write_all(&body);
            // No destructors, no atexit handlers: this is a copy of the shim.
            unsafe { libc::_exit(0) }
        }
        Ok(ForkResult::Parent { child }) => {
            drop(tx);
            if own_group {
                // Also here: a timeout must find the group even if the child has not run yet.
                let _ = nix::unistd::setpgid(child, child);
            }
            let started = Instant::now();
            let status = wait_helper(child, what, timeout, own_group);
            let timed_out = started.elapsed() >= timeout;
            // Only after the helper exited: processes it started (a created container's init,
            // waiting for its start) may still hold the pipe's write end, so EOF may never come.
            read_available(rx)
                .ok()
                .filter(|b| !b.is_empty())
                .and_then(|b| serde_json::from_slice::<HelperAnswer<T>>(&b).ok())
                .map(|answer| match answer {
                    HelperAnswer::Ok(v) => Ok(v),
                    HelperAnswer::Err { code, message } => Err(ApiError::new(
                        ErrorCode::try_from(code).unwrap_or(ErrorCode::Internal),
                        message,
                    )),
                })
                .unwrap_or_else(|| {
                    Err(ApiError::internal(if timed_out {
                        format!("{what}: took longer than {timeout:?} and was stopped (SIGKILL); see shim.log")
                    } else {
                        format!("{what}: libcontainer helper ended without an answer ({status:?}); see shim.log")
                    }))
                })
        }
    }
}

/// Waits for a helper, killing it (with `group`, its process group) after `timeout`. Only this
/// pid is reaped: other children are the event loop's.
fn wait_helper(child: Pid, what: &str, timeout: Duration, group: bool) -> Option<WaitStatus> {
    let deadline = Instant::now() + timeout;
    let kill = || {
        tracing::error!(what, "libcontainer helper timed out, killing it");
        let target = if group { Pid::from_raw(-child.as_raw()) } else { child };
        let _ = nix::sys::signal::kill(target, Signal::SIGKILL);
    };
    let mut killed = false;
    if !await_exit(child, deadline) {
        kill();
        killed = true;
    }
    // Reaps it: at once after a pidfd said it exited; polling where pidfds are not there.
    let mut nap = Duration::from_micros(100);
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => {}
            Ok(status) if exit_of(status).is_some() => {
                if killed && group {
                    until_group_exited(child, GROUP_EXIT_WAIT);
                }
                return Some(status);
            }
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "waiting for the libcontainer helper");
                return None;
            }
        }
        if !killed && Instant::now() >= deadline {
            kill();
            killed = true;
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(5));
    }
}

/// How long a killed helper's group is given to exit (CRIU at a dump's deadline).
const GROUP_EXIT_WAIT: Duration = Duration::from_secs(5);

/// Waits, up to `limit`, until nothing of process group `pgid` is alive (zombies have exited).
/// What the helper started, CRIU at a dump's deadline, is killed with it but exits on its own
/// time, and the container's processes CRIU seized stay in a tracing stop until it has: the
/// answer that the dump was stopped must not come before they run again. Its zombie is reaped
/// later, by the event loop (the shim is the subreaper).
fn until_group_exited(pgid: Pid, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let live = procfs::process::all_processes().map(|all| {
            all.flatten()
                .filter_map(|p| p.stat().ok())
                .any(|s| s.pgrp == pgid.as_raw() && !matches!(s.state, 'Z' | 'X'))
        });
        match live {
            Ok(true) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(5)),
            Ok(true) => {
                tracing::warn!(pgid = pgid.as_raw(), "a killed helper's process group is still alive");
                return;
            }
            _ => return,
        }
    }
}

/// Sleeps until `child` exits (true) or `deadline` passes (false), on a pidfd: the exit wakes it
/// at once, where polling waitpid with naps cost each libcontainer operation 1-3 ms. True at once
/// when the kernel has no pidfd_open (before 5.3): the caller's polling loop then waits.
pub(crate) fn await_exit(child: Pid, deadline: Instant) -> bool {
    let Ok(pidfd) = scute_sys::pidfd::open(child.as_raw()) else {
        return true;
    };
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        let mut fds = [libc::pollfd {
            fd: pidfd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        }];
        let millis = left.as_millis().clamp(1, i32::MAX as u128) as i32;
        match unsafe { libc::poll(fds.as_mut_ptr(), 1, millis) } {
            n if n > 0 => return true,
            0 => {}
            _ if Errno::last() == Errno::EINTR => {}
            _ => return true,
        }
    }
}

fn close_fds_except(keep: &[RawFd]) {
    let fds: Vec<RawFd> = match fs::read_dir("/proc/self/fd") {
        Ok(dir) => dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect(),
        Err(_) => return,
    };
    for fd in fds {
        if fd > 2 && !keep.contains(&fd) {
            unsafe { libc::close(fd) };
        }
    }
}

fn read_available(rx: OwnedFd) -> std::io::Result<Vec<u8>> {
    nix::fcntl::fcntl(
        std::os::fd::AsRawFd::as_raw_fd(&rx),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )?;
    let mut f = File::from(rx);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match f.read(&mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Ok(out),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn helper_answers() {
        if !crate::test_support::alone("helper::tests::helper_answers") {
            return;
        }
        assert_eq!(in_helper("t", &[], || Ok(42u32)).unwrap(), 42);
        let e = in_helper::<(), _>("t", &[], || {
            Err(ApiError::new(ErrorCode::AlreadyExists, "x".repeat(100_000)))
        })
        .unwrap_err();
        assert_eq!(e.code, ErrorCode::AlreadyExists);
        assert_eq!(e.message.len(), MAX_HELPER_MESSAGE);
        let e = in_helper::<(), _>("t", &[], || panic!("boom")).unwrap_err();
        assert_eq!(e.code, ErrorCode::Internal);
        assert!(e.message.contains("panicked"), "{}", e.message);
        let e = in_helper::<(), _>("t", &[], || unsafe { libc::_exit(3) }).unwrap_err();
        assert!(e.message.contains("without an answer"), "{}", e.message);
    }

    #[test]
    fn helper_answer_does_not_wait_for_its_descendants() {
        if !crate::test_support::alone("helper::tests::helper_answer_does_not_wait_for_its_descendants") {
            return;
        }
        // A grandchild that keeps the pipe's write end open (as a created container's init does)
        // must not hold up the answer.
        let started = Instant::now();
        let v = in_helper("t", &[], || {
            if let Ok(ForkResult::Child) = unsafe { fork() } {
                std::thread::sleep(Duration::from_secs(3));
                unsafe { libc::_exit(0) }
            }
            Ok(7u8)
        })
        .unwrap();
        assert_eq!(v, 7);
        assert!(started.elapsed() < Duration::from_secs(2));
    }
}
