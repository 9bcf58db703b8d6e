//! The free space a pull leaves on the image store's filesystem.
//!
//! A layer is hostile input that may decompress to far more than the disk holds (gzip expands
//! about 1000 times, zstd far more), and a registry may declare a blob of any size. A pull that
//! would leave less than `[image] min_free_disk_percent` of the filesystem's space or inodes
//! free stops with ResourceExhausted before the disk the pods share is full; containerd and
//! CRI-O write until ENOSPC, and the pods' logs and emptyDirs fail with them.

use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Bytes written between two looks at the filesystem. A look is one statvfs(2), about a
/// microsecond; the reserve may be overrun by this much per layer in flight (and a tar header
/// is 512 bytes, so by 2048 inodes).
const CHECK_EVERY: u64 = 1 << 20;

/// What a pull must leave free where the image store lives.
#[derive(Debug, Clone)]
pub struct DiskReserve {
    dir: Arc<PathBuf>,
    min_free_percent: u8,
}

impl DiskReserve {
    /// `min_free_percent` of the space and of the inodes of `dir`'s filesystem; 0: none (a full
    /// disk still fails the pull with ResourceExhausted).
    pub fn new(dir: &Path, min_free_percent: u8) -> DiskReserve {
        DiskReserve {
            dir: Arc::new(dir.to_path_buf()),
            min_free_percent,
        }
    }

    /// A meter for one stream of writes (a layer's download, its unpack).
    pub fn meter(&self) -> DiskMeter {
        DiskMeter {
            reserve: self.clone(),
            // The first charge looks: a pull onto a disk already past the reserve stops at once.
            unchecked: AtomicU64::new(CHECK_EVERY),
            tripped: Mutex::new(None),
        }
    }

    /// Err says what is left when less than the reserve is.
    fn check(&self) -> Result<(), String> {
        if self.min_free_percent == 0 {
            return Ok(());
        }
        let dir = self.dir.display();
        let stat = nix::sys::statvfs::statvfs(self.dir.as_path()).map_err(|e| format!("statvfs {dir}: {e}"))?;
        let percent = u64::from(self.min_free_percent);
        let under = |free: u64, total: u64| total > 0 && (free as u128) * 100 < (total as u128) * (percent as u128);
        // Of what unprivileged use can reach (used + available, as df's Use% counts it): blocks
        // reserved for root, or held back by the filesystem, are neither free nor usable.
        let block = stat.fragment_size();
        let used = stat.blocks().saturating_sub(stat.blocks_free());
        let (free, total) = (
            stat.blocks_available() * block,
            (used + stat.blocks_available()) * block,
        );
        let used_inodes = stat.files().saturating_sub(stat.files_free());
        let (free_inodes, inodes) = (stat.files_available(), used_inodes + stat.files_available());
        let left = if under(free, total) {
            format!("{} of {} free", mib(free), mib(total))
        } else if under(free_inodes, inodes) {
            format!("{free_inodes} of {inodes} inodes free")
        } else {
            return Ok(());
        };
        Err(format!(
            "the filesystem of {dir} has {left}, under the {percent}% a pull leaves free \
             ([image] min_free_disk_percent): free space, or remove unused images"
        ))
    }
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

/// Counts what one stream is about to write and stops it for good once the reserve is reached.
#[derive(Debug)]
pub struct DiskMeter {
    reserve: DiskReserve,
    unchecked: AtomicU64,
    tripped: Mutex<Option<String>>,
}

impl DiskMeter {
    /// `bytes` are about to be written: fails (ErrorKind::StorageFull) when the filesystem has
    /// less than the reserve free, or did at an earlier charge.
    pub fn charge(&self, bytes: u64) -> io::Result<()> {
        if let Some(reason) = self.tripped() {
            return Err(io::Error::new(io::ErrorKind::StorageFull, reason));
        }
        if self.unchecked.fetch_add(bytes, Ordering::Relaxed) + bytes < CHECK_EVERY {
            return Ok(());
        }
        self.unchecked.store(0, Ordering::Relaxed);
        self.reserve.check().map_err(|reason| {
            *self.tripped.lock().unwrap_or_else(|e| e.into_inner()) = Some(reason.clone());
            io::Error::new(io::ErrorKind::StorageFull, reason)
        })
    }

    /// Why the stream was stopped, if it was.
    pub fn tripped(&self) -> Option<String> {
        self.tripped.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A reader whose bytes are about to be written (a decompressed layer on its way to the
/// unpacker): each read is charged to the meter.
pub struct Metered<'a, R> {
    pub inner: R,
    pub meter: &'a DiskMeter,
}

impl<R: Read> Read for Metered<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.meter.charge(n as u64)?;
        Ok(n)
    }
}

/// Whether a write failed because the filesystem is full (or the quota is).
pub fn is_disk_full(err: &io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT)) || err.kind() == io::ErrorKind::StorageFull
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_reserve_stops_at_the_first_charge_and_stays_stopped() {
        let dir = tempfile::tempdir().unwrap();
        let meter = DiskReserve::new(dir.path(), 100).meter();
        let err = meter.charge(1).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::StorageFull);
        let reason = meter.tripped().expect("tripped");
        assert!(reason.contains("min_free_disk_percent"), "{reason}");
        assert!(reason.contains(&dir.path().display().to_string()), "{reason}");
        assert!(meter.charge(0).is_err(), "a stopped stream stays stopped");
    }

    #[test]
    fn no_reserve_never_stops() {
        let dir = tempfile::tempdir().unwrap();
        let meter = DiskReserve::new(dir.path(), 0).meter();
        for _ in 0..4 {
            meter.charge(CHECK_EVERY).unwrap();
        }
        assert!(meter.tripped().is_none());
    }

    #[test]
    fn the_filesystem_is_looked_at_every_check_every_bytes() {
        // procfs has no blocks or inodes, so it is never under a reserve: the test does not
        // depend on how full the machine's disk is.
        let dir = tempfile::tempdir().unwrap();
        let gone = dir.path().join("gone");
        std::os::unix::fs::symlink("/proc", &gone).unwrap();
        let meter = DiskReserve::new(&gone, 1).meter();
        meter.charge(1).unwrap(); // looked: there, with room
        std::fs::remove_file(&gone).unwrap();
        meter.charge(CHECK_EVERY - 1).unwrap(); // not looked again yet
        let err = meter.charge(1).unwrap_err(); // looked: statvfs fails, which stops it too
        assert!(err.to_string().contains("statvfs"), "{err}");
    }

    #[test]
    fn metered_reads_are_charged() {
        let dir = tempfile::tempdir().unwrap();
        let meter = DiskReserve::new(dir.path(), 100).meter();
        let mut reader = Metered {
            inner: &b"abc"[..],
            meter: &meter,
        };
        let err = io::copy(&mut reader, &mut io::sink()).unwrap_err();
        assert!(is_disk_full(&err), "{err}");
    }
}
