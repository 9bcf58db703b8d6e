//! A container's own cgroup on a cgroup v1 (or hybrid) host, for the shim's kill --all and delete
//! without libcgroups' v1 manager, which libcontainer's kill and delete construct: it looks each
//! of its 12 controllers up in the mount table and reads the whole table for every one the host
//! does not mount (four on the CI host), which with many containers on the node was most of a
//! pod's stop. Here the hierarchies come from the mount table read once per shim
//! (`oom::host_hierarchies`); what is done with them is what libcgroups does (by hand: it has no
//! constructor that takes the mount points).

use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};
use std::time::Duration;

use scute_sys::cgroupfs::{procs, procs_below, subtree, Hierarchy};

/// The v1 controllers libcgroups 0.7's v1 manager manages (its `CONTROLLERS`), as the kernel names
/// them in a hierarchy's mount options.
pub const CONTROLLERS: [&str; 12] = [
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "hugetlb",
    "pids",
    "perf_event",
    "memory",
    "blkio",
    "net_prio",
    "net_cls",
    "freezer",
];

/// Whether this host's cgroups are v1 (or hybrid), where this module applies.
pub fn applies() -> bool {
    !scute_sys::cgroupfs::is_cgroup2(Path::new("/sys/fs/cgroup"))
}

/// The mounted v1 hierarchies holding a controller libcgroups manages.
pub fn managed() -> io::Result<Vec<&'static Hierarchy>> {
    let hierarchies =
        crate::oom::host_hierarchies().ok_or_else(|| io::Error::other("no cgroup hierarchy is mounted"))?;
    Ok(hierarchies
        .v1
        .iter()
        .filter(|h| h.controllers.iter().any(|c| CONTROLLERS.contains(&c.as_str())))
        .collect())
}

/// `path` (a cgroupfs path, absolute) in `hierarchy`, joined to its mount point as libcgroups
/// joins it; None for one that climbs.
pub fn dir(hierarchy: &Hierarchy, path: &Path) -> Option<PathBuf> {
    let relative = path.strip_prefix("/").unwrap_or(path);
    relative
        .components()
        .all(|c| matches!(c, Component::Normal(_)))
        .then(|| hierarchy.mount_point.join(relative))
}

/// The freezer directory of cgroup `path` (a container's, as libcontainer recorded it), if a v1
/// freezer hierarchy is mounted (none is on a pure v2 host) and the directory is there.
pub fn freezer_dir(path: &Path) -> Option<PathBuf> {
    let freezer = managed()
        .ok()?
        .into_iter()
        .find(|h| h.controllers.iter().any(|c| c == "freezer"))?;
    let dir = dir(freezer, path)?;
    dir.is_dir().then_some(dir)
}

/// Sends `signal` to every process in the freezer cgroup `dir` and below, frozen meanwhile so
/// that none forks away, as libcontainer's kill --all does through libcgroups. A cgroup that does
/// not freeze is signalled all the same (libcontainer only warns, too).
pub fn signal_all(dir: &Path, signal: i32) -> io::Result<()> {
    let state = dir.join("freezer.state");
    let frozen = freeze(&state);
    if let Err(e) = &frozen {
        tracing::warn!(cgroup = %dir.display(), error = %e, "freezing before kill --all");
    }
    let mut result = Ok(());
    for pid in procs_below(&[dir.to_path_buf()]) {
        // SAFETY: kill takes no pointers; ESRCH (gone already) is what the caller wants.
        if unsafe { libc::kill(pid, signal) } != 0 && io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH) {
            result = Err(io::Error::last_os_error());
        }
    }
    if frozen.is_ok() {
        fs::write(&state, "THAWED")?;
    }
    result
}

/// Writes FROZEN until the cgroup reads FROZEN (FREEZING while its tasks stop), thawing now and
/// then as libcgroups does, for about a second at most.
fn freeze(state: &Path) -> io::Result<()> {
    for i in 0..100 {
        if i % 50 == 49 {
            let _ = fs::write(state, "THAWED");
            std::thread::sleep(Duration::from_millis(10));
        }
        fs::write(state, "FROZEN")?;
        if i % 25 == 24 {
            std::thread::sleep(Duration::from_millis(10));
        }
        match fs::read_to_string(state)?.trim() {
            "FROZEN" => return Ok(()),
            "FREEZING" => continue,
            other => return Err(io::Error::other(format!("unexpected freezer state {other}"))),
        }
    }
    let _ = fs::write(state, "THAWED");
    Err(io::Error::other("still freezing"))
}

/// Removes cgroup `path` (and any cgroup a container made below it) from every managed hierarchy,
/// SIGKILLing what is still in it and retrying rmdir while the kernel answers EBUSY, as
/// libcgroups' v1 manager's remove does (4 tries, 10 ms growing to 100 ms).
pub fn remove(path: &Path) -> io::Result<()> {
    for hierarchy in managed()? {
        let Some(top) = dir(hierarchy, path) else {
            return Err(io::Error::other(format!("invalid cgroup path {}", path.display())));
        };
        for cgroup in subtree(&top) {
            for pid in procs(&cgroup) {
                // SAFETY: kill takes no pointers.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
            rmdir_with_retry(&cgroup)?;
        }
    }
    Ok(())
}

fn rmdir_with_retry(dir: &Path) -> io::Result<()> {
    let mut delay = Duration::from_millis(10);
    for attempt in 1..=4 {
        match fs::remove_dir(dir) {
            Ok(()) => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
            Err(e) if attempt == 4 => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("removing cgroup {}: {e}", dir.display()),
                ))
            }
            Err(_) => {
                std::thread::sleep(delay);
                delay = (delay * attempt).min(Duration::from_millis(100));
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_join_the_mount_point_and_never_climb() {
        let h = Hierarchy {
            controllers: vec!["memory".into()],
            mount_point: "/sys/fs/cgroup/memory".into(),
            root: "/".into(),
        };
        assert_eq!(
            dir(&h, Path::new("/kubepods/pod1/scute-c1")),
            Some(PathBuf::from("/sys/fs/cgroup/memory/kubepods/pod1/scute-c1"))
        );
        assert_eq!(dir(&h, Path::new("/a/../../etc")), None);
        assert_eq!(dir(&h, Path::new("/")), Some(PathBuf::from("/sys/fs/cgroup/memory")));
    }
}
