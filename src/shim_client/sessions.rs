//! Sessions: connections of their own that outlive their request. An exec's or attach's stdio
//! (`ShimSession`: stdin, terminal sizes and the end of input one way, output chunks and the exit
//! the other) and the stream of container exits (`ExitSubscription`).

use bytes::{Buf, Bytes, BytesMut};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::UnixStream;

use super::pb::{self, request, response};
use super::{
    encode, io_error, open, read_frame, remote, unexpected, AttachOptions, ExecStreamOptions, ShimClient, ShimError,
    MAX_SESSION_FRAME, SLOW_TIMEOUT, STDIN_FRAME,
};

/// What a session yields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionOutput {
    Stdout(Bytes),
    Stderr(Bytes),
    /// The last item: the process (exec) or container (attach) exited, after all its output.
    /// The exit status, or 128 + signal.
    Exit(i32),
}

/// A streaming session with the shim (one connection of its own). Dropping both halves closes
/// it: an exec'd process is SIGKILLed, an attach detaches (with stdin_once that closes the
/// container's stdin).
pub struct ShimSession {
    /// The exec'd process in the host pid namespace; 0 for an attach.
    pub pid: u32,
    /// On a terminal: output comes as `Stdout` only, `resize` applies.
    pub tty: bool,
    pub input: SessionInput,
    pub output: SessionOutputs,
}

/// The sending half of a session. Writes wait while the shim takes no more input (the process
/// does not read its stdin): that is the backpressure reaching the client. Dropping it (while
/// keeping `SessionOutputs`) shuts the connection's writing side: the shim takes that as
/// `close_stdin`, and output keeps coming.
pub struct SessionInput {
    stream: OwnedWriteHalf,
}

impl SessionInput {
    /// Sends `data` to the process's stdin (dropped by the shim if the session has no stdin or it
    /// was closed).
    pub async fn stdin(&mut self, data: &[u8]) -> Result<(), ShimError> {
        for chunk in data.chunks(STDIN_FRAME) {
            self.send(pb::session_input::Kind::Stdin(chunk.to_vec())).await?;
        }
        Ok(())
    }

    /// No more stdin from this session: an exec's stdin is closed (a terminal gets ^D); for an
    /// attach this ends its input (with stdin_once the container's stdin is closed). Output
    /// keeps coming.
    pub async fn close_stdin(&mut self) -> Result<(), ShimError> {
        self.send(pb::session_input::Kind::CloseStdin(pb::CloseStdin {})).await
    }

    /// The client's terminal size changed (columns, rows); ignored without a terminal.
    pub async fn resize(&mut self, width: u32, height: u32) -> Result<(), ShimError> {
        self.send(pb::session_input::Kind::Resize(pb::Resize { width, height }))
            .await
    }

    async fn send(&mut self, kind: pb::session_input::Kind) -> Result<(), ShimError> {
        let frame = encode(&pb::SessionInput { kind: Some(kind) });
        self.stream.write_all(&frame).await.map_err(io_error)
    }
}

/// The receiving half of a session.
pub struct SessionOutputs {
    stream: OwnedReadHalf,
    buf: BytesMut,
    done: bool,
}

impl SessionOutputs {
    /// The next output; None when the shim closed the connection (after Exit, or if it died).
    /// `Err(Gone)` when the connection ended in the middle of a frame: the shim dropped an attach
    /// session that fell more than 1 MiB behind the container's output (or it died). Nothing
    /// follows an Exit or an error. Cancel safe: a call dropped before it returns loses nothing
    /// (it can be used in `select!`).
    pub async fn next(&mut self) -> Option<Result<SessionOutput, ShimError>> {
        loop {
            if self.done {
                return None;
            }
            match parse_session_frame(&mut self.buf) {
                Ok(Some(out)) => {
                    self.done = matches!(out, SessionOutput::Exit(_));
                    return Some(Ok(out));
                }
                Ok(None) => {}
                Err(e) => {
                    self.done = true;
                    return Some(Err(e));
                }
            }
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) => {
                    self.done = true;
                    if self.buf.is_empty() {
                        return None;
                    }
                    return Some(Err(ShimError::Gone(
                        "the shim closed the session in the middle of a frame".into(),
                    )));
                }
                Ok(_) => {}
                Err(e) => {
                    self.done = true;
                    return Some(Err(io_error(e)));
                }
            }
        }
    }
}

/// Takes one SessionOutput frame off the front of `buf`, if a whole one is there.
pub(crate) fn parse_session_frame(buf: &mut BytesMut) -> Result<Option<SessionOutput>, ShimError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_be_bytes(buf[..4].try_into().expect("4 bytes")) as usize;
    if len > MAX_SESSION_FRAME {
        return Err(ShimError::Protocol(format!(
            "session frame of {len} bytes exceeds {MAX_SESSION_FRAME}"
        )));
    }
    if buf.len() < 4 + len {
        // Room for the rest, so that one read can complete it.
        buf.reserve(4 + len - buf.len());
        return Ok(None);
    }
    buf.advance(4);
    let payload = buf.split_to(len);
    let msg = pb::SessionOutput::decode(payload.freeze()).map_err(|e| ShimError::Protocol(e.to_string()))?;
    match msg.kind {
        Some(pb::session_output::Kind::Stdout(b)) => Ok(Some(SessionOutput::Stdout(Bytes::from(b)))),
        Some(pb::session_output::Kind::Stderr(b)) => Ok(Some(SessionOutput::Stderr(Bytes::from(b)))),
        Some(pb::session_output::Kind::Exit(e)) => Ok(Some(SessionOutput::Exit(e.exit_code))),
        None => Err(ShimError::Protocol("session output of an unknown kind".into())),
    }
}

impl ShimClient {
    /// Runs `opts.args` in the running container (CRI Exec) with its stdio a session on a
    /// connection of its own. `NotFound` for an unknown container; `Remote { FailedPrecondition }`
    /// for one that is not running. The session ends with `SessionOutput::Exit`.
    pub async fn exec_stream(&self, id: &str, opts: &ExecStreamOptions) -> Result<ShimSession, ShimError> {
        let req = request::Kind::ExecStream(pb::ExecStreamRequest {
            container_id: id.to_string(),
            args: opts.args.clone(),
            env: opts.env.clone(),
            tty: opts.tty,
            stdin: opts.stdin,
            width: opts.width,
            height: opts.height,
        });
        let (stream, kind) = self.open_session(req).await?;
        match kind {
            response::Kind::ExecStream(r) => Ok(session(stream, r.pid, opts.tty)),
            other => Err(unexpected("ExecStream", &other)),
        }
    }

    /// Attaches to a created or running container's stdio (CRI Attach): output written from now
    /// on comes to this session (as well as to the log). `NotFound` for an unknown container;
    /// `Remote { FailedPrecondition }` for a stopped one, or `stdin` asked of a container without
    /// stdin (or whose stdin was closed, stdin_once). The session ends with
    /// `SessionOutput::Exit` when the container exits.
    pub async fn attach(&self, id: &str, opts: &AttachOptions) -> Result<ShimSession, ShimError> {
        let req = request::Kind::Attach(pb::AttachRequest {
            container_id: id.to_string(),
            stdin: opts.stdin,
            stdout: opts.stdout,
            stderr: opts.stderr,
        });
        let (stream, kind) = self.open_session(req).await?;
        match kind {
            response::Kind::Attach(r) => Ok(session(stream, 0, r.tty)),
            other => Err(unexpected("Attach", &other)),
        }
    }

    /// Subscribes to the shim's container exits, on a connection of its own: every exit it reaps
    /// from now on (none from before: ask `state` for those).
    pub async fn subscribe_exits(&self) -> Result<ExitSubscription, ShimError> {
        let req = request::Kind::SubscribeExits(pb::SubscribeExitsRequest {});
        let (stream, kind) = self.open_session(req).await?;
        match kind {
            response::Kind::SubscribeExits(_) => Ok(ExitSubscription { stream }),
            other => Err(unexpected("SubscribeExits", &other)),
        }
    }

    /// Sends `req` on a new connection and reads its answer; the connection is then a session.
    async fn open_session(&self, req: request::Kind) -> Result<(UnixStream, response::Kind), ShimError> {
        let request = pb::Request { kind: Some(req) };
        let mut stream = open(&self.socket).await?;
        // An exec's setup runs libcontainer in a helper.
        let response = tokio::time::timeout(SLOW_TIMEOUT, async {
            stream.write_all(&encode(&request)).await.map_err(io_error)?;
            read_frame(&mut stream).await
        })
        .await
        .map_err(|_| ShimError::Timeout(SLOW_TIMEOUT))??;
        match response.kind {
            Some(response::Kind::Error(e)) => Err(remote(e)),
            Some(kind) => Ok((stream, kind)),
            None => Err(ShimError::Protocol("response of an unknown kind".into())),
        }
    }
}

fn session(stream: UnixStream, pid: u32, tty: bool) -> ShimSession {
    let (read, write) = stream.into_split();
    ShimSession {
        pid,
        tty,
        input: SessionInput { stream: write },
        output: SessionOutputs {
            stream: read,
            buf: BytesMut::new(),
            done: false,
        },
    }
}

/// The container exits a shim reports as it reaps them. Dropping it ends the subscription.
pub struct ExitSubscription {
    stream: UnixStream,
}

impl ExitSubscription {
    /// The next exit; `Err(Gone)` when the shim closed the connection (it exited, or dropped a
    /// subscriber that did not read). Not cancel safe.
    pub async fn next(&mut self) -> Result<pb::ContainerExit, ShimError> {
        let mut header = [0u8; 4];
        self.stream.read_exact(&mut header).await.map_err(io_error)?;
        let len = u32::from_be_bytes(header) as usize;
        if len > MAX_SESSION_FRAME {
            return Err(ShimError::Protocol(format!("exit frame of {len} bytes")));
        }
        let mut payload = vec![0u8; len];
        self.stream.read_exact(&mut payload).await.map_err(io_error)?;
        pb::ContainerExit::decode(payload.as_slice()).map_err(|e| ShimError::Protocol(e.to_string()))
    }
}
