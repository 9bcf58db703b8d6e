//! Exec'd processes: started in a running container by a libcontainer helper (see
//! `Containers::exec`), their output read by the event loop, their exit reaped by it.
//!
//! - ExecSync (`Exec`): stdout and stderr are captured; the request's connection gets its answer
//!   when the process has exited and its output has ended; meanwhile the shim serves everything
//!   else.
//! - ExecStream (`StreamExec`): stdio is a session. Output is framed onto the session as it is
//!   read, but only as fast as the session takes it (the process waits on a full pipe, the shim
//!   never does); stdin comes from the session; the session ends with the exit.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::time::{Duration, Instant};

use crate::pb::{self, session_output};
use crate::stdio::{self, Input};

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
            if self.timed_out {
                // A timeout is an error to the caller (the kubelet's probe sees DeadlineExceeded
                // and no output): up to twice 16 MiB of a flood need not cross to the daemon.
                c.dropped += c.buf.len() as u64;
                c.buf = Vec::new();
            }
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

/// Output frames for sessions: (connection, frame). The event loop queues them on the
/// connections; an exit frame is a session's last.
pub type Outbox = Vec<(u64, session_output::Kind)>;

/// After the process exited, at most this much more output is read for its session at once,
/// whether the session keeps up or not (what is left in a pipe or terminal is bounded anyway).
const FINAL_OUTPUT: usize = 1 << 20;

/// Reads from `fd` (non-blocking) up to `limit` bytes, handing each chunk to `chunk`. Closes it
/// at EOF (or EIO: a terminal master whose slave is closed everywhere).
fn read_limited(fd: &mut Option<OwnedFd>, limit: usize, chunk: &mut dyn FnMut(&[u8])) {
    let Some(f) = fd.take() else { return };
    let mut pipe = File::from(f);
    let mut buf = vec![0u8; READ_CHUNK.min(limit.max(1))];
    let mut left = limit;
    let mut reads = 0;
    while left > 0 && reads < READS_PER_WAKE {
        let want = left.min(buf.len());
        match pipe.read(&mut buf[..want]) {
            Ok(0) => return,
            Ok(n) => {
                chunk(&buf[..n]);
                left -= n;
                reads += 1;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(e) if e.raw_os_error() == Some(libc::EIO) => return,
            Err(e) => {
                tracing::warn!(error = %e, "reading exec output");
                return;
            }
        }
    }
    *fd = Some(pipe.into());
}

/// An ExecStream process and its session.
pub struct StreamExec {
    pub serial: u64,
    /// The session's connection; None once it went away (the process is killed then).
    pub conn: Option<u64>,
    pub container: String,
    pub pid: i32,
    /// stdout and stderr pipes; with a terminal, its master as stdout and no stderr.
    out: [Option<OwnedFd>; 2],
    /// Fed from the session (None: stdin is /dev/null, or the terminal nobody writes to).
    pub stdin: Option<Input>,
    /// The terminal's master, for resizes.
    tty: Option<OwnedFd>,
    exit: Option<i32>,
    output_deadline: Option<Instant>,
}

impl StreamExec {
    /// `out` non-blocking; `tty`: the master (then `out` holds a copy of it as stdout).
    pub fn new(
        serial: u64,
        conn: u64,
        container: String,
        pid: i32,
        out: [Option<OwnedFd>; 2],
        stdin: Option<Input>,
        tty: Option<OwnedFd>,
    ) -> Self {
        StreamExec {
            serial,
            conn: Some(conn),
            container,
            pid,
            out,
            stdin,
            tty,
            exit: None,
            output_deadline: None,
        }
    }

    pub fn exited(&self) -> bool {
        self.exit.is_some()
    }

    pub fn out_fds(&self) -> impl Iterator<Item = (usize, BorrowedFd<'_>)> {
        self.out
            .iter()
            .enumerate()
            .filter_map(|(i, f)| f.as_ref().map(|f| (i, f.as_fd())))
    }

    /// Reads output stream `i`, at most `room` bytes, into frames for the session (dropped if
    /// the session is gone).
    pub fn read(&mut self, i: usize, room: usize, outbox: &mut Outbox) {
        let conn = self.conn;
        let limit = if conn.is_some() { room } else { usize::MAX };
        if let Some(fd) = self.out.get_mut(i) {
            read_limited(fd, limit, &mut |chunk| {
                if let Some(conn) = conn {
                    outbox.push((conn, output_frame(i, chunk)));
                }
            });
        }
    }

    /// The client's terminal size changed (nothing without a terminal).
    pub fn resize(&self, width: u32, height: u32) {
        if let (Some(master), Some(ws)) = (&self.tty, stdio::winsize(width, height)) {
            if let Err(e) = stdio::set_winsize(master.as_raw_fd(), ws) {
                tracing::debug!(pid = self.pid, error = %e, "resizing an exec's terminal");
            }
        }
    }

    /// SIGKILL, while the process is not reaped (so the pid is still ours).
    pub fn kill(&self) {
        if self.exit.is_none() {
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }

    /// The session went away: nobody wants the process any more.
    pub fn abandon(&mut self) {
        self.conn = None;
        self.stdin = None;
        self.kill();
    }

    /// The process was reaped.
    pub fn on_exit(&mut self, code: i32) {
        self.exit = Some(code);
        self.output_deadline = Some(Instant::now() + OUTPUT_GRACE);
        self.stdin = None;
    }

    /// When the loop must look at this exec again without any event.
    pub fn wake_at(&self) -> Option<Instant> {
        self.output_deadline
    }

    /// Exited, and its output ended (or stopped waiting for that: something it started in the
    /// background holds the pipes), or nobody wants it any more.
    pub fn is_done(&self, now: Instant) -> bool {
        self.exit.is_some()
            && (self.conn.is_none()
                || self.out.iter().all(|f| f.is_none())
                || self.output_deadline.is_some_and(|d| now >= d))
    }

    /// Frames what is left (bounded) and the exit, for the session.
    pub fn finish(mut self, outbox: &mut Outbox) {
        if self.conn.is_some() {
            for i in 0..self.out.len() {
                self.read(i, FINAL_OUTPUT, outbox);
            }
        }
        let code = self.exit.unwrap_or(-1);
        tracing::info!(container = %self.container, serial = self.serial, pid = self.pid, exit_code = code, "exec session finished");
        if let Some(conn) = self.conn {
            outbox.push((conn, session_output::Kind::Exit(pb::SessionExit { exit_code: code })));
        }
    }
}

/// A frame carrying output of stream `i` (0: stdout, 1: stderr).
pub fn output_frame(i: usize, chunk: &[u8]) -> session_output::Kind {
    if i == 0 {
        session_output::Kind::Stdout(chunk.to_vec())
    } else {
        session_output::Kind::Stderr(chunk.to_vec())
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

    #[test]
    fn stream_output_is_read_as_far_as_the_session_takes_it() {
        let (r1, mut w1) = pipe();
        let (r2, mut w2) = pipe();
        let mut x = StreamExec::new(1, 7, "c".into(), i32::MAX, [Some(r1), Some(r2)], None, None);
        w1.write_all(&[b'o'; 1000]).unwrap();
        w2.write_all(b"err").unwrap();
        let mut outbox = Outbox::new();
        x.read(0, 300, &mut outbox);
        x.read(1, 300, &mut outbox);
        let total = |o: &Outbox, stdout: bool| -> usize {
            o.iter()
                .map(|(conn, k)| {
                    assert_eq!(*conn, 7);
                    match k {
                        session_output::Kind::Stdout(b) if stdout => b.len(),
                        session_output::Kind::Stderr(b) if !stdout => b.len(),
                        _ => 0,
                    }
                })
                .sum()
        };
        assert_eq!((total(&outbox, true), total(&outbox, false)), (300, 3));
        // Nothing read without room; the rest stays in the pipe.
        outbox.clear();
        x.read(0, 0, &mut outbox);
        assert!(outbox.is_empty());
        assert!(!x.is_done(Instant::now()));
        drop(w2);
        x.on_exit(3);
        assert!(!x.is_done(Instant::now()), "stdout is still open");
        drop(w1);
        // Another test's fork may hold a copy of the write ends for a moment.
        let deadline = Instant::now() + Duration::from_secs(2);
        while !x.is_done(Instant::now()) && Instant::now() < deadline {
            x.read(1, 100, &mut outbox);
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(x.is_done(Instant::now() + OUTPUT_GRACE));
        // What is left comes before the exit, the exit last.
        outbox.clear();
        x.finish(&mut outbox);
        assert_eq!(total(&outbox, true), 700);
        assert_eq!(
            outbox.last().unwrap().1,
            session_output::Kind::Exit(pb::SessionExit { exit_code: 3 })
        );
    }

    #[test]
    fn abandoned_stream_is_drained_without_frames() {
        let (r1, mut w1) = pipe();
        let mut x = StreamExec::new(1, 7, "c".into(), i32::MAX, [Some(r1), None], None, None);
        x.conn = None;
        w1.write_all(b"nobody listens").unwrap();
        let mut outbox = Outbox::new();
        x.read(0, 0, &mut outbox);
        assert!(outbox.is_empty());
        x.on_exit(137);
        assert!(x.is_done(Instant::now()));
        x.finish(&mut outbox);
        assert!(outbox.is_empty());
    }
}
