//! Image config, manifest and OCI image layout.
//!
//! The JSON documents are plain serde structs whose maps are BTreeMaps, so the
//! bytes (and therefore the image ID and manifest digest) depend only on the
//! input, never on hash-map order.

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::layer::{self, LayerInfo};

pub const MEDIA_TYPE_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_TYPE_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_TYPE_CONFIG: &str = "application/vnd.oci.image.config.v1+json";
pub const MEDIA_TYPE_LAYER_GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

/// `created` of the config and its history: fixed, for reproducible IDs.
const FIXED_CREATED: &str = "1970-01-01T00:00:00Z";

/// What the image runs, as given on the command line.
#[derive(Debug, Clone, Default)]
pub struct ImageOptions {
    pub entrypoint: Option<Vec<String>>,
    pub cmd: Option<Vec<String>>,
    /// `KEY=VALUE` entries, in order.
    pub env: Vec<String>,
    pub user: Option<String>,
    pub workdir: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub stop_signal: Option<String>,
    /// `PORT/PROTO` entries.
    pub exposed_ports: Vec<String>,
}

/// The OCI image configuration (image-spec config.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImageConfig {
    pub created: String,
    pub architecture: String,
    pub os: String,
    pub config: RunConfig,
    pub rootfs: RootFs,
    pub history: Vec<History>,
}

/// The `config` member: defaults for the container process.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "PascalCase")]
pub struct RunConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub exposed_ports: BTreeMap<String, EmptyObject>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entrypoint: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cmd: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub working_dir: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_signal: Option<String>,
}

/// `{}`, the value type of ExposedPorts.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct EmptyObject {}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct RootFs {
    #[serde(rename = "type")]
    pub kind: String,
    pub diff_ids: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct History {
    pub created: String,
    pub created_by: String,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Descriptor {
    pub media_type: String,
    pub digest: String,
    pub size: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Manifest {
    pub schema_version: u32,
    pub media_type: String,
    pub config: Descriptor,
    pub layers: Vec<Descriptor>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct Index {
    pub schema_version: u32,
    pub media_type: String,
    pub manifests: Vec<Descriptor>,
}

/// The digests of a built image.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    pub manifest: Descriptor,
    /// Digest of the config blob: the image ID.
    pub config: Descriptor,
    pub layer: LayerInfo,
}

impl ImageOptions {
    /// Checks the shape of user-supplied values before anything is written.
    pub fn validate(&self) -> Result<()> {
        for kv in &self.env {
            match kv.split_once('=') {
                Some((key, _)) if !key.is_empty() => {}
                _ => bail!("--env {kv:?}: want KEY=VALUE"),
            }
        }
        for port in &self.exposed_ports {
            normalize_port(port)?;
        }
        Ok(())
    }

    fn run_config(&self) -> Result<RunConfig> {
        let mut exposed_ports = BTreeMap::new();
        for port in &self.exposed_ports {
            exposed_ports.insert(normalize_port(port)?, EmptyObject {});
        }
        Ok(RunConfig {
            user: self.user.clone(),
            exposed_ports,
            env: self.env.clone(),
            entrypoint: self.entrypoint.clone(),
            cmd: self.cmd.clone(),
            working_dir: self.workdir.clone(),
            labels: self.labels.clone(),
            stop_signal: self.stop_signal.clone(),
        })
    }
}

/// `80` -> `80/tcp`; `53/udp` stays. Rejects anything else.
pub fn normalize_port(spec: &str) -> Result<String> {
    let (port, proto) = spec.split_once('/').unwrap_or((spec, "tcp"));
    let port: u16 = port
        .parse()
        .ok()
        .filter(|p| *p != 0)
        .ok_or_else(|| anyhow!("--expose {spec:?}: port must be 1-65535"))?;
    let proto = proto.to_ascii_lowercase();
    if !matches!(proto.as_str(), "tcp" | "udp" | "sctp") {
        bail!("--expose {spec:?}: protocol must be tcp, udp or sctp");
    }
    Ok(format!("{port}/{proto}"))
}

pub fn image_config(options: &ImageOptions, layer: &LayerInfo) -> Result<ImageConfig> {
    Ok(ImageConfig {
        created: FIXED_CREATED.to_string(),
        architecture: "amd64".to_string(),
        os: "linux".to_string(),
        config: options.run_config()?,
        rootfs: RootFs {
            kind: "layers".to_string(),
            diff_ids: vec![layer.diff_id.clone()],
        },
        history: vec![History {
            created: FIXED_CREATED.to_string(),
            created_by: "scute-imagekit build".to_string(),
        }],
    })
}

pub fn sha256_digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// Path of a blob inside a layout.
pub fn blob_path(layout: &Path, digest: &str) -> Result<PathBuf> {
    let hex = digest
        .strip_prefix("sha256:")
        .filter(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
        .ok_or_else(|| anyhow!("unsupported digest {digest:?}: want sha256:<64 hex>"))?;
    Ok(layout.join("blobs/sha256").join(hex))
}

fn write_blob(layout: &Path, media_type: &str, bytes: &[u8]) -> Result<Descriptor> {
    let digest = sha256_digest(bytes);
    let path = blob_path(layout, &digest)?;
    fs::write(&path, bytes).with_context(|| format!("writing {}", path.display()))?;
    Ok(Descriptor {
        media_type: media_type.to_string(),
        digest,
        size: bytes.len() as u64,
    })
}

/// Builds an image from `rootfs` into the OCI image layout directory `out`.
///
/// The layout is assembled next to `out` and then moved into place, so `out`
/// never holds a half-written image or blobs of an older build. An existing
/// `out` is replaced only if it is empty or an OCI layout.
pub fn build(rootfs: &Path, out: &Path, options: &ImageOptions) -> Result<BuiltImage> {
    options.validate()?;
    let staging = staging_dir(out)?;
    let result = write_layout(rootfs, &staging, options);
    let built = match result {
        Ok(built) => built,
        Err(err) => {
            let _ = fs::remove_dir_all(&staging);
            return Err(err);
        }
    };
    if let Err(err) = replace_dir(&staging, out) {
        let _ = fs::remove_dir_all(&staging);
        return Err(err);
    }
    Ok(built)
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
        fs::remove_dir_all(&staging)
            .with_context(|| format!("removing stale {}", staging.display()))?;
    }
    fs::create_dir_all(staging.join("blobs/sha256"))
        .with_context(|| format!("creating {}", staging.display()))?;
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
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err).with_context(|| format!("stat {}", out.display())),
    }
    fs::rename(staging, out)
        .with_context(|| format!("moving {} to {}", staging.display(), out.display()))
}

fn write_layout(rootfs: &Path, layout: &Path, options: &ImageOptions) -> Result<BuiltImage> {
    // The layer's digest is known only once it is written: write to a temp
    // name in the blob dir, then rename.
    let blobs = layout.join("blobs/sha256");
    let tmp_layer = blobs.join("layer.tmp");
    let file =
        File::create(&tmp_layer).with_context(|| format!("creating {}", tmp_layer.display()))?;
    let mut writer = BufWriter::new(file);
    let layer = layer::write_layer(rootfs, &mut writer)?;
    let file = writer
        .into_inner()
        .map_err(|e| e.into_error())
        .context("writing layer")?;
    file.sync_all().context("syncing layer")?;
    let layer_path = blob_path(layout, &layer.digest)?;
    fs::rename(&tmp_layer, &layer_path)
        .with_context(|| format!("renaming layer to {}", layer_path.display()))?;

    let config = image_config(options, &layer)?;
    let config_bytes = serde_json::to_vec(&config).context("encoding image config")?;
    let config_desc = write_blob(layout, MEDIA_TYPE_CONFIG, &config_bytes)?;

    let manifest = Manifest {
        schema_version: 2,
        media_type: MEDIA_TYPE_MANIFEST.to_string(),
        config: config_desc.clone(),
        layers: vec![Descriptor {
            media_type: MEDIA_TYPE_LAYER_GZIP.to_string(),
            digest: layer.digest.clone(),
            size: layer.size,
        }],
    };
    let manifest_bytes = serde_json::to_vec(&manifest).context("encoding manifest")?;
    let manifest_desc = write_blob(layout, MEDIA_TYPE_MANIFEST, &manifest_bytes)?;

    let index = Index {
        schema_version: 2,
        media_type: MEDIA_TYPE_INDEX.to_string(),
        manifests: vec![manifest_desc.clone()],
    };
    write_json(&layout.join("index.json"), &index)?;
    write_json(
        &layout.join("oci-layout"),
        &serde_json::json!({ "imageLayoutVersion": "1.0.0" }),
    )?;

    Ok(BuiltImage {
        manifest: manifest_desc,
        config: config_desc,
        layer,
    })
}

fn write_json<T: Serialize>(path: &Path, value: &T) -> Result<()> {
    let mut bytes = serde_json::to_vec(value).context("encoding JSON")?;
    bytes.push(b'\n');
    let mut file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    file.write_all(&bytes)
        .with_context(|| format!("writing {}", path.display()))
}

/// The single image of a layout written by [`build`], as stored.
pub struct LayoutImage {
    pub manifest_bytes: Vec<u8>,
    pub manifest: Manifest,
}

/// Reads and checks the one manifest of an OCI image layout.
pub fn read_layout(layout: &Path) -> Result<LayoutImage> {
    let index_path = layout.join("index.json");
    let index_bytes =
        fs::read(&index_path).with_context(|| format!("reading {}", index_path.display()))?;
    let index: Index = serde_json::from_slice(&index_bytes)
        .with_context(|| format!("parsing {}", index_path.display()))?;
    let [entry] = index.manifests.as_slice() else {
        bail!(
            "{}: want exactly one manifest, found {}",
            index_path.display(),
            index.manifests.len()
        );
    };
    if entry.media_type != MEDIA_TYPE_MANIFEST {
        bail!(
            "{}: unsupported manifest media type {:?}",
            index_path.display(),
            entry.media_type
        );
    }
    let manifest_bytes = read_blob(layout, entry)?;
    let manifest: Manifest = serde_json::from_slice(&manifest_bytes)
        .with_context(|| format!("parsing manifest {}", entry.digest))?;
    Ok(LayoutImage {
        manifest_bytes,
        manifest,
    })
}

/// Reads a blob and checks its size and digest against the descriptor.
pub fn read_blob(layout: &Path, desc: &Descriptor) -> Result<Vec<u8>> {
    let path = blob_path(layout, &desc.digest)?;
    let bytes = fs::read(&path).with_context(|| format!("reading blob {}", path.display()))?;
    if bytes.len() as u64 != desc.size {
        bail!(
            "blob {}: size {} but descriptor says {}",
            desc.digest,
            bytes.len(),
            desc.size
        );
    }
    let actual = sha256_digest(&bytes);
    if actual != desc.digest {
        bail!("blob {}: content hashes to {actual}", desc.digest);
    }
    Ok(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rootfs() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        fs::create_dir(root.path().join("bin")).unwrap();
        fs::write(root.path().join("bin/true"), b"binary").unwrap();
        root
    }

    fn options() -> ImageOptions {
        ImageOptions {
            entrypoint: Some(vec!["/bin/sh".into(), "-c".into()]),
            cmd: Some(vec!["echo hi".into()]),
            env: vec!["PATH=/bin".into(), "A=b=c".into()],
            user: Some("1002".into()),
            workdir: Some("/tmp".into()),
            labels: BTreeMap::from([("b".into(), "2".into()), ("a".into(), "1".into())]),
            stop_signal: Some("SIGQUIT".into()),
            exposed_ports: vec!["80".into(), "53/udp".into()],
        }
    }

    #[test]
    fn config_has_the_requested_fields() {
        let root = rootfs();
        let out = tempfile::tempdir().unwrap();
        let layout = out.path().join("img");
        let built = build(root.path(), &layout, &options()).unwrap();

        let bytes = read_blob(&layout, &built.config).unwrap();
        let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(json["architecture"], "amd64");
        assert_eq!(json["os"], "linux");
        assert_eq!(json["rootfs"]["type"], "layers");
        assert_eq!(
            json["rootfs"]["diff_ids"],
            serde_json::json!([built.layer.diff_id])
        );
        assert_eq!(json["history"].as_array().unwrap().len(), 1);
        let c = &json["config"];
        assert_eq!(c["Entrypoint"], serde_json::json!(["/bin/sh", "-c"]));
        assert_eq!(c["Cmd"], serde_json::json!(["echo hi"]));
        assert_eq!(c["Env"], serde_json::json!(["PATH=/bin", "A=b=c"]));
        assert_eq!(c["User"], "1002");
        assert_eq!(c["WorkingDir"], "/tmp");
        assert_eq!(c["StopSignal"], "SIGQUIT");
        assert_eq!(c["Labels"], serde_json::json!({"a": "1", "b": "2"}));
        assert_eq!(
            c["ExposedPorts"],
            serde_json::json!({"53/udp": {}, "80/tcp": {}})
        );

        // What other OCI tooling parses must accept it too.
        let parsed: oci_spec::image::ImageConfiguration = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            parsed.rootfs().diff_ids(),
            &vec![built.layer.diff_id.clone()]
        );
        let manifest: oci_spec::image::ImageManifest =
            serde_json::from_slice(&read_blob(&layout, &built.manifest).unwrap()).unwrap();
        assert_eq!(
            manifest.layers()[0].digest().to_string(),
            built.layer.digest
        );
        assert_eq!(manifest.config().digest().to_string(), built.config.digest);
    }

    #[test]
    fn layout_is_reproducible_and_labels_change_the_id() {
        let root = rootfs();
        let out = tempfile::tempdir().unwrap();
        let a = build(root.path(), &out.path().join("a"), &options()).unwrap();
        let b = build(root.path(), &out.path().join("b"), &options()).unwrap();
        assert_eq!(a.manifest, b.manifest);

        let mut labelled = options();
        labelled
            .labels
            .insert("scute.test/name".into(), "other".into());
        let c = build(root.path(), &out.path().join("c"), &labelled).unwrap();
        assert_eq!(a.layer, c.layer);
        assert_ne!(a.config.digest, c.config.digest);

        let image = read_layout(&out.path().join("c")).unwrap();
        assert_eq!(sha256_digest(&image.manifest_bytes), c.manifest.digest);
        assert!(out.path().join("c/oci-layout").is_file());
    }

    #[test]
    fn rebuild_replaces_a_layout_but_not_other_dirs() {
        let root = rootfs();
        let out = tempfile::tempdir().unwrap();
        let layout = out.path().join("img");
        build(root.path(), &layout, &ImageOptions::default()).unwrap();
        let built = build(root.path(), &layout, &options()).unwrap();
        // Only the new image's three blobs remain.
        assert_eq!(
            fs::read_dir(layout.join("blobs/sha256")).unwrap().count(),
            3
        );
        assert_eq!(read_layout(&layout).unwrap().manifest.config, built.config);

        let precious = out.path().join("precious");
        fs::create_dir(&precious).unwrap();
        fs::write(precious.join("keep"), b"").unwrap();
        assert!(build(root.path(), &precious, &options()).is_err());
        assert!(precious.join("keep").exists());
        // No staging dir is left behind.
        let leftovers: Vec<_> = fs::read_dir(out.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "{leftovers:?}");
    }

    #[test]
    fn bad_options_are_rejected() {
        assert!(normalize_port("0").is_err());
        assert!(normalize_port("http").is_err());
        assert!(normalize_port("80/icmp").is_err());
        assert_eq!(normalize_port("8080/UDP").unwrap(), "8080/udp");
        let bad_env = ImageOptions {
            env: vec!["=x".into()],
            ..Default::default()
        };
        assert!(bad_env.validate().is_err());
        let no_eq = ImageOptions {
            env: vec!["PATH".into()],
            ..Default::default()
        };
        assert!(no_eq.validate().is_err());
    }

    #[test]
    fn corrupt_blobs_are_detected() {
        let root = rootfs();
        let out = tempfile::tempdir().unwrap();
        let layout = out.path().join("img");
        let built = build(root.path(), &layout, &options()).unwrap();
        let path = blob_path(&layout, &built.config.digest).unwrap();
        let mut bytes = fs::read(&path).unwrap();
        bytes[0] ^= 1;
        fs::write(&path, bytes).unwrap();
        assert!(read_blob(&layout, &built.config).is_err());
        assert!(blob_path(&layout, "sha256:../../etc").is_err());
    }
}
