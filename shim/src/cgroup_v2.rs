//! SIGKILL for a whole container on cgroup v2: one write of `1` to its cgroup's `cgroup.kill`
//! (Linux 5.14+) kills every process in it at once, with no window for a fork to escape and
//! without the freeze-list-signal-thaw round libcontainer does for any signal.

use std::path::PathBuf;

/// The `cgroup.kill` file of container `id`, whose init is `pid`: only on a pure cgroup v2 host
/// (on a hybrid one the unified hierarchy holds the shim's cgroup, not the container's) and only
/// when the cgroup is the container's own (`scute-<id>` or `scute-<id>.scope`).
pub fn kill_file(id: &str, pid: i32) -> Option<PathBuf> {
    if !scute_sys::cgroupfs::is_cgroup2(std::path::Path::new("/sys/fs/cgroup")) {
        return None;
    }
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
    let path = own_cgroup(&cgroup, id)?;
    let file = PathBuf::from(format!("/sys/fs/cgroup{path}/cgroup.kill"));
    file.is_file().then_some(file)
}

/// The unified cgroup path in /proc/<pid>/cgroup text, if it is container `id`'s own.
fn own_cgroup<'a>(proc_cgroup: &'a str, id: &str) -> Option<&'a str> {
    let path = proc_cgroup.lines().find_map(|l| l.strip_prefix("0::"))?;
    let last = path.rsplit('/').next()?;
    let own = [format!("scute-{id}"), format!("scute-{id}.scope")];
    own.iter().any(|o| o == last).then_some(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_containers_own_cgroup_is_killed() {
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
