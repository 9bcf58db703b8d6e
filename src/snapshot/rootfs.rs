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

use std::collections::VecDeque;
use std::ffi::{OsStr, OsString};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::dir::Dir;
use nix::fcntl::{readlinkat, AtFlags, OFlag};
use nix::sys::stat::{fstatat, mkdirat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// The mount points the runtime covers with a kernel filesystem of its own.
const KERNEL_MOUNT_POINTS: [&str; 3] = ["dev", "proc", "sys"];

/// Makes `<rootfs>/dev`, `/proc` and `/sys` directories where the image has something else
/// there. Answers what was replaced ("/proc was a symlink", for the log); a directory, or
/// nothing (libcontainer makes it), is left alone.
pub fn settle_mount_points(rootfs: &Path) -> io::Result<Vec<String>> {
    let root = open_root(rootfs)?;
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

/// Where `path` lands in the container once the runtime sets its root up: the image's symlinks
/// followed inside the root (an absolute target starts again from the root, `..` stops there),
/// a component not in the image taken as spelt (the runtime makes it a directory). A link whose
/// target is not in the image is followed all the same: `/data` -> `/proc/sys` lands in procfs
/// once it is mounted, though the image's /proc is empty. Below /dev, /proc and /sys nothing of
/// the image is read: the runtime's tmpfs, procfs and sysfs hide it (an image's own `proc/self`
/// link is not what the kernel's /proc/self will be). openat2's RESOLVE_IN_ROOT stops at a
/// dangling link and pathrs resolves only what exists, hence this walk written by hand. Names
/// are bytes throughout; every lookup is relative to `root` ([`open_root`]), no-follow.
pub fn resolve_in_root(root: &Dir, path: &str) -> io::Result<PathBuf> {
    // The kernel's own limit on links in one lookup.
    const MAX_LINKS: u32 = 40;
    let fd = Some(root.as_raw_fd());
    let mut pending: VecDeque<OsString> = components(OsStr::new(path)).collect();
    let mut resolved: Vec<OsString> = Vec::new();
    let mut links = 0;
    while let Some(name) = pending.pop_front() {
        if name == ".." {
            resolved.pop();
            continue;
        }
        resolved.push(name);
        if resolved
            .first()
            .is_some_and(|top| KERNEL_MOUNT_POINTS.iter().any(|k| top.as_os_str() == OsStr::new(k)))
        {
            continue; // hidden by the runtime's mount: taken as spelt
        }
        let here: PathBuf = resolved.iter().collect();
        match fstatat(fd, here.as_path(), AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFLNK => {
                links += 1;
                if links > MAX_LINKS {
                    return Err(io::Error::from_raw_os_error(nix::libc::ELOOP));
                }
                let target = readlinkat(fd, here.as_path())?;
                resolved.pop();
                if target.as_bytes().starts_with(b"/") {
                    resolved.clear();
                }
                for (i, c) in components(&target).enumerate() {
                    pending.insert(i, c);
                }
            }
            Ok(_) | Err(nix::errno::Errno::ENOENT) | Err(nix::errno::Errno::ENOTDIR) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Path::new("/").join(resolved.iter().collect::<PathBuf>()))
}

/// A container's root, opened without following a link, for lookups relative to it.
pub fn open_root(rootfs: &Path) -> io::Result<Dir> {
    Ok(Dir::open(
        rootfs,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?)
}

fn components(path: &OsStr) -> impl Iterator<Item = OsString> + '_ {
    path.as_bytes()
        .split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .map(|c| OsStr::from_bytes(c).to_os_string())
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

    #[test]
    fn paths_resolve_through_the_images_links_inside_the_root() {
        use std::os::unix::fs::symlink;
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        std::fs::create_dir_all(r.join("proc")).unwrap();
        std::fs::create_dir_all(r.join("usr/etc")).unwrap();
        symlink("/proc/sys", r.join("data")).unwrap(); // dangling until procfs is mounted
        symlink("usr/etc", r.join("etc")).unwrap();
        symlink("../../../../proc/self", r.join("usr/up")).unwrap();
        symlink("loop", r.join("loop")).unwrap();
        // What the image keeps under its own /proc is hidden by procfs: never followed.
        std::fs::create_dir_all(r.join("tmp")).unwrap();
        symlink("/tmp", r.join("proc/self")).unwrap();
        symlink("/srv", r.join("proc/sys")).unwrap();
        // A link whose bytes are not UTF-8 is followed by its bytes.
        let odd = OsStr::from_bytes(b"x\xff");
        symlink("/proc/self", r.join(odd)).unwrap();
        symlink(Path::new("/").join(odd), r.join("odd")).unwrap();
        let root = open_root(r).unwrap();
        let resolve = |p: &str| resolve_in_root(&root, p).unwrap().to_string_lossy().into_owned();
        assert_eq!(resolve("/data"), "/proc/sys");
        assert_eq!(resolve("/data/kernel/core_pattern"), "/proc/sys/kernel/core_pattern");
        assert_eq!(resolve("/etc/hosts"), "/usr/etc/hosts");
        assert_eq!(resolve("//etc/./x/../hostname"), "/usr/etc/hostname");
        assert_eq!(resolve("/usr/up/attr"), "/proc/self/attr");
        assert_eq!(resolve("/odd/attr"), "/proc/self/attr");
        assert_eq!(resolve("/proc/self/../sys/x"), "/proc/sys/x");
        assert_eq!(resolve("/srv/new/dir"), "/srv/new/dir");
        assert_eq!(resolve("/"), "/");
        assert_eq!(
            resolve_in_root(&root, "/loop/x").unwrap_err().raw_os_error(),
            Some(nix::libc::ELOOP)
        );
    }
}
