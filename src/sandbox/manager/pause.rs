//! The pod's pause container: the pod's shared files, a read-only view of the sandbox image, a
//! spec and a shim to run it; its stop and deletion.

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{failed, shim_failed, SandboxError, SandboxManager, PAUSE_ID};
use crate::api;
use crate::oci::userns;
use crate::sandbox::files;
use crate::sandbox::record::SandboxRecord;
use crate::sandbox::spec::{pause_spec, SandboxSpec};
use crate::shim_client::{ContainerStatus as ShimStatus, ShimClient, ShimError, SpawnOptions};

/// containerd's oom_score_adj for pause: the last thing the OOM killer should pick.
const PAUSE_OOM_SCORE_ADJ: i32 = -998;
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

impl SandboxManager {
    /// The pod's files (hostname, resolv.conf, /dev/shm) and its pause container: a read-only
    /// view of the image, a spec, a shim to run it. Answers pause's pid and the pod's hostname.
    pub(super) async fn start_pause(
        &self,
        config: &api::PodSandboxConfig,
        record: &SandboxRecord,
        image: &crate::image::record::ImageRecord,
        userns: Option<userns::PodUserNs>,
    ) -> Result<(u32, String), SandboxError> {
        let id = record.id.clone();
        let dir = self.sandbox_dir(&id);
        let linux = config.linux.clone().unwrap_or_default();
        let security = linux.security_context.clone().unwrap_or_default();
        let ns = security.namespace_options.clone().unwrap_or_default();
        // Files shared by the pod's containers.
        // Without a hostname (or on the host network) the pod gets the node's, as with containerd
        // (the pod name may be longer than a hostname can be).
        let hostname = if record.netns.is_some() && !config.hostname.is_empty() {
            config.hostname.clone()
        } else {
            nix::sys::utsname::uname()
                .map(|u| u.nodename().to_string_lossy().into_owned())
                .unwrap_or_default()
        };
        // The files, the mounts and the bundle block (a mount waits for the mount table's lock).
        let bundle = crate::blocking::run(|| -> Result<PathBuf, SandboxError> {
            files::write_atomic(&dir.join("hostname"), &format!("{hostname}\n")).map_err(failed("writing hostname"))?;
            let host_resolv = std::fs::read_to_string("/etc/resolv.conf").unwrap_or_default();
            files::write_atomic(
                &dir.join("resolv.conf"),
                &files::resolv_conf(config.dns_config.as_ref(), &host_resolv),
            )
            .map_err(failed("writing resolv.conf"))?;
            let host_ipc = ns.ipc() == api::NamespaceMode::Node;
            let shm = if host_ipc {
                PathBuf::from("/dev/shm")
            } else {
                let shm = dir.join("shm");
                files::mount_shm(&shm, files::DEFAULT_SHM_SIZE).map_err(failed("mounting /dev/shm"))?;
                shm
            };

            // The pause container: a read-only view of the image, a spec, a shim to run it.
            let rootfs = dir.join("rootfs");
            let lowers: Vec<PathBuf> = image
                .layers
                .iter()
                .rev()
                .map(|l| self.images.snapshots().fs_path(&l.chain_id))
                .collect();
            if userns.is_some() {
                walkable_root(&self.config.root)?;
                let dir = crate::cgroups::dir(&record.cgroups_path);
                let parent = dir.rsplit_once('/').map(|(p, _)| p).unwrap_or_default();
                walkable_cgroup_path(parent).map_err(failed("opening the pod's cgroup path to its user namespace"))?;
            }
            if let Some(pod) = &userns {
                // pause's root (the pod's) makes its mount points at / of the read-only image view.
                let upper = dir.join("upper");
                std::fs::create_dir_all(&upper).map_err(failed("creating the sandbox's upper dir"))?;
                std::os::unix::fs::chown(&upper, Some(pod.uids.host_id), Some(pod.gids.host_id))
                    .map_err(failed("handing the sandbox's upper dir to the pod's root"))?;
            }
            crate::snapshot::mount_overlay(&lowers, &dir.join("upper"), &dir.join("work"), &rootfs)
                .map_err(failed("mounting the sandbox image"))?;
            // `image.sandbox_image` may name any image.
            let replaced = crate::snapshot::rootfs::settle_mount_points(&rootfs)
                .map_err(failed("settling the sandbox image's /dev, /proc and /sys"))?;
            for what in replaced {
                tracing::warn!(sandbox = %id, "in the sandbox image, {what}: replaced by a directory in the pod's layer");
            }
            let sysctls: BTreeMap<String, String> = linux.sysctls.clone().into_iter().collect();
            let spec = pause_spec(&SandboxSpec {
                hostname: &hostname,
                rootfs: rootfs.clone(),
                netns: record.netns.clone(),
                userns,
                host_pid: ns.pid() == api::NamespaceMode::Node,
                host_ipc,
                shm,
                cgroups_path: record.cgroups_path.clone(),
                sysctls: &sysctls,
                image: &image.config,
                run_as_user: security.run_as_user.map(|v| v.value),
                run_as_group: security.run_as_group.map(|v| v.value),
                oom_score_adj: clamp_oom_score_adj(PAUSE_OOM_SCORE_ADJ),
                annotations: BTreeMap::from([
                    ("io.kubernetes.cri.container-type".to_string(), "sandbox".to_string()),
                    ("io.kubernetes.cri.sandbox-id".to_string(), id.clone()),
                ]),
            })?;
            files::write_bundle(&dir, &spec).map_err(failed("writing the bundle"))
        })?;

        let shim = ShimClient::spawn(&SpawnOptions {
            sandbox_id: id.clone(),
            state_dir: self.shim_dir(&id),
            shim_binary: self.shim_binary.clone(),
            log_level: "info".into(),
            cgroup_driver: self.config.runtime.cgroup_driver,
            cgroup: crate::cgroups::shim_path(&record.cgroups_path, &id),
        })
        .await
        .map_err(shim_failed("starting the shim"))?;
        let shim = Arc::new(shim);
        self.shims.lock().await.insert(id.clone(), shim.clone());
        let pid = shim
            .create_container(PAUSE_ID, &bundle)
            .await
            .map_err(shim_failed("starting the pause container"))?;
        Ok((pid, hostname))
    }

    /// Kills pause (unless the shim reaped it already) and, with `end_shim`, deletes it and
    /// stops the shim (which deletes whatever else it holds).
    pub(super) async fn stop_pause(&self, record: &SandboxRecord, end_shim: bool) -> Result<(), SandboxError> {
        let id = &record.id;
        let Some(shim) = self.shim(id).await else {
            if self.shim_gone(id).await {
                // Its shim died (or ended with the pod's stop): whatever of pause is left goes,
                // as the shim's kill would.
                crate::cgroups::kill_all(&record.cgroups_path);
                crate::cgroups::until_empty(&record.cgroups_path, STOP_TIMEOUT).await;
            }
            return Ok(());
        };
        // A pause the shim reaped already (RemovePodSandbox after its stop) is not killed again:
        // the shim's kill of every process of the container took 4 ms of the removal here.
        let stopped = matches!(shim.state(PAUSE_ID).await, Ok(s) if s.status == ShimStatus::Stopped);
        if !stopped {
            match shim.kill(PAUSE_ID, libc::SIGKILL, true).await {
                Ok(()) | Err(ShimError::NotFound(_)) => {}
                Err(e) => return Err(shim_failed("stopping the pause container")(e)),
            }
            self.wait_stopped(&shim).await;
        }
        if end_shim {
            let _ = shim.delete_container(PAUSE_ID).await;
            let _ = shim.shutdown().await;
            self.shims.lock().await.remove(id);
        }
        Ok(())
    }

    async fn wait_stopped(&self, shim: &ShimClient) {
        let tick = Duration::from_millis(10);
        self.exit_notices
            .until_not_running(shim, PAUSE_ID, STOP_TIMEOUT, tick)
            .await;
    }

    pub(super) async fn pause_running(&self, id: &str) -> bool {
        match self.shim(id).await {
            Some(shim) => matches!(shim.state(PAUSE_ID).await, Ok(s) if s.status == ShimStatus::Running),
            None => false,
        }
    }
}

/// A container in a pod user namespace binds its own cgroup dirs into its /sys/fs/cgroup from
/// inside that namespace, where it is not the host's root: every existing directory on the way
/// must be searchable by others (runc makes them 0755; an older shim or a umask may have made
/// them 0700). Covers each mounted hierarchy (v1 controllers and the unified one).
fn walkable_cgroup_path(parent: &str) -> io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let Ok(hierarchies) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Ok(());
    };
    for hierarchy in hierarchies.flatten() {
        let mut dir = hierarchy.path();
        for component in parent.split('/').filter(|c| !c.is_empty()) {
            dir.push(component);
            let Ok(meta) = std::fs::symlink_metadata(&dir) else {
                break;
            };
            if !meta.is_dir() {
                break;
            }
            let mode = meta.permissions().mode() & 0o7777;
            if mode & 0o055 != 0o055 {
                std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode | 0o055))?;
            }
        }
    }
    Ok(())
}

/// A pod user namespace's root binds its containers' rootfs from under scute's root: every
/// directory above it must be searchable by others (a 0700 parent fails later with a bare
/// EACCES from the mount). Says which directory blocks, instead.
fn walkable_root(root: &Path) -> Result<(), SandboxError> {
    use std::os::unix::fs::PermissionsExt;
    for dir in root.ancestors().skip(1) {
        let Ok(meta) = std::fs::metadata(dir) else { continue };
        if meta.permissions().mode() & 0o001 == 0 {
            return Err(SandboxError::FailedPrecondition(format!(
                "pods with their own user namespace need scute's root {} reachable by others: \
                 {} is mode {:o} (chmod o+x it)",
                root.display(),
                dir.display(),
                meta.permissions().mode() & 0o7777
            )));
        }
    }
    Ok(())
}

/// Negative scores need CAP_SYS_RESOURCE, which scute may lack: never ask for less than the
/// daemon's own score (containerd's restrict_oom_score_adj).
pub fn clamp_oom_score_adj(wanted: i32) -> i32 {
    let current = std::fs::read_to_string("/proc/self/oom_score_adj")
        .ok()
        .and_then(|s| s.trim().parse::<i32>().ok())
        .unwrap_or(0);
    wanted.max(current).min(1000)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oom_score_is_never_below_ours() {
        let current: i32 = std::fs::read_to_string("/proc/self/oom_score_adj")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        assert_eq!(clamp_oom_score_adj(-1000), current.max(-1000));
        assert_eq!(clamp_oom_score_adj(2000), 1000);
    }
}
