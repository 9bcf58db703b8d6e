//! The pull pipeline: resolve the manifest, fetch the config, then for every layer not already
//! unpacked, stream it from the registry into its ingest file while decompressing and unpacking
//! it in the same pass (no second read of the blob), several layers at once. Every layer is
//! verified (compressed digest and diff ID) before its blob and snapshot are committed. The
//! blob is then dropped, unless the configuration or the image (a checkpoint) keeps it, and the
//! pull's snapshots go in place together after one sync: so the disk gets each layer once.
//!
//! A download whose blob is kept is written to its ingest file as it arrives: when it is
//! interrupted (deadline, network), the next pull replays those bytes from disk and asks the
//! registry for the rest with a Range request. One whose blob is dropped once unpacked (the
//! default) is only hashed on its way to the unpacker, and an interrupted one starts over.

use std::io::{self, BufRead, Read};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::{Buf as _, Bytes};
use futures_util::StreamExt;
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use scute_sha256x2::Sha256;
use tokio::sync::{mpsc, Semaphore};

use super::content::{BlobDigest, ContentError, Ingest};
use super::disk_reserve::{is_disk_full, DiskMeter, Metered};
use super::progress::{self, PullState};
use super::record::{ImageConfig, ImageRecord, LayerRecord};
use super::registry::{Credentials, Remote};
use super::unpack::{self, UnpackError};
use super::{ImageError, ImageManager, PullError};
use crate::distribution::digest::{chain_ids, Digest};
use crate::distribution::reference::ImageRef;
use crate::snapshot::SnapshotRecord;

impl ImageManager {
    /// Pulls `reference` and returns its record. Concurrent pulls of one reference run once.
    /// The pull is listed with its progress while it runs and aborted when it stops moving.
    pub async fn pull(
        &self,
        reference: &str,
        credentials: &Credentials,
        runtime_handler: &str,
    ) -> Result<ImageRecord, ImageError> {
        let image = ImageRef::parse(reference)?;
        let _one_pull = self.ref_locks.lock(&image.to_string()).await;
        let pull = self.pulls.begin(&image.to_string());
        let work = self.pull_one(&image, credentials, runtime_handler, &pull.state);
        match progress::watched(&pull.state, self.pull_progress_timeout, work).await {
            Ok(result) => result,
            Err(stalled) => Err(ImageError::Pull {
                image: image.to_string(),
                source: stalled,
            }),
        }
    }

    async fn pull_one(
        &self,
        image: &ImageRef,
        credentials: &Credentials,
        runtime_handler: &str,
        progress: &Arc<PullState>,
    ) -> Result<ImageRecord, ImageError> {
        let image = image.clone();
        let pull_err = |source: PullError| ImageError::Pull {
            image: image.to_string(),
            source,
        };
        let started = Instant::now();
        let in_flight = crate::metrics::global().pull_started();

        let remote = Remote::new(&image, &self.hosts_dir, credentials).map_err(pull_err)?;
        let resolved = remote.resolve().await.map_err(pull_err)?;
        let manifest: OciImageManifest = serde_json::from_slice(&resolved.manifest).map_err(|e| {
            pull_err(PullError::Integrity(format!(
                "manifest is not a valid image manifest: {e}"
            )))
        })?;
        if super::artifact::is_artifact(&manifest) {
            let record = self
                .pull_artifact(&remote, &image, &resolved, &manifest, runtime_handler, progress)
                .await
                .map_err(pull_err)?;
            let record = self.commit_record(record).await?;
            tracing::info!(
                image = %image,
                id = %record.id,
                files = record.artifact.as_ref().map_or(0, |a| a.files.len()),
                bytes = record.size,
                elapsed_ms = started.elapsed().as_millis() as u64,
                "image pulled (an OCI artifact)"
            );
            in_flight.succeeded();
            return Ok(record);
        }
        let config_digest =
            Digest::parse(&manifest.config.digest).map_err(|e| pull_err(PullError::Integrity(e.to_string())))?;

        // Everything this pull may write or reuse is protected from GC until it is recorded.
        let mut leased = vec![resolved.manifest_digest.clone(), config_digest.clone()];
        leased.extend(resolved.index.iter().map(|(_, d)| d.clone()));
        for layer in &manifest.layers {
            leased.extend(Digest::parse(&layer.digest).ok());
        }
        let _lease = self.lease(leased);

        let config_bytes = match self.content.read(&config_digest) {
            Ok(bytes) => bytes,
            Err(_) => {
                let bytes = remote.fetch_small(&manifest.config).await.map_err(pull_err)?;
                self.content.write(&bytes, &config_digest)?;
                bytes
            }
        };
        let config: oci_spec::image::ImageConfiguration = serde_json::from_slice(&config_bytes)
            .map_err(|e| pull_err(PullError::Integrity(format!("image config is not valid: {e}"))))?;
        let diff_ids = config
            .rootfs()
            .diff_ids()
            .iter()
            .map(|d| Digest::parse(d))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| pull_err(PullError::Integrity(e.to_string())))?;
        if diff_ids.len() != manifest.layers.len() {
            return Err(pull_err(PullError::Integrity(format!(
                "manifest has {} layers but the config lists {} diff IDs",
                manifest.layers.len(),
                diff_ids.len()
            ))));
        }
        let chains = chain_ids(&diff_ids);
        let _chain_lease = self.lease(chains.clone());
        // A checkpoint image keeps its layer blob: a restore reads it.
        let keep_blobs = !self.discard_unpacked_layers
            || super::annotated_as_checkpoint(&resolved.manifest)
            || resolved
                .index
                .as_ref()
                .is_some_and(|(index, _)| super::annotated_as_checkpoint(index));

        // All layers at once, bounded by max_concurrent_downloads.
        let limit = Arc::new(Semaphore::new(self.max_concurrent_downloads));
        let mut layers = Vec::with_capacity(manifest.layers.len());
        for (i, descriptor) in manifest.layers.iter().enumerate() {
            let layer = LayerRecord {
                digest: Digest::parse(&descriptor.digest).map_err(|e| pull_err(PullError::Integrity(e.to_string())))?,
                diff_id: diff_ids[i].clone(),
                chain_id: chains[i].clone(),
                size: u64::try_from(descriptor.size).map_err(|_| {
                    pull_err(PullError::Integrity(format!(
                        "layer {} has a negative size",
                        descriptor.digest
                    )))
                })?,
                media_type: descriptor.media_type.clone(),
            };
            let parent = i.checked_sub(1).map(|p| chains[p].clone());
            layers.push((layer, parent, descriptor));
        }
        progress.downloading(layers.iter().map(|(l, _, _)| l.size).sum(), layers.len());
        // Each unpacked layer is handed to `unpacked` as it finishes: the layers that did unpack
        // are committed even when another fails or the pull is cancelled, so a retry starts
        // from them.
        let unpacked = UnpackedLayers::new(self.snapshots.clone(), self.store.clone());
        let jobs = layers.iter().map(|(layer, parent, descriptor)| {
            let (limit, remote, unpacked) = (limit.clone(), &remote, &unpacked);
            async move {
                let _slot = limit.acquire().await.expect("semaphore never closed");
                let layer = self
                    .ensure_layer(remote, descriptor, layer, parent.clone(), keep_blobs, progress)
                    .await?;
                unpacked.add(layer);
                progress.layer_done();
                Ok::<(), PullError>(())
            }
        });
        let failed = futures_util::future::join_all(jobs)
            .await
            .into_iter()
            .find_map(Result::err);
        unpacked.commit().map_err(pull_err)?;
        if let Some(e) = failed {
            return Err(pull_err(e));
        }
        progress.committing();

        if let Some((index, index_digest)) = &resolved.index {
            self.content.write(index, index_digest)?;
        }
        self.content.write(&resolved.manifest, &resolved.manifest_digest)?;

        let size = layers.iter().map(|(l, _, _)| l.size).sum::<u64>() + config_bytes.len() as u64;
        let record = ImageRecord {
            id: config_digest,
            repo_tags: image.repo_tag().into_iter().collect(),
            repo_digests: vec![image.repo_digest(resolved.top_digest())],
            manifest_digest: resolved.manifest_digest.clone(),
            manifest_media_type: resolved.media_type.clone(),
            index_digest: resolved.index_digest(),
            layers: layers.into_iter().map(|(l, _, _)| l).collect(),
            size,
            config: summarize_config(&config),
            pinned: false,
            runtime_handlers: vec![runtime_handler.to_string()],
            artifact: None,
            created_at: scute_sys::clock::now_nanos(),
        };
        let record = self.commit_record(record).await?;
        tracing::info!(
            image = %image,
            id = %record.id,
            layers = record.layers.len(),
            bytes = record.size,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "image pulled"
        );
        in_flight.succeeded();
        Ok(record)
    }

    /// Makes sure the snapshot of one layer exists or is unpacked: already there (None),
    /// unpacked from a blob we have, or downloaded and unpacked in one pass. What it unpacked
    /// is committed with the pull's other layers (`UnpackedLayers`).
    async fn ensure_layer(
        &self,
        remote: &Remote,
        descriptor: &OciDescriptor,
        layer: &LayerRecord,
        parent: Option<Digest>,
        keep_blob: bool,
        progress: &Arc<PullState>,
    ) -> Result<Option<Unpacked>, PullError> {
        let io = |e: io::Error| PullError::Remote(format!("layer {}: {e}", layer.digest));
        if self.layer_ready(layer, keep_blob) {
            progress.add_bytes(layer.size);
            return Ok(None);
        }
        let _one_download = self.lock_for_pull(layer.digest.as_str(), progress).await;
        if self.layer_ready(layer, keep_blob) {
            progress.add_bytes(layer.size);
            return Ok(None);
        }
        // A pull waiting here for another's download of this layer finds it ready only once that
        // pull committed it: until then it unpacks its own copy (the first to commit is kept).
        let pending = self.snapshots.prepare().map_err(io)?;
        let dest = pending.fs();
        let unpacked_bytes = if self.content.has(&layer.digest) {
            let decoder = Decoder::for_media_type(&layer.media_type)?;
            progress.add_bytes(layer.size);
            let blob = self.content.blob_path(&layer.digest);
            let (expected, dest, meter) = (layer.clone(), dest.clone(), self.disk_reserve.meter());
            let progress = progress.clone();
            tokio::task::spawn_blocking(move || {
                let file = std::fs::File::open(&blob).map_err(|e| PullError::Remote(e.to_string()))?;
                let file = io::BufReader::with_capacity(UNPACK_READ, file);
                unpack_verified(file, None, decoder, &dest, &expected, &meter, &progress)
            })
            .await
            .map_err(|e| PullError::Remote(e.to_string()))??
        } else {
            self.download_and_unpack(remote, descriptor, layer, dest, keep_blob, progress)
                .await?
        };
        Ok(Some(Unpacked {
            pending,
            record: SnapshotRecord {
                chain_id: layer.chain_id.clone(),
                parent,
                diff_id: layer.diff_id.clone(),
                size: unpacked_bytes,
                tally: None,
            },
        }))
    }

    pub(super) async fn open_ingest(&self, digest: &Digest) -> Result<Option<Ingest>, PullError> {
        let content = self.content_root.clone();
        let digest = digest.clone();
        tokio::task::spawn_blocking(move || {
            super::content::ContentStore::open(&content).and_then(|c| c.open_ingest(&digest))
        })
        .await
        .map_err(|e| PullError::Remote(e.to_string()))?
        .map_err(|e: ContentError| PullError::Remote(e.to_string()))
    }

    /// The layer's snapshot is in place and recorded (and its blob kept, if the image keeps
    /// its blobs).
    fn layer_ready(&self, layer: &LayerRecord, keep_blob: bool) -> bool {
        self.snapshots.exists(&layer.chain_id)
            && self
                .store
                .get::<SnapshotRecord>(layer.chain_id.as_str())
                .ok()
                .flatten()
                .is_some()
            && (!keep_blob || self.content.has(&layer.digest))
    }

    async fn download_and_unpack(
        &self,
        remote: &Remote,
        descriptor: &OciDescriptor,
        layer: &LayerRecord,
        dest: std::path::PathBuf,
        keep_blob: bool,
        progress: &Arc<PullState>,
    ) -> Result<u64, PullError> {
        let decoder = Decoder::for_media_type(&layer.media_type)?;
        // The download and the unpack both write to the disk the reserve protects.
        let meter = Arc::new(self.disk_reserve.meter());
        let Some(mut ingest) = self.open_ingest(&layer.digest).await? else {
            // Another writer finished this blob while we waited for its lock.
            let blob = self.content.blob_path(&layer.digest);
            let (expected, progress) = (layer.clone(), progress.clone());
            return tokio::task::spawn_blocking(move || {
                let file = std::fs::File::open(&blob).map_err(|e| PullError::Remote(e.to_string()))?;
                let file = io::BufReader::with_capacity(UNPACK_READ, file);
                unpack_verified(file, None, decoder, &dest, &expected, &meter, &progress)
            })
            .await
            .map_err(|e| PullError::Remote(e.to_string()))?;
        };
        if ingest.resumed() >= layer.size {
            // A complete-but-uncommitted or oversized leftover: start over.
            ingest = ingest.truncate().map_err(|e| PullError::Remote(e.to_string()))?;
        }
        if !keep_blob {
            ingest = ingest.hashed_only();
        }
        tracing::debug!(layer = %layer.digest, size = layer.size, offset = ingest.resumed(), "downloading layer");
        let (stream, resumed) = remote.blob_stream(descriptor, ingest.resumed()).await?;
        if ingest.resumed() > 0 && !resumed {
            tracing::debug!(layer = %layer.digest, "registry ignored the Range request; downloading from zero");
            ingest = ingest.truncate().map_err(|e| PullError::Remote(e.to_string()))?;
        } else if resumed {
            tracing::info!(layer = %layer.digest, offset = ingest.resumed(), "resuming layer download");
        }
        // A wrong announced length is refused before any of the body is read; without one, the
        // reader below holds the registry to the descriptor's size.
        let what = format!("layer {}", layer.digest);
        super::registry::check_announced(&stream, ingest.resumed(), layer.size, &what)?;

        let offset = ingest.resumed();
        progress.add_bytes(offset);
        // hyper hands over chunks of up to 408 KiB on a fast link: 8 in flight per layer keep the
        // unpacker fed (as fast as 32 in `cargo bench --bench pull`) and hold 3 MiB, not 13.
        let (tx, rx) = mpsc::channel::<Result<Bytes, String>>(8);
        let store = self.content_root.clone();
        let (expected, worker_progress) = (layer.clone(), progress.clone());
        let worker = tokio::task::spawn_blocking(move || {
            let content = super::content::ContentStore::open(&store).map_err(|e| PullError::Remote(e.to_string()))?;
            let source = DownloadSource {
                replay: None,
                rx,
                ingest,
                limit: expected.size,
                pending: Bytes::new(),
                violation: None,
                interrupted: None,
                what,
                meter,
            };
            let (unpacked, source) = unpack_download(source, decoder, &dest, &expected, &worker_progress)?;
            let checked = if keep_blob {
                source.ingest.commit(&content, &expected.digest)
            } else {
                // Gone before the pull's sync: its bytes need not reach the disk.
                source.ingest.check_and_drop(&expected.digest)
            };
            checked.map_err(|e| PullError::Integrity(format!("layer {}: {e}", expected.digest)))?;
            Ok::<u64, PullError>(unpacked)
        });

        let mut stream = stream.stream;
        let mut done = 0u64;
        // What the current connection delivered, and how many times the layer was picked up.
        let (mut delivered, mut reconnects) = (0u64, 0u32);
        while let Some(chunk) = stream.next().await {
            if let Err(e) = &chunk {
                if offset + done >= layer.size {
                    // Every byte is in: this is the client's own digest check at the end of the
                    // stream. The worker's checks (diff ID, blob digest) decide, with a message
                    // that names what the registry sent (not "download interrupted").
                    tracing::debug!(layer = %layer.digest, error = %e, "error after the whole blob arrived");
                    break;
                }
                // A connection that moved and then broke: the rest is asked for, and the
                // unpacker, still in the middle of the layer, goes on as if nothing happened.
                if delivered > 0 && reconnects < MAX_RECONNECTS {
                    if let Some(rest) = pick_up(remote, descriptor, layer, offset + done, e).await {
                        (stream, delivered) = (rest, 0);
                        reconnects += 1;
                        continue;
                    }
                }
            }
            let message = chunk.map_err(|e| e.to_string());
            let failed = message.is_err();
            if let Ok(bytes) = &message {
                delivered += bytes.len() as u64;
                done += bytes.len() as u64;
                progress.add_bytes(bytes.len() as u64);
                crate::metrics::global().pull_bytes(bytes.len() as u64);
            }
            if tx.send(message).await.is_err() || failed {
                break; // the worker stopped (its error is reported below) or the network failed
            }
        }
        drop(tx);
        worker.await.map_err(|e| PullError::Remote(e.to_string()))?
    }
}

/// How many times one layer's download is picked up after the network cut it, each after a
/// connection that delivered bytes: a registry that always cuts fails the pull, retryable.
const MAX_RECONNECTS: u32 = 8;

/// Asks the registry for the rest of a layer whose download broke off at `at`, as a Range
/// request: only a 206 answer announcing exactly the rest will do (a 200 would start over,
/// which the unpacker, half-way through the layer, cannot). None: the pull fails with `cause`.
async fn pick_up(
    remote: &Remote,
    descriptor: &OciDescriptor,
    layer: &LayerRecord,
    at: u64,
    cause: &io::Error,
) -> Option<futures_util::stream::BoxStream<'static, Result<Bytes, io::Error>>> {
    tracing::info!(layer = %layer.digest, at, size = layer.size, error = %cause, "layer download broke off; asking for the rest");
    let what = format!("layer {}", layer.digest);
    match remote.blob_stream(descriptor, at).await {
        Ok((rest, true)) => match super::registry::check_announced(&rest, at, layer.size, &what) {
            Ok(()) => Some(rest.stream),
            Err(e) => {
                tracing::info!(layer = %layer.digest, error = %e, "the registry's answer to the range is not the rest");
                None
            }
        },
        Ok((_, false)) => {
            tracing::info!(layer = %layer.digest, "the registry would not send the rest (no range answer)");
            None
        }
        Err(e) => {
            tracing::info!(layer = %layer.digest, error = %e, "asking for the rest failed");
            None
        }
    }
}

/// A layer unpacked by this pull, not yet in place.
struct Unpacked {
    pending: crate::snapshot::PendingSnapshot,
    record: SnapshotRecord,
}

/// A pull's unpacked layers, put in place together after one sync of the filesystem and then
/// recorded (a record names only a snapshot whose files are on the disk). Dropped uncommitted
/// (the pull was cancelled), they are committed off the caller's task, as a per-layer commit
/// would have left them: the retry finds them, although their blobs may be gone.
struct UnpackedLayers {
    snapshots: Arc<crate::snapshot::Snapshotter>,
    store: Arc<crate::store::Store>,
    layers: std::sync::Mutex<Vec<Unpacked>>,
}

impl UnpackedLayers {
    fn new(snapshots: Arc<crate::snapshot::Snapshotter>, store: Arc<crate::store::Store>) -> UnpackedLayers {
        UnpackedLayers {
            snapshots,
            store,
            layers: Default::default(),
        }
    }

    fn add(&self, layer: Option<Unpacked>) {
        self.layers.lock().unwrap_or_else(|p| p.into_inner()).extend(layer);
    }

    fn take(&self) -> Vec<Unpacked> {
        std::mem::take(&mut *self.layers.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Blocks for the sync (as the per-layer commit did).
    fn commit(&self) -> Result<(), PullError> {
        Self::put_in_place(&self.snapshots, &self.store, self.take())
    }

    fn put_in_place(
        snapshots: &crate::snapshot::Snapshotter,
        store: &crate::store::Store,
        layers: Vec<Unpacked>,
    ) -> Result<(), PullError> {
        if layers.is_empty() {
            return Ok(());
        }
        let (pendings, mut records): (Vec<_>, Vec<_>) = layers
            .into_iter()
            .map(|u| ((u.pending, u.record.chain_id.clone()), u.record))
            .unzip();
        let tallies = snapshots
            .commit_all(pendings)
            .map_err(|e| PullError::Remote(format!("putting the unpacked layers in place: {e}")))?;
        for (record, tally) in records.iter_mut().zip(tallies) {
            record.tally = Some(tally);
            store
                .put(&*record)
                .map_err(|e| PullError::Remote(format!("recording snapshot {}: {e}", record.chain_id)))?;
        }
        Ok(())
    }
}

impl Drop for UnpackedLayers {
    fn drop(&mut self) {
        let layers = self.take();
        if layers.is_empty() {
            return;
        }
        let (snapshots, store, count) = (self.snapshots.clone(), self.store.clone(), layers.len());
        let commit = move || match Self::put_in_place(&snapshots, &store, layers) {
            Ok(()) => tracing::info!(
                layers = count,
                "kept the layers a cancelled pull finished: a retry does not download them again"
            ),
            Err(e) => tracing::warn!(error = %e, "committing the layers a cancelled pull unpacked"),
        };
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => drop(runtime.spawn_blocking(commit)),
            Err(_) => commit(),
        }
    }
}

/// Reads of a layer blob already on disk (kept, or what an earlier attempt left).
const UNPACK_READ: usize = 128 * 1024;

/// Layer compression, from the descriptor's media type.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Decoder {
    Gzip,
    Zstd,
    Plain,
}

impl Decoder {
    pub(crate) fn for_media_type(media_type: &str) -> Result<Decoder, PullError> {
        match media_type {
            "application/vnd.oci.image.layer.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.diff.tar.gzip"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+gzip"
            | "application/vnd.docker.image.rootfs.foreign.diff.tar.gzip" => Ok(Decoder::Gzip),
            "application/vnd.oci.image.layer.v1.tar+zstd"
            | "application/vnd.oci.image.layer.nondistributable.v1.tar+zstd" => Ok(Decoder::Zstd),
            "application/vnd.oci.image.layer.v1.tar" | "application/vnd.oci.image.layer.nondistributable.v1.tar" => {
                Ok(Decoder::Plain)
            }
            other => Err(PullError::Unsupported(format!("layer media type {other:?}"))),
        }
    }

    /// The uncompressed stream of `compressed`.
    pub(crate) fn reader<'a, R: BufRead + 'a>(self, compressed: R) -> io::Result<Box<dyn Read + 'a>> {
        Ok(match self {
            Decoder::Gzip => Box::new(flate2::bufread::MultiGzDecoder::new(compressed)),
            Decoder::Zstd => Box::new(zstd::stream::read::Decoder::with_buffer(compressed)?),
            Decoder::Plain => Box::new(compressed),
        })
    }
}

/// Bytes of a download as the unpacker reads them: first what an earlier attempt left in the
/// ingest file, then the network chunks, each appended to the ingest file (and hashed) as read.
struct DownloadSource {
    replay: Option<io::BufReader<std::fs::File>>,
    rx: mpsc::Receiver<Result<Bytes, String>>,
    ingest: Ingest,
    /// The descriptor's size: more bytes, or fewer by the end of the stream, fail the pull.
    limit: u64,
    pending: Bytes,
    /// Set when the registry broke the descriptor's size: the pull's error, whatever the
    /// unpacker made of the failed read.
    violation: Option<PullError>,
    /// Set when the download broke off: the archive then looks cut short, which says nothing
    /// of the layer itself, so the pull's error stays retryable.
    interrupted: Option<String>,
    what: String,
    meter: Arc<DiskMeter>,
}

impl DownloadSource {
    fn violate(&mut self, e: PullError) -> io::Error {
        let io = io::Error::other(e.to_string());
        self.violation = Some(e);
        io
    }

    /// Waits for the next network chunk unless one is pending, appending it to the ingest;
    /// leaves nothing pending at the end of the download.
    fn receive(&mut self) -> io::Result<()> {
        while self.pending.is_empty() {
            match self.rx.blocking_recv() {
                None if self.ingest.written() < self.limit => {
                    let e = super::registry::fewer_than_declared(&self.what, self.ingest.written(), self.limit);
                    return Err(self.violate(e));
                }
                None => return Ok(()),
                Some(Err(e)) => {
                    let message = format!("download interrupted: {e}");
                    self.interrupted = Some(message.clone());
                    return Err(io::Error::other(message));
                }
                Some(Ok(chunk)) => {
                    // Refused whole: the ingest never holds more than the descriptor's size.
                    if self.ingest.written() + chunk.len() as u64 > self.limit {
                        let e = super::registry::more_than_declared(&self.what, self.limit);
                        return Err(self.violate(e));
                    }
                    self.meter.charge(chunk.len() as u64)?;
                    if let Err(e) = self.ingest.append(chunk.clone()) {
                        return Err(match e.io_error().filter(|e| is_disk_full(e)) {
                            Some(_) => self.violate(PullError::NoSpace(format!("{}: {e}", self.what))),
                            None => io::Error::other(e),
                        });
                    }
                    self.pending = chunk;
                }
            }
        }
        Ok(())
    }
}

/// The decoder reads the network chunks where they are: no copy into a buffer of its own.
impl io::BufRead for DownloadSource {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if let Some(replay) = &mut self.replay {
            if replay.fill_buf()?.is_empty() {
                self.replay = None;
            }
        }
        if self.replay.is_none() {
            self.receive()?;
            return Ok(&self.pending);
        }
        match &mut self.replay {
            Some(replay) => replay.fill_buf(),
            None => Ok(&[]),
        }
    }

    fn consume(&mut self, n: usize) {
        match &mut self.replay {
            Some(replay) => replay.consume(n),
            None => self.pending.advance(n),
        }
    }
}

impl Read for DownloadSource {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let available = io::BufRead::fill_buf(self)?;
        let n = buf.len().min(available.len());
        buf[..n].copy_from_slice(&available[..n]);
        io::BufRead::consume(self, n);
        Ok(n)
    }
}

fn unpack_download(
    mut source: DownloadSource,
    decoder: Decoder,
    dest: &std::path::Path,
    expected: &LayerRecord,
    progress: &PullState,
) -> Result<(u64, DownloadSource), PullError> {
    if source.ingest.resumed() > 0 {
        let replay = source.ingest.replay().map_err(|e| PullError::Remote(e.to_string()))?;
        source.replay = Some(io::BufReader::with_capacity(UNPACK_READ, replay));
    }
    let meter = source.meter.clone();
    let blob_digest = Some(source.ingest.blob_digest());
    match unpack_verified(&mut source, blob_digest, decoder, dest, expected, &meter, progress) {
        Ok(unpacked) => Ok((unpacked, source)),
        Err(e) => {
            let e = match (source.violation.take(), source.interrupted.take(), e) {
                (Some(violation), _, _) => violation,
                (None, Some(interrupted), PullError::Malformed(_)) => {
                    PullError::Remote(format!("{}: {interrupted}", source.what))
                }
                (None, _, e) => e,
            };
            let resumed = source.ingest.resumed();
            if matches!(e, PullError::NoSpace(_)) {
                // Kept, it would hold the disk at the reserve until a retry.
                source.ingest.discard();
                return Err(e);
            }
            if !source.ingest.saves() && resumed == 0 {
                tracing::debug!(
                    layer = %expected.digest,
                    received = source.ingest.written(),
                    "download cut short, nothing kept (its blob is dropped once unpacked): the next pull starts over"
                );
                source.ingest.discard();
                return Err(e);
            }
            if resumed > 0
                && matches!(
                    e,
                    PullError::Malformed(_) | PullError::Integrity(_) | PullError::Hostile { .. }
                )
            {
                // The bytes may be what a power cut left of the partial download (a tail the
                // disk never got), not the registry's: kept, every retry would resume from them
                // and fail the same way. Dropped, the next pull starts over and judges the layer.
                source.ingest.discard();
                return Err(PullError::Remote(format!(
                    "{}: resumed from a partial download of {resumed} bytes that does not unpack ({e}); \
                     it was discarded and the next pull starts over",
                    source.what
                )));
            }
            Err(e)
        }
    }
}

/// Decompresses and unpacks `compressed` into `dest`, reading it to the end and checking the
/// uncompressed stream against the layer's diff ID. What it unpacks is charged to `meter`.
/// `blob_digest`, for a download, is hashed alongside the diff ID.
fn unpack_verified<R: BufRead>(
    mut compressed: R,
    blob_digest: Option<Arc<Mutex<BlobDigest>>>,
    decoder: Decoder,
    dest: &std::path::Path,
    expected: &LayerRecord,
    meter: &DiskMeter,
    progress: &PullState,
) -> Result<u64, PullError> {
    let layer_err = |e: UnpackError| match e {
        _ if meter.tripped().is_some() => PullError::NoSpace(format!(
            "layer {}: {}",
            expected.digest,
            meter.tripped().unwrap_or_default()
        )),
        UnpackError::Hostile { entry, reason } => PullError::Hostile {
            layer: expected.digest.to_string(),
            reason: format!("{entry}: {reason}"),
        },
        UnpackError::Io { entry, source } if is_disk_full(&source) => {
            PullError::NoSpace(format!("layer {}: writing {entry}: {source}", expected.digest))
        }
        UnpackError::Tar(_) => PullError::Malformed(format!("layer {}: {e}", expected.digest)),
        other => PullError::Remote(format!("layer {}: {other}", expected.digest)),
    };
    let malformed = |what: &str, e: io::Error| {
        PullError::Malformed(format!("layer {}: malformed layer archive: {what}{e}", expected.digest))
    };
    let (stats, diff_id) = {
        let decompressed = decoder.reader(&mut compressed).map_err(|e| malformed("zstd: ", e))?;
        let mut hashing = HashingReader {
            inner: Metered {
                inner: Fill {
                    inner: decompressed,
                    error: None,
                },
                meter,
            },
            hasher: Sha256::new(),
            blob_digest,
            progress,
        };
        let stats = unpack::unpack_layer(&mut hashing, dest).map_err(layer_err)?;
        // The tar end marker may be followed by padding: hash every byte.
        io::copy(&mut hashing, &mut io::sink()).map_err(|e| malformed("after the archive's end: ", e))?;
        (stats, Digest::from_sha256(hashing.hasher.finalize()))
    };
    // And the compressed stream to its end, so the blob digest covers all of it.
    io::copy(&mut compressed, &mut io::sink()).map_err(|e| malformed("after the compressed stream: ", e))?;
    if diff_id != expected.diff_id {
        return Err(PullError::Integrity(format!(
            "layer {} unpacks to {diff_id}, but the image config says {}",
            expected.digest, expected.diff_id
        )));
    }
    Ok(stats.bytes)
}

/// Reads until the caller's buffer is full or the stream ends. A decoder hands out about one
/// input buffer's worth per read (32 KiB for gzip), and each read the unpacker makes becomes one
/// write(2) to the file it unpacks: fewer, larger writes cost the kernel less per byte.
struct Fill<R> {
    inner: R,
    /// An error met after some bytes were read: returned by the next read.
    error: Option<io::Error>,
}

impl<R: Read> Read for Fill<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let mut filled = 0;
        while filled < buf.len() {
            match self.inner.read(&mut buf[filled..]) {
                Ok(0) => break,
                Ok(n) => filled += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if filled == 0 => return Err(e),
                Err(e) => {
                    self.error = Some(e);
                    break;
                }
            }
        }
        Ok(filled)
    }
}

/// The uncompressed layer on its way to the unpacker: hashed for the diff ID, and each read
/// counts as the pull moving (a layer unpacked from a blob on disk receives no bytes).
struct HashingReader<'a, R> {
    inner: R,
    hasher: Sha256,
    /// A download's blob digest, whose waiting bytes are hashed in step with these.
    blob_digest: Option<Arc<Mutex<BlobDigest>>>,
    progress: &'a PullState,
}

impl<R: Read> Read for HashingReader<'_, R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        match &self.blob_digest {
            Some(blob) => blob
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner())
                .hash_with(&mut self.hasher, &buf[..n]),
            None => self.hasher.update(&buf[..n]),
        }
        self.progress.moved();
        Ok(n)
    }
}

pub(crate) fn summarize_config(config: &oci_spec::image::ImageConfiguration) -> ImageConfig {
    let c = config.config().as_ref();
    let strings = |v: Option<&Vec<String>>| v.cloned().unwrap_or_default();
    ImageConfig {
        user: c.and_then(|c| c.user().clone()).unwrap_or_default(),
        env: strings(c.and_then(|c| c.env().as_ref())),
        entrypoint: strings(c.and_then(|c| c.entrypoint().as_ref())),
        cmd: strings(c.and_then(|c| c.cmd().as_ref())),
        working_dir: c.and_then(|c| c.working_dir().clone()).unwrap_or_default(),
        labels: c
            .and_then(|c| c.labels().clone())
            .map(|l| l.into_iter().collect())
            .unwrap_or_default(),
        stop_signal: c.and_then(|c| c.stop_signal().clone()).unwrap_or_default(),
        exposed_ports: strings(c.and_then(|c| c.exposed_ports().as_ref())),
        volumes: strings(c.and_then(|c| c.volumes().as_ref())),
        os: config.os().to_string(),
        architecture: config.architecture().to_string(),
    }
}
