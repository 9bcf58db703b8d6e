//! The embedded pause image: scute's own static pause binary (images/pause, built by build.rs)
//! packaged as a one-layer OCI image and imported at start, so a node runs pods with no registry.
//! The image is built deterministically (fixed mtimes, no gzip name/time), so its ID is stable
//! across starts and matches across nodes running the same scute.

use std::io::Write;

use super::record::{ImageConfig, ImageRecord, LayerRecord};
use super::{ImageError, ImageManager};
use crate::distribution::digest::{chain_ids, Digest};
use crate::snapshot::SnapshotRecord;

/// The name the embedded pause image is imported under (the kubelet 1.36 default sandbox image).
pub const EMBEDDED_PAUSE_IMAGE: &str = "registry.k8s.io/pause:3.10";

static PAUSE_BINARY: &[u8] = include_bytes!(env!("SCUTE_PAUSE_BINARY"));

const LAYER_MEDIA_TYPE: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
/// The nobody user of the upstream pause image.
const PAUSE_USER: &str = "65535:65535";

struct Built {
    layer: Vec<u8>,
    layer_digest: Digest,
    diff_id: Digest,
    config: Vec<u8>,
    config_digest: Digest,
    manifest: Vec<u8>,
    manifest_digest: Digest,
}

fn build() -> std::io::Result<Built> {
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(PAUSE_BINARY.len() as u64);
    header.set_mode(0o755);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    tar.append_data(&mut header, "pause", PAUSE_BINARY)?;
    let tar_bytes = tar.into_inner()?;
    let diff_id = Digest::of(&tar_bytes);
    let mut gz = flate2::GzBuilder::new()
        .mtime(0)
        .write(Vec::new(), flate2::Compression::default());
    gz.write_all(&tar_bytes)?;
    let layer = gz.finish()?;
    let layer_digest = Digest::of(&layer);
    let (os, arch) = super::registry::host_platform();
    let config = serde_json::to_vec(&serde_json::json!({
        "architecture": arch,
        "os": os,
        "config": { "User": PAUSE_USER, "Entrypoint": ["/pause"], "WorkingDir": "/" },
        "rootfs": { "type": "layers", "diff_ids": [diff_id.to_string()] },
        "history": [{ "created_by": "scute embedded pause", "comment": concat!("scute ", env!("CARGO_PKG_VERSION")) }],
    }))?;
    let config_digest = Digest::of(&config);
    let manifest = serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": super::registry::MEDIA_OCI_MANIFEST,
        "config": { "mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest.to_string(), "size": config.len() },
        "layers": [{ "mediaType": LAYER_MEDIA_TYPE, "digest": layer_digest.to_string(), "size": layer.len() }],
    }))?;
    let manifest_digest = Digest::of(&manifest);
    Ok(Built {
        layer,
        layer_digest,
        diff_id,
        config,
        config_digest,
        manifest,
        manifest_digest,
    })
}

impl ImageManager {
    /// Imports the embedded pause image under [`EMBEDDED_PAUSE_IMAGE`] unless that name already
    /// points at an image (a pulled pause is left alone). Cheap when already imported.
    pub async fn import_embedded_pause(&self) -> Result<ImageRecord, ImageError> {
        let built = build()?;
        if let Ok(existing) = self.resolve(EMBEDDED_PAUSE_IMAGE) {
            let intact = existing.layers.iter().all(|l| self.snapshots.exists(&l.chain_id));
            if existing.id != built.config_digest || intact {
                return Ok(existing);
            }
        }
        let chain_id = chain_ids(std::slice::from_ref(&built.diff_id)).remove(0);
        let _lease = self.lease(vec![
            built.layer_digest.clone(),
            built.config_digest.clone(),
            built.manifest_digest.clone(),
            chain_id.clone(),
        ]);
        self.content.write(&built.layer, &built.layer_digest)?;
        self.content.write(&built.config, &built.config_digest)?;
        self.content.write(&built.manifest, &built.manifest_digest)?;
        // A directory already there keeps the tally recorded with it, if any (a directory no
        // record names is left unchecked rather than blessed).
        let tally = if self.snapshots.exists(&chain_id) {
            self.store
                .get::<SnapshotRecord>(chain_id.as_str())?
                .and_then(|r| r.tally)
        } else {
            let pending = self.snapshots.prepare()?;
            super::unpack::unpack_layer(std::io::Cursor::new(&built.layer[..]).pipe_gunzip(), &pending.fs())
                .map_err(|e| ImageError::Io(format!("unpacking the embedded pause image: {e}")))?;
            Some(self.snapshots.commit(pending, &chain_id)?)
        };
        self.store.put(&SnapshotRecord {
            chain_id: chain_id.clone(),
            parent: None,
            diff_id: built.diff_id.clone(),
            size: PAUSE_BINARY.len() as u64,
            tally,
        })?;
        let image_ref = crate::distribution::reference::ImageRef::parse(EMBEDDED_PAUSE_IMAGE)?;
        let record = ImageRecord {
            id: built.config_digest,
            repo_tags: image_ref.repo_tag().into_iter().collect(),
            repo_digests: vec![image_ref.repo_digest(&built.manifest_digest)],
            manifest_digest: built.manifest_digest,
            manifest_media_type: super::registry::MEDIA_OCI_MANIFEST.to_string(),
            index_digest: None,
            layers: vec![LayerRecord {
                digest: built.layer_digest,
                diff_id: built.diff_id,
                chain_id,
                size: built.layer.len() as u64,
                media_type: LAYER_MEDIA_TYPE.to_string(),
            }],
            size: (built.layer.len() + built.config.len()) as u64,
            config: ImageConfig {
                user: PAUSE_USER.to_string(),
                entrypoint: vec!["/pause".to_string()],
                working_dir: "/".to_string(),
                os: "linux".to_string(),
                architecture: super::registry::host_platform().1.to_string(),
                ..ImageConfig::default()
            },
            runtime_handlers: vec![String::new()],
            artifact: None,
            pinned: true,
            created_at: scute_sys::clock::now_nanos(),
        };
        let record = self.commit_record(record).await?;
        tracing::info!(image = EMBEDDED_PAUSE_IMAGE, id = %record.id, "embedded pause image imported");
        Ok(record)
    }
}

trait PipeGunzip: std::io::Read + Sized {
    fn pipe_gunzip(self) -> flate2::read::GzDecoder<Self> {
        flate2::read::GzDecoder::new(self)
    }
}
impl<R: std::io::Read> PipeGunzip for R {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_pause_image_is_deterministic_and_static() {
        let a = build().unwrap();
        let b = build().unwrap();
        assert_eq!(a.config_digest, b.config_digest);
        assert_eq!(a.manifest_digest, b.manifest_digest);
        // A static ELF (64-bit) has no PT_INTERP program header: it needs no dynamic loader.
        let elf = PAUSE_BINARY;
        assert_eq!(&elf[..5], b"\x7fELF\x02");
        let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]) as usize;
        let phoff = u64::from_le_bytes(elf[0x20..0x28].try_into().unwrap()) as usize;
        let (phentsize, phnum) = (u16_at(0x36), u16_at(0x38));
        const PT_INTERP: u32 = 3;
        for i in 0..phnum {
            let at = phoff + i * phentsize;
            let p_type = u32::from_le_bytes(elf[at..at + 4].try_into().unwrap());
            assert_ne!(p_type, PT_INTERP, "pause must be statically linked");
        }
    }
}
