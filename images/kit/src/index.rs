//! Multi-platform images: an OCI image index (or Docker manifest list) over
//! the single images of other layouts, whose blobs are copied in so the new
//! layout is self-contained and `push` needs nothing else.

use std::path::{Path, PathBuf};
use std::str::FromStr;

use anyhow::{bail, Context, Result};

use crate::layout::{self, Descriptor, Index, Layout, StoredImage};
use crate::media::Format;
use crate::platform::Platform;

/// `PLATFORM=LAYOUT`: one child of the index.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexEntry {
    pub platform: Platform,
    pub layout: PathBuf,
}

impl FromStr for IndexEntry {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let (platform, layout) = s
            .split_once('=')
            .filter(|(_, layout)| !layout.is_empty())
            .ok_or_else(|| format!("{s:?}: want OS/ARCH[/VARIANT]=LAYOUT_DIR"))?;
        Ok(IndexEntry {
            platform: platform.parse()?,
            layout: PathBuf::from(layout),
        })
    }
}

/// The digests of a built index.
#[derive(Debug, Clone)]
pub struct BuiltIndex {
    pub index: Descriptor,
    /// The index's entries, in command-line order, platforms set.
    pub children: Vec<Descriptor>,
}

/// Builds an index over `entries` into the layout directory `out`.
///
/// Children keep their own media types: a Docker manifest list over OCI
/// manifests (or the reverse) is odd but legal, and tests may want it.
pub fn build_index(entries: &[IndexEntry], format: Format, out: &Path) -> Result<BuiltIndex> {
    if entries.is_empty() {
        bail!("at least one --manifest is needed");
    }
    layout::write_atomically(out, |staging| {
        let mut children = Vec::with_capacity(entries.len());
        for entry in entries {
            let child = add_child(entry, staging).with_context(|| format!("--manifest {}", entry.layout.display()))?;
            children.push(child);
        }
        let index = Index {
            schema_version: 2,
            media_type: format.index().to_string(),
            manifests: children.clone(),
        };
        let index_desc = layout::write_json_blob(staging, format.index(), &index)?;
        layout::write_layout_files(staging, &index_desc)?;
        Ok(BuiltIndex {
            index: index_desc,
            children,
        })
    })
}

/// Copies one child image's blobs into `staging`; returns its index entry.
fn add_child(entry: &IndexEntry, staging: &Path) -> Result<Descriptor> {
    let image = match layout::read_layout(&entry.layout)? {
        Layout::Image(image) => image,
        Layout::Index(_) => bail!("holds an index; an index entry must be a single image"),
    };
    for blob in image.blobs().chain(std::iter::once(&image.desc)) {
        layout::copy_blob(&entry.layout, staging, blob)?;
    }
    warn_on_platform_mismatch(entry, &image)?;
    Ok(Descriptor {
        platform: Some(entry.platform.clone()),
        ..image.desc
    })
}

/// A child whose config names another platform is allowed (tests can reuse
/// one small image for every platform), but is rarely what a caller meant.
fn warn_on_platform_mismatch(entry: &IndexEntry, image: &StoredImage) -> Result<()> {
    let config_bytes = layout::read_blob(&entry.layout, &image.manifest.config)?;
    // Platform's fields are the config's top-level os/architecture/variant.
    let configured: Platform =
        serde_json::from_slice(&config_bytes).context("reading os/architecture of the config")?;
    if configured != entry.platform {
        eprintln!(
            "scute-imagekit: warning: {} is a {configured} image, listed as {}",
            entry.layout.display(),
            entry.platform
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::image::{self, BuildSpec};
    use crate::layout::{read_blob, StoredIndex};
    use crate::media;
    use std::fs;

    fn build_child(dir: &Path, name: &str, platform: &str, format: Format) -> PathBuf {
        let rootfs = dir.join(format!("{name}-rootfs"));
        fs::create_dir_all(&rootfs).unwrap();
        fs::write(rootfs.join("arch"), platform).unwrap();
        let layout = dir.join(name);
        let spec = BuildSpec {
            rootfs: vec![rootfs],
            platform: platform.parse().unwrap(),
            format,
            ..Default::default()
        };
        image::build(&spec, &layout).unwrap();
        layout
    }

    fn entry(platform: &str, layout: &Path) -> IndexEntry {
        format!("{platform}={}", layout.display()).parse().unwrap()
    }

    fn stored_index(layout: &Path) -> StoredIndex {
        match layout::read_layout(layout).unwrap() {
            Layout::Index(index) => index,
            Layout::Image(_) => panic!("{} holds an image", layout.display()),
        }
    }

    #[test]
    fn index_lists_children_with_platforms_and_holds_their_blobs() {
        let dir = tempfile::tempdir().unwrap();
        let amd64 = build_child(dir.path(), "amd64", "linux/amd64", Format::Oci);
        let arm64 = build_child(dir.path(), "arm64", "linux/arm64/v8", Format::Oci);
        let out = dir.path().join("index");
        let entries = [entry("linux/amd64", &amd64), entry("linux/arm64/v8", &arm64)];
        let built = build_index(&entries, Format::Oci, &out).unwrap();

        let index = stored_index(&out);
        assert_eq!(index.desc, built.index);
        assert_eq!(index.desc.media_type, media::OCI_INDEX);
        assert_eq!(index.children.len(), 2);
        let platforms: Vec<String> = index
            .children
            .iter()
            .map(|c| c.desc.platform.as_ref().unwrap().to_string())
            .collect();
        assert_eq!(platforms, ["linux/amd64", "linux/arm64/v8"]);
        // Every blob of every child is readable (and checked) in the new layout.
        for child in &index.children {
            for blob in child.blobs() {
                read_blob(&out, blob).unwrap();
            }
        }
        // Other OCI tooling reads the index with its platforms.
        let parsed: oci_spec::image::ImageIndex = serde_json::from_slice(&index.bytes).unwrap();
        let arm = parsed.manifests()[1].platform().as_ref().unwrap();
        assert_eq!(arm.architecture().to_string(), "arm64");
        assert_eq!(arm.variant().as_deref(), Some("v8"));

        // Same inputs, same index digest.
        let again = build_index(&entries, Format::Oci, &dir.path().join("again")).unwrap();
        assert_eq!(again.index, built.index);
    }

    #[test]
    fn docker_manifest_list_over_docker_images() {
        let dir = tempfile::tempdir().unwrap();
        let amd64 = build_child(dir.path(), "amd64", "linux/amd64", Format::Docker);
        let out = dir.path().join("list");
        build_index(&[entry("linux/amd64", &amd64)], Format::Docker, &out).unwrap();
        let index = stored_index(&out);
        assert_eq!(index.desc.media_type, media::DOCKER_MANIFEST_LIST);
        assert_eq!(index.children[0].desc.media_type, media::DOCKER_MANIFEST);
        let json: serde_json::Value = serde_json::from_slice(&index.bytes).unwrap();
        assert_eq!(json["mediaType"], media::DOCKER_MANIFEST_LIST);
        assert_eq!(json["manifests"][0]["platform"]["os"], "linux");
    }

    #[test]
    fn bad_entries_are_rejected() {
        assert!("linux/amd64".parse::<IndexEntry>().is_err());
        assert!("linux/amd64=".parse::<IndexEntry>().is_err());
        assert!("amd64=/x".parse::<IndexEntry>().is_err());
        let dir = tempfile::tempdir().unwrap();
        assert!(build_index(&[], Format::Oci, &dir.path().join("i")).is_err());
        let missing = entry("linux/amd64", &dir.path().join("missing"));
        assert!(build_index(&[missing], Format::Oci, &dir.path().join("i")).is_err());

        // An index cannot be a child: the kit writes flat indexes only.
        let child = build_child(dir.path(), "c", "linux/amd64", Format::Oci);
        let inner = dir.path().join("inner");
        build_index(&[entry("linux/amd64", &child)], Format::Oci, &inner).unwrap();
        let nested = build_index(&[entry("linux/amd64", &inner)], Format::Oci, &dir.path().join("o"));
        assert!(nested.is_err());
    }
}
