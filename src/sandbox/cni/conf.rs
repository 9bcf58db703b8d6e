//! CNI network configuration discovery (NetworkReady): libcni's `ConfFiles` + `LoadConfList`
//! over `cni.conf_dir` with every plugin resolved in the bin dirs, the embedded default network,
//! and the probe cache the kubelet's frequent Status calls hit.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::config::CniConfig;

/// The `reason` of a NetworkReady=false condition, as containerd and CRI-O report it.
pub const REASON_NOT_READY: &str = "NetworkPluginNotReady";

/// `Network::conf_file` of the embedded default network.
pub const EMBEDDED_CONF_FILE: &str = "(embedded default)";
/// Name of the embedded default network.
pub const DEFAULT_NETWORK_NAME: &str = "scute";
/// Bridge of the embedded default network.
pub const DEFAULT_BRIDGE: &str = "scute0";
/// Pod subnet of the embedded default network.
pub const DEFAULT_SUBNET: &str = "10.88.0.0/16";
/// Per-plugin-call timeout unless [`CniManager::with_timeout`] says otherwise.
pub const DEFAULT_PLUGIN_TIMEOUT: Duration = Duration::from_secs(60);

/// Spec versions this implementation speaks (used to pick from a 1.1 `cniVersions` list).
pub(super) const SUPPORTED_VERSIONS: &[&str] = &["0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0"];

/// A network configuration that is ready to use.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Network {
    /// The conf file, or [`EMBEDDED_CONF_FILE`] for the embedded default.
    pub conf_file: PathBuf,
    pub name: String,
    pub cni_version: String,
    /// Plugin type → resolved binary path, in chain order.
    pub plugins: Vec<(String, PathBuf)>,
}

#[derive(Debug, Clone, thiserror::Error, PartialEq)]
pub enum NotReady {
    #[error("no CNI network config found in {0}")]
    NoConfig(PathBuf),
    #[error("cannot read CNI config dir {dir}: {message}")]
    ConfDirUnreadable { dir: PathBuf, message: String },
    #[error("CNI config {file} is invalid: {message}")]
    BadConfig { file: PathBuf, message: String },
    #[error("CNI plugin {plugin:?} named by {file} was not found in {dirs}")]
    PluginMissing {
        file: PathBuf,
        plugin: String,
        dirs: String,
    },
}

/// Finds the pod network of `config.conf_dir` and checks its plugins exist. This looks at the
/// conf dir only; [`CniManager::network`] adds the embedded default.
pub fn probe(config: &CniConfig) -> Result<Network, NotReady> {
    let file = first_conf_file(&config.conf_dir)?;
    let list = read_conf_list(&file)?;
    resolve(&file, &list, &config.bin_dirs)
}

/// Reads a `.conflist`, or a single-plugin `.conf`/`.json` turned into a one-plugin list
/// (libcni's `ConfListFromConf`), and checks its shape.
pub(super) fn read_conf_list(file: &Path) -> Result<Value, NotReady> {
    let bad = |message: String| NotReady::BadConfig {
        file: file.to_path_buf(),
        message,
    };
    let text = std::fs::read_to_string(file).map_err(|e| bad(e.to_string()))?;
    let value: Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let Value::Object(mut top) = value else {
        return Err(bad("not a JSON object".into()));
    };
    let name = top.get("name").and_then(Value::as_str).unwrap_or_default().to_string();
    if name.is_empty() {
        return Err(bad("\"name\" is missing or empty".into()));
    }
    let version = pick_version(&top).map_err(bad)?;
    let list = if file.extension().is_some_and(|e| e == "conflist") {
        let Some(Value::Array(plugins)) = top.remove("plugins") else {
            return Err(bad("\"plugins\" is missing or not a list".into()));
        };
        if plugins.is_empty() {
            return Err(bad("\"plugins\" is empty".into()));
        }
        let mut list = top;
        list.insert("plugins".into(), Value::Array(plugins));
        list
    } else {
        let mut list = Map::new();
        list.insert("name".into(), json!(name));
        list.insert("plugins".into(), json!([Value::Object(top)]));
        list
    };
    let mut list = list;
    list.insert("cniVersion".into(), json!(version));
    for plugin in list["plugins"].as_array().into_iter().flatten() {
        let plugin_type = plugin.get("type").and_then(Value::as_str).unwrap_or_default();
        if plugin_type.is_empty() || plugin_type.contains('/') {
            return Err(bad(format!("plugin type {plugin_type:?} is not a plain binary name")));
        }
        if let Some(ipam) = plugin.get("ipam").and_then(|i| i.get("type")) {
            let ipam = ipam.as_str().unwrap_or_default();
            if ipam.is_empty() || ipam.contains('/') {
                return Err(bad(format!("IPAM type {ipam:?} is not a plain binary name")));
            }
        }
    }
    Ok(Value::Object(list))
}

/// The version to speak: the highest supported entry of a CNI 1.1 `cniVersions` list, else
/// `cniVersion` (libcni does the same).
pub(super) fn pick_version(conf: &Map<String, Value>) -> Result<String, String> {
    if let Some(Value::Array(versions)) = conf.get("cniVersions") {
        let best = versions
            .iter()
            .filter_map(Value::as_str)
            .filter(|v| SUPPORTED_VERSIONS.contains(v))
            .max_by_key(|v| version_tuple(v));
        return match best {
            Some(v) => Ok(v.to_string()),
            None => Err(format!("none of \"cniVersions\" {versions:?} is supported")),
        };
    }
    Ok(conf
        .get("cniVersion")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string())
}

/// Resolves every plugin (and IPAM plugin) of `list` to a binary.
pub(super) fn resolve(file: &Path, list: &Value, bin_dirs: &[PathBuf]) -> Result<Network, NotReady> {
    let missing = |plugin: &str| NotReady::PluginMissing {
        file: file.to_path_buf(),
        plugin: plugin.to_string(),
        dirs: join_dirs(bin_dirs, ", "),
    };
    let mut plugins = Vec::new();
    for plugin in list["plugins"].as_array().into_iter().flatten() {
        let plugin_type = plugin["type"].as_str().unwrap_or_default();
        let path = find_plugin(bin_dirs, plugin_type).ok_or_else(|| missing(plugin_type))?;
        if let Some(ipam) = plugin.get("ipam").and_then(|i| i.get("type")).and_then(Value::as_str) {
            find_plugin(bin_dirs, ipam).ok_or_else(|| missing(ipam))?;
        }
        plugins.push((plugin_type.to_string(), path));
    }
    Ok(Network {
        conf_file: file.to_path_buf(),
        name: list["name"].as_str().unwrap_or_default().to_string(),
        cni_version: list["cniVersion"].as_str().unwrap_or_default().to_string(),
        plugins,
    })
}

pub(super) fn join_dirs(dirs: &[PathBuf], sep: &str) -> String {
    dirs.iter()
        .map(|d| d.display().to_string())
        .collect::<Vec<_>>()
        .join(sep)
}

pub(super) fn first_conf_file(dir: &Path) -> Result<PathBuf, NotReady> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Err(NotReady::NoConfig(dir.to_path_buf())),
        Err(e) => {
            return Err(NotReady::ConfDirUnreadable {
                dir: dir.to_path_buf(),
                message: e.to_string(),
            })
        }
    };
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| {
            p.is_file()
                && p.extension()
                    .and_then(|e| e.to_str())
                    .is_some_and(|e| matches!(e, "conflist" | "conf" | "json"))
        })
        .collect();
    files.sort();
    files
        .into_iter()
        .next()
        .ok_or_else(|| NotReady::NoConfig(dir.to_path_buf()))
}

pub(super) fn find_plugin(dirs: &[PathBuf], plugin: &str) -> Option<PathBuf> {
    if plugin.is_empty() || plugin.contains('/') {
        return None;
    }
    dirs.iter()
        .map(|d| d.join(plugin))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
}

/// The embedded default network (podman's default, minus tuning): a bridge with NAT to the
/// outside, host-local IPAM keeping its leases under `data_dir`, portmap for hostPorts, and
/// firewall, which accepts the pod's traffic in FORWARD (a node with Docker has policy DROP there;
/// its backend is firewalld when that runs, else iptables).
pub fn default_conflist(bridge: &str, subnet: &str, data_dir: &Path) -> Value {
    json!({
        "cniVersion": "1.0.0",
        "name": DEFAULT_NETWORK_NAME,
        "plugins": [
            {
                "type": "bridge",
                "bridge": bridge,
                "isGateway": true,
                "ipMasq": true,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": subnet }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                    "dataDir": data_dir,
                }
            },
            {
                "type": "portmap",
                "capabilities": { "portMappings": true },
                "snat": true
            },
            {
                "type": "firewall"
            }
        ]
    })
}

/// "a.b.c" → (a, b, c); anything unparsable (or empty, which plugins read as 0.1.0) is 0.1.0.
pub(super) fn version_tuple(v: &str) -> (u32, u32, u32) {
    let mut parts = v.split('.').map(|p| p.parse::<u32>());
    match (parts.next(), parts.next(), parts.next(), parts.next()) {
        (Some(Ok(a)), Some(Ok(b)), Some(Ok(c)), None) => (a, b, c),
        _ => (0, 1, 0),
    }
}

pub(super) fn version_at_least(v: &str, min: &str) -> bool {
    version_tuple(v) >= version_tuple(min)
}

/// Remembers the last probe so the kubelet's frequent Status calls cost a few `stat`s instead of
/// a directory scan and a JSON parse. The result is reused while the conf dir (files added or
/// removed), the chosen conf file and its plugins are unchanged, so a fix on disk shows on the
/// next Status call, as with containerd's config watcher.
#[derive(Default)]
pub struct ProbeCache {
    last: std::sync::Mutex<Option<(Fingerprint, Result<Network, NotReady>)>>,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) struct Fingerprint {
    dir: Option<(std::time::SystemTime, u64)>,
    file: Option<(std::time::SystemTime, u64)>,
    plugins: Vec<Option<(std::time::SystemTime, u64)>>,
}

pub(super) fn stamp(path: &Path) -> Option<(std::time::SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

impl ProbeCache {
    pub fn probe(&self, config: &CniConfig) -> Result<Network, NotReady> {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((fingerprint, result)) = last.as_ref() {
            if *fingerprint == Self::fingerprint(config, result) {
                return result.clone();
            }
        }
        let result = probe(config);
        *last = Some((Self::fingerprint(config, &result), result.clone()));
        result
    }

    fn fingerprint(config: &CniConfig, result: &Result<Network, NotReady>) -> Fingerprint {
        let (file, plugins) = match result {
            Ok(net) => (
                stamp(&net.conf_file),
                net.plugins.iter().map(|(_, path)| stamp(path)).collect(),
            ),
            // A missing plugin may appear in any bin dir: watch the dirs instead.
            Err(NotReady::PluginMissing { file, .. }) => {
                (stamp(file), config.bin_dirs.iter().map(|d| stamp(d)).collect())
            }
            Err(NotReady::BadConfig { file, .. }) => (stamp(file), Vec::new()),
            Err(_) => (None, Vec::new()),
        };
        Fingerprint {
            dir: stamp(&config.conf_dir),
            file,
            plugins,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;

    fn setup() -> (tempfile::TempDir, CniConfig) {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("net.d")).unwrap();
        fs::create_dir_all(dir.path().join("bin")).unwrap();
        let config = CniConfig {
            conf_dir: dir.path().join("net.d"),
            bin_dirs: vec![dir.path().join("missing"), dir.path().join("bin")],
        };
        (dir, config)
    }

    fn plugin(dir: &Path, name: &str) {
        let p = dir.join("bin").join(name);
        fs::write(&p, "#!/bin/sh\n").unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o755)).unwrap();
    }

    #[test]
    fn missing_dir_and_empty_dir_are_not_ready() {
        let (dir, mut config) = setup();
        assert_eq!(probe(&config), Err(NotReady::NoConfig(config.conf_dir.clone())));
        config.conf_dir = dir.path().join("nope");
        assert!(matches!(probe(&config), Err(NotReady::NoConfig(_))));
    }

    #[test]
    fn first_conflist_in_lexical_order_wins_and_plugins_resolve() {
        let (dir, config) = setup();
        plugin(dir.path(), "bridge");
        plugin(dir.path(), "portmap");
        fs::write(
            config.conf_dir.join("10-pods.conflist"),
            r#"{"cniVersion":"1.0.0","name":"pods","plugins":[{"type":"bridge"},{"type":"portmap"}]}"#,
        )
        .unwrap();
        fs::write(
            config.conf_dir.join("20-other.conf"),
            r#"{"name":"other","type":"nope"}"#,
        )
        .unwrap();
        fs::write(config.conf_dir.join("00-readme.txt"), "ignored").unwrap();
        let net = probe(&config).unwrap();
        assert_eq!(net.name, "pods");
        assert_eq!(net.cni_version, "1.0.0");
        assert_eq!(net.plugins[1], ("portmap".to_string(), dir.path().join("bin/portmap")));
    }

    #[test]
    fn missing_or_non_executable_plugin_is_named() {
        let (dir, config) = setup();
        fs::write(config.conf_dir.join("a.conf"), r#"{"name":"n","type":"bridge"}"#).unwrap();
        let err = probe(&config).unwrap_err();
        assert!(
            matches!(&err, NotReady::PluginMissing { plugin, .. } if plugin == "bridge"),
            "{err}"
        );
        fs::write(dir.path().join("bin/bridge"), "").unwrap();
        assert!(matches!(probe(&config), Err(NotReady::PluginMissing { .. })));
        plugin(dir.path(), "bridge");
        assert_eq!(probe(&config).unwrap().plugins.len(), 1);
    }

    #[test]
    fn invalid_json_and_path_plugin_types_are_rejected() {
        let (_dir, config) = setup();
        fs::write(config.conf_dir.join("a.conflist"), "{").unwrap();
        assert!(matches!(probe(&config), Err(NotReady::BadConfig { .. })));
        fs::write(
            config.conf_dir.join("a.conflist"),
            r#"{"name":"n","plugins":[{"type":"../../bin/sh"}]}"#,
        )
        .unwrap();
        assert!(matches!(probe(&config), Err(NotReady::BadConfig { .. })));
    }

    #[test]
    fn cache_sees_changes_on_disk() {
        let (dir, config) = setup();
        let cache = ProbeCache::default();
        assert!(matches!(cache.probe(&config), Err(NotReady::NoConfig(_))));
        let file = config.conf_dir.join("a.conflist");
        fs::write(&file, r#"{"name":"n","plugins":[{"type":"bridge"}]}"#).unwrap();
        assert!(matches!(cache.probe(&config), Err(NotReady::PluginMissing { .. })));
        plugin(dir.path(), "bridge");
        assert_eq!(cache.probe(&config).unwrap().name, "n");
        // Rewritten in place with another length: the file stamp changes.
        fs::write(&file, r#"{"name":"renamed","plugins":[{"type":"bridge"}]}"#).unwrap();
        assert_eq!(cache.probe(&config).unwrap().name, "renamed");
        fs::remove_file(dir.path().join("bin/bridge")).unwrap();
        assert!(matches!(cache.probe(&config), Err(NotReady::PluginMissing { .. })));
    }
}
