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

mod checkpoint;
mod executor;
mod restore;
mod sessions;

use std::collections::BTreeMap;
use std::fs::{self, File, OpenOptions};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::oci_spec::runtime::LinuxResources;
use libcontainer::syscall::syscall::SyscallType;
use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use crate::exec::{Exec, Outbox, StreamExec};
use crate::exits::{self, exit_of, ExitRecord};
use crate::logs::{self, ContainerLog, LogFile, LogStream};
use crate::oom;
use crate::pb::{self, session_output, ErrorCode};
use crate::stdio::{self, ConsoleSocket, Input};

use crate::api_error::chain;
pub use crate::api_error::ApiError;
use crate::helper::in_helper;
use executor::{check_terminal, update_cgroup, ShimExecutor};
pub use restore::RestoreFrom;
use scute_sys::clock::now_nanos;
use sessions::{copy_to_sessions, Attachment};

/// How long DeleteContainer waits for a SIGKILLed container to be reaped.
const KILL_WAIT: Duration = Duration::from_secs(10);

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
    /// A restore waiting for StartContainer: no process yet (pid 0).
    restore: Option<restore::Pending>,
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
    /// Restore from CRIU's images at start instead of creating a process now.
    pub restore: Option<RestoreFrom>,
}

impl CreateOptions {
    /// The container's log file, opened (None without a log path).
    fn open_log_file(&self) -> Result<Option<LogFile>, ApiError> {
        if self.log_path.is_empty() {
            return Ok(None);
        }
        let max_line = match self.max_log_line_bytes as usize {
            0 => logs::DEFAULT_MAX_LINE,
            n => n.clamp(logs::MIN_MAX_LINE, logs::MAX_MAX_LINE),
        };
        let path = PathBuf::from(&self.log_path);
        LogFile::open(path.clone(), max_line)
            .map(Some)
            .map_err(|e| ApiError::internal(format!("opening the log file {path:?}: {e}")))
    }
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
        if let Some(from) = &opts.restore {
            return self.create_restorable(id, bundle, opts, from).map(|()| 0);
        }

        // Output: pipes (or the terminal) whose read ends this shim keeps, or /dev/null.
        let file = opts.open_log_file()?;
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
            // Before any of its processes runs user code (init waits for start, execs need it
            // created).
            if systemd {
                if let Err(e) = crate::systemd_scope::complete(id, pid.as_raw(), bundle) {
                    let _ = container.delete(true);
                    return Err(ApiError::internal(format!(
                        "container {id}: completing its systemd scope (devices, hugetlb, unified): {e}"
                    )));
                }
            }
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
                created_at_ns: now_nanos(),
                started_at_ns: 0,
                log,
                oom,
                sigkill_sent: false,
                stdin,
                stdin_once: opts.stdin && opts.stdin_once,
                tty: tty_master,
                attached: Vec::new(),
                restore: None,
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
        if entry.restore.is_some() {
            return self.restore(id);
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
        entry.started_at_ns = now_nanos();
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

    pub fn kill(&mut self, id: &str, signal: u32, all: bool) -> Result<(), ApiError> {
        let entry = self.table.get_mut(id).ok_or_else(|| ApiError::not_found(id))?;
        let sig = i32::try_from(signal)
            .ok()
            .filter(|s| (1..=libc::SIGRTMAX()).contains(s))
            .ok_or_else(|| ApiError::invalid(format!("invalid signal {signal}")))?;
        if entry.restore.is_some() {
            // A restore not started has no process to signal.
            return Ok(());
        }
        let stopped = matches!(entry.status, Status::Stopped(_));
        entry.sigkill_sent |= sig == libc::SIGKILL;
        if all && sig == libc::SIGKILL && !stopped && crate::cgroup_v2::kill_all(id, entry.pid) {
            return Ok(());
        }
        if all && !stopped {
            // On cgroup v1, through the container's freezer cgroup, as libcontainer would.
            if let Some(dir) = v1_freezer_dir(&self.root.join(id)) {
                return crate::cgroup_v1::signal_all(&dir, sig)
                    .map_err(|e| ApiError::internal(format!("killing container {id}: {e}")));
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
        if !matches!(entry.status, Status::Stopped(_)) && entry.restore.is_none() {
            entry.sigkill_sent = true;
            let pid = entry.pid;
            // On pure cgroup v2 one write to its cgroup.kill, as `kill` does.
            let killed = match v1_freezer_dir(&dir) {
                _ if crate::cgroup_v2::kill_all(id, pid) => Ok(()),
                Some(cgroup) => {
                    crate::cgroup_v1::signal_all(&cgroup, libc::SIGKILL).map_err(|e| ApiError::internal(e.to_string()))
                }
                None => in_helper(&format!("killing container {id}"), &[self.log_fd], || {
                    Container::load(dir.clone())
                        .and_then(|mut c| c.kill(Signal::SIGKILL, true))
                        .map_err(|e| ApiError::internal(chain(&e)))
                }),
            };
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
            match delete_on_v1(&dir) {
                Some(deleted) => deleted.map_err(|e| ApiError::internal(format!("deleting container {id}: {e}")))?,
                None => in_helper(&format!("deleting container {id}"), &[self.log_fd], || {
                    Container::load(dir.clone())
                        .and_then(|mut c| c.delete(true))
                        .map_err(|e| ApiError::internal(format!("deleting container {id}: {}", chain(&e))))
                })?,
            }
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
        let mut woken = false;
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
            // Sleeps until the exit on a pidfd (a fixed 5 ms nap cost RemoveContainer of a
            // running container that much). Woken and still not reaped (no pidfds on this
            // kernel, or not our child): polls every millisecond.
            if woken {
                std::thread::sleep(Duration::from_millis(1));
            }
            woken = crate::helper::await_exit(Pid::from_raw(pid), deadline);
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
        let finished_at_ns = now_nanos();
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
mod tests;

/// On a cgroup v1 host, the freezer directory of the cgroup libcontainer recorded for the container
/// whose state is in `dir` (what its kill --all freezes and lists); None elsewhere, for a systemd
/// container, or when the state cannot be read.
fn v1_freezer_dir(dir: &Path) -> Option<PathBuf> {
    if !crate::cgroup_v1::applies() {
        return None;
    }
    let container = Container::load(dir.to_path_buf()).ok()?;
    if container.systemd() {
        return None;
    }
    crate::cgroup_v1::freezer_dir(&container.spec().ok()?.cgroup_path)
}

/// libcontainer's delete of a container that is no longer running, on a cgroup v1 host, without
/// the cgroup manager it constructs (see `cgroup_v1`): the container's cgroups, then its state
/// directory. None where libcontainer's own delete (in a helper) does more or knows better: its
/// state unreadable, poststop hooks to run, Intel RDT, systemd, a v2 host.
fn delete_on_v1(dir: &Path) -> Option<std::io::Result<()>> {
    if !crate::cgroup_v1::applies() {
        return None;
    }
    let container = Container::load(dir.to_path_buf()).ok()?;
    if container.systemd() || container.intel_rdt_dir().is_some() {
        return None;
    }
    let config = container.spec().ok()?;
    let poststop = config.hooks.as_ref().and_then(|h| h.poststop().as_ref());
    if poststop.is_some_and(|hooks| !hooks.is_empty()) {
        return None;
    }
    Some(crate::cgroup_v1::remove(&config.cgroup_path).and_then(|()| fs::remove_dir_all(dir)))
}
