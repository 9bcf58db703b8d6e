//! Cgroups named for a pod or container (`scute-<id>`, `scute-<id>.scope`), or for a pod's shim
//! (`scute-shim-<32 hex of the pod's id>`, `.scope` under systemd), that no record knows: a crash
//! between libcontainer making one and the record being written, or a removal cut short. An
//! empty one only clutters the tree; one with processes is a container nothing can stop through
//! the CRI. Repair thaws and kills what is inside, then removes the cgroup in every hierarchy.
//!
//! Another scute on the host (a node of a test cluster, the tests' many daemons) uses the same
//! names, and its pods' cgroups outlive their shims when those die: a cgroup is taken as this
//! daemon's only when its own state dir has a trace of it (a shim's state dir is named after its
//! pod, `shims/<first 32 hex of the pod id>`, and holds `containers/<id>` for each container
//! libcontainer made: both exist before libcontainer makes the cgroup). One a live shim of
//! another state dir serves, or with no trace here, is another daemon's and is left alone.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use super::{Finding, Kind};
use crate::cgroups::Owner;
use crate::container::record::ContainerRecord;
use crate::sandbox::record::SandboxRecord;
use crate::store::{self, Store};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";
/// How deep the walk goes below a hierarchy's root (kubepods/burstable/pod<uid>/scute-<id> is 4).
const MAX_DEPTH: usize = 8;
/// How long repair waits for killed processes to leave a cgroup.
const KILL_WAIT: Duration = Duration::from_secs(5);

/// Finds (and with `repair` removes) scute's cgroups no record knows that were made at least
/// `settled` ago. `state` is this daemon's state dir (its shims live under `state/shims`).
pub fn examine(store: &Store, state: &Path, repair: bool, settled: Duration) -> Result<Vec<Finding>, store::Error> {
    // Ages are measured against when the records were read: a repair that takes a while must
    // not reach a member created after that.
    let cutoff = SystemTime::now() - settled;
    let pods = store.list::<SandboxRecord>()?;
    // A shim's cgroup names its pod by the first 32 hex digits of its ID.
    let mut known: HashSet<Owner> = pods.iter().map(|s| Owner::Shim(s.id[..32].to_string())).collect();
    known.extend(pods.into_iter().map(|s| Owner::Member(s.id)));
    known.extend(
        store
            .list::<ContainerRecord>()?
            .into_iter()
            .map(|c| Owner::Member(c.id)),
    );
    let unknown = unknown_cgroups(&known);
    // After the walk: a member's shim state exists before its cgroup does. Only cgroups this
    // daemon has a trace of are its own: another daemon's (its shim alive or not) is left alone.
    let traces = Traces::read(&state.join("shims"));
    let mut findings = Vec::new();
    for ((path, owner), dirs) in unknown {
        let fresh = dirs
            .iter()
            .any(|d| d.metadata().and_then(|m| m.modified()).map_or(true, |t| t > cutoff));
        if fresh || !traces.has(&owner) {
            continue;
        }
        // Recorded since the records were read: a create that got there first.
        if recorded(store, &owner)? {
            continue;
        }
        let pids = procs(&dirs);
        let detail = match pids.len() {
            0 => "no pod or container records it; empty".to_string(),
            n => format!("no pod or container records it; {n} process(es) nothing can stop"),
        };
        let mut finding = Finding::new(Kind::OrphanCgroup, path, 0, detail);
        if repair {
            finding.repaired = remove(&dirs, &mut finding.detail);
        }
        findings.push(finding);
    }
    Ok(findings)
}

/// What this daemon's shims dir has a trace of, read once: pods by their shim state dir (named
/// by the first 32 hex digits of the pod's ID), containers by their dir in any shim's
/// `containers/`.
struct Traces {
    pods: HashSet<String>,
    containers: HashSet<String>,
}

impl Traces {
    fn read(shims: &Path) -> Traces {
        let names = |dir: &Path| -> Vec<(String, PathBuf)> {
            std::fs::read_dir(dir)
                .into_iter()
                .flatten()
                .flatten()
                .map(|e| (e.file_name().to_string_lossy().into_owned(), e.path()))
                .collect()
        };
        let shim_dirs = names(shims);
        let containers = shim_dirs
            .iter()
            .flat_map(|(_, dir)| names(&dir.join("containers")))
            .map(|(name, _)| name)
            .collect();
        Traces {
            pods: shim_dirs.into_iter().map(|(name, _)| name).collect(),
            containers,
        }
    }

    fn has(&self, owner: &Owner) -> bool {
        match owner {
            Owner::Shim(pod) => self.pods.contains(pod),
            Owner::Member(id) => self.pods.contains(&id[..32]) || self.containers.contains(id),
        }
    }
}

/// Whether the owner of a cgroup has a record now (a shim: its pod).
fn recorded(store: &Store, owner: &Owner) -> Result<bool, store::Error> {
    match owner {
        Owner::Shim(pod) => Ok(store
            .list::<SandboxRecord>()?
            .iter()
            .any(|s| s.id.starts_with(pod.as_str()))),
        Owner::Member(id) => {
            Ok(store.get::<SandboxRecord>(id)?.is_some() || store.get::<ContainerRecord>(id)?.is_some())
        }
    }
}

/// Every scute cgroup whose owner is not `known`, by its path below the hierarchies' roots and
/// its owner, with its directory in each hierarchy that has it.
fn unknown_cgroups(known: &HashSet<Owner>) -> BTreeMap<(String, Owner), Vec<PathBuf>> {
    let mut found = BTreeMap::new();
    for root in hierarchies() {
        walk(&root, &root, 0, known, &mut found);
    }
    found
}

/// The unified hierarchy, or each v1 hierarchy and the hybrid host's unified one (the
/// `cpu` → `cpu,cpuacct` links are skipped: the same hierarchy twice).
fn hierarchies() -> Vec<PathBuf> {
    let root = Path::new(CGROUP_ROOT);
    if scute_sys::cgroupfs::is_cgroup2(root) {
        return vec![root.to_path_buf()];
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .collect()
}

fn walk(
    root: &Path,
    dir: &Path,
    depth: usize,
    known: &HashSet<Owner>,
    found: &mut BTreeMap<(String, Owner), Vec<PathBuf>>,
) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        if !entry.file_type().is_ok_and(|t| t.is_dir()) {
            continue;
        }
        let path = entry.path();
        match Owner::of(&entry.file_name().to_string_lossy()) {
            Some(owner) if !known.contains(&owner) => {
                let below = path.strip_prefix(root).unwrap_or(&path);
                found
                    .entry((format!("/{}", below.display()), owner))
                    .or_default()
                    .push(path);
            }
            Some(_) => {}
            None if depth < MAX_DEPTH => walk(root, &path, depth + 1, known, found),
            None => {}
        }
    }
}

/// The processes in the cgroup (and below it), in every hierarchy, in order.
fn procs(dirs: &[PathBuf]) -> Vec<i32> {
    crate::cgroups::procs_below(dirs).into_iter().collect()
}

/// Thaws the cgroup (a frozen process never dies), kills what is in it and removes it in every
/// hierarchy; says why not in `detail` when it cannot.
fn remove(dirs: &[PathBuf], detail: &mut String) -> bool {
    let all: Vec<PathBuf> = dirs.iter().flat_map(|d| crate::cgroups::subtree(d)).collect();
    for dir in &all {
        let _ = std::fs::write(dir.join("cgroup.freeze"), "0");
        let _ = std::fs::write(dir.join("freezer.state"), "THAWED");
    }
    let deadline = Instant::now() + KILL_WAIT;
    loop {
        let pids = procs(dirs);
        if pids.is_empty() {
            break;
        }
        if Instant::now() > deadline {
            detail.push_str(&format!("; {} process(es) would not die", pids.len()));
            return false;
        }
        // cgroup v2's cgroup.kill kills exactly the members; v1 has none (and on a hybrid host
        // the members may be in v1 only): their PIDs, read just now.
        for dir in dirs {
            let _ = std::fs::write(dir.join("cgroup.kill"), "1");
        }
        for pid in pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    for dir in all {
        // systemd removes an emptied scope's cgroup itself, and keeps the unit for good if the
        // cgroup goes before it looked (crate::cgroups::rmdir): one still here after a while
        // has no unit watching it.
        if crate::cgroups::is_scope(&dir) {
            let deadline = Instant::now() + KILL_WAIT;
            while dir.exists() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        match std::fs::remove_dir(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                detail.push_str(&format!("; removing {}: {e}", dir.display()));
                return false;
            }
            _ => {}
        }
    }
    true
}
