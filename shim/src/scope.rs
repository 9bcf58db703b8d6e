//! The shim's own cgroup. The daemon names one beside the pod's containers (`--cgroup`), as
//! CRI-O's default `conmon_cgroup = "pod"` does: the shim's memory is then charged to its pod,
//! inside the overhead the kubelet reserves for it, and not to nobody.
//!
//! - systemd: a transient scope `scute-shim-<id>.scope` in the pod's slice, started through
//!   systemd's D-Bus API by libcgroups' systemd manager, so that stopping or restarting scute's
//!   unit never touches a shim (whatever its KillMode); systemd removes the scope once the shim
//!   exits. Without `--cgroup` (an older daemon), the scope is in system.slice.
//! - cgroupfs: `<pod cgroup>/scute-shim-<id>` in every hierarchy libcgroups manages, which the
//!   daemon removes with the pod. Without `--cgroup`, the shim stays where it was started.

use std::path::PathBuf;
use std::time::Duration;

use libcgroups::common::{CgroupConfig, CgroupManager};
use libcgroups::systemd::manager::Manager;
use nix::unistd::Pid;

/// The cgroups path the shim of sandbox `id` moves into, if any.
pub fn own_cgroup(id: &str, systemd: bool, given: Option<&str>) -> Option<String> {
    match given {
        Some(path) => Some(path.to_string()),
        // A unit name holds at most 255 bytes: 32 hex digits of the ID (128 random bits) suffice.
        None if systemd => Some(format!("system.slice:scute-shim:{}", &id[..id.len().min(32)])),
        None => None,
    }
}

/// Moves this process into `cgroup` (the driver's form).
pub fn enter(cgroup: &str, systemd: bool) -> Result<(), String> {
    // What libcgroups makes on the way (the pod's cgroup in a hierarchy the kubelet left alone)
    // gets runc's 0755, not the daemon's private umask: a user-namespaced pod's root must walk
    // that path to its containers' cgroups.
    let umask = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o022));
    let entered = enter_with(cgroup, systemd);
    nix::sys::stat::umask(umask);
    entered
}

fn enter_with(cgroup: &str, systemd: bool) -> Result<(), String> {
    // systemd shows it as the unit's description.
    let name = format!("scute-shim {}", cgroup.rsplit([':', '/']).next().unwrap_or_default());
    if systemd {
        let manager = Manager::new(
            PathBuf::from("/sys/fs/cgroup"),
            PathBuf::from(cgroup),
            name,
            true,
            // As runc waits for its scope's start job: a busy systemd (a loaded or emulated node,
            // just after scute.service started) took longer than libcgroups' 5 s.
            Duration::from_secs(30),
        )
        .map_err(|e| format!("connecting to systemd for the shim's scope {cgroup}: {e}"))?;
        manager
            .add_task(Pid::this())
            .map_err(|e| format!("starting the shim's scope {cgroup}: {e}"))?;
    } else {
        let manager = libcgroups::common::create_cgroup_manager(CgroupConfig {
            cgroup_path: PathBuf::from(cgroup),
            systemd_cgroup: false,
            container_name: name,
        })
        .map_err(|e| format!("the shim's cgroup {cgroup}: {e}"))?;
        manager
            .add_task(Pid::this())
            .map_err(|e| format!("moving the shim into its cgroup {cgroup}: {e}"))?;
    }
    Ok(())
}
