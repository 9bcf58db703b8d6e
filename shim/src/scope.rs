//! With systemd's cgroup driver the shim leaves the cgroup of whoever started it (scute.service)
//! for a transient scope of its own, `scute-shim-<sandbox-id>.scope` in system.slice, as CRI-O's
//! conmon does: stopping or restarting scute's unit then never touches a shim (whatever its
//! KillMode), and systemd accounts the shim's memory as its own. The scope is started through
//! systemd's D-Bus API by libcgroups' systemd manager; systemd removes it once the shim exits.

use std::path::PathBuf;
use std::time::Duration;

use libcgroups::common::CgroupManager;
use libcgroups::systemd::manager::Manager;
use nix::unistd::Pid;

/// Moves this process into its scope; returns the scope's unit name.
pub fn enter_own_scope(sandbox_id: &str) -> Result<String, String> {
    // A unit name holds at most 255 bytes: 32 hex digits of the ID (128 random bits) suffice.
    let short = &sandbox_id[..sandbox_id.len().min(32)];
    let manager = Manager::new(
        PathBuf::from("/sys/fs/cgroup"),
        PathBuf::from(format!("system.slice:scute-shim:{short}")),
        format!("scute-shim {short}"),
        true,
        // As runc waits for its scope's start job: a busy systemd (a loaded or emulated node,
        // just after scute.service started) took longer than libcgroups' 5 s.
        Duration::from_secs(30),
    )
    .map_err(|e| format!("connecting to systemd for the shim's scope: {e}"))?;
    manager
        .add_task(Pid::this())
        .map_err(|e| format!("starting the shim's scope scute-shim-{short}.scope: {e}"))?;
    Ok(format!("scute-shim-{short}.scope"))
}
