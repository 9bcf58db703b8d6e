//! OCI artifacts (image-spec 1.1): a manifest with an `artifactType`, the empty config, and one
//! layer per file, named by its `org.opencontainers.image.title` annotation — the shape ORAS
//! and Helm push, which image volumes mount as files.

use std::path::{Path, PathBuf};

use anyhow::{anyhow, Context, Result};
use serde_json::json;

use crate::layout::{self, Descriptor};
use crate::media;

/// The empty config every artifact without one of its own points at (image-spec 1.1).
pub const EMPTY_CONFIG: &str = "application/vnd.oci.empty.v1+json";
const TITLE: &str = "org.opencontainers.image.title";

/// Writes an OCI image layout holding an artifact of `files`, each a layer of `media_type`.
pub fn build(files: &[PathBuf], artifact_type: &str, media_type: &str, out: &Path) -> Result<Descriptor> {
    layout::write_atomically(out, |staging| {
        let config = layout::write_blob(staging, EMPTY_CONFIG, b"{}")?;
        let mut layers = Vec::with_capacity(files.len());
        for file in files {
            let name = file
                .file_name()
                .and_then(|n| n.to_str())
                .ok_or_else(|| anyhow!("{}: needs a file name", file.display()))?;
            let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            let desc = layout::write_blob(staging, media_type, &bytes)?;
            layers.push(json!({
                "mediaType": desc.media_type, "digest": desc.digest, "size": desc.size,
                "annotations": {TITLE: name},
            }));
        }
        let manifest = json!({
            "schemaVersion": 2,
            "mediaType": media::OCI_MANIFEST,
            "artifactType": artifact_type,
            "config": {"mediaType": config.media_type, "digest": config.digest, "size": config.size},
            "layers": layers,
        });
        let desc = layout::write_json_blob(staging, media::OCI_MANIFEST, &manifest)?;
        layout::write_layout_files(staging, &desc)?;
        Ok(desc)
    })
}
