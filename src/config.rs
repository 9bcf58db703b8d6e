//! Daemon configuration: embedded defaults, an optional TOML file, then command-line overrides.
//!
//! The embedded `config.default.toml` is the only place defaults live. A user file is merged
//! key by key onto it before deserializing, so a key the defaults don't have is an unknown key
//! and a value whose TOML type differs from the default's is a type error, both reported with
//! the full dotted key (`grpc.adress`), which serde alone would not name.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The full commented default configuration, printed by `scute config default`.
pub const DEFAULT_CONFIG: &str = include_str!("config.default.toml");

/// Where `scute serve` looks for a config file when `--config` is not given.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/scute/config.toml";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub root: PathBuf,
    pub state: PathBuf,
    pub grpc: GrpcConfig,
    pub log: LogConfig,
    pub runtime: RuntimeConfig,
    pub cni: CniConfig,
    pub registry: RegistryConfig,
    pub image: ImageConfig,
    pub streaming: StreamingConfig,
    pub metrics: MetricsConfig,
    pub cdi: CdiConfig,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpcConfig {
    pub address: PathBuf,
    pub image_address: PathBuf,
    pub max_recv_message_size: usize,
    pub max_send_message_size: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LogConfig {
    pub level: String,
    pub format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuntimeConfig {
    pub cgroup_driver: CgroupDriver,
    /// How many RunPodSandbox calls make their pod at once, the rest waiting in arrival order;
    /// 0: one per CPU (see `sandbox_starts`).
    pub max_parallel_sandbox_starts: u32,
    /// Handler name → its defaults (RuntimeClass handlers).
    pub handlers: std::collections::BTreeMap<String, HandlerConfig>,
}

/// What a runtime handler changes for the pods that select it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HandlerConfig {
    pub default_seccomp: DefaultSeccomp,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum DefaultSeccomp {
    #[serde(rename = "unconfined")]
    Unconfined,
    #[serde(rename = "runtime/default")]
    RuntimeDefault,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    Cgroupfs,
    Systemd,
}

impl RuntimeConfig {
    /// `max_parallel_sandbox_starts` with 0 made the node's CPU count.
    pub fn sandbox_starts(&self) -> usize {
        match self.max_parallel_sandbox_starts {
            0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
            n => n as usize,
        }
    }
}

impl fmt::Display for CgroupDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            CgroupDriver::Cgroupfs => "cgroupfs",
            CgroupDriver::Systemd => "systemd",
        })
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CniConfig {
    pub conf_dir: PathBuf,
    pub bin_dirs: Vec<PathBuf>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RegistryConfig {
    pub config_path: PathBuf,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageConfig {
    pub max_concurrent_downloads: usize,
    /// Percent of the root filesystem's space and inodes a pull leaves free.
    pub min_free_disk_percent: u8,
    /// Seconds without progress after which a pull is aborted; 0: never.
    pub pull_progress_timeout_seconds: u64,
    /// Drop a layer's compressed blob once its snapshot is unpacked (containerd's
    /// `discard_unpacked_layers`).
    pub discard_unpacked_layers: bool,
    pub sandbox_image: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamingConfig {
    pub address: String,
    pub tls_cert: PathBuf,
    pub tls_key: PathBuf,
    pub token_ttl_seconds: u64,
    pub idle_timeout_seconds: u64,
    pub stream_creation_timeout_seconds: u64,
    pub max_sessions: usize,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// "host:port" of the Prometheus endpoint; empty: off.
    pub address: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CdiConfig {
    /// Off: a container asking for a CDI device fails to create (never runs without it).
    pub enabled: bool,
    /// Directories of CDI spec files; a device in a later one overrides one in an earlier one.
    pub spec_dirs: Vec<PathBuf>,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config file {path} is not valid TOML: {message}")]
    Syntax { path: PathBuf, message: String },
    #[error("{origin}: unknown key `{key}`")]
    UnknownKey { origin: String, key: String },
    #[error("{origin}: key `{key}` must be {expected}, found {found}")]
    WrongType {
        origin: String,
        key: String,
        expected: &'static str,
        found: &'static str,
    },
    #[error("{origin}: key `{key}`: {message}")]
    BadValue {
        origin: String,
        key: String,
        message: String,
    },
}

impl Config {
    /// The embedded defaults.
    pub fn defaults() -> Config {
        // The embedded text is checked by a unit test; failing here is a build defect.
        Self::from_toml_str(DEFAULT_CONFIG, "embedded defaults").expect("embedded default config is valid")
    }

    /// Loads `path` if given (it must exist), else /etc/scute/config.toml if present, else the
    /// defaults.
    pub fn load(path: Option<&Path>) -> Result<Config, ConfigError> {
        let path = match path {
            Some(p) => p.to_path_buf(),
            None if Path::new(DEFAULT_CONFIG_PATH).exists() => PathBuf::from(DEFAULT_CONFIG_PATH),
            None => return Ok(Self::defaults()),
        };
        let text = std::fs::read_to_string(&path).map_err(|source| ConfigError::Read {
            path: path.clone(),
            source,
        })?;
        Self::from_toml_str(&text, &path.display().to_string())
    }

    /// Parses a (partial) config text and merges it onto the defaults. `origin` names the
    /// source in error messages.
    pub fn from_toml_str(text: &str, origin: &str) -> Result<Config, ConfigError> {
        let syntax = |e: toml::de::Error| ConfigError::Syntax {
            path: PathBuf::from(origin),
            message: e.message().to_string(),
        };
        let mut merged: toml::Table = DEFAULT_CONFIG.parse().map_err(syntax)?;
        let user: toml::Table = text.parse().map_err(syntax)?;
        merge_table(&mut merged, user, "", origin)?;
        // serde_path_to_error names the key of a bad enum spelling (`runtime.cgroup_driver`).
        let config: Config = serde_path_to_error::deserialize(toml::Value::Table(merged)).map_err(
            |e: serde_path_to_error::Error<toml::de::Error>| ConfigError::BadValue {
                origin: origin.to_string(),
                key: e.path().to_string(),
                message: e.inner().message().to_string(),
            },
        )?;
        config.validate(origin)?;
        Ok(config)
    }

    /// Checks values serde cannot: enum spellings are checked by serde through the merge, but
    /// paths and sizes are checked here so the error names the key.
    fn validate(&self, origin: &str) -> Result<(), ConfigError> {
        let bad = |key: &str, message: String| ConfigError::BadValue {
            origin: origin.to_string(),
            key: key.to_string(),
            message,
        };
        for (key, path) in [
            ("root", &self.root),
            ("state", &self.state),
            ("grpc.address", &self.grpc.address),
            ("cni.conf_dir", &self.cni.conf_dir),
            ("registry.config_path", &self.registry.config_path),
        ] {
            if !path.is_absolute() {
                return Err(bad(key, format!("must be an absolute path, got {:?}", path)));
            }
        }
        if !self.grpc.image_address.as_os_str().is_empty() {
            if !self.grpc.image_address.is_absolute() {
                return Err(bad(
                    "grpc.image_address",
                    format!("must be empty or an absolute path, got {:?}", self.grpc.image_address),
                ));
            }
            if self.grpc.image_address == self.grpc.address {
                return Err(bad("grpc.image_address", "must differ from grpc.address".into()));
            }
        }
        for dir in &self.cni.bin_dirs {
            if !dir.is_absolute() {
                return Err(bad("cni.bin_dirs", format!("{:?} is not an absolute path", dir)));
            }
        }
        for (i, dir) in self.cdi.spec_dirs.iter().enumerate() {
            if !dir.is_absolute() {
                return Err(bad("cdi.spec_dirs", format!("{:?} is not an absolute path", dir)));
            }
            // Listed twice, every device in it would be defined twice at one priority.
            if self.cdi.spec_dirs[..i].contains(dir) {
                return Err(bad("cdi.spec_dirs", format!("{:?} is listed twice", dir)));
            }
        }
        for (key, size) in [
            ("grpc.max_recv_message_size", self.grpc.max_recv_message_size),
            ("grpc.max_send_message_size", self.grpc.max_send_message_size),
        ] {
            if size < 4096 {
                return Err(bad(key, format!("{size} bytes is too small (at least 4096)")));
            }
        }
        if !(1..=64).contains(&self.image.max_concurrent_downloads) {
            return Err(bad(
                "image.max_concurrent_downloads",
                format!("{} is out of range (1 to 64)", self.image.max_concurrent_downloads),
            ));
        }
        if self.image.min_free_disk_percent > 50 {
            return Err(bad(
                "image.min_free_disk_percent",
                format!("{} is out of range (0 to 50)", self.image.min_free_disk_percent),
            ));
        }
        let streaming = &self.streaming;
        if streaming.address.parse::<std::net::SocketAddr>().is_err() {
            return Err(bad(
                "streaming.address",
                format!(
                    "{:?} is not an IP address and port (\"127.0.0.1:0\")",
                    streaming.address
                ),
            ));
        }
        if streaming.tls_cert.as_os_str().is_empty() != streaming.tls_key.as_os_str().is_empty() {
            return Err(bad(
                "streaming.tls_cert",
                "streaming.tls_cert and streaming.tls_key go together: set both or neither".into(),
            ));
        }
        if !self.metrics.address.is_empty() && self.metrics.address.parse::<std::net::SocketAddr>().is_err() {
            return Err(bad(
                "metrics.address",
                format!(
                    "{:?} is not empty nor an IP address and port (\"127.0.0.1:9523\")",
                    self.metrics.address
                ),
            ));
        }
        for (key, value) in [
            ("streaming.token_ttl_seconds", streaming.token_ttl_seconds),
            ("streaming.idle_timeout_seconds", streaming.idle_timeout_seconds),
            (
                "streaming.stream_creation_timeout_seconds",
                streaming.stream_creation_timeout_seconds,
            ),
            ("streaming.max_sessions", streaming.max_sessions as u64),
        ] {
            if value == 0 {
                return Err(bad(key, "must be at least 1".into()));
            }
        }
        if let Err(e) = crate::distribution::reference::ImageRef::parse(&self.image.sandbox_image) {
            return Err(bad("image.sandbox_image", e.to_string()));
        }
        if self.log.level.trim().is_empty() {
            return Err(bad("log.level", "must not be empty".into()));
        }
        if let Err(e) = tracing_subscriber::EnvFilter::try_new(&self.log.level) {
            return Err(bad(
                "log.level",
                format!("{:?} is not a valid filter: {e}", self.log.level),
            ));
        }
        for handler in self.runtime.handlers.keys() {
            if handler.is_empty() || handler.len() > 63 || !handler.bytes().all(is_dns_label_byte) {
                return Err(bad(
                    "runtime.handlers",
                    format!("{handler:?} is not a valid handler name (lowercase DNS label)"),
                ));
            }
        }
        Ok(())
    }

    /// The runtime handler names scute accepts; "" is the default handler.
    pub fn handler_names(&self) -> impl Iterator<Item = &str> {
        std::iter::once("").chain(self.runtime.handlers.keys().map(String::as_str))
    }

    /// The settings of a handler; the default handler "" uses the embedded defaults.
    pub fn handler(&self, name: &str) -> Option<HandlerConfig> {
        if name.is_empty() {
            return Some(HandlerConfig {
                default_seccomp: DefaultSeccomp::Unconfined,
            });
        }
        self.runtime.handlers.get(name).cloned()
    }
}

fn is_dns_label_byte(b: u8) -> bool {
    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-'
}

/// The one table whose keys are names the operator chooses (one table per handler).
const HANDLERS_KEY: &str = "runtime.handlers";
/// The embedded handler whose keys and defaults a new handler starts from.
const DEFAULT_HANDLER_TEMPLATE: &str = "runc";

/// Merges `user` onto `base`, refusing keys `base` lacks and values of another TOML type.
fn merge_table(base: &mut toml::Table, user: toml::Table, prefix: &str, origin: &str) -> Result<(), ConfigError> {
    for (key, value) in user {
        let dotted = if prefix.is_empty() {
            key.clone()
        } else {
            format!("{prefix}.{key}")
        };
        if prefix == HANDLERS_KEY && !base.contains_key(&key) {
            // A new handler: its keys are checked against the default handler's.
            let template = base
                .get(DEFAULT_HANDLER_TEMPLATE)
                .cloned()
                .ok_or_else(|| ConfigError::UnknownKey {
                    origin: origin.to_string(),
                    key: dotted.clone(),
                })?;
            base.insert(key.clone(), template);
        }
        let Some(slot) = base.get_mut(&key) else {
            return Err(ConfigError::UnknownKey {
                origin: origin.to_string(),
                key: dotted,
            });
        };
        match (slot, value) {
            (toml::Value::Table(base_table), toml::Value::Table(user_table)) => {
                merge_table(base_table, user_table, &dotted, origin)?;
            }
            (slot, value) if slot.type_str() == value.type_str() => *slot = value,
            (slot, value) => {
                return Err(ConfigError::WrongType {
                    origin: origin.to_string(),
                    key: dotted,
                    expected: article_type(slot.type_str()),
                    found: article_type(value.type_str()),
                });
            }
        }
    }
    Ok(())
}

fn article_type(t: &'static str) -> &'static str {
    match t {
        "string" => "a string",
        "integer" => "an integer",
        "float" => "a float",
        "boolean" => "a boolean",
        "datetime" => "a datetime",
        "array" => "an array",
        "table" => "a table",
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_defaults_parse_and_validate() {
        let c = Config::defaults();
        assert_eq!(c.root, PathBuf::from("/var/lib/scute"));
        assert_eq!(c.grpc.address, PathBuf::from("/run/scute/scute.sock"));
        assert_eq!(c.runtime.cgroup_driver, CgroupDriver::Cgroupfs);
        assert_eq!(c.log.format, LogFormat::Text);
        assert_eq!(c.handler_names().collect::<Vec<_>>(), vec!["", "runc"]);
    }

    #[test]
    fn partial_file_overrides_only_its_keys() {
        let c = Config::from_toml_str("[runtime]\ncgroup_driver = \"systemd\"\n", "t.toml").unwrap();
        assert_eq!(c.runtime.cgroup_driver, CgroupDriver::Systemd);
        assert_eq!(c.runtime.handlers.keys().collect::<Vec<_>>(), vec!["runc"]);
        assert_eq!(c.root, Config::defaults().root);
    }

    #[test]
    fn unknown_key_is_named_with_its_path() {
        let err = Config::from_toml_str("[grpc]\nadress = \"/x\"\n", "t.toml").unwrap_err();
        assert_eq!(err.to_string(), "t.toml: unknown key `grpc.adress`");
        let err = Config::from_toml_str("bogus = 1\n", "t.toml").unwrap_err();
        assert_eq!(err.to_string(), "t.toml: unknown key `bogus`");
    }

    #[test]
    fn wrong_type_is_named() {
        let err = Config::from_toml_str("[grpc]\nmax_recv_message_size = \"big\"\n", "t.toml").unwrap_err();
        assert_eq!(
            err.to_string(),
            "t.toml: key `grpc.max_recv_message_size` must be an integer, found a string"
        );
        let err = Config::from_toml_str("grpc = 3\n", "t.toml").unwrap_err();
        assert!(err.to_string().contains("key `grpc` must be a table"), "{err}");
    }

    #[test]
    fn bad_enum_value_is_rejected() {
        let err = Config::from_toml_str("[runtime]\ncgroup_driver = \"cgroupv3\"\n", "t.toml").unwrap_err();
        let msg = err.to_string();
        assert!(
            msg.starts_with("t.toml: key `runtime.cgroup_driver`: unknown variant `cgroupv3`"),
            "{msg}"
        );
    }

    #[test]
    fn bad_values_name_the_key() {
        for (text, key) in [
            ("root = \"relative/dir\"", "root"),
            ("[grpc]\nimage_address = \"img.sock\"", "grpc.image_address"),
            (
                "[grpc]\nimage_address = \"/run/scute/scute.sock\"",
                "grpc.image_address",
            ),
            ("[grpc]\nmax_send_message_size = 10", "grpc.max_send_message_size"),
            ("[log]\nlevel = \"\"", "log.level"),
            ("[log]\nlevel = \"scute=loud\"", "log.level"),
            (
                "[runtime]\nruntime_handlers = [\"Bad Name\"]",
                "runtime.runtime_handlers",
            ),
            ("[cni]\nbin_dirs = [\"bin\"]", "cni.bin_dirs"),
            ("[cdi]\nspec_dirs = [\"cdi\"]", "cdi.spec_dirs"),
            ("[cdi]\nspec_dirs = [\"/etc/cdi\", \"/etc/cdi\"]", "cdi.spec_dirs"),
            (
                "[image]\nmax_concurrent_downloads = 0",
                "image.max_concurrent_downloads",
            ),
            ("[image]\nsandbox_image = \"Bad/Name\"", "image.sandbox_image"),
        ] {
            let err = Config::from_toml_str(text, "t.toml").unwrap_err();
            assert!(err.to_string().contains(&format!("key `{key}`")), "{text}: {err}");
        }
    }

    #[test]
    fn handlers_are_named_tables_with_checked_keys() {
        let c = Config::from_toml_str(
            "[runtime.handlers.hardened]\ndefault_seccomp = \"runtime/default\"\n",
            "t.toml",
        )
        .unwrap();
        assert_eq!(c.handler_names().collect::<Vec<_>>(), vec!["", "hardened", "runc"]);
        assert_eq!(
            c.handler("hardened").unwrap().default_seccomp,
            DefaultSeccomp::RuntimeDefault
        );
        assert_eq!(c.handler("runc").unwrap().default_seccomp, DefaultSeccomp::Unconfined);
        assert_eq!(c.handler("").unwrap().default_seccomp, DefaultSeccomp::Unconfined);
        assert!(c.handler("kata").is_none());
        // A handler with no keys gets the defaults.
        let c = Config::from_toml_str("[runtime.handlers.plain]\n", "t.toml").unwrap();
        assert_eq!(c.handler("plain").unwrap().default_seccomp, DefaultSeccomp::Unconfined);
        let err = Config::from_toml_str("[runtime.handlers.x]\nbogus = 1\n", "t.toml").unwrap_err();
        assert_eq!(err.to_string(), "t.toml: unknown key `runtime.handlers.x.bogus`");
        let err = Config::from_toml_str("[runtime.handlers.x]\ndefault_seccomp = \"strict\"\n", "t.toml").unwrap_err();
        assert!(err.to_string().contains("runtime.handlers.x.default_seccomp"), "{err}");
    }

    #[test]
    fn syntax_errors_name_the_file() {
        let err = Config::from_toml_str("[grpc\n", "/etc/scute/config.toml").unwrap_err();
        assert!(err
            .to_string()
            .starts_with("config file /etc/scute/config.toml is not valid TOML"));
    }

    #[test]
    fn missing_explicit_file_is_an_error() {
        let err = Config::load(Some(Path::new("/nonexistent/scute.toml"))).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/scute.toml"));
    }
}
