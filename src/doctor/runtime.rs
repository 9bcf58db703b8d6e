//! Pods' and containers' leftovers: directories under `root/sandboxes` and `root/containers`
//! with no record, and network namespace pins under `state/netns` no pod records (a crash
//! between making them and recording them, or a removal cut short). Repair unmounts what is
//! mounted under them and removes them.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{Finding, Kind};
use crate::container::record::ContainerRecord;
use crate::sandbox::record::SandboxRecord;
use crate::store::{self, Store};

/// With the daemon running, a create may have made its directory a moment before its record:
/// only what is older than this is a leftover then.
pub const SETTLED: Duration = Duration::from_secs(60);

/// Finds (and with `repair` removes) the leftovers under `root` and `state` that were last
/// changed at least `settled` ago.
pub fn examine(
    store: &Store,
    root: &Path,
    state: &Path,
    repair: bool,
    settled: Duration,
) -> Result<Vec<Finding>, store::Error> {
    let sandboxes = store.list::<SandboxRecord>()?;
    let containers = store.list::<ContainerRecord>()?;
    let mut findings = Vec::new();
    let known: [(&str, HashSet<&str>); 2] = [
        ("sandboxes", sandboxes.iter().map(|s| s.id.as_str()).collect()),
        ("containers", containers.iter().map(|c| c.id.as_str()).collect()),
    ];
    for (kind, ids) in known {
        for dir in settled_entries(&root.join(kind), settled) {
            let id = dir.file_name().unwrap_or_default().to_string_lossy().into_owned();
            if ids.contains(id.as_str()) {
                continue;
            }
            let (bytes, _) = scute_sys::files::dir_usage(&dir);
            let mut finding = Finding::new(
                Kind::OrphanDir,
                dir.display().to_string(),
                bytes,
                format!("no {kind} record"),
            );
            if repair {
                finding.repaired = remove_tree(&dir, &mut finding.detail);
            }
            findings.push(finding);
        }
    }
    let pinned: HashSet<&Path> = sandboxes.iter().filter_map(|s| s.netns.as_deref()).collect();
    // A pod's record names its pin before the pin is made: an unrecorded one is never a create
    // in flight (and a mounted pin's time is the namespace's, not the file's).
    for file in settled_entries(&state.join("netns"), Duration::ZERO) {
        if pinned.contains(file.as_path()) {
            continue;
        }
        // A pod created since the records were read names its pin before making it.
        let pinned_now = store
            .list::<SandboxRecord>()?
            .iter()
            .any(|s| s.netns.as_deref() == Some(file.as_path()));
        if pinned_now {
            continue;
        }
        let mounted = scute_sys::mountinfo::is_mountpoint(&file);
        let detail = if mounted {
            "pinned, no pod records it"
        } else {
            "no pod records it"
        };
        let mut finding = Finding::new(Kind::StaleNetns, file.display().to_string(), 0, detail);
        if repair {
            match crate::sandbox::netns::NetNs::remove(&file) {
                Ok(()) => finding.repaired = true,
                Err(e) => finding.detail.push_str(&format!("; not removed: {e}")),
            }
        }
        findings.push(finding);
    }
    Ok(findings)
}

/// Entries of `dir` last changed at least `settled` ago (none if it is absent).
fn settled_entries(dir: &Path, settled: Duration) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter(|e| {
            e.metadata()
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().unwrap_or_default() >= settled)
        })
        .map(|e| e.path())
        .collect()
}

/// Unmounts everything mounted under `dir` (deepest first) and removes it; says why not in
/// `detail` when it cannot.
fn remove_tree(dir: &Path, detail: &mut String) -> bool {
    let mut mounts: Vec<PathBuf> = scute_sys::mountinfo::read()
        .unwrap_or_default()
        .into_iter()
        .map(|m| m.mount_point)
        .filter(|m| m.starts_with(dir))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.components().count()));
    for mount in mounts {
        if let Err(e) = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH) {
            detail.push_str(&format!("; unmounting {}: {e}", mount.display()));
            return false;
        }
    }
    match std::fs::remove_dir_all(dir) {
        Ok(()) => true,
        Err(e) => {
            detail.push_str(&format!("; not removed: {e}"));
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn age(path: &Path) {
        let old = std::time::SystemTime::now() - Duration::from_secs(3600);
        let file = std::fs::File::open(path).unwrap();
        file.set_modified(old).unwrap();
    }

    #[test]
    fn leftovers_without_records_are_found_and_removed_and_fresh_ones_left() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("meta.redb")).unwrap();
        let (root, state) = (dir.path().join("root"), dir.path().join("state"));
        let orphan = root.join("containers/0123abcd");
        std::fs::create_dir_all(orphan.join("rootfs")).unwrap();
        std::fs::write(orphan.join("rootfs/file"), vec![0u8; 8192]).unwrap();
        let fresh = root.join("sandboxes/fresh");
        std::fs::create_dir_all(&fresh).unwrap();
        std::fs::create_dir_all(state.join("netns")).unwrap();
        let netns = state.join("netns/stale");
        std::fs::write(&netns, "").unwrap();
        age(&orphan);
        age(&netns);

        let found = examine(&store, &root, &state, false, SETTLED).unwrap();
        let kinds: Vec<(Kind, bool)> = found.iter().map(|f| (f.kind, f.repaired)).collect();
        assert_eq!(
            kinds,
            [(Kind::OrphanDir, false), (Kind::StaleNetns, false)],
            "{found:?}"
        );
        assert!(found[0].bytes >= 8192, "{found:?}");
        assert!(orphan.exists() && netns.exists(), "looking changes nothing");

        let repaired = examine(&store, &root, &state, true, SETTLED).unwrap();
        assert!(repaired.iter().all(|f| f.repaired), "{repaired:?}");
        assert!(!orphan.exists() && !netns.exists());
        assert!(fresh.exists(), "a directory a create may be filling is left alone");
        assert!(examine(&store, &root, &state, false, SETTLED).unwrap().is_empty());
    }
}
