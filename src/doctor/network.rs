//! The pod network left behind by pods no record knows (a crash between CNI ADD and the
//! record, or a removal cut short):
//!
//! - attachments still cached under `state/cni/results`: their IP lease, veth and portmap
//!   rules stay until their DEL runs, so repair runs it (with the cached network list and
//!   result, as StopPodSandbox would, the netns being gone);
//! - leases in the embedded default network's host-local data dir (scute's alone) naming such a
//!   pod with no attachment cached: repair removes the lease file, which is how host-local itself
//!   releases an address. Leases of an operator's network live in a data dir other runtimes may
//!   share, and are left to its owner.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::{Finding, Kind};
use crate::sandbox::cni::{AttachRequest, CniManager};
use crate::sandbox::record::SandboxRecord;
use crate::store::{self, Store};

/// Finds (and with `repair` releases) what pods no record knows still hold of the network,
/// written at least `settled` ago.
pub async fn examine(
    store: &Store,
    cni: &CniManager,
    repair: bool,
    settled: Duration,
) -> Result<Vec<Finding>, store::Error> {
    // Ages are measured against when the records were read: DELs take a while, and must not
    // reach a pod created meanwhile.
    let cutoff = SystemTime::now() - settled;
    let known: HashSet<String> = store.list::<SandboxRecord>()?.into_iter().map(|s| s.id).collect();
    let cached = cni.cached_attachments();
    let mut findings = Vec::new();
    for cached in &cached {
        if known.contains(&cached.container_id) || !older(&cached.path, cutoff) {
            continue;
        }
        let mut finding = Finding::new(
            Kind::StaleAttachment,
            cached.path.display().to_string(),
            0,
            format!(
                "pod {} on {}: no pod records it, its address is still held",
                cached.container_id, cached.ifname
            ),
        );
        if repair && store.get::<SandboxRecord>(&cached.container_id)?.is_none() {
            let request = AttachRequest {
                ifname: &cached.ifname,
                ..AttachRequest::new(&cached.container_id, Path::new(""))
            };
            match cni.teardown(&request).await {
                Ok(()) => finding.repaired = true,
                Err(e) => finding.detail.push_str(&format!("; CNI DEL: {e}")),
            }
        }
        findings.push(finding);
    }
    // A lease whose pod has an attachment cached is that attachment's (its DEL releases it).
    let attached: HashSet<&str> = cached.iter().map(|c| c.container_id.as_str()).collect();
    for (lease, holder) in leases(&cni.default_leases_dir()) {
        if known.contains(&holder) || attached.contains(holder.as_str()) || !older(&lease, cutoff) {
            continue;
        }
        let mut finding = Finding::new(
            Kind::StaleLease,
            lease.display().to_string(),
            0,
            format!("held by pod {holder}, which no pod records"),
        );
        if repair && store.get::<SandboxRecord>(&holder)?.is_none() {
            match std::fs::remove_file(&lease) {
                Ok(()) => finding.repaired = true,
                Err(e) => finding.detail.push_str(&format!("; not removed: {e}")),
            }
        }
        findings.push(finding);
    }
    Ok(findings)
}

fn older(path: &Path, cutoff: SystemTime) -> bool {
    path.metadata().and_then(|m| m.modified()).is_ok_and(|t| t <= cutoff)
}

/// host-local's leases under `dir`: `<network>/<ip>` files whose first line is the holder's
/// container ID (its lock and last-reserved files are not named by an address).
fn leases(dir: &Path) -> Vec<(PathBuf, String)> {
    let Ok(networks) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for network in networks.flatten() {
        let Ok(files) = std::fs::read_dir(network.path()) else {
            continue;
        };
        for file in files.flatten() {
            if file.file_name().to_string_lossy().parse::<std::net::IpAddr>().is_err() {
                continue;
            }
            let Ok(text) = std::fs::read_to_string(file.path()) else {
                continue;
            };
            if let Some(holder) = text.lines().next().map(str::trim).filter(|h| !h.is_empty()) {
                found.push((file.path(), holder.to_string()));
            }
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_the_files_named_by_an_address() {
        let dir = tempfile::tempdir().unwrap();
        let net = dir.path().join("scute");
        std::fs::create_dir_all(&net).unwrap();
        std::fs::write(net.join("10.88.0.5"), "abc\r\neth0").unwrap();
        std::fs::write(net.join("fd00::5"), "def\neth0").unwrap();
        std::fs::write(net.join("last_reserved_ip.0"), "10.88.0.5").unwrap();
        std::fs::write(net.join("lock"), "").unwrap();
        let mut found = leases(dir.path());
        found.sort();
        assert_eq!(
            found,
            [
                (net.join("10.88.0.5"), "abc".to_string()),
                (net.join("fd00::5"), "def".to_string())
            ]
        );
    }
}
