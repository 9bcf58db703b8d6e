//! scute-imagekit: builds single-layer OCI images from a root filesystem
//! directory and pushes them to a registry. Used to fill the local test
//! registry (images/build.sh); not part of the runtime.

mod image;
mod layer;
mod push;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{anyhow, Context, Result};
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "scute-imagekit", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Write an OCI image layout with one reproducible layer made from a rootfs.
    Build(BuildArgs),
    /// Push the image of an OCI image layout to a registry.
    Push(PushArgs),
}

#[derive(clap::Args)]
struct BuildArgs {
    /// Directory whose contents become the image's root filesystem.
    #[arg(long)]
    rootfs: PathBuf,
    /// OCI image layout directory to write (replaced if it already is one).
    #[arg(long)]
    out: PathBuf,
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
    /// Stop signal, e.g. SIGQUIT.
    #[arg(long)]
    stop_signal: Option<String>,
    /// Exposed port PORT[/tcp|udp|sctp] (repeatable).
    #[arg(long, value_name = "PORT/PROTO")]
    expose: Vec<String>,
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
}

fn parse_json_array(flag: &str, value: &str) -> Result<Vec<String>> {
    serde_json::from_str(value)
        .with_context(|| format!("--{flag} {value:?}: want a JSON array of strings"))
}

fn parse_labels(labels: &[String]) -> Result<BTreeMap<String, String>> {
    let mut out = BTreeMap::new();
    for label in labels {
        let (key, value) = label
            .split_once('=')
            .filter(|(key, _)| !key.is_empty())
            .ok_or_else(|| anyhow!("--label {label:?}: want KEY=VALUE"))?;
        out.insert(key.to_string(), value.to_string());
    }
    Ok(out)
}

fn run_build(args: BuildArgs) -> Result<()> {
    let options = image::ImageOptions {
        entrypoint: args
            .entrypoint
            .as_deref()
            .map(|v| parse_json_array("entrypoint", v))
            .transpose()?,
        cmd: args
            .cmd
            .as_deref()
            .map(|v| parse_json_array("cmd", v))
            .transpose()?,
        env: args.env,
        user: args.user,
        workdir: args.workdir,
        labels: parse_labels(&args.label)?,
        stop_signal: args.stop_signal,
        exposed_ports: args.expose,
    };
    let built = image::build(&args.rootfs, &args.out, &options)?;
    println!(
        "built {} manifest {} config {} layer {} ({} bytes)",
        args.out.display(),
        built.manifest.digest,
        built.config.digest,
        built.layer.digest,
        built.layer.size
    );
    Ok(())
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
    };
    let pushed = runtime.block_on(push::push(&request))?;
    for reference in pushed.references {
        println!("pushed {reference}@{}", pushed.manifest_digest);
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Build(args) => run_build(args),
        Command::Push(args) => run_push(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("scute-imagekit: {err:#}");
            ExitCode::FAILURE
        }
    }
}
