//! scute-imagekit: builds OCI (or Docker schema 2) images and multi-platform
//! indexes from root filesystem directories and pushes them to a registry.
//! Fills the local test registry (images/build.sh) and makes the images of
//! the image-pull tests and benchmarks; not part of the runtime.

mod artifact;
mod digest;
mod genrootfs;
mod image;
mod index;
mod layer;
mod layout;
mod media;
mod platform;
mod push;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Parser, Subcommand};
use oci_client::secrets::RegistryAuth;

use crate::index::IndexEntry;
use crate::layer::Whiteouts;
use crate::media::{Compression, Format};
use crate::platform::Platform;

#[derive(Parser)]
#[command(name = "scute-imagekit", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once per run: the size of the variants does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// Write an OCI image layout holding one image: one reproducible layer per --rootfs.
    Build(BuildArgs),
    /// Write an OCI image layout holding an image index over images of other layouts.
    Index(IndexArgs),
    /// Write a directory of pseudo-random (incompressible) files, to use as a --rootfs.
    GenRootfs(GenRootfsArgs),
    /// Push the image or index of an OCI image layout to a registry.
    Push(PushArgs),
    /// Write an OCI image layout holding an artifact: one layer per --file, the empty config.
    Artifact(ArtifactArgs),
}

#[derive(clap::Args)]
struct ArtifactArgs {
    /// A file that becomes one layer, titled with its file name (repeatable).
    #[arg(long, required = true)]
    file: Vec<PathBuf>,
    /// The manifest's artifactType.
    #[arg(long, default_value = "application/vnd.scute.test.artifact")]
    artifact_type: String,
    /// The layers' media type.
    #[arg(long, default_value = "application/octet-stream")]
    media_type: String,
    /// OCI image layout directory to write (replaced if it already is one).
    #[arg(long)]
    out: PathBuf,
}

#[derive(clap::Args)]
struct BuildArgs {
    /// Directory whose contents become one layer (repeatable: the first is the lowest layer).
    #[arg(long, required = true)]
    rootfs: Vec<PathBuf>,
    /// OCI image layout directory to write (replaced if it already is one).
    #[arg(long)]
    out: PathBuf,
    /// Delete PATH of the lower layers: adds a `.wh.NAME` entry to the last layer
    /// (repeatable). PATH's directory must exist in the last --rootfs.
    #[arg(long, value_name = "PATH")]
    whiteout: Vec<String>,
    /// Hide everything lower layers have in DIR: adds `DIR/.wh..wh..opq` to the last
    /// layer (repeatable). DIR must exist in the last --rootfs.
    #[arg(long, value_name = "DIR")]
    opaque: Vec<String>,
    /// Layer compression: gzip, zstd or none.
    #[arg(long, default_value_t = Compression::Gzip)]
    compression: Compression,
    /// Docker v2 schema 2 media types (manifest, config, layers) instead of OCI.
    #[arg(long)]
    docker_media_types: bool,
    /// OS/ARCH[/VARIANT] written into the image config.
    #[arg(long, default_value = "linux/amd64")]
    platform: Platform,
    /// Entrypoint as a JSON array, e.g. '["/pause"]'.
    #[arg(long, value_name = "JSON")]
    entrypoint: Option<String>,
    /// Cmd as a JSON array, e.g. '["sh"]'.
    #[arg(long, value_name = "JSON")]
    cmd: Option<String>,
    /// Environment variable KEY=VALUE (repeatable).
    #[arg(long, value_name = "KEY=VALUE")]
    env: Vec<String>,
    /// User (name, uid, uid:gid, ...).
    #[arg(long)]
    user: Option<String>,
    /// Working directory.
    #[arg(long)]
    workdir: Option<String>,
    /// Label KEY=VALUE (repeatable); gives otherwise identical images distinct IDs.
    #[arg(long, value_name = "KEY=VALUE")]
    label: Vec<String>,
    /// Manifest annotation KEY=VALUE (repeatable), e.g. the one that marks a checkpoint image.
    #[arg(long, value_name = "KEY=VALUE")]
    annotation: Vec<String>,
    /// Stop signal, e.g. SIGQUIT.
    #[arg(long)]
    stop_signal: Option<String>,
    /// Exposed port PORT[/tcp|udp|sctp] (repeatable).
    #[arg(long, value_name = "PORT/PROTO")]
    expose: Vec<String>,
}

#[derive(clap::Args)]
struct IndexArgs {
    /// OCI image layout directory to write (replaced if it already is one).
    #[arg(long)]
    out: PathBuf,
    /// An entry: the single image of layout LAYOUT_DIR (written by `build`), listed
    /// for platform OS/ARCH[/VARIANT] (repeatable, kept in order).
    #[arg(long, required = true, value_name = "OS/ARCH[/VARIANT]=LAYOUT_DIR")]
    manifest: Vec<IndexEntry>,
    /// Write a Docker manifest list instead of an OCI image index.
    #[arg(long)]
    docker_media_types: bool,
}

#[derive(clap::Args)]
struct GenRootfsArgs {
    /// Directory to fill; created if missing, must be empty otherwise.
    #[arg(long)]
    out: PathBuf,
    /// Number of files (file-000000, file-000001, ...).
    #[arg(long)]
    files: u64,
    /// Total size in bytes; K, M or G suffixes are powers of 1024.
    #[arg(long, value_name = "BYTES", value_parser = parse_size)]
    size: u64,
    /// Content seed: the same seed gives the same bytes. Use one per layer.
    #[arg(long, default_value_t = 0)]
    seed: u64,
}

#[derive(clap::Args)]
struct PushArgs {
    /// OCI image layout written by `build`.
    #[arg(long)]
    layout: PathBuf,
    /// Target reference HOST[:PORT]/repo/name:tag.
    #[arg(long, value_name = "REFERENCE")]
    to: String,
    /// Push the same manifest under this tag too (repeatable).
    #[arg(long, value_name = "TAG")]
    also_tag: Vec<String>,
    /// Talk plain HTTP instead of HTTPS (loopback test registries).
    #[arg(long)]
    plain_http: bool,
    /// User for HTTP basic auth (registry.sh start --htpasswd).
    #[arg(long, requires = "password")]
    username: Option<String>,
    /// Password for HTTP basic auth.
    #[arg(long, requires = "username")]
    password: Option<String>,
}

/// `1048576`, `1024K`, `1M`, `1G`.
fn parse_size(value: &str) -> Result<u64, String> {
    let (digits, multiplier) = match value.char_indices().last() {
        Some((i, 'K' | 'k')) => (&value[..i], 1u64 << 10),
        Some((i, 'M' | 'm')) => (&value[..i], 1 << 20),
        Some((i, 'G' | 'g')) => (&value[..i], 1 << 30),
        _ => (value, 1),
    };
    digits
        .parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(multiplier))
        .ok_or_else(|| format!("{value:?}: want a byte count such as 10485760 or 10M"))
}

fn parse_json_array(flag: &str, value: &str) -> Result<Vec<String>> {
    serde_json::from_str(value).with_context(|| format!("--{flag} {value:?}: want a JSON array of strings"))
}

fn parse_pairs(flag: &str, pairs: &[String]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for label in pairs {
        let (key, value) = label
            .split_once('=')
            .filter(|(key, _)| !key.is_empty())
            .ok_or_else(|| anyhow!("--{flag} {label:?}: want KEY=VALUE"))?;
        out.insert(key.to_string(), value.to_string());
    }
    Ok(out)
}

fn image_options(args: &BuildArgs) -> Result<image::ImageOptions> {
    Ok(image::ImageOptions {
        entrypoint: args
            .entrypoint
            .as_deref()
            .map(|v| parse_json_array("entrypoint", v))
            .transpose()?,
        cmd: args.cmd.as_deref().map(|v| parse_json_array("cmd", v)).transpose()?,
        env: args.env.clone(),
        user: args.user.clone(),
        workdir: args.workdir.clone(),
        labels: parse_pairs("label", &args.label)?,
        annotations: parse_pairs("annotation", &args.annotation)?,
        stop_signal: args.stop_signal.clone(),
        exposed_ports: args.expose.clone(),
    })
}

fn whiteouts(args: &BuildArgs) -> Result<Whiteouts> {
    let mut whiteouts = Whiteouts::default();
    for path in &args.whiteout {
        whiteouts.remove(path)?;
    }
    for dir in &args.opaque {
        whiteouts.opaque(dir)?;
    }
    Ok(whiteouts)
}

fn format(docker_media_types: bool) -> Format {
    if docker_media_types {
        Format::Docker
    } else {
        Format::Oci
    }
}

fn run_build(args: BuildArgs) -> Result<()> {
    let spec = image::BuildSpec {
        options: image_options(&args)?,
        whiteouts: whiteouts(&args)?,
        compression: args.compression,
        format: format(args.docker_media_types),
        platform: args.platform,
        rootfs: args.rootfs,
    };
    let built = image::build(&spec, &args.out)?;
    println!(
        "built {} manifest {} config {}",
        args.out.display(),
        built.manifest.digest,
        built.config.digest,
    );
    for (layer, rootfs) in built.layers.iter().zip(&spec.rootfs) {
        println!(
            "layer {} ({} bytes) from {}",
            layer.desc.digest,
            layer.desc.size,
            rootfs.display()
        );
    }
    Ok(())
}

fn run_index(args: IndexArgs) -> Result<()> {
    let built = index::build_index(&args.manifest, format(args.docker_media_types), &args.out)?;
    println!("built {} index {}", args.out.display(), built.index.digest);
    for child in &built.children {
        let platform = child.platform.as_ref().map(Platform::to_string);
        println!("manifest {} {}", child.digest, platform.unwrap_or_default());
    }
    Ok(())
}

fn run_artifact(args: ArtifactArgs) -> Result<()> {
    let manifest = artifact::build(&args.file, &args.artifact_type, &args.media_type, &args.out)?;
    println!("built {} artifact {}", args.out.display(), manifest.digest);
    Ok(())
}

fn run_gen_rootfs(args: GenRootfsArgs) -> Result<()> {
    let files = genrootfs::generate(&args.out, args.files, args.size, args.seed)?;
    println!(
        "generated {} files, {} bytes, in {}",
        files.len(),
        args.size,
        args.out.display()
    );
    Ok(())
}

fn registry_auth(args: &PushArgs) -> Result<RegistryAuth> {
    match (&args.username, &args.password) {
        (Some(user), Some(password)) => Ok(RegistryAuth::Basic(user.clone(), password.clone())),
        (None, None) => Ok(RegistryAuth::Anonymous),
        // clap's `requires` already enforces the pair.
        _ => bail!("--username and --password go together"),
    }
}

fn run_push(args: PushArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting tokio runtime")?;
    let request = push::PushRequest {
        layout: &args.layout,
        target: &args.to,
        also_tags: &args.also_tag,
        plain_http: args.plain_http,
        auth: registry_auth(&args)?,
    };
    let pushed = runtime.block_on(push::push(&request))?;
    for child in &pushed.children {
        let platform = child.platform.as_ref().map(Platform::to_string);
        println!("pushed child {} {}", child.digest, platform.unwrap_or_default());
    }
    for reference in pushed.references {
        println!("pushed {reference}@{}", pushed.digest);
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Build(args) => run_build(args),
        Command::Index(args) => run_index(args),
        Command::GenRootfs(args) => run_gen_rootfs(args),
        Command::Push(args) => run_push(args),
        Command::Artifact(args) => run_artifact(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("scute-imagekit: {err:#}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn cli_is_well_formed() {
        Cli::command().debug_assert();
    }

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("1000").unwrap(), 1000);
        assert_eq!(parse_size("10M").unwrap(), 10 << 20);
        assert_eq!(parse_size("2k").unwrap(), 2048);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        for bad in ["", "M", "1.5M", "-1", "10MB", "99999999999999G"] {
            assert!(parse_size(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn build_flags_parse() {
        let cli = Cli::try_parse_from([
            "scute-imagekit",
            "build",
            "--rootfs",
            "a",
            "--rootfs",
            "b",
            "--out",
            "o",
            "--whiteout",
            "/etc/x",
            "--opaque",
            "/var",
            "--compression",
            "zstd",
            "--platform",
            "linux/arm64",
        ])
        .unwrap();
        let Command::Build(args) = cli.command else {
            panic!("not build")
        };
        assert_eq!(args.rootfs, [PathBuf::from("a"), PathBuf::from("b")]);
        assert_eq!(args.compression, Compression::Zstd);
        assert_eq!(args.platform.architecture, "arm64");
        assert!(whiteouts(&args).is_ok());
        let no_password = [
            "scute-imagekit",
            "push",
            "--layout",
            "l",
            "--to",
            "r/x:1",
            "--username",
            "u",
        ];
        assert!(Cli::try_parse_from(no_password).is_err());
    }
}
