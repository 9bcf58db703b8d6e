//! The checkpoint archive of CheckpointContainer, in the layout containerd and CRI-O write (the
//! file names of checkpointctl's `lib/metadata.go`), so the field's tools read scute's archives:
//!
//! ```text
//! config.dump       who was checkpointed: id, name, image, runtime, times (JSON)
//! spec.dump         the container's OCI spec as it ran (its config.json)
//! status.dump       its CRI ContainerStatus (JSON, the proto's field names)
//! checkpoint/       CRIU's images (pages-*.img, core-*.img, ...)
//! rootfs-diff.tar   what the container added or changed in its writable layer
//! deleted.files     what it deleted from the image (JSON list of absolute paths), if anything
//! dump.log          CRIU's log of the dump; stats-dump: its timings
//! container.log     the container's log up to the checkpoint, if it has one
//! ```
//! The archive is an uncompressed tar, mode 0600 (process memory holds secrets), written to a
//! temporary file beside `location` and renamed over it once complete and synced.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub const CONFIG_DUMP: &str = "config.dump";
pub const SPEC_DUMP: &str = "spec.dump";
pub const STATUS_DUMP: &str = "status.dump";
pub const CHECKPOINT_DIR: &str = "checkpoint";
pub const ROOTFS_DIFF: &str = "rootfs-diff.tar";
pub const DELETED_FILES: &str = "deleted.files";
pub const DUMP_LOG: &str = "dump.log";
pub const STATS_DUMP: &str = "stats-dump";
pub const CONTAINER_LOG: &str = "container.log";

/// config.dump: checkpointctl's `ContainerConfig` (a reduced copy of Podman's), field for field.
/// Times are RFC 3339 with nanoseconds, as Go writes a `time.Time`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ConfigDump {
    pub id: String,
    pub name: String,
    /// The image as the container's config named it.
    #[serde(rename = "rootfsImage", default, skip_serializing_if = "String::is_empty")]
    pub rootfs_image: String,
    /// The image pinned: `name@sha256:…` where a repo digest is known, else its ID.
    #[serde(rename = "rootfsImageRef", default, skip_serializing_if = "String::is_empty")]
    pub rootfs_image_ref: String,
    /// The image's name as ContainerStatus reports it.
    #[serde(rename = "rootfsImageName", default, skip_serializing_if = "String::is_empty")]
    pub rootfs_image_name: String,
    #[serde(rename = "runtime", default, skip_serializing_if = "String::is_empty")]
    pub runtime: String,
    #[serde(rename = "createdTime")]
    pub created_time: String,
    #[serde(rename = "checkpointedTime", default)]
    pub checkpointed_time: String,
    #[serde(rename = "restoredTime", default)]
    pub restored_time: String,
    #[serde(default)]
    pub restored: bool,
}

/// Go's zero `time.Time`, which is what the anchors write for a time that never was.
pub const ZERO_TIME: &str = "0001-01-01T00:00:00Z";

/// RFC 3339 with nanoseconds, UTC, of nanoseconds since the epoch.
pub fn rfc3339(nanos: i64) -> String {
    chrono::DateTime::<chrono::Utc>::from_timestamp_nanos(nanos).to_rfc3339_opts(chrono::SecondsFormat::Nanos, true)
}

/// What goes into an archive besides CRIU's images.
pub struct Contents<'a> {
    pub config: &'a ConfigDump,
    /// The bundle's config.json, as is.
    pub spec_json: &'a [u8],
    pub status_json: &'a serde_json::Value,
    /// The container's writable layer (its overlay's upper dir)...
    pub upper: &'a Path,
    /// ...and the image's layers under it, top first (for what an opaque directory hides).
    pub lowers: &'a [PathBuf],
    /// CRIU's images.
    pub images_dir: &'a Path,
    /// CRIU's work dir (dump.log, stats-dump); also where rootfs-diff.tar is staged.
    pub work_dir: &'a Path,
    /// The container's log, and its length when CRIU froze the container: what came after is
    /// the still-running container's, not the checkpoint's.
    pub log: Option<(&'a Path, u64)>,
}

/// Writes the archive at `location` (replacing a file there); its size in bytes.
pub fn write_archive(contents: &Contents<'_>, location: &Path) -> io::Result<u64> {
    let staged_diff = contents.work_dir.join(ROOTFS_DIFF);
    let deleted = {
        let mut out = io::BufWriter::new(File::create(&staged_diff)?);
        let deleted = write_rootfs_diff(contents.upper, contents.lowers, &mut out)?;
        out.flush()?;
        deleted
    };
    let parent = location
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(".scute-checkpoint-")
        .tempfile_in(parent)?;
    tmp.as_file().set_permissions(fs::Permissions::from_mode(0o600))?;
    let mut tar = tar::Builder::new(io::BufWriter::new(tmp.as_file()));
    tar.follow_symlinks(false);
    append_bytes(&mut tar, CONFIG_DUMP, &json(contents.config)?)?;
    append_bytes(&mut tar, SPEC_DUMP, contents.spec_json)?;
    append_bytes(&mut tar, STATUS_DUMP, &json(contents.status_json)?)?;
    tar.append_dir_all(CHECKPOINT_DIR, contents.images_dir)?;
    tar.append_path_with_name(&staged_diff, ROOTFS_DIFF)?;
    if !deleted.is_empty() {
        append_bytes(&mut tar, DELETED_FILES, &serde_json::to_vec(&deleted)?)?;
    }
    for name in [DUMP_LOG, STATS_DUMP] {
        let path = contents.work_dir.join(name);
        if path.is_file() {
            tar.append_path_with_name(&path, name)?;
        }
    }
    if let Some((log, len)) = contents.log {
        if let Ok(file) = File::open(log) {
            let len = len.min(file.metadata()?.len());
            let mut header = tar::Header::new_gnu();
            header.set_metadata(&file.metadata()?);
            header.set_size(len);
            tar.append_data(&mut header, CONTAINER_LOG, io::Read::take(file, len))?;
        }
    }
    tar.into_inner()?.flush()?;
    tmp.as_file().sync_all()?;
    let size = tmp.as_file().metadata()?.len();
    tmp.persist(location).map_err(|e| e.error)?;
    scute_sys::files::sync_dir(parent)?;
    let _ = fs::remove_file(&staged_diff);
    Ok(size)
}

fn json<T: Serialize>(value: &T) -> io::Result<Vec<u8>> {
    serde_json::to_vec_pretty(value).map_err(io::Error::other)
}

fn append_bytes<W: Write>(tar: &mut tar::Builder<W>, name: &str, bytes: &[u8]) -> io::Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o600);
    header.set_mtime(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    );
    header.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut header, name, bytes)
}

/// Writes what the container added or changed (every entry of its writable layer but overlay's
/// whiteouts) as a tar with paths relative to the root; answers what it deleted from the image
/// (whiteouts, and what an opaque directory hides in the layers below), as absolute paths.
/// Sockets are left out (a tar cannot hold one; the process that listened is restored by CRIU).
pub fn write_rootfs_diff<W: Write>(upper: &Path, lowers: &[PathBuf], out: W) -> io::Result<Vec<String>> {
    let mut tar = tar::Builder::new(out);
    tar.follow_symlinks(false);
    let mut deleted = BTreeSet::new();
    walk(upper, Path::new(""), lowers, &mut tar, &mut deleted)?;
    tar.into_inner()?.flush()?;
    Ok(deleted.into_iter().collect())
}

fn walk<W: Write>(
    upper: &Path,
    rel: &Path,
    lowers: &[PathBuf],
    tar: &mut tar::Builder<W>,
    deleted: &mut BTreeSet<String>,
) -> io::Result<()> {
    let dir = upper.join(rel);
    let mut names: Vec<_> = fs::read_dir(&dir)?
        .map(|e| e.map(|e| e.file_name()))
        .collect::<Result<_, _>>()?;
    names.sort();
    for name in &names {
        let path = rel.join(name);
        let full = upper.join(&path);
        let meta = fs::symlink_metadata(&full)?;
        let kind = meta.file_type();
        if kind.is_char_device() && meta.rdev() == 0 {
            // Overlay's whiteout: the image's file is gone.
            deleted.insert(absolute(&path));
            continue;
        }
        if kind.is_socket() {
            continue;
        }
        tar.append_path_with_name(&full, &path)?;
        if kind.is_dir() {
            if is_opaque(&full) {
                // Whatever the layers below have here is hidden: deleted, unless written again.
                for lower in lowers {
                    let Ok(entries) = fs::read_dir(lower.join(&path)) else {
                        continue;
                    };
                    for entry in entries.flatten() {
                        if fs::symlink_metadata(full.join(entry.file_name())).is_err() {
                            deleted.insert(absolute(&path.join(entry.file_name())));
                        }
                    }
                }
            }
            walk(upper, &path, lowers, tar, deleted)?;
        }
    }
    Ok(())
}

fn absolute(rel: &Path) -> String {
    format!("/{}", rel.display())
}

/// Overlay marked the directory opaque (`trusted.overlay.opaque=y`): it replaced the image's.
fn is_opaque(dir: &Path) -> bool {
    let Ok(path) = CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    let mut value = [0u8; 4];
    // No maintained crate reads one xattr without pulling in more than this call.
    let n = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            c"trusted.overlay.opaque".as_ptr(),
            value.as_mut_ptr().cast(),
            value.len(),
        )
    };
    n == 1 && value[0] == b'y'
}

#[cfg(test)]
mod tests;
