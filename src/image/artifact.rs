//! OCI artifacts (image-spec 1.1: a manifest with an `artifactType`, or a config that is not an
//! image config), pulled so that image volumes can mount them as CRI-O does: each layer is one
//! file, named by its `org.opencontainers.image.title` annotation (its digest's hex without
//! one), in a single snapshot. Layers are files whatever their media type: a tarball stays a
//! tarball. An artifact is no runnable image: CreateContainer refuses it as a container's image.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::sync::Arc;

use bytes::Bytes;
use futures_util::StreamExt;
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use tokio::sync::mpsc;

use super::content::ContentStore;
use super::disk_reserve::{is_disk_full, Metered};
use super::progress::PullState;

use super::registry::{Remote, Resolved};
use super::{ImageManager, PullError};
use crate::distribution::digest::Digest;
use crate::distribution::reference::ImageRef;
use crate::image::record::{ArtifactFile, ImageConfig, ImageRecord, LayerRecord};
use crate::snapshot::SnapshotRecord;

const TITLE: &str = "org.opencontainers.image.title";
/// Image configs (OCI and Docker): any other config media type makes the manifest an artifact.
const IMAGE_CONFIGS: &[&str] = &[
    "application/vnd.oci.image.config.v1+json",
    "application/vnd.docker.container.image.v1+json",
];
/// Hostile input: an artifact may not hold more files, or more bytes, than this.
const MAX_FILES: usize = 1024;
const MAX_BYTES: u64 = 16 << 30;

/// Whether `manifest` is an artifact rather than an image.
pub(crate) fn is_artifact(manifest: &OciImageManifest) -> bool {
    manifest.artifact_type.is_some() || !IMAGE_CONFIGS.contains(&manifest.config.media_type.as_str())
}

/// The file name a layer gets: its title when that is one plain path component.
fn file_name(layer: &OciDescriptor, digest: &Digest) -> Result<String, PullError> {
    let title = layer.annotations.as_ref().and_then(|a| a.get(TITLE));
    match title {
        None => Ok(digest.hex().to_string()),
        Some(t) if !t.is_empty() && t.len() <= 255 && !t.contains(['/', '\0']) && t != "." && t != ".." => {
            Ok(t.clone())
        }
        Some(t) => Err(PullError::Integrity(format!(
            "artifact layer {digest} has title {t:?}, which is not a plain file name"
        ))),
    }
}

impl ImageManager {
    /// Pulls artifact `manifest` (resolved from `image`): its files into the content store,
    /// verified, then into one snapshot; answers its record, the manifest digest as its ID.
    pub(super) async fn pull_artifact(
        &self,
        remote: &Remote,
        image: &ImageRef,
        resolved: &Resolved,
        manifest: &OciImageManifest,
        runtime_handler: &str,
        progress: &Arc<PullState>,
    ) -> Result<ImageRecord, PullError> {
        if manifest.layers.len() > MAX_FILES {
            return Err(PullError::Unsupported(format!(
                "artifact of {} files (at most {MAX_FILES})",
                manifest.layers.len()
            )));
        }
        let mut files = Vec::with_capacity(manifest.layers.len());
        let (mut names, mut total) = (HashSet::new(), 0u64);
        for layer in &manifest.layers {
            let digest = Digest::parse(&layer.digest).map_err(|e| PullError::Integrity(e.to_string()))?;
            let size = u64::try_from(layer.size)
                .map_err(|_| PullError::Integrity(format!("artifact layer {digest} has a negative size")))?;
            total = total.saturating_add(size);
            if total > MAX_BYTES {
                return Err(PullError::Unsupported(format!(
                    "artifact of more than {MAX_BYTES} bytes"
                )));
            }
            let name = file_name(layer, &digest)?;
            if !names.insert(name.clone()) {
                return Err(PullError::Integrity(format!("artifact has two files named {name:?}")));
            }
            files.push((ArtifactFile { name, digest, size }, layer));
        }
        // The snapshot is the artifact's: keyed by its manifest.
        let chain_id = Digest::of(format!("scute artifact {}", resolved.manifest_digest).as_bytes());
        let mut leased: Vec<Digest> = files.iter().map(|(f, _)| f.digest.clone()).collect();
        leased.extend([resolved.manifest_digest.clone(), chain_id.clone()]);
        leased.extend(resolved.index.iter().map(|(_, d)| d.clone()));
        let _lease = self.lease(leased);

        progress.downloading(total, files.len());
        for (file, layer) in &files {
            if self.content.has(&file.digest) {
                progress.add_bytes(file.size);
            } else {
                self.download_blob(remote, layer, file, progress).await?;
            }
            progress.layer_done();
        }
        progress.committing();
        // One snapshot build at a time (another reference to the same artifact may be pulling).
        let _one_build = self.lock_for_pull(chain_id.as_str(), progress).await;
        // A directory already there keeps the tally recorded with it, if any.
        let tally = if self.snapshots.exists(&chain_id) {
            self.store
                .get::<SnapshotRecord>(chain_id.as_str())
                .ok()
                .flatten()
                .and_then(|r| r.tally)
        } else {
            let io = |e: std::io::Error| match is_disk_full(&e) {
                true => PullError::NoSpace(format!("artifact snapshot {chain_id}: {e}")),
                false => PullError::Remote(format!("artifact snapshot {chain_id}: {e}")),
            };
            let pending = self.snapshots.prepare().map_err(io)?;
            let copies: Vec<_> = files
                .iter()
                .map(|(f, _)| (self.content.blob_path(&f.digest), pending.fs().join(&f.name)))
                .collect();
            // Up to 16 GiB of copying: off the async workers, metered against the disk reserve,
            // each chunk counting as the pull moving.
            let (meter, progress) = (self.disk_reserve.meter(), progress.clone());
            tokio::task::spawn_blocking(move || {
                for (blob, target) in copies {
                    let mut source = Metered {
                        inner: std::fs::File::open(&blob)?,
                        meter: &meter,
                    };
                    let mut out = std::fs::File::create(&target)?;
                    let mut buf = vec![0u8; 1 << 20];
                    loop {
                        let n = source.read(&mut buf)?;
                        if n == 0 {
                            break;
                        }
                        out.write_all(&buf[..n])?;
                        progress.moved();
                    }
                    std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o644))?;
                }
                Ok::<(), std::io::Error>(())
            })
            .await
            .map_err(|e| PullError::Remote(e.to_string()))?
            .map_err(io)?;
            Some(self.snapshots.commit(pending, &chain_id).map_err(io)?)
        };
        let size: u64 = files.iter().map(|(f, _)| f.size).sum();
        self.store
            .put(&SnapshotRecord {
                chain_id: chain_id.clone(),
                parent: None,
                diff_id: chain_id.clone(),
                size,
                tally,
            })
            .map_err(|e| PullError::Remote(format!("recording snapshot {chain_id}: {e}")))?;
        if let Some((index, index_digest)) = &resolved.index {
            self.content
                .write(index, index_digest)
                .map_err(|e| PullError::Remote(e.to_string()))?;
        }
        self.content
            .write(&resolved.manifest, &resolved.manifest_digest)
            .map_err(|e| PullError::Remote(e.to_string()))?;
        let artifact_type = manifest
            .artifact_type
            .clone()
            .unwrap_or_else(|| manifest.config.media_type.clone());
        Ok(ImageRecord {
            id: resolved.manifest_digest.clone(),
            repo_tags: image.repo_tag().into_iter().collect(),
            repo_digests: vec![image.repo_digest(resolved.top_digest())],
            manifest_digest: resolved.manifest_digest.clone(),
            manifest_media_type: resolved.media_type.clone(),
            index_digest: resolved.index_digest(),
            layers: vec![LayerRecord {
                digest: resolved.manifest_digest.clone(),
                diff_id: chain_id.clone(),
                chain_id,
                size,
                media_type: artifact_type.clone(),
            }],
            size,
            config: ImageConfig::default(),
            pinned: false,
            created_at: scute_sys::clock::now_nanos(),
            runtime_handlers: vec![runtime_handler.to_string()],
            artifact: Some(crate::image::record::Artifact {
                artifact_type,
                files: files.into_iter().map(|(f, _)| f).collect(),
            }),
        })
    }

    /// One artifact file into the content store, held to its descriptor's size and verified
    /// against its digest before it is committed.
    async fn download_blob(
        &self,
        remote: &Remote,
        layer: &OciDescriptor,
        file: &ArtifactFile,
        progress: &Arc<PullState>,
    ) -> Result<(), PullError> {
        let _one_download = self.lock_for_pull(file.digest.as_str(), progress).await;
        let Some(ingest) = self.open_ingest(&file.digest).await? else {
            return Ok(()); // another pull committed it meanwhile
        };
        let mut ingest = ingest.truncate().map_err(|e| PullError::Remote(e.to_string()))?;
        let what = format!("artifact file {} ({})", file.name, file.digest);
        let (stream, _) = remote.blob_stream(layer, 0).await?;
        super::registry::check_announced(&stream, 0, file.size, &what)?;

        // Writing and hashing run off the async workers, as a layer's download does.
        let (tx, mut rx) = mpsc::channel::<Bytes>(32);
        let (store, digest, size, label) = (self.content_root.clone(), file.digest.clone(), file.size, what.clone());
        let meter = self.disk_reserve.meter();
        let writer = tokio::task::spawn_blocking(move || {
            let content = ContentStore::open(&store).map_err(|e| PullError::Remote(e.to_string()))?;
            let no_space = |e: &dyn std::fmt::Display| PullError::NoSpace(format!("{label}: {e}"));
            while let Some(chunk) = rx.blocking_recv() {
                if ingest.written() + chunk.len() as u64 > size {
                    return Err(super::registry::more_than_declared(&label, size));
                }
                meter.charge(chunk.len() as u64).map_err(|e| no_space(&e))?;
                ingest
                    .append(chunk)
                    .map_err(|e| match e.io_error().is_some_and(is_disk_full) {
                        true => no_space(&e),
                        false => PullError::Remote(e.to_string()),
                    })?;
            }
            if ingest.written() < size {
                return Err(super::registry::fewer_than_declared(&label, ingest.written(), size));
            }
            ingest
                .commit(&content, &digest)
                .map_err(|e| PullError::Integrity(format!("{label}: {e}")))
        });
        let mut stream = stream.stream;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| PullError::Remote(format!("{what}: {e}")))?;
            crate::metrics::global().pull_bytes(chunk.len() as u64);
            progress.add_bytes(chunk.len() as u64);
            if tx.send(chunk).await.is_err() {
                break; // the writer stopped: its error is answered below
            }
        }
        drop(tx);
        writer.await.map_err(|e| PullError::Remote(e.to_string()))?
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn layer(title: Option<&str>) -> OciDescriptor {
        OciDescriptor {
            media_type: "application/octet-stream".into(),
            digest: Digest::of(b"x").to_string(),
            size: 1,
            annotations: title.map(|t| BTreeMap::from([(TITLE.to_string(), t.to_string())])),
            ..Default::default()
        }
    }

    #[test]
    fn layer_titles_must_be_plain_file_names() {
        let digest = Digest::of(b"x");
        assert_eq!(file_name(&layer(Some("model.bin")), &digest).unwrap(), "model.bin");
        assert_eq!(file_name(&layer(None), &digest).unwrap(), digest.hex());
        for hostile in ["../etc/passwd", "a/b", "..", ".", "", "nul\0"] {
            assert!(
                matches!(file_name(&layer(Some(hostile)), &digest), Err(PullError::Integrity(_))),
                "{hostile:?}"
            );
        }
    }

    #[test]
    fn artifacts_are_told_from_images() {
        let manifest = |config: &str, artifact_type: Option<&str>| OciImageManifest {
            config: OciDescriptor {
                media_type: config.into(),
                ..Default::default()
            },
            artifact_type: artifact_type.map(str::to_string),
            ..Default::default()
        };
        assert!(!is_artifact(&manifest(
            "application/vnd.oci.image.config.v1+json",
            None
        )));
        assert!(!is_artifact(&manifest(
            "application/vnd.docker.container.image.v1+json",
            None
        )));
        assert!(is_artifact(&manifest(
            "application/vnd.oci.empty.v1+json",
            Some("application/x.model")
        )));
        assert!(is_artifact(&manifest("application/vnd.cncf.helm.config.v1+json", None)));
    }
}
