//! Files: atomic writes and the space a tree uses.

use std::io::{self, Write};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

/// Writes `contents` to `path` atomically and durably (temp file in the same directory, fsync,
/// rename, fsync of the directory) with `mode`; the temp file is 0600 until then, so nobody
/// reads a half-written file.
pub fn write_atomic_mode(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    write_via_temp(path, contents, mode, true)
}

/// As [`write_atomic_mode`] without the fsync: for files that matter only while the processes
/// reading them live (a bundle's spec, a pod's hosts and resolv.conf). A crash of the host ends
/// those processes, so a sync would buy nothing; readers still never see a half-written file.
pub fn write_replace_mode(path: &Path, contents: &[u8], mode: u32) -> io::Result<()> {
    write_via_temp(path, contents, mode, false)
}

fn write_via_temp(path: &Path, contents: &[u8], mode: u32, sync: bool) -> io::Result<()> {
    let dir = path.parent().ok_or_else(|| io::Error::other("no parent dir"))?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(contents)?;
    if sync {
        tmp.as_file().sync_all()?;
    }
    tmp.as_file().set_permissions(std::fs::Permissions::from_mode(mode))?;
    tmp.persist(path).map_err(|e| e.error)?;
    if sync {
        // The rename is an entry of the directory: durable only once the directory is.
        sync_dir(dir)?;
    }
    Ok(())
}

/// Flushes every dirty page and inode of the filesystem holding `path` to the disk (syncfs(2)):
/// one call makes a whole unpacked tree durable, where an fsync per file would cost a disk flush
/// each.
pub fn sync_filesystem(path: &Path) -> io::Result<()> {
    use std::os::fd::AsRawFd;
    let dir = std::fs::File::open(path)?;
    nix::unistd::syncfs(dir.as_raw_fd()).map_err(io::Error::from)
}

/// Starts writing `file`'s dirty pages to the disk and returns at once (sync_file_range(2),
/// SYNC_FILE_RANGE_WRITE). It makes nothing durable by itself: it moves the writeback earlier,
/// so a later syncfs finds most of the data on the disk already (git's batched fsync does the
/// same). By hand: nix has no wrapper for sync_file_range.
pub fn start_writeback(file: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: the fd is open for the call's length; the call reads no memory of ours.
    // Best effort: an error (a filesystem without writeback) only leaves the work to the syncfs.
    let _ = unsafe { libc::sync_file_range(file.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
}

/// Makes the entries of directory `dir` (a rename into it, a removal) durable: fsync(2) of the
/// directory itself.
pub fn sync_dir(dir: &Path) -> io::Result<()> {
    std::fs::File::open(dir)?.sync_all()
}

/// Walks a tree summing allocated bytes and counting inodes once each (hard links share one).
/// Symlinks are counted, never followed. Unreadable entries are skipped.
pub fn dir_usage(root: &Path) -> (u64, u64) {
    let mut seen = std::collections::HashSet::new();
    let mut bytes = 0u64;
    let mut inodes = 0u64;
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else { continue };
            if !seen.insert((meta.dev(), meta.ino())) {
                continue;
            }
            inodes += 1;
            bytes += meta.blocks() * 512;
            if meta.is_dir() {
                stack.push(entry.path());
            }
        }
    }
    (bytes, inodes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_write_sets_the_mode_and_replaces() {
        type Writer = fn(&Path, &[u8], u32) -> io::Result<()>;
        for write in [write_atomic_mode as Writer, write_replace_mode] {
            let dir = tempfile::tempdir().unwrap();
            let p = dir.path().join("f");
            write(&p, b"one", 0o640).unwrap();
            write(&p, b"two", 0o640).unwrap();
            assert_eq!(std::fs::read(&p).unwrap(), b"two");
            assert_eq!(std::fs::metadata(&p).unwrap().mode() & 0o777, 0o640);
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temp file left");
            assert!(write(&dir.path().join("missing/f"), b"x", 0o600).is_err());
        }
    }

    #[test]
    fn dir_usage_counts_hard_links_once() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a"), vec![1u8; 10_000]).unwrap();
        std::fs::hard_link(dir.path().join("a"), dir.path().join("b")).unwrap();
        std::fs::create_dir(dir.path().join("d")).unwrap();
        std::os::unix::fs::symlink("/nonexistent", dir.path().join("d/l")).unwrap();
        let (bytes, inodes) = dir_usage(dir.path());
        assert_eq!(inodes, 3, "a (= b), d, d/l");
        assert!(bytes >= 10_000, "{bytes}");
    }
}
