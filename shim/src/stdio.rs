//! Interactive stdio: what the shim writes to a process's stdin, and the terminals it holds.
//!
//! Terminals come from libcontainer's console socket (the OCI `terminal` process field, as runc
//! does it): the process opens a pseudo-terminal in the container's own devpts, makes the slave
//! its controlling terminal and stdio, and sends the master over a unix socket the shim listens
//! on. So `tty` in the container names /dev/pts/0 and /dev/console is the terminal, as with
//! containerd or CRI-O. The shim keeps the master, non-blocking: output is read from it, input
//! written to it, and TIOCSWINSZ on it resizes the terminal.

use std::io::{self, IoSliceMut};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};

use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags, UnixAddr};

/// Input buffered for one stdin (several attach sessions write to the same one). A session whose
/// input does not fit is not read until the process has taken some (see `Input::has_room`).
pub const INPUT_BUFFER: usize = 64 << 10;
/// The end-of-file character when the terminal has none set (^D).
const DEFAULT_VEOF: u8 = 4;

/// A process's stdin as the shim feeds it: the write end of a pipe, or a terminal's master.
/// Writes never block: what the process has not taken yet waits here (bounded by the caller, see
/// `has_room`), and goes out when the descriptor is writable.
pub struct Input {
    /// Non-blocking. None once closed (or the reader is gone).
    fd: Option<OwnedFd>,
    buf: Vec<u8>,
    tty: bool,
    /// No more input is taken; a pipe is closed once `buf` is out.
    closing: bool,
}

impl Input {
    /// `fd`: a pipe's write end or a terminal master, non-blocking.
    pub fn new(fd: OwnedFd, tty: bool) -> Input {
        Input {
            fd: Some(fd),
            buf: Vec::new(),
            tty,
            closing: false,
        }
    }

    /// Still taking input.
    pub fn is_open(&self) -> bool {
        self.fd.is_some() && !self.closing
    }

    /// Takes more input now (else the session's input waits where it is).
    pub fn has_room(&self) -> bool {
        !self.is_open() || self.buf.len() < INPUT_BUFFER
    }

    /// The descriptor to poll for POLLOUT, while something waits to be written.
    pub fn pending_fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().filter(|_| !self.buf.is_empty()).map(|f| f.as_fd())
    }

    /// Queues `data` (dropped once closed) and writes what the process takes now.
    pub fn push(&mut self, data: &[u8]) {
        if !self.is_open() || data.is_empty() {
            return;
        }
        self.buf.extend_from_slice(data);
        self.flush();
    }

    /// The end of input: a pipe is closed (after what is queued), so the process reads EOF; a
    /// terminal gets its end-of-file character (^D), which a program reading lines in canonical
    /// mode sees as EOF (closing the master would hang the terminal up instead).
    pub fn close(&mut self) {
        if !self.is_open() {
            return;
        }
        if self.tty {
            let eof = self.fd.as_ref().map_or(DEFAULT_VEOF, |f| eof_char(f.as_fd()));
            self.buf.push(eof);
        }
        self.closing = true;
        self.flush();
    }

    /// Writes what the descriptor takes. A reader that went away (EPIPE, EIO, or `hangup` from
    /// poll) ends the input: what is queued is dropped.
    pub fn flush(&mut self) {
        let Some(fd) = &self.fd else { return };
        let mut written = 0;
        while written < self.buf.len() {
            let n = unsafe {
                libc::write(
                    fd.as_raw_fd(),
                    self.buf[written..].as_ptr().cast(),
                    self.buf.len() - written,
                )
            };
            if n >= 0 {
                written += n as usize;
                continue;
            }
            match io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => {}
                Some(libc::EAGAIN) => break,
                e => {
                    tracing::debug!(errno = ?e, "stdin reader is gone, dropping its input");
                    self.fd = None;
                    self.buf = Vec::new();
                    return;
                }
            }
        }
        self.buf.drain(..written);
        if self.buf.is_empty() {
            // Mostly idle: give the memory back.
            self.buf = Vec::new();
            if self.closing && !self.tty {
                self.fd = None;
            }
        }
    }

    /// poll said POLLHUP or POLLERR: nobody reads this any more.
    pub fn hang_up(&mut self) {
        self.fd = None;
        self.buf = Vec::new();
    }
}

/// The terminal's end-of-file character (c_cc[VEOF]; the master shares the slave's termios).
fn eof_char(master: BorrowedFd<'_>) -> u8 {
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    if unsafe { libc::tcgetattr(master.as_raw_fd(), &mut t) } == 0 && t.c_cc[libc::VEOF] != 0 {
        t.c_cc[libc::VEOF]
    } else {
        DEFAULT_VEOF
    }
}

/// A terminal size from a request (columns, rows); 0 keeps the kernel's for that dimension.
/// Values beyond u16 are clamped.
pub fn winsize(width: u32, height: u32) -> Option<(u16, u16)> {
    (width > 0 || height > 0).then(|| (clamp16(width), clamp16(height)))
}

fn clamp16(v: u32) -> u16 {
    u16::try_from(v).unwrap_or(u16::MAX)
}

/// Sets the size of the terminal `fd` is on (master or slave): the foreground process group
/// gets SIGWINCH if it changed. A 0 dimension keeps the current one.
pub fn set_winsize(fd: RawFd, (cols, rows): (u16, u16)) -> io::Result<()> {
    let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
    if unsafe { libc::ioctl(fd, libc::TIOCGWINSZ, &mut ws) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if cols > 0 {
        ws.ws_col = cols;
    }
    if rows > 0 {
        ws.ws_row = rows;
    }
    if unsafe { libc::ioctl(fd, libc::TIOCSWINSZ, &ws) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Sets O_NONBLOCK on `fd`.
pub fn set_nonblocking(fd: BorrowedFd<'_>) -> io::Result<()> {
    let flags = nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_GETFL)?;
    let flags = nix::fcntl::OFlag::from_bits_truncate(flags) | nix::fcntl::OFlag::O_NONBLOCK;
    nix::fcntl::fcntl(fd.as_raw_fd(), nix::fcntl::FcntlArg::F_SETFL(flags))?;
    Ok(())
}

/// A stdin pipe: (read end for the process, blocking; write end for the shim, non-blocking).
/// Both close-on-exec (the process dup2s its end onto fd 0).
pub fn input_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)?;
    set_nonblocking(w.as_fd())?;
    Ok((r, w))
}

/// The unix socket a process with a terminal sends its master over (libcontainer's
/// `with_console_socket`). It lives only while the process is being created; the file is removed
/// when this is dropped.
pub struct ConsoleSocket {
    path: PathBuf,
    listener: UnixListener,
}

impl ConsoleSocket {
    /// Listens on `path` (0600; a stale file there is replaced).
    pub fn bind(path: PathBuf) -> io::Result<ConsoleSocket> {
        // sun_path holds 107 bytes and a NUL.
        if path.as_os_str().len() > 107 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("console socket path {path:?} is longer than a unix socket address allows"),
            ));
        }
        let _ = std::fs::remove_file(&path);
        let listener = UnixListener::bind(&path)?;
        let socket = ConsoleSocket { path, listener };
        std::fs::set_permissions(&socket.path, std::fs::Permissions::from_mode(0o600))?;
        socket.listener.set_nonblocking(true)?;
        Ok(socket)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The master the process sent. Never blocks: the process sent it before libcontainer's
    /// create returned, so it is there or it never comes. Close-on-exec and non-blocking.
    pub fn receive(self) -> io::Result<OwnedFd> {
        let (conn, _) = self.listener.accept().map_err(|e| {
            if e.kind() == io::ErrorKind::WouldBlock {
                io::Error::other("the process did not connect to the console socket")
            } else {
                e
            }
        })?;
        let mut name = [0u8; 64];
        let mut iov = [IoSliceMut::new(&mut name)];
        let mut space = nix::cmsg_space!([RawFd; 4]);
        let msg = recvmsg::<UnixAddr>(
            conn.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| io::Error::other(format!("receiving the terminal: {e}")))?;
        let mut master = None;
        for cmsg in msg.cmsgs().map_err(|e| io::Error::other(e.to_string()))? {
            if let ControlMessageOwned::ScmRights(fds) = cmsg {
                for fd in fds {
                    // Owned from here on, so that extra ones are closed.
                    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                    master.get_or_insert(fd);
                }
            }
        }
        let master = master.ok_or_else(|| io::Error::other("the process sent no terminal over the console socket"))?;
        if unsafe { libc::isatty(master.as_raw_fd()) } != 1 {
            return Err(io::Error::other(
                "what the process sent over the console socket is no terminal",
            ));
        }
        set_nonblocking(master.as_fd())?;
        Ok(master)
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Duplicates `fd` (close-on-exec): the terminal master is read, written and resized through
/// separate owners.
pub fn dup(fd: BorrowedFd<'_>) -> io::Result<OwnedFd> {
    fd.try_clone_to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::{Read, Write};
    use std::os::unix::fs::OpenOptionsExt;

    fn pipe() -> (File, OwnedFd) {
        let (r, w) = input_pipe().unwrap();
        set_nonblocking(r.as_fd()).unwrap();
        (File::from(r), w)
    }

    fn read_now(f: &mut File) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = [0u8; 65536];
        loop {
            match f.read(&mut buf) {
                Ok(0) => return out,
                Ok(n) => out.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return out,
                Err(e) => panic!("{e}"),
            }
        }
    }

    /// A pseudo-terminal pair: (master, non-blocking; slave).
    fn pty() -> (OwnedFd, OwnedFd) {
        let master = nix::pty::posix_openpt(nix::fcntl::OFlag::O_RDWR | nix::fcntl::OFlag::O_NOCTTY).unwrap();
        nix::pty::grantpt(&master).unwrap();
        nix::pty::unlockpt(&master).unwrap();
        let name = nix::pty::ptsname_r(&master).unwrap();
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_NOCTTY | libc::O_CLOEXEC)
            .open(name)
            .unwrap();
        let master = unsafe { OwnedFd::from_raw_fd(std::os::fd::IntoRawFd::into_raw_fd(master)) };
        set_nonblocking(master.as_fd()).unwrap();
        (master, slave.into())
    }

    #[test]
    fn pipe_input_is_bounded_and_never_blocks() {
        let (mut r, w) = pipe();
        let mut input = Input::new(w, false);
        assert!(input.has_room() && input.is_open());
        input.push(b"hello ");
        input.push(b"world");
        assert_eq!(read_now(&mut r), b"hello world");
        assert!(input.pending_fd().is_none());
        // More than the pipe holds: the rest waits, and room runs out once the buffer is full.
        let big = vec![b'x'; 1 << 20];
        input.push(&big);
        assert!(input.pending_fd().is_some());
        assert!(!input.has_room());
        let mut got = 0;
        while input.pending_fd().is_some() {
            got += read_now(&mut r).len();
            input.flush();
        }
        got += read_now(&mut r).len();
        assert_eq!(got, big.len());
        assert!(input.has_room());
    }

    #[test]
    fn pipe_close_waits_for_queued_input_then_gives_eof() {
        let (mut r, w) = pipe();
        let mut input = Input::new(w, false);
        let big = vec![b'y'; 200_000];
        input.push(&big);
        input.close();
        assert!(!input.is_open());
        // Further input is dropped.
        input.push(b"late");
        let mut got = Vec::new();
        loop {
            got.extend(read_now(&mut r));
            input.flush();
            if input.pending_fd().is_none() && input.fd.is_none() {
                got.extend(read_now(&mut r));
                break;
            }
        }
        assert_eq!(got.len(), big.len());
        // Write end closed: EOF (read returns 0 with nothing left).
        crate::test_support::wait_readable(r.as_fd());
        let mut buf = [0u8; 1];
        assert_eq!(r.read(&mut buf).unwrap(), 0);
    }

    #[test]
    fn a_reader_that_went_away_ends_the_input() {
        let (r, w) = pipe();
        drop(r);
        let mut input = Input::new(w, false);
        assert!(crate::test_support::eventually(|| {
            input.push(b"nobody reads this");
            !input.is_open()
        }));
        assert!(input.has_room());
        assert!(input.pending_fd().is_none());
    }

    #[test]
    fn terminal_input_close_sends_the_eof_character() {
        let (master, slave) = pty();
        let mut input = Input::new(dup(master.as_fd()).unwrap(), true);
        // Raw mode on the slave: bytes pass as they are (no echo, no line editing).
        let mut t: libc::termios = unsafe { std::mem::zeroed() };
        unsafe {
            libc::tcgetattr(slave.as_raw_fd(), &mut t);
            let veof = t.c_cc[libc::VEOF];
            assert_eq!(veof, 4);
            libc::cfmakeraw(&mut t);
            libc::tcsetattr(slave.as_raw_fd(), libc::TCSANOW, &t);
        }
        input.push(b"ab");
        input.close();
        assert!(!input.is_open());
        // The master stays open (closing it would hang the terminal up).
        assert!(input.fd.is_some());
        set_nonblocking(slave.as_fd()).unwrap();
        let mut s = File::from(slave);
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(read_now(&mut s), b"ab\x04");
    }

    #[test]
    fn winsize_of_a_terminal() {
        let (master, slave) = pty();
        set_winsize(master.as_raw_fd(), (120, 40)).unwrap();
        let mut ws: libc::winsize = unsafe { std::mem::zeroed() };
        unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
        assert_eq!((ws.ws_col, ws.ws_row), (120, 40));
        // 0 keeps a dimension.
        set_winsize(master.as_raw_fd(), (0, 50)).unwrap();
        unsafe { libc::ioctl(slave.as_raw_fd(), libc::TIOCGWINSZ, &mut ws) };
        assert_eq!((ws.ws_col, ws.ws_row), (120, 50));
        assert_eq!(winsize(0, 0), None);
        assert_eq!(winsize(80, 0), Some((80, 0)));
        assert_eq!(winsize(1 << 20, 24), Some((u16::MAX, 24)));
        let (r, _w) = pipe();
        assert!(set_winsize(r.as_raw_fd(), (1, 1)).is_err());
    }

    #[test]
    fn console_socket_receives_a_terminal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("tty-1.sock");
        let socket = ConsoleSocket::bind(path.clone()).unwrap();
        // What libcontainer's init does: connect, send the master with SCM_RIGHTS.
        let (master, slave) = pty();
        let c = std::os::unix::net::UnixStream::connect(socket.path()).unwrap();
        let fds = [master.as_raw_fd()];
        let iov = [std::io::IoSlice::new(b"/dev/ptmx")];
        nix::sys::socket::sendmsg::<UnixAddr>(
            c.as_raw_fd(),
            &iov,
            &[nix::sys::socket::ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .unwrap();
        drop(master);
        let got = socket.receive().unwrap();
        assert!(!path.exists(), "the socket file is removed");
        // The same terminal: what the slave writes, the received master reads.
        File::from(dup(slave.as_fd()).unwrap()).write_all(b"hi").unwrap();
        std::thread::sleep(std::time::Duration::from_millis(50));
        assert_eq!(read_now(&mut File::from(got)), b"hi");

        // Nobody connected, or nothing sent: an error, at once.
        let socket = ConsoleSocket::bind(path.clone()).unwrap();
        assert!(socket.receive().is_err());
        let socket = ConsoleSocket::bind(path.clone()).unwrap();
        let c = std::os::unix::net::UnixStream::connect(socket.path()).unwrap();
        drop(c);
        assert!(socket.receive().is_err());
        assert!(ConsoleSocket::bind(dir.path().join("x".repeat(120))).is_err());
    }
}
