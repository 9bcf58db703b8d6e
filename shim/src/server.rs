//! The shim's event loop: one thread, one `poll` over the SIGCHLD signalfd, the listening socket,
//! the open connections and the containers' descriptors (output pipes and terminals, stdins with
//! input waiting, execs). Requests are handled one at a time, to completion, except Exec: its
//! connection waits (gets no other answer) while the loop serves everything else, and gets its
//! answer when the process has exited. Answers are queued per connection and written as the peer
//! takes them, so a slow reader (or a 32 MiB exec answer) does not hold up the loop.
//!
//! A connection whose ExecStream or Attach succeeded becomes a session (and serves no request
//! again): SessionInput frames from it go to containers/, SessionOutput frames that containers/
//! produces are queued on it. A session's output queue is bounded: an exec's output is read only
//! as far as its session takes it (the process waits), an attach session more than
//! SESSION_MAX_QUEUED behind is closed (a container never waits for a session). After the exit
//! frame the shim closes the session once it is sent.
//!
//! A connection whose SubscribeExits was answered gets a ContainerExit frame for every container
//! exit reaped from then on (queued like answers: a subscriber that stops reading is dropped).

use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signalfd::SignalFd;
use nix::sys::socket::{send, MsgFlags};

use crate::containers::{ApiError, Containers, CreateOptions, Source};
use crate::frame::{self, FrameReader};
use crate::memory;
use crate::pb::{self, request, response, session_output, ErrorCode};

/// More connections than this means someone leaks them; new ones are closed at once. (Each exec
/// in flight and each session holds one.)
const MAX_CONNECTIONS: usize = 64;
/// A peer that takes none of its pending answer for this long is dropped (not sessions: an
/// exec's output waits for its client as long as it takes).
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection with this much answer unsent gets no further request served until it reads.
const MAX_QUEUED: usize = 1 << 20;
/// Output queued for a session: an exec's is not read further, an attach session is dropped.
const SESSION_MAX_QUEUED: usize = 1 << 20;
/// One read of session input; the next waits for the next wake-up (bounds what is buffered).
const SESSION_READ: usize = 32 << 10;

pub struct Server {
    pub sandbox_id: String,
    pub state_dir: PathBuf,
    pub listener: UnixListener,
    pub sigchld: SignalFd,
    pub containers: Containers,
    conns: Vec<Conn>,
    next_conn: u64,
    exit_requested: bool,
}

struct Conn {
    id: u64,
    stream: UnixStream,
    reader: FrameReader,
    /// Encoded answers not yet sent, from `sent` on.
    out: Vec<u8>,
    sent: usize,
    /// Since when `out` has been waiting without progress.
    stalled_since: Option<Instant>,
    mode: Mode,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Requests, answered in order.
    Requests,
    /// An Exec's answer is pending: no other request is served on this connection until then.
    Waiting,
    /// A streaming session (ExecStream, Attach).
    Session(Session),
    /// An exit subscription: ContainerExit frames out, nothing in.
    Exits,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Session {
    attach: bool,
    /// The peer shut its writing side: no more input (taken as CloseStdin once the frames before
    /// it are handled).
    input_eof: bool,
    /// That CloseStdin was handed on.
    input_ended: bool,
    /// The exit frame is queued: the connection closes once it is sent.
    closing: bool,
}

impl Conn {
    fn queued(&self) -> usize {
        self.out.len() - self.sent
    }

    /// Sends what the socket takes now. Err when the peer is gone.
    fn flush(&mut self) -> io::Result<()> {
        let mut progressed = false;
        while self.sent < self.out.len() {
            match send(
                std::os::fd::AsRawFd::as_raw_fd(&self.stream),
                &self.out[self.sent..],
                MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
            ) {
                Ok(n) => {
                    self.sent += n;
                    progressed = true;
                }
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => break,
                Err(e) => return Err(e.into()),
            }
        }
        if self.sent == self.out.len() {
            // Answers can be large (exec output): give the memory back.
            self.out = Vec::new();
            self.sent = 0;
            self.stalled_since = None;
        } else {
            if progressed || self.stalled_since.is_none() {
                self.stalled_since = Some(Instant::now());
            }
            if self.sent >= self.out.len() / 2 {
                // A long-lived session's queue: drop what is sent.
                self.out.drain(..self.sent);
                self.sent = 0;
            }
        }
        Ok(())
    }

    fn queue(&mut self, resp: &pb::Response) -> io::Result<()> {
        frame::encode_to(resp, &mut self.out);
        self.flush()
    }

    fn session(&self) -> Option<Session> {
        match self.mode {
            Mode::Session(s) => Some(s),
            _ => None,
        }
    }

    /// How much more session output this connection takes now.
    fn room(&self) -> usize {
        SESSION_MAX_QUEUED.saturating_sub(self.queued())
    }
}

/// How a request was handled.
enum Handled {
    Answer(pb::Response),
    /// An exec's answer comes later.
    Pending,
    /// The answer, after which the connection is a session.
    Session {
        answer: pb::Response,
        attach: bool,
    },
    /// The answer, after which the connection is an exit subscription.
    Exits(pb::Response),
}

/// poll(2) on raw pollfds: nix's PollFd drops revents with bits it does not name (POLLRDHUP).
/// `timeout_ms` -1: no timeout.
fn poll_raw(fds: &mut [libc::pollfd], timeout_ms: i32) -> Result<usize, Errno> {
    let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
    Errno::result(n).map(|n| n as usize)
}

fn pollfd(fd: impl AsFd, events: i16) -> libc::pollfd {
    libc::pollfd {
        fd: fd.as_fd().as_raw_fd(),
        events,
        revents: 0,
    }
}

/// What a polled descriptor is.
enum Slot {
    Sigchld,
    Listener,
    Conn(u64),
    Output(Source),
}

impl Server {
    pub fn new(
        sandbox_id: String,
        state_dir: PathBuf,
        listener: UnixListener,
        sigchld: SignalFd,
        containers: Containers,
    ) -> Self {
        Server {
            sandbox_id,
            state_dir,
            listener,
            sigchld,
            containers,
            conns: Vec::new(),
            next_conn: 1,
            exit_requested: false,
        }
    }

    /// Serves until a Shutdown has been answered.
    pub fn run(&mut self) {
        // Trim once after start, then whenever activity has settled (see memory.rs).
        let mut last_activity = Instant::now();
        let mut trimmed = false;
        while !self.exit_requested {
            let now = Instant::now();
            let mut wake = self.containers.next_wake();
            for c in self.conns.iter().filter(|c| c.session().is_none()) {
                if let Some(since) = c.stalled_since {
                    wake = Some(wake.map_or(since + WRITE_TIMEOUT, |w| w.min(since + WRITE_TIMEOUT)));
                }
            }
            if !trimmed {
                let at = last_activity + memory::SETTLE;
                wake = Some(wake.map_or(at, |w| w.min(at)));
            }
            let timeout_ms = match wake {
                None => -1,
                // Rounded up, so that the deadline has passed when poll returns.
                Some(at) => at
                    .saturating_duration_since(now)
                    .as_micros()
                    .div_ceil(1000)
                    .min(i32::MAX as u128) as i32,
            };

            let mut slots = Vec::with_capacity(2 + self.conns.len());
            let mut fds = Vec::with_capacity(2 + self.conns.len());
            slots.push(Slot::Sigchld);
            fds.push(pollfd(&self.sigchld, libc::POLLIN));
            slots.push(Slot::Listener);
            fds.push(pollfd(&self.listener, libc::POLLIN));
            for c in &self.conns {
                let mut events = match c.mode {
                    Mode::Requests => libc::POLLIN,
                    // While an exec runs, only watch for the peer going away.
                    Mode::Waiting | Mode::Exits => libc::POLLRDHUP,
                    // Input only while its stdin takes more and nothing read waits; POLLHUP
                    // (the peer closed) comes anyway.
                    Mode::Session(s) => {
                        if !s.input_eof
                            && !s.closing
                            && !c.reader.has_frame()
                            && self.containers.session_input_room(c.id)
                        {
                            libc::POLLIN
                        } else {
                            0
                        }
                    }
                };
                if c.queued() > 0 {
                    events |= libc::POLLOUT;
                }
                slots.push(Slot::Conn(c.id));
                fds.push(pollfd(&c.stream, events));
            }
            let conns = &self.conns;
            let room = |id: u64| conns.iter().find(|c| c.id == id).map_or(usize::MAX, Conn::room);
            for (source, fd, events) in self.containers.poll_sources(&room) {
                slots.push(Slot::Output(source));
                fds.push(pollfd(fd, events));
            }
            let n = match poll_raw(&mut fds, timeout_ms) {
                Ok(n) => n,
                Err(Errno::EINTR) => 0,
                Err(e) => {
                    tracing::error!(error = %e, "poll");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            let ready: Vec<i16> = fds.iter().map(|f| f.revents).collect();
            drop(fds);
            if n > 0 {
                last_activity = Instant::now();
                trimmed = false;
            }

            let mut accept = false;
            for (slot, &revents) in slots.iter().zip(&ready) {
                if revents == 0 {
                    continue;
                }
                match slot {
                    Slot::Sigchld => {
                        while let Ok(Some(_)) = self.sigchld.read_signal() {}
                        self.containers.reap();
                    }
                    Slot::Listener => accept = true,
                    Slot::Output(source) => {
                        let conns = &self.conns;
                        let room = |id: u64| conns.iter().find(|c| c.id == id).map_or(usize::MAX, Conn::room);
                        self.containers.on_ready(source, revents, &room);
                    }
                    Slot::Conn(_) => {}
                }
            }
            self.deliver();
            for (slot, &revents) in slots.iter().zip(&ready) {
                if let Slot::Conn(id) = slot {
                    if revents != 0 {
                        if let Some(i) = self.conn_index(*id) {
                            if !self.on_conn_event(i, revents) {
                                self.close_conn(i);
                            }
                        }
                    }
                }
                if self.exit_requested {
                    return;
                }
            }
            // Execs reaped and output read while a request was handled; session input that
            // waited for room in a stdin.
            self.deliver();
            self.pump_sessions();
            self.deliver();
            self.drop_stalled();
            if accept {
                self.accept();
            }
            if !trimmed && last_activity.elapsed() >= memory::SETTLE && self.conns.iter().all(|c| c.queued() == 0) {
                memory::trim();
                trimmed = true;
            }
        }
    }

    fn conn_index(&self, id: u64) -> Option<usize> {
        self.conns.iter().position(|c| c.id == id)
    }

    fn close_conn(&mut self, i: usize) {
        let c = self.conns.remove(i);
        match c.mode {
            Mode::Requests => {}
            Mode::Waiting => self.containers.abandon_execs(c.id),
            Mode::Session(_) => self.containers.session_closed(c.id),
            Mode::Exits => {}
        }
        tracing::debug!(conn = c.id, "connection closed");
    }

    fn drop_stalled(&mut self) {
        for i in (0..self.conns.len()).rev() {
            let c = &self.conns[i];
            if c.session().is_none() && c.stalled_since.is_some_and(|s| s.elapsed() >= WRITE_TIMEOUT) {
                tracing::warn!(
                    conn = self.conns[i].id,
                    "peer does not read its answers, closing the connection"
                );
                self.close_conn(i);
            }
        }
    }

    /// Queues what the containers have for connections: exec answers, session output.
    fn deliver(&mut self) {
        self.deliver_exec_answers();
        self.containers.finish_streams();
        self.deliver_session_output();
        self.deliver_exits();
    }

    /// Queues every exit recorded since the last call on every exit subscription.
    fn deliver_exits(&mut self) {
        let exits = self.containers.take_exits();
        if exits.is_empty() {
            return;
        }
        for i in (0..self.conns.len()).rev() {
            let c = &mut self.conns[i];
            if c.mode != Mode::Exits {
                continue;
            }
            for exit in &exits {
                frame::encode_to(exit, &mut c.out);
            }
            if c.flush().is_err() {
                self.close_conn(i);
            }
        }
    }

    /// Queues the answers of finished execs on their connections, which may serve requests again.
    fn deliver_exec_answers(&mut self) {
        for (conn, resp) in self.containers.take_finished_execs() {
            let Some(i) = self.conn_index(conn) else { continue };
            self.conns[i].mode = Mode::Requests;
            let resp = pb::Response {
                kind: Some(response::Kind::Exec(resp)),
            };
            let ok = self.conns[i].queue(&resp).is_ok() && self.serve_buffered(i);
            if !ok {
                self.close_conn(i);
            }
        }
    }

    /// Queues session output frames on their connections. An attach session that falls more than
    /// SESSION_MAX_QUEUED behind is closed; a session whose exit frame is sent is closed.
    fn deliver_session_output(&mut self) {
        let frames = self.containers.take_session_output();
        if frames.is_empty() {
            return;
        }
        let mut touched = Vec::new();
        for (conn, kind) in frames {
            let Some(i) = self.conn_index(conn) else { continue };
            let c = &mut self.conns[i];
            let Mode::Session(s) = &mut c.mode else { continue };
            if s.closing {
                continue;
            }
            if matches!(kind, session_output::Kind::Exit(_)) {
                s.closing = true;
            }
            frame::encode_to(&pb::SessionOutput { kind: Some(kind) }, &mut c.out);
            if !touched.contains(&conn) {
                touched.push(conn);
            }
        }
        for conn in touched {
            let Some(i) = self.conn_index(conn) else { continue };
            let c = &mut self.conns[i];
            let Some(s) = c.session() else { continue };
            if c.flush().is_err() {
                self.close_conn(i);
            } else if s.closing && c.queued() == 0 {
                tracing::debug!(conn, "session ended");
                self.close_conn(i);
            } else if s.attach && !s.closing && c.queued() > SESSION_MAX_QUEUED {
                tracing::warn!(
                    conn,
                    queued = c.queued(),
                    "attach session does not keep up with the container's output, closing it"
                );
                self.close_conn(i);
            }
        }
    }

    /// Hands buffered session input to the containers where there is room for it now.
    fn pump_sessions(&mut self) {
        for i in (0..self.conns.len()).rev() {
            if self.conns[i].session().is_some() && !self.session_input(i) {
                self.close_conn(i);
            }
        }
    }

    /// Hands the complete SessionInput frames connection `i` has sent to the containers, while
    /// they take more; then, once all are handled, the end of input. False when the connection is
    /// finished (a bad frame).
    fn session_input(&mut self, i: usize) -> bool {
        let id = self.conns[i].id;
        loop {
            let Some(s) = self.conns[i].session() else { return true };
            if s.closing {
                return true;
            }
            if !self.containers.session_input_room(id) {
                return true;
            }
            match self.conns[i].reader.next_message::<pb::SessionInput>() {
                Ok(Some(input)) => {
                    // Kinds this shim does not know are ignored (a newer daemon).
                    if let Some(kind) = input.kind {
                        self.containers.session_input(id, kind);
                    }
                }
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(conn = id, error = %e, "bad session frame, closing the session");
                    return false;
                }
            }
        }
        let c = &mut self.conns[i];
        if let Mode::Session(s) = &mut c.mode {
            if s.input_eof && !c.reader.has_frame() {
                if c.reader.is_partial() {
                    tracing::debug!(conn = id, "session input ended in the middle of a frame");
                    c.reader = FrameReader::default();
                }
                if !std::mem::replace(&mut s.input_ended, true) {
                    self.containers
                        .session_input(id, pb::session_input::Kind::CloseStdin(pb::CloseStdin {}));
                }
            }
        }
        true
    }

    fn accept(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, _)) => {
                    if self.conns.len() >= MAX_CONNECTIONS {
                        tracing::warn!("too many connections, closing a new one");
                        continue;
                    }
                    if let Err(e) = stream.set_nonblocking(true) {
                        tracing::warn!(error = %e, "set_nonblocking");
                        continue;
                    }
                    let id = self.next_conn;
                    self.next_conn += 1;
                    tracing::debug!(conn = id, "connection accepted");
                    self.conns.push(Conn {
                        id,
                        stream,
                        reader: FrameReader::default(),
                        out: Vec::new(),
                        sent: 0,
                        stalled_since: None,
                        mode: Mode::Requests,
                    });
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::warn!(error = %e, "accept");
                    return;
                }
            }
        }
    }

    /// Connection `i` is ready. False when it is finished (closed by the peer, or broken).
    fn on_conn_event(&mut self, i: usize, revents: i16) -> bool {
        if self.conns[i].queued() > 0 && self.conns[i].flush().is_err() {
            return false;
        }
        match self.conns[i].mode {
            // Only POLLRDHUP, POLLHUP and POLLERR are watched now: the client gave up.
            Mode::Waiting | Mode::Exits => revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR) == 0,
            Mode::Session(s) => {
                if revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                    // Closed by the peer (both ways): an exec is killed, an attach detached.
                    return false;
                }
                if s.closing {
                    return self.conns[i].queued() > 0;
                }
                if revents & libc::POLLIN != 0 && !self.read_session(i) {
                    return false;
                }
                self.session_input(i)
            }
            Mode::Requests => {
                if revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                    return self.serve(i);
                }
                true
            }
        }
    }

    /// One read of session input from connection `i`. False when the connection is broken.
    fn read_session(&mut self, i: usize) -> bool {
        // On the heap: a big stack frame here would push every deeper call's stack pages down
        // (resident for good; the shim's RSS is counted in KiB).
        let mut buf = vec![0u8; SESSION_READ];
        let c = &mut self.conns[i];
        loop {
            match c.stream.read(&mut buf) {
                Ok(0) => {
                    // The peer shut its writing side (dropped its input half): no more input,
                    // output still goes to it.
                    if let Mode::Session(s) = &mut c.mode {
                        s.input_eof = true;
                    }
                    return true;
                }
                Ok(n) => {
                    c.reader.push(&buf[..n]);
                    return true;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "session read");
                    return false;
                }
            }
        }
    }

    /// Reads what connection `i` sent and answers every complete request. False when the
    /// connection is finished (closed by the peer, or broken).
    fn serve(&mut self, i: usize) -> bool {
        let mut buf = [0u8; 8192];
        let mut open = true;
        loop {
            match self.conns[i].stream.read(&mut buf) {
                Ok(0) => {
                    open = false;
                    break;
                }
                Ok(n) => self.conns[i].reader.push(&buf[..n]),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => {
                    tracing::debug!(error = %e, "read");
                    return false;
                }
            }
        }
        if !self.serve_buffered(i) {
            return false;
        }
        if let Mode::Session(s) = &mut self.conns[i].mode {
            // Became a session: what followed the request is its input.
            s.input_eof |= !open;
            return self.session_input(i);
        }
        if !open && self.conns[i].reader.is_partial() {
            tracing::debug!("connection closed in the middle of a request");
        }
        // A peer that closed while its exec runs gave up on it.
        open
    }

    /// Answers the complete requests connection `i` has sent, until one has to wait (Exec), the
    /// connection became a session, or too much is queued. False when the connection is finished.
    fn serve_buffered(&mut self, i: usize) -> bool {
        while self.conns[i].mode == Mode::Requests && self.conns[i].queued() < MAX_QUEUED {
            let req = match self.conns[i].reader.next_message::<pb::Request>() {
                Ok(Some(req)) => req,
                Ok(None) => break,
                Err(e) => {
                    tracing::warn!(error = %e, "bad frame, closing the connection");
                    let resp = error_response(ApiError::new(ErrorCode::InvalidArgument, e.to_string()));
                    let _ = write_all(&self.conns[i].stream, &frame::encode(&resp));
                    return false;
                }
            };
            let conn_id = self.conns[i].id;
            match self.handle(req, conn_id) {
                Handled::Answer(resp) => {
                    if self.exit_requested {
                        // The last answer: sent before the loop ends (bounded wait).
                        let c = &mut self.conns[i];
                        c.out.extend_from_slice(&frame::encode(&resp));
                        let _ = write_all(&c.stream, &c.out[c.sent..]);
                        return false;
                    }
                    if let Err(e) = self.conns[i].queue(&resp) {
                        tracing::debug!(error = %e, "writing a response");
                        return false;
                    }
                }
                Handled::Pending => self.conns[i].mode = Mode::Waiting,
                Handled::Exits(answer) => {
                    let c = &mut self.conns[i];
                    c.mode = Mode::Exits;
                    c.stalled_since = None;
                    if let Err(e) = c.queue(&answer) {
                        tracing::debug!(error = %e, "writing a response");
                        return false;
                    }
                }
                Handled::Session { answer, attach } => {
                    let c = &mut self.conns[i];
                    c.mode = Mode::Session(Session {
                        attach,
                        input_eof: false,
                        input_ended: false,
                        closing: false,
                    });
                    // A stalled request connection's clock does not carry over.
                    c.stalled_since = None;
                    if let Err(e) = c.queue(&answer) {
                        tracing::debug!(error = %e, "writing a response");
                        return false;
                    }
                }
            }
        }
        true
    }

    /// The answer to `req`, or that it comes later (an exec was started for `conn`), or that
    /// `conn` is a session after this answer.
    fn handle(&mut self, req: pb::Request, conn: u64) -> Handled {
        // Exits that happened since the last poll are recorded before anything is reported.
        self.containers.reap();
        let Some(kind) = req.kind else {
            return Handled::Answer(error_response(ApiError::new(
                ErrorCode::Unimplemented,
                "request of a kind this shim does not know (the shim is older than the daemon?)",
            )));
        };
        let name = request_name(&kind);
        let started = Instant::now();
        let result: Result<response::Kind, ApiError> = match kind {
            request::Kind::Ping(_) => Ok(response::Kind::Ping(pb::PingResponse {
                pid: std::process::id(),
                version: env!("CARGO_PKG_VERSION").to_string(),
                sandbox_id: self.sandbox_id.clone(),
            })),
            request::Kind::CreateContainer(r) => {
                let opts = CreateOptions {
                    create_only: r.create_only,
                    log_path: r.log_path,
                    stdin: r.stdin,
                    tty: r.tty,
                    max_log_line_bytes: r.max_log_line_bytes,
                    stdin_once: r.stdin_once,
                    restore: (!r.restore_images_dir.is_empty()).then(|| crate::containers::RestoreFrom {
                        images_dir: r.restore_images_dir.into(),
                        work_dir: r.restore_work_dir.into(),
                    }),
                };
                self.containers
                    .create(&r.container_id, &r.bundle, &opts)
                    .map(|pid| response::Kind::CreateContainer(pb::CreateContainerResponse { pid }))
            }
            request::Kind::StartContainer(r) => self
                .containers
                .start(&r.container_id)
                .map(|()| response::Kind::StartContainer(pb::StartContainerResponse {})),
            request::Kind::State(r) => self.containers.state(&r.container_id).map(response::Kind::State),
            request::Kind::Kill(r) => self
                .containers
                .kill(&r.container_id, r.signal, r.all)
                .map(|()| response::Kind::Kill(pb::KillResponse {})),
            request::Kind::DeleteContainer(r) => self
                .containers
                .delete(&r.container_id)
                .map(|()| response::Kind::DeleteContainer(pb::DeleteContainerResponse {})),
            request::Kind::Shutdown(_) => self
                .shutdown()
                .map(|()| response::Kind::Shutdown(pb::ShutdownResponse {})),
            request::Kind::Exec(r) => match self.containers.exec(conn, r) {
                Ok(()) => {
                    tracing::debug!(request = name, elapsed = ?started.elapsed(), "started, answer pending");
                    return Handled::Pending;
                }
                Err(e) => Err(e),
            },
            request::Kind::ExecStream(r) => match self.containers.exec_stream(conn, r) {
                Ok(pid) => {
                    tracing::debug!(request = name, elapsed = ?started.elapsed(), "session started");
                    return Handled::Session {
                        answer: pb::Response {
                            kind: Some(response::Kind::ExecStream(pb::ExecStreamResponse { pid })),
                        },
                        attach: false,
                    };
                }
                Err(e) => Err(e),
            },
            request::Kind::Attach(r) => match self.containers.attach(conn, r) {
                Ok(resp) => {
                    tracing::debug!(request = name, elapsed = ?started.elapsed(), "session started");
                    return Handled::Session {
                        answer: pb::Response {
                            kind: Some(response::Kind::Attach(resp)),
                        },
                        attach: true,
                    };
                }
                Err(e) => Err(e),
            },
            request::Kind::SubscribeExits(_) => {
                tracing::debug!(request = name, "exit subscription started");
                return Handled::Exits(pb::Response {
                    kind: Some(response::Kind::SubscribeExits(pb::SubscribeExitsResponse {})),
                });
            }
            request::Kind::ReopenContainerLog(r) => self
                .containers
                .reopen_log(&r.container_id)
                .map(|()| response::Kind::ReopenContainerLog(pb::ReopenContainerLogResponse {})),
            request::Kind::UpdateResources(r) => self
                .containers
                .update_resources(&r.container_id, &r.resources_json)
                .map(|()| response::Kind::UpdateResources(pb::UpdateResourcesResponse {})),
            request::Kind::CheckpointContainer(r) => self
                .containers
                .checkpoint(&r.container_id, &r.image_dir, &r.work_dir, r.timeout_seconds)
                .map(|()| response::Kind::CheckpointContainer(pb::CheckpointContainerResponse {})),
        };
        match &result {
            Ok(_) => tracing::debug!(request = name, elapsed = ?started.elapsed(), "handled"),
            Err(e) => tracing::warn!(request = name, code = ?e.code, error = %e.message, "failed"),
        }
        Handled::Answer(match result {
            Ok(kind) => pb::Response { kind: Some(kind) },
            Err(e) => error_response(e),
        })
    }

    /// Deletes every container and the shim's files; the loop ends after the answer is sent.
    fn shutdown(&mut self) -> Result<(), ApiError> {
        self.containers.delete_all()?;
        self.containers.reap();
        for name in ["shim.sock", "shim.pid"] {
            let _ = std::fs::remove_file(self.state_dir.join(name));
        }
        for name in ["containers", "exits"] {
            let path = self.state_dir.join(name);
            if let Err(e) = std::fs::remove_dir_all(&path) {
                if e.kind() != io::ErrorKind::NotFound {
                    tracing::warn!(?path, error = %e, "removing");
                }
            }
        }
        tracing::info!("shutdown: every container deleted, exiting");
        self.exit_requested = true;
        Ok(())
    }
}

fn request_name(kind: &request::Kind) -> &'static str {
    match kind {
        request::Kind::Ping(_) => "Ping",
        request::Kind::CreateContainer(_) => "CreateContainer",
        request::Kind::StartContainer(_) => "StartContainer",
        request::Kind::State(_) => "State",
        request::Kind::Kill(_) => "Kill",
        request::Kind::DeleteContainer(_) => "DeleteContainer",
        request::Kind::Shutdown(_) => "Shutdown",
        request::Kind::Exec(_) => "Exec",
        request::Kind::ReopenContainerLog(_) => "ReopenContainerLog",
        request::Kind::UpdateResources(_) => "UpdateResources",
        request::Kind::ExecStream(_) => "ExecStream",
        request::Kind::Attach(_) => "Attach",
        request::Kind::SubscribeExits(_) => "SubscribeExits",
        request::Kind::CheckpointContainer(_) => "CheckpointContainer",
    }
}

fn error_response(e: ApiError) -> pb::Response {
    pb::Response {
        kind: Some(response::Kind::Error(pb::Error {
            code: e.code as i32,
            message: e.message,
        })),
    }
}

/// Writes a whole frame to a non-blocking socket, waiting (bounded) for room. MSG_NOSIGNAL: a
/// peer that went away is an error here, never a SIGPIPE.
fn write_all(stream: &UnixStream, mut bytes: &[u8]) -> io::Result<()> {
    let deadline = Instant::now() + WRITE_TIMEOUT;
    while !bytes.is_empty() {
        match send(std::os::fd::AsRawFd::as_raw_fd(stream), bytes, MsgFlags::MSG_NOSIGNAL) {
            Ok(n) => bytes = &bytes[n..],
            Err(Errno::EINTR) => {}
            Err(Errno::EAGAIN) => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(io::Error::new(io::ErrorKind::TimedOut, "peer does not read"));
                }
                let mut fds = [PollFd::new(stream.as_fd(), PollFlags::POLLOUT)];
                let ms = left.as_millis().min(i32::MAX as u128) as i32;
                match poll(&mut fds, PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)) {
                    Ok(_) | Err(Errno::EINTR) => {}
                    Err(e) => return Err(e.into()),
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_response_carries_code_and_message() {
        let r = error_response(ApiError::new(ErrorCode::NotFound, "no container"));
        match r.kind {
            Some(response::Kind::Error(e)) => {
                assert_eq!(e.code(), ErrorCode::NotFound);
                assert_eq!(e.message, "no container");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn write_all_to_a_closed_peer_is_an_error_not_a_signal() {
        let (a, b) = UnixStream::pair().unwrap();
        a.set_nonblocking(true).unwrap();
        drop(b);
        assert!(crate::test_support::eventually(|| write_all(&a, b"hello").is_err()));
    }
}
