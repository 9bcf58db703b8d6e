//! The cgroup hierarchies mounted here, from the mount table: each v1 hierarchy (its controllers)
//! and the unified (v2) one, with the sub-tree each mount shows, and where a cgroup's directory
//! is in each. Pure v2 nodes have only the unified hierarchy; hybrid ones both.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::mountinfo::{self, Mount};

/// A mounted cgroup hierarchy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hierarchy {
    /// v1: its controllers (`cpu`, `cpuacct`, …; a named one like `name=systemd` has none).
    pub controllers: Vec<String>,
    pub mount_point: PathBuf,
    /// The cgroup the mount shows as its top (`/` for the whole hierarchy).
    pub root: String,
}

impl Hierarchy {
    fn from_mount(m: &Mount) -> Hierarchy {
        Hierarchy {
            controllers: m
                .super_options
                .split(',')
                .filter(|o| !o.is_empty() && !matches!(*o, "rw" | "ro") && !o.contains('='))
                .map(str::to_string)
                .collect(),
            mount_point: m.mount_point.clone(),
            root: m.root.clone(),
        }
    }

    /// The directory of cgroup `path` (as /proc/<pid>/cgroup or an OCI cgroupsPath names it),
    /// if this mount shows it.
    pub fn dir(&self, path: &str) -> Option<PathBuf> {
        let root = self.root.trim_end_matches('/');
        let rel = match path.strip_prefix(root) {
            Some(r) if r.is_empty() || r.starts_with('/') || root.is_empty() => r,
            _ => return None,
        };
        let rel = rel.trim_start_matches('/');
        Some(if rel.is_empty() {
            self.mount_point.clone()
        } else {
            self.mount_point.join(rel)
        })
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hierarchies {
    pub v1: Vec<Hierarchy>,
    pub unified: Option<Hierarchy>,
}

impl Hierarchies {
    /// This process's (empty if its mount table cannot be read).
    pub fn read() -> Hierarchies {
        mountinfo::read()
            .map(|m| Hierarchies::from_mounts(&m))
            .unwrap_or_default()
    }

    /// The first mount of each hierarchy wins (later ones are bind mounts of it).
    pub fn from_mounts(mounts: &[Mount]) -> Hierarchies {
        let mut out = Hierarchies::default();
        for m in mounts {
            match m.fstype.as_str() {
                "cgroup2" if out.unified.is_none() => out.unified = Some(Hierarchy::from_mount(m)),
                "cgroup" => {
                    let h = Hierarchy::from_mount(m);
                    if !out.v1.iter().any(|o| o.controllers == h.controllers) {
                        out.v1.push(h);
                    }
                }
                _ => {}
            }
        }
        out
    }

    /// The v1 hierarchy of `controller`, if one is mounted.
    pub fn v1_of(&self, controller: &str) -> Option<&Hierarchy> {
        self.v1.iter().find(|h| h.controllers.iter().any(|c| c == controller))
    }
}

/// `dir` and every cgroup below it (a container may make its own), children before parents
/// (the order rmdir needs); empty when `dir` does not exist.
pub fn subtree(dir: &Path) -> Vec<PathBuf> {
    let mut found = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return found;
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            found.extend(subtree(&entry.path()));
        }
    }
    found.push(dir.to_path_buf());
    found
}

/// The processes in cgroup `dir` itself (its `cgroup.procs`); none when it cannot be read.
pub fn procs(dir: &Path) -> Vec<i32> {
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

/// The processes in the cgroups `dirs` and below them.
pub fn procs_below(dirs: &[PathBuf]) -> BTreeSet<i32> {
    dirs.iter().flat_map(|d| subtree(d)).flat_map(|d| procs(&d)).collect()
}

/// Whether `dir` is on a cgroup2 filesystem (statfs), as a pure v2 node's /sys/fs/cgroup is.
pub fn is_cgroup2(dir: &Path) -> bool {
    nix::sys::statfs::statfs(dir).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
31 23 0:28 / /sys/fs/cgroup ro - tmpfs tmpfs ro,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 /kube /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory
40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd
42 31 0:39 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate
50 23 0:32 /kube /mnt/again rw - cgroup cgroup rw,memory
";

    #[test]
    fn hybrid_node() {
        let h = Hierarchies::from_mounts(&mountinfo::parse(HYBRID));
        assert_eq!(
            h.v1.len(),
            3,
            "cpu,cpuacct, memory, name=systemd; the second memory mount is the same"
        );
        let cpu = h.v1_of("cpuacct").unwrap();
        assert_eq!(cpu.dir("/a/b"), Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct/a/b")));
        assert_eq!(cpu.dir("/"), Some(PathBuf::from("/sys/fs/cgroup/cpu,cpuacct")));
        let mem = h.v1_of("memory").unwrap();
        assert_eq!(mem.dir("/kube/pod"), Some(PathBuf::from("/sys/fs/cgroup/memory/pod")));
        assert_eq!(mem.dir("/kube"), Some(PathBuf::from("/sys/fs/cgroup/memory")));
        assert_eq!(mem.dir("/kubelet"), None, "not below the mount's root");
        assert_eq!(mem.dir("/other"), None);
        assert!(h.v1_of("pids").is_none());
        let unified = h.unified.as_ref().unwrap();
        assert_eq!(unified.dir("/x"), Some(PathBuf::from("/sys/fs/cgroup/unified/x")));
    }

    #[test]
    fn this_node() {
        let h = Hierarchies::read();
        assert!(h.unified.is_some() || !h.v1.is_empty(), "{h:?}");
        assert_eq!(
            is_cgroup2(Path::new("/sys/fs/cgroup")),
            h.v1.is_empty()
                && h.unified
                    .as_ref()
                    .is_some_and(|u| u.mount_point == Path::new("/sys/fs/cgroup"))
        );
    }
}
