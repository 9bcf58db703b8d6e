//! Content store: blobs by digest under `<root>/content/blobs/sha256/<hex>`, written through
//! `<root>/content/ingest/<hex>` and renamed into place only once their digest is verified.
//! An ingest file left by an interrupted download is where a retry resumes.

use std::collections::VecDeque;
use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use bytes::{Buf as _, Bytes};
use scute_sha256x2::Sha256;

use crate::distribution::digest::Digest;

pub struct ContentStore {
    blobs: PathBuf,
    ingest: PathBuf,
    /// Counts the blobs put in and taken out, for [`ContentStore::changes`].
    changes: AtomicU64,
}

#[derive(Debug, thiserror::Error)]
pub enum ContentError {
    #[error("blob {0} not found in the content store")]
    NotFound(Digest),
    #[error("blob digest mismatch: expected {expected}, got {actual}")]
    DigestMismatch { expected: Digest, actual: Digest },
    #[error("content store {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
}

impl ContentError {
    /// The OS error underneath, if it is one.
    pub fn io_error(&self) -> Option<&io::Error> {
        match self {
            ContentError::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

fn io_err(path: &Path) -> impl FnOnce(io::Error) -> ContentError + '_ {
    move |source| ContentError::Io {
        path: path.to_path_buf(),
        source,
    }
}

impl ContentStore {
    pub fn open(root: &Path) -> Result<ContentStore, ContentError> {
        let store = ContentStore {
            blobs: root.join("blobs/sha256"),
            ingest: root.join("ingest"),
            changes: AtomicU64::new(0),
        };
        fs::create_dir_all(&store.blobs).map_err(io_err(&store.blobs))?;
        // Private images' layers are readable by root only.
        fs::set_permissions(root, std::os::unix::fs::PermissionsExt::from_mode(0o700)).map_err(io_err(root))?;
        fs::create_dir_all(&store.ingest).map_err(io_err(&store.ingest))?;
        Ok(store)
    }

    /// How many times a blob went in or out so far: what the store holds changed when this did
    /// (partial downloads growing aside).
    pub fn changes(&self) -> u64 {
        self.changes.load(Ordering::Acquire)
    }

    fn changed(&self) {
        self.changes.fetch_add(1, Ordering::AcqRel);
    }

    pub fn blob_path(&self, digest: &Digest) -> PathBuf {
        self.blobs.join(digest.hex())
    }

    pub fn ingest_path(&self, digest: &Digest) -> PathBuf {
        self.ingest.join(digest.hex())
    }

    pub fn has(&self, digest: &Digest) -> bool {
        self.blob_path(digest).is_file()
    }

    pub fn size(&self, digest: &Digest) -> Option<u64> {
        fs::metadata(self.blob_path(digest)).ok().map(|m| m.len())
    }

    pub fn read(&self, digest: &Digest) -> Result<Vec<u8>, ContentError> {
        let path = self.blob_path(digest);
        match fs::read(&path) {
            Ok(bytes) => Ok(bytes),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Err(ContentError::NotFound(digest.clone())),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    /// Writes a small blob (manifest, config) held in memory, verifying it against `expected`.
    pub fn write(&self, bytes: &[u8], expected: &Digest) -> Result<(), ContentError> {
        let actual = Digest::of(bytes);
        if &actual != expected {
            return Err(ContentError::DigestMismatch {
                expected: expected.clone(),
                actual,
            });
        }
        if self.has(expected) {
            return Ok(());
        }
        let tmp = self.ingest.join(format!("{}.small", expected.hex()));
        let mut file = File::create(&tmp).map_err(io_err(&tmp))?;
        file.write_all(bytes).map_err(io_err(&tmp))?;
        file.sync_all().map_err(io_err(&tmp))?;
        fs::rename(&tmp, self.blob_path(expected)).map_err(io_err(&tmp))?;
        self.changed();
        // The rename is durable once the blobs directory is: before any record names the blob.
        scute_sys::files::sync_dir(&self.blobs).map_err(io_err(&self.blobs))?;
        Ok(())
    }

    /// Opens (or resumes) the ingest file of `digest`, locked (flock) for this writer alone: a
    /// cancelled pull's unpacker may still be appending its last buffered chunks, and a retry must
    /// wait for it rather than interleave. Blocks while another writer holds it: call from a
    /// blocking thread. Returns None when the blob was committed meanwhile.
    pub fn open_ingest(&self, digest: &Digest) -> Result<Option<Ingest>, ContentError> {
        use std::os::fd::AsRawFd;
        use std::os::unix::fs::MetadataExt;
        let path = self.ingest_path(digest);
        let file = loop {
            let file = OpenOptions::new()
                .create(true)
                .read(true)
                .append(true)
                .open(&path)
                .map_err(io_err(&path))?;
            // SAFETY: flock on a valid fd we own; it is released when the file is closed.
            if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } != 0 {
                return Err(io_err(&path)(io::Error::last_os_error()));
            }
            // The previous holder may have committed (renamed) or discarded the file we opened:
            // only the inode still at `path` is the ingest.
            let held = file.metadata().map_err(io_err(&path))?;
            match fs::metadata(&path) {
                Ok(now) if now.ino() == held.ino() && now.dev() == held.dev() => break file,
                _ => continue,
            }
        };
        if self.has(digest) {
            let _ = fs::remove_file(&path);
            return Ok(None);
        }
        let resumed = file.metadata().map_err(io_err(&path))?.len();
        Ok(Some(Ingest {
            path,
            file,
            resumed,
            written: resumed,
            writeback_from: resumed,
            save: true,
            digest: Arc::default(),
        }))
    }

    pub fn delete(&self, digest: &Digest) -> Result<(), ContentError> {
        let path = self.blob_path(digest);
        self.changed();
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(&path)(e)),
        }
    }

    /// Removes the ingest file at `path` (from `list_ingests`) unless a writer holds it; answers
    /// its size, or None when it is in use.
    pub fn remove_idle_ingest(&self, path: &Path, remove: bool) -> Result<Option<u64>, ContentError> {
        use std::os::fd::AsRawFd;
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(io_err(path)(e)),
        };
        // SAFETY: flock on a valid fd we own; released when the file closes.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
            return Ok(None); // a download is writing it
        }
        let size = file.metadata().map_err(io_err(path))?.len();
        if remove {
            self.changed();
            fs::remove_file(path).map_err(io_err(path))?;
        }
        Ok(Some(size))
    }

    /// The partial downloads (not the `.small` files `write` renames into place at once).
    pub fn list_ingests(&self) -> Result<Vec<PathBuf>, ContentError> {
        let entries = fs::read_dir(&self.ingest).map_err(io_err(&self.ingest))?;
        Ok(entries
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_none_or(|x| x != "small"))
            .collect())
    }

    pub fn list(&self) -> Result<Vec<Digest>, ContentError> {
        let mut out = Vec::new();
        for entry in fs::read_dir(&self.blobs).map_err(io_err(&self.blobs))? {
            let entry = entry.map_err(io_err(&self.blobs))?;
            if let Ok(d) = Digest::parse(&format!("sha256:{}", entry.file_name().to_string_lossy())) {
                out.push(d);
            }
        }
        Ok(out)
    }
}

/// A blob being downloaded: every byte is hashed, and appended to the ingest file unless the
/// blob is dropped once checked ([`Ingest::hashed_only`]). The locked file is also what keeps a
/// second writer of the same blob waiting.
pub struct Ingest {
    path: PathBuf,
    file: File,
    resumed: u64,
    written: u64,
    /// Where the bytes not yet handed to writeback start.
    writeback_from: u64,
    /// Off for a blob dropped once its layer is unpacked: its bytes are hashed, never written.
    save: bool,
    /// Shared with the unpacker while it runs ([`Ingest::blob_digest`]).
    digest: Arc<Mutex<BlobDigest>>,
}

/// A blob's writeback starts every this many bytes, so that the fsync of its commit waits for
/// the tail alone: waiting for all of a 21 MB layer took 11-58 ms here, and about 50 ms of a
/// 200 MB pull's 0.5 s (`cargo bench --bench pull`).
const WRITEBACK_EVERY: u64 = 8 << 20;

impl Ingest {
    /// Bytes already on disk from an earlier attempt.
    pub fn resumed(&self) -> u64 {
        self.resumed
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// Reads back the resumed bytes (hashing them) so they can be fed to the unpacker again.
    pub fn replay(&mut self) -> Result<File, ContentError> {
        let mut file = File::open(&self.path).map_err(io_err(&self.path))?;
        let mut buf = vec![0u8; 1 << 16];
        loop {
            let n = file.read(&mut buf).map_err(io_err(&self.path))?;
            if n == 0 {
                break;
            }
            self.blob_digest_now().update(&buf[..n]);
        }
        File::open(&self.path).map_err(io_err(&self.path))
    }

    /// Empties the ingest (its bytes were wrong, or the registry restarted from zero), keeping
    /// the lock.
    pub fn truncate(mut self) -> Result<Ingest, ContentError> {
        self.file.set_len(0).map_err(io_err(&self.path))?;
        self.resumed = 0;
        self.written = 0;
        self.writeback_from = 0;
        *self.blob_digest_now() = BlobDigest::default();
        Ok(self)
    }

    /// Removes the partial download (the disk needs its room more than a retry does).
    pub fn discard(self) {
        let _ = fs::remove_file(&self.path);
    }

    pub fn append(&mut self, chunk: Bytes) -> Result<(), ContentError> {
        self.written += chunk.len() as u64;
        if self.save {
            self.file.write_all(&chunk).map_err(io_err(&self.path))?;
        }
        self.blob_digest_now().push(chunk);
        if !self.save {
            return Ok(());
        }
        if self.written - self.writeback_from >= WRITEBACK_EVERY {
            self.start_writeback();
        }
        Ok(())
    }

    /// Starts writing the bytes appended since the last call to the disk, without waiting
    /// (sync_file_range(2) with SYNC_FILE_RANGE_WRITE). Durability is still the commit's fsync;
    /// this only gets the disk going while the download goes on. nix 0.29 has no wrapper.
    fn start_writeback(&mut self) {
        use std::os::fd::AsRawFd;
        let (Ok(offset), Ok(len)) = (
            i64::try_from(self.writeback_from),
            i64::try_from(self.written - self.writeback_from),
        ) else {
            return;
        };
        // SAFETY: sync_file_range on a valid fd we own, with a range inside the file; it reads
        // and writes no memory of ours. A failure only means the fsync does all the work.
        unsafe {
            libc::sync_file_range(self.file.as_raw_fd(), offset, len, libc::SYNC_FILE_RANGE_WRITE);
        }
        self.writeback_from = self.written;
    }

    /// For a blob that is dropped once checked ([`Ingest::check_and_drop`]): the new bytes are
    /// hashed and handed on, not written. Writing them (to delete them after the unpack) was
    /// about 0.4 CPU-s per GB pulled, a seventh of the daemon's CPU, for one use: a later pull
    /// resuming a cut download. Here a cut download starts over, as with CRI-O; keeping blobs
    /// (`[image] discard_unpacked_layers = false`) keeps downloads resumable, as containerd's.
    /// Bytes an earlier attempt left are still replayed.
    pub fn hashed_only(mut self) -> Ingest {
        self.save = false;
        self
    }

    /// Whether the new bytes go to the ingest file (see [`Ingest::hashed_only`]).
    pub fn saves(&self) -> bool {
        self.save
    }

    /// Verifies the whole blob against `expected`, then removes it: the layer it held is
    /// unpacked and the store does not keep it (`[image] discard_unpacked_layers`).
    pub fn check_and_drop(self, expected: &Digest) -> Result<(), ContentError> {
        let _ = fs::remove_file(&self.path);
        check_digest(self.finish_digest(), expected)
    }

    /// The blob's digest so far, for the unpacker to hash its own bytes alongside
    /// ([`BlobDigest::hash_with`]).
    pub fn blob_digest(&self) -> Arc<Mutex<BlobDigest>> {
        self.digest.clone()
    }

    fn blob_digest_now(&self) -> MutexGuard<'_, BlobDigest> {
        // A panic while holding it can only have come from a hashing bug, not left a half
        // update of anything but the digest, which then fails its check.
        self.digest.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn finish_digest(&self) -> Digest {
        std::mem::take(&mut *self.blob_digest_now()).finish()
    }

    /// Verifies the whole blob against `expected` and moves it into the store.
    pub fn commit(self, store: &ContentStore, expected: &Digest) -> Result<(), ContentError> {
        if let Err(e) = check_digest(self.finish_digest(), expected) {
            let _ = fs::remove_file(&self.path);
            return Err(e);
        }
        self.file.sync_all().map_err(io_err(&self.path))?;
        fs::rename(&self.path, store.blob_path(expected)).map_err(io_err(&self.path))?;
        store.changed();
        scute_sys::files::sync_dir(&store.blobs).map_err(io_err(&store.blobs))?;
        Ok(())
    }
}

fn check_digest(actual: Digest, expected: &Digest) -> Result<(), ContentError> {
    if &actual != expected {
        return Err(ContentError::DigestMismatch {
            expected: expected.clone(),
            actual,
        });
    }
    Ok(())
}

/// A download's blob digest. Its chunks wait here, shared rather than copied, until the
/// unpacker hashes the uncompressed bytes they hold and takes them alongside
/// ([`BlobDigest::hash_with`]): two SHA-256 streams in step cost about a fifth less than one
/// after the other. What nothing takes is hashed alone once more than `WAITING_MAX` waits, and at
/// the end.
#[derive(Default)]
pub struct BlobDigest {
    hasher: Sha256,
    waiting: VecDeque<Bytes>,
    waiting_len: usize,
}

/// Past this the waiting chunks are hashed alone: a blob nothing unpacks (an artifact file, a
/// config) must not be held in memory whole. A layer's unpacker takes them well before.
const WAITING_MAX: usize = 1 << 20;

impl BlobDigest {
    fn push(&mut self, chunk: Bytes) {
        self.waiting_len += chunk.len();
        self.waiting.push_back(chunk);
        while self.waiting_len > WAITING_MAX {
            self.hash_front_alone();
        }
    }

    fn update(&mut self, data: &[u8]) {
        while !self.waiting.is_empty() {
            self.hash_front_alone();
        }
        self.hasher.update(data);
    }

    fn hash_front_alone(&mut self) {
        if let Some(chunk) = self.waiting.pop_front() {
            self.waiting_len -= chunk.len();
            self.hasher.update(&chunk);
        }
    }

    /// Hashes `data` into `other`, and as many of the waiting bytes into the blob digest, the
    /// two in step.
    pub fn hash_with(&mut self, other: &mut Sha256, mut data: &[u8]) {
        while !data.is_empty() {
            let Some(front) = self.waiting.front_mut() else {
                other.update(data);
                return;
            };
            let n = front.len().min(data.len());
            scute_sha256x2::update_both(&mut self.hasher, &front[..n], other, &data[..n]);
            data = &data[n..];
            self.waiting_len -= n;
            if n == front.len() {
                self.waiting.pop_front();
            } else {
                front.advance(n);
            }
        }
    }

    fn finish(mut self) -> Digest {
        while !self.waiting.is_empty() {
            self.hash_front_alone();
        }
        Digest::from_sha256(self.hasher.finalize())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_blob_larger_than_the_writeback_step_commits_whole() {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        let data: Vec<u8> = (0..(WRITEBACK_EVERY as usize * 2 + 12345))
            .map(|i| (i % 251) as u8)
            .collect();
        let d = Digest::of(&data);
        // Resumed past the first step, then appended in uneven chunks across two more.
        let mut ingest = store.open_ingest(&d).unwrap().unwrap();
        ingest
            .append(Bytes::copy_from_slice(&data[..(WRITEBACK_EVERY as usize + 7)]))
            .unwrap();
        drop(ingest);
        let mut ingest = store.open_ingest(&d).unwrap().unwrap();
        ingest.replay().unwrap();
        for chunk in data[(WRITEBACK_EVERY as usize + 7)..].chunks(3 << 20) {
            ingest.append(Bytes::copy_from_slice(chunk)).unwrap();
        }
        // 3 + 3 + 2.01 MiB after the resume: one step, at the last chunk.
        assert_eq!(ingest.writeback_from, data.len() as u64, "writeback started");
        ingest.commit(&store, &d).unwrap();
        assert_eq!(store.read(&d).unwrap(), data);
    }

    #[test]
    fn the_blob_digest_comes_out_the_same_whoever_hashes_its_bytes() {
        // A compressed stream in network-sized chunks, an uncompressed one in unpacker reads,
        // and more waiting than WAITING_MAX at one point: both digests are those of the bytes.
        let blob: Vec<u8> = (0..3 * WAITING_MAX + 4321).map(|i| (i * 7 % 253) as u8).collect();
        let unpacked: Vec<u8> = (0..2 * WAITING_MAX + 99).map(|i| (i * 13 % 241) as u8).collect();
        let mut digest = BlobDigest::default();
        let mut diff = Sha256::new();
        let mut reads = unpacked.chunks(131_072 - 3);
        for (i, chunk) in blob.chunks(16_411).enumerate() {
            digest.push(Bytes::copy_from_slice(chunk));
            // The unpacker reads less than arrives: what waits passes WAITING_MAX.
            if i % 20 == 0 {
                if let Some(read) = reads.next() {
                    digest.hash_with(&mut diff, read);
                }
            }
        }
        assert!(digest.waiting_len <= WAITING_MAX && digest.waiting_len > WAITING_MAX - 16_411);
        for read in reads {
            digest.hash_with(&mut diff, read);
        }
        assert_eq!(digest.finish(), Digest::of(&blob));
        assert_eq!(Digest::from_sha256(diff.finalize()), Digest::of(&unpacked));
    }

    #[test]
    fn write_verifies_and_resume_rehashes() {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        let data = b"hello layer".to_vec();
        let d = Digest::of(&data);
        assert!(matches!(
            store.write(b"other", &d),
            Err(ContentError::DigestMismatch { .. })
        ));
        assert!(!store.has(&d));

        // First attempt stops half way.
        let mut ingest = store.open_ingest(&d).unwrap().unwrap();
        ingest.append(Bytes::copy_from_slice(&data[..5])).unwrap();
        drop(ingest);
        // The retry resumes after the 5 bytes on disk.
        let mut ingest = store.open_ingest(&d).unwrap().unwrap();
        assert_eq!(ingest.resumed(), 5);
        let mut replay = String::new();
        ingest.replay().unwrap().read_to_string(&mut replay).unwrap();
        assert_eq!(replay, "hello");
        ingest.append(Bytes::copy_from_slice(&data[5..])).unwrap();
        ingest.commit(&store, &d).unwrap();
        assert_eq!(store.read(&d).unwrap(), data);
        assert!(!store.ingest_path(&d).exists());
        assert_eq!(store.list().unwrap(), vec![d.clone()]);
        store.delete(&d).unwrap();
        store.delete(&d).unwrap();
        assert!(matches!(store.read(&d), Err(ContentError::NotFound(_))));
    }

    #[test]
    fn corrupt_ingest_is_rejected_and_removed() {
        let dir = tempfile::tempdir().unwrap();
        let store = ContentStore::open(dir.path()).unwrap();
        let d = Digest::of(b"right");
        let mut ingest = store.open_ingest(&d).unwrap().unwrap();
        ingest.append(Bytes::from_static(b"wrong")).unwrap();
        assert!(matches!(
            ingest.commit(&store, &d),
            Err(ContentError::DigestMismatch { .. })
        ));
        assert!(!store.has(&d));
        assert!(!store.ingest_path(&d).exists());
    }

    #[test]
    fn a_second_writer_waits_and_sees_the_commit() {
        let dir = tempfile::tempdir().unwrap();
        let store = std::sync::Arc::new(ContentStore::open(dir.path()).unwrap());
        let d = Digest::of(b"whole");
        let mut first = store.open_ingest(&d).unwrap().unwrap();
        first.append(Bytes::from_static(b"who")).unwrap();
        let (s2, d2) = (store.clone(), d.clone());
        let second = std::thread::spawn(move || s2.open_ingest(&d2).unwrap().is_none());
        std::thread::sleep(std::time::Duration::from_millis(100));
        assert!(!second.is_finished(), "the second writer must wait for the lock");
        first.append(Bytes::from_static(b"le")).unwrap();
        first.commit(&store, &d).unwrap();
        assert!(
            second.join().unwrap(),
            "after the commit there is nothing left to write"
        );
        assert_eq!(store.read(&d).unwrap(), b"whole");
        assert!(!store.ingest_path(&d).exists());
    }
}
