//! The shim's own cgroup. The daemon names one beside the pod's containers (`--cgroup`), as
//! CRI-O's default `conmon_cgroup = "pod"` does: the shim's memory is then charged to its pod,
//! inside the overhead the kubelet reserves for it, and not to nobody.
//!
//! - systemd: a transient scope `scute-shim-<id>.scope` in the pod's slice, started through
//!   systemd's D-Bus API by libcgroups' systemd manager, so that stopping or restarting scute's
//!   unit never touches a shim (whatever its KillMode); systemd removes the scope once the shim
//!   exits. Without `--cgroup` (an older daemon), the scope is in system.slice.
//! - cgroupfs: `<pod cgroup>/scute-shim-<id>` in every hierarchy libcgroups manages, which the
//!   daemon removes with the pod. Without `--cgroup`, the shim stays where it was started. On
//!   cgroup v1 (and hybrid) the move is made here, as libcgroups' v1 manager makes it, from the
//!   hierarchies read once: that manager looks each of its 12 controllers up in the mount table
//!   and reads the whole table for every one the host does not mount, which on a node with many
//!   containers was most of a pod's start.

use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
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
    } else if crate::cgroup_v1::applies() {
        enter_v1(cgroup).map_err(|e| format!("moving the shim into its cgroup {cgroup}: {e}"))?;
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

/// What libcgroups' v1 manager does to add this process to `cgroup`: the directory made in every
/// hierarchy holding one of its controllers, each new cpuset level given its parent's cpus and
/// mems (a cpuset cgroup without them takes no process), then the pid into `cgroup.procs`.
fn enter_v1(cgroup: &str) -> io::Result<()> {
    let pid = std::process::id().to_string();
    for hierarchy in crate::cgroup_v1::managed()? {
        let dir = crate::cgroup_v1::dir(hierarchy, Path::new(cgroup))
            .ok_or_else(|| io::Error::other(format!("invalid cgroup path {cgroup:?}")))?;
        fs::create_dir_all(&dir).map_err(|e| io::Error::new(e.kind(), format!("creating {}: {e}", dir.display())))?;
        if hierarchy.controllers.iter().any(|c| c == "cpuset") {
            let relative = dir.strip_prefix(&hierarchy.mount_point).unwrap_or(Path::new(""));
            for file in ["cpuset.cpus", "cpuset.mems"] {
                inherit_cpuset(&hierarchy.mount_point, relative, file)?;
            }
        }
        let procs = dir.join("cgroup.procs");
        fs::OpenOptions::new()
            .write(true)
            .open(&procs)
            .and_then(|mut f| f.write_all(pid.as_bytes()))
            .map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", procs.display())))?;
    }
    Ok(())
}

/// Each cpuset level from the hierarchy's top down to `relative` whose `file` is empty (a new
/// one) gets its parent's value, as libcgroups' cpuset controller does.
fn inherit_cpuset(mount_point: &Path, relative: &Path, file: &str) -> io::Result<()> {
    let read =
        |p: &Path| fs::read_to_string(p).map_err(|e| io::Error::new(e.kind(), format!("reading {}: {e}", p.display())));
    let mut current = mount_point.to_path_buf();
    for component in relative.components() {
        let parent = read(&current.join(file))?;
        if parent.trim().is_empty() {
            return Err(io::Error::other(format!("{} is empty", current.join(file).display())));
        }
        current.push(component);
        let child = current.join(file);
        if read(&child)?.trim().is_empty() {
            fs::write(&child, parent.trim())
                .map_err(|e| io::Error::new(e.kind(), format!("writing {}: {e}", child.display())))?;
        }
    }
    Ok(())
}
