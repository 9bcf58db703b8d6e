//! The end of a container's life in two steps, as containerd deletes a task at its exit and its
//! container at RemoveContainer:
//! - at its exit (`release_exited`): the shim's process state and cgroup, the rootfs mount and
//!   the image volumes' and idmapped views' mounts go, so that the exited containers the kubelet
//!   keeps for their logs and statuses hold no mounts or cgroups;
//! - at RemoveContainer (`cleanup`): whatever the exit left (a release that failed or never ran,
//!   e.g. a daemon down at the exit) and the container's directory with its writable layer.

use super::{failed, image_volumes, shim_failed, ContainerError, ContainerManager};
use crate::container::record::{ContainerRecord, ContainerState};
use crate::shim_client::{ShimClient, ShimError};

/// How long the processes of a container whose shim died get to exit after SIGKILL.
const KILL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

impl ContainerManager {
    /// Releases the container in a task of its own once it can take its lock: exits are
    /// noticed by callers that hold other locks or must not wait (the exit watch loop).
    pub(super) fn release_later(&self, id: &str) {
        let Some(me) = self.me.upgrade() else { return };
        let id = id.to_string();
        tokio::spawn(async move {
            let _lock = me.id_locks.lock(&id).await;
            if let Ok(record) = me.get(&id) {
                me.release_exited(&record).await;
            }
        });
    }

    /// Releases what an exited container holds and its record does not need; the writable layer
    /// (its stats), the log and the record stay. Once released the rootfs is no mount, which
    /// makes a second call a stat. When the pod's shim is gone (it died) the daemon does the
    /// shim's part; left to RemoveContainer when the shim only does not answer, or something
    /// fails, which is logged: the container has stopped all the same. The caller holds the
    /// container's lock.
    pub(super) async fn release_exited(&self, record: &ContainerRecord) {
        if record.state != ContainerState::Exited {
            return;
        }
        if !self.rootfs_mounted(record) {
            // A start that failed before the rootfs was mounted may have mounted the image
            // volumes' views (mounted first): no shim holds them.
            if let Err(e) = crate::blocking::run(|| unmount_views(&self.dir(&record.id))) {
                tracing::warn!(container = %record.id, error = %e, "unmounting a failed start's views; RemoveContainer tries again");
            }
            return;
        }
        let shim = self.shim(&record.sandbox_id).await.ok();
        if shim.is_none() && !self.sandboxes.shim_gone(&record.sandbox_id).await {
            tracing::warn!(container = %record.id, "the pod's shim does not answer: release left to RemoveContainer");
            return;
        }
        match self.release(shim.as_deref(), record).await {
            Ok(()) => tracing::debug!(container = %record.id, "released at its exit"),
            Err(e) => {
                tracing::warn!(container = %record.id, error = %e, "releasing an exited container; RemoveContainer tries again")
            }
        }
    }

    /// The shim's part first (its process state and cgroup), then the rootfs, so that an
    /// unmounted rootfs means the shim's part is done (the rootfs is mounted before the shim
    /// makes the container, too).
    pub(super) async fn release(
        &self,
        shim: Option<&ShimClient>,
        record: &ContainerRecord,
    ) -> Result<(), ContainerError> {
        match shim {
            Some(shim) => match shim.delete_container(&record.id).await {
                Ok(()) | Err(ShimError::NotFound(_)) => {}
                Err(e) => return Err(shim_failed("deleting the container")(e)),
            },
            // The shim died before its part was done: its processes and cgroup are the daemon's
            // to end, as libcontainer's delete would have (containerd kills a dead shim's tasks).
            None if self.rootfs_mounted(record) && self.sandboxes.shim_gone(&record.sandbox_id).await => {
                let killed = crate::cgroups::kill_all(&record.cgroups_path);
                if !crate::cgroups::until_empty(&record.cgroups_path, KILL_TIMEOUT).await {
                    tracing::warn!(container = %record.id, "processes left in its cgroup after SIGKILL");
                }
                crate::cgroups::remove_tree(&record.cgroups_path);
                tracing::info!(container = %record.id, killed, "released after its shim died");
            }
            None => {}
        }
        crate::blocking::run(|| unmount_views(&self.dir(&record.id)))
    }

    pub(super) fn rootfs_mounted(&self, record: &ContainerRecord) -> bool {
        scute_sys::mountinfo::is_mountpoint(&self.dir(&record.id).join("rootfs"))
    }

    /// Everything the container has on the node but its record (RemoveContainer, a rolled back
    /// or interrupted create). The shim is asked only while the rootfs is mounted: a released
    /// container's shim part is done.
    pub(super) async fn cleanup(&self, record: &ContainerRecord) -> Result<(), ContainerError> {
        let shim = match self.rootfs_mounted(record) {
            true => self.shim(&record.sandbox_id).await.ok(),
            false => None,
        };
        self.release(shim.as_deref(), record).await?;
        match crate::blocking::run(|| std::fs::remove_dir_all(self.dir(&record.id))) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(failed("removing the container directory")(e)),
            _ => Ok(()),
        }
    }
}

/// Unmounts what `mount_views` mounted for the container in `dir`: its rootfs and its volumes'
/// views; nothing mounted is fine.
pub(super) fn unmount_views(dir: &std::path::Path) -> Result<(), ContainerError> {
    crate::snapshot::unmount_view(&dir.join("rootfs")).map_err(failed("unmounting the rootfs"))?;
    image_volumes::unmount_image_volumes(dir).map_err(failed("unmounting the image volumes"))?;
    crate::snapshot::idmap::unmount_idmapped_views(dir).map_err(failed("unmounting the idmapped views"))
}
