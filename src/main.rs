//! The scute command line: `serve` (the daemon), `config default`, `check`, `version`.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use scute::check::{self, Verdict};
use scute::config::{CgroupDriver, Config, LogFormat, DEFAULT_CONFIG};
use scute::doctor::{self, Depth};

#[derive(Parser)]
#[command(name = "scute", version = scute::LONG_VERSION, about = "A Kubernetes CRI v1 container runtime")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve CRI v1 on the configured unix socket until SIGTERM/SIGINT.
    Serve(ServeArgs),
    /// Configuration helpers.
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Report whether this node can run pods (kernel, cgroups, overlay, CNI, registries);
    /// exits non-zero when it cannot.
    Check {
        /// Config file (default: $SCUTE_CONFIG, else /etc/scute/config.toml if present, else
        /// built-in defaults).
        #[arg(long, short = 'c', env = "SCUTE_CONFIG")]
        config: Option<PathBuf>,
    },
    /// List the image pulls in flight with their progress (bytes and layers done, how long
    /// since the pull last moved), read from the running daemon.
    Pulls {
        /// Config file whose grpc.address is the daemon's socket (default: $SCUTE_CONFIG, else
        /// /etc/scute/config.toml if present, else built-in defaults).
        #[arg(long, short = 'c', env = "SCUTE_CONFIG")]
        config: Option<PathBuf>,
        /// The daemon's socket (overrides the config's grpc.address; `unix://` accepted).
        #[arg(long)]
        address: Option<String>,
    },
    /// Find what is damaged or left behind in scute's root and state (blobs against their
    /// digests, partial downloads, snapshots against their records, images missing layers,
    /// pods' and containers' directories, netns pins, cgroups and CNI attachments and leases
    /// nothing records, ready pods whose shim is gone); with --repair remove or release it. Asks the running daemon, or reads the store itself when the daemon is stopped.
    /// Exits 1 while problems remain.
    Doctor {
        /// Config file (default: $SCUTE_CONFIG, else /etc/scute/config.toml if present, else
        /// built-in defaults).
        #[arg(long, short = 'c', env = "SCUTE_CONFIG")]
        config: Option<PathBuf>,
        /// The daemon's socket (overrides the config's grpc.address).
        #[arg(long)]
        address: Option<String>,
        /// Hash only documents (manifests, configs); size-check layers.
        #[arg(long)]
        quick: bool,
        /// Remove what is found (never what a pull, pod or container uses).
        #[arg(long)]
        repair: bool,
    },
    /// Print version information.
    Version,
}

#[derive(Subcommand)]
enum ConfigCommand {
    /// Print the full default configuration, every key commented.
    Default,
    /// Print the effective configuration (defaults + file), as TOML.
    Show {
        /// Config file (default: $SCUTE_CONFIG, else /etc/scute/config.toml if present, else
        /// built-in defaults).
        #[arg(long, short = 'c', env = "SCUTE_CONFIG")]
        config: Option<PathBuf>,
    },
}

/// Flags of `scute serve`; each overrides its config key.
#[derive(clap::Args)]
struct ServeArgs {
    /// Config file (default: $SCUTE_CONFIG, else /etc/scute/config.toml if present, else built-in
    /// defaults).
    #[arg(long, short = 'c', env = "SCUTE_CONFIG")]
    config: Option<PathBuf>,
    /// `root`: persistent data directory.
    #[arg(long)]
    root: Option<PathBuf>,
    /// `state`: runtime state directory.
    #[arg(long)]
    state: Option<PathBuf>,
    /// `grpc.address`: CRI socket path (a `unix://` prefix is accepted).
    #[arg(long)]
    address: Option<String>,
    /// `grpc.image_address`: separate ImageService socket.
    #[arg(long)]
    image_address: Option<String>,
    /// `log.level`: tracing filter, e.g. info or scute=debug.
    #[arg(long)]
    log_level: Option<String>,
    /// `log.format`.
    #[arg(long, value_enum)]
    log_format: Option<LogFormat>,
    /// `runtime.cgroup_driver`.
    #[arg(long, value_enum)]
    cgroup_driver: Option<CgroupDriver>,
}

fn socket_path(flag: &str) -> PathBuf {
    PathBuf::from(flag.strip_prefix("unix://").unwrap_or(flag))
}

fn load_config(args: ServeArgs) -> anyhow::Result<Config> {
    let mut config = Config::load(args.config.as_deref())?;
    let mut overridden = toml::Table::new();
    if let Some(root) = args.root {
        config.root = root;
    }
    if let Some(state) = args.state {
        config.state = state;
    }
    if let Some(address) = args.address {
        config.grpc.address = socket_path(&address);
    }
    if let Some(address) = args.image_address {
        config.grpc.image_address = socket_path(&address);
    }
    if let Some(level) = args.log_level {
        config.log.level = level;
    }
    if let Some(format) = args.log_format {
        config.log.format = format;
    }
    if let Some(driver) = args.cgroup_driver {
        config.runtime.cgroup_driver = driver;
    }
    // Re-validate with the flags applied, so a bad flag is reported like a bad key.
    let text = toml::to_string(&config)?;
    overridden.extend(text.parse::<toml::Table>()?);
    Ok(Config::from_toml_str(&toml::to_string(&overridden)?, "command line")?)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Version => {
            println!("{} {}", scute::RUNTIME_NAME, scute::LONG_VERSION);
            println!("CRI API: {} (k8s.io/cri-api v0.36)", scute::CRI_API_VERSION);
            ExitCode::SUCCESS
        }
        Command::Config {
            command: ConfigCommand::Default,
        } => {
            print!("{DEFAULT_CONFIG}");
            ExitCode::SUCCESS
        }
        Command::Config {
            command: ConfigCommand::Show { config },
        } => match Config::load(config.as_deref())
            .map_err(anyhow::Error::from)
            .and_then(|c| Ok(toml::to_string(&c)?))
        {
            Ok(text) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("scute: {e:#}");
                ExitCode::from(2)
            }
        },
        Command::Check { config } => {
            let config = match Config::load(config.as_deref()) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("scute: {e}");
                    return ExitCode::from(2);
                }
            };
            let findings = check::run_all(&config);
            for f in &findings {
                println!("{f}");
            }
            let failed = findings.iter().filter(|f| f.verdict == Verdict::Fail).count();
            if failed > 0 {
                println!("this node cannot run pods: {failed} check(s) failed");
                ExitCode::FAILURE
            } else {
                println!("this node can run pods");
                ExitCode::SUCCESS
            }
        }
        Command::Doctor {
            config,
            address,
            quick,
            repair,
        } => {
            let config = match Config::load(config.as_deref()) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("scute: {e}");
                    return ExitCode::from(2);
                }
            };
            let socket = address
                .map(|a| socket_path(&a))
                .unwrap_or_else(|| config.grpc.address.clone());
            let depth = if quick { Depth::Quick } else { Depth::Full };
            let findings = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(doctor::run(&config, &socket, depth, repair)));
            match findings {
                Ok(findings) => {
                    print!("{}", doctor::report(&findings, repair));
                    if findings.iter().all(|f| f.repaired) {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::FAILURE
                    }
                }
                Err(e) => {
                    eprintln!("scute: {e:#}");
                    ExitCode::from(2)
                }
            }
        }
        Command::Pulls { config, address } => {
            let socket = match (address, Config::load(config.as_deref())) {
                (Some(address), _) => socket_path(&address),
                (None, Ok(config)) => config.grpc.address,
                (None, Err(e)) => {
                    eprintln!("scute: {e}");
                    return ExitCode::from(2);
                }
            };
            let report = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(anyhow::Error::from)
                .and_then(|rt| rt.block_on(scute::client::pulls_report(&socket)));
            match report {
                Ok(text) => {
                    print!("{text}");
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("scute: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
        Command::Serve(args) => {
            let config = match load_config(args) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("scute: {e:#}");
                    return ExitCode::from(2);
                }
            };
            scute::logging::init(&config.log.level, config.log.format);
            scute::memory::tune();
            let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("scute: cannot start the async runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match runtime.block_on(scute::daemon::serve(config)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    tracing::error!(error = format!("{e:#}"), "scute failed");
                    eprintln!("scute: {e:#}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}
