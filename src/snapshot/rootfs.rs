//! What scute settles in a container's root before the runtime (libcontainer) sets it up.
//!
//! An image whose `/dev` is a symlink (or a file) is hostile or broken: libcontainer mounts the
//! container's /dev tmpfs resolved inside the root, but then makes /dev's links (fd, stdin,
//! stdout, stderr, ptmx, kcore) through the rootfs path as the host sees it, which follows an
//! absolute link out of the root (runc CVE-2026-41579 was this class: files created or deleted on
//! the host). Whatever the image had at /dev is hidden by that tmpfs anyway, so the link is
//! replaced by an empty directory in the container's own writable layer; the image is untouched.
//! /proc and /sys likewise: procfs and sysfs hide what the image had there, and libcontainer
//! (like runc) refuses to mount them on anything but a directory, so an image linking them
//! elsewhere (to look-alike files, the runc CVE-2025-52881 class) runs with the kernel's.
//! Everything here works from a descriptor of the root and never follows a link.

use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstatat, mkdirat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// The mount points the runtime covers with a kernel filesystem of its own.
const KERNEL_MOUNT_POINTS: [&str; 3] = ["dev", "proc", "sys"];

/// Makes `<rootfs>/dev`, `/proc` and `/sys` directories where the image has something else
/// there. Answers what was replaced ("/proc was a symlink", for the log); a directory, or
/// nothing (libcontainer makes it), is left alone.
pub fn settle_mount_points(rootfs: &Path) -> io::Result<Vec<String>> {
    let root = nix::dir::Dir::open(
        rootfs,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let fd = Some(root.as_raw_fd());
    let mut replaced = Vec::new();
    for name in KERNEL_MOUNT_POINTS {
        let kind = match fstatat(fd, name, AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT,
            Err(nix::errno::Errno::ENOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        let what = match kind {
            SFlag::S_IFDIR => continue,
            SFlag::S_IFLNK => "a symlink",
            SFlag::S_IFREG => "a file",
            _ => "a special file",
        };
        unlinkat(fd, name, UnlinkatFlags::NoRemoveDir)?;
        mkdirat(fd, name, Mode::from_bits_truncate(0o755))?;
        replaced.push(format!("/{name} was {what}"));
    }
    Ok(replaced)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn links_and_files_become_directories_and_their_targets_are_untouched() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("keys"), "look-alike").unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("dev")).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("proc")).unwrap();
        std::fs::write(root.path().join("sys"), "not a dir").unwrap();
        assert_eq!(
            settle_mount_points(root.path()).unwrap(),
            ["/dev was a symlink", "/proc was a symlink", "/sys was a file"]
        );
        for name in KERNEL_MOUNT_POINTS {
            let md = std::fs::symlink_metadata(root.path().join(name)).unwrap();
            assert!(md.is_dir(), "{name}");
        }
        assert_eq!(
            std::fs::read_to_string(outside.path().join("keys")).unwrap(),
            "look-alike"
        );

        // Directories, or nothing at all, are left as they are.
        std::fs::write(root.path().join("dev/keep"), "").unwrap();
        std::fs::remove_dir(root.path().join("sys")).unwrap();
        assert!(settle_mount_points(root.path()).unwrap().is_empty());
        assert!(root.path().join("dev/keep").exists());
        assert!(!root.path().join("sys").exists());
    }
}
