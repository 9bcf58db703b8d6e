//! Daemon side of the shim protocol (proto/shim/v1/shim.proto): starts a pod's `scute-shim`,
//! reconnects to it after a daemon restart, and sends it requests.
//!
//! The shim is one process per pod sandbox, detached from the daemon (its own session; reparented
//! to PID 1 or a subreaper), so it and the pod's containers outlive the daemon. Everything the
//! daemon knows about a shim is in its state dir:
//!
//! ```text
//! <state-dir>/shim.sock                  the socket, 0600 (protocol: a u32 big-endian length, then
//!                                        one protobuf message; one Request -> one Response)
//! <state-dir>/shim.pid                   the shim's pid
//! <state-dir>/shim.log                   the shim's log (and libcontainer's)
//! <state-dir>/exits/<container-id>.json  exit records, written before the shim reports an exit
//! <state-dir>/containers/                libcontainer's state (the shim's business)
//! ```
//!
//! One connection per client, opened lazily and reopened after an error; requests of concurrent
//! callers are serialized by a tokio mutex (the shim handles one request at a time anyway). An
//! exec, which lasts as long as its process, uses a connection of its own: the shim serves other
//! requests meanwhile, and so does this client.
//!
//! Container output: `create_container_with` gives the container a CRI log file that the shim
//! writes itself (so output never waits for the daemon); `reopen_log` after the kubelet rotated it.
//!
//! Streaming (CRI Exec and Attach): `exec_stream` and `attach` open a connection of their own that
//! becomes a session (`ShimSession`): its `input` half sends stdin, its end and terminal sizes,
//! its `output` half yields stdout/stderr chunks and finally the exit. Dropping both halves closes
//! the connection: an exec'd process is then killed, an attach detaches.

use std::io;
use std::path::{Path, PathBuf};
use std::time::Duration;

use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::Mutex;

/// Messages generated from proto/shim/v1/shim.proto.
#[allow(clippy::all, clippy::pedantic, missing_docs)]
pub mod pb {
    tonic::include_proto!("scute.shim.v1");
}

use pb::{request, response};

mod sessions;
mod spawn;

pub(crate) use sessions::parse_session_frame;
pub use sessions::{ExitSubscription, SessionInput, SessionOutput, SessionOutputs, ShimSession};
use spawn::ProcId;

pub const SOCKET_FILE: &str = "shim.sock";
pub const PID_FILE: &str = "shim.pid";
pub const LOG_FILE: &str = "shim.log";
pub const EXITS_DIR: &str = "exits";

/// Largest answer accepted: an exec's carries up to 16 MiB of stdout and of stderr. (The shim
/// accepts requests up to 4 MiB.)
const MAX_FRAME: usize = 40 << 20;
/// Largest session output frame accepted (the shim sends chunks of at most 64 KiB).
const MAX_SESSION_FRAME: usize = 4 << 20;
/// Stdin is sent in frames of at most this much (the shim buffers a frame whole).
const STDIN_FRAME: usize = 32 << 10;
/// Most output an exec keeps per stream (the shim's cap, too).
pub const MAX_EXEC_OUTPUT: usize = 16 << 20;
/// Spawn: from exec to the shim listening.
const SPAWN_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests that only read or signal.
const QUICK_TIMEOUT: Duration = Duration::from_secs(30);
/// Requests that create or tear down containers (libcontainer, cgroups, waiting for SIGKILL).
const SLOW_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `shutdown` waits for the shim process to be gone after it answered.
const EXIT_TIMEOUT: Duration = Duration::from_secs(10);

pub struct SpawnOptions {
    pub sandbox_id: String,
    pub state_dir: PathBuf,
    pub shim_binary: PathBuf,
    /// The daemon's log level; anything but error/warn/info/debug/trace/off is passed as info.
    pub log_level: String,
    /// How the shim makes its containers' cgroups and its own.
    pub cgroup_driver: crate::config::CgroupDriver,
    /// The shim's own cgroup (the driver's form), beside the pod's containers
    /// ([`crate::cgroups::shim_path`]): it moves there first, so its memory is the pod's and
    /// restarting scute's unit leaves it alone.
    pub cgroup: String,
}

/// A container's lifecycle as the shim reports it: the protocol's own enum, so the shim and
/// the daemon name its states the same way.
pub use pb::ContainerStatus;

#[derive(Debug, Clone)]
pub struct ContainerState {
    /// The init process in the host pid namespace (the last one, once stopped).
    pub pid: u32,
    pub status: ContainerStatus,
    /// Set once stopped: exit status, or 128 + signal.
    pub exit_code: Option<i32>,
    /// Set once stopped: when the shim reaped it, ns since the epoch.
    pub finished_at_ns: Option<i64>,
    pub created_at_ns: i64,
    /// 0 while not started.
    pub started_at_ns: i64,
    /// Set once stopped: killed by SIGKILL after its memory cgroup counted an OOM kill (the CRI
    /// reason is then OOMKilled).
    pub oom_killed: bool,
    /// Output the shim could not write to the log file and dropped, in bytes.
    pub log_bytes_dropped: u64,
}

/// An exit as the shim records it in `<state-dir>/exits/<container-id>.json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
pub struct ExitRecord {
    pub exit_code: i32,
    pub finished_at_ns: i64,
    /// Absent in the files of older shims.
    #[serde(default)]
    pub oom_killed: bool,
}

/// What a container gets besides its bundle (`create_container_with`).
#[derive(Debug, Clone, Default)]
pub struct CreateOptions {
    /// The CRI log file (absolute); the shim creates it (0640, and missing parent directories)
    /// and writes stdout and stderr to it. None: output goes to /dev/null.
    pub log_path: Option<PathBuf>,
    /// The container's stdin is a pipe (or its terminal) the shim keeps for `attach`; until an
    /// attach writes, it reads nothing (and no EOF).
    pub stdin: bool,
    /// The container runs on a terminal (its bundle's process.terminal must be true too): output
    /// is logged as stdout, attach sessions can resize it.
    pub tty: bool,
    /// Longest log line written as one entry (longer ones are split into partial entries); None:
    /// the shim's default, 16 KiB.
    pub max_log_line_bytes: Option<u32>,
    /// With `stdin`: the first attach session that ends its input (`close_stdin`, or closing)
    /// closes the container's stdin (a terminal gets ^D), and no attach can write to it again.
    pub stdin_once: bool,
    /// Restore at start from CRIU's images in the first directory (CRIU's work dir: the second)
    /// instead of starting the bundle's process; no process (pid 0) until then.
    pub restore: Option<(PathBuf, PathBuf)>,
}

/// A command to run in a running container (`exec_with`).
#[derive(Debug, Clone, Default)]
pub struct ExecOptions {
    pub args: Vec<String>,
    /// KEY=VALUE entries added to (or overriding) the container's environment.
    pub env: Vec<String>,
    /// The process is SIGKILLed after this long (and `timed_out` set); zero: no limit.
    pub timeout: Duration,
    /// Most bytes kept of stdout and of stderr each (more is dropped); 0 or more than
    /// `MAX_EXEC_OUTPUT`: `MAX_EXEC_OUTPUT`.
    pub max_output: usize,
}

/// A command to run in a running container with its stdio streamed (`exec_stream`, CRI Exec).
#[derive(Debug, Clone, Default)]
pub struct ExecStreamOptions {
    pub args: Vec<String>,
    /// KEY=VALUE entries added to (or overriding) the container's environment.
    pub env: Vec<String>,
    /// On a terminal: all output comes as `Stdout`, `resize` applies.
    pub tty: bool,
    /// Stdin is fed by `SessionInput::stdin` (else it is /dev/null, or the terminal nobody
    /// writes to).
    pub stdin: bool,
    /// Initial terminal size (columns, rows), with `tty`; 0 keeps the kernel's default.
    pub width: u32,
    pub height: u32,
}

/// What an attach session takes part in (`attach`, CRI Attach).
#[derive(Debug, Clone, Copy, Default)]
pub struct AttachOptions {
    /// Write to the container's stdin (it must have been created with `stdin`).
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
}

/// How an exec ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecResult {
    /// Exit status, or 128 + signal (137 after a timeout).
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub timed_out: bool,
    /// Output beyond `max_output` that was dropped, in bytes.
    pub stdout_dropped: u64,
    pub stderr_dropped: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum ShimError {
    /// The shim is not running (no socket, nobody listening, or it closed the connection).
    #[error("shim is not running: {0}")]
    Gone(String),
    /// The shim has no container with that id.
    #[error("not found: {0}")]
    NotFound(String),
    /// The shim answered something that is not the protocol.
    #[error("shim protocol error: {0}")]
    Protocol(String),
    /// The shim tried and refused or failed; `message` says why.
    #[error("shim: {message} ({code:?})")]
    Remote { code: pb::ErrorCode, message: String },
    /// The shim binary could not be started or did not get ready.
    #[error("starting the shim: {0}")]
    Start(String),
    /// No answer in time (the connection is dropped; the next call reconnects).
    #[error("the shim did not answer within {0:?}")]
    Timeout(Duration),
    #[error("shim I/O: {0}")]
    Io(#[from] io::Error),
}

pub struct ShimClient {
    state_dir: PathBuf,
    socket: PathBuf,
    sandbox_id: String,
    version: String,
    process: Option<ProcId>,
    conn: Mutex<Option<UnixStream>>,
}

impl ShimClient {
    /// Connects to the shim serving `state_dir` (after a daemon restart). `Gone` if it is not
    /// running.
    pub async fn connect(state_dir: &Path) -> Result<ShimClient, ShimError> {
        let mut client = ShimClient {
            state_dir: state_dir.to_path_buf(),
            socket: state_dir.join(SOCKET_FILE),
            sandbox_id: String::new(),
            version: String::new(),
            process: None,
            conn: Mutex::new(None),
        };
        let ping = match client
            .call(request::Kind::Ping(pb::PingRequest {}), QUICK_TIMEOUT)
            .await?
        {
            response::Kind::Ping(p) => p,
            other => return Err(unexpected("Ping", &other)),
        };
        client.sandbox_id = ping.sandbox_id;
        client.version = ping.version;
        client.process = ProcId::of(ping.pid);
        if client.process.is_none() {
            // The shim answered, so it runs; /proc of another pid namespace would not show it.
            tracing::warn!(pid = ping.pid, "shim answered but its pid is not visible in /proc");
            client.process = Some(ProcId {
                pid: ping.pid,
                start_time: 0,
            });
        }
        Ok(client)
    }

    /// The sandbox the shim says it serves.
    pub fn sandbox_id(&self) -> &str {
        &self.sandbox_id
    }

    /// The shim's version.
    pub fn version(&self) -> &str {
        &self.version
    }

    pub fn state_dir(&self) -> &Path {
        &self.state_dir
    }

    pub fn shim_pid(&self) -> Option<u32> {
        self.process.map(|p| p.pid)
    }

    /// True once the shim's process has exited (killed, crashed): this connection is dead for
    /// good. False while it runs, or when its process could not be identified.
    pub fn exited(&self) -> bool {
        self.process.is_some_and(|p| p.start_time != 0 && !p.alive())
    }

    /// Creates and starts a container from an OCI bundle (absolute path), output to /dev/null
    /// (the pause container); its init pid.
    pub async fn create_container(&self, id: &str, bundle: &Path) -> Result<u32, ShimError> {
        self.create(id, bundle, false, &CreateOptions::default()).await
    }

    /// Creates a container that waits for `start_container`, output to /dev/null; its init pid.
    pub async fn create_container_only(&self, id: &str, bundle: &Path) -> Result<u32, ShimError> {
        self.create(id, bundle, true, &CreateOptions::default()).await
    }

    /// Creates a container (CRI CreateContainer) that waits for `start_container`, with a log
    /// file and the like; its init pid.
    pub async fn create_container_with(&self, id: &str, bundle: &Path, opts: &CreateOptions) -> Result<u32, ShimError> {
        self.create(id, bundle, true, opts).await
    }

    async fn create(&self, id: &str, bundle: &Path, create_only: bool, opts: &CreateOptions) -> Result<u32, ShimError> {
        let bundle = bundle
            .to_str()
            .ok_or_else(|| ShimError::Protocol(format!("bundle path {bundle:?} is not UTF-8")))?;
        let log_path = match &opts.log_path {
            None => String::new(),
            Some(p) => p
                .to_str()
                .ok_or_else(|| ShimError::Protocol(format!("log path {p:?} is not UTF-8")))?
                .to_string(),
        };
        let req = request::Kind::CreateContainer(pb::CreateContainerRequest {
            container_id: id.to_string(),
            bundle: bundle.to_string(),
            create_only,
            log_path,
            stdin: opts.stdin,
            tty: opts.tty,
            max_log_line_bytes: opts.max_log_line_bytes.unwrap_or(0),
            stdin_once: opts.stdin_once,
            restore_images_dir: path_of(opts.restore.as_ref().map(|r| r.0.as_path()))?,
            restore_work_dir: path_of(opts.restore.as_ref().map(|r| r.1.as_path()))?,
        });
        match self.call(req, SLOW_TIMEOUT).await? {
            response::Kind::CreateContainer(r) => Ok(r.pid),
            other => Err(unexpected("CreateContainer", &other)),
        }
    }

    pub async fn start_container(&self, id: &str) -> Result<(), ShimError> {
        let req = request::Kind::StartContainer(pb::StartContainerRequest {
            container_id: id.to_string(),
        });
        match self.call(req, SLOW_TIMEOUT).await? {
            response::Kind::StartContainer(_) => Ok(()),
            other => Err(unexpected("StartContainer", &other)),
        }
    }

    pub async fn state(&self, id: &str) -> Result<ContainerState, ShimError> {
        let req = request::Kind::State(pb::StateRequest {
            container_id: id.to_string(),
        });
        match self.call(req, QUICK_TIMEOUT).await? {
            response::Kind::State(s) => Ok(ContainerState {
                pid: s.pid,
                status: s.status(),
                exit_code: s.exit_code,
                finished_at_ns: s.finished_at_ns,
                created_at_ns: s.created_at_ns,
                started_at_ns: s.started_at_ns,
                oom_killed: s.oom_killed,
                log_bytes_dropped: s.log_bytes_dropped,
            }),
            other => Err(unexpected("State", &other)),
        }
    }

    /// Reopens the container's log file at its path (CRI ReopenContainerLog, after the kubelet
    /// renamed it). A container without log file or whose output has ended is fine.
    pub async fn reopen_log(&self, id: &str) -> Result<(), ShimError> {
        let req = request::Kind::ReopenContainerLog(pb::ReopenContainerLogRequest {
            container_id: id.to_string(),
        });
        match self.call(req, QUICK_TIMEOUT).await? {
            response::Kind::ReopenContainerLog(_) => Ok(()),
            other => Err(unexpected("ReopenContainerLog", &other)),
        }
    }

    /// Applies new cgroup limits to a created or running container (CRI UpdateContainerResources):
    /// only what `resources` sets changes; its `devices` are ignored (device rules stay as created).
    /// `NotFound` for an unknown container, `Remote { FailedPrecondition }` for a stopped one.
    pub async fn update_resources(
        &self,
        id: &str,
        resources: &oci_spec::runtime::LinuxResources,
    ) -> Result<(), ShimError> {
        let resources_json = serde_json::to_string(resources)
            .map_err(|e| ShimError::Protocol(format!("encoding the resources: {e}")))?;
        let req = request::Kind::UpdateResources(pb::UpdateResourcesRequest {
            container_id: id.to_string(),
            resources_json,
        });
        // Lowering a memory limit makes the kernel reclaim first: allow for it.
        match self.call(req, SLOW_TIMEOUT).await? {
            response::Kind::UpdateResources(_) => Ok(()),
            other => Err(unexpected("UpdateResources", &other)),
        }
    }

    /// Checkpoints the running container with CRIU, leaving it running: CRIU's images into
    /// `image_dir`, its log and statistics into `work_dir`. CRIU is killed after `timeout`.
    pub async fn checkpoint_container(
        &self,
        id: &str,
        image_dir: &Path,
        work_dir: &Path,
        timeout: Duration,
    ) -> Result<(), ShimError> {
        let secs = timeout.as_secs().clamp(1, u32::MAX.into()) as u32;
        let req = request::Kind::CheckpointContainer(pb::CheckpointContainerRequest {
            container_id: id.to_string(),
            image_dir: path_of(Some(image_dir))?,
            work_dir: path_of(Some(work_dir))?,
            timeout_seconds: secs,
        });
        // The shim kills CRIU at the limit; its answer may take a little longer.
        match self.call(req, timeout + QUICK_TIMEOUT).await? {
            response::Kind::CheckpointContainer(_) => Ok(()),
            other => Err(unexpected("CheckpointContainer", &other)),
        }
    }

    /// Runs `args` in the running container (CRI ExecSync) and waits for it: killed after
    /// `timeout` (zero: no limit), at most `max_output` bytes kept of stdout and of stderr each
    /// (0: `MAX_EXEC_OUTPUT`). `NotFound` for an unknown container; `Remote { FailedPrecondition }`
    /// for one that is not running.
    pub async fn exec(
        &self,
        id: &str,
        args: &[String],
        timeout: Duration,
        max_output: usize,
    ) -> Result<ExecResult, ShimError> {
        self.exec_with(
            id,
            &ExecOptions {
                args: args.to_vec(),
                env: Vec::new(),
                timeout,
                max_output,
            },
        )
        .await
    }

    /// `exec` with all options. Uses a connection of its own (other calls go on meanwhile); if
    /// this future is dropped, the connection closes and the shim kills the process.
    pub async fn exec_with(&self, id: &str, opts: &ExecOptions) -> Result<ExecResult, ShimError> {
        let timeout_ms = if opts.timeout.is_zero() {
            0
        } else {
            // Rounded up: a timeout below a millisecond is not "none".
            opts.timeout.as_micros().div_ceil(1000).clamp(1, u32::MAX as u128) as u32
        };
        let request = pb::Request {
            kind: Some(request::Kind::Exec(pb::ExecRequest {
                container_id: id.to_string(),
                args: opts.args.clone(),
                env: opts.env.clone(),
                timeout_ms,
                max_output_bytes: opts.max_output.min(MAX_EXEC_OUTPUT) as u64,
            })),
        };
        let mut stream = open(&self.socket).await?;
        let round_trip = async {
            stream.write_all(&encode(&request)).await.map_err(io_error)?;
            read_frame(&mut stream).await
        };
        // The shim enforces the timeout; this bound only covers a shim that hangs.
        let response = if opts.timeout.is_zero() {
            round_trip.await?
        } else {
            let bound = opts.timeout + QUICK_TIMEOUT;
            tokio::time::timeout(bound, round_trip)
                .await
                .map_err(|_| ShimError::Timeout(bound))??
        };
        match response.kind {
            Some(response::Kind::Exec(r)) => Ok(ExecResult {
                exit_code: r.exit_code,
                stdout: r.stdout,
                stderr: r.stderr,
                timed_out: r.timed_out,
                stdout_dropped: r.stdout_dropped,
                stderr_dropped: r.stderr_dropped,
            }),
            Some(response::Kind::Error(e)) => Err(remote(e)),
            Some(other) => Err(unexpected("Exec", &other)),
            None => Err(ShimError::Protocol("response of an unknown kind".into())),
        }
    }

    /// Signals the container's init (or with `all` every process of its cgroup). A stopped
    /// container is not an error.
    pub async fn kill(&self, id: &str, signal: i32, all: bool) -> Result<(), ShimError> {
        let signal = u32::try_from(signal).map_err(|_| ShimError::Protocol(format!("invalid signal {signal}")))?;
        let req = request::Kind::Kill(pb::KillRequest {
            container_id: id.to_string(),
            signal,
            all,
        });
        match self.call(req, QUICK_TIMEOUT).await? {
            response::Kind::Kill(_) => Ok(()),
            other => Err(unexpected("Kill", &other)),
        }
    }

    /// SIGKILLs (if running), waits, removes the container. Unknown ids succeed.
    pub async fn delete_container(&self, id: &str) -> Result<(), ShimError> {
        let req = request::Kind::DeleteContainer(pb::DeleteContainerRequest {
            container_id: id.to_string(),
        });
        match self.call(req, SLOW_TIMEOUT).await? {
            response::Kind::DeleteContainer(_) => Ok(()),
            other => Err(unexpected("DeleteContainer", &other)),
        }
    }

    /// Deletes every container, stops the shim and waits (bounded) for its process to be gone.
    /// Idempotent: a shim that is already gone is fine.
    pub async fn shutdown(&self) -> Result<(), ShimError> {
        match self
            .call(request::Kind::Shutdown(pb::ShutdownRequest {}), SLOW_TIMEOUT)
            .await
        {
            Ok(response::Kind::Shutdown(_)) | Err(ShimError::Gone(_)) => {}
            Ok(other) => return Err(unexpected("Shutdown", &other)),
            Err(e) => return Err(e),
        }
        *self.conn.lock().await = None;
        let Some(process) = self.process.filter(|p| p.start_time != 0) else {
            return Ok(());
        };
        if !process.exited_within(EXIT_TIMEOUT).await {
            return Err(ShimError::Timeout(EXIT_TIMEOUT));
        }
        Ok(())
    }

    /// One round trip. The connection is dropped after any failure (a timed-out request could
    /// still be answered later and desynchronize it).
    async fn call(&self, req: request::Kind, timeout: Duration) -> Result<response::Kind, ShimError> {
        let mut conn = self.conn.lock().await;
        let request = pb::Request { kind: Some(req) };
        // The connection is taken out for the exchange and put back only once its response is
        // read: a call dropped half way (an RPC whose client gave up) drops the connection with
        // its unread response, instead of leaving that response to answer the next call.
        let mut stream = conn.take();
        let result = tokio::time::timeout(timeout, async {
            if stream.is_none() {
                stream = Some(open(&self.socket).await?);
            }
            let stream = stream.as_mut().expect("opened above");
            stream.write_all(&encode(&request)).await.map_err(io_error)?;
            read_frame(stream).await
        })
        .await;
        let response = match result {
            Ok(Ok(r)) => r,
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(ShimError::Timeout(timeout)),
        };
        *conn = stream;
        match response.kind {
            Some(response::Kind::Error(e)) => Err(remote(e)),
            Some(kind) => Ok(kind),
            None => Err(ShimError::Protocol("response of an unknown kind".into())),
        }
    }
}

/// Reads `<state-dir>/exits/<container-id>.json` (for when the shim itself is gone).
pub fn read_exit_file(state_dir: &Path, container_id: &str) -> io::Result<Option<ExitRecord>> {
    let path = state_dir.join(EXITS_DIR).join(format!("{container_id}.json"));
    match std::fs::read(&path) {
        Ok(body) => serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

async fn read_pid_file(state_dir: &Path) -> Option<u32> {
    tokio::fs::read_to_string(state_dir.join(PID_FILE))
        .await
        .ok()?
        .trim()
        .parse()
        .ok()
}

async fn open(socket: &Path) -> Result<UnixStream, ShimError> {
    UnixStream::connect(socket).await.map_err(|e| match e.kind() {
        io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused => {
            ShimError::Gone(format!("{}: {e}", socket.display()))
        }
        _ => ShimError::Io(e),
    })
}

/// I/O errors that mean the shim went away become `Gone`.
fn io_error(e: io::Error) -> ShimError {
    match e.kind() {
        io::ErrorKind::UnexpectedEof | io::ErrorKind::ConnectionReset | io::ErrorKind::BrokenPipe => {
            ShimError::Gone(format!("the shim closed the connection: {e}"))
        }
        _ => ShimError::Io(e),
    }
}

fn encode<M: Message>(msg: &M) -> Vec<u8> {
    let len = msg.encoded_len();
    let mut out = Vec::with_capacity(4 + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    msg.encode(&mut out).expect("a Vec grows as needed");
    out
}

async fn read_frame(stream: &mut UnixStream) -> Result<pb::Response, ShimError> {
    let mut header = [0u8; 4];
    stream.read_exact(&mut header).await.map_err(io_error)?;
    let len = u32::from_be_bytes(header) as usize;
    if len > MAX_FRAME {
        return Err(ShimError::Protocol(format!("frame of {len} bytes exceeds {MAX_FRAME}")));
    }
    let mut payload = vec![0u8; len];
    stream.read_exact(&mut payload).await.map_err(io_error)?;
    pb::Response::decode(payload.as_slice()).map_err(|e| ShimError::Protocol(e.to_string()))
}

fn remote(e: pb::Error) -> ShimError {
    match e.code() {
        pb::ErrorCode::NotFound => ShimError::NotFound(e.message),
        code => ShimError::Remote {
            code,
            message: e.message,
        },
    }
}

/// A path for the protocol (empty for none).
fn path_of(path: Option<&Path>) -> Result<String, ShimError> {
    match path {
        None => Ok(String::new()),
        Some(p) => p
            .to_str()
            .map(str::to_string)
            .ok_or_else(|| ShimError::Protocol(format!("path {p:?} is not UTF-8"))),
    }
}

fn unexpected(request: &str, got: &response::Kind) -> ShimError {
    ShimError::Protocol(format!("{request} answered with {got:?}"))
}

#[cfg(test)]
mod tests;
