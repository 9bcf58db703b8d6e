//! Media types of the two manifest families the kit writes: OCI (default) and
//! Docker v2 schema 2, which registries and pullers still meet in the wild.

use std::fmt;
use std::str::FromStr;

use anyhow::{bail, Result};

pub const OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const OCI_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const OCI_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
pub const OCI_LAYER_ZSTD: &str = "application/vnd.oci.image.layer.v1.tar+zstd";
pub const OCI_LAYER_TAR: &str = "application/vnd.oci.image.layer.v1.tar";

pub const DOCKER_MANIFEST_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
pub const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const DOCKER_CONFIG: &str = "application/vnd.docker.container.image.v1+json";
pub const DOCKER_LAYER_GZIP: &str = "application/vnd.docker.image.rootfs.diff.tar.gzip";
/// Not in Docker's own spec, but containerd and distribution know it.
pub const DOCKER_LAYER_TAR: &str = "application/vnd.docker.image.rootfs.diff.tar";

/// Which family of media types an image or index is written with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Oci,
    Docker,
}

/// How layer tars are compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Compression {
    #[default]
    Gzip,
    Zstd,
    None,
}

impl Format {
    pub fn manifest(self) -> &'static str {
        match self {
            Format::Oci => OCI_MANIFEST,
            Format::Docker => DOCKER_MANIFEST,
        }
    }

    pub fn config(self) -> &'static str {
        match self {
            Format::Oci => OCI_CONFIG,
            Format::Docker => DOCKER_CONFIG,
        }
    }

    pub fn index(self) -> &'static str {
        match self {
            Format::Oci => OCI_INDEX,
            Format::Docker => DOCKER_MANIFEST_LIST,
        }
    }

    /// The layer media type; Docker defines none for zstd, so that is refused
    /// rather than inventing one a puller would reject for the wrong reason.
    pub fn layer(self, compression: Compression) -> Result<&'static str> {
        Ok(match (self, compression) {
            (Format::Oci, Compression::Gzip) => OCI_LAYER_GZIP,
            (Format::Oci, Compression::Zstd) => OCI_LAYER_ZSTD,
            (Format::Oci, Compression::None) => OCI_LAYER_TAR,
            (Format::Docker, Compression::Gzip) => DOCKER_LAYER_GZIP,
            (Format::Docker, Compression::None) => DOCKER_LAYER_TAR,
            (Format::Docker, Compression::Zstd) => {
                bail!("Docker media types have no zstd layer type; use OCI media types for zstd")
            }
        })
    }
}

pub fn is_manifest(media_type: &str) -> bool {
    media_type == OCI_MANIFEST || media_type == DOCKER_MANIFEST
}

pub fn is_index(media_type: &str) -> bool {
    media_type == OCI_INDEX || media_type == DOCKER_MANIFEST_LIST
}

impl FromStr for Compression {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "gzip" => Ok(Compression::Gzip),
            "zstd" => Ok(Compression::Zstd),
            "none" => Ok(Compression::None),
            _ => Err(format!("{s:?}: want gzip, zstd or none")),
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Compression::Gzip => "gzip",
            Compression::Zstd => "zstd",
            Compression::None => "none",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_types_per_format() {
        assert_eq!(Format::Oci.layer(Compression::Zstd).unwrap(), OCI_LAYER_ZSTD);
        assert_eq!(Format::Oci.layer(Compression::None).unwrap(), OCI_LAYER_TAR);
        assert_eq!(Format::Docker.layer(Compression::Gzip).unwrap(), DOCKER_LAYER_GZIP);
        assert!(Format::Docker.layer(Compression::Zstd).is_err());
        assert!(is_index(Format::Docker.index()));
        assert!(is_manifest(Format::Docker.manifest()));
        assert!(!is_manifest(OCI_INDEX));
    }

    #[test]
    fn compression_parses_its_own_names() {
        for c in [Compression::Gzip, Compression::Zstd, Compression::None] {
            assert_eq!(c.to_string().parse::<Compression>().unwrap(), c);
        }
        assert!("xz".parse::<Compression>().is_err());
    }
}
