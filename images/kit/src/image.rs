//! Image config and manifest, built from one rootfs directory per layer.
//!
//! The JSON documents are plain serde structs whose maps are BTreeMaps, so the
//! bytes (and therefore the image ID and manifest digest) depend only on the
//! input, never on hash-map order.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{anyhow, bail, Context, Result};
use serde::{Deserialize, Serialize};

use crate::layer::{self, Whiteouts};
use crate::layout::{self, Descriptor, Manifest};
use crate::media::{Compression, Format};
use crate::platform::Platform;

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
    /// The manifest's annotations (a checkpoint image is marked by one).
    pub annotations: BTreeMap<String, String>,
}

/// The OCI image configuration (image-spec config.md).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ImageConfig {
    pub created: String,
    pub architecture: String,
    pub os: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub variant: Option<String>,
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

/// What to build: the layers, in order, and how to write them.
#[derive(Debug, Clone, Default)]
pub struct BuildSpec {
    /// One directory per layer, lowest first.
    pub rootfs: Vec<PathBuf>,
    /// Whiteouts added to the last layer, deleting files of the lower ones.
    pub whiteouts: Whiteouts,
    pub compression: Compression,
    pub format: Format,
    pub platform: Platform,
    pub options: ImageOptions,
}

/// One written layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltLayer {
    /// The manifest's descriptor of the (compressed) blob.
    pub desc: Descriptor,
    /// sha256 of the uncompressed tar (config rootfs.diff_ids).
    pub diff_id: String,
}

/// The digests of a built image.
#[derive(Debug, Clone)]
pub struct BuiltImage {
    pub manifest: Descriptor,
    /// Digest of the config blob: the image ID.
    pub config: Descriptor,
    pub layers: Vec<BuiltLayer>,
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

pub fn image_config(spec: &BuildSpec, layers: &[BuiltLayer]) -> Result<ImageConfig> {
    Ok(ImageConfig {
        created: FIXED_CREATED.to_string(),
        architecture: spec.platform.architecture.clone(),
        os: spec.platform.os.clone(),
        variant: spec.platform.variant.clone(),
        config: spec.options.run_config()?,
        rootfs: RootFs {
            kind: "layers".to_string(),
            diff_ids: layers.iter().map(|l| l.diff_id.clone()).collect(),
        },
        // One entry per layer, all alike: a numbered created_by would change
        // the IDs that single-layer images had before multi-layer builds.
        history: layers
            .iter()
            .map(|_| History {
                created: FIXED_CREATED.to_string(),
                created_by: "scute-imagekit build".to_string(),
            })
            .collect(),
    })
}

/// Builds an image into the OCI image layout directory `out` (replacing a
/// layout that is there).
pub fn build(spec: &BuildSpec, out: &Path) -> Result<BuiltImage> {
    if spec.rootfs.is_empty() {
        bail!("at least one --rootfs is needed");
    }
    spec.options.validate()?;
    let layer_media_type = spec.format.layer(spec.compression)?;
    layout::write_atomically(out, |staging| {
        let layers = write_layers(spec, layer_media_type, staging)?;
        write_image(spec, layers, staging)
    })
}

fn write_layers(spec: &BuildSpec, media_type: &str, layout: &Path) -> Result<Vec<BuiltLayer>> {
    let no_whiteouts = Whiteouts::default();
    let last = spec.rootfs.len() - 1;
    let mut layers = Vec::with_capacity(spec.rootfs.len());
    for (i, rootfs) in spec.rootfs.iter().enumerate() {
        let whiteouts = if i == last { &spec.whiteouts } else { &no_whiteouts };
        let (desc, diff_id) = layout::write_streamed_blob(layout, media_type, |out| {
            layer::write_layer(rootfs, whiteouts, spec.compression, out)
        })
        .with_context(|| format!("layer {} from {}", i + 1, rootfs.display()))?;
        layers.push(BuiltLayer { desc, diff_id });
    }
    Ok(layers)
}

fn write_image(spec: &BuildSpec, layers: Vec<BuiltLayer>, layout: &Path) -> Result<BuiltImage> {
    let config = image_config(spec, &layers)?;
    let config_desc = layout::write_json_blob(layout, spec.format.config(), &config)?;
    let manifest = Manifest {
        schema_version: 2,
        media_type: spec.format.manifest().to_string(),
        config: config_desc.clone(),
        layers: layers.iter().map(|l| l.desc.clone()).collect(),
        annotations: spec.options.annotations.clone(),
    };
    let manifest_desc = layout::write_json_blob(layout, spec.format.manifest(), &manifest)?;
    layout::write_layout_files(layout, &manifest_desc)?;
    Ok(BuiltImage {
        manifest: manifest_desc,
        config: config_desc,
        layers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::{read_blob, read_layout, Layout, StoredImage};
    use crate::media;
    use std::fs;

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
            annotations: BTreeMap::from([("checkpointctl.annotation.checkpoint.name".into(), "c".into())]),
        }
    }

    fn spec(rootfs: &Path, options: ImageOptions) -> BuildSpec {
        BuildSpec {
            rootfs: vec![rootfs.to_path_buf()],
            options,
            ..Default::default()
        }
    }

    fn stored_image(layout: &Path) -> StoredImage {
        match read_layout(layout).unwrap() {
            Layout::Image(image) => image,
            Layout::Index(_) => panic!("{} holds an index", layout.display()),
        }
    }

    fn config_json(layout: &Path, built: &BuiltImage) -> serde_json::Value {
        serde_json::from_slice(&read_blob(layout, &built.config).unwrap()).unwrap()
    }

    #[test]
    fn config_has_the_requested_fields() {
        let root = rootfs();
        let out = tempfile::tempdir().unwrap();
        let layout = out.path().join("img");
        let built = build(&spec(root.path(), options()), &layout).unwrap();

        let json = config_json(&layout, &built);
        assert_eq!(json["architecture"], "amd64");
        assert_eq!(json["os"], "linux");
        assert!(json.get("variant").is_none());
        assert_eq!(json["rootfs"]["type"], "layers");
        assert_eq!(json["rootfs"]["diff_ids"], serde_json::json!([built.layers[0].diff_id]));
        assert_eq!(json["history"].as_array().unwrap().len(), 1);
        let c = &json["config"];
        assert_eq!(c["Entrypoint"], serde_json::json!(["/bin/sh", "-c"]));
        assert_eq!(c["Cmd"], serde_json::json!(["echo hi"]));
        assert_eq!(c["Env"], serde_json::json!(["PATH=/bin", "A=b=c"]));
        assert_eq!(c["User"], "1002");
        assert_eq!(c["WorkingDir"], "/tmp");
        assert_eq!(c["StopSignal"], "SIGQUIT");
        assert_eq!(c["Labels"], serde_json::json!({"a": "1", "b": "2"}));
        assert_eq!(c["ExposedPorts"], serde_json::json!({"53/udp": {}, "80/tcp": {}}));

        // What other OCI tooling parses must accept it too.
        let bytes = read_blob(&layout, &built.config).unwrap();
        let parsed: oci_spec::image::ImageConfiguration = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(parsed.rootfs().diff_ids(), &vec![built.layers[0].diff_id.clone()]);
        let manifest: oci_spec::image::ImageManifest =
            serde_json::from_slice(&read_blob(&layout, &built.manifest).unwrap()).unwrap();
        assert_eq!(manifest.layers()[0].digest().to_string(), built.layers[0].desc.digest);
        assert_eq!(manifest.config().digest().to_string(), built.config.digest);
        let annotations = manifest.annotations().clone().unwrap_or_default();
        assert_eq!(annotations["checkpointctl.annotation.checkpoint.name"], "c");
    }

    #[test]
    fn layout_is_reproducible_and_labels_change_the_id() {
        let root = rootfs();
        let out = tempfile::tempdir().unwrap();
        let a = build(&spec(root.path(), options()), &out.path().join("a")).unwrap();
        let b = build(&spec(root.path(), options()), &out.path().join("b")).unwrap();
        assert_eq!(a.manifest, b.manifest);

        let mut labelled = options();
        labelled.labels.insert("scute.test/name".into(), "other".into());
        let c = build(&spec(root.path(), labelled), &out.path().join("c")).unwrap();
        assert_eq!(a.layers, c.layers);
        assert_ne!(a.config.digest, c.config.digest);

        let image = stored_image(&out.path().join("c"));
        assert_eq!(image.desc, c.manifest);
        assert!(out.path().join("c/oci-layout").is_file());
    }

    #[test]
    fn layers_come_in_rootfs_order_with_whiteouts_on_top() {
        let (one, two, three) = (rootfs(), rootfs(), tempfile::tempdir().unwrap());
        fs::write(two.path().join("bin/two"), b"2").unwrap();
        fs::create_dir(three.path().join("bin")).unwrap();
        let mut spec = spec(one.path(), ImageOptions::default());
        spec.rootfs.push(two.path().to_path_buf());
        spec.rootfs.push(three.path().to_path_buf());
        spec.whiteouts.remove("/bin/true").unwrap();
        let out = tempfile::tempdir().unwrap();
        let layout = out.path().join("img");
        let built = build(&spec, &layout).unwrap();

        assert_eq!(built.layers.len(), 3);
        let image = stored_image(&layout);
        let layer_digests: Vec<_> = image.manifest.layers.iter().map(|l| &l.digest).collect();
        let built_digests: Vec<_> = built.layers.iter().map(|l| &l.desc.digest).collect();
        assert_eq!(layer_digests, built_digests);
        let json = config_json(&layout, &built);
        assert_eq!(json["rootfs"]["diff_ids"].as_array().unwrap().len(), 3);
        assert_eq!(json["history"].as_array().unwrap().len(), 3);

        let top = read_blob(&layout, &built.layers[2].desc).unwrap();
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(&top[..]));
        let paths: Vec<String> = archive
            .entries()
            .unwrap()
            .map(|e| e.unwrap().path().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(paths, ["bin/", "bin/.wh.true"]);
    }

    #[test]
    fn media_types_platform_and_compression_are_honoured() {
        let root = rootfs();
        let out = tempfile::tempdir().unwrap();
        let layout = out.path().join("img");
        let mut docker = spec(root.path(), ImageOptions::default());
        docker.format = Format::Docker;
        docker.compression = Compression::None;
        docker.platform = "linux/arm/v7".parse().unwrap();
        let built = build(&docker, &layout).unwrap();

        let image = stored_image(&layout);
        assert_eq!(image.desc.media_type, media::DOCKER_MANIFEST);
        assert_eq!(image.manifest.media_type, media::DOCKER_MANIFEST);
        assert_eq!(image.manifest.config.media_type, media::DOCKER_CONFIG);
        assert_eq!(image.manifest.layers[0].media_type, media::DOCKER_LAYER_TAR);
        // Uncompressed: the blob is the tar itself.
        assert_eq!(built.layers[0].desc.digest, built.layers[0].diff_id);
        let json = config_json(&layout, &built);
        assert_eq!(
            (&json["os"], &json["architecture"], &json["variant"]),
            (&"linux".into(), &"arm".into(), &"v7".into())
        );

        let mut zstd = spec(root.path(), ImageOptions::default());
        zstd.compression = Compression::Zstd;
        build(&zstd, &layout).unwrap();
        let image = stored_image(&layout);
        assert_eq!(image.manifest.media_type, media::OCI_MANIFEST);
        assert_eq!(image.manifest.layers[0].media_type, media::OCI_LAYER_ZSTD);

        zstd.format = Format::Docker;
        assert!(build(&zstd, &layout).is_err());
    }

    #[test]
    fn rebuild_replaces_a_layout_but_not_other_dirs() {
        let root = rootfs();
        let out = tempfile::tempdir().unwrap();
        let layout = out.path().join("img");
        build(&spec(root.path(), ImageOptions::default()), &layout).unwrap();
        let built = build(&spec(root.path(), options()), &layout).unwrap();
        // Only the new image's three blobs remain.
        assert_eq!(fs::read_dir(layout.join("blobs/sha256")).unwrap().count(), 3);
        assert_eq!(stored_image(&layout).manifest.config, built.config);

        let precious = out.path().join("precious");
        fs::create_dir(&precious).unwrap();
        fs::write(precious.join("keep"), b"").unwrap();
        assert!(build(&spec(root.path(), options()), &precious).is_err());
        assert!(precious.join("keep").exists());
        // A failed build (missing whiteout dir) leaves the old layout alone.
        let mut failing = spec(root.path(), options());
        failing.whiteouts.remove("/no/such").unwrap();
        assert!(build(&failing, &layout).is_err());
        assert_eq!(stored_image(&layout).manifest.config, built.config);
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
        let out = tempfile::tempdir().unwrap();
        assert!(build(&BuildSpec::default(), &out.path().join("x")).is_err());
    }

    #[test]
    fn corrupt_blobs_are_detected() {
        let root = rootfs();
        let out = tempfile::tempdir().unwrap();
        let layout = out.path().join("img");
        let built = build(&spec(root.path(), options()), &layout).unwrap();
        let path = layout::blob_path(&layout, &built.config.digest).unwrap();
        let mut bytes = fs::read(&path).unwrap();
        bytes[0] ^= 1;
        fs::write(&path, bytes).unwrap();
        assert!(read_blob(&layout, &built.config).is_err());
        assert!(layout::blob_path(&layout, "sha256:../../etc").is_err());
    }
}
