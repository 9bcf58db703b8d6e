//! A container's own cgroup on a pure cgroup v2 host, and SIGKILL for a whole container through
//! it: one write of `1` to its `cgroup.kill` (Linux 5.14+) kills every process in it at once, with
//! no window for a fork to escape and without the freeze-list-signal-thaw round libcontainer does
//! for any signal.

use std::path::{Path, PathBuf};

/// The cgroup directory of container `id`, whose init is `pid`: only on a pure cgroup v2 host
/// (on a hybrid one the unified hierarchy holds the shim's cgroup, not the container's) and only
/// when the cgroup is the container's own (`scute-<id>` or `scute-<id>.scope`).
pub fn own_dir(id: &str, pid: i32) -> Option<PathBuf> {
    dir_named(pid, &[format!("scute-{id}"), format!("scute-{id}.scope")])
}

/// The unified cgroup directory `pid` is in, on a pure cgroup v2 host, if its last component is
/// one of `names`.
pub fn dir_named(pid: i32, names: &[String]) -> Option<PathBuf> {
    if !scute_sys::cgroupfs::is_cgroup2(Path::new("/sys/fs/cgroup")) {
        return None;
    }
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = named_cgroup(&cgroup, names)?;
    let dir = PathBuf::from(format!("/sys/fs/cgroup{path}"));
    dir.is_dir().then_some(dir)
}

/// The `cgroup.kill` file of container `id`, whose init is `pid` (see [`own_dir`]).
pub fn kill_file(id: &str, pid: i32) -> Option<PathBuf> {
    let file = own_dir(id, pid)?.join("cgroup.kill");
    file.is_file().then_some(file)
}

/// SIGKILLs every process of container `id` (init `pid`) with one write to its own cgroup's
/// `cgroup.kill`. False when there is none (not pure cgroup v2, not its own cgroup) or the write
/// failed (logged): the caller signals them another way.
pub fn kill_all(id: &str, pid: i32) -> bool {
    let Some(file) = kill_file(id, pid) else {
        return false;
    };
    match std::fs::write(&file, "1") {
        Ok(()) => true,
        Err(e) => {
            tracing::warn!(id, file = %file.display(), error = %e, "cgroup.kill failed; signalling each process");
            false
        }
    }
}

/// The unified cgroup path in /proc/<pid>/cgroup text, if its last component is one of `names`.
fn named_cgroup<'a>(proc_cgroup: &'a str, names: &[String]) -> Option<&'a str> {
    let path = proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let last = path.rsplit('/').next()?;
    names.iter().any(|n| n == last).then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_containers_own_cgroup_is_killed() {
        let own_cgroup = |text, id| named_cgroup(text, &[format!("scute-{id}"), format!("scute-{id}.scope")]);
        assert_eq!(
            own_cgroup("0::/system.slice/scute-c1.scope\n", "c1"),
            Some("/system.slice/scute-c1.scope")
        );
        assert_eq!(
            own_cgroup("0::/kubepods/pod1/scute-c1\n", "c1"),
            Some("/kubepods/pod1/scute-c1")
        );
        // A process that left (or never entered) the container's cgroup: not a target.
        assert_eq!(own_cgroup("0::/system.slice/scute.service\n", "c1"), None);
        assert_eq!(own_cgroup("0::/kubepods/pod1/scute-c10\n", "c1"), None);
        assert_eq!(own_cgroup("4:memory:/scute/scute-c1\n", "c1"), None);
    }
}
