//! The shim's containers: what the shim knows of each (pid, status, times, exit) and the
//! libcontainer calls that create, start, signal and delete them.
//!
//! libcontainer never runs in the shim process itself but in a short-lived forked helper (see
//! `in_helper`): its code and heap stay out of the long-lived shim (its RSS), a panic or leak in
//! it cannot take the shim down, and the container's init still becomes the shim's child (the
//! helper is not a subreaper, so when libcontainer's intermediate process exits, init is
//! reparented to the shim, which is).
//!
//! ```text
//!   create ──▶ Created ──start──▶ Running ──(reaped)──▶ Stopped ──delete──▶ (gone)
//!                 │                                        ▲
//!                 └────────────────(reaped)────────────────┘
//! ```
//! Reaping happens only between requests (the event loop and the start of each request), never
//! while libcontainer runs: it forks and waits for its own helper processes.
//!
//! A container with a log path, stdin or a tty has pipes for stdout and stderr (or a terminal)
//! whose read ends the shim keeps (logs.rs), and a stdin the shim writes to (stdio.rs). Attach
//! sessions are kept here with their container: output is copied to them as it is read, their
//! input goes to its stdin. Exec'd processes (exec.rs) are tracked here too, since their exits
//! are reaped here. Output for sessions is collected as frames (`take_session_output`); the
//! event loop owns the connections and queues the frames on them.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libcgroups::common::{create_cgroup_manager, AnyCgroupManager, CgroupConfig, CgroupManager, ControllerOpt};
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::oci_spec::runtime::{
    Capabilities, Capability as SpecCapability, LinuxCapabilities, LinuxNamespaceType, LinuxResources, LinuxSeccomp,
    Process, Spec,
};
use libcontainer::syscall::syscall::SyscallType;
use libcontainer::workload::default::DefaultExecutor;
use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError};
use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{fork, ForkResult, Pid};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

use crate::exec::{self, output_frame, Capture, Exec, Outbox, StreamExec};
use crate::exits::{self, exit_of, now_ns, ExitRecord};
use crate::logs::{self, ContainerLog, LogFile, LogStream};
use crate::oom;
use crate::pb::{self, session_input, session_output, ErrorCode};
use crate::stdio::{self, ConsoleSocket, Input};

/// How long DeleteContainer waits for a SIGKILLed container to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(10);
/// How long one libcontainer operation may take before its helper is killed.
const HELPER_TIMEOUT: Duration = Duration::from_secs(90);
/// Longest error message a helper sends back (the pipe must hold the whole answer).
const MAX_HELPER_MESSAGE: usize = 16 << 10;

/// A request's failure, sent to the daemon as `pb::Error`.
#[derive(Debug)]
pub struct ApiError {
    pub code: ErrorCode,
    pub message: String,
}

impl ApiError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ApiError {
            code,
            message: message.into(),
        }
    }
    fn not_found(id: &str) -> Self {
        Self::new(ErrorCode::NotFound, format!("no container {id:?} in this shim"))
    }
    fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }
    fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }
    fn precondition(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::FailedPrecondition, message)
    }
}

/// An error with its whole source chain, for messages a person can act on.
fn chain(err: &dyn std::error::Error) -> String {
    let mut s = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let next = e.to_string();
        if !s.contains(&next) {
            s.push_str(": ");
            s.push_str(&next);
        }
        cur = e.source();
    }
    s
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Created,
    Running,
    Stopped(ExitRecord),
}

impl Status {
    fn name(&self) -> &'static str {
        match self {
            Status::Created => "created",
            Status::Running => "running",
            Status::Stopped(_) => "stopped",
        }
    }
}

struct Entry {
    pid: i32,
    status: Status,
    created_at_ns: i64,
    started_at_ns: i64,
    /// Its output (to the log file, if it has one, and to attached sessions), when it has pipes
    /// or a terminal.
    log: Option<ContainerLog>,
    /// Its memory cgroup's OOM kill counter.
    oom: Option<oom::OomWatch>,
    /// The shim was asked to SIGKILL it (a stop or a delete): a SIGKILL exit then is not the OOM
    /// killer's unless its own counter says so.
    sigkill_sent: bool,
    /// Its stdin, when created with one (a pipe's write end, or the terminal's master).
    stdin: Option<Input>,
    /// The first attach session that ends its input closes stdin.
    stdin_once: bool,
    /// Its terminal's master, for resizes.
    tty: Option<OwnedFd>,
    attached: Vec<Attachment>,
}

/// An attach session of a container.
struct Attachment {
    conn: u64,
    /// Its input goes to the container's stdin (until it ends its input).
    stdin: bool,
    stdout: bool,
    stderr: bool,
}

impl Attachment {
    /// Wants output of stream `i` (0 stdout, 1 stderr; a terminal is stream 0 and serves both).
    fn wants(&self, i: usize, tty: bool) -> bool {
        if tty {
            self.stdout || self.stderr
        } else if i == 0 {
            self.stdout
        } else {
            self.stderr
        }
    }
}

/// Copies a chunk of a container's stream `i` to its attached sessions.
fn copy_to_sessions(attached: &[Attachment], tty: bool, i: usize, chunk: &[u8], outbox: &mut Outbox) {
    for a in attached.iter().filter(|a| a.wants(i, tty)) {
        outbox.push((a.conn, output_frame(i, chunk)));
    }
}

/// What CreateContainer asks for besides the bundle.
#[derive(Debug, Default, Clone)]
pub struct CreateOptions {
    pub create_only: bool,
    /// Absolute; empty: output goes to no file (to /dev/null unless stdin or tty).
    pub log_path: String,
    pub stdin: bool,
    pub tty: bool,
    /// 0: the default.
    pub max_log_line_bytes: u32,
    pub stdin_once: bool,
}

/// A descriptor the event loop polls for this module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A container's stdout (0) or stderr (1) pipe, or its terminal (0).
    Log(String, usize),
    /// An exec's (by serial) stdout (0) or stderr (1) pipe.
    Exec(u64, usize),
    /// An ExecStream's (by serial) stdout (0) or stderr (1) pipe, or its terminal (0).
    Stream(u64, usize),
    /// A container's stdin, with input waiting to be written.
    Stdin(String),
    /// An ExecStream's stdin, with input waiting to be written.
    StreamStdin(u64),
    /// A container's memory.events changed (cgroup v2).
    Oom(String),
}

pub struct Containers {
    /// libcontainer's root (`<state-dir>/containers`).
    root: PathBuf,
    /// The log file's descriptor: the only one (besides stdio) a libcontainer helper keeps.
    log_fd: RawFd,
    /// Exit records (`<state-dir>/exits`).
    exits_dir: PathBuf,
    table: BTreeMap<String, Entry>,
    /// Exec'd processes whose answer is pending.
    execs: Vec<Exec>,
    /// ExecStream processes (until their session got the exit).
    streams: Vec<StreamExec>,
    /// Serial numbers of execs and console sockets.
    next_exec: u64,
    /// Frames for sessions, taken by the event loop.
    outbox: Outbox,
    /// Containers' exits for exit subscribers, taken (and dropped when nobody subscribes) by the
    /// event loop.
    exits: Vec<pb::ContainerExit>,
    /// The systemd cgroup driver: libcontainer starts a scope per container over D-Bus.
    systemd: bool,
}

/// The container ids libcontainer accepts, which are also safe as file names.
pub fn validate_id(id: &str) -> Result<(), ApiError> {
    let ok = !id.is_empty()
        && id.len() <= 255
        && id != "."
        && id != ".."
        && id.chars().all(|c| c.is_ascii_alphanumeric() || "_+-.".contains(c));
    if ok {
        Ok(())
    } else {
        Err(ApiError::invalid(format!(
            "invalid container id {id:?}: use 1-255 of A-Z a-z 0-9 _ + - ."
        )))
    }
}

fn dev_null() -> Result<File, ApiError> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")
        .map_err(|e| ApiError::internal(format!("opening /dev/null: {e}")))
}

/// A pipe for a child's output: (read end, non-blocking; write end). Both close-on-exec (the
/// container's init dup2s the write end onto its stdout or stderr).
fn output_pipe() -> Result<(OwnedFd, OwnedFd), ApiError> {
    let (r, w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| ApiError::internal(format!("pipe: {e}")))?;
    nix::fcntl::fcntl(
        r.as_raw_fd(),
        nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK),
    )
    .map_err(|e| ApiError::internal(format!("fcntl: {e}")))?;
    Ok((r, w))
}

/// `fd`, or /dev/null.
fn or_dev_null(fd: Option<OwnedFd>) -> Result<OwnedFd, ApiError> {
    match fd {
        Some(fd) => Ok(fd),
        None => Ok(dev_null()?.into()),
    }
}

impl Containers {
    pub fn new(root: PathBuf, exits_dir: PathBuf, log_fd: RawFd) -> Self {
        Containers {
            root,
            log_fd,
            exits_dir,
            table: BTreeMap::new(),
            execs: Vec::new(),
            streams: Vec::new(),
            next_exec: 1,
            outbox: Vec::new(),
            exits: Vec::new(),
            systemd: false,
        }
    }

    /// Containers get transient systemd scopes (their cgroups paths are `slice:prefix:name`).
    pub fn with_systemd(mut self, systemd: bool) -> Self {
        self.systemd = systemd;
        self
    }

    /// The exits recorded since the last call, for exit subscribers.
    pub fn take_exits(&mut self) -> Vec<pb::ContainerExit> {
        std::mem::take(&mut self.exits)
    }

    /// A unix socket for a terminal's master (in the state dir: short enough for sun_path).
    fn console_socket(&mut self) -> Result<ConsoleSocket, ApiError> {
        let serial = self.next_exec;
        self.next_exec += 1;
        let path = self
            .root
            .parent()
            .unwrap_or(Path::new("/"))
            .join(format!("tty-{serial}.sock"));
        ConsoleSocket::bind(path).map_err(|e| ApiError::internal(format!("console socket for a terminal: {e}")))
    }

    /// Where libcontainer's own messages (also those of the container's init before it execs) go.
    fn log_path(&self) -> PathBuf {
        self.root.parent().unwrap_or(Path::new("/")).join("shim.log")
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.table.len()
    }

    pub fn create(&mut self, id: &str, bundle: &str, opts: &CreateOptions) -> Result<u32, ApiError> {
        validate_id(id)?;
        if self.table.contains_key(id) {
            return Err(ApiError::new(
                ErrorCode::AlreadyExists,
                format!("container {id:?} exists already in this shim"),
            ));
        }
        let bundle = Path::new(bundle);
        if !bundle.is_absolute() {
            return Err(ApiError::invalid(format!("bundle {bundle:?} is not an absolute path")));
        }
        if !bundle.join("config.json").is_file() {
            return Err(ApiError::invalid(format!("bundle {bundle:?} has no config.json")));
        }
        let log_path = Path::new(&opts.log_path);
        if !opts.log_path.is_empty() && !log_path.is_absolute() {
            return Err(ApiError::invalid(format!("log path {log_path:?} is not absolute")));
        }
        self.remove_leftover(id);

        // Output: pipes (or the terminal) whose read ends this shim keeps, or /dev/null.
        let file = if opts.log_path.is_empty() {
            None
        } else {
            let max_line = match opts.max_log_line_bytes as usize {
                0 => logs::DEFAULT_MAX_LINE,
                n => n.clamp(logs::MIN_MAX_LINE, logs::MAX_MAX_LINE),
            };
            Some(
                LogFile::open(log_path.to_path_buf(), max_line)
                    .map_err(|e| ApiError::internal(format!("opening the log file {log_path:?}: {e}")))?,
            )
        };
        let mut streams = Vec::new();
        let mut child_out = [None, None];
        let mut child_in = None;
        let mut stdin = None;
        let console = if opts.tty { Some(self.console_socket()?) } else { None };
        if !opts.tty && (file.is_some() || opts.stdin) {
            let (out_r, out_w) = output_pipe()?;
            let (err_r, err_w) = output_pipe()?;
            streams = vec![LogStream::new("stdout", out_r), LogStream::new("stderr", err_r)];
            child_out = [Some(out_w), Some(err_w)];
        }
        if opts.stdin && !opts.tty {
            let (r, w) = stdio::input_pipe().map_err(|e| ApiError::internal(format!("stdin pipe: {e}")))?;
            child_in = Some(r);
            stdin = Some(Input::new(w, false));
        }
        let keep: Vec<RawFd> = std::iter::once(self.log_fd)
            .chain(child_out.iter().chain([&child_in]).flatten().map(|f| f.as_raw_fd()))
            .collect();
        let [stdout, stderr] = child_out;

        let root = self.root.clone();
        let log_file = self.log_path();
        let log_start = std::fs::metadata(&log_file).map(|m| m.len()).unwrap_or(0);
        let console_path = console.as_ref().map(|c| c.path().to_path_buf());
        let tty = opts.tty;
        let systemd = self.systemd;
        // The closure owns the child's ends: the shim's copies close when in_helper returns.
        let pid = in_helper(&format!("creating container {id}"), &keep, move || {
            check_terminal(bundle, tty)?;
            let builder = ContainerBuilder::new(id.to_owned(), SyscallType::Linux)
                .with_executor(ShimExecutor::default())
                .with_root_path(&root)
                .map_err(|e| ApiError::internal(chain(&e)))?;
            // With a terminal, libcontainer makes it the process's stdio.
            let builder = match console_path {
                Some(path) => builder.with_console_socket(Some(path)),
                None => builder
                    .with_stdin(or_dev_null(child_in)?)
                    .with_stdout(or_dev_null(stdout)?)
                    .with_stderr(or_dev_null(stderr)?),
            };
            let mut container = builder
                .validate_id()
                .map_err(|e| ApiError::invalid(chain(&e)))?
                .as_init(bundle)
                .with_systemd(systemd)
                .with_detach(true)
                .build()
                .map_err(|e| {
                    ApiError::internal(format!(
                        "creating container {id}: {}{} (details in {log_file:?})",
                        chain(&e),
                        first_errors(&log_file, log_start)
                    ))
                })?;
            let Some(pid) = container.pid() else {
                let _ = container.delete(true);
                return Err(ApiError::internal(format!("container {id}: libcontainer gave no pid")));
            };
            Ok(pid.as_raw())
        });
        let pid = match pid {
            Ok(pid) => pid,
            Err(e) => {
                // libcontainer cleans up after itself, unless its helper died or timed out.
                self.remove_leftover(id);
                return Err(e);
            }
        };
        let mut tty_master = None;
        if let Some(console) = console {
            let received = console.receive().and_then(|master| {
                let log_copy = stdio::dup(master.as_fd())?;
                let stdin_copy = if opts.stdin {
                    Some(stdio::dup(master.as_fd())?)
                } else {
                    None
                };
                Ok((master, log_copy, stdin_copy))
            });
            match received {
                Ok((master, log_copy, stdin_copy)) => {
                    streams = vec![LogStream::new("stdout", log_copy)];
                    stdin = stdin_copy.map(|fd| Input::new(fd, true));
                    tty_master = Some(master);
                }
                Err(e) => {
                    let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
                    self.wait_for_exit(pid, KILL_WAIT);
                    self.remove_leftover(id);
                    return Err(ApiError::internal(format!(
                        "container {id}: its terminal did not arrive: {e} (details in {:?})",
                        self.log_path()
                    )));
                }
            }
        }
        let log = (!streams.is_empty()).then_some(ContainerLog {
            file,
            streams,
            terminal: opts.tty,
        });
        // init is in its cgroups already (libcontainer's intermediate process joined them first).
        let oom = oom::OomWatch::new(pid);
        tracing::info!(id, pid, ?bundle, log = %opts.log_path, stdin = opts.stdin, tty = opts.tty, oom_counter = ?oom.as_ref().map(|o| o.path()), "container created");
        self.table.insert(
            id.to_owned(),
            Entry {
                pid,
                status: Status::Created,
                created_at_ns: now_ns(),
                started_at_ns: 0,
                log,
                oom,
                sigkill_sent: false,
                stdin,
                stdin_once: opts.stdin && opts.stdin_once,
                tty: tty_master,
                attached: Vec::new(),
            },
        );
        if !opts.create_only {
            if let Err(e) = self.start(id) {
                if let Err(del) = self.delete(id) {
                    tracing::error!(id, error = %del.message, "removing a container that failed to start");
                }
                return Err(e);
            }
        }
        Ok(pid as u32)
    }

    pub fn start(&mut self, id: &str) -> Result<(), ApiError> {
        let entry = self.table.get_mut(id).ok_or_else(|| ApiError::not_found(id))?;
        if entry.status != Status::Created {
            return Err(ApiError::new(
                ErrorCode::FailedPrecondition,
                format!(
                    "container {id} is {}, only a created container can start",
                    entry.status.name()
                ),
            ));
        }
        let dir = self.root.join(id);
        let log = self.log_path();
        in_helper(&format!("starting container {id}"), &[self.log_fd], || {
            Container::load(dir)
                .and_then(|mut c| c.start())
                .map_err(|e| ApiError::internal(format!("starting container {id}: {} (details in {log:?})", chain(&e))))
        })?;
        let entry = self.table.get_mut(id).ok_or_else(|| ApiError::not_found(id))?;
        entry.status = Status::Running;
        entry.started_at_ns = now_ns();
        tracing::info!(id, pid = entry.pid, "container started");
        Ok(())
    }

    pub fn state(&self, id: &str) -> Result<pb::StateResponse, ApiError> {
        let e = self.table.get(id).ok_or_else(|| ApiError::not_found(id))?;
        let (status, exit) = match e.status {
            Status::Created => (pb::ContainerStatus::Created, None),
            Status::Running => (pb::ContainerStatus::Running, None),
            Status::Stopped(rec) => (pb::ContainerStatus::Stopped, Some(rec)),
        };
        Ok(pb::StateResponse {
            pid: e.pid as u32,
            status: status as i32,
            exit_code: exit.map(|r| r.exit_code),
            finished_at_ns: exit.map(|r| r.finished_at_ns),
            created_at_ns: e.created_at_ns,
            started_at_ns: e.started_at_ns,
            oom_killed: exit.is_some_and(|r| r.oom_killed),
            log_bytes_dropped: e.log.as_ref().and_then(|l| l.file.as_ref()).map_or(0, |f| f.dropped),
        })
    }

    /// Opens the container's log file again (it was renamed away to rotate it).
    pub fn reopen_log(&mut self, id: &str) -> Result<(), ApiError> {
        let entry = self.table.get_mut(id).ok_or_else(|| ApiError::not_found(id))?;
        match &mut entry.log {
            Some(log) if log.is_open() => {
                let Some(file) = &mut log.file else { return Ok(()) };
                file.reopen()
                    .map_err(|e| ApiError::internal(format!("reopening the log of container {id}: {e}")))?;
                tracing::debug!(id, "log file reopened");
                Ok(())
            }
            // No log file, or its output has ended: nothing will be written any more.
            _ => Ok(()),
        }
    }

    /// Applies new cgroup limits (an OCI `LinuxResources`, JSON) to a created or running
    /// container: only what the JSON sets changes. Its device rules stay as created.
    pub fn update_resources(&mut self, id: &str, resources_json: &str) -> Result<(), ApiError> {
        let entry = self.table.get(id).ok_or_else(|| ApiError::not_found(id))?;
        if let Status::Stopped(_) = entry.status {
            return Err(ApiError::precondition(format!(
                "container {id} is stopped, its resources cannot be updated"
            )));
        }
        let mut resources: LinuxResources = serde_json::from_str(resources_json).map_err(|e| {
            ApiError::invalid(format!(
                "resources for container {id} are not an OCI LinuxResources object: {e}"
            ))
        })?;
        resources.set_devices(None);
        let dir = self.root.join(id);
        let log = self.log_path();
        in_helper(
            &format!("updating resources of container {id}"),
            &[self.log_fd],
            move || {
                update_cgroup(id, &dir, resources).map_err(|e| {
                    ApiError::new(
                        e.code,
                        format!(
                            "updating resources of container {id}: {} (details in {log:?})",
                            e.message
                        ),
                    )
                })
            },
        )?;
        tracing::info!(id, resources = resources_json, "resources updated");
        Ok(())
    }

    /// Checks an exec request: the container runs, the command and environment make sense.
    fn check_exec(&self, id: &str, args: &[String], env: &[String]) -> Result<(), ApiError> {
        let entry = self.table.get(id).ok_or_else(|| ApiError::not_found(id))?;
        if entry.status != Status::Running {
            return Err(ApiError::precondition(format!(
                "container {id} is {}, exec needs a running container",
                entry.status.name()
            )));
        }
        if args.is_empty() || args[0].is_empty() {
            return Err(ApiError::invalid("exec needs a command"));
        }
        if let Some(bad) = env.iter().find(|e| !e.contains('=') || e.starts_with('=')) {
            return Err(ApiError::invalid(format!("environment entry {bad:?} is not KEY=VALUE")));
        }
        Ok(())
    }

    /// Starts `args` in container `id` through a libcontainer helper, with `io`: (serial, pid).
    fn spawn_exec(
        &mut self,
        id: &str,
        args: Vec<String>,
        env: Vec<String>,
        io: ExecIo,
    ) -> Result<(u64, i32), ApiError> {
        let serial = self.next_exec;
        self.next_exec += 1;
        let keep: Vec<RawFd> = std::iter::once(self.log_fd)
            .chain(
                [&io.stdin, &io.stdout, &io.stderr]
                    .into_iter()
                    .flatten()
                    .map(|f| f.as_raw_fd()),
            )
            .collect();
        let root = self.root.clone();
        let process_file = self
            .root
            .parent()
            .unwrap_or(Path::new("/"))
            .join(format!("exec-{serial}.json"));
        let log_file = self.log_path();
        let pid = in_helper(&format!("exec in container {id}"), &keep, move || {
            let result = exec_in_helper(id, &root, &process_file, args, env, io);
            let _ = fs::remove_file(&process_file);
            result.map_err(|e| {
                ApiError::new(
                    e.code,
                    format!("exec in container {id}: {} (details in {log_file:?})", e.message),
                )
            })
        })?;
        Ok((serial, pid))
    }

    /// Starts `r.args` in the running container `r.container_id`, for the connection `conn`. The
    /// answer comes from `take_finished_execs` once the process has exited.
    pub fn exec(&mut self, conn: u64, r: pb::ExecRequest) -> Result<(), ApiError> {
        let started = Instant::now();
        let id = r.container_id.as_str();
        self.check_exec(id, &r.args, &r.env)?;
        let max = match usize::try_from(r.max_output_bytes) {
            Ok(0) | Err(_) => exec::DEFAULT_MAX_OUTPUT,
            Ok(n) => n.min(exec::DEFAULT_MAX_OUTPUT),
        };
        let deadline = (r.timeout_ms > 0).then(|| started + Duration::from_millis(r.timeout_ms.into()));
        let (out_r, out_w) = output_pipe()?;
        let (err_r, err_w) = output_pipe()?;
        let io = ExecIo {
            stdout: Some(out_w),
            stderr: Some(err_w),
            ..ExecIo::default()
        };
        let (serial, pid) = self.spawn_exec(id, r.args, r.env, io)?;
        tracing::info!(id, pid, serial, setup = ?started.elapsed(), "exec started");
        self.execs.push(Exec::new(
            serial,
            conn,
            id.to_owned(),
            pid,
            [Capture::new(out_r, max), Capture::new(err_r, max)],
            deadline,
        ));
        Ok(())
    }

    /// Starts `r.args` in the running container `r.container_id` with its stdio a session on
    /// the connection `conn`; the process's pid. Output and the exit come as frames for `conn`.
    pub fn exec_stream(&mut self, conn: u64, r: pb::ExecStreamRequest) -> Result<u32, ApiError> {
        let started = Instant::now();
        let id = r.container_id.as_str();
        self.check_exec(id, &r.args, &r.env)?;
        let winsize = if r.tty { stdio::winsize(r.width, r.height) } else { None };
        let mut io = ExecIo {
            winsize,
            ..ExecIo::default()
        };
        let mut out = [None, None];
        let mut stdin = None;
        let console = if r.tty {
            let console = self.console_socket()?;
            io.console = Some(console.path().to_path_buf());
            Some(console)
        } else {
            let (out_r, out_w) = output_pipe()?;
            let (err_r, err_w) = output_pipe()?;
            out = [Some(out_r), Some(err_r)];
            (io.stdout, io.stderr) = (Some(out_w), Some(err_w));
            if r.stdin {
                let (r, w) = stdio::input_pipe().map_err(|e| ApiError::internal(format!("stdin pipe: {e}")))?;
                io.stdin = Some(r);
                stdin = Some(Input::new(w, false));
            }
            None
        };
        let (serial, pid) = self.spawn_exec(id, r.args, r.env, io)?;
        let mut master = None;
        if let Some(console) = console {
            let received = console.receive().and_then(|m| {
                let out_copy = stdio::dup(m.as_fd())?;
                let stdin_copy = if r.stdin { Some(stdio::dup(m.as_fd())?) } else { None };
                Ok((m, out_copy, stdin_copy))
            });
            match received {
                Ok((m, out_copy, stdin_copy)) => {
                    // The process set the size itself before it exec'd (see ShimExecutor); this
                    // only repeats it.
                    if let Some(ws) = winsize {
                        let _ = stdio::set_winsize(m.as_raw_fd(), ws);
                    }
                    out[0] = Some(out_copy);
                    stdin = stdin_copy.map(|fd| Input::new(fd, true));
                    master = Some(m);
                }
                Err(e) => {
                    // Reaped by the event loop as an unknown child.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                    return Err(ApiError::internal(format!(
                        "exec in container {id}: its terminal did not arrive: {e} (details in {:?})",
                        self.log_path()
                    )));
                }
            }
        }
        tracing::info!(id, pid, serial, tty = r.tty, stdin = r.stdin, setup = ?started.elapsed(), "exec session started");
        self.streams
            .push(StreamExec::new(serial, conn, id.to_owned(), pid, out, stdin, master));
        Ok(pid as u32)
    }

    /// Attaches the connection `conn` to container `r.container_id`'s stdio: from now on its
    /// output is copied to `conn` as frames, and input from `conn` goes to its stdin.
    pub fn attach(&mut self, conn: u64, r: pb::AttachRequest) -> Result<pb::AttachResponse, ApiError> {
        let id = r.container_id.as_str();
        let entry = self.table.get_mut(id).ok_or_else(|| ApiError::not_found(id))?;
        if let Status::Stopped(_) = entry.status {
            return Err(ApiError::precondition(format!(
                "container {id} is stopped, there is nothing to attach to"
            )));
        }
        if r.stdin {
            match &entry.stdin {
                None => {
                    return Err(ApiError::precondition(format!(
                        "container {id} was created without stdin, attach cannot write to it"
                    )))
                }
                Some(input) if !input.is_open() => {
                    return Err(ApiError::precondition(format!(
                        "the stdin of container {id} is closed{}",
                        if entry.stdin_once {
                            " (stdin_once: an earlier attach ended its input)"
                        } else {
                            ""
                        }
                    )))
                }
                Some(_) => {}
            }
        }
        entry.attached.push(Attachment {
            conn,
            stdin: r.stdin,
            stdout: r.stdout,
            stderr: r.stderr,
        });
        tracing::info!(
            id,
            conn,
            stdin = r.stdin,
            stdout = r.stdout,
            stderr = r.stderr,
            "attached"
        );
        Ok(pb::AttachResponse {
            tty: entry.tty.is_some(),
        })
    }

    /// Input from the session on `conn`: stdin data, its end, or a terminal size.
    pub fn session_input(&mut self, conn: u64, input: session_input::Kind) {
        if let Some(x) = self.streams.iter_mut().find(|x| x.conn == Some(conn)) {
            match input {
                session_input::Kind::Stdin(data) => {
                    if let Some(i) = &mut x.stdin {
                        i.push(&data);
                    }
                }
                session_input::Kind::CloseStdin(_) => {
                    if let Some(i) = &mut x.stdin {
                        i.close();
                    }
                }
                session_input::Kind::Resize(r) => x.resize(r.width, r.height),
            }
            return;
        }
        let Some((id, entry)) = self
            .table
            .iter_mut()
            .find(|(_, e)| e.attached.iter().any(|a| a.conn == conn))
        else {
            return;
        };
        let Some(a) = entry.attached.iter_mut().find(|a| a.conn == conn) else {
            return;
        };
        match input {
            session_input::Kind::Stdin(data) => {
                if a.stdin {
                    if let Some(i) = &mut entry.stdin {
                        i.push(&data);
                    }
                }
            }
            session_input::Kind::CloseStdin(_) => {
                if a.stdin {
                    a.stdin = false;
                    end_attach_input(id, entry);
                }
            }
            session_input::Kind::Resize(r) => {
                if let (Some(master), Some(ws)) = (&entry.tty, stdio::winsize(r.width, r.height)) {
                    if let Err(e) = stdio::set_winsize(master.as_raw_fd(), ws) {
                        tracing::debug!(id, error = %e, "resizing a container's terminal");
                    }
                }
            }
        }
    }

    /// Whether the session on `conn` may send more input now: false while its stdin has more
    /// queued than the process has taken (the session is then not read; nothing is dropped).
    pub fn session_input_room(&self, conn: u64) -> bool {
        if let Some(x) = self.streams.iter().find(|x| x.conn == Some(conn)) {
            return x.stdin.as_ref().is_none_or(|i| i.has_room());
        }
        for entry in self.table.values() {
            if entry.attached.iter().any(|a| a.conn == conn && a.stdin) {
                return entry.stdin.as_ref().is_none_or(|i| i.has_room());
            }
        }
        true
    }

    /// The session on `conn` went away: an exec's process is killed, an attach detaches (its
    /// input ends, which closes stdin with stdin_once).
    pub fn session_closed(&mut self, conn: u64) {
        if let Some(x) = self.streams.iter_mut().find(|x| x.conn == Some(conn)) {
            if !x.exited() {
                tracing::info!(container = %x.container, pid = x.pid, "exec session closed by the client, killing its process");
            }
            x.abandon();
            return;
        }
        for (id, entry) in self.table.iter_mut() {
            if let Some(pos) = entry.attached.iter().position(|a| a.conn == conn) {
                let a = entry.attached.remove(pos);
                tracing::info!(id, conn, "detached");
                if a.stdin {
                    end_attach_input(id, entry);
                }
                return;
            }
        }
    }

    /// Frames for sessions since the last call.
    pub fn take_session_output(&mut self) -> Outbox {
        std::mem::take(&mut self.outbox)
    }

    /// Hands the exits of finished ExecStream processes to their sessions (after their output).
    pub fn finish_streams(&mut self) {
        let now = Instant::now();
        let mut i = 0;
        while i < self.streams.len() {
            if self.streams[i].is_done(now) {
                self.streams.swap_remove(i).finish(&mut self.outbox);
            } else {
                i += 1;
            }
        }
    }

    /// Descriptors to poll (containers' output and stdin, execs) and the events wanted. `room`:
    /// how much more a session's connection takes now (ExecStream output is read only that far).
    pub fn poll_sources(&self, room: &dyn Fn(u64) -> usize) -> Vec<(Source, BorrowedFd<'_>, i16)> {
        let mut out = Vec::new();
        for (id, e) in &self.table {
            if let Some(log) = &e.log {
                for (i, s) in log.streams.iter().enumerate() {
                    if let Some(fd) = s.fd() {
                        out.push((Source::Log(id.clone(), i), fd, libc::POLLIN));
                    }
                }
            }
            if let Some(fd) = e.stdin.as_ref().and_then(|i| i.pending_fd()) {
                out.push((Source::Stdin(id.clone()), fd, libc::POLLOUT));
            }
            if let (Status::Created | Status::Running, Some(fd)) = (&e.status, e.oom.as_ref().and_then(|o| o.fd())) {
                out.push((Source::Oom(id.clone()), fd, libc::POLLPRI));
            }
        }
        for x in &self.execs {
            for (i, c) in x.out.iter().enumerate() {
                if let Some(fd) = c.fd() {
                    out.push((Source::Exec(x.serial, i), fd, libc::POLLIN));
                }
            }
        }
        for x in &self.streams {
            if x.conn.is_none_or(|c| room(c) > 0) {
                for (i, fd) in x.out_fds() {
                    out.push((Source::Stream(x.serial, i), fd, libc::POLLIN));
                }
            }
            if let Some(fd) = x.stdin.as_ref().and_then(|i| i.pending_fd()) {
                out.push((Source::StreamStdin(x.serial), fd, libc::POLLOUT));
            }
        }
        out
    }

    /// A polled descriptor is ready (`revents`).
    pub fn on_ready(&mut self, source: &Source, revents: i16, room: &dyn Fn(u64) -> usize) {
        // For a stdin: its reader is gone (a pipe's read end closed, a terminal's slave closed).
        let gone = revents & (libc::POLLHUP | libc::POLLERR) != 0;
        match source {
            Source::Oom(id) => {
                if let Some(watch) = self.table.get_mut(id).and_then(|e| e.oom.as_mut()) {
                    watch.refresh();
                }
            }
            Source::Log(id, i) => {
                let Containers { table, outbox, .. } = self;
                if let Some(Entry {
                    log: Some(log),
                    attached,
                    ..
                }) = table.get_mut(id)
                {
                    let tty = log.terminal;
                    log.drain(*i, id, false, &mut |s, chunk| {
                        copy_to_sessions(attached, tty, s, chunk, outbox)
                    });
                }
            }
            Source::Exec(serial, i) => {
                if let Some(x) = self.execs.iter_mut().find(|x| x.serial == *serial) {
                    x.out[*i].drain(false);
                }
            }
            Source::Stream(serial, i) => {
                if let Some(x) = self.streams.iter_mut().find(|x| x.serial == *serial) {
                    let room = x.conn.map_or(usize::MAX, room);
                    x.read(*i, room, &mut self.outbox);
                }
            }
            Source::Stdin(id) => {
                if let Some(input) = self.table.get_mut(id).and_then(|e| e.stdin.as_mut()) {
                    if gone {
                        input.hang_up();
                    } else {
                        input.flush();
                    }
                }
            }
            Source::StreamStdin(serial) => {
                if let Some(input) = self
                    .streams
                    .iter_mut()
                    .find(|x| x.serial == *serial)
                    .and_then(|x| x.stdin.as_mut())
                {
                    if gone {
                        input.hang_up();
                    } else {
                        input.flush();
                    }
                }
            }
        }
    }

    /// The earliest time an exec needs attention (a timeout, the end of waiting for its output).
    pub fn next_wake(&self) -> Option<Instant> {
        self.execs
            .iter()
            .filter_map(|x| x.wake_at())
            .chain(self.streams.iter().filter_map(|x| x.wake_at()))
            .min()
    }

    /// Kills timed-out execs and hands out the answers of finished ones: (connection, answer);
    /// answers of execs whose connection went away are dropped.
    pub fn take_finished_execs(&mut self) -> Vec<(u64, pb::ExecResponse)> {
        let now = Instant::now();
        for x in &mut self.execs {
            x.check_timeout(now);
        }
        let mut out = Vec::new();
        let mut i = 0;
        while i < self.execs.len() {
            if self.execs[i].is_done(now) {
                let x = self.execs.swap_remove(i);
                let conn = x.conn;
                let (serial, container) = (x.serial, x.container.clone());
                let resp = x.into_response();
                tracing::info!(
                    container,
                    serial,
                    exit_code = resp.exit_code,
                    timed_out = resp.timed_out,
                    "exec finished"
                );
                if let Some(conn) = conn {
                    out.push((conn, resp));
                }
            } else {
                i += 1;
            }
        }
        out
    }

    /// The connection waiting for these execs went away: kill them, nobody wants their answer.
    pub fn abandon_execs(&mut self, conn: u64) {
        for x in self.execs.iter_mut().filter(|x| x.conn == Some(conn)) {
            tracing::info!(container = %x.container, pid = x.pid, "exec's client went away, killing it");
            x.conn = None;
            x.kill();
        }
    }

    #[cfg(test)]
    pub fn pending_execs(&self) -> usize {
        self.execs.len()
    }

    pub fn kill(&mut self, id: &str, signal: u32, all: bool) -> Result<(), ApiError> {
        let entry = self.table.get_mut(id).ok_or_else(|| ApiError::not_found(id))?;
        let sig = i32::try_from(signal)
            .ok()
            .filter(|s| (1..=libc::SIGRTMAX()).contains(s))
            .ok_or_else(|| ApiError::invalid(format!("invalid signal {signal}")))?;
        let stopped = matches!(entry.status, Status::Stopped(_));
        entry.sigkill_sent |= sig == libc::SIGKILL;
        if all && sig == libc::SIGKILL && !stopped {
            if let Some(file) = crate::cgroup_kill::kill_file(id, entry.pid) {
                match std::fs::write(&file, "1") {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        tracing::warn!(id, file = %file.display(), error = %e, "cgroup.kill failed; signalling each process")
                    }
                }
            }
        }
        if all {
            // Every process in the container's cgroup (the freezer keeps them from forking away).
            let nsig = Signal::try_from(sig)
                .map_err(|_| ApiError::invalid(format!("signal {sig} cannot be sent to all processes")))?;
            let dir = self.root.join(id);
            let killed = in_helper(&format!("killing container {id}"), &[self.log_fd], || {
                Container::load(dir)
                    .and_then(|mut c| c.kill(nsig, true))
                    .map_err(|e| ApiError::internal(chain(&e)))
            });
            match killed {
                Ok(()) => Ok(()),
                Err(e) if stopped => {
                    tracing::debug!(id, error = %e.message, "kill --all of a stopped container");
                    Ok(())
                }
                Err(e) => Err(ApiError::internal(format!("killing container {id}: {}", e.message))),
            }
        } else if stopped {
            // Already reaped: its pid may belong to someone else now.
            Ok(())
        } else {
            // Not reaped yet, so the pid is still ours (at worst a zombie). libc::kill because
            // nix's Signal has no real-time signals.
            if unsafe { libc::kill(entry.pid, sig) } == 0 || Errno::last() == Errno::ESRCH {
                Ok(())
            } else {
                Err(ApiError::internal(format!(
                    "signal {sig} to container {id}: {}",
                    std::io::Error::last_os_error()
                )))
            }
        }
    }

    /// SIGKILLs the container if needed, waits for it, removes it everywhere. Unknown ids are OK.
    pub fn delete(&mut self, id: &str) -> Result<(), ApiError> {
        validate_id(id)?;
        let Some(entry) = self.table.get_mut(id) else {
            self.remove_leftover(id);
            let _ = exits::remove(&self.exits_dir, id);
            return Ok(());
        };
        let dir = self.root.join(id);
        if !matches!(entry.status, Status::Stopped(_)) {
            entry.sigkill_sent = true;
            let pid = entry.pid;
            let killed = in_helper(&format!("killing container {id}"), &[self.log_fd], || {
                Container::load(dir.clone())
                    .and_then(|mut c| c.kill(Signal::SIGKILL, true))
                    .map_err(|e| ApiError::internal(chain(&e)))
            });
            if let Err(e) = killed {
                tracing::warn!(id, error = %e.message, "kill --all failed, killing init only");
            }
            // Not reaped yet, so the pid is still the container's.
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), Signal::SIGKILL);
            if !self.wait_for_exit(pid, KILL_WAIT) {
                return Err(ApiError::internal(format!(
                    "container {id} (pid {pid}) did not exit within {KILL_WAIT:?} of SIGKILL"
                )));
            }
        }
        if let Some(log) = self.table.get_mut(id).and_then(|e| e.log.as_mut()) {
            log.close(id);
        }
        if dir.exists() {
            in_helper(&format!("deleting container {id}"), &[self.log_fd], || {
                Container::load(dir.clone())
                    .and_then(|mut c| c.delete(true))
                    .map_err(|e| ApiError::internal(format!("deleting container {id}: {}", chain(&e))))
            })?;
        }
        self.table.remove(id);
        exits::remove(&self.exits_dir, id)
            .map_err(|e| ApiError::internal(format!("removing exit file of {id}: {e}")))?;
        tracing::info!(id, "container deleted");
        Ok(())
    }

    /// Deletes every container (Shutdown). Tries all of them, then reports the first failure.
    pub fn delete_all(&mut self) -> Result<(), ApiError> {
        let mut ids: Vec<String> = self.table.keys().cloned().collect();
        // And whatever libcontainer holds that the table does not (a helper that died mid-way).
        if let Ok(dir) = fs::read_dir(&self.root) {
            for name in dir.flatten().filter_map(|e| e.file_name().into_string().ok()) {
                if !self.table.contains_key(&name) && validate_id(&name).is_ok() {
                    ids.push(name);
                }
            }
        }
        let mut first = None;
        for id in ids {
            if let Err(e) = self.delete(&id) {
                tracing::error!(id, error = %e.message, "delete during shutdown");
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Reaps every child that has exited (containers' init processes and orphans that were
    /// reparented to the shim as subreaper), recording the containers' exits. Never blocks.
    pub fn reap(&mut self) {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(Errno::ECHILD) => return,
                Ok(status) => {
                    if let Some((pid, code)) = exit_of(status) {
                        self.on_exit(pid, code);
                    }
                }
                Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::error!(error = %e, "waitpid");
                    return;
                }
            }
        }
    }

    /// Waits (bounded) for one of our children to exit and records it. True once it has.
    fn wait_for_exit(&mut self, pid: i32, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            match waitpid(Pid::from_raw(pid), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => {}
                Ok(status) => {
                    if let Some((pid, code)) = exit_of(status) {
                        self.on_exit(pid, code);
                        return true;
                    }
                }
                Err(Errno::ECHILD) => {
                    // Not our child (should not happen: we are its subreaper). It is gone once
                    // /proc no longer has it; its exit code is lost.
                    if !Path::new(&format!("/proc/{pid}")).exists() {
                        tracing::warn!(pid, "container exited but was not our child; exit code unknown");
                        self.on_exit(pid, 255);
                        return true;
                    }
                }
                Err(e) => tracing::error!(pid, error = %e, "waitpid"),
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn on_exit(&mut self, pid: i32, exit_code: i32) {
        let Some((id, entry)) = self
            .table
            .iter_mut()
            .find(|(_, e)| e.pid == pid && !matches!(e.status, Status::Stopped(_)))
        else {
            if let Some(x) = self.execs.iter_mut().find(|x| x.pid == pid && !x.exited()) {
                tracing::debug!(pid, exit_code, container = %x.container, "exec'd process exited");
                x.on_exit(exit_code);
            } else if let Some(x) = self.streams.iter_mut().find(|x| x.pid == pid && !x.exited()) {
                tracing::debug!(pid, exit_code, container = %x.container, "exec session's process exited");
                x.on_exit(exit_code);
            } else {
                tracing::debug!(pid, exit_code, "reaped a process that is no container's init");
            }
            return;
        };
        let finished_at_ns = now_ns();
        // Everything it wrote is in the log (and on its way to attached sessions) before its exit
        // is reported.
        if let Some(log) = &mut entry.log {
            let tty = log.terminal;
            let (attached, outbox) = (&entry.attached, &mut self.outbox);
            log.drain_all(id, &mut |s, chunk| copy_to_sessions(attached, tty, s, chunk, outbox));
        }
        // Sessions end with the exit; nobody writes to its stdin or resizes its terminal again.
        for a in entry.attached.drain(..) {
            self.outbox
                .push((a.conn, session_output::Kind::Exit(pb::SessionExit { exit_code })));
        }
        entry.stdin = None;
        entry.tty = None;
        // The kernel's OOM killer sends SIGKILL. The counter: as last seen, or read now (cgroupfs
        // keeps the cgroup until delete; systemd may have removed the scope already).
        let sigkill_sent = entry.sigkill_sent;
        let oom_killed = exit_code == 128 + libc::SIGKILL && entry.oom.as_mut().is_some_and(|w| w.killed(sigkill_sent));
        let record = ExitRecord {
            exit_code,
            finished_at_ns,
            oom_killed,
        };
        // Durable before anyone can see it.
        if let Err(e) = exits::write(&self.exits_dir, id, &record) {
            tracing::error!(id, error = %e, "writing the exit file failed; exit kept in memory only");
        }
        entry.status = Status::Stopped(record);
        self.exits.push(pb::ContainerExit {
            container_id: id.clone(),
            exit_code,
            finished_at_ns,
            oom_killed,
        });
        tracing::info!(id, pid, exit_code, oom_killed, "container exited");
    }

    /// Removes what a failed or interrupted earlier attempt left in libcontainer's root.
    fn remove_leftover(&self, id: &str) {
        let dir = self.root.join(id);
        if !dir.exists() {
            return;
        }
        tracing::warn!(id, ?dir, "removing leftover container state");
        let deleted = in_helper(&format!("deleting leftover container {id}"), &[self.log_fd], || {
            Container::load(dir.clone())
                .and_then(|mut c| c.delete(true))
                .map_err(|e| ApiError::internal(chain(&e)))
        });
        if let Err(e) = deleted {
            tracing::warn!(id, error = %e.message, "libcontainer delete of leftover failed");
            let _ = fs::remove_dir_all(&dir);
        }
    }
}

/// An attach session that fed stdin ended its input: with stdin_once, that closes stdin.
fn end_attach_input(id: &str, entry: &mut Entry) {
    if !entry.stdin_once {
        return;
    }
    if let Some(input) = entry.stdin.as_mut().filter(|i| i.is_open()) {
        tracing::info!(
            id,
            "stdin_once: an attach ended its input, closing the container's stdin"
        );
        input.close();
    }
}

/// What a helper sends back: the result, JSON, in one write to a pipe.
#[derive(Serialize, Deserialize)]
enum HelperAnswer<T> {
    Ok(T),
    Err { code: i32, message: String },
}

/// An exec'd process's stdio: descriptors for its stdin, stdout and stderr (/dev/null when None),
/// or a terminal (its master sent over the console socket at `console`).
#[derive(Default)]
struct ExecIo {
    stdin: Option<OwnedFd>,
    stdout: Option<OwnedFd>,
    stderr: Option<OwnedFd>,
    console: Option<PathBuf>,
    /// The terminal's initial size (columns, rows).
    winsize: Option<(u16, u16)>,
}

/// The helper's part of an exec: the container's process (from its bundle) with other args and
/// env, written to `process_file` for libcontainer's tenant builder, run with `io`.
fn exec_in_helper(
    id: &str,
    root: &Path,
    process_file: &Path,
    args: Vec<String>,
    env: Vec<String>,
    io: ExecIo,
) -> Result<i32, ApiError> {
    let container = Container::load(root.join(id)).map_err(|e| ApiError::internal(chain(&e)))?;
    let spec = Spec::load(container.bundle().join("config.json")).map_err(|e| ApiError::internal(chain(&e)))?;
    let mut process = spec
        .process()
        .clone()
        .ok_or_else(|| ApiError::internal("the container's spec has no process"))?;
    let mut merged: Vec<String> = process
        .env()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            let key = e.split('=').next().unwrap_or("");
            !env.iter().any(|o| o.split('=').next() == Some(key))
        })
        .collect();
    merged.extend(env);
    process
        .set_args(Some(args))
        .set_env(Some(merged))
        .set_terminal(Some(io.console.is_some()))
        .set_console_size(None);
    let seccomp = spec.linux().as_ref().and_then(|l| l.seccomp().clone());
    let userns = spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .and_then(|nss| nss.iter().find(|ns| ns.typ() == LinuxNamespaceType::User))
        .and_then(|ns| ns.path().clone());
    let (exec_seccomp, exec_userns) = match userns {
        Some(path) => {
            let entry = ExecUserns::prepare(path, &mut process)?;
            let seccomp = seccomp.map(|profile| ExecSeccomp {
                profile,
                drop_sys_admin: !entry.keeps_sys_admin(),
            });
            (seccomp, Some(entry))
        }
        None => (seccomp.map(|profile| ExecSeccomp::prepare(profile, &mut process)), None),
    };
    let body = serde_json::to_vec(&process).map_err(|e| ApiError::internal(e.to_string()))?;
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(process_file)
        .and_then(|mut f| f.write_all(&body))
        .map_err(|e| ApiError::internal(format!("writing {process_file:?}: {e}")))?;
    let builder = ContainerBuilder::new(id.to_owned(), SyscallType::Linux)
        .with_executor(ShimExecutor {
            exec_seccomp,
            exec_userns,
            winsize: io.winsize,
        })
        .with_root_path(root)
        .map_err(|e| ApiError::internal(chain(&e)))?;
    let tty = io.console.is_some();
    let builder = match io.console {
        Some(path) => builder.with_console_socket(Some(path)),
        None => builder
            .with_stdin(or_dev_null(io.stdin)?)
            .with_stdout(or_dev_null(io.stdout)?)
            .with_stderr(or_dev_null(io.stderr)?),
    };
    let result = builder
        .as_tenant()
        .with_process(Some(process_file))
        .with_detach(true)
        .build()
        .map_err(|e| ApiError::internal(chain(&e)));
    if tty {
        // libcontainer links the console socket into the container's directory for each exec
        // and leaves the link there.
        if let Ok(dir) = fs::read_dir(root.join(id)) {
            for e in dir.flatten() {
                if e.file_name().to_string_lossy().starts_with("tenant-tty-") {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
    Ok(result?.as_raw())
}

/// The bundle's process.terminal must say what the request says: libcontainer decides by it
/// whether the process gets a terminal (sent over the console socket) or the given stdio.
fn check_terminal(bundle: &Path, tty: bool) -> Result<(), ApiError> {
    let spec = Spec::load(bundle.join("config.json"))
        .map_err(|e| ApiError::invalid(format!("bundle {bundle:?}: {}", chain(&e))))?;
    let terminal = spec.process().as_ref().and_then(|p| p.terminal()).unwrap_or(false);
    if terminal != tty {
        return Err(ApiError::invalid(format!(
            "bundle {bundle:?} has process.terminal {terminal} but the request asks for tty {tty}: they must agree"
        )));
    }
    Ok(())
}

/// The helper's part of UpdateResources: the container's cgroup manager, as libcontainer made it
/// at creation (libcgroups: v1, or v2 on a unified host), applies `resources` (whose devices were
/// cleared). Device rules: on v2 they are one eBPF program that every apply replaces, built from
/// the given rules plus libcgroups' defaults, so the container's own rules (its bundle's, exactly
/// what creation applied) go along and the new program allows what the old one did. On v1 they
/// are left out: re-writing them would start with the spec's deny-all and refuse every device for
/// a moment; without them libcgroups only re-allows its defaults, which the container has already.
fn update_cgroup(id: &str, dir: &Path, mut resources: LinuxResources) -> Result<(), ApiError> {
    let container = Container::load(dir.to_path_buf()).map_err(|e| ApiError::internal(chain(&e)))?;
    let cgroup_path = container.spec().map_err(|e| ApiError::internal(chain(&e)))?.cgroup_path;
    let manager = create_cgroup_manager(CgroupConfig {
        cgroup_path,
        systemd_cgroup: container.systemd(),
        container_name: id.to_owned(),
    })
    .map_err(|e| ApiError::internal(chain(&e)))?;
    if !matches!(manager, AnyCgroupManager::V1(_)) {
        let spec = Spec::load(container.bundle().join("config.json")).map_err(|e| ApiError::internal(chain(&e)))?;
        let devices = spec
            .linux()
            .as_ref()
            .and_then(|l| l.resources().as_ref())
            .and_then(|r| r.devices().clone());
        resources.set_devices(devices);
    }
    manager
        .apply(&ControllerOpt {
            resources: &resources,
            disable_oom_killer: false,
            oom_score_adj: None,
            freezer_state: None,
        })
        .map_err(|e| ApiError::internal(chain(&e)))
}

/// Runs `f` (libcontainer work) in a forked child of the shim and returns its result. The shim is
/// single-threaded, so the child is a faithful copy; it exits right after answering. The child
/// keeps only stdio, its answer pipe and `keep` open.
fn in_helper<T, F>(what: &str, keep: &[RawFd], f: F) -> Result<T, ApiError>
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
            let status = wait_helper(child, what);
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
                    Err(ApiError::internal(format!(
                        "{what}: libcontainer helper ended without an answer ({status:?}); see shim.log"
                    )))
                })
        }
    }
}

/// Waits for a helper, killing it after HELPER_TIMEOUT. Only this pid: other children are the
/// event loop's to reap.
fn wait_helper(child: Pid, what: &str) -> Option<WaitStatus> {
    let deadline = Instant::now() + HELPER_TIMEOUT;
    let mut nap = Duration::from_micros(100);
    let mut killed = false;
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(Errno::EINTR) => {}
            Ok(status) if exit_of(status).is_some() => return Some(status),
            Ok(_) => {}
            Err(e) => {
                tracing::error!(error = %e, "waiting for the libcontainer helper");
                return None;
            }
        }
        if !killed && Instant::now() >= deadline {
            tracing::error!(what, "libcontainer helper timed out, killing it");
            let _ = nix::sys::signal::kill(child, Signal::SIGKILL);
            killed = true;
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(5));
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

/// libcontainer's default executor, after restoring the signal state a fresh process expects:
/// the shim blocks SIGCHLD (for its signalfd) and Rust ignores SIGPIPE, and both would otherwise be
/// inherited through exec by every container process.
#[derive(Clone, Default)]
struct ShimExecutor {
    /// For exec'd processes: the container's filter, which libcontainer's tenant builder leaves out.
    exec_seccomp: Option<ExecSeccomp>,
    /// For exec'd processes of a container in a pod user namespace: entering it.
    exec_userns: Option<ExecUserns>,
    /// For exec'd processes on a terminal: its initial size (libcontainer 0.7 ignores the OCI
    /// consoleSize), set here so that the process sees it from its first instruction.
    winsize: Option<(u16, u16)>,
}

/// The container's seccomp filter for an exec'd process, loaded by the executor as the last step
/// before exec. libcontainer 0.7's tenant builder rebuilds `linux` without `seccomp`, so without
/// this an exec (a probe, `kubectl exec`) would run unfiltered; runc's exec applies the filter.
#[derive(Clone)]
struct ExecSeccomp {
    profile: LinuxSeccomp,
    /// Without no_new_privs, loading a filter needs CAP_SYS_ADMIN: the process was given it in
    /// its effective and permitted sets only (not the bounding set, so exec could not keep it
    /// anyway) and drops it right after loading.
    drop_sys_admin: bool,
}

impl ExecSeccomp {
    /// Prepares `process` (the exec'd one) for `profile`.
    fn prepare(profile: LinuxSeccomp, process: &mut Process) -> Self {
        let nnp = process.no_new_privileges() == Some(true);
        let mut drop_sys_admin = false;
        if let Some(mut caps) = process.capabilities().clone() {
            let effective = caps.effective().clone().unwrap_or_default();
            if !nnp && !effective.contains(&SpecCapability::SysAdmin) {
                let add = |set: Option<Capabilities>| {
                    let mut set = set.unwrap_or_default();
                    set.insert(SpecCapability::SysAdmin);
                    Some(set)
                };
                let (e, p) = (add(caps.effective().clone()), add(caps.permitted().clone()));
                caps.set_effective(e).set_permitted(p);
                process.set_capabilities(Some(caps));
                drop_sys_admin = true;
            }
        }
        ExecSeccomp {
            profile,
            drop_sys_admin,
        }
    }

    fn load(&self) -> Result<(), ExecutorError> {
        let fail = |what: String| ExecutorError::Other(format!("exec: container seccomp filter: {what}"));
        match libcontainer::seccomp::initialize_seccomp(&self.profile) {
            Ok(None) => {}
            Ok(Some(_)) => return Err(fail("notify actions are not supported".into())),
            Err(e) => return Err(fail(e.to_string())),
        }
        if self.drop_sys_admin {
            for set in [caps::CapSet::Effective, caps::CapSet::Permitted] {
                caps::drop(None, set, caps::Capability::CAP_SYS_ADMIN)
                    .map_err(|e| fail(format!("dropping CAP_SYS_ADMIN after loading: {e}")))?;
            }
        }
        Ok(())
    }
}

/// An exec'd process of a container in a pod user namespace. libcontainer 0.7's tenant
/// builder joins every namespace of the container except the user namespace (its list leaves
/// "user" out), so its exec would run as the host's root. Instead the tenant is built as root
/// holding CAP_SYS_ADMIN only, and the executor, last before exec: enters the user namespace
/// (which grants a full capability set inside it), takes the container's user and groups, then
/// its capability sets and no_new_privs, as libcontainer does for the container's init.
#[derive(Clone)]
struct ExecUserns {
    /// Inode of the pod's user namespace, as the host sees it at the spec's path.
    ns_inode: u64,
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
    capabilities: LinuxCapabilities,
    no_new_privs: bool,
}

impl ExecUserns {
    /// Takes the container's identity out of `process`, leaving what the tenant needs to get here.
    fn prepare(path: PathBuf, process: &mut Process) -> Result<Self, ApiError> {
        let ns_inode = fs::metadata(&path)
            .map_err(|e| ApiError::internal(format!("the pod's user namespace {path:?}: {e}")))?
            .ino();
        let user = process.user().clone();
        let entry = ExecUserns {
            ns_inode,
            uid: user.uid(),
            gid: user.gid(),
            groups: user.additional_gids().clone().unwrap_or_default(),
            capabilities: process.capabilities().clone().unwrap_or_default(),
            no_new_privs: process.no_new_privileges() == Some(true),
        };
        let mut root = user;
        root.set_uid(0).set_gid(0).set_additional_gids(None);
        let sys_admin: Capabilities = [SpecCapability::SysAdmin].into_iter().collect();
        let mut caps = LinuxCapabilities::default();
        caps.set_bounding(Some(sys_admin.clone()))
            .set_effective(Some(sys_admin.clone()))
            .set_permitted(Some(sys_admin))
            .set_inheritable(None)
            .set_ambient(None);
        process
            .set_user(root)
            .set_capabilities(Some(caps))
            .set_no_new_privileges(Some(false));
        Ok(entry)
    }

    /// Whether the container's own effective set has CAP_SYS_ADMIN (else it is held only until
    /// the seccomp filter is loaded).
    fn keeps_sys_admin(&self) -> bool {
        self.no_new_privs
            || self
                .capabilities
                .effective()
                .as_ref()
                .is_some_and(|e| e.contains(&SpecCapability::SysAdmin))
    }

    fn enter(&self) -> Result<(), ExecutorError> {
        let fail = |what: &str, e: std::io::Error| ExecutorError::Other(format!("exec: {what}: {e}"));
        // By now the process is in the container's mount and PID namespaces, where the host's
        // path to the namespace means nothing; PID 1 there (pause, or the container's init)
        // is in the pod's user namespace. The inode check makes sure of it.
        let ns = File::open("/proc/1/ns/user").map_err(|e| fail("opening the pod's user namespace", e))?;
        let inode = ns
            .metadata()
            .map_err(|e| fail("reading the pod's user namespace", e))?
            .ino();
        if inode != self.ns_inode {
            return Err(ExecutorError::Other(format!(
                "exec: PID 1 of the container is not in the pod's user namespace ({inode} != {})",
                self.ns_inode
            )));
        }
        // SAFETY: plain syscalls on a valid fd and on this (single-threaded) process's credentials.
        unsafe {
            if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWUSER) != 0 {
                return Err(fail(
                    "entering the pod's user namespace",
                    std::io::Error::last_os_error(),
                ));
            }
            let groups: Vec<libc::gid_t> = self.groups.clone();
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                return Err(fail("setgroups", std::io::Error::last_os_error()));
            }
            if libc::setresgid(self.gid, self.gid, self.gid) != 0 {
                return Err(fail("setresgid", std::io::Error::last_os_error()));
            }
            // Keep the permitted set across the uid change; the sets are set right after.
            if libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0 {
                return Err(fail("PR_SET_KEEPCAPS", std::io::Error::last_os_error()));
            }
            if libc::setresuid(self.uid, self.uid, self.uid) != 0 {
                return Err(fail("setresuid", std::io::Error::last_os_error()));
            }
        }
        let mut caps = self.capabilities.clone();
        if !self.keeps_sys_admin() {
            // Held in effective and permitted (never bounding) until the filter is loaded.
            let add = |set: &Option<Capabilities>| {
                let mut set = set.clone().unwrap_or_default();
                set.insert(SpecCapability::SysAdmin);
                Some(set)
            };
            let (e, p) = (add(caps.effective()), add(caps.permitted()));
            caps.set_effective(e).set_permitted(p);
        }
        let syscall = libcontainer::syscall::syscall::create_syscall();
        libcontainer::capabilities::drop_privileges(&caps, &*syscall)
            .map_err(|e| ExecutorError::Other(format!("exec: setting capabilities: {e}")))?;
        if self.no_new_privs {
            // SAFETY: no pointers.
            if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                return Err(fail("PR_SET_NO_NEW_PRIVS", std::io::Error::last_os_error()));
            }
        }
        Ok(())
    }
}

impl Executor for ShimExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        reset_signals();
        writable_null_stdio();
        if let Some(ws) = self.winsize {
            // fd 0 is the terminal's slave (libcontainer's console setup made it so).
            if let Err(e) = stdio::set_winsize(0, ws) {
                tracing::warn!(error = %e, "setting the exec's terminal size");
            }
        }
        if let Some(userns) = &self.exec_userns {
            userns.enter()?;
        }
        if let Some(seccomp) = &self.exec_seccomp {
            seccomp.load()?;
        }
        DefaultExecutor {}.exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        DefaultExecutor {}.validate(spec)
    }
}

/// libcontainer 0.7 replaces stdio that is the host's /dev/null by the container's, opened
/// read-only (`reopen_dev_null`): a container whose output goes to /dev/null would fail every
/// write (EBADF; `echo` exits 1). Runs in the container's init, just before exec: stdout and stderr
/// on a read-only /dev/null get a writable one.
fn writable_null_stdio() {
    for fd in [1, 2] {
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st) } != 0
            || st.st_mode & libc::S_IFMT != libc::S_IFCHR
            || st.st_rdev != libc::makedev(1, 3)
        {
            continue;
        }
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 || flags & libc::O_ACCMODE != libc::O_RDONLY {
            continue;
        }
        let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        if null >= 0 {
            unsafe {
                libc::dup2(null, fd);
                libc::close(null);
            }
        }
    }
}

/// Default dispositions for every catchable signal and an empty signal mask. The raw syscall:
/// glibc refuses to touch its internal signals (32, 33), which a spawner may have left ignored.
fn reset_signals() {
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: u64,
        restorer: usize,
        mask: u64,
    }
    let default = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    &default as *const KernelSigaction,
                    0usize,
                    8usize,
                );
            }
        }
    }
    let empty = 0u64;
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const u64,
            0usize,
            8usize,
        );
    }
}

/// The first error lines libcontainer's helpers wrote to the shim log: "failed to prepare
/// rootfs" alone does not say which mount failed, and a failed pod takes its log with it.
/// Only lines after `since` (the log's length when the attempt began) count.
fn first_errors(log_file: &Path, since: u64) -> String {
    let Ok(bytes) = std::fs::read(log_file) else {
        return String::new();
    };
    let text = String::from_utf8_lossy(bytes.get(since as usize..).unwrap_or_default());
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("ERROR")).collect();
    // The first errors say what failed; the later ones only report it upwards.
    let head = &errors[..errors.len().min(2)];
    if head.is_empty() {
        return String::new();
    }
    let joined = head.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" | ");
    format!(": {}", joined.chars().take(2000).collect::<String>())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        for ok in ["a", "pause", "0123abcdef", "a.b-c_d+e", &"x".repeat(255)] {
            validate_id(ok).unwrap();
        }
        for bad in ["", ".", "..", "a/b", "../x", "a b", "é", &"x".repeat(256)] {
            assert_eq!(
                validate_id(bad).unwrap_err().code,
                ErrorCode::InvalidArgument,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn helper_answers() {
        if !crate::test_support::alone("containers::tests::helper_answers") {
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
        if !crate::test_support::alone("containers::tests::helper_answer_does_not_wait_for_its_descendants") {
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

    #[test]
    fn unknown_ids() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Containers::new(dir.path().join("containers"), dir.path().join("exits"), -1);
        assert_eq!(c.state("nope").unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(c.kill("nope", 9, false).unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(c.start("nope").unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(c.update_resources("nope", "{}").unwrap_err().code, ErrorCode::NotFound);
        c.delete("nope").unwrap();
        c.delete("nope").unwrap();
        c.delete_all().unwrap();
    }

    #[test]
    fn update_resources_needs_a_live_container_and_resources_json() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Containers::new(dir.path().join("containers"), dir.path().join("exits"), -1);
        let entry = |status| Entry {
            pid: 1,
            status,
            created_at_ns: 0,
            started_at_ns: 0,
            log: None,
            oom: None,
            sigkill_sent: false,
            stdin: None,
            stdin_once: false,
            tty: None,
            attached: Vec::new(),
        };
        let exit = ExitRecord {
            exit_code: 0,
            finished_at_ns: 1,
            oom_killed: false,
        };
        c.table.insert("gone".into(), entry(Status::Stopped(exit)));
        c.table.insert("live".into(), entry(Status::Running));
        let e = c.update_resources("gone", r#"{"memory":{"limit":1}}"#).unwrap_err();
        assert_eq!(e.code, ErrorCode::FailedPrecondition, "{}", e.message);
        for bad in ["", "[1]", r#"{"memory":{"limit":"lots"}}"#, r#"{"cpu":{"shares":-1}}"#] {
            let e = c.update_resources("live", bad).unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidArgument, "{bad}: {}", e.message);
        }
    }

    /// A running entry whose stdin and stdout are pipes this test holds the other ends of.
    fn piped_entry(stdin_once: bool) -> (Entry, File, File) {
        let (in_r, in_w) = stdio::input_pipe().unwrap();
        stdio::set_nonblocking(in_r.as_fd()).unwrap();
        let (out_r, out_w) = output_pipe().unwrap();
        let (err_r, _) = output_pipe().unwrap();
        let entry = Entry {
            pid: i32::MAX,
            status: Status::Running,
            created_at_ns: 0,
            started_at_ns: 0,
            log: Some(ContainerLog {
                file: None,
                streams: vec![LogStream::new("stdout", out_r), LogStream::new("stderr", err_r)],
                terminal: false,
            }),
            oom: None,
            sigkill_sent: false,
            stdin: Some(Input::new(in_w, false)),
            stdin_once,
            tty: None,
            attached: Vec::new(),
        };
        (entry, File::from(in_r), File::from(out_w))
    }

    fn read_now(f: &mut File) -> std::io::Result<Vec<u8>> {
        crate::test_support::wait_readable(f.as_fd());
        let mut buf = [0u8; 1024];
        let n = f.read(&mut buf)?;
        Ok(buf[..n].to_vec())
    }

    #[test]
    fn attach_sessions_share_output_and_stdin() {
        let dir = tempfile::tempdir().unwrap();
        let exits = dir.path().join("exits");
        std::fs::create_dir(&exits).unwrap();
        let mut c = Containers::new(dir.path().join("containers"), exits, -1);
        let (entry, mut stdin, mut stdout) = piped_entry(true);
        c.table.insert("c".into(), entry);
        let attach = |stdin, stdout, stderr| pb::AttachRequest {
            container_id: "c".into(),
            stdin,
            stdout,
            stderr,
        };
        assert!(!c.attach(1, attach(true, true, false)).unwrap().tty);
        c.attach(2, attach(false, false, true)).unwrap();
        c.attach(3, attach(true, true, true)).unwrap();

        // Output goes to the sessions that want it, as it is read.
        stdout.write_all(b"hello").unwrap();
        c.on_ready(&Source::Log("c".into(), 0), libc::POLLIN, &|_| usize::MAX);
        let frames = c.take_session_output();
        let hello = session_output::Kind::Stdout(b"hello".to_vec());
        assert_eq!(frames, vec![(1, hello.clone()), (3, hello)]);

        // Input from any session with stdin; none from one without.
        c.session_input(2, session_input::Kind::Stdin(b"ignored".to_vec()));
        c.session_input(1, session_input::Kind::Stdin(b"a".to_vec()));
        c.session_input(3, session_input::Kind::Stdin(b"b".to_vec()));
        assert_eq!(read_now(&mut stdin).unwrap(), b"ab");
        assert!(c.session_input_room(1));
        // Resizing without a terminal does nothing.
        c.session_input(1, session_input::Kind::Resize(pb::Resize { width: 1, height: 1 }));

        // stdin_once: the first session to end its input closes stdin (EOF), for good.
        c.session_closed(1);
        assert_eq!(read_now(&mut stdin).unwrap(), b"");
        c.session_input(3, session_input::Kind::Stdin(b"late".to_vec()));
        let e = c.attach(4, attach(true, true, true)).unwrap_err();
        assert_eq!(e.code, ErrorCode::FailedPrecondition);
        assert!(e.message.contains("stdin_once"), "{}", e.message);

        // The exit ends the remaining sessions, after the output.
        stdout.write_all(b"bye").unwrap();
        c.on_exit(i32::MAX, 3);
        let frames = c.take_session_output();
        let exit = session_output::Kind::Exit(pb::SessionExit { exit_code: 3 });
        assert_eq!(
            frames,
            vec![
                (3, session_output::Kind::Stdout(b"bye".to_vec())),
                (2, exit.clone()),
                (3, exit)
            ]
        );
        let e = c.attach(5, attach(false, true, true)).unwrap_err();
        assert_eq!(e.code, ErrorCode::FailedPrecondition);
    }

    #[test]
    fn attach_without_stdin_once_keeps_stdin_open() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Containers::new(dir.path().join("containers"), dir.path().join("exits"), -1);
        let (entry, mut stdin, _stdout) = piped_entry(false);
        c.table.insert("c".into(), entry);
        let with_stdin = pb::AttachRequest {
            container_id: "c".into(),
            stdin: true,
            ..Default::default()
        };
        c.attach(1, with_stdin.clone()).unwrap();
        c.session_input(1, session_input::Kind::CloseStdin(pb::CloseStdin {}));
        c.session_closed(1);
        c.attach(2, with_stdin).unwrap();
        c.session_input(2, session_input::Kind::Stdin(b"still open".to_vec()));
        assert_eq!(read_now(&mut stdin).unwrap(), b"still open");
        // A container created without stdin takes none.
        c.table.get_mut("c").unwrap().stdin = None;
        let e = c
            .attach(
                3,
                pb::AttachRequest {
                    container_id: "c".into(),
                    stdin: true,
                    ..Default::default()
                },
            )
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::FailedPrecondition);
        assert!(e.message.contains("without stdin"), "{}", e.message);
    }

    #[test]
    fn create_checks_arguments_before_libcontainer() {
        if !crate::test_support::alone("containers::tests::create_checks_arguments_before_libcontainer") {
            return;
        }
        let none = CreateOptions::default();
        let dir = tempfile::tempdir().unwrap();
        let mut c = Containers::new(dir.path().join("containers"), dir.path().join("exits"), -1);
        assert_eq!(
            c.create("a/b", "/x", &none).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        assert_eq!(
            c.create("a", "rel/bundle", &none).unwrap_err().code,
            ErrorCode::InvalidArgument
        );
        let e = c.create("a", dir.path().to_str().unwrap(), &none).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        assert!(e.message.contains("config.json"), "{}", e.message);
        std::fs::write(dir.path().join("config.json"), "{}").unwrap();
        let bundle = dir.path().to_str().unwrap();
        let e = c
            .create(
                "a",
                bundle,
                &CreateOptions {
                    log_path: "rel/0.log".into(),
                    ..none.clone()
                },
            )
            .unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument, "{}", e.message);
        // A terminal must be what the bundle's process.terminal says (checked in the helper,
        // before libcontainer runs).
        let tty = CreateOptions {
            tty: true,
            ..none.clone()
        };
        let e = c.create("a", bundle, &tty).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument, "{}", e.message);
        assert!(e.message.contains("process.terminal false"), "{}", e.message);
        std::fs::write(
            dir.path().join("config.json"),
            r#"{"ociVersion": "1.2.0", "process": {"terminal": true, "cwd": "/", "user": {"uid": 0, "gid": 0}}}"#,
        )
        .unwrap();
        let e = c.create("a", bundle, &none).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument, "{}", e.message);
        assert!(e.message.contains("process.terminal true"), "{}", e.message);
        assert_eq!(c.len(), 0);
        // The console socket is gone with the failed create.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n.ends_with(".sock"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
        assert_eq!(c.reopen_log("a").unwrap_err().code, ErrorCode::NotFound);
        let exec = pb::ExecRequest {
            container_id: "a".into(),
            args: vec!["true".into()],
            ..Default::default()
        };
        assert_eq!(c.exec(1, exec).unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(c.pending_execs(), 0);
        let stream = pb::ExecStreamRequest {
            container_id: "a".into(),
            args: vec!["sh".into()],
            tty: true,
            ..Default::default()
        };
        assert_eq!(c.exec_stream(1, stream).unwrap_err().code, ErrorCode::NotFound);
        let attach = pb::AttachRequest {
            container_id: "a".into(),
            stdout: true,
            ..Default::default()
        };
        assert_eq!(c.attach(1, attach).unwrap_err().code, ErrorCode::NotFound);
    }
}
