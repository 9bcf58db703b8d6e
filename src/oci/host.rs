//! What the spec builder knows of the host, gathered once when the daemon starts: the host's
//! cgroup layout and the runtime's own capabilities do not change under a running daemon (the
//! hierarchies are never remounted), so each part of a spec is a function of the request and
//! these facts, and tests pin a cgroup v1 or v2 host instead of asserting whatever they run on.
//! What does change (the mount table, for propagation checks; /dev, for privileged containers)
//! is still read per request.

use std::collections::BTreeSet;
use std::path::Path;

use scute_sys::mountinfo::{self, Mount};

use super::capabilities::{held_from_status, ALL_CAPABILITIES};

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostFacts {
    /// /sys/fs/cgroup is the unified (v2) hierarchy.
    pub cgroup2: bool,
    /// Swap limits can be set (v2: memory.swap.max exists; v1: memory.memsw.*).
    pub swap: bool,
    /// The hugetlb controller is there.
    pub hugetlb: bool,
    /// The highest capability number the kernel knows (/proc/sys/kernel/cap_last_cap).
    pub last_cap: usize,
    /// The capabilities scute itself holds (effective), all a container can get.
    pub held_caps: BTreeSet<usize>,
    /// On a v1 or hybrid host, what the container's /sys/fs/cgroup bind mounts are made from.
    pub v1: V1Cgroups,
}

/// The daemon's view of the v1 hierarchies: its mount table, its /proc/self/cgroup (the shim and
/// so a container inherit its cgroups in hierarchies libcontainer leaves alone) and the symlinks
/// of /sys/fs/cgroup (`cpu` → `cpu,cpuacct`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct V1Cgroups {
    pub mounts: Vec<Mount>,
    pub own_cgroup: String,
    pub links: Vec<(String, String)>,
}

impl HostFacts {
    /// This host, as the daemon (root, in the host's namespaces) sees it.
    pub fn gather() -> HostFacts {
        let root = Path::new("/sys/fs/cgroup");
        let cgroup2 = root.join("cgroup.controllers").exists();
        let own_cgroup = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let last_cap = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(ALL_CAPABILITIES.len() - 1)
            .min(ALL_CAPABILITIES.len() - 1);
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let swap = if cgroup2 {
            let own = own_cgroup.lines().find_map(|l| l.strip_prefix("0::")).map(str::trim);
            match own {
                Some(p) if p != "/" && root.join(p.trim_start_matches('/')).join("memory.swap.max").exists() => true,
                // At the root (or not found there): any child cgroup with the file.
                _ => std::fs::read_dir(root)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .any(|e| e.path().join("memory.swap.max").exists()),
            }
        } else {
            root.join("memory/memory.memsw.limit_in_bytes").exists()
        };
        let hugetlb = if cgroup2 {
            std::fs::read_to_string(root.join("cgroup.controllers"))
                .is_ok_and(|c| c.split_whitespace().any(|c| c == "hugetlb"))
        } else {
            root.join("hugetlb").exists()
        };
        let v1 = if cgroup2 {
            V1Cgroups::default()
        } else {
            V1Cgroups {
                mounts: mountinfo::read().unwrap_or_default(),
                own_cgroup,
                links: std::fs::read_dir(root)
                    .into_iter()
                    .flatten()
                    .flatten()
                    .filter_map(|e| {
                        let target = std::fs::read_link(e.path()).ok()?;
                        let target = target.file_name()?.to_string_lossy().into_owned();
                        Some((e.file_name().to_string_lossy().into_owned(), target))
                    })
                    .collect(),
            }
        };
        HostFacts {
            cgroup2,
            swap,
            hugetlb,
            last_cap,
            held_caps: held_from_status(&status, last_cap),
            v1,
        }
    }

    /// Every capability the kernel knows.
    pub fn supported_caps(&self) -> BTreeSet<usize> {
        (0..=self.last_cap).collect()
    }
}
