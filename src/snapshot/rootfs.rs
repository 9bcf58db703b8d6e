//! What scute settles in a container's root before the runtime (libcontainer) sets it up.
//!
//! An image whose `/dev` is a symlink (or a file) is hostile or broken: libcontainer mounts the
//! container's /dev tmpfs resolved inside the root, but then makes /dev's links (fd, stdin,
//! stdout, stderr, ptmx, kcore) through the rootfs path as the host sees it, which follows an
//! absolute link out of the root (runc CVE-2026-41579 was this class: files created or deleted on
//! the host). Whatever the image had at /dev is hidden by that tmpfs anyway, so the link is
//! replaced by an empty directory in the container's own writable layer; the image is untouched.
//! Everything here works from a descriptor of the root and never follows a link.

use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;

use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{fstatat, mkdirat, Mode, SFlag};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// Makes `<rootfs>/dev` a directory when the image has something else there. Answers what was
/// replaced (for the log), or None when /dev was a directory or absent (libcontainer makes it).
pub fn settle_dev(rootfs: &Path) -> io::Result<Option<&'static str>> {
    let root = nix::dir::Dir::open(
        rootfs,
        OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::empty(),
    )?;
    let fd = Some(root.as_raw_fd());
    let kind = match fstatat(fd, "dev", AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT,
        Err(nix::errno::Errno::ENOENT) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let what = match kind {
        SFlag::S_IFDIR => return Ok(None),
        SFlag::S_IFLNK => "a symlink",
        SFlag::S_IFREG => "a file",
        _ => "a special file",
    };
    unlinkat(fd, "dev", UnlinkatFlags::NoRemoveDir)?;
    mkdirat(fd, "dev", Mode::from_bits_truncate(0o755))?;
    Ok(Some(what))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dev_link_becomes_a_directory_and_its_target_is_untouched() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("dev")).unwrap();
        assert_eq!(settle_dev(root.path()).unwrap(), Some("a symlink"));
        let md = std::fs::symlink_metadata(root.path().join("dev")).unwrap();
        assert!(md.is_dir());
        assert!(outside.path().is_dir());

        // A directory, or no /dev at all, is left as it is.
        std::fs::write(root.path().join("dev/keep"), "").unwrap();
        assert_eq!(settle_dev(root.path()).unwrap(), None);
        assert!(root.path().join("dev/keep").exists());
        std::fs::remove_dir_all(root.path().join("dev")).unwrap();
        assert_eq!(settle_dev(root.path()).unwrap(), None);

        std::fs::write(root.path().join("dev"), "not a dir").unwrap();
        assert_eq!(settle_dev(root.path()).unwrap(), Some("a file"));
        assert!(root.path().join("dev").is_dir());
    }
}
