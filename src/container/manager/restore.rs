//! CRI's restore: a CreateContainer whose image is a checkpoint makes a container from the image
//! the checkpoint's container ran, with the checkpoint's writable layer, whose processes CRIU
//! restores at StartContainer (see the shim's `containers::restore`). The checkpoint is either
//! an archive file (its path as the image, as containerd and crictl take it) or a checkpoint
//! image: an OCI image whose manifest carries `checkpointctl.annotation.checkpoint.name` (or
//! CRI-O's `io.kubernetes.cri-o.annotations.checkpoint.name`) and whose one layer holds the
//! archive's files, which is how a pod spec (the kubelet) names one. The request's config (the
//! new pod, mounts, name) is used as for any container; the process is the checkpoint's.
//!
//! A checkpoint is anyone's input: its metadata is read with sizes capped, its writable layer
//! goes through the hardened layer unpacker (deleted files become whiteouts), only plain files
//! of `checkpoint/` are taken as CRIU's images, and an entry that is not a clean relative path
//! refuses the whole checkpoint.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Component, Path, PathBuf};

use super::{ContainerError, ContainerManager};
use crate::container::checkpoint::{
    ConfigDump, CHECKPOINT_DIR, CONFIG_DUMP, CONTAINER_LOG, DELETED_FILES, ROOTFS_DIFF, STATUS_DUMP,
};
use crate::image::pull::Decoder;
use crate::image::record::ImageRecord;
use crate::image::ImageError;

/// Where a checkpoint's files are: a tar either way.
#[derive(Debug, Clone)]
pub(super) enum Source {
    /// An archive file, as CheckpointContainer writes it.
    Archive(PathBuf),
    /// The one layer of a checkpoint image (its blob, compressed per its media type).
    Image {
        name: String,
        blob: PathBuf,
        media_type: String,
    },
}

impl Source {
    fn open(&self) -> Result<Box<dyn Read>, ContainerError> {
        match self {
            Source::Archive(path) => {
                let file = File::open(path).map_err(|e| self.invalid(e.to_string()))?;
                Ok(Box::new(io::BufReader::new(file)))
            }
            Source::Image { blob, media_type, .. } => {
                let decoder = Decoder::for_media_type(media_type).map_err(|e| self.invalid(e.to_string()))?;
                let file = File::open(blob).map_err(|e| self.invalid(format!("its layer: {e}")))?;
                decoder
                    .reader(io::BufReader::new(file))
                    .map_err(|e| self.invalid(format!("its layer: {e}")))
            }
        }
    }

    fn invalid(&self, why: String) -> ContainerError {
        ContainerError::InvalidArgument(format!("{self}: {why}"))
    }
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Archive(path) => write!(f, "checkpoint archive {}", path.display()),
            Source::Image { name, .. } => write!(f, "checkpoint image {name}"),
        }
    }
}

/// Biggest metadata file read from an archive (they are a few KB).
const MAX_METADATA: u64 = 4 << 20;

/// What CreateContainer needs to know of a checkpoint before making the container.
#[derive(Debug)]
pub(super) struct Checkpoint {
    pub source: Source,
    pub config: ConfigDump,
    /// status.dump's `image_ref` and `image_id`: other names of the same image.
    pub image_refs: Vec<String>,
}

/// The checkpoint archive an image name is, if it is one: an absolute path of a file.
pub(super) fn archive_of(image_name: &str) -> Option<PathBuf> {
    let path = Path::new(image_name);
    (path.is_absolute() && path.is_file()).then(|| path.to_path_buf())
}

/// Reads config.dump and status.dump of a checkpoint.
pub(super) fn read_checkpoint(source: Source) -> Result<Checkpoint, ContainerError> {
    let invalid = |why: String| source.invalid(why);
    let not_one = |e: io::Error| invalid(format!("not a container checkpoint (a tar with {CONFIG_DUMP}): {e}"));
    let mut tar = tar::Archive::new(source.open()?);
    let (mut config, mut status) = (None, None);
    for entry in tar.entries().map_err(not_one)? {
        let entry = entry.map_err(not_one)?;
        let name = entry_name(&entry);
        let wanted = match name.as_deref() {
            Some(CONFIG_DUMP) => &mut config,
            Some(STATUS_DUMP) => &mut status,
            _ => continue,
        };
        if entry.header().entry_type() != tar::EntryType::Regular || entry.size() > MAX_METADATA {
            return Err(invalid(format!(
                "{} is not a file of at most {MAX_METADATA} bytes",
                name.unwrap_or_default()
            )));
        }
        let mut bytes = Vec::new();
        entry
            .take(MAX_METADATA)
            .read_to_end(&mut bytes)
            .map_err(|e| invalid(e.to_string()))?;
        *wanted = Some(bytes);
        if config.is_some() && status.is_some() {
            break;
        }
    }
    let config = config.ok_or_else(|| invalid(format!("no {CONFIG_DUMP}: not a container checkpoint")))?;
    let config: ConfigDump = serde_json::from_slice(&config).map_err(|e| invalid(format!("{CONFIG_DUMP}: {e}")))?;
    let status: serde_json::Value = match status {
        Some(bytes) => serde_json::from_slice(&bytes).map_err(|e| invalid(format!("{STATUS_DUMP}: {e}")))?,
        None => serde_json::Value::Null,
    };
    let image_refs = ["image_ref", "image_id"]
        .iter()
        .filter_map(|k| status[*k].as_str())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .collect();
    Ok(Checkpoint {
        source,
        config,
        image_refs,
    })
}

/// An entry's path as one relative name (`./` dropped), if it is a clean relative path.
fn entry_name<R: Read>(entry: &tar::Entry<'_, R>) -> Option<String> {
    let path = entry.path().ok()?;
    let parts: Vec<&str> = path
        .components()
        .filter(|c| !matches!(c, Component::CurDir))
        .map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect::<Option<_>>()?;
    (!parts.is_empty()).then(|| parts.join("/"))
}

/// The archive's own root (`.` or `./`), which archivers add.
fn is_root<R: Read>(entry: &tar::Entry<'_, R>) -> bool {
    entry
        .path()
        .is_ok_and(|p| p.components().all(|c| matches!(c, Component::CurDir)))
}

impl ContainerManager {
    /// The image the checkpointed container ran, found by its pinned reference, its ID or its
    /// name; NotFound (pull it first) when this node has none of them.
    pub(super) fn checkpoint_image(&self, checkpoint: &Checkpoint) -> Result<ImageRecord, ContainerError> {
        let c = &checkpoint.config;
        let names: Vec<&str> = [&c.rootfs_image_ref, &c.rootfs_image, &c.rootfs_image_name]
            .into_iter()
            .chain(&checkpoint.image_refs)
            .map(String::as_str)
            .filter(|s| !s.is_empty())
            .collect();
        for name in &names {
            match self.images.resolve(name) {
                Ok(image) => return Ok(image),
                Err(ImageError::NotFound(_)) | Err(ImageError::InvalidReference(_)) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Err(ContainerError::NotFound(format!(
            "the image of {} is not on this node: pull {} first",
            checkpoint.source,
            names.first().copied().unwrap_or("it")
        )))
    }

    /// The checkpoint an image is, if it is a checkpoint image: one layer, and a manifest (or
    /// index) annotated as one.
    pub(super) fn checkpoint_in_image(&self, name: &str, image: &ImageRecord) -> Option<Source> {
        let [layer] = image.layers.as_slice() else {
            return None;
        };
        let annotated = |digest: &crate::distribution::digest::Digest| {
            let Ok(bytes) = self.images.content().read(digest) else {
                return false;
            };
            crate::image::annotated_as_checkpoint(&bytes)
        };
        let marked = annotated(&image.manifest_digest) || image.index_digest.as_ref().is_some_and(annotated);
        marked.then(|| Source::Image {
            name: name.to_string(),
            blob: self.images.content().blob_path(&layer.digest),
            media_type: layer.media_type.clone(),
        })
    }
}

/// Unpacks what a restore needs from a checkpoint: CRIU's images into `images_dir` (made here), the
/// writable layer into `upper` (empty; deleted files become whiteouts), and the container's log
/// so far into `log_path` (its lines come before the restored process's).
pub(super) fn unpack_checkpoint(
    source: &Source,
    images_dir: &Path,
    upper: &Path,
    log_path: Option<&Path>,
) -> Result<(), ContainerError> {
    let invalid = |why: String| source.invalid(why);
    let io_err = |what: &str| {
        let what = what.to_string();
        move |source: io::Error| ContainerError::Io { what, source }
    };
    fs::DirBuilder::new()
        .mode(0o700)
        .create(images_dir)
        .map_err(io_err("creating the directory for CRIU's images"))?;
    fs::create_dir_all(upper).map_err(io_err("creating the writable layer"))?;
    let mut tar = tar::Archive::new(source.open()?);
    let (mut images, mut has_diff, mut deleted) = (0, false, Vec::new());
    for entry in tar.entries().map_err(|e| invalid(format!("not a tar archive: {e}")))? {
        let mut entry = entry.map_err(|e| invalid(format!("malformed: {e}")))?;
        let Some(name) = entry_name(&entry) else {
            if is_root(&entry) {
                continue;
            }
            return Err(invalid(format!(
                "entry {:?} is not a clean relative path",
                entry.path_bytes()
            )));
        };
        let regular = entry.header().entry_type() == tar::EntryType::Regular;
        if let Some(image) = name.strip_prefix(&format!("{CHECKPOINT_DIR}/")) {
            // CRIU's images are plain files in one directory.
            if !regular || image.contains('/') {
                return Err(invalid(format!("{name}: not a plain file of {CHECKPOINT_DIR}/")));
            }
            let mut out = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(images_dir.join(image))
                .map_err(io_err("writing a CRIU image"))?;
            io::copy(&mut entry, &mut out).map_err(io_err("writing a CRIU image"))?;
            images += 1;
        } else if name == ROOTFS_DIFF && regular {
            crate::image::unpack::unpack_layer(&mut entry, upper)
                .map_err(|e| invalid(format!("its writable layer ({ROOTFS_DIFF}): {e}")))?;
            has_diff = true;
        } else if name == DELETED_FILES && regular {
            if entry.size() > MAX_METADATA {
                return Err(invalid(format!("{DELETED_FILES} is larger than {MAX_METADATA} bytes")));
            }
            let mut bytes = Vec::new();
            entry.read_to_end(&mut bytes).map_err(|e| invalid(e.to_string()))?;
            deleted = serde_json::from_slice(&bytes).map_err(|e| invalid(format!("{DELETED_FILES}: {e}")))?;
        } else if name == CONTAINER_LOG && regular {
            if let Some(log) = log_path {
                if let Some(parent) = log.parent() {
                    fs::create_dir_all(parent).map_err(io_err("creating the log directory"))?;
                }
                let mut out = OpenOptions::new()
                    .create(true)
                    .append(true)
                    .mode(0o640)
                    .open(log)
                    .map_err(io_err("restoring the container's log"))?;
                io::copy(&mut entry, &mut out).map_err(io_err("restoring the container's log"))?;
            }
        }
    }
    if images == 0 {
        return Err(invalid(format!("no CRIU images under {CHECKPOINT_DIR}/")));
    }
    if !has_diff {
        tracing::debug!(checkpoint = %source, "checkpoint without a writable layer diff");
    }
    if !deleted.is_empty() {
        // Through the same unpacker: an OCI whiteout per deleted path, made safely in `upper`.
        let whiteouts = whiteout_tar(&deleted).map_err(|e| invalid(format!("{DELETED_FILES}: {e}")))?;
        crate::image::unpack::unpack_layer(whiteouts.as_slice(), upper)
            .map_err(|e| invalid(format!("{DELETED_FILES}: {e}")))?;
    }
    Ok(())
}

/// A tar of OCI whiteouts (`DIR/.wh.NAME`) for absolute `paths`.
fn whiteout_tar(paths: &[String]) -> io::Result<Vec<u8>> {
    let mut tar = tar::Builder::new(Vec::new());
    for path in paths {
        let rel = Path::new(path.trim_start_matches('/'));
        let (Some(parent), Some(name)) = (rel.parent(), rel.file_name()) else {
            return Err(io::Error::other(format!("{path:?} names no file")));
        };
        let mut whiteout = std::ffi::OsString::from(".wh.");
        whiteout.push(name);
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(0);
        header.set_mode(0o600);
        tar.append_data(&mut header, parent.join(whiteout), io::empty())?;
    }
    tar.into_inner()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whiteouts_are_made_for_deleted_paths_and_stay_inside() {
        let tmp = tempfile::tempdir().unwrap();
        let upper = tmp.path().join("upper");
        fs::create_dir(&upper).unwrap();
        let tar = whiteout_tar(&["/etc/group".into(), "/a/b/c".into()]).unwrap();
        crate::image::unpack::unpack_layer(tar.as_slice(), &upper).unwrap();
        use std::os::unix::fs::{FileTypeExt, MetadataExt};
        for p in ["etc/group", "a/b/c"] {
            let m = fs::symlink_metadata(upper.join(p)).unwrap();
            assert!(m.file_type().is_char_device() && m.rdev() == 0, "{p} is no whiteout");
        }
        // A path climbing out, or naming no file, is refused.
        assert!(whiteout_tar(&["/../../escape".into()]).is_err());
        assert!(whiteout_tar(&["/".into()]).is_err());
    }
}
