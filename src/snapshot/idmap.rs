//! Idmapped views of directories, for pods with their own user namespace.
//!
//! A layer snapshot is owned by host ids; inside a pod user namespace those ids are unmapped
//! and the container's root would see every file as nobody's. An idmapped mount shows the same
//! files with ids shifted through the pod's mappings (host 0 appears as the pod's root), without
//! copying or chowning the shared layers — what containerd does for its overlay lowers.
//!
//! Written here because neither nix 0.29 nor libcontainer 0.7 offers it: libcontainer refuses
//! idmapped mounts ("not supported"), nix has no open_tree/mount_setattr/move_mount. The
//! syscalls are the kernel's new mount API (5.12+; overlayfs accepts idmapped lowers from 5.19).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// Directory, under a container's directory, holding one idmapped view per lower layer.
const LOWERS_DIR: &str = "idmapped-lowers";
/// Directory, under a container's directory, holding one idmapped view per idmapped volume.
const VOLUMES_DIR: &str = "idmapped-volumes";

/// Mounts at `target` (an existing directory or file) a copy of the mount tree at `source`
/// whose ids are mapped through the user namespace `userns`. `recursive` copies submounts too.
pub fn mount_idmapped(source: &Path, target: &Path, userns: &File, recursive: bool) -> io::Result<()> {
    let source_c = path_c(source)?;
    let target_c = path_c(target)?;
    let mut flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC;
    let mut setattr_flags = libc::AT_EMPTY_PATH as libc::c_uint;
    if recursive {
        flags |= libc::AT_RECURSIVE as libc::c_uint;
        setattr_flags |= libc::AT_RECURSIVE as libc::c_uint;
    }
    // SAFETY: open_tree reads a NUL-terminated path and returns a new fd or -1.
    let tree = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, source_c.as_ptr(), flags) };
    if tree < 0 {
        return Err(context(io::Error::last_os_error(), "open_tree", source));
    }
    // SAFETY: a fresh fd the kernel just returned, owned by nobody else.
    let tree = unsafe { OwnedFd::from_raw_fd(tree as i32) };
    let attr = libc::mount_attr {
        attr_set: libc::MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    let empty = c"";
    // SAFETY: the attr struct outlives the call and its size is passed; the path is "".
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            setattr_flags,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if rc < 0 {
        return Err(context(io::Error::last_os_error(), "idmapping (mount_setattr)", source));
    }
    // SAFETY: both paths are NUL-terminated; the detached tree is attached at target.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            target_c.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if rc < 0 {
        return Err(context(io::Error::last_os_error(), "move_mount", target));
    }
    Ok(())
}

/// The overlay rootfs of a container in a pod user namespace: each lower is an idmapped view
/// (under `container_dir`), and the upper and work dirs belong to the pod's root (`root_ids`,
/// host ids) so that what the container writes is its own.
pub fn mount_overlay_idmapped(
    lowers: &[PathBuf],
    container_dir: &Path,
    upper: &Path,
    work: &Path,
    target: &Path,
    userns: &File,
    root_ids: (u32, u32),
) -> io::Result<()> {
    let views_dir = container_dir.join(LOWERS_DIR);
    let mut views = Vec::with_capacity(lowers.len());
    for (i, lower) in lowers.iter().enumerate() {
        let view = views_dir.join(i.to_string());
        std::fs::create_dir_all(&view)?;
        mount_idmapped(lower, &view, userns, false)?;
        views.push(view);
    }
    for dir in [upper, work] {
        std::fs::create_dir_all(dir)?;
        std::os::unix::fs::chown(dir, Some(root_ids.0), Some(root_ids.1))?;
    }
    super::mount_overlay(&views, upper, work, target)
}

/// An idmapped view of a volume's host path (a CRI mount with uid/gid mappings), made under
/// `container_dir` for the container's spec to bind instead of the host path. Submounts come
/// along, as with the plain bind.
pub fn stage_idmapped_volume(source: &Path, container_dir: &Path, index: usize, userns: &File) -> io::Result<PathBuf> {
    let dir = container_dir.join(VOLUMES_DIR);
    std::fs::create_dir_all(&dir)?;
    let view = dir.join(index.to_string());
    if std::fs::metadata(source)?.is_dir() {
        std::fs::create_dir_all(&view)?;
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&view)?;
    }
    mount_idmapped(source, &view, userns, true)?;
    Ok(view)
}

/// Unmounts a container's idmapped views — layers (after its overlay is gone) and volumes —
/// and removes their mount points. Must run before the container's directory is removed
/// recursively: the views are the shared image layers and the pod's volumes. Idempotent.
pub fn unmount_idmapped_views(container_dir: &Path) -> io::Result<()> {
    for dir in [VOLUMES_DIR, LOWERS_DIR] {
        unmount_views_in(&container_dir.join(dir))?;
    }
    Ok(())
}

fn unmount_views_in(views_dir: &Path) -> io::Result<()> {
    let entries = match std::fs::read_dir(views_dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let view = entry?.path();
        super::unmount_view(&view)?;
        // Not remove_dir_all: if the view were somehow still mounted this fails instead of
        // deleting a shared layer's (or a volume's) files.
        if view.is_dir() {
            std::fs::remove_dir(&view)?;
        } else {
            std::fs::remove_file(&view)?;
        }
    }
    std::fs::remove_dir(views_dir)
}

fn path_c(path: &Path) -> io::Result<CString> {
    CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{} contains NUL", path.display())))
}

fn context(e: io::Error, what: &str, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{what} {}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// A user namespace mapping 0 → 100000 (65536 ids), held by a sleeping child.
    fn userns_holder() -> (std::process::Child, File) {
        use std::os::unix::process::CommandExt;
        let mut command = std::process::Command::new("sleep");
        command.arg("60");
        // SAFETY: unshare is async-signal-safe and touches only the child.
        unsafe {
            command.pre_exec(|| {
                if libc::unshare(libc::CLONE_NEWUSER) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().unwrap();
        for map in ["uid_map", "gid_map"] {
            std::fs::write(format!("/proc/{}/{map}", child.id()), "0 100000 65536\n").unwrap();
        }
        let ns = File::open(format!("/proc/{}/ns/user", child.id())).unwrap();
        (child, ns)
    }

    #[test]
    fn views_show_host_root_files_as_the_pods_root_and_unmount_cleanly() {
        if !nix::unistd::Uid::effective().is_root() {
            return;
        }
        let (mut holder, userns) = userns_holder();
        let dir = tempfile::tempdir().unwrap();
        let lower = dir.path().join("lower");
        std::fs::create_dir_all(&lower).unwrap();
        std::fs::write(lower.join("f"), "x").unwrap();
        let container = dir.path().join("c");
        let rootfs = container.join("rootfs");
        let result = mount_overlay_idmapped(
            std::slice::from_ref(&lower),
            &container,
            &container.join("upper"),
            &container.join("work"),
            &rootfs,
            &userns,
            (100000, 100000),
        );
        holder.kill().ok();
        holder.wait().ok();
        result.unwrap();
        // Seen from the host, a file the host's root owns in the layer is owned by the id the
        // pod's root has on the host.
        assert_eq!(std::fs::metadata(rootfs.join("f")).unwrap().uid(), 100000);
        assert_eq!(std::fs::metadata(container.join("upper")).unwrap().uid(), 100000);
        super::super::unmount_view(&rootfs).unwrap();
        unmount_idmapped_views(&container).unwrap();
        assert!(!container.join(LOWERS_DIR).exists());
        // The layer itself is untouched.
        assert_eq!(std::fs::metadata(lower.join("f")).unwrap().uid(), 0);
        assert_eq!(std::fs::read_to_string(lower.join("f")).unwrap(), "x");
    }
}
