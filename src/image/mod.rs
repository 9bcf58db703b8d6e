//! Images: references, registry hosts (mirrors), registry access, the content store, secure
//! layer unpacking, and the image records kept in the store.
//!
//! [`ImageManager`] owns all of it: the content store and snapshot directories on disk, the image
//! and snapshot records, and the in-flight pulls. Server handlers call it; nothing else touches
//! those files.

pub(crate) mod artifact;
pub mod content;
mod disk_reserve;
mod doctor;
pub mod hosts;
pub mod pause;
pub mod progress;
pub(crate) mod pull;
pub mod record;
pub mod registry;
pub mod unpack;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio::sync::Mutex;

use crate::distribution::digest::Digest;
use crate::distribution::reference::{self, ImageRef};
use crate::keyed_lock::KeyedLocks;
use crate::snapshot::{SnapshotRecord, Snapshotter};
use crate::store::{self, Kind, Store};
use content::ContentStore;
use disk_reserve::DiskReserve;
use record::ImageRecord;

pub use registry::Credentials;

#[derive(Debug, thiserror::Error)]
pub enum PullError {
    #[error("{0}")]
    NotFound(String),
    #[error("registry refused the credentials: {0}")]
    Unauthorized(String),
    #[error("registry error: {0}")]
    Remote(String),
    #[error("{0}")]
    NoPlatform(String),
    #[error("content verification failed: {0}")]
    Integrity(String),
    #[error("layer {layer} is unsafe to unpack: {reason}")]
    Hostile { layer: String, reason: String },
    #[error("registry configuration: {0}")]
    Config(String),
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// The disk reserve was reached, or the disk is full.
    #[error("{0}")]
    NoSpace(String),
    /// No progress for `[image] pull_progress_timeout_seconds`.
    #[error("{0}")]
    Stalled(String),
    /// A layer whose bytes are not a readable archive (bad tar headers, a corrupt or truncated
    /// gzip or zstd stream) though the registry sent them whole: pulling again gets the same.
    #[error("{0}")]
    Malformed(String),
}

#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error("{0}")]
    InvalidReference(#[from] reference::RefError),
    #[error("image {0:?} not found")]
    NotFound(String),
    #[error("pulling {image}: {source}")]
    Pull { image: String, source: PullError },
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error(transparent)]
    Content(#[from] content::ContentError),
    #[error("{0}")]
    Io(String),
}

impl From<std::io::Error> for ImageError {
    fn from(e: std::io::Error) -> Self {
        ImageError::Io(e.to_string())
    }
}

/// The manifest annotations that mark a checkpoint image: checkpointctl's (containerd's) and
/// CRI-O's. A pull keeps such an image's layer blob: a restore reads it.
pub const CHECKPOINT_ANNOTATIONS: [&str; 2] = [
    "checkpointctl.annotation.checkpoint.name",
    "io.kubernetes.cri-o.annotations.checkpoint.name",
];

/// Whether a manifest's or index's bytes carry one of [`CHECKPOINT_ANNOTATIONS`].
pub fn annotated_as_checkpoint(document: &[u8]) -> bool {
    let doc: serde_json::Value = serde_json::from_slice(document).unwrap_or_default();
    CHECKPOINT_ANNOTATIONS.iter().any(|k| doc["annotations"][k].is_string())
}

pub struct ImageManager {
    store: Arc<Store>,
    content: ContentStore,
    snapshots: Arc<Snapshotter>,
    hosts_dir: PathBuf,
    max_concurrent_downloads: usize,
    /// Layer blobs are dropped once unpacked (`[image] discard_unpacked_layers`).
    discard_unpacked_layers: bool,
    disk_reserve: DiskReserve,
    pulls: progress::Pulls,
    pull_progress_timeout: std::time::Duration,
    /// Which pull holds each of `layer_locks` (its waiters follow that pull's progress).
    lock_holders: std::sync::Mutex<std::collections::HashMap<String, Arc<progress::PullState>>>,
    /// Images named here are reported pinned (the kubelet never garbage-collects them).
    pinned: Vec<String>,
    /// One pull per reference at a time; one download per layer at a time.
    ref_locks: KeyedLocks,
    layer_locks: KeyedLocks,
    /// Serialises read-modify-write of image records (tags move between images).
    records: Mutex<()>,
    /// Blobs and snapshots that pulls in flight are writing or rely on: garbage collection treats
    /// them as live (containerd's leases). GC holds this lock for its whole run, so a pull cannot
    /// register something between GC's liveness check and its deletion.
    in_flight: std::sync::Mutex<Vec<Digest>>,
    content_root: PathBuf,
    snapshots_root: PathBuf,
    held_snapshots: HeldSnapshots,
    /// The last walk of the two trees (ImageFsInfo), reused while nothing was put in or taken
    /// out; older than [`USAGE_MAX_AGE`], it is walked again in the background.
    usage: Arc<std::sync::Mutex<Option<UsageSample>>>,
    /// A background walk is under way.
    usage_refreshing: Arc<std::sync::atomic::AtomicBool>,
}

/// How long a walk of the image filesystem is reused while no blob or snapshot came or went
/// (what a pull or an unpack in progress adds shows up after that): containerd's CRI plugin
/// reports snapshot usage it collects every 10 s.
const USAGE_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(10);

/// A walk of the image filesystem: its figures, when, and the stores' change counts it saw.
struct UsageSample {
    changes: (u64, u64),
    taken: std::time::Instant,
    bytes: u64,
    inodes: u64,
}

/// The snapshot chains something above the image layer still uses (containers keep their
/// rootfs layers when their image is removed): asked at each garbage collection, so images
/// need not know what a container is.
pub type HeldSnapshots = Box<dyn Fn() -> Result<Vec<Digest>, store::Error> + Send + Sync>;

pub struct ImageManagerConfig<'a> {
    pub root: &'a Path,
    pub hosts_dir: &'a Path,
    pub max_concurrent_downloads: usize,
    pub discard_unpacked_layers: bool,
    /// What a pull leaves free on `root`'s filesystem (`[image] min_free_disk_percent`).
    pub min_free_disk_percent: u8,
    /// A pull that made no progress for this long is aborted; zero: never.
    pub pull_progress_timeout: std::time::Duration,
    pub pinned: Vec<String>,
    pub held_snapshots: HeldSnapshots,
}

impl ImageManager {
    pub fn open(store: Arc<Store>, config: ImageManagerConfig<'_>) -> Result<ImageManager, ImageError> {
        let content_root = config.root.join("content");
        let snapshots_root = config.root.join("snapshots");
        Ok(ImageManager {
            content: ContentStore::open(&content_root)?,
            snapshots: Arc::new(Snapshotter::open(&snapshots_root)?),
            store,
            hosts_dir: config.hosts_dir.to_path_buf(),
            max_concurrent_downloads: config.max_concurrent_downloads.max(1),
            discard_unpacked_layers: config.discard_unpacked_layers,
            disk_reserve: DiskReserve::new(config.root, config.min_free_disk_percent),
            pulls: progress::Pulls::default(),
            pull_progress_timeout: config.pull_progress_timeout,
            lock_holders: Default::default(),
            pinned: config.pinned,
            ref_locks: KeyedLocks::default(),
            layer_locks: KeyedLocks::default(),
            records: Mutex::new(()),
            in_flight: std::sync::Mutex::new(Vec::new()),
            content_root,
            snapshots_root,
            held_snapshots: config.held_snapshots,
            usage: Default::default(),
            usage_refreshing: Default::default(),
        })
    }

    /// The pulls in flight with their progress.
    pub fn pulls(&self) -> Vec<progress::PullSnapshot> {
        self.pulls.list()
    }

    pub fn snapshots(&self) -> &Snapshotter {
        &self.snapshots
    }

    pub fn content_root(&self) -> &Path {
        &self.content_root
    }

    pub fn snapshots_root(&self) -> &Path {
        &self.snapshots_root
    }

    pub fn list(&self) -> Result<Vec<ImageRecord>, ImageError> {
        Ok(self.store.list::<ImageRecord>()?)
    }

    /// Finds an image by ID (`sha256:…` or bare hex, or a unique prefix of either), RepoTag or
    /// RepoDigest, in that order of certainty (containerd's LocalResolve).
    pub fn resolve(&self, ref_or_id: &str) -> Result<ImageRecord, ImageError> {
        let not_found = || ImageError::NotFound(ref_or_id.to_string());
        if ref_or_id.is_empty() {
            return Err(not_found());
        }
        if let Ok(d) = Digest::parse(ref_or_id) {
            return self.store.get::<ImageRecord>(d.as_str())?.ok_or_else(not_found);
        }
        let images = self.store.list::<ImageRecord>()?;
        if let Ok(image_ref) = ImageRef::parse(ref_or_id) {
            let tag = image_ref.repo_tag();
            let by_digest = image_ref.digest().map(|d| image_ref.repo_digest(d));
            // name:tag@digest names the digest; the tag is informational.
            let found = match (&by_digest, &tag) {
                (Some(rd), _) => images.iter().find(|i| i.repo_digests.contains(rd)),
                (None, Some(t)) => images.iter().find(|i| i.repo_tags.contains(t)),
                (None, None) => None,
            };
            if let Some(image) = found {
                return Ok(image.clone());
            }
        }
        let hex = ref_or_id.strip_prefix("sha256:").unwrap_or(ref_or_id);
        if !hex.is_empty() && hex.len() <= 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            return match self
                .store
                .resolve_id(Kind::Image, &format!("sha256:{}", hex.to_ascii_lowercase()))
            {
                Ok(id) => self.store.get::<ImageRecord>(&id)?.ok_or_else(not_found),
                Err(store::Error::NotFound { .. }) => Err(not_found()),
                Err(e) => Err(e.into()),
            };
        }
        Err(not_found())
    }

    pub fn is_pinned(&self, image: &ImageRecord) -> bool {
        image.pinned || image.repo_tags.iter().any(|t| self.pinned.contains(t))
    }

    /// Drops `runtime_handler`'s claim on an image (KEP-4216: the kubelet collects images per
    /// runtime class). The image goes when no claim is left, or when the handler held none
    /// (`crictl rmi`, with no handler, of an image only other handlers pulled): with every name
    /// it has (removing `busybox:1` when the same image is also `busybox:latest` removes both,
    /// as containerd does), then content and snapshots no other image uses are freed. Unknown
    /// images are not an error: the kubelet retries removals.
    pub async fn remove(&self, ref_or_id: &str, runtime_handler: &str) -> Result<(), ImageError> {
        let _records = self.records.lock().await;
        let mut image = match self.resolve(ref_or_id) {
            Ok(image) => image,
            Err(ImageError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let mut handlers = image.handlers();
        let held = handlers.iter().any(|h| h == runtime_handler);
        handlers.retain(|h| h != runtime_handler);
        if held && !handlers.is_empty() {
            image.runtime_handlers = handlers;
            self.store.put(&image)?;
            tracing::info!(image = %image.id, handler = %runtime_handler, "image released by a runtime handler; others still hold it");
            return Ok(());
        }
        self.store.delete::<ImageRecord>(image.id.as_str(), None)?;
        tracing::info!(image = %image.id, tags = ?image.repo_tags, "image removed");
        self.collect_garbage()
    }

    /// Marks blobs and snapshots as in use by a pull until the lease is dropped.
    /// Takes the one-writer lock of `key` (a layer's or artifact file's digest, an artifact's
    /// chain) for the pull `progress`. While another pull holds it, this one follows that pull's
    /// progress (its watchdog then fires only if the holder stalls too).
    async fn lock_for_pull(&self, key: &str, progress: &Arc<progress::PullState>) -> HeldLock<'_> {
        let holder = self.holders().get(key).cloned();
        let guard = {
            let _following = progress.follow(holder);
            self.layer_locks.lock(key).await
        };
        self.holders().insert(key.to_string(), progress.clone());
        HeldLock {
            owner: self,
            key: key.to_string(),
            _guard: guard,
        }
    }

    fn holders(&self) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, Arc<progress::PullState>>> {
        self.lock_holders.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lease(&self, digests: Vec<Digest>) -> Lease<'_> {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        in_flight.extend(digests.iter().cloned());
        Lease { owner: self, digests }
    }

    /// Deletes blobs and snapshots that no image (and no pull in flight) references.
    fn collect_garbage(&self) -> Result<(), ImageError> {
        let in_flight = self.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        let images = self.store.list::<ImageRecord>()?;
        let live_blobs: std::collections::HashSet<&Digest> =
            images.iter().flat_map(|i| i.blobs()).chain(in_flight.iter()).collect();
        let held = (self.held_snapshots)()?;
        let live_chains: std::collections::HashSet<&Digest> = images
            .iter()
            .flat_map(|i| i.layers.iter().map(|l| &l.chain_id))
            .chain(held.iter())
            .chain(in_flight.iter())
            .collect();
        for blob in self.content.list()? {
            if !live_blobs.contains(&blob) {
                self.content.delete(&blob)?;
            }
        }
        for snapshot in self.store.list::<SnapshotRecord>()? {
            if !live_chains.contains(&snapshot.chain_id) {
                self.store.delete::<SnapshotRecord>(snapshot.chain_id.as_str(), None)?;
                self.snapshots.remove(&snapshot.chain_id)?;
            }
        }
        // Directories without a record: a crash between unpack and record.
        for chain in self.snapshots.list_dirs()? {
            if !live_chains.contains(&chain) && self.store.get::<SnapshotRecord>(chain.as_str())?.is_none() {
                self.snapshots.remove(&chain)?;
            }
        }
        Ok(())
    }

    /// Stores a new image record, or adds names to the existing one, moving a RepoTag away from
    /// the image that had it (an image left with no name at all is removed).
    async fn commit_record(&self, mut record: ImageRecord) -> Result<ImageRecord, ImageError> {
        let _records = self.records.lock().await;
        let new_tags = record.repo_tags.clone();
        for mut other in self.store.list::<ImageRecord>()? {
            if other.id == record.id {
                for tag in &other.repo_tags {
                    if !record.repo_tags.contains(tag) {
                        record.repo_tags.push(tag.clone());
                    }
                }
                for rd in &other.repo_digests {
                    if !record.repo_digests.contains(rd) {
                        record.repo_digests.push(rd.clone());
                    }
                }
                record.created_at = other.created_at;
                for handler in other.handlers() {
                    if !record.runtime_handlers.contains(&handler) {
                        record.runtime_handlers.push(handler);
                    }
                }
                continue;
            }
            let before = other.repo_tags.len();
            other.repo_tags.retain(|t| !new_tags.contains(t));
            if other.repo_tags.len() != before {
                if other.has_name() {
                    self.store.put(&other)?;
                } else {
                    self.store.delete::<ImageRecord>(other.id.as_str(), None)?;
                }
            }
        }
        record.repo_tags.sort();
        record.repo_digests.sort();
        record.runtime_handlers.sort();
        self.store.put(&record)?;
        self.collect_garbage()?;
        Ok(record)
    }

    /// Records that `runtime_handler` uses image `id` (ImageStatus found it for that handler,
    /// so the kubelet will not pull it for that handler: its claim must show in ListImages).
    pub async fn claim(&self, id: &Digest, runtime_handler: &str) -> Result<(), ImageError> {
        let _records = self.records.lock().await;
        let Some(mut image) = self.store.get::<ImageRecord>(id.as_str())? else {
            return Ok(());
        };
        let mut handlers = image.handlers();
        if !handlers.iter().any(|h| h == runtime_handler) {
            handlers.push(runtime_handler.to_string());
            handlers.sort();
            image.runtime_handlers = handlers;
            self.store.put(&image)?;
        }
        Ok(())
    }

    pub fn content(&self) -> &ContentStore {
        &self.content
    }

    /// Bytes and inodes used by the image filesystem (content + snapshots). A walk of both trees,
    /// reused while no blob or snapshot came or went: every crictl command asks once (the CRI
    /// client's connection check is an ImageFsInfo) and the kubelet every few seconds, and the
    /// walk visits every file of every image. After a change the answer walks at once (a pull or
    /// a removal shows in the next answer); a sample older than [`USAGE_MAX_AGE`] with no change
    /// (only a pull in progress adds to the trees meanwhile) is answered and walked again in the
    /// background, so no caller waits for a walk but the first after a change.
    pub fn usage(&self) -> (u64, u64) {
        // Read before the walk: a change during it makes the next call walk again.
        let changes = (self.content.changes(), self.snapshots.changes());
        let last = self
            .usage
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .filter(|sample| sample.changes == changes)
            .map(|sample| (sample.bytes, sample.inodes, sample.taken.elapsed()));
        match last {
            Some((bytes, inodes, age)) if age < USAGE_MAX_AGE => (bytes, inodes),
            Some((bytes, inodes, _)) => {
                self.refresh_usage_in_background(changes);
                (bytes, inodes)
            }
            None => walk_usage(&self.content_root, &self.snapshots_root, changes, &self.usage),
        }
    }

    fn refresh_usage_in_background(&self, changes: (u64, u64)) {
        use std::sync::atomic::Ordering;
        if self.usage_refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (content, snapshots) = (self.content_root.clone(), self.snapshots_root.clone());
        let (usage, refreshing) = (self.usage.clone(), self.usage_refreshing.clone());
        let spawned = std::thread::Builder::new().name("scute-usage".into()).spawn(move || {
            walk_usage(&content, &snapshots, changes, &usage);
            refreshing.store(false, Ordering::Release);
        });
        if let Err(e) = spawned {
            tracing::warn!(error = %e, "starting the image filesystem's usage walk");
            self.usage_refreshing.store(false, Ordering::Release);
        }
    }
}

/// Walks the content store and the snapshots, and keeps the figures as seen at `changes`.
fn walk_usage(
    content: &Path,
    snapshots: &Path,
    changes: (u64, u64),
    usage: &std::sync::Mutex<Option<UsageSample>>,
) -> (u64, u64) {
    let taken = std::time::Instant::now();
    let (b1, i1) = scute_sys::files::dir_usage(content);
    let (b2, i2) = scute_sys::files::dir_usage(snapshots);
    let (bytes, inodes) = (b1 + b2, i1 + i2);
    *usage.lock().unwrap_or_else(|p| p.into_inner()) = Some(UsageSample {
        changes,
        taken,
        bytes,
        inodes,
    });
    (bytes, inodes)
}

/// A layer lock held by a pull; its holder entry goes before the lock does.
struct HeldLock<'a> {
    owner: &'a ImageManager,
    key: String,
    _guard: crate::keyed_lock::KeyedGuard<'a>,
}

impl Drop for HeldLock<'_> {
    fn drop(&mut self) {
        self.owner.holders().remove(&self.key);
    }
}

/// What a pull holds on to; released on drop (also when the pull is cancelled).
struct Lease<'a> {
    owner: &'a ImageManager,
    digests: Vec<Digest>,
}

impl Drop for Lease<'_> {
    fn drop(&mut self) {
        let mut in_flight = self.owner.in_flight.lock().unwrap_or_else(|p| p.into_inner());
        for digest in &self.digests {
            if let Some(pos) = in_flight.iter().position(|d| d == digest) {
                in_flight.swap_remove(pos);
            }
        }
    }
}
