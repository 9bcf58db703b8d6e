//! Overlay snapshotter. Each image layer is unpacked once into its own directory, keyed by the
//! chain ID of the layer stack it tops (`<root>/snapshots/<chain hex>/fs`), so images with a common
//! base share those directories. A container's rootfs (the containers issue) is an overlay of
//! these `fs` dirs as lower layers plus an active rw snapshot.
//!
//! Layers are extracted independently (as Docker's overlay2 does), whiteouts already in overlay
//! format, which lets every layer of a pull download and unpack in parallel. An unpack works in
//! `snapshots/tmp/<random>` and is renamed into place when verified; leftovers of a crash are
//! removed at start.

pub mod idmap;
pub mod rootfs;
pub mod view;

use std::fs;
use std::io;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use serde::{Deserialize, Serialize};

use crate::distribution::digest::Digest;
use crate::store::{Kind, Record};

/// A committed layer snapshot, as kept in the store.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SnapshotRecord {
    pub chain_id: Digest,
    pub parent: Option<Digest>,
    pub diff_id: Digest,
    /// Bytes of regular files unpacked.
    pub size: u64,
    /// What the tree held when it was committed (absent in records of a scute before 0.1.0+tally:
    /// those snapshots are not checked against one).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tally: Option<Tally>,
}

/// A snapshot tree's regular files (each inode once) and the sum of their sizes. A power cut that
/// loses unpacked data leaves files emptied or short while their names, modes and times survive
/// (containerd#8895, moby#49784): a walk of the tree against the tally taken at commit finds
/// that without reading a byte of data.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tally {
    pub files: u64,
    pub bytes: u64,
}

impl Tally {
    /// Walks `root` (symlinks are not followed). An entry that cannot be read is an error: the
    /// tree is not what was committed.
    pub fn of(root: &Path) -> io::Result<Tally> {
        use std::os::unix::fs::MetadataExt;
        let mut seen = std::collections::HashSet::new();
        let mut tally = Tally::default();
        let mut stack = vec![root.to_path_buf()];
        while let Some(dir) = stack.pop() {
            for entry in fs::read_dir(&dir)? {
                let entry = entry?;
                let meta = entry.metadata()?;
                if meta.is_dir() {
                    stack.push(entry.path());
                } else if meta.is_file() && (meta.nlink() == 1 || seen.insert(meta.ino())) {
                    tally.files += 1;
                    tally.bytes += meta.len();
                }
            }
        }
        Ok(tally)
    }
}

impl std::fmt::Display for Tally {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} files, {} bytes", self.files, self.bytes)
    }
}

impl Record for SnapshotRecord {
    const KIND: Kind = Kind::Snapshot;
    fn id(&self) -> &str {
        self.chain_id.as_str()
    }
}

pub struct Snapshotter {
    root: PathBuf,
    /// Counts the snapshots put in place and removed, for [`Snapshotter::changes`].
    changes: AtomicU64,
}

/// A snapshot being unpacked; removed on drop unless committed.
pub struct PendingSnapshot {
    dir: PathBuf,
    committed: bool,
}

impl PendingSnapshot {
    /// Where the layer's files go.
    pub fn fs(&self) -> PathBuf {
        self.dir.join("fs")
    }
}

impl Drop for PendingSnapshot {
    fn drop(&mut self) {
        if !self.committed {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

impl Snapshotter {
    pub fn open(root: &Path) -> io::Result<Snapshotter> {
        let s = Snapshotter {
            root: root.to_path_buf(),
            changes: AtomicU64::new(0),
        };
        // Layers hold setuid binaries and device nodes with any mode: only root may reach them
        // (made so, never open for a moment; an older scute's dir is tightened).
        fs::DirBuilder::new().recursive(true).mode(0o700).create(&s.root)?;
        fs::set_permissions(&s.root, fs::Permissions::from_mode(0o700))?;
        // Half-done unpacks from before a crash.
        let _ = fs::remove_dir_all(s.tmp_dir());
        fs::create_dir_all(s.tmp_dir())?;
        Ok(s)
    }

    fn tmp_dir(&self) -> PathBuf {
        self.root.join("tmp")
    }

    fn dir(&self, chain_id: &Digest) -> PathBuf {
        self.root.join(chain_id.hex())
    }

    /// The lower dir of a committed snapshot.
    pub fn fs_path(&self, chain_id: &Digest) -> PathBuf {
        self.dir(chain_id).join("fs")
    }

    pub fn exists(&self, chain_id: &Digest) -> bool {
        self.fs_path(chain_id).is_dir()
    }

    pub fn prepare(&self) -> io::Result<PendingSnapshot> {
        let dir = tempfile::Builder::new()
            .prefix("unpack-")
            .tempdir_in(self.tmp_dir())?
            .keep();
        fs::create_dir(dir.join("fs"))?;
        Ok(PendingSnapshot { dir, committed: false })
    }

    /// Moves a finished unpack into place, durably, and returns the tally of what is in place:
    /// its files are on the disk before the snapshot is in place, and the rename is before the
    /// caller records it. If another pull committed the same chain meanwhile, theirs is kept and
    /// this one dropped.
    pub fn commit(&self, pending: PendingSnapshot, chain_id: &Digest) -> io::Result<Tally> {
        let mut tallies = self.commit_all(vec![(pending, chain_id.clone())])?;
        Ok(tallies.pop().expect("one tally per snapshot"))
    }

    /// [`Snapshotter::commit`] for several unpacks at once (a pull's layers), with one syncfs
    /// for all of them, not an fsync per file: a power cut right after a pull must not leave a
    /// recorded snapshot whose files the disk never got (containerd's differ syncs nothing by
    /// default, and nodes were left with empty files in good snapshots: containerd#8895,
    /// #10284). One sync per pull, after its layer blobs are dropped, also keeps a discarded
    /// blob's bytes off the disk (a sync per layer would write the other layers' downloads).
    pub fn commit_all(&self, pendings: Vec<(PendingSnapshot, Digest)>) -> io::Result<Vec<Tally>> {
        let mut tallies = Vec::with_capacity(pendings.len());
        let mut to_place = Vec::new();
        for (pending, chain_id) in pendings {
            let target = self.dir(&chain_id);
            if target.exists() {
                // Another pull's; ours is dropped with `pending`.
                tallies.push(Tally::of(&target.join("fs"))?);
            } else {
                tallies.push(Tally::of(&pending.fs())?);
                to_place.push((pending, target));
            }
        }
        if to_place.is_empty() {
            return Ok(tallies);
        }
        scute_sys::files::sync_filesystem(&self.root)?;
        for (mut pending, target) in to_place {
            fs::rename(&pending.dir, &target)?;
            self.changes.fetch_add(1, Ordering::AcqRel);
            pending.committed = true;
        }
        scute_sys::files::sync_dir(&self.root)?;
        Ok(tallies)
    }

    /// How many times a snapshot was put in place or removed so far: the snapshots held changed
    /// when this did (unpacks in progress aside).
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    /// The tally of a committed snapshot's tree as it is now.
    pub fn tally(&self, chain_id: &Digest) -> io::Result<Tally> {
        Tally::of(&self.fs_path(chain_id))
    }

    pub fn remove(&self, chain_id: &Digest) -> io::Result<()> {
        self.changes.fetch_add(1, Ordering::AcqRel);
        match fs::remove_dir_all(self.dir(chain_id)) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
            _ => Ok(()),
        }
    }

    /// Chain IDs of the snapshot directories on disk.
    pub fn list_dirs(&self) -> io::Result<Vec<Digest>> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.root)? {
            let name = entry?.file_name();
            if let Ok(d) = Digest::parse(&format!("sha256:{}", name.to_string_lossy())) {
                out.push(d);
            }
        }
        Ok(out)
    }
}

/// Mounts an overlay of layer snapshots (top first) with a writable upper layer at `target`.
/// libcontainer creates the mount points (/proc, /dev, /sys) a minimal image lacks in the rootfs
/// before it makes the root read-only, so even a read-only container needs an upper dir.
pub fn mount_overlay(lowers: &[PathBuf], upper: &Path, work: &Path, target: &Path) -> io::Result<()> {
    use nix::mount::MsFlags;
    if lowers.is_empty() {
        return Err(io::Error::other("an image with no layers has no root filesystem"));
    }
    for dir in [upper, work, target] {
        fs::create_dir_all(dir)?;
    }
    // The upper dir is the container's `/` (overlayfs takes the root's mode from it): 0755 as
    // with containerd, whatever the daemon's umask. The container's own dir keeps host users out.
    fs::set_permissions(upper, fs::Permissions::from_mode(0o755))
        .map_err(|e| io::Error::new(e.kind(), format!("setting mode 755 on {}: {e}", upper.display())))?;
    let (Some(base), Some(upper_name), Some(work_name)) = (upper.parent(), upper.file_name(), work.file_name()) else {
        return Err(io::Error::other(
            "the upper and work dirs must be named inside a directory",
        ));
    };
    if work.parent() != Some(base) {
        return Err(io::Error::other("the upper and work dirs must be side by side"));
    }
    let lowerdir = link_lowers(base, lowers)?;
    let options = format!(
        "lowerdir={lowerdir},upperdir={},workdir={}",
        upper_name.to_string_lossy(),
        work_name.to_string_lossy()
    );
    mount_overlay_from(base, target, MsFlags::empty(), &options)
}

/// Links `<base>/l<N>` to the N-th of `lowers` and answers the overlay's `lowerdir` naming
/// them (`l0:l1:…`), for `mount_overlay_from`. Made anew before each mount, which resolves
/// them; they stay beside the mount point, saying which layers it stacks.
pub(crate) fn link_lowers(base: &Path, lowers: &[PathBuf]) -> io::Result<String> {
    let mut names = Vec::with_capacity(lowers.len());
    for (i, lower) in lowers.iter().enumerate() {
        let name = format!("l{i}");
        let link = base.join(&name);
        match fs::remove_file(&link) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        std::os::unix::fs::symlink(lower, &link).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("linking {} to {}: {e}", link.display(), lower.display()),
            )
        })?;
        names.push(name);
    }
    Ok(names.join(":"))
}

/// Mounts an overlay at `target` whose `options` name its layers relative to `base`, as
/// containerd and Docker do: mount(2) takes one page of options, which absolute paths of some
/// 40 layers overflow, and the mount table shows the options as given, which every reader of
/// it prints and parses again (libcontainer's cgroup lookups read the whole table several times
/// per container made; with 110 pods that printing was a tenth of a node's CPU). The working
/// directory is the process's, so the mount runs on a thread with its own (`unshare(CLONE_FS)`).
pub(crate) fn mount_overlay_from(
    base: &Path,
    target: &Path,
    flags: nix::mount::MsFlags,
    options: &str,
) -> io::Result<()> {
    let mounted = std::thread::scope(|scope| {
        scope
            .spawn(|| -> nix::Result<()> {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_FS)?;
                nix::unistd::chdir(base)?;
                nix::mount::mount(Some("overlay"), target, Some("overlay"), flags, Some(options))
            })
            .join()
    });
    match mounted {
        Ok(result) => result.map_err(io::Error::from),
        Err(_) => Err(io::Error::other("the thread mounting the overlay panicked")),
    }
}

/// Unmounts a view; not mounted (or missing) is fine.
pub fn unmount_view(target: &Path) -> io::Result<()> {
    use nix::mount::{umount2, MntFlags};
    if scute_sys::mountinfo::is_mountpoint(target) {
        umount2(target, MntFlags::MNT_DETACH)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pending_snapshots_vanish_unless_committed() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = Snapshotter::open(dir.path()).unwrap();
        let chain = Digest::of(b"layer");
        let p = snaps.prepare().unwrap();
        fs::write(p.fs().join("f"), "x").unwrap();
        let tmp = p.dir.clone();
        drop(p);
        assert!(!tmp.exists());
        let p = snaps.prepare().unwrap();
        fs::write(p.fs().join("f"), "x").unwrap();
        snaps.commit(p, &chain).unwrap();
        assert!(snaps.exists(&chain));
        assert_eq!(fs::read_to_string(snaps.fs_path(&chain).join("f")).unwrap(), "x");
        assert_eq!(snaps.list_dirs().unwrap(), vec![chain.clone()]);
        // A second commit of the same chain keeps the first.
        let p = snaps.prepare().unwrap();
        snaps.commit(p, &chain).unwrap();
        assert_eq!(fs::read_dir(snaps.tmp_dir()).unwrap().count(), 0);
        snaps.remove(&chain).unwrap();
        snaps.remove(&chain).unwrap();
        assert!(!snaps.exists(&chain));
    }

    #[test]
    fn leftovers_of_a_crash_are_removed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = Snapshotter::open(dir.path()).unwrap();
        let p = snaps.prepare().unwrap();
        std::mem::forget(p);
        assert_eq!(fs::read_dir(snaps.tmp_dir()).unwrap().count(), 1);
        let snaps = Snapshotter::open(dir.path()).unwrap();
        assert_eq!(fs::read_dir(snaps.tmp_dir()).unwrap().count(), 0);
    }

    #[test]
    fn a_tally_counts_each_file_once_and_sees_what_a_power_cut_empties() {
        let dir = tempfile::tempdir().unwrap();
        let snaps = Snapshotter::open(dir.path()).unwrap();
        let chain = Digest::of(b"tallied");
        let p = snaps.prepare().unwrap();
        let fs_dir = p.fs();
        fs::create_dir_all(fs_dir.join("usr/bin")).unwrap();
        fs::write(fs_dir.join("usr/bin/tool"), vec![7u8; 5000]).unwrap();
        fs::write(fs_dir.join("empty"), b"").unwrap();
        // A hard link is one file; a symlink (even to a big file) and a directory are none.
        fs::hard_link(fs_dir.join("usr/bin/tool"), fs_dir.join("usr/bin/alias")).unwrap();
        std::os::unix::fs::symlink("usr/bin/tool", fs_dir.join("link")).unwrap();
        let tally = snaps.commit(p, &chain).unwrap();
        assert_eq!(tally, Tally { files: 2, bytes: 5000 });
        assert_eq!(snaps.tally(&chain).unwrap(), tally);
        // A second commit of the chain answers the tally of the one in place.
        assert_eq!(snaps.commit(snaps.prepare().unwrap(), &chain).unwrap(), tally);
        // Emptied (names and modes kept, as ext4 leaves data never written back) or gone.
        fs::File::options()
            .write(true)
            .open(snaps.fs_path(&chain).join("usr/bin/tool"))
            .unwrap()
            .set_len(0)
            .unwrap();
        assert_eq!(snaps.tally(&chain).unwrap(), Tally { files: 2, bytes: 0 });
        fs::remove_file(snaps.fs_path(&chain).join("empty")).unwrap();
        assert_eq!(snaps.tally(&chain).unwrap(), Tally { files: 1, bytes: 0 });
    }
}
