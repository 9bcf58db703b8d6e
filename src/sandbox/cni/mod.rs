//! CNI: network configuration discovery (NetworkReady) and plugin execution (pod networking).
//!
//! Discovery is libcni's `ConfFiles` + `LoadConfList`: the first `*.conflist`, `*.conf` or
//! `*.json` file of `cni.conf_dir` in lexical order is the pod network, usable only when every
//! plugin it names (chain plugins and their IPAM plugins) is an executable in one of the bin dirs.
//! When the conf dir holds no config at all, [`CniManager`] falls back to an embedded default
//! network (bridge `scute0` on 10.88.0.0/16 with portmap and firewall, like podman's default);
//! a config that is present but broken is reported, never silently replaced.
//!
//! Execution follows the CNI spec 1.0/1.1 and libcni (containerd's go-cni wraps libcni):
//! - every plugin gets `CNI_COMMAND`, `CNI_CONTAINERID`, `CNI_NETNS`, `CNI_IFNAME`, `CNI_ARGS`
//!   (`IgnoreUnknown=1;K8S_POD_NAMESPACE=…;K8S_POD_NAME=…;K8S_POD_INFRA_CONTAINER_ID=…;K8S_POD_UID=…`)
//!   and `CNI_PATH` (the bin dirs joined with `:`) on top of the daemon's environment;
//! - its stdin is its entry of the list with the list's `name` and `cniVersion` injected, the
//!   previous plugin's result as `prevResult`, and `runtimeConfig` holding only the capability
//!   arguments the plugin declares in `capabilities` (libcni's `injectRuntimeConfig`);
//! - ADD runs the chain in order, each plugin's result feeding the next; the last result is the
//!   attachment's result and is cached (with the list used) under `<state>/cni/results/`, like
//!   libcni's cache dir, so DEL and CHECK get it as `prevResult` and use the same config even if
//!   the conf dir changed meanwhile;
//! - DEL runs the chain in reverse order; DEL of something never added succeeds (plugins handle
//!   it); a netns that is gone is passed as an empty `CNI_NETNS`, as the spec says;
//! - CHECK (0.4.0+, unless `disableCheck`) and STATUS (1.1.0+) run the chain in order;
//! - a plugin failing prints `{"code", "msg", "details"}` on stdout: that becomes
//!   [`CniError::Plugin`] naming the plugin; every call has a timeout (60 s by default).
//!
//! `lo` is not a plugin's job here: the daemon brings it up when it makes the pod's netns
//! ([`super::netns::NetNs::create`]), as CRI-O's ocicni does, where containerd runs the
//! `loopback` plugin before the pod network. That is one plugin exec fewer on every ADD and
//! DEL. Pods attached by an earlier scute (with the plugin) need no loopback DEL: `lo` goes
//! with their netns.
//!
//! No maintained Rust crate executes CNI plugins well (the few that exist are stale or pull in a
//! large dependency tree for a few hundred lines of protocol), so this is written here, small and
//! tested: unit tests use fake plugins (shell scripts), and root tests run Debian's real plugins.

mod conf;

pub use conf::{
    default_conflist, probe, Network, NotReady, ProbeCache, DEFAULT_BRIDGE, DEFAULT_NETWORK_NAME,
    DEFAULT_PLUGIN_TIMEOUT, DEFAULT_SUBNET, EMBEDDED_CONF_FILE, REASON_NOT_READY,
};
use conf::{join_dirs, read_conf_list, resolve, version_at_least};
use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{json, Map, Value};

use crate::config::CniConfig;

/// A hostPort mapping (CRI `PortMapping`), passed to plugins declaring `portMappings`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortMapping {
    pub host_port: i32,
    pub container_port: i32,
    /// `tcp`, `udp` or `sctp` (any case).
    pub protocol: String,
    /// Empty for every host address.
    pub host_ip: String,
}

/// Traffic shaping, passed to plugins declaring `bandwidth` (bits per second, bits).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Bandwidth {
    pub ingress_rate: u64,
    pub ingress_burst: u64,
    pub egress_rate: u64,
    pub egress_burst: u64,
}

/// DNS settings, passed to plugins declaring `dns`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dns {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

/// One pod's attachment to the pod network.
#[derive(Debug, Clone)]
pub struct AttachRequest<'a> {
    /// The sandbox ID (`CNI_CONTAINERID`, `K8S_POD_INFRA_CONTAINER_ID`).
    pub container_id: &'a str,
    /// The pinned network namespace.
    pub netns: &'a Path,
    /// The pod's interface, normally "eth0".
    pub ifname: &'a str,
    pub pod_name: &'a str,
    pub pod_namespace: &'a str,
    pub pod_uid: &'a str,
    pub port_mappings: Vec<PortMapping>,
    pub bandwidth: Option<Bandwidth>,
    pub dns: Option<Dns>,
}

impl Default for AttachRequest<'_> {
    /// No container ID and no netns (fill them in), `eth0`, nothing else.
    fn default() -> Self {
        AttachRequest::new("", Path::new(""))
    }
}

impl<'a> AttachRequest<'a> {
    /// A request for `eth0` with no pod metadata and no capability arguments.
    pub fn new(container_id: &'a str, netns: &'a Path) -> Self {
        AttachRequest {
            container_id,
            netns,
            ifname: "eth0",
            pod_name: "",
            pod_namespace: "",
            pod_uid: "",
            port_mappings: Vec::new(),
            bandwidth: None,
            dns: None,
        }
    }

    /// `CNI_ARGS` as the kubelet's dockershim and containerd pass them.
    fn cni_args(&self) -> String {
        format!(
            "IgnoreUnknown=1;K8S_POD_NAMESPACE={};K8S_POD_NAME={};K8S_POD_INFRA_CONTAINER_ID={};K8S_POD_UID={}",
            self.pod_namespace, self.pod_name, self.container_id, self.pod_uid
        )
    }

    /// Capability arguments by capability name; plugins get the ones they declare.
    fn capability_args(&self) -> Map<String, Value> {
        let mut args = Map::new();
        let ports: Vec<Value> = self
            .port_mappings
            .iter()
            // containerd skips mappings without a host port: nothing to map.
            .filter(|p| p.host_port > 0)
            .map(|p| {
                let mut m = json!({
                    "hostPort": p.host_port,
                    "containerPort": p.container_port,
                    "protocol": if p.protocol.is_empty() { "tcp".to_string() } else { p.protocol.to_lowercase() },
                });
                if !p.host_ip.is_empty() {
                    m["hostIP"] = json!(p.host_ip);
                }
                m
            })
            .collect();
        if !ports.is_empty() {
            args.insert("portMappings".into(), Value::Array(ports));
        }
        if let Some(b) = &self.bandwidth {
            args.insert(
                "bandwidth".into(),
                json!({
                    "ingressRate": b.ingress_rate,
                    "ingressBurst": b.ingress_burst,
                    "egressRate": b.egress_rate,
                    "egressBurst": b.egress_burst,
                }),
            );
        }
        if let Some(d) = &self.dns {
            args.insert(
                "dns".into(),
                json!({ "servers": d.servers, "searches": d.searches, "options": d.options }),
            );
        }
        args
    }
}

/// What ADD produced.
#[derive(Debug, Clone, PartialEq)]
pub struct AttachResult {
    /// The pod's addresses, IPv4 first (containerd's choice of primary), then IPv6.
    pub ips: Vec<IpAddr>,
    /// The final result of the pod network's chain.
    pub raw: Value,
}

#[derive(Debug, thiserror::Error)]
pub enum CniError {
    #[error("CNI network not ready: {0}")]
    NotReady(#[from] NotReady),
    #[error("invalid CNI request: {0}")]
    InvalidRequest(String),
    #[error("CNI plugin {plugin} {command} failed (code {code}): {msg}{}", if details.is_empty() { String::new() } else { format!(": {details}") })]
    Plugin {
        plugin: String,
        command: &'static str,
        code: u64,
        msg: String,
        details: String,
    },
    #[error("CNI plugin {plugin} {command} failed: {message}")]
    Failed {
        plugin: String,
        command: &'static str,
        message: String,
    },
    #[error("CNI plugin {plugin} {command} timed out after {after:?}")]
    Timeout {
        plugin: String,
        command: &'static str,
        after: Duration,
    },
    #[error("CNI plugin {plugin} {command} printed an invalid result: {message}")]
    BadResult {
        plugin: String,
        command: &'static str,
        message: String,
    },
    #[error("CNI result cache {path}: {message}")]
    Cache { path: PathBuf, message: String },
}

/// A network list ready to run: the list JSON (name, cniVersion, plugins) and the plugins'
/// binaries in chain order.
#[derive(Debug, Clone)]
struct Chain {
    list: Value,
    binaries: Vec<PathBuf>,
}

impl Chain {
    fn name(&self) -> &str {
        self.list["name"].as_str().unwrap_or_default()
    }
    fn version(&self) -> &str {
        self.list["cniVersion"].as_str().unwrap_or_default()
    }
    fn plugins(&self) -> &[Value] {
        self.list["plugins"].as_array().map(Vec::as_slice).unwrap_or_default()
    }
    fn plugin_type(&self, i: usize) -> &str {
        self.plugins()[i]["type"].as_str().unwrap_or_default()
    }
}

/// What the result cache holds per attachment (libcni keeps the same under /var/lib/cni).
#[derive(serde::Serialize, serde::Deserialize)]
pub(crate) struct CachedAttachment {
    #[serde(rename = "containerId")]
    container_id: String,
    #[serde(rename = "ifName")]
    ifname: String,
    #[serde(rename = "networkName")]
    network_name: String,
    /// The network list the attachment was made with.
    config: Value,
    result: Value,
}

/// The embedded default network's IPAM data dir, under the state dir.
const LEASES_DIR: &str = "cni/networks";

/// A cached attachment: whose, on which interface, and its cache file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cached {
    pub container_id: String,
    pub ifname: String,
    pub path: PathBuf,
}

/// Runs the pod network for pod sandboxes: the network in use, ADD/DEL/CHECK/STATUS.
pub struct CniManager {
    config: CniConfig,
    state_dir: PathBuf,
    default_list: Value,
    timeout: Duration,
    probe: ProbeCache,
}

impl CniManager {
    /// `state_dir` is the daemon's state dir: the embedded default network keeps its IPAM leases
    /// in `<state_dir>/cni/networks` and attachments are cached in `<state_dir>/cni/results`.
    pub fn new(config: &CniConfig, state_dir: &Path) -> CniManager {
        CniManager {
            config: config.clone(),
            state_dir: state_dir.to_path_buf(),
            default_list: default_conflist(DEFAULT_BRIDGE, DEFAULT_SUBNET, &state_dir.join(LEASES_DIR)),
            timeout: DEFAULT_PLUGIN_TIMEOUT,
            probe: ProbeCache::default(),
        }
    }

    /// Where the embedded default network's host-local IPAM keeps its leases (scute's alone:
    /// `<dir>/<network>/<ip>`, each naming the pod that holds it).
    pub fn default_leases_dir(&self) -> PathBuf {
        self.state_dir.join(LEASES_DIR)
    }

    /// Another bridge and subnet for the embedded default network (tests; a future config key).
    pub fn with_default_network(mut self, bridge: &str, subnet: &str) -> Self {
        self.default_list = default_conflist(bridge, subnet, &self.state_dir.join(LEASES_DIR));
        self
    }

    /// Another per-plugin-call timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The embedded default network list (with its data dir), for `scute config`-style output.
    pub fn default_conflist(&self) -> &Value {
        &self.default_list
    }

    /// The network pods get: the conf dir's first config, else (no config at all) the embedded
    /// default. Ready only when every plugin it needs exists. Cheap enough for every Status call
    /// (a few `stat`s while nothing changes).
    pub fn network(&self) -> Result<Network, NotReady> {
        match self.probe.probe(&self.config) {
            Ok(network) => Ok(network),
            Err(NotReady::NoConfig(_)) => {
                resolve(Path::new(EMBEDDED_CONF_FILE), &self.default_list, &self.config.bin_dirs)
            }
            Err(e) => Err(e),
        }
    }

    /// The network in use, read afresh, ready to run.
    fn chain(&self) -> Result<Chain, NotReady> {
        let network = self.network()?;
        let list = if network.conf_file == Path::new(EMBEDDED_CONF_FILE) {
            self.default_list.clone()
        } else {
            read_conf_list(&network.conf_file)?
        };
        // The file may have changed since the cached probe: resolve again (a few stats).
        let network = resolve(&network.conf_file, &list, &self.config.bin_dirs)?;
        Ok(Chain {
            list,
            binaries: network.plugins.into_iter().map(|(_, p)| p).collect(),
        })
    }

    /// A cached list whose plugins are looked up again (they may have moved between bin dirs).
    fn chain_from_list(&self, list: Value) -> Result<Chain, NotReady> {
        let network = resolve(Path::new("(cached attachment)"), &list, &self.config.bin_dirs)?;
        Ok(Chain {
            list,
            binaries: network.plugins.into_iter().map(|(_, p)| p).collect(),
        })
    }

    /// Every cached attachment, for recovery after a crash and `scute doctor`: an attachment
    /// whose pod has no record still holds its IP until its DEL runs.
    pub fn cached_attachments(&self) -> Vec<Cached> {
        let Ok(entries) = std::fs::read_dir(self.state_dir.join("cni/results")) else {
            return Vec::new();
        };
        let mut found: Vec<Cached> = entries
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| {
                let cached = serde_json::from_slice::<CachedAttachment>(&std::fs::read(e.path()).ok()?).ok()?;
                Some(Cached {
                    container_id: cached.container_id,
                    ifname: cached.ifname,
                    path: e.path(),
                })
            })
            .collect();
        found.sort_by(|a, b| (&a.container_id, &a.ifname).cmp(&(&b.container_id, &b.ifname)));
        found
    }

    fn cache_path(&self, network: &str, req: &AttachRequest<'_>) -> PathBuf {
        self.state_dir
            .join("cni/results")
            .join(format!("{network}-{}-{}", req.container_id, req.ifname))
    }

    fn read_cache(&self, req: &AttachRequest<'_>) -> Result<Option<CachedAttachment>, CniError> {
        let dir = self.state_dir.join("cni/results");
        let suffix = format!("-{}-{}", req.container_id, req.ifname);
        let entries = match std::fs::read_dir(&dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => {
                return Err(CniError::Cache {
                    path: dir,
                    message: e.to_string(),
                })
            }
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().to_string();
            if !name.ends_with(&suffix) || name.starts_with('.') {
                continue;
            }
            let path = entry.path();
            let cached: Option<CachedAttachment> = std::fs::read(&path)
                .ok()
                .and_then(|bytes| serde_json::from_slice(&bytes).ok());
            match cached {
                Some(c) if c.container_id == req.container_id && c.ifname == req.ifname => return Ok(Some(c)),
                Some(_) => continue,
                None => {
                    tracing::warn!(path = %path.display(), "ignoring an unreadable CNI result cache entry");
                }
            }
        }
        Ok(None)
    }

    fn write_cache(&self, chain: &Chain, req: &AttachRequest<'_>, result: &Value) -> Result<(), CniError> {
        let path = self.cache_path(chain.name(), req);
        let err = |e: std::io::Error| CniError::Cache {
            path: path.clone(),
            message: e.to_string(),
        };
        let entry = CachedAttachment {
            container_id: req.container_id.to_string(),
            ifname: req.ifname.to_string(),
            network_name: chain.name().to_string(),
            config: chain.list.clone(),
            result: result.clone(),
        };
        let dir = path.parent().expect("cache path has a parent");
        std::fs::create_dir_all(dir).map_err(err)?;
        let mut tmp = tempfile::NamedTempFile::with_prefix_in(".tmp-", dir).map_err(err)?;
        serde_json::to_writer(&mut tmp, &entry).map_err(|e| err(e.into()))?;
        tmp.as_file().sync_all().map_err(err)?;
        tmp.persist(&path).map_err(|e| err(e.error))?;
        Ok(())
    }

    fn remove_cache(&self, network: &str, req: &AttachRequest<'_>) -> Result<(), CniError> {
        let path = self.cache_path(network, req);
        match std::fs::remove_file(&path) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CniError::Cache {
                path,
                message: e.to_string(),
            }),
            _ => Ok(()),
        }
    }

    /// Attaches the pod: the pod network's chain ADD on `req.ifname`. On failure, what was
    /// added is deleted again (DEL of the plugins that ran, in reverse order) and the first
    /// error is returned.
    pub async fn setup(&self, req: &AttachRequest<'_>) -> Result<AttachResult, CniError> {
        validate(req)?;
        let chain = self.chain()?;
        let result = match self.add(&chain, req).await {
            Ok(result) => result,
            Err(e) => {
                self.rollback(&chain, req, e.ran, e.prev.as_ref()).await;
                return Err(e.error);
            }
        };
        if let Err(e) = self.write_cache(&chain, req, &result) {
            // DEL still works without it (no prevResult, current config); say so.
            tracing::warn!(container_id = req.container_id, error = %e, "CNI result not cached");
        }
        Ok(AttachResult {
            ips: result_ips(&result),
            raw: result,
        })
    }

    /// Detaches the pod: the chain's DEL in reverse order with the cached result as prevResult
    /// (using the network list the attachment was made with, when cached).
    /// Idempotent. A netns that no longer exists is passed as an empty `CNI_NETNS`.
    pub async fn teardown(&self, req: &AttachRequest<'_>) -> Result<(), CniError> {
        validate(req)?;
        let netns_gone = !netns_present(req.netns);
        let (chain, prev) = match self.read_cache(req)? {
            Some(cached) => match self.chain_from_list(cached.config) {
                Ok(chain) => (chain, Some(cached.result)),
                // The plugins of the cached list are gone: the current network is the best bet.
                Err(_) => (self.chain()?, None),
            },
            None => match self.chain() {
                Ok(chain) => (chain, None),
                // Nothing cached, no usable network and no netns left: nothing can be undone.
                Err(e) if netns_gone => {
                    tracing::warn!(container_id = req.container_id, error = %e, "CNI teardown skipped");
                    return Ok(());
                }
                Err(e) => return Err(e.into()),
            },
        };
        let all = chain.plugins().len();
        self.del(&chain, req, all, prev.as_ref()).await?;
        self.remove_cache(chain.name(), req)
    }

    /// CHECK of the pod network with `prev` (the result of [`CniManager::setup`]) as prevResult,
    /// with the network list the attachment was made with when cached. A no-op for lists older
    /// than 0.4.0 or with `disableCheck`.
    pub async fn check(&self, req: &AttachRequest<'_>, prev: &Value) -> Result<(), CniError> {
        validate(req)?;
        let chain = match self.read_cache(req)? {
            Some(cached) => self.chain_from_list(cached.config)?,
            None => self.chain()?,
        };
        if !version_at_least(chain.version(), "0.4.0") || chain.list["disableCheck"] == json!(true) {
            return Ok(());
        }
        let args = req.capability_args();
        for i in 0..chain.plugins().len() {
            let stdin = plugin_stdin(&chain, i, Some(prev), &args);
            self.exec(&chain, i, "CHECK", Some(req), &stdin).await?;
        }
        Ok(())
    }

    /// CNI 1.1 STATUS of every plugin of the network in use; Ok for lists older than 1.1.0
    /// (libcni's `GetStatusNetworkList` does the same).
    pub async fn status(&self) -> Result<(), CniError> {
        let chain = self.chain()?;
        if !version_at_least(chain.version(), "1.1.0") {
            return Ok(());
        }
        for i in 0..chain.plugins().len() {
            let stdin = plugin_stdin(&chain, i, None, &Map::new());
            self.exec(&chain, i, "STATUS", None, &stdin).await?;
        }
        Ok(())
    }

    /// ADD of every plugin in order, each getting the previous one's result.
    async fn add(&self, chain: &Chain, req: &AttachRequest<'_>) -> Result<Value, AddFailure> {
        let args = req.capability_args();
        let mut prev: Option<Value> = None;
        for i in 0..chain.plugins().len() {
            let stdin = plugin_stdin(chain, i, prev.as_ref(), &args);
            match self.exec(chain, i, "ADD", Some(req), &stdin).await {
                // A plugin printing nothing passes the previous result on.
                Ok(Some(result)) => prev = Some(result),
                Ok(None) => {}
                Err(error) => {
                    return Err(AddFailure {
                        error,
                        ran: i + 1,
                        prev,
                    })
                }
            }
        }
        prev.ok_or_else(|| AddFailure {
            error: CniError::BadResult {
                plugin: chain.plugin_type(chain.plugins().len() - 1).to_string(),
                command: "ADD",
                message: "the chain produced no result".into(),
            },
            ran: chain.plugins().len(),
            prev: None,
        })
    }

    /// DEL of the first `count` plugins, in reverse order; stops at the first failure.
    async fn del(
        &self,
        chain: &Chain,
        req: &AttachRequest<'_>,
        count: usize,
        prev: Option<&Value>,
    ) -> Result<(), CniError> {
        // prevResult on DEL arrived with spec 0.4.0.
        let prev = prev.filter(|_| version_at_least(chain.version(), "0.4.0"));
        let args = req.capability_args();
        for i in (0..count.min(chain.plugins().len())).rev() {
            let stdin = plugin_stdin(chain, i, prev, &args);
            self.exec(chain, i, "DEL", Some(req), &stdin).await?;
        }
        Ok(())
    }

    async fn rollback(&self, chain: &Chain, req: &AttachRequest<'_>, count: usize, prev: Option<&Value>) {
        if let Err(e) = self.del(chain, req, count, prev).await {
            tracing::warn!(container_id = req.container_id, network = chain.name(), error = %e, "CNI rollback failed");
        }
    }

    /// Runs one plugin; `Ok(None)` when it printed nothing.
    async fn exec(
        &self,
        chain: &Chain,
        index: usize,
        command: &'static str,
        req: Option<&AttachRequest<'_>>,
        stdin: &Value,
    ) -> Result<Option<Value>, CniError> {
        let plugin = chain.plugin_type(index).to_string();
        let binary = &chain.binaries[index];
        let mut cmd = tokio::process::Command::new(binary);
        cmd.env("CNI_COMMAND", command)
            .env("CNI_PATH", join_dirs(&self.config.bin_dirs, ":"))
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        if std::env::var_os("PATH").is_none() {
            // Plugins run iptables, ip, …
            cmd.env("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
        }
        if let Some(req) = req {
            // DEL into something that is not a namespace (gone, or the empty file of an
            // interrupted create) would fail forever: the spec's empty CNI_NETNS says "gone".
            let netns = if command == "DEL" && !netns_present(req.netns) {
                String::new()
            } else {
                req.netns.display().to_string()
            };
            cmd.env("CNI_CONTAINERID", req.container_id)
                .env("CNI_NETNS", netns)
                .env("CNI_IFNAME", req.ifname)
                .env("CNI_ARGS", req.cni_args());
        }
        let failed = |message: String| CniError::Failed {
            plugin: plugin.clone(),
            command,
            message,
        };
        let input = serde_json::to_vec(stdin).expect("JSON values serialize");
        // A fork waits while another process moves between cgroups (libcontainer's, under a burst).
        let mut child = crate::blocking::run(|| cmd.spawn())
            .map_err(|e| failed(format!("cannot run {}: {e}", binary.display())))?;
        let mut pipe = child.stdin.take().expect("stdin is piped");
        let run = async move {
            let write = async {
                use tokio::io::AsyncWriteExt;
                // A plugin may exit without reading all of stdin: its output tells what happened.
                let _ = pipe.write_all(&input).await;
                drop(pipe);
            };
            let (_, output) = tokio::join!(write, child.wait_with_output());
            output
        };
        let started = std::time::Instant::now();
        let output = tokio::time::timeout(self.timeout, run)
            .await
            .map_err(|_| CniError::Timeout {
                plugin: plugin.clone(),
                command,
                after: self.timeout,
            })?
            .map_err(|e| failed(e.to_string()))?;
        let stderr = String::from_utf8_lossy(&output.stderr).trim().to_string();
        tracing::debug!(
            plugin = %plugin,
            command,
            container_id = req.map(|r| r.container_id).unwrap_or_default(),
            status = %output.status,
            elapsed_ms = started.elapsed().as_millis() as u64,
            stderr = %stderr,
            "CNI plugin ran"
        );
        if !output.status.success() {
            return Err(plugin_error(&plugin, command, &output.stdout, &stderr, output.status));
        }
        if output.stdout.iter().all(u8::is_ascii_whitespace) {
            return Ok(None);
        }
        let result: Value = serde_json::from_slice(&output.stdout).map_err(|e| CniError::BadResult {
            plugin: plugin.clone(),
            command,
            message: e.to_string(),
        })?;
        if !result.is_object() {
            return Err(CniError::BadResult {
                plugin,
                command,
                message: "not a JSON object".into(),
            });
        }
        Ok(Some(result))
    }
}

struct AddFailure {
    error: CniError,
    /// How many plugins ran (the failing one included).
    ran: usize,
    /// The last good result (the failing plugin's prevResult).
    prev: Option<Value>,
}

/// Whether `path` is a namespace plugins can enter.
fn netns_present(path: &Path) -> bool {
    super::netns::is_nsfs(path).unwrap_or(true)
}

fn validate(req: &AttachRequest<'_>) -> Result<(), CniError> {
    let plain = |s: &str| !s.is_empty() && !s.contains('/') && s != "." && s != ".." && !s.contains('\0');
    if !plain(req.container_id) {
        return Err(CniError::InvalidRequest(format!("container ID {:?}", req.container_id)));
    }
    if !plain(req.ifname) || req.ifname.len() > 15 {
        return Err(CniError::InvalidRequest(format!("interface name {:?}", req.ifname)));
    }
    Ok(())
}

/// A failed plugin's error: the spec's `{code, msg, details}` on stdout, else its stderr.
fn plugin_error(
    plugin: &str,
    command: &'static str,
    stdout: &[u8],
    stderr: &str,
    status: std::process::ExitStatus,
) -> CniError {
    #[derive(serde::Deserialize)]
    struct ErrorResult {
        code: Option<u64>,
        msg: Option<String>,
        #[serde(default)]
        details: String,
    }
    if let Ok(ErrorResult {
        code: Some(code),
        msg,
        details,
    }) = serde_json::from_slice::<ErrorResult>(stdout)
    {
        return CniError::Plugin {
            plugin: plugin.to_string(),
            command,
            code,
            msg: msg.unwrap_or_default(),
            details,
        };
    }
    let out = String::from_utf8_lossy(stdout).trim().to_string();
    let message = [stderr.to_string(), out]
        .into_iter()
        .filter(|s| !s.is_empty())
        .collect::<Vec<_>>()
        .join("; ");
    CniError::Failed {
        plugin: plugin.to_string(),
        command,
        message: if message.is_empty() {
            status.to_string()
        } else {
            format!("{status}: {message}")
        },
    }
}

/// The stdin of plugin `index` of `chain`: its entry with the list's `name` and `cniVersion`,
/// `prevResult` when there is one, and `runtimeConfig` with exactly the capability arguments it
/// declares (`"capabilities": {"portMappings": true}`), as libcni's `buildOneConfig` does.
fn plugin_stdin(chain: &Chain, index: usize, prev: Option<&Value>, args: &Map<String, Value>) -> Value {
    let mut conf = match &chain.plugins()[index] {
        Value::Object(m) => m.clone(),
        _ => Map::new(),
    };
    conf.insert("name".into(), json!(chain.name()));
    conf.insert("cniVersion".into(), json!(chain.version()));
    if let Some(prev) = prev {
        conf.insert("prevResult".into(), prev.clone());
    }
    let declared: BTreeMap<&str, bool> = conf
        .get("capabilities")
        .and_then(Value::as_object)
        .map(|caps| caps.iter().map(|(k, v)| (k.as_str(), v == &json!(true))).collect())
        .unwrap_or_default();
    let runtime: Map<String, Value> = args
        .iter()
        .filter(|(cap, _)| declared.get(cap.as_str()).copied().unwrap_or(false))
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if !runtime.is_empty() {
        conf.insert("runtimeConfig".into(), Value::Object(runtime));
    }
    Value::Object(conf)
}

/// The pod's addresses in a result: `ips` (0.3.0+) on interfaces inside the sandbox (or with no
/// interface named), else `ip4`/`ip6` (0.1.0/0.2.0). IPv4 first, each family in result order.
pub fn result_ips(result: &Value) -> Vec<IpAddr> {
    let parse = |cidr: &str| cidr.split('/').next().and_then(|a| a.parse::<IpAddr>().ok());
    let mut ips: Vec<IpAddr> = Vec::new();
    if let Some(list) = result.get("ips").and_then(Value::as_array) {
        let interfaces = result.get("interfaces").and_then(Value::as_array);
        for ip in list {
            let in_sandbox = match (ip.get("interface").and_then(Value::as_u64), interfaces) {
                (Some(i), Some(ifs)) => ifs
                    .get(i as usize)
                    .and_then(|iface| iface.get("sandbox"))
                    .and_then(Value::as_str)
                    .is_some_and(|s| !s.is_empty()),
                _ => true,
            };
            if let Some(addr) = ip.get("address").and_then(Value::as_str).and_then(parse) {
                if in_sandbox {
                    ips.push(addr);
                }
            }
        }
    } else {
        for key in ["ip4", "ip6"] {
            if let Some(addr) = result
                .get(key)
                .and_then(|v| v.get("ip"))
                .and_then(Value::as_str)
                .and_then(parse)
            {
                ips.push(addr);
            }
        }
    }
    ips.sort_by_key(|ip| ip.is_ipv6());
    ips
}

#[cfg(test)]
mod exec_tests;

#[cfg(test)]
mod real_plugin_tests;
