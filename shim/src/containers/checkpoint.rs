//! CheckpointContainer: CRIU dumps a running container's processes through libcontainer (which
//! speaks CRIU's RPC to `criu swrk`), leaving them running. The daemon makes the archive.

use std::path::{Path, PathBuf};
use std::time::Duration;

use libcontainer::container::{CheckpointOptions, Container};

use super::{Containers, Status};
use crate::api_error::{chain, ApiError};
use crate::helper::in_helper_group;

/// When the request gives no time limit.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

/// CRIU's log, in the work dir (libcontainer names it).
pub const DUMP_LOG: &str = "dump.log";

/// The name libcontainer gives the container's init until it execs the command.
const INIT_COMM: &str = "youki:[2:INIT]";

/// How long a checkpoint waits for a just-started container's init to exec its command.
const EXEC_WAIT: Duration = Duration::from_secs(10);

impl Containers {
    pub fn checkpoint(
        &mut self,
        id: &str,
        image_dir: &str,
        work_dir: &str,
        timeout_seconds: u32,
    ) -> Result<(), ApiError> {
        let entry = self.table.get(id).ok_or_else(|| ApiError::not_found(id))?;
        if entry.status != Status::Running {
            return Err(ApiError::precondition(format!(
                "container {id} is {}, only a running container can be checkpointed",
                entry.status.name()
            )));
        }
        let (image_dir, work_dir) = (PathBuf::from(image_dir), PathBuf::from(work_dir));
        for dir in [&image_dir, &work_dir] {
            if !dir.is_absolute() {
                return Err(ApiError::invalid(format!(
                    "checkpoint directory {dir:?} is not absolute"
                )));
            }
        }
        let timeout = match timeout_seconds {
            0 => DEFAULT_TIMEOUT,
            s => Duration::from_secs(s.into()),
        };
        // StartContainer answers once the init is told to exec (as runc's start does), not once
        // it has: a checkpoint right after it (slow machines, an emulated VM) could find the
        // init still in libcontainer's code, and CRIU would try to dump the shim's image.
        if !exec_done(entry.pid, EXEC_WAIT) {
            return Err(ApiError::precondition(format!(
                "container {id} has not started its command within {EXEC_WAIT:?} of its start: try again"
            )));
        }
        let dir = self.root.join(id);
        let log = work_dir.join(DUMP_LOG);
        let result = in_helper_group(
            &format!("checkpointing container {id}"),
            &[self.log_fd],
            timeout,
            true,
            || {
                let opts = CheckpointOptions {
                    ext_unix_sk: false,
                    // As CRI-O: a process holding a file lock is common (databases).
                    file_locks: true,
                    image_path: image_dir.clone(),
                    // Forensic: the kubelet expects the container to go on.
                    leave_running: true,
                    shell_job: false,
                    // Established TCP connections are not kept (a restore lands in a new pod,
                    // with a new address): CRIU refuses to dump them, which says so.
                    tcp_established: false,
                    work_path: Some(work_dir.clone()),
                    manage_cgroups_mode: rust_criu::CgMode::SOFT,
                    link_remap: false,
                };
                Container::load(dir)
                    .and_then(|mut c| c.checkpoint(&opts))
                    .map_err(|e| ApiError::internal(format!("CRIU: {}{}", chain(&e), criu_errors(&log))))
            },
        );
        match &result {
            Ok(()) => tracing::info!(id, image_dir = ?image_dir, "container checkpointed"),
            Err(e) => tracing::warn!(id, error = %e.message, "checkpoint failed"),
        }
        // A killed CRIU leaves nothing to undo: the processes were seized with ptrace only, and
        // the kernel lets them go when their tracer ends.
        result.map_err(|e| ApiError::new(e.code, format!("checkpointing container {id}: {}", e.message)))
    }
}

/// Whether process `pid` has left libcontainer's init for its command (or is gone: then CRIU
/// says so), waiting up to `limit`.
fn exec_done(pid: i32, limit: Duration) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        match std::fs::read_to_string(format!("/proc/{pid}/comm")) {
            Ok(comm) if comm.trim_end() == INIT_COMM => {}
            _ => return true,
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// CRIU's first error lines from its log, for the message a person reads, with where the log is.
pub(super) fn criu_errors(log: &Path) -> String {
    let Ok(text) = std::fs::read_to_string(log) else {
        return String::new();
    };
    let errors: Vec<&str> = text.lines().filter(|l| l.contains("Error (")).take(3).collect();
    if errors.is_empty() {
        return format!(" (CRIU's log: {log:?})");
    }
    let joined = errors.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" | ");
    format!(
        ": {} (CRIU's log: {log:?})",
        joined.chars().take(2000).collect::<String>()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A process named as libcontainer's init that execs its command 300 ms later: the wait ends
    /// with the exec, and a process that never execs is reported after the limit.
    #[test]
    fn a_checkpoint_waits_for_the_init_to_exec() {
        let script = |then: &str| {
            format!(
                "import ctypes, os, time\n\
                 ctypes.CDLL(None).prctl(15, b'{INIT_COMM}', 0, 0, 0)\n\
                 time.sleep(0.3)\n{then}"
            )
        };
        let spawn = |then: &str| {
            std::process::Command::new("python3")
                .args(["-c", &script(then)])
                .spawn()
                .expect("python3")
        };
        let comm = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        let mut execs = spawn("os.execvp('sleep', ['sleep', '5'])");
        let pid = execs.id();
        while comm(pid).trim_end() != INIT_COMM {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert!(exec_done(pid as i32, Duration::from_secs(10)));
        assert_eq!(comm(pid).trim_end(), "sleep");
        let _ = execs.kill();
        let _ = execs.wait();

        let mut stays = spawn("time.sleep(5)");
        let pid = stays.id();
        while comm(pid).trim_end() != INIT_COMM {
            std::thread::sleep(Duration::from_millis(5));
        }
        let started = std::time::Instant::now();
        assert!(!exec_done(pid as i32, Duration::from_millis(200)));
        assert!(started.elapsed() >= Duration::from_millis(200));
        let _ = stays.kill();
        let _ = stays.wait();
    }
}
