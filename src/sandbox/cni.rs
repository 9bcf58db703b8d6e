//! CNI network configuration discovery, as libcni's `ConfFiles` + `LoadConfList` do it: the first
//! `*.conflist`, `*.conf` or `*.json` file in lexical order is the pod network, and it is usable
//! only when every plugin it names is an executable in one of the bin dirs.
//!
//! This is what NetworkReady reports; the pod-sandbox issue adds ADD/DEL/CHECK on top.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::config::CniConfig;

/// The `reason` of a NetworkReady=false condition, as containerd and CRI-O report it.
pub const REASON_NOT_READY: &str = "NetworkPluginNotReady";

/// A network configuration that is ready to use.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Network {
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

#[derive(Deserialize)]
struct ConfList {
    name: String,
    #[serde(rename = "cniVersion", default)]
    cni_version: String,
    plugins: Vec<PluginConf>,
}

#[derive(Deserialize)]
struct SingleConf {
    name: String,
    #[serde(rename = "cniVersion", default)]
    cni_version: String,
    #[serde(rename = "type")]
    plugin_type: String,
}

#[derive(Deserialize)]
struct PluginConf {
    #[serde(rename = "type")]
    plugin_type: String,
}

/// Finds the pod network of `config` and checks its plugins exist.
pub fn probe(config: &CniConfig) -> Result<Network, NotReady> {
    let file = first_conf_file(&config.conf_dir)?;
    let text = std::fs::read_to_string(&file).map_err(|e| NotReady::BadConfig {
        file: file.clone(),
        message: e.to_string(),
    })?;
    let bad = |message: String| NotReady::BadConfig {
        file: file.clone(),
        message,
    };
    let (name, cni_version, plugin_types) = if file.extension().is_some_and(|e| e == "conflist") {
        let list: ConfList = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        if list.plugins.is_empty() {
            return Err(bad("\"plugins\" is empty".into()));
        }
        let types = list.plugins.into_iter().map(|p| p.plugin_type).collect::<Vec<_>>();
        (list.name, list.cni_version, types)
    } else {
        let single: SingleConf = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        (single.name, single.cni_version, vec![single.plugin_type])
    };
    if name.is_empty() {
        return Err(bad("\"name\" is empty".into()));
    }
    let mut plugins = Vec::with_capacity(plugin_types.len());
    for plugin in plugin_types {
        if plugin.is_empty() || plugin.contains('/') {
            return Err(bad(format!("plugin type {plugin:?} is not a plain binary name")));
        }
        let Some(path) = find_plugin(&config.bin_dirs, &plugin) else {
            return Err(NotReady::PluginMissing {
                file: file.clone(),
                plugin,
                dirs: config
                    .bin_dirs
                    .iter()
                    .map(|d| d.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        };
        plugins.push((plugin, path));
    }
    Ok(Network {
        conf_file: file,
        name,
        cni_version,
        plugins,
    })
}

fn first_conf_file(dir: &Path) -> Result<PathBuf, NotReady> {
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

fn find_plugin(dirs: &[PathBuf], plugin: &str) -> Option<PathBuf> {
    dirs.iter()
        .map(|d| d.join(plugin))
        .find(|p| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0))
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

/// Remembers the last probe so the kubelet's frequent Status calls cost a few `stat`s instead of
/// a directory scan and a JSON parse. The result is reused while the conf dir (files added or
/// removed), the chosen conf file and its plugins are unchanged, so a fix on disk shows on the
/// next Status call, as with containerd's config watcher.
#[derive(Default)]
pub struct ProbeCache {
    last: std::sync::Mutex<Option<(Fingerprint, Result<Network, NotReady>)>>,
}

#[derive(Debug, Clone, PartialEq)]
struct Fingerprint {
    dir: Option<(std::time::SystemTime, u64)>,
    file: Option<(std::time::SystemTime, u64)>,
    plugins: Vec<Option<(std::time::SystemTime, u64)>>,
}

fn stamp(path: &Path) -> Option<(std::time::SystemTime, u64)> {
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
