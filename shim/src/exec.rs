//! Exec sessions (ExecSync): a process started in a running container by a libcontainer helper
//! (see `Containers::exec`), whose stdout and stderr are pipes the event loop drains, and whose
//! exit the loop reaps. The request's connection gets its answer when the process has exited and
//! its output has ended; meanwhile the shim serves everything else.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::pb;

/// Output kept per stream unless the request asks for less.
pub const DEFAULT_MAX_OUTPUT: usize = 16 << 20;
/// After the process exited, how long the answer waits for the end of its output (a process it
/// started in the background may hold the pipes open).
const OUTPUT_GRACE: Duration = Duration::from_secs(1);
const READ_CHUNK: usize = 64 << 10;
const READS_PER_WAKE: usize = 16;
/// Reads when everything available is wanted (after an exit): more than a pipe holds, still
/// bounded (other processes may hold the pipe and write on).
const READS_WHEN_ALL: usize = 256;

/// One output stream of an exec: kept up to `max` bytes, the rest read and counted.
pub struct Capture {
    fd: Option<OwnedFd>,
    pub buf: Vec<u8>,
    max: usize,
    pub dropped: u64,
}

impl Capture {
    /// `fd` must be non-blocking.
    pub fn new(fd: OwnedFd, max: usize) -> Self {
        Capture {
            fd: Some(fd),
            buf: Vec::new(),
            max,
            dropped: 0,
        }
    }

    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    pub fn is_open(&self) -> bool {
        self.fd.is_some()
    }

    /// Reads what the pipe holds (a few reads; with `all` until it is empty, still bounded);
    /// closes it at EOF.
    pub fn drain(&mut self, all: bool) {
        let Some(fd) = self.fd.take() else { return };
        let mut pipe = File::from(fd);
        let mut chunk = vec![0u8; READ_CHUNK];
        let mut reads = 0;
        loop {
            match pipe.read(&mut chunk) {
                Ok(0) => return,
                Ok(n) => {
                    let keep = n.min(self.max.saturating_sub(self.buf.len()));
                    self.buf.extend_from_slice(&chunk[..keep]);
                    self.dropped += (n - keep) as u64;
                    reads += 1;
                    if reads >= if all { READS_WHEN_ALL } else { READS_PER_WAKE } {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) => {
                    tracing::warn!(error = %e, "reading exec output");
                    return;
                }
            }
        }
        self.fd = Some(pipe.into());
    }
}

pub struct Exec {
    /// Serial number, for the event loop's bookkeeping.
    pub serial: u64,
    /// The connection waiting for the answer; None once it went away.
    pub conn: Option<u64>,
    pub container: String,
    pub pid: i32,
    pub out: [Capture; 2],
    deadline: Option<Instant>,
    timed_out: bool,
    exit: Option<i32>,
    output_deadline: Option<Instant>,
}

impl Exec {
    pub fn new(
        serial: u64,
        conn: u64,
        container: String,
        pid: i32,
        out: [Capture; 2],
        deadline: Option<Instant>,
    ) -> Self {
        Exec {
            serial,
            conn: Some(conn),
            container,
            pid,
            out,
            deadline,
            timed_out: false,
            exit: None,
            output_deadline: None,
        }
    }

    pub fn exited(&self) -> bool {
        self.exit.is_some()
    }

    /// When the loop must look at this exec again without any event.
    pub fn wake_at(&self) -> Option<Instant> {
        if self.exit.is_some() {
            self.output_deadline
        } else if self.timed_out {
            None
        } else {
            self.deadline
        }
    }

    /// Kills the process once its time is up.
    pub fn check_timeout(&mut self, now: Instant) {
        if self.exit.is_none() && !self.timed_out && self.deadline.is_some_and(|d| now >= d) {
            tracing::info!(container = %self.container, pid = self.pid, "exec timed out, killing it");
            self.timed_out = true;
            self.kill();
        }
    }

    /// SIGKILL, while the process is not reaped (so the pid is still ours).
    pub fn kill(&self) {
        if self.exit.is_none() {
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }

    /// The process was reaped: read what it left in the pipes.
    pub fn on_exit(&mut self, code: i32) {
        self.exit = Some(code);
        self.output_deadline = Some(Instant::now() + OUTPUT_GRACE);
        for c in &mut self.out {
            c.drain(true);
        }
    }

    /// Exited, and its output ended (or stopped waiting for that).
    pub fn is_done(&self, now: Instant) -> bool {
        self.exit.is_some() && (self.out.iter().all(|c| !c.is_open()) || self.output_deadline.is_some_and(|d| now >= d))
    }

    pub fn into_response(mut self) -> pb::ExecResponse {
        for c in &mut self.out {
            c.drain(true);
        }
        let [stdout, stderr] = self.out;
        pb::ExecResponse {
            exit_code: self.exit.unwrap_or(-1),
            stdout: stdout.buf,
            stderr: stderr.buf,
            timed_out: self.timed_out,
            stdout_dropped: stdout.dropped,
            stderr_dropped: stderr.dropped,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn pipe() -> (OwnedFd, File) {
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK).unwrap();
        (r, File::from(w))
    }

    #[test]
    fn capture_caps_and_keeps_draining() {
        let (r, mut w) = pipe();
        let mut c = Capture::new(r, 10);
        w.write_all(b"0123456789abcdef").unwrap();
        c.drain(false);
        assert_eq!(c.buf, b"0123456789");
        assert_eq!(c.dropped, 6);
        assert!(c.is_open());
        w.write_all(b"xyz").unwrap();
        drop(w);
        // Another test's fork may hold a copy of the write end until that child execs: EOF
        // can come a moment later.
        for _ in 0..200 {
            c.drain(false);
            if !c.is_open() {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!((c.dropped, c.is_open()), (9, false));
    }

    #[test]
    fn done_after_exit_and_end_of_output() {
        let (r1, w1) = pipe();
        let (r2, mut w2) = pipe();
        let mut e = Exec::new(
            1,
            7,
            "c".into(),
            i32::MAX,
            [Capture::new(r1, 100), Capture::new(r2, 100)],
            None,
        );
        assert_eq!(e.wake_at(), None);
        w2.write_all(b"err").unwrap();
        drop(w1);
        let now = Instant::now();
        assert!(!e.is_done(now));
        e.on_exit(3);
        // stderr's pipe is still open: wait (bounded) for its end.
        assert!(!e.is_done(Instant::now()));
        assert!(e.wake_at().is_some());
        assert!(e.is_done(Instant::now() + OUTPUT_GRACE));
        drop(w2);
        let r = e.into_response();
        assert_eq!((r.exit_code, r.stderr.as_slice(), r.timed_out), (3, &b"err"[..], false));
    }
}
