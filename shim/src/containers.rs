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
//! A container with a log path has pipes for stdout and stderr whose read ends the shim keeps
//! (logs.rs); exec'd processes (exec.rs) are tracked here too, since their exits are reaped here.

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libcgroups::common::{create_cgroup_manager, AnyCgroupManager, CgroupConfig, CgroupManager, ControllerOpt};
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::oci_spec::runtime::{
    Capabilities, Capability as SpecCapability, LinuxResources, LinuxSeccomp, Process, Spec,
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

use crate::exec::{self, Capture, Exec};
use crate::exits::{self, exit_of, now_ns, ExitRecord};
use crate::logs::{self, ContainerLog, LogFile, LogStream};
use crate::oom;
use crate::pb::{self, ErrorCode};

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
    /// Where its output goes, when it has a log file.
    log: Option<ContainerLog>,
    /// Its memory cgroup's OOM kill counter file and the count at creation.
    oom: Option<(PathBuf, u64)>,
}

/// What CreateContainer asks for besides the bundle.
#[derive(Debug, Default, Clone)]
pub struct CreateOptions {
    pub create_only: bool,
    /// Absolute; empty: stdout and stderr are /dev/null.
    pub log_path: String,
    pub stdin: bool,
    pub tty: bool,
    /// 0: the default.
    pub max_log_line_bytes: u32,
}

/// A descriptor the event loop polls for this module.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    /// A container's stdout (0) or stderr (1) pipe.
    Log(String, usize),
    /// An exec's (by serial) stdout (0) or stderr (1) pipe.
    Exec(u64, usize),
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
    next_exec: u64,
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
            next_exec: 1,
        }
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
        if opts.stdin || opts.tty {
            return Err(ApiError::new(
                ErrorCode::Unimplemented,
                "containers with stdin or a terminal are not supported by this shim yet",
            ));
        }
        let log_path = Path::new(&opts.log_path);
        if !opts.log_path.is_empty() && !log_path.is_absolute() {
            return Err(ApiError::invalid(format!("log path {log_path:?} is not absolute")));
        }
        self.remove_leftover(id);

        // Output: pipes whose read ends this shim keeps, or /dev/null.
        let mut log = None;
        let mut child_out = [None, None];
        if !opts.log_path.is_empty() {
            let max_line = match opts.max_log_line_bytes as usize {
                0 => logs::DEFAULT_MAX_LINE,
                n => n.clamp(logs::MIN_MAX_LINE, logs::MAX_MAX_LINE),
            };
            let file = LogFile::open(log_path.to_path_buf(), max_line)
                .map_err(|e| ApiError::internal(format!("opening the log file {log_path:?}: {e}")))?;
            let (out_r, out_w) = output_pipe()?;
            let (err_r, err_w) = output_pipe()?;
            log = Some(ContainerLog {
                file,
                streams: [LogStream::new("stdout", out_r), LogStream::new("stderr", err_r)],
            });
            child_out = [Some(out_w), Some(err_w)];
        }
        let keep: Vec<RawFd> = std::iter::once(self.log_fd)
            .chain(child_out.iter().flatten().map(|f| f.as_raw_fd()))
            .collect();
        let [stdout, stderr] = child_out;

        let root = self.root.clone();
        let log_file = self.log_path();
        // The closure owns the write ends: the shim's copies close when in_helper returns.
        let pid = in_helper(&format!("creating container {id}"), &keep, move || {
            let mut container = ContainerBuilder::new(id.to_owned(), SyscallType::Linux)
                .with_executor(ShimExecutor::default())
                .with_root_path(&root)
                .map_err(|e| ApiError::internal(chain(&e)))?
                .with_stdin(dev_null()?)
                .with_stdout(or_dev_null(stdout)?)
                .with_stderr(or_dev_null(stderr)?)
                .validate_id()
                .map_err(|e| ApiError::invalid(chain(&e)))?
                .as_init(bundle)
                .with_systemd(false)
                .with_detach(true)
                .build()
                .map_err(|e| {
                    ApiError::internal(format!(
                        "creating container {id}: {} (details in {log_file:?})",
                        chain(&e)
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
        // init is in its cgroups already (libcontainer's intermediate process joined them first).
        let oom = oom::counter_path(pid).map(|p| {
            let base = oom::kills(&p).unwrap_or(0);
            (p, base)
        });
        tracing::info!(id, pid, ?bundle, log = %opts.log_path, oom_counter = ?oom.as_ref().map(|o| &o.0), "container created");
        self.table.insert(
            id.to_owned(),
            Entry {
                pid,
                status: Status::Created,
                created_at_ns: now_ns(),
                started_at_ns: 0,
                log,
                oom,
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
            log_bytes_dropped: e.log.as_ref().map_or(0, |l| l.file.dropped),
        })
    }

    /// Opens the container's log file again (it was renamed away to rotate it).
    pub fn reopen_log(&mut self, id: &str) -> Result<(), ApiError> {
        let entry = self.table.get_mut(id).ok_or_else(|| ApiError::not_found(id))?;
        match &mut entry.log {
            Some(log) if log.is_open() => {
                log.file
                    .reopen()
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

    /// Starts `r.args` in the running container `r.container_id`, for the connection `conn`. The
    /// answer comes from `take_finished_execs` once the process has exited.
    pub fn exec(&mut self, conn: u64, r: pb::ExecRequest) -> Result<(), ApiError> {
        let started = Instant::now();
        let id = r.container_id.as_str();
        let entry = self.table.get(id).ok_or_else(|| ApiError::not_found(id))?;
        if entry.status != Status::Running {
            return Err(ApiError::precondition(format!(
                "container {id} is {}, exec needs a running container",
                entry.status.name()
            )));
        }
        if r.args.is_empty() || r.args[0].is_empty() {
            return Err(ApiError::invalid("exec needs a command"));
        }
        if let Some(bad) = r.env.iter().find(|e| !e.contains('=') || e.starts_with('=')) {
            return Err(ApiError::invalid(format!("environment entry {bad:?} is not KEY=VALUE")));
        }
        let max = match usize::try_from(r.max_output_bytes) {
            Ok(0) | Err(_) => exec::DEFAULT_MAX_OUTPUT,
            Ok(n) => n.min(exec::DEFAULT_MAX_OUTPUT),
        };
        let deadline = (r.timeout_ms > 0).then(|| started + Duration::from_millis(r.timeout_ms.into()));
        let serial = self.next_exec;
        self.next_exec += 1;

        let (out_r, out_w) = output_pipe()?;
        let (err_r, err_w) = output_pipe()?;
        let keep = [self.log_fd, out_w.as_raw_fd(), err_w.as_raw_fd()];
        let root = self.root.clone();
        let process_file = self
            .root
            .parent()
            .unwrap_or(Path::new("/"))
            .join(format!("exec-{serial}.json"));
        let log_file = self.log_path();
        let (args, env) = (r.args, r.env);
        let pid = in_helper(&format!("exec in container {id}"), &keep, move || {
            let result = exec_in_helper(id, &root, &process_file, args, env, out_w, err_w);
            let _ = fs::remove_file(&process_file);
            result.map_err(|e| {
                ApiError::new(
                    e.code,
                    format!("exec in container {id}: {} (details in {log_file:?})", e.message),
                )
            })
        })?;
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

    /// Descriptors to poll for output (containers' logs, execs).
    pub fn poll_sources(&self) -> Vec<(Source, BorrowedFd<'_>)> {
        let mut out = Vec::new();
        for (id, e) in &self.table {
            if let Some(log) = &e.log {
                for (i, s) in log.streams.iter().enumerate() {
                    if let Some(fd) = s.fd() {
                        out.push((Source::Log(id.clone(), i), fd));
                    }
                }
            }
        }
        for x in &self.execs {
            for (i, c) in x.out.iter().enumerate() {
                if let Some(fd) = c.fd() {
                    out.push((Source::Exec(x.serial, i), fd));
                }
            }
        }
        out
    }

    /// A polled descriptor is readable (or hung up).
    pub fn on_readable(&mut self, source: &Source) {
        match source {
            Source::Log(id, i) => {
                if let Some(log) = self.table.get_mut(id).and_then(|e| e.log.as_mut()) {
                    log.drain(*i, id, false);
                }
            }
            Source::Exec(serial, i) => {
                if let Some(x) = self.execs.iter_mut().find(|x| x.serial == *serial) {
                    x.out[*i].drain(false);
                }
            }
        }
    }

    /// The earliest time an exec needs attention (a timeout, the end of waiting for its output).
    pub fn next_wake(&self) -> Option<Instant> {
        self.execs.iter().filter_map(|x| x.wake_at()).min()
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
            } else {
                tracing::debug!(pid, exit_code, "reaped a process that is no container's init");
            }
            return;
        };
        let finished_at_ns = now_ns();
        // Everything it wrote is in the log before its exit is reported.
        if let Some(log) = &mut entry.log {
            log.drain_all(id);
        }
        // The kernel's OOM killer sends SIGKILL; the cgroup is still there (removed at delete).
        let oom_killed = exit_code == 128 + libc::SIGKILL
            && entry
                .oom
                .as_ref()
                .is_some_and(|(path, base)| oom::kills(path).is_some_and(|n| n > *base));
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

/// What a helper sends back: the result, JSON, in one write to a pipe.
#[derive(Serialize, Deserialize)]
enum HelperAnswer<T> {
    Ok(T),
    Err { code: i32, message: String },
}

/// The helper's part of an exec: the container's process (from its bundle) with other args and
/// env, written to `process_file` for libcontainer's tenant builder, run with the given output.
fn exec_in_helper(
    id: &str,
    root: &Path,
    process_file: &Path,
    args: Vec<String>,
    env: Vec<String>,
    stdout: OwnedFd,
    stderr: OwnedFd,
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
        .set_terminal(Some(false))
        .set_console_size(None);
    let exec_seccomp = spec
        .linux()
        .as_ref()
        .and_then(|l| l.seccomp().clone())
        .map(|profile| ExecSeccomp::prepare(profile, &mut process));
    let body = serde_json::to_vec(&process).map_err(|e| ApiError::internal(e.to_string()))?;
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(process_file)
        .and_then(|mut f| f.write_all(&body))
        .map_err(|e| ApiError::internal(format!("writing {process_file:?}: {e}")))?;
    let pid = ContainerBuilder::new(id.to_owned(), SyscallType::Linux)
        .with_executor(ShimExecutor { exec_seccomp })
        .with_root_path(root)
        .map_err(|e| ApiError::internal(chain(&e)))?
        .with_stdin(dev_null()?)
        .with_stdout(stdout)
        .with_stderr(stderr)
        .as_tenant()
        .with_process(Some(process_file))
        .with_detach(true)
        .build()
        .map_err(|e| ApiError::internal(chain(&e)))?;
    Ok(pid.as_raw())
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

impl Executor for ShimExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        reset_signals();
        writable_null_stdio();
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

    #[test]
    fn create_checks_arguments_before_libcontainer() {
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
        for (opts, code) in [
            (
                CreateOptions {
                    stdin: true,
                    ..none.clone()
                },
                ErrorCode::Unimplemented,
            ),
            (
                CreateOptions {
                    tty: true,
                    ..none.clone()
                },
                ErrorCode::Unimplemented,
            ),
            (
                CreateOptions {
                    log_path: "rel/0.log".into(),
                    ..none.clone()
                },
                ErrorCode::InvalidArgument,
            ),
        ] {
            assert_eq!(c.create("a", bundle, &opts).unwrap_err().code, code, "{opts:?}");
        }
        assert_eq!(c.len(), 0);
        assert_eq!(c.reopen_log("a").unwrap_err().code, ErrorCode::NotFound);
        let exec = pb::ExecRequest {
            container_id: "a".into(),
            args: vec!["true".into()],
            ..Default::default()
        };
        assert_eq!(c.exec(1, exec).unwrap_err().code, ErrorCode::NotFound);
        assert_eq!(c.pending_execs(), 0);
    }
}
