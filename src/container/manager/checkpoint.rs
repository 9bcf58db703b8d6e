//! CheckpointContainer: CRIU dumps the running container through its pod's shim (it keeps
//! running), then the archive is made from CRIU's images, the writable layer, the spec and the
//! records (see `container::checkpoint` for its layout).

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::{failed, shim_failed, ContainerError, ContainerManager};
use crate::container::checkpoint::{self, ConfigDump, Contents, ZERO_TIME};
use crate::container::record::{ContainerRecord, ContainerState};
use crate::shim_client::pb::ErrorCode as ShimCode;
use crate::shim_client::ShimError;

/// When the request gives no time limit.
const DEFAULT_TIMEOUT: Duration = Duration::from_secs(120);

impl ContainerManager {
    /// Checkpoints a running container into the archive at `location` (absolute, a file; its
    /// directory must exist); the container keeps running. `timeout` zero: the default.
    pub async fn checkpoint(
        &self,
        id_or_prefix: &str,
        location: &str,
        timeout: Duration,
    ) -> Result<u64, ContainerError> {
        let location = check_location(location)?;
        let id = self.resolve(id_or_prefix)?;
        // Stop and remove wait for the checkpoint (they would pull the rootfs from under it).
        let _lock = self.id_locks.lock(&id).await;
        let record = self.refresh(self.get(&id)?).await?;
        if record.state != ContainerState::Running {
            return Err(ContainerError::FailedPrecondition(format!(
                "container {id} is {}, only a running container can be checkpointed",
                record.state.to_cri().as_str_name()
            )));
        }
        // Before CRIU touches the container: a host where it cannot work says so, with CRIU's words.
        let criu = crate::criu::available()
            .await
            .map_err(|why| ContainerError::FailedPrecondition(format!("checkpointing needs a working CRIU: {why}")))?;
        let dir = self.dir(&id);
        let images_dir = dir.join("checkpoint");
        // Kept after a checkpoint: CRIU's log of the last dump, for the operator.
        let work_dir = dir.join("criu");
        for d in [&images_dir, &work_dir] {
            remove_dir_if_any(d).map_err(failed("clearing CRIU's directories"))?;
        }
        let timeout = if timeout.is_zero() { DEFAULT_TIMEOUT } else { timeout };
        let started = std::time::Instant::now();
        let shim = self.shim(&record.sandbox_id).await?;
        // The log as far as it goes when CRIU freezes the container (it runs on after).
        let log_len = std::fs::metadata(&record.log_path).map_or(0, |m| m.len());
        let dumped = shim.checkpoint_container(&id, &images_dir, &work_dir, timeout).await;
        if let Err(e) = dumped {
            let _ = remove_dir_if_any(&images_dir);
            return Err(match e {
                ShimError::Remote {
                    code: ShimCode::FailedPrecondition,
                    message,
                }
                | ShimError::NotFound(message) => ContainerError::FailedPrecondition(message),
                e => shim_failed("checkpointing the container")(e),
            });
        }
        let dumped_in = started.elapsed();
        let written = self
            .write_archive(&record, &dir, &images_dir, &work_dir, &location, log_len)
            .await;
        let _ = remove_dir_if_any(&images_dir);
        let size = written?;
        tracing::info!(container = %id, archive = %location.display(), size, criu = %criu, dump = ?dumped_in, total = ?started.elapsed(), "container checkpointed");
        Ok(size)
    }

    async fn write_archive(
        &self,
        record: &ContainerRecord,
        dir: &Path,
        images_dir: &Path,
        work_dir: &Path,
        location: &Path,
        log_len: u64,
    ) -> Result<u64, ContainerError> {
        let config = ConfigDump {
            id: record.id.clone(),
            name: record.name.clone(),
            rootfs_image: record.image_ref.clone(),
            rootfs_image_ref: self.pinned_image(record),
            rootfs_image_name: record.image_name.clone(),
            runtime: "scute".into(),
            created_time: checkpoint::rfc3339(record.created_at),
            checkpointed_time: checkpoint::rfc3339(scute_sys::clock::now_nanos()),
            restored_time: ZERO_TIME.into(),
            restored: false,
        };
        let status = status_json(&record.to_cri_status());
        let spec_json =
            std::fs::read(dir.join("bundle").join("config.json")).map_err(failed("reading the container's spec"))?;
        let lowers: Vec<PathBuf> = record
            .chain_ids
            .iter()
            .rev()
            .map(|c| self.images.snapshots().fs_path(c))
            .collect();
        let upper = self.writable_layer_dir(&record.id);
        let log_path = (!record.log_path.is_empty()).then(|| PathBuf::from(&record.log_path));
        let (images_dir, work_dir, location) =
            (images_dir.to_path_buf(), work_dir.to_path_buf(), location.to_path_buf());
        tokio::task::spawn_blocking(move || {
            checkpoint::write_archive(
                &Contents {
                    config: &config,
                    spec_json: &spec_json,
                    status_json: &status,
                    upper: &upper,
                    lowers: &lowers,
                    images_dir: &images_dir,
                    work_dir: &work_dir,
                    log: log_path.as_deref().map(|p| (p, log_len)),
                },
                &location,
            )
            .map_err(|e| ContainerError::Io {
                what: format!("writing the checkpoint archive {}", location.display()),
                source: e,
            })
        })
        .await
        .map_err(|e| ContainerError::Failed(format!("writing the checkpoint archive: {e}")))?
    }

    /// The container's image pinned by digest (`name@sha256:…`) when its record knows one, so
    /// another node can pull exactly that image; else its ID.
    fn pinned_image(&self, record: &ContainerRecord) -> String {
        self.images
            .resolve(&record.image_id.to_string())
            .ok()
            .and_then(|image| image.repo_digests.first().cloned())
            .unwrap_or_else(|| record.image_id.to_string())
    }
}

/// CRI's `location`: an absolute path of a file to write, in a directory that exists.
fn check_location(location: &str) -> Result<PathBuf, ContainerError> {
    let invalid =
        |why: &str| ContainerError::InvalidArgument(format!("CheckpointContainer: location {location:?} {why}"));
    if location.is_empty() {
        return Err(ContainerError::InvalidArgument(
            "CheckpointContainer: location (the archive to write) is required".into(),
        ));
    }
    let path = PathBuf::from(location);
    if !path.is_absolute() {
        return Err(invalid("is not an absolute path"));
    }
    if path.is_dir() {
        return Err(invalid("is a directory: name the archive file to write"));
    }
    match path.parent() {
        Some(parent) if parent.is_dir() => Ok(path),
        _ => Err(invalid("is in a directory that does not exist")),
    }
}

fn remove_dir_if_any(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// status.dump: the CRI ContainerStatus with the proto's field names, as the anchors write it.
fn status_json(status: &crate::api::ContainerStatus) -> serde_json::Value {
    let metadata = status.metadata.clone().unwrap_or_default();
    serde_json::json!({
        "id": status.id,
        "metadata": {"name": metadata.name, "attempt": metadata.attempt},
        "state": status.state,
        "created_at": status.created_at,
        "started_at": status.started_at,
        "finished_at": status.finished_at,
        "exit_code": status.exit_code,
        "image": {"image": status.image.as_ref().map(|i| i.image.clone()).unwrap_or_default()},
        "image_ref": status.image_ref,
        "image_id": status.image_id,
        "reason": status.reason,
        "message": status.message,
        "labels": status.labels,
        "annotations": status.annotations,
        "log_path": status.log_path,
    })
}
