//! The end of a container's life in two steps, as containerd deletes a task at its exit and its
//! container at RemoveContainer:
//! - at its exit (`release_exited`): the shim's process state and cgroup, the rootfs mount and
//!   the image volumes' and idmapped views' mounts go, so that the exited containers the kubelet
//!   keeps for their logs and statuses hold no mounts or cgroups;
//! - at RemoveContainer (`cleanup`): whatever the exit left (a release that failed or never ran,
//!   e.g. a daemon down at the exit) and the container's directory with its writable layer.

use super::{failed, image_volumes, shim_failed, ContainerError, ContainerManager};
use crate::container::record::{ContainerRecord, ContainerState};
use crate::shim_client::ShimError;

impl ContainerManager {
    /// Takes the container's lock and releases it if it has exited (see `release_exited`).
    pub(super) async fn release_if_exited(&self, id: &str) {
        let _lock = self.id_locks.lock(id).await;
        if let Ok(record) = self.get(id) {
            self.release_exited(&record).await;
        }
    }

    /// Releases what an exited container holds and its record does not need; the writable layer
    /// (its stats), the log and the record stay. Once released the rootfs is no mount, which
    /// makes a second call a stat. A failure is logged: the container has stopped all the same
    /// and RemoveContainer tries again (and reports it). The caller holds the container's lock.
    pub(super) async fn release_exited(&self, record: &ContainerRecord) {
        if record.state != ContainerState::Exited
            || !scute_sys::mountinfo::is_mountpoint(&self.dir(&record.id).join("rootfs"))
        {
            return;
        }
        match self.release(record).await {
            Ok(()) => tracing::debug!(container = %record.id, "released at its exit"),
            Err(e) => {
                tracing::warn!(container = %record.id, error = %e, "releasing an exited container; RemoveContainer tries again")
            }
        }
    }

    /// The shim's part first (its process state and cgroup), so that an unmounted rootfs means
    /// a released container.
    async fn release(&self, record: &ContainerRecord) -> Result<(), ContainerError> {
        if let Ok(shim) = self.shim(&record.sandbox_id).await {
            match shim.delete_container(&record.id).await {
                Ok(()) | Err(ShimError::NotFound(_)) => {}
                Err(e) => return Err(shim_failed("deleting the container")(e)),
            }
        }
        let dir = self.dir(&record.id);
        crate::snapshot::unmount_view(&dir.join("rootfs")).map_err(failed("unmounting the rootfs"))?;
        image_volumes::unmount_image_volumes(&dir).map_err(failed("unmounting the image volumes"))?;
        crate::snapshot::idmap::unmount_idmapped_views(&dir).map_err(failed("unmounting the idmapped views"))
    }

    /// Everything the container has on the node but its record (RemoveContainer, a rolled back
    /// or interrupted create).
    pub(super) async fn cleanup(&self, record: &ContainerRecord) -> Result<(), ContainerError> {
        self.release(record).await?;
        match std::fs::remove_dir_all(self.dir(&record.id)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(failed("removing the container directory")(e)),
            _ => Ok(()),
        }
    }
}
