//! OCI image layout directories: blobs, `index.json`, and the manifest and
//! index documents they hold.
//!
//! A layout written by the kit has exactly one entry in `index.json`: either
//! one image manifest (`build`) or one image index / Docker manifest list
//! (`index`) whose children are all in the same blob dir. That one entry is
//! what `push` sends under the tag.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::digest::{sha256_digest, HashingWriter};
use crate::media;
use crate::platform::Platform;

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
    /// Set on the entries of an index, which a puller selects by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform: Option<Platform>,
}

/// An image manifest; OCI and Docker schema 2 share this shape.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    pub media_type: String,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

/// An image index or Docker manifest list; also the shape of `index.json`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub schema_version: u32,
    pub media_type: String,
    pub manifests: Vec<Descriptor>,
}

/// One image manifest as stored in a layout.
#[derive(Debug, Clone)]
pub struct StoredImage {
    /// How the layout (or the parent index) refers to the manifest.
    pub desc: Descriptor,
    pub bytes: Vec<u8>,
    pub manifest: Manifest,
}

/// One index as stored in a layout, with every child it lists.
#[derive(Debug, Clone)]
pub struct StoredIndex {
    pub desc: Descriptor,
    pub bytes: Vec<u8>,
    pub children: Vec<StoredImage>,
}

/// What a layout's single `index.json` entry is.
#[derive(Debug, Clone)]
pub enum Layout {
    Image(StoredImage),
    Index(StoredIndex),
}

impl Descriptor {
    pub fn new(media_type: &str, digest: String, size: u64) -> Self {
        Descriptor {
            media_type: media_type.to_string(),
            digest,
            size,
            platform: None,
        }
    }
}

impl StoredImage {
    /// Config and layers: every blob the manifest needs on the registry first.
    pub fn blobs(&self) -> impl Iterator<Item = &Descriptor> {
        let manifest = &self.manifest;
        manifest.layers.iter().chain(std::iter::once(&manifest.config))
    }
}

/// Path of a blob inside a layout.
pub fn blob_path(layout: &Path, digest: &str) -> Result<PathBuf> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| anyhow!("unsupported digest {digest:?}: want sha256:<64 hex>"))?;
    Ok(layout.join("blobs/sha256").join(hex))
}

pub fn write_blob(layout: &Path, media_type: &str, bytes: &[u8]) -> Result<Descriptor> {
    let digest = sha256_digest(bytes);
    let path = blob_path(layout, &digest)?;
    fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    Ok(Descriptor::new(media_type, digest, bytes.len() as u64))
}

/// Serializes a document (config, manifest, index) into a blob.
pub fn write_json_blob<T: Serialize>(layout: &Path, media_type: &str, value: &T) -> Result<Descriptor> {
    let bytes = serde_json::to_vec(value).with_context(|| format!("encoding {media_type}"))?;
    write_blob(layout, media_type, &bytes)
}

/// Writes a blob whose digest is known only at the end (a layer): to a temp
/// name in the blob dir first, then renamed to its digest. Returns what
/// `write` returns too.
pub fn write_streamed_blob<T, F>(layout: &Path, media_type: &str, write: F) -> Result<(Descriptor, T)>
where
    F: FnOnce(&mut dyn Write) -> Result<T>,
{
    let tmp = layout.join("blobs/sha256/blob.tmp");
    let file = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut hashing = HashingWriter::new(BufWriter::new(file));
    let value = write(&mut hashing)?;
    let (buffered, digest, size) = hashing.finish();
    let file = buffered
        .into_inner()
        .map_err(|e| e.into_error())
        .with_context(|| format!("writing {}", tmp.display()))?;
    file.sync_all().with_context(|| format!("syncing {}", tmp.display()))?;
    let path = blob_path(layout, &digest)?;
    fs::rename(&tmp, &path).with_context(|| format!("renaming blob to {}", path.display()))?;
    Ok((Descriptor::new(media_type, digest, size), value))
}

/// Reads a blob and checks its size and digest against the descriptor.
pub fn read_blob(layout: &Path, desc: &Descriptor) -> Result<Vec<u8>> {
    let path = blob_path(layout, &desc.digest)?;
    let bytes = fs::read(&path).with_context(|| format!("reading blob {}", path.display()))?;
    check_blob(desc, bytes.len() as u64, &sha256_digest(&bytes))?;
    Ok(bytes)
}

/// Copies a blob between layouts, checking it on the way (a corrupt child
/// layout fails here rather than at the registry).
pub fn copy_blob(from: &Path, to: &Path, desc: &Descriptor) -> Result<()> {
    let src = blob_path(from, &desc.digest)?;
    let dst = blob_path(to, &desc.digest)?;
    if dst.exists() {
        return Ok(()); // Shared by two children; already copied and checked.
    }
    let mut input = File::open(&src).with_context(|| format!("opening {}", src.display()))?;
    let tmp = to.join("blobs/sha256/copy.tmp");
    let output = File::create(&tmp).with_context(|| format!("creating {}", tmp.display()))?;
    let mut hashing = HashingWriter::new(BufWriter::new(output));
    io::copy(&mut input, &mut hashing).with_context(|| format!("copying {}", src.display()))?;
    let (mut buffered, digest, size) = hashing.finish();
    buffered.flush().with_context(|| format!("writing {}", tmp.display()))?;
    check_blob(desc, size, &digest)?;
    fs::rename(&tmp, &dst).with_context(|| format!("renaming to {}", dst.display()))
}

fn check_blob(desc: &Descriptor, size: u64, digest: &str) -> Result<()> {
    if size != desc.size {
        bail!("blob {}: size {size} but descriptor says {}", desc.digest, desc.size);
    }
    if digest != desc.digest {
        bail!("blob {}: content hashes to {digest}", desc.digest);
    }
    Ok(())
}

/// Writes a layout into a staging dir next to `out` and then moves it into
/// place, so `out` never holds a half-written image or blobs of an older
/// build. An existing `out` is replaced only if it is empty or a layout.
pub fn write_atomically<T, F>(out: &Path, write: F) -> Result<T>
where
    F: FnOnce(&Path) -> Result<T>,
{
    let staging = staging_dir(out)?;
    let result = write(&staging).and_then(|value| {
        replace_dir(&staging, out)?;
        Ok(value)
    });
    if result.is_err() {
        let _ = fs::remove_dir_all(&staging);
    }
    result
}

/// Writes `index.json` pointing at `top`, and the `oci-layout` marker.
pub fn write_layout_files(layout: &Path, top: &Descriptor) -> Result<()> {
    let index = Index {
        schema_version: 2,
        media_type: media::OCI_INDEX.to_string(),
        manifests: vec![top.clone()],
    };
    write_json_file(&layout.join("index.json"), &index)?;
    write_json_file(
        &layout.join("oci-layout"),
        &serde_json::json!({ "imageLayoutVersion": "1.0.0" }),
    )
}

fn staging_dir(out: &Path) -> Result<PathBuf> {
    let name = out
        .file_name()
        .ok_or_else(|| anyhow!("--out {}: needs a final path component", out.display()))?;
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    fs::create_dir_all(&parent).with_context(|| format!("creating {}", parent.display()))?;
    let mut staging_name = std::ffi::OsString::from(".");
    staging_name.push(name);
    staging_name.push(format!(".tmp-{}", std::process::id()));
    let staging = parent.join(staging_name);
    if staging.exists() {
        fs::remove_dir_all(&staging).with_context(|| format!("removing stale {}", staging.display()))?;
    }
    fs::create_dir_all(staging.join("blobs/sha256")).with_context(|| format!("creating {}", staging.display()))?;
    Ok(staging)
}

fn replace_dir(staging: &Path, out: &Path) -> Result<()> {
    match fs::symlink_metadata(out) {
        Ok(meta) => {
            let is_layout = meta.is_dir() && out.join("oci-layout").is_file();
            let is_empty = meta.is_dir()
                && fs::read_dir(out)
                    .with_context(|| format!("listing {}", out.display()))?
                    .next()
                    .is_none();
            if !is_layout && !is_empty {
                bail!(
                    "refusing to replace {}: it exists and is neither empty nor an OCI image layout",
                    out.display()
                );
            }
            fs::remove_dir_all(out).with_context(|| format!("removing old {}", out.display()))?;
        }
        Err(err) if err.kind() == io::ErrorKind::NotFound => {}
        Err(err) => return Err(err).with_context(|| format!("stat {}", out.display())),
    }
    fs::rename(staging, out).with_context(|| format!("moving {} to {}", staging.display(), out.display()))
}

fn write_json_file<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut bytes = serde_json::to_vec(value).context("encoding JSON")?;
    bytes.push(b'\n');
    fs::write(path, bytes).with_context(|| format!("writing {}", path.display()))
}

/// Reads the one entry of a layout's `index.json` and everything it refers to.
pub fn read_layout(layout: &Path) -> Result<Layout> {
    let index_path = layout.join("index.json");
    let bytes = fs::read(&index_path).with_context(|| format!("reading {}", index_path.display()))?;
    let index: Index = serde_json::from_slice(&bytes).with_context(|| format!("parsing {}", index_path.display()))?;
    let [entry] = index.manifests.as_slice() else {
        bail!(
            "{}: want exactly one entry, found {}",
            index_path.display(),
            index.manifests.len()
        );
    };
    if media::is_manifest(&entry.media_type) {
        Ok(Layout::Image(read_image(layout, entry)?))
    } else if media::is_index(&entry.media_type) {
        Ok(Layout::Index(read_index(layout, entry)?))
    } else {
        bail!(
            "{}: unsupported media type {:?}",
            index_path.display(),
            entry.media_type
        )
    }
}

fn read_image(layout: &Path, desc: &Descriptor) -> Result<StoredImage> {
    let bytes = read_blob(layout, desc)?;
    let manifest: Manifest =
        serde_json::from_slice(&bytes).with_context(|| format!("parsing manifest {}", desc.digest))?;
    check_media_type(desc, &manifest.media_type)?;
    Ok(StoredImage {
        desc: desc.clone(),
        bytes,
        manifest,
    })
}

fn read_index(layout: &Path, desc: &Descriptor) -> Result<StoredIndex> {
    let bytes = read_blob(layout, desc)?;
    let index: Index = serde_json::from_slice(&bytes).with_context(|| format!("parsing index {}", desc.digest))?;
    check_media_type(desc, &index.media_type)?;
    let mut children = Vec::with_capacity(index.manifests.len());
    for child in &index.manifests {
        // The kit writes flat indexes only; nesting would need a recursive push.
        if !media::is_manifest(&child.media_type) {
            bail!(
                "index {}: entry {} has media type {:?}, want an image manifest",
                desc.digest,
                child.digest,
                child.media_type
            );
        }
        children.push(read_image(layout, child)?);
    }
    Ok(StoredIndex {
        desc: desc.clone(),
        bytes,
        children,
    })
}

/// The registry is sent the descriptor's media type as Content-Type; a
/// document saying otherwise would be rejected there, so catch it here.
fn check_media_type(desc: &Descriptor, in_document: &str) -> Result<()> {
    if desc.media_type != in_document {
        bail!(
            "{}: descriptor says {:?} but the document says {:?}",
            desc.digest,
            desc.media_type,
            in_document
        );
    }
    Ok(())
}
