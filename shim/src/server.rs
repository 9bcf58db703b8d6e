//! The shim's event loop: one thread, one `poll` over the SIGCHLD signalfd, the listening socket
//! and the open connections. Requests are handled one at a time, to completion.

use std::io::{self, Read};
use std::os::fd::AsFd;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
use nix::sys::signalfd::SignalFd;
use nix::sys::socket::{send, MsgFlags};

use crate::containers::{ApiError, Containers};
use crate::frame::{self, FrameReader};
use crate::memory;
use crate::pb::{self, request, response, ErrorCode};

/// More connections than this means someone leaks them; new ones are closed at once.
const MAX_CONNECTIONS: usize = 16;
/// A peer that does not take a (small) response within this time is dropped.
const WRITE_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Server {
    pub sandbox_id: String,
    pub state_dir: PathBuf,
    pub listener: UnixListener,
    pub sigchld: SignalFd,
    pub containers: Containers,
    conns: Vec<Conn>,
    exit_requested: bool,
}

struct Conn {
    stream: UnixStream,
    reader: FrameReader,
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
            exit_requested: false,
        }
    }

    /// Serves until a Shutdown has been answered.
    pub fn run(&mut self) {
        // Trim once after start, then whenever activity has settled (see memory.rs).
        let mut settled = false;
        while !self.exit_requested {
            let timeout = if settled {
                PollTimeout::NONE
            } else {
                PollTimeout::try_from(memory::SETTLE).unwrap_or(PollTimeout::MAX)
            };
            let mut fds = Vec::with_capacity(2 + self.conns.len());
            fds.push(PollFd::new(self.sigchld.as_fd(), PollFlags::POLLIN));
            fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
            for c in &self.conns {
                fds.push(PollFd::new(c.stream.as_fd(), PollFlags::POLLIN));
            }
            match poll(&mut fds, timeout) {
                Ok(0) => {
                    drop(fds);
                    memory::trim();
                    settled = true;
                    continue;
                }
                Ok(_) | Err(Errno::EINTR) => settled = false,
                Err(e) => {
                    tracing::error!(error = %e, "poll");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            }
            let ready: Vec<bool> = fds.iter().map(|f| f.any().unwrap_or(false)).collect();
            drop(fds);

            if ready[0] {
                while let Ok(Some(_)) = self.sigchld.read_signal() {}
                self.containers.reap();
            }
            // Connections from the last to the first, so removing one keeps the others' indexes.
            for i in (0..ready.len() - 2).rev() {
                if ready[2 + i] && !self.serve(i) {
                    self.conns.remove(i);
                }
                if self.exit_requested {
                    return;
                }
            }
            if ready[1] {
                self.accept();
            }
        }
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
                    tracing::debug!("connection accepted");
                    self.conns.push(Conn {
                        stream,
                        reader: FrameReader::default(),
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
        loop {
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
            let resp = self.handle(req);
            if let Err(e) = write_all(&self.conns[i].stream, &frame::encode(&resp)) {
                tracing::debug!(error = %e, "writing a response");
                return false;
            }
            if self.exit_requested {
                return false;
            }
        }
        if !open && self.conns[i].reader.is_partial() {
            tracing::debug!("connection closed in the middle of a request");
        }
        open
    }

    fn handle(&mut self, req: pb::Request) -> pb::Response {
        // Exits that happened since the last poll are recorded before anything is reported.
        self.containers.reap();
        let Some(kind) = req.kind else {
            return error_response(ApiError::new(
                ErrorCode::Unimplemented,
                "request of a kind this shim does not know (the shim is older than the daemon?)",
            ));
        };
        let name = request_name(&kind);
        let started = Instant::now();
        let result: Result<response::Kind, ApiError> = match kind {
            request::Kind::Ping(_) => Ok(response::Kind::Ping(pb::PingResponse {
                pid: std::process::id(),
                version: env!("CARGO_PKG_VERSION").to_string(),
                sandbox_id: self.sandbox_id.clone(),
            })),
            request::Kind::CreateContainer(r) => self
                .containers
                .create(&r.container_id, &r.bundle, r.create_only)
                .map(|pid| response::Kind::CreateContainer(pb::CreateContainerResponse { pid })),
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
        };
        match &result {
            Ok(_) => tracing::debug!(request = name, elapsed = ?started.elapsed(), "handled"),
            Err(e) => tracing::warn!(request = name, code = ?e.code, error = %e.message, "failed"),
        }
        match result {
            Ok(kind) => pb::Response { kind: Some(kind) },
            Err(e) => error_response(e),
        }
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
        assert!(write_all(&a, b"hello").is_err());
    }
}
