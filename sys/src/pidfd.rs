//! pidfd_open(2) and pidfd_send_signal(2), by hand through libc: nix 0.29 has no wrapper. A
//! pidfd polls readable once its process has exited (a zombie counts), whoever its parent is:
//! both the shim (its helpers) and the daemon (a shim, reparented to PID 1) sleep on one until
//! an exit instead of polling. A signal sent through one reaches that process or none, never a
//! process that reused its pid.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A pidfd for `pid`. ENOSYS before Linux 5.3; ESRCH when no such process.
pub fn open(pid: i32) -> io::Result<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new fd or -1.
    let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if raw < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd the kernel just returned, owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(raw as i32) })
}

/// Sends `signal` to the process of `pidfd`. ESRCH once it has exited.
pub fn send_signal(pidfd: BorrowedFd<'_>, signal: i32) -> io::Result<()> {
    // SAFETY: pidfd_send_signal takes an fd, a signal number, a null siginfo and flags.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_pidfd_send_signal,
            pidfd.as_raw_fd(),
            signal,
            std::ptr::null::<libc::siginfo_t>(),
            0,
        )
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsFd, AsRawFd};

    #[test]
    fn a_signal_reaches_the_process() {
        let mut child = std::process::Command::new("sleep").arg("100").spawn().unwrap();
        let fd = super::open(child.id() as i32).unwrap();
        super::send_signal(fd.as_fd(), libc::SIGKILL).unwrap();
        let status = child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(status.signal(), Some(libc::SIGKILL));
    }

    #[test]
    fn polls_readable_once_the_process_exits() {
        let mut child = std::process::Command::new("sleep").arg("0.2").spawn().unwrap();
        let fd = super::open(child.id() as i32).unwrap();
        let poll = |timeout_ms| {
            let mut fds = [libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            }];
            unsafe { libc::poll(fds.as_mut_ptr(), 1, timeout_ms) }
        };
        assert_eq!(poll(0), 0, "readable while the process runs");
        assert_eq!(poll(5000), 1, "not readable after the process exited");
        child.wait().unwrap();
        assert_eq!(
            super::send_signal(fd.as_fd(), 0).unwrap_err().raw_os_error(),
            Some(libc::ESRCH),
            "a reaped process takes no signal"
        );
        assert_eq!(super::open(i32::MAX).unwrap_err().raw_os_error(), Some(libc::ESRCH));
    }
}
