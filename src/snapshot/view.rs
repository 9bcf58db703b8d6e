//! Read-only views of an image's layers, for image volumes (KEP-4639): the image's filesystem
//! as its layers make it, with no writable layer, and sub-paths resolved inside it.
//!
//! A view is an overlay whose every layer is a lower one (overlayfs makes such a mount
//! read-only); an image of one layer gets an empty directory as a second lower, since overlayfs
//! wants two lowers when there is no upper. The mount is ro, nosuid and nodev.

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{open, openat2, OFlag, OpenHow, ResolveFlag};
use nix::mount::{mount, MsFlags};
use nix::sys::stat::Mode;

/// openat2 answers EAGAIN when a rename raced the lookup; retrying is safe.
const OPENAT2_ATTEMPTS: usize = 16;

/// Mounts at `<dir>/view` the read-only view of `lowers` (layer `fs` dirs, top first). In a
/// pod with its own user namespace (`userns`), each layer is first seen through an idmapped
/// view of its own (`<dir>/lowers/<n>`, read-only too), as the container's rootfs is. Answers
/// the view's path. `unmount` undoes it all.
pub fn mount_readonly(lowers: &[PathBuf], dir: &Path, userns: Option<&File>) -> io::Result<PathBuf> {
    if lowers.is_empty() {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, "the image has no layers"));
    }
    let view = dir.join("view");
    let empty = dir.join("empty");
    for d in [&view, &empty] {
        std::fs::create_dir_all(d)?;
    }
    let mut layers = Vec::with_capacity(lowers.len() + 1);
    match userns {
        Some(userns) => {
            for (i, lower) in lowers.iter().enumerate() {
                let idmapped = dir.join("lowers").join(i.to_string());
                std::fs::create_dir_all(&idmapped)?;
                super::idmap::mount_idmapped(lower, &idmapped, userns, false)?;
                // The view is the shared layer itself: nothing may write through it.
                remount_readonly(&idmapped)?;
                layers.push(idmapped);
            }
        }
        None => layers.extend(lowers.iter().cloned()),
    }
    if layers.len() == 1 {
        layers.push(empty);
    }
    // Named relative to `dir` (see `mount_overlay_from`).
    let lowerdir = super::link_lowers(dir, &layers)?;
    super::mount_overlay_from(
        dir,
        &view,
        MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        &format!("lowerdir={lowerdir}"),
    )
    .map_err(|e| io::Error::new(e.kind(), format!("mounting the image view at {}: {e}", view.display())))?;
    Ok(view)
}

/// Unmounts what `mount_readonly` made under `dir` (the view first, then the idmapped layers);
/// not mounted is fine. Must run before `dir` is removed recursively.
pub fn unmount(dir: &Path) -> io::Result<()> {
    super::unmount_view(&dir.join("view"))?;
    let lowers = dir.join("lowers");
    let entries = match std::fs::read_dir(&lowers) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        super::unmount_view(&entry?.path())?;
    }
    Ok(())
}

fn remount_readonly(target: &Path) -> io::Result<()> {
    let flags = MsFlags::MS_REMOUNT | MsFlags::MS_BIND | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
    mount(None::<&str>, target, None::<&str>, flags, None::<&str>).map_err(io::Error::from)
}

/// Why a sub-path of a view cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum SubPathError {
    #[error("must be a relative path without \"..\"")]
    NotRelative,
    #[error("does not exist in the image")]
    Missing,
    #[error("leads out of the image (through a symlink)")]
    Escapes,
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// `sub` inside `root`, every component resolved beneath it (`openat2(RESOLVE_BENEATH)`): a
/// symlink that leads out, absolute or through "..", is refused, never followed on the host.
/// Answers the path the host sees, for a bind mount.
pub fn resolve_beneath(root: &Path, sub: &str) -> Result<PathBuf, SubPathError> {
    if sub.starts_with('/') || sub.contains('\0') || sub.split('/').any(|c| c == "..") {
        return Err(SubPathError::NotRelative);
    }
    let rel = sub.trim_matches('/');
    if rel.is_empty() {
        return Ok(root.to_path_buf());
    }
    let root_fd = open(
        root,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(io::Error::from)?;
    // SAFETY: a fresh descriptor the kernel just returned, owned by nobody else.
    let root_fd = unsafe { OwnedFd::from_raw_fd(root_fd) };
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS | ResolveFlag::RESOLVE_NO_XDEV);
    let mut attempts = 0;
    let fd = loop {
        match openat2(root_fd.as_raw_fd(), rel, how) {
            Err(Errno::EAGAIN) if attempts < OPENAT2_ATTEMPTS => attempts += 1,
            Err(Errno::ENOENT | Errno::ENOTDIR) => return Err(SubPathError::Missing),
            Err(Errno::EXDEV | Errno::ELOOP) => return Err(SubPathError::Escapes),
            Err(e) => return Err(SubPathError::Io(e.into())),
            // SAFETY: as above.
            Ok(fd) => break unsafe { OwnedFd::from_raw_fd(fd) },
        }
    };
    // Both as the kernel names them (the configured root may go through a symlink).
    let found = std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd()))?;
    let real_root = std::fs::read_link(format!("/proc/self/fd/{}", root_fd.as_raw_fd()))?;
    if !found.starts_with(&real_root) {
        return Err(SubPathError::Escapes);
    }
    Ok(found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sub_paths_resolve_beneath_the_root_only() {
        let dir = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(dir.path()).unwrap().join("root");
        std::fs::create_dir_all(root.join("etc/conf")).unwrap();
        std::fs::write(root.join("etc/conf/a"), "a").unwrap();
        std::os::unix::fs::symlink("/etc", root.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../..", root.join("etc/up")).unwrap();
        std::os::unix::fs::symlink("conf", root.join("etc/inside")).unwrap();

        assert_eq!(resolve_beneath(&root, "etc/conf").unwrap(), root.join("etc/conf"));
        assert_eq!(resolve_beneath(&root, "etc/conf/a").unwrap(), root.join("etc/conf/a"));
        assert_eq!(resolve_beneath(&root, "etc/inside").unwrap(), root.join("etc/conf"));
        assert_eq!(resolve_beneath(&root, "").unwrap(), root);
        assert!(matches!(resolve_beneath(&root, "/etc"), Err(SubPathError::NotRelative)));
        assert!(matches!(
            resolve_beneath(&root, "etc/../etc"),
            Err(SubPathError::NotRelative)
        ));
        assert!(matches!(resolve_beneath(&root, "missing"), Err(SubPathError::Missing)));
        assert!(matches!(resolve_beneath(&root, "abs"), Err(SubPathError::Escapes)));
        assert!(matches!(resolve_beneath(&root, "etc/up"), Err(SubPathError::Escapes)));
        assert!(matches!(
            resolve_beneath(&root, "etc\0"),
            Err(SubPathError::NotRelative)
        ));
        // A root reached through a symlink (a data dir moved to another disk) still works.
        let linked = root.with_file_name("linked");
        std::os::unix::fs::symlink(&root, &linked).unwrap();
        assert_eq!(resolve_beneath(&linked, "etc/conf").unwrap(), root.join("etc/conf"));
    }
}
