//! Starting a shim, and knowing whether the process that answered is still the one running.

use std::io;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use super::{read_pid_file, ShimClient, ShimError, SpawnOptions, SPAWN_TIMEOUT};

impl ShimClient {
    /// Starts a shim for a sandbox and returns once it answers. The state dir is created if
    /// missing; a shim already serving it is an error.
    pub async fn spawn(opts: &SpawnOptions) -> Result<ShimClient, ShimError> {
        tokio::fs::create_dir_all(&opts.state_dir).await?;
        let log_level = match opts.log_level.to_ascii_lowercase().as_str() {
            l @ ("error" | "warn" | "info" | "debug" | "trace" | "off") => l.to_string(),
            _ => "info".to_string(),
        };
        let mut cmd = std::process::Command::new(&opts.shim_binary);
        cmd.arg("--id")
            .arg(&opts.sandbox_id)
            .arg("--state-dir")
            .arg(&opts.state_dir)
            .arg("--log-level")
            .arg(log_level)
            .arg("--cgroup-driver")
            .arg(opts.cgroup_driver.to_string())
            .arg("--cgroup")
            .arg(&opts.cgroup)
            .env_clear()
            .env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        // A fork waits while another process moves between cgroups (libcontainer's, under a burst).
        let child = crate::blocking::run(|| cmd.spawn())
            .map_err(|e| ShimError::Start(format!("{}: {e}", opts.shim_binary.display())))?;
        // The process we started forks the real shim and exits once that one listens (0) or
        // failed (1, reason on stderr). A specific-pid wait on a blocking thread: tokio's child
        // reaping is not involved.
        let first_pid = child.id();
        let waiter = tokio::task::spawn_blocking(move || child.wait_with_output());
        let output = match tokio::time::timeout(SPAWN_TIMEOUT, waiter).await {
            Err(_) => {
                // Still unreaped (the blocking wait is pending), so the pid is still that child.
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(first_pid as i32),
                    nix::sys::signal::Signal::SIGKILL,
                );
                if let Some(pid) = read_pid_file(&opts.state_dir).await {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGKILL,
                    );
                }
                return Err(ShimError::Start(format!(
                    "the shim for sandbox {} did not get ready within {SPAWN_TIMEOUT:?}",
                    opts.sandbox_id
                )));
            }
            Ok(joined) => joined.map_err(io::Error::other)??,
        };
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let reason = stderr.trim();
            return Err(ShimError::Start(if reason.is_empty() {
                format!("{} exited with {}", opts.shim_binary.display(), output.status)
            } else {
                reason.to_string()
            }));
        }
        let client = ShimClient::connect(&opts.state_dir).await?;
        if client.sandbox_id != opts.sandbox_id {
            return Err(ShimError::Protocol(format!(
                "the shim in {} serves sandbox {:?}, not {:?}",
                opts.state_dir.display(),
                client.sandbox_id,
                opts.sandbox_id
            )));
        }
        Ok(client)
    }
}

/// A process, identified by pid and start time so that a reused pid is not mistaken for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct ProcId {
    pub(super) pid: u32,
    pub(super) start_time: u64,
}

impl ProcId {
    pub(super) fn of(pid: u32) -> Option<ProcId> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        let (state, start_time) = parse_stat(&stat)?;
        (state != 'Z' && state != 'X').then_some(ProcId { pid, start_time })
    }

    /// True while the process runs (a zombie has exited).
    pub(super) fn alive(&self) -> bool {
        ProcId::of(self.pid) == Some(*self)
    }

    /// Sleeps until the process has exited (true) or `timeout` passes (false). On a pidfd, which
    /// wakes at the exit: the 10 ms polling nap it replaces was most of RemovePodSandbox's 17 ms.
    /// Polls where the kernel has no pidfds.
    pub(super) async fn exited_within(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        // Opened before the liveness check: a pid reused before the open fails the check (its
        // start time differs), so the pidfd waited on is this process's.
        let pidfd = self.pidfd();
        if !self.alive() {
            return true;
        }
        if let Some(exited) = until_readable(pidfd, deadline).await {
            return exited;
        }
        while self.alive() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        true
    }
}

impl ProcId {
    /// The process's pidfd in the reactor; None where the kernel has none (before 5.3) or the
    /// process is gone.
    pub(super) fn pidfd(&self) -> Option<AsyncFd<std::os::fd::OwnedFd>> {
        let fd = scute_sys::pidfd::open(i32::try_from(self.pid).ok()?).ok()?;
        // SAFETY: the AsyncFd owns the OwnedFd, so the fd stays open and the same until the
        // AsyncFd is dropped.
        unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.ok()
    }
}

/// Sleeps on a pidfd until its process exits (Some(true)) or `deadline` (Some(false)); None
/// when there is no pidfd to sleep on, or the reactor is going away: the caller polls /proc.
pub(super) async fn until_readable(
    pidfd: Option<AsyncFd<std::os::fd::OwnedFd>>,
    deadline: tokio::time::Instant,
) -> Option<bool> {
    match tokio::time::timeout_at(deadline, pidfd?.readable()).await {
        Ok(Ok(_)) => Some(true),
        Err(_) => Some(false),
        Ok(Err(_)) => None,
    }
}

/// State and start time (fields 3 and 22) of /proc/<pid>/stat; comm may contain anything.
pub(super) fn parse_stat(stat: &str) -> Option<(char, u64)> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let start_time = fields.nth(18)?.parse().ok()?;
    Some((state, start_time))
}
