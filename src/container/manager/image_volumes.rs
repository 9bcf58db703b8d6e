//! Image volumes (KEP-4639): a CRI mount whose `image` names a pulled image gets that image's
//! filesystem, read-only (`snapshot::view`), whole or at `image_sub_path`. The view is made
//! under the container's directory when the container is created (to check the sub-path) and
//! when it starts, and unmounted after each; the record holds the image's layers from its create
//! to its removal, so garbage collection keeps them meanwhile.

use std::fs::File;
use std::path::Path;

use super::{failed, ContainerError, ContainerManager};
use crate::api;
use crate::container::record::ImageVolume;
use crate::image::ImageError;
use crate::snapshot::view::{self, SubPathError};

/// Directory, under a container's directory, holding one view per image volume.
const VOLUMES_DIR: &str = "image-volumes";

/// Whether the kubelet asks for an image at this mount.
pub(super) fn is_image_volume(m: &api::Mount) -> bool {
    m.image.as_ref().is_some_and(|i| !i.image.is_empty())
}

impl ContainerManager {
    /// The images `config`'s image volumes name, resolved, their sub-paths checked as paths,
    /// before anything is mounted: the caller records them as held (garbage collection keeps
    /// their layers) and only then mounts them (`stage_image_volumes`).
    pub(super) fn resolve_image_volumes(
        &self,
        config: &api::ContainerConfig,
    ) -> Result<Vec<ImageVolume>, ContainerError> {
        let mut volumes = Vec::new();
        for (i, mount) in config.mounts.iter().enumerate() {
            if !is_image_volume(mount) {
                continue;
            }
            let name = mount.image.as_ref().map(|s| s.image.clone()).unwrap_or_default();
            let at = &mount.container_path;
            let image = match self.images.resolve(&name) {
                Ok(image) => image,
                Err(ImageError::NotFound(_)) => {
                    return Err(ContainerError::NotFound(format!(
                        "image volume at {at}: image {name:?} not found: pull it first"
                    )))
                }
                Err(e) => return Err(e.into()),
            };
            let sub = &mount.image_sub_path;
            if sub.starts_with('/') || sub.contains('\0') || sub.split('/').any(|c| c == "..") {
                return Err(sub_path_error(at, sub, &name, SubPathError::NotRelative));
            }
            if image.layers.is_empty() {
                return Err(ContainerError::InvalidArgument(format!(
                    "image volume at {at}: image {name:?} has no layers to mount"
                )));
            }
            let volume = ImageVolume {
                mount: i,
                image_id: image.id.clone(),
                chain_ids: image.layers.iter().map(|l| l.chain_id.clone()).collect(),
            };
            volumes.push(volume);
        }
        Ok(volumes)
    }

    /// Mounts the view of every resolved image volume under `dir` (idmapped through the pod's
    /// user namespace `userns` when it has one) and answers the config with those mounts bound
    /// from their views (or sub-paths), read-only. None when there are none. What was mounted
    /// before a failure stays for the caller's rollback (`unmount_image_volumes`).
    pub(super) fn stage_image_volumes(
        &self,
        config: &api::ContainerConfig,
        volumes: &[ImageVolume],
        dir: &Path,
        userns: Option<&File>,
    ) -> Result<Option<api::ContainerConfig>, ContainerError> {
        if volumes.is_empty() {
            return Ok(None);
        }
        let mut staged = config.clone();
        for volume in volumes {
            let Some(mount) = staged.mounts.get_mut(volume.mount) else {
                continue;
            };
            let name = mount.image.as_ref().map(|s| s.image.clone()).unwrap_or_default();
            let at = mount.container_path.clone();
            let lowers: Vec<_> = volume
                .chain_ids
                .iter()
                .rev()
                .map(|chain_id| self.images.snapshots().fs_path(chain_id))
                .collect();
            let volume_dir = dir.join(VOLUMES_DIR).join(volume.mount.to_string());
            let root = view::mount_readonly(&lowers, &volume_dir, userns)
                .map_err(failed(&format!("mounting image {name:?} at {at}")))?;
            let source = view::resolve_beneath(&root, &mount.image_sub_path)
                .map_err(|e| sub_path_error(&at, &mount.image_sub_path, &name, e))?;
            mount.host_path = source.display().to_string();
            mount.readonly = true;
            // The view is made through the pod's user namespace already.
            mount.uid_mappings.clear();
            mount.gid_mappings.clear();
        }
        Ok(Some(staged))
    }
}

fn sub_path_error(at: &str, sub: &str, image: &str, e: SubPathError) -> ContainerError {
    match e {
        SubPathError::Io(source) => ContainerError::Io {
            what: format!("image volume at {at}: resolving image_sub_path {sub:?}"),
            source,
        },
        e => ContainerError::InvalidArgument(format!(
            "image volume at {at}: image_sub_path {sub:?} of image {image:?} {e}"
        )),
    }
}

/// Unmounts the views of a container's image volumes; nothing mounted is fine. Must run before
/// the container's directory is removed recursively.
pub(super) fn unmount_image_volumes(dir: &Path) -> std::io::Result<()> {
    let entries = match std::fs::read_dir(dir.join(VOLUMES_DIR)) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        view::unmount(&entry?.path())?;
    }
    Ok(())
}
