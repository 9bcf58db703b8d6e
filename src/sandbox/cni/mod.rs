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
//! Like containerd, the pod network is preceded by the `loopback` plugin on `lo` (its own
//! one-plugin network `cni-loopback`), which brings `lo` up in the pod.
//!
//! No maintained Rust crate executes CNI plugins well (the few that exist are stale or pull in a
//! large dependency tree for a few hundred lines of protocol), so this is written here, small and
//! tested: unit tests use fake plugins (shell scripts), and root tests run Debian's real plugins.

mod conf;

pub use conf::{
    default_conflist, probe, Network, NotReady, ProbeCache, DEFAULT_BRIDGE, DEFAULT_NETWORK_NAME,
    DEFAULT_PLUGIN_TIMEOUT, DEFAULT_SUBNET, EMBEDDED_CONF_FILE, REASON_NOT_READY,
};
use conf::{
    find_plugin, join_dirs, read_conf_list, resolve, version_at_least, LOOPBACK_IFNAME, LOOPBACK_NETWORK,
    LOOPBACK_PLUGIN, LOOPBACK_VERSION,
};
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
struct CachedAttachment {
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
            default_list: default_conflist(DEFAULT_BRIDGE, DEFAULT_SUBNET, &state_dir.join("cni/networks")),
            timeout: DEFAULT_PLUGIN_TIMEOUT,
            probe: ProbeCache::default(),
        }
    }

    /// Another bridge and subnet for the embedded default network (tests; a future config key).
    pub fn with_default_network(mut self, bridge: &str, subnet: &str) -> Self {
        self.default_list = default_conflist(bridge, subnet, &self.state_dir.join("cni/networks"));
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
    /// default. Ready only when every plugin it needs exists, `loopback` included. Cheap enough
    /// for every Status call (a few `stat`s while nothing changes).
    pub fn network(&self) -> Result<Network, NotReady> {
        let network = match self.probe.probe(&self.config) {
            Ok(network) => network,
            Err(NotReady::NoConfig(_)) => {
                resolve(Path::new(EMBEDDED_CONF_FILE), &self.default_list, &self.config.bin_dirs)?
            }
            Err(e) => return Err(e),
        };
        if find_plugin(&self.config.bin_dirs, LOOPBACK_PLUGIN).is_none() {
            return Err(NotReady::PluginMissing {
                file: network.conf_file.clone(),
                plugin: LOOPBACK_PLUGIN.into(),
                dirs: join_dirs(&self.config.bin_dirs, ", "),
            });
        }
        Ok(network)
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

    fn loopback(&self) -> Result<Chain, NotReady> {
        let binary = find_plugin(&self.config.bin_dirs, LOOPBACK_PLUGIN).ok_or_else(|| NotReady::PluginMissing {
            file: PathBuf::from(LOOPBACK_NETWORK),
            plugin: LOOPBACK_PLUGIN.into(),
            dirs: join_dirs(&self.config.bin_dirs, ", "),
        })?;
        Ok(Chain {
            list: json!({
                "cniVersion": LOOPBACK_VERSION,
                "name": LOOPBACK_NETWORK,
                "plugins": [{ "type": LOOPBACK_PLUGIN }],
            }),
            binaries: vec![binary],
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

    /// `(container ID, interface)` of every cached attachment, for recovery after a crash: an
    /// attachment whose sandbox the store does not know should be torn down (CNI 1.1's GC idea).
    pub fn cached_attachments(&self) -> Vec<(String, String)> {
        let Ok(entries) = std::fs::read_dir(self.state_dir.join("cni/results")) else {
            return Vec::new();
        };
        let mut found: Vec<(String, String)> = entries
            .flatten()
            .filter(|e| !e.file_name().to_string_lossy().starts_with('.'))
            .filter_map(|e| std::fs::read(e.path()).ok())
            .filter_map(|bytes| serde_json::from_slice::<CachedAttachment>(&bytes).ok())
            .map(|c| (c.container_id, c.ifname))
            .collect();
        found.sort();
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

    /// Attaches the pod: loopback ADD on `lo`, then the pod network's chain ADD on `req.ifname`.
    /// On failure, what was added is deleted again (DEL of the plugins that ran, in reverse
    /// order, then loopback) and the first error is returned.
    pub async fn setup(&self, req: &AttachRequest<'_>) -> Result<AttachResult, CniError> {
        validate(req)?;
        let chain = self.chain()?;
        let loopback = self.loopback()?;
        let lo_req = AttachRequest {
            ifname: LOOPBACK_IFNAME,
            ..req.clone()
        };
        if let Err(e) = self.add(&loopback, &lo_req).await {
            self.rollback(&loopback, &lo_req, e.ran, e.prev.as_ref()).await;
            return Err(e.error);
        }
        let result = match self.add(&chain, req).await {
            Ok(result) => result,
            Err(e) => {
                self.rollback(&chain, req, e.ran, e.prev.as_ref()).await;
                self.rollback(&loopback, &lo_req, 1, None).await;
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
    /// (using the network list the attachment was made with, when cached), then loopback DEL.
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
        let lo_req = AttachRequest {
            ifname: LOOPBACK_IFNAME,
            ..req.clone()
        };
        match self.loopback() {
            Ok(loopback) => self.del(&loopback, &lo_req, 1, None).await?,
            Err(e) => tracing::warn!(error = %e, "loopback DEL skipped"),
        }
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
        let mut child = cmd
            .spawn()
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

/// CNI execution with fake plugins (shell scripts recording what they get): no root needed.
#[cfg(test)]
mod exec_tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::PermissionsExt;

    struct Fake {
        dir: tempfile::TempDir,
        config: CniConfig,
    }

    impl Fake {
        /// A conf dir with `conflist` (if any) and fake plugins `types` in a bin dir.
        fn new(conflist: Option<Value>, types: &[&str]) -> Fake {
            let dir = tempfile::tempdir().unwrap();
            for sub in ["net.d", "bin", "log", "state"] {
                fs::create_dir_all(dir.path().join(sub)).unwrap();
            }
            let config = CniConfig {
                conf_dir: dir.path().join("net.d"),
                bin_dirs: vec![dir.path().join("nope"), dir.path().join("bin")],
            };
            if let Some(list) = conflist {
                fs::write(config.conf_dir.join("10-test.conflist"), list.to_string()).unwrap();
            }
            let fake = Fake { dir, config };
            for (i, t) in types.iter().enumerate() {
                fake.plugin(t, i + 1);
            }
            fake
        }

        fn plugin(&self, name: &str, index: usize) {
            let d = self.dir.path().display();
            let script = format!(
                r#"#!/bin/sh
d={d}
n=$(printf %03d $(ls "$d/log" | grep -c json))
cat > "$d/log/$n-$CNI_COMMAND-{name}.json"
printf '%s\n' "$CNI_CONTAINERID" "$CNI_NETNS" "$CNI_IFNAME" "$CNI_ARGS" "$CNI_PATH" > "$d/log/$n-$CNI_COMMAND-{name}.env"
if [ -f "$d/{name}.$CNI_COMMAND.sleep" ]; then sleep 5; fi
if [ -f "$d/{name}.$CNI_COMMAND.fail" ]; then cat "$d/{name}.$CNI_COMMAND.fail"; exit 1; fi
if [ "$CNI_COMMAND" = ADD ]; then
  printf '{{"cniVersion":"1.0.0","interfaces":[{{"name":"{name}","sandbox":"/x"}}],"ips":[{{"address":"10.9.0.{index}/24","interface":0}}]}}'
fi
"#
            );
            let path = self.dir.path().join("bin").join(name);
            fs::write(&path, script).unwrap();
            fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
        }

        fn manager(&self) -> CniManager {
            CniManager::new(&self.config, &self.dir.path().join("state"))
        }

        fn netns(&self) -> PathBuf {
            let p = self.dir.path().join("netns");
            fs::write(&p, "").unwrap();
            p
        }

        fn touch(&self, name: &str, content: &str) {
            fs::write(self.dir.path().join(name), content).unwrap();
        }

        /// (command-plugin, stdin, env lines) of every call so far, in order.
        fn calls(&self) -> Vec<(String, Value, Vec<String>)> {
            let log = self.dir.path().join("log");
            let mut names: Vec<String> = fs::read_dir(&log)
                .unwrap()
                .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
                .filter(|n| n.ends_with(".json"))
                .collect();
            names.sort();
            names
                .into_iter()
                .map(|n| {
                    let stdin = serde_json::from_slice(&fs::read(log.join(&n)).unwrap()).unwrap();
                    let env = fs::read_to_string(log.join(n.replace(".json", ".env")))
                        .unwrap()
                        .lines()
                        .map(str::to_string)
                        .collect();
                    let label = n.trim_end_matches(".json")[4..].to_string();
                    (label, stdin, env)
                })
                .collect()
        }

        fn clear_log(&self) {
            let log = self.dir.path().join("log");
            fs::remove_dir_all(&log).unwrap();
            fs::create_dir(&log).unwrap();
        }

        fn labels(&self) -> Vec<String> {
            self.calls().into_iter().map(|c| c.0).collect()
        }
    }

    fn three_plugins() -> Value {
        json!({
            "cniVersion": "1.0.0",
            "name": "testnet",
            "plugins": [
                { "type": "a", "ipam": { "type": "ipam" } },
                { "type": "b", "capabilities": { "bandwidth": true, "portMappings": false } },
                { "type": "c", "capabilities": { "portMappings": true }, "cniVersion": "0.0.9", "name": "overridden" }
            ]
        })
    }

    fn request<'a>(netns: &'a Path) -> AttachRequest<'a> {
        AttachRequest {
            pod_name: "web",
            pod_namespace: "default",
            pod_uid: "uid-1",
            port_mappings: vec![
                PortMapping {
                    host_port: 8080,
                    container_port: 80,
                    protocol: "TCP".into(),
                    host_ip: String::new(),
                },
                // No host port: not mapped.
                PortMapping {
                    host_port: 0,
                    container_port: 81,
                    protocol: "tcp".into(),
                    host_ip: String::new(),
                },
            ],
            bandwidth: Some(Bandwidth {
                ingress_rate: 1_000_000,
                ..Default::default()
            }),
            ..AttachRequest::new("sandbox1", netns)
        }
    }

    #[test]
    fn stdin_gets_name_version_prev_result_and_only_declared_capabilities() {
        let chain = Chain {
            list: three_plugins(),
            binaries: vec![PathBuf::new(); 3],
        };
        let netns = PathBuf::from("/x");
        let args = request(&netns).capability_args();
        let prev = json!({"cniVersion": "1.0.0", "ips": []});

        let a = plugin_stdin(&chain, 0, None, &args);
        assert_eq!(
            a,
            json!({"type": "a", "ipam": {"type": "ipam"}, "name": "testnet", "cniVersion": "1.0.0"})
        );

        let b = plugin_stdin(&chain, 1, Some(&prev), &args);
        assert_eq!(b["prevResult"], prev);
        assert_eq!(
            b["runtimeConfig"],
            json!({"bandwidth": {"ingressRate": 1_000_000, "ingressBurst": 0, "egressRate": 0, "egressBurst": 0}})
        );

        let c = plugin_stdin(&chain, 2, Some(&prev), &args);
        assert_eq!(c["name"], "testnet");
        assert_eq!(c["cniVersion"], "1.0.0");
        assert_eq!(
            c["runtimeConfig"],
            json!({"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]})
        );

        // Declared but not requested: no runtimeConfig at all.
        let c = plugin_stdin(&chain, 2, None, &Map::new());
        assert!(c.get("runtimeConfig").is_none());
        assert!(c.get("prevResult").is_none());
    }

    #[test]
    fn cni_args_and_capability_args() {
        let netns = PathBuf::from("/x");
        let mut req = request(&netns);
        assert_eq!(
            req.cni_args(),
            "IgnoreUnknown=1;K8S_POD_NAMESPACE=default;K8S_POD_NAME=web;K8S_POD_INFRA_CONTAINER_ID=sandbox1;K8S_POD_UID=uid-1"
        );
        req.port_mappings[0].host_ip = "127.0.0.1".into();
        req.dns = Some(Dns {
            servers: vec!["10.96.0.10".into()],
            searches: vec!["svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        });
        let args = req.capability_args();
        assert_eq!(args["portMappings"][0]["hostIP"], "127.0.0.1");
        assert_eq!(args["dns"]["searches"][0], "svc.cluster.local");
        assert!(AttachRequest::new("x", &netns).capability_args().is_empty());
    }

    #[tokio::test]
    async fn setup_chains_results_and_teardown_runs_in_reverse_with_the_cached_result() {
        let fake = Fake::new(Some(three_plugins()), &["loopback", "a", "b", "c", "ipam"]);
        let netns = fake.netns();
        let mgr = fake.manager();
        let req = request(&netns);

        assert!(mgr.cached_attachments().is_empty());
        let result = mgr.setup(&req).await.unwrap();
        assert_eq!(mgr.cached_attachments(), [("sandbox1".to_string(), "eth0".to_string())]);
        assert_eq!(
            result.ips,
            vec!["10.9.0.4".parse::<IpAddr>().unwrap()],
            "{:?}",
            result.raw
        );
        assert_eq!(result.raw["interfaces"][0]["name"], "c");
        let calls = fake.calls();
        assert_eq!(
            calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
            ["ADD-loopback", "ADD-a", "ADD-b", "ADD-c"]
        );
        // loopback: its own network, on lo, no prevResult.
        let (_, lo, lo_env) = &calls[0];
        assert_eq!(lo["name"], LOOPBACK_NETWORK);
        assert!(lo.get("prevResult").is_none());
        assert_eq!(lo_env[2], "lo");
        // Each plugin gets the previous one's result.
        assert!(calls[1].1.get("prevResult").is_none());
        assert_eq!(calls[2].1["prevResult"]["interfaces"][0]["name"], "a");
        assert_eq!(calls[3].1["prevResult"]["interfaces"][0]["name"], "b");
        // Environment.
        let env = &calls[1].2;
        assert_eq!(env[0], "sandbox1");
        assert_eq!(env[1], netns.display().to_string());
        assert_eq!(env[2], "eth0");
        assert!(env[3].contains("K8S_POD_NAME=web"));
        assert_eq!(
            env[4],
            format!(
                "{}:{}",
                fake.dir.path().join("nope").display(),
                fake.dir.path().join("bin").display()
            )
        );

        // CHECK: in order, the given result as prevResult.
        fake.clear_log();
        mgr.check(&req, &result.raw).await.unwrap();
        let calls = fake.calls();
        assert_eq!(
            calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
            ["CHECK-a", "CHECK-b", "CHECK-c"]
        );
        assert!(calls.iter().all(|c| c.1["prevResult"] == result.raw));

        // The conf dir changes: teardown still uses the list the attachment was made with.
        fs::write(
            fake.config.conf_dir.join("10-test.conflist"),
            json!({"cniVersion": "1.0.0", "name": "other", "plugins": [{"type": "a"}]}).to_string(),
        )
        .unwrap();
        fake.clear_log();
        mgr.teardown(&req).await.unwrap();
        let calls = fake.calls();
        assert_eq!(
            calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
            ["DEL-c", "DEL-b", "DEL-a", "DEL-loopback"]
        );
        assert!(calls[..3]
            .iter()
            .all(|c| c.1["prevResult"] == result.raw && c.1["name"] == "testnet"));
        assert_eq!(calls[0].1["runtimeConfig"]["portMappings"][0]["hostPort"], 8080);
        // The fake netns is a plain file, not a namespace: DEL gets an empty CNI_NETNS (the root
        // tests see a real path passed on).
        assert_eq!(calls[1].2[1], "");
        assert!(mgr.cached_attachments().is_empty());

        // Again, with the netns gone: current config, no prevResult, empty CNI_NETNS.
        fs::remove_file(&netns).unwrap();
        fake.clear_log();
        mgr.teardown(&req).await.unwrap();
        let calls = fake.calls();
        assert_eq!(
            calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
            ["DEL-a", "DEL-loopback"]
        );
        assert!(calls[0].1.get("prevResult").is_none());
        assert_eq!(calls[0].1["name"], "other");
        assert_eq!(calls[0].2[1], "");
    }

    #[tokio::test]
    async fn a_failing_add_is_reported_and_rolled_back() {
        let fake = Fake::new(Some(three_plugins()), &["loopback", "a", "b", "c", "ipam"]);
        fake.touch(
            "b.ADD.fail",
            r#"{"cniVersion":"1.0.0","code":11,"msg":"try again later","details":"busy"}"#,
        );
        let netns = fake.netns();
        let mgr = fake.manager();
        let err = mgr.setup(&request(&netns)).await.unwrap_err();
        match &err {
            CniError::Plugin {
                plugin,
                command,
                code,
                msg,
                details,
            } => {
                assert_eq!((plugin.as_str(), *command, *code), ("b", "ADD", 11));
                assert_eq!((msg.as_str(), details.as_str()), ("try again later", "busy"));
            }
            other => panic!("{other:?}"),
        }
        assert!(
            err.to_string()
                .contains("CNI plugin b ADD failed (code 11): try again later: busy"),
            "{err}"
        );
        let calls = fake.calls();
        assert_eq!(
            calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
            ["ADD-loopback", "ADD-a", "ADD-b", "DEL-b", "DEL-a", "DEL-loopback"]
        );
        // The rollback DEL gets the last good result.
        assert_eq!(calls[3].1["prevResult"]["interfaces"][0]["name"], "a");
        assert!(!fake
            .dir
            .path()
            .join("state/cni/results")
            .join("testnet-sandbox1-eth0")
            .exists());

        // Unstructured failure: stderr/stdout text.
        fs::remove_file(fake.dir.path().join("b.ADD.fail")).unwrap();
        fake.touch("loopback.ADD.fail", "plain words");
        fake.clear_log();
        let err = mgr.setup(&request(&netns)).await.unwrap_err();
        assert!(
            matches!(&err, CniError::Failed { plugin, message, .. } if plugin == "loopback" && message.contains("plain words")),
            "{err:?}"
        );
        assert_eq!(fake.labels(), ["ADD-loopback", "DEL-loopback"]);
    }

    #[tokio::test]
    async fn a_hanging_plugin_times_out() {
        let fake = Fake::new(Some(three_plugins()), &["loopback", "a", "b", "c", "ipam"]);
        fake.touch("a.ADD.sleep", "");
        let netns = fake.netns();
        let mgr = fake.manager().with_timeout(Duration::from_millis(300));
        let started = std::time::Instant::now();
        let err = mgr.setup(&request(&netns)).await.unwrap_err();
        assert!(
            matches!(&err, CniError::Timeout { plugin, command: "ADD", .. } if plugin == "a"),
            "{err:?}"
        );
        assert!(started.elapsed() < Duration::from_secs(4));
    }

    #[tokio::test]
    async fn check_and_status_follow_the_list_version() {
        let mut list = three_plugins();
        list["cniVersion"] = json!("0.3.1");
        let fake = Fake::new(Some(list.clone()), &["loopback", "a", "b", "c", "ipam"]);
        let netns = fake.netns();
        let mgr = fake.manager();
        let req = request(&netns);
        // 0.3.1: no CHECK, no STATUS.
        mgr.check(&req, &json!({})).await.unwrap();
        mgr.status().await.unwrap();
        assert!(fake.labels().is_empty());

        list["cniVersion"] = json!("1.0.0");
        list["disableCheck"] = json!(true);
        fs::write(fake.config.conf_dir.join("10-test.conflist"), list.to_string()).unwrap();
        mgr.check(&req, &json!({})).await.unwrap();
        assert!(fake.labels().is_empty());

        // 1.1: the highest supported of cniVersions; STATUS in order, failures reported.
        list["cniVersions"] = json!(["1.0.0", "1.1.0", "9.0.0"]);
        fs::write(fake.config.conf_dir.join("10-test.conflist"), list.to_string()).unwrap();
        mgr.status().await.unwrap();
        let calls = fake.calls();
        assert_eq!(
            calls.iter().map(|c| c.0.as_str()).collect::<Vec<_>>(),
            ["STATUS-a", "STATUS-b", "STATUS-c"]
        );
        assert_eq!(calls[0].1["cniVersion"], "1.1.0");
        fake.touch("b.STATUS.fail", r#"{"code":50,"msg":"The plugin is not available"}"#);
        let err = mgr.status().await.unwrap_err();
        assert!(matches!(err, CniError::Plugin { code: 50, .. }), "{err:?}");
    }

    #[test]
    fn network_falls_back_to_the_embedded_default_only_without_config() {
        let fake = Fake::new(None, &["bridge", "portmap", "firewall", "host-local"]);
        let mgr = fake.manager();
        // No loopback plugin: not ready.
        let err = mgr.network().unwrap_err();
        assert!(
            matches!(&err, NotReady::PluginMissing { plugin, .. } if plugin == "loopback"),
            "{err}"
        );
        fake.plugin("loopback", 9);
        let net = mgr.network().unwrap();
        assert_eq!(net.conf_file, Path::new(EMBEDDED_CONF_FILE));
        assert_eq!(net.name, DEFAULT_NETWORK_NAME);
        assert_eq!(net.cni_version, "1.0.0");
        assert_eq!(
            net.plugins.iter().map(|p| p.0.as_str()).collect::<Vec<_>>(),
            ["bridge", "portmap", "firewall"]
        );
        assert_eq!(
            mgr.default_conflist()["plugins"][0]["ipam"]["dataDir"],
            json!(fake.dir.path().join("state/cni/networks"))
        );
        // The IPAM plugin is required too.
        fs::remove_file(fake.dir.path().join("bin/host-local")).unwrap();
        assert!(matches!(mgr.network(), Err(NotReady::PluginMissing { plugin, .. }) if plugin == "host-local"));
        fake.plugin("host-local", 10);

        // A config in the conf dir wins; a broken one is reported, not replaced.
        fs::write(fake.config.conf_dir.join("a.conflist"), "{").unwrap();
        assert!(matches!(mgr.network(), Err(NotReady::BadConfig { .. })));
        fs::write(
            fake.config.conf_dir.join("a.conflist"),
            r#"{"cniVersion":"0.4.0","name":"mine","plugins":[{"type":"portmap"}]}"#,
        )
        .unwrap();
        assert_eq!(mgr.network().unwrap().name, "mine");
    }

    #[tokio::test]
    async fn single_plugin_conf_files_are_one_plugin_lists() {
        let fake = Fake::new(None, &["loopback", "a", "ipam"]);
        fs::write(
            fake.config.conf_dir.join("10-a.conf"),
            r#"{"cniVersion":"0.4.0","name":"single","type":"a","ipam":{"type":"ipam"}}"#,
        )
        .unwrap();
        let netns = fake.netns();
        let mgr = fake.manager();
        let req = AttachRequest::new("s2", &netns);
        let result = mgr.setup(&req).await.unwrap();
        assert_eq!(result.ips, vec!["10.9.0.2".parse::<IpAddr>().unwrap()]);
        let calls = fake.calls();
        assert_eq!(calls[1].0, "ADD-a");
        assert_eq!(calls[1].1["name"], "single");
        assert_eq!(calls[1].1["cniVersion"], "0.4.0");
        assert_eq!(calls[1].1["ipam"]["type"], "ipam");
    }

    #[tokio::test]
    async fn bad_requests_are_refused_before_any_plugin_runs() {
        let fake = Fake::new(Some(three_plugins()), &["loopback", "a", "b", "c", "ipam"]);
        let netns = fake.netns();
        let mgr = fake.manager();
        for (id, ifname) in [
            ("", "eth0"),
            ("../x", "eth0"),
            ("ok", "averyveryverylongname"),
            ("ok", ""),
        ] {
            let req = AttachRequest {
                ifname,
                ..AttachRequest::new(id, &netns)
            };
            assert!(matches!(mgr.setup(&req).await, Err(CniError::InvalidRequest(_))));
            assert!(matches!(mgr.teardown(&req).await, Err(CniError::InvalidRequest(_))));
        }
        assert!(fake.labels().is_empty());
    }

    #[test]
    fn result_ips_prefers_ipv4_and_skips_host_side_interfaces() {
        let result = json!({
            "cniVersion": "1.0.0",
            "interfaces": [
                {"name": "cni0", "mac": "aa"},
                {"name": "veth1", "mac": "bb"},
                {"name": "eth0", "mac": "cc", "sandbox": "/run/scute/netns/x"}
            ],
            "ips": [
                {"address": "fd00::5/64", "interface": 2},
                {"address": "10.88.0.1/16", "interface": 0},
                {"address": "10.88.0.5/16", "gateway": "10.88.0.1", "interface": 2}
            ]
        });
        assert_eq!(
            result_ips(&result),
            vec!["10.88.0.5".parse::<IpAddr>().unwrap(), "fd00::5".parse().unwrap()]
        );
        // No interface index: taken.
        assert_eq!(result_ips(&json!({"ips": [{"address": "10.1.0.2/24"}]})).len(), 1);
        // 0.2.0 layout.
        assert_eq!(
            result_ips(&json!({"ip4": {"ip": "10.1.0.3/24"}, "ip6": {"ip": "fd00::3/64"}})),
            vec!["10.1.0.3".parse::<IpAddr>().unwrap(), "fd00::3".parse().unwrap()]
        );
    }

    #[test]
    fn versions_compare_numerically() {
        assert!(version_at_least("1.0.0", "0.4.0"));
        assert!(version_at_least("0.10.0", "0.4.0"));
        assert!(!version_at_least("0.3.1", "0.4.0"));
        assert!(!version_at_least("", "0.2.0"));
        assert!(version_at_least("1.1.0", "1.1.0"));
    }
}

/// Debian's real plugins from /usr/lib/cni in real namespaces: needs root (skipped otherwise).
/// Every test uses its own bridge name, subnet and data dir and removes what it made.
#[cfg(test)]
mod real_plugin_tests {
    use super::*;
    use crate::sandbox::netns::NetNs;
    use std::fs;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::os::fd::AsRawFd;
    use std::process::Command;
    use std::sync::Arc;

    const PLUGIN_DIR: &str = "/usr/lib/cni";

    fn usable() -> bool {
        let ok = nix::unistd::geteuid().is_root() && Path::new(PLUGIN_DIR).join("bridge").exists();
        if !ok {
            eprintln!("skipped: needs root and {PLUGIN_DIR}");
        }
        ok
    }

    fn random() -> u64 {
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos(),
        );
        h.finish()
    }

    /// A test network: unique bridge "sct" + 6 chars, unique /24, temp conf/data/state dirs, and
    /// a guard that tears down, unpins and deletes the bridge even when the test fails.
    struct Net {
        dir: tempfile::TempDir,
        bridge: String,
        /// e.g. "10.213.7." (a /24)
        prefix: String,
        mgr: Arc<CniManager>,
        pods: Vec<(String, PathBuf)>,
    }

    impl Net {
        /// `plugins` after bridge; `None` for an empty conf dir (the embedded default, moved to
        /// this test's bridge and subnet).
        fn new(extra: Option<Vec<Value>>) -> Net {
            let r = random();
            let alphabet = b"abcdefghijklmnopqrstuvwxyz0123456789";
            let bridge: String = std::iter::once("sct".to_string())
                .chain((0..6).map(|i| (alphabet[((r >> (i * 6)) % 36) as usize] as char).to_string()))
                .collect();
            let prefix = format!("10.{}.{}.", 200 + (r >> 40) % 50, (r >> 48) % 256);
            let subnet = format!("{prefix}0/24");
            let dir = tempfile::tempdir().unwrap();
            let config = CniConfig {
                conf_dir: dir.path().join("net.d"),
                bin_dirs: vec![PathBuf::from(PLUGIN_DIR)],
            };
            fs::create_dir_all(&config.conf_dir).unwrap();
            let state = dir.path().join("state");
            let mut mgr = CniManager::new(&config, &state);
            match extra {
                Some(extra) => {
                    let mut list = default_conflist(&bridge, &subnet, &dir.path().join("ipam"));
                    list["name"] = json!("test-net");
                    let plugins = list["plugins"].as_array_mut().unwrap();
                    plugins.truncate(1);
                    plugins.extend(extra);
                    fs::write(config.conf_dir.join("10-test.conflist"), list.to_string()).unwrap();
                }
                None => mgr = mgr.with_default_network(&bridge, &subnet),
            }
            Net {
                dir,
                bridge,
                prefix,
                mgr: Arc::new(mgr),
                pods: Vec::new(),
            }
        }

        fn pod(&mut self, name: &str) -> (String, PathBuf) {
            let id = format!("{}{name}", self.bridge);
            let path = self.dir.path().join("netns").join(&id);
            NetNs::create(&path).unwrap();
            self.pods.push((id.clone(), path.clone()));
            (id, path)
        }
    }

    impl Drop for Net {
        fn drop(&mut self) {
            let mgr = self.mgr.clone();
            let pods = self.pods.clone();
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                for (id, path) in &pods {
                    let _ = rt.block_on(mgr.teardown(&AttachRequest::new(id, path)));
                    let _ = NetNs::remove(path);
                }
            })
            .join()
            .unwrap();
            let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
        }
    }

    fn portmap() -> Value {
        json!({"type": "portmap", "capabilities": {"portMappings": true}, "snat": true})
    }

    fn run(cmd: &mut Command) -> (bool, String) {
        let out = cmd.output().unwrap();
        let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        (out.status.success(), text)
    }

    /// `ip -o link show <ifname>` inside the pinned namespace.
    fn link_in(netns: &Path, ifname: &str) -> String {
        let (ok, text) = run(Command::new("nsenter")
            .arg(format!("--net={}", netns.display()))
            .args(["ip", "-o", "link", "show", ifname]));
        assert!(ok, "{text}");
        text
    }

    fn host_link_exists(name: &str) -> bool {
        run(Command::new("ip").args(["link", "show", name])).0
    }

    /// Runs `f` on a thread inside the network namespace (sockets it makes stay in there).
    fn inside<T: Send + 'static>(netns: &Path, f: impl FnOnce() -> T + Send + 'static) -> T {
        let ns = fs::File::open(netns).unwrap();
        std::thread::spawn(move || {
            // SAFETY: setns on this thread only; the thread ends after `f`.
            assert_eq!(unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) }, 0);
            f()
        })
        .join()
        .unwrap()
    }

    fn mounted(path: &Path) -> bool {
        scute_sys::mountinfo::is_mountpoint(path)
    }

    /// Host-side interfaces of a result: no sandbox, not the bridge.
    fn host_veths(result: &Value, bridge: &str) -> Vec<String> {
        result["interfaces"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|i| i.get("sandbox").is_none() && i["name"] != bridge)
            .map(|i| i["name"].as_str().unwrap().to_string())
            .collect()
    }

    fn echo_through(listener: TcpListener, mut stream: TcpStream) {
        let (mut served, _) = listener.accept().unwrap();
        stream.write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        served.read_exact(&mut buf).unwrap();
        assert_eq!(&buf, b"ping");
    }

    #[tokio::test]
    async fn two_pods_get_addresses_talk_and_leave_nothing_behind() {
        if !usable() {
            return;
        }
        let mut net = Net::new(Some(vec![portmap()]));
        let (id_a, ns_a) = net.pod("a");
        let (id_b, ns_b) = net.pod("b");
        let req_a = AttachRequest {
            pod_name: "a",
            pod_namespace: "default",
            pod_uid: "uid-a",
            ..AttachRequest::new(&id_a, &ns_a)
        };
        let req_b = AttachRequest::new(&id_b, &ns_b);
        assert_eq!(net.mgr.network().unwrap().name, "test-net");

        let a = net.mgr.setup(&req_a).await.unwrap();
        let b = net.mgr.setup(&req_b).await.unwrap();
        for r in [&a, &b] {
            assert_eq!(r.ips.len(), 1, "{}", r.raw);
            assert!(
                r.ips[0].to_string().starts_with(&net.prefix),
                "{:?} not in {}0/24",
                r.ips,
                net.prefix
            );
        }
        assert_ne!(a.ips, b.ips);
        for ns in [&ns_a, &ns_b] {
            assert!(link_in(ns, "eth0").contains(",UP"), "{}", link_in(ns, "eth0"));
            assert!(link_in(ns, "lo").contains(",UP"), "{}", link_in(ns, "lo"));
        }
        let lease = |r: &AttachResult| net.dir.path().join("ipam/test-net").join(r.ips[0].to_string());
        assert!(lease(&a).exists() && lease(&b).exists());
        let veths: Vec<String> = [&a, &b].iter().flat_map(|r| host_veths(&r.raw, &net.bridge)).collect();
        assert_eq!(veths.len(), 2, "{}", a.raw);
        assert!(veths.iter().all(|v| host_link_exists(v)));

        // b connects to a over the bridge.
        let listener = inside(&ns_a, || TcpListener::bind("0.0.0.0:0").unwrap());
        let port = listener.local_addr().unwrap().port();
        let ip_a = a.ips[0];
        let stream = inside(&ns_b, move || {
            TcpStream::connect_timeout(&(ip_a, port).into(), Duration::from_secs(5)).unwrap()
        });
        echo_through(listener, stream);

        // CHECK agrees with what is there.
        net.mgr.check(&req_a, &a.raw).await.unwrap();

        for req in [&req_a, &req_b] {
            net.mgr.teardown(req).await.unwrap();
            net.mgr.teardown(req).await.unwrap();
        }
        assert!(veths.iter().all(|v| !host_link_exists(v)), "veths left: {veths:?}");
        assert!(!lease(&a).exists() && !lease(&b).exists(), "IPs not released");
        assert!(!net
            .dir
            .path()
            .join("state/cni/results")
            .join(format!("test-net-{id_a}-eth0"))
            .exists());
        for ns in [&ns_a, &ns_b] {
            NetNs::remove(ns).unwrap();
            assert!(!mounted(ns));
        }
        // Teardown after the netns is gone (empty CNI_NETNS) still succeeds.
        net.mgr.teardown(&req_a).await.unwrap();
    }

    #[tokio::test]
    async fn host_ports_are_mapped_and_unmapped() {
        if !usable() {
            return;
        }
        let mut net = Net::new(Some(vec![portmap()]));
        let (id, ns) = net.pod("p");
        let req = AttachRequest {
            port_mappings: vec![PortMapping {
                host_port: 18080,
                container_port: 80,
                protocol: "tcp".into(),
                host_ip: String::new(),
            }],
            ..AttachRequest::new(&id, &ns)
        };
        let pod = net.mgr.setup(&req).await.unwrap();
        let rules = || {
            let (_, text) = run(Command::new("iptables").args(["-w", "-t", "nat", "-S", "CNI-HOSTPORT-DNAT"]));
            text.lines()
                .filter(|l| l.contains(&id) && l.contains("18080"))
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        assert_eq!(rules().len(), 1, "{:?}", rules());

        // The host reaches the pod's port 80 through the host port on the gateway address.
        let listener = inside(&ns, || TcpListener::bind("0.0.0.0:80").unwrap());
        let gateway: IpAddr = format!("{}1", net.prefix).parse().unwrap();
        let stream = TcpStream::connect_timeout(&(gateway, 18080).into(), Duration::from_secs(5)).unwrap();
        echo_through(listener, stream);
        assert!(pod.ips[0].to_string().starts_with(&net.prefix));

        net.mgr.teardown(&req).await.unwrap();
        assert!(rules().is_empty(), "{:?}", rules());
    }

    #[tokio::test]
    async fn the_embedded_default_network_works_with_debian_plugins() {
        if !usable() {
            return;
        }
        let mut net = Net::new(None);
        let network = net.mgr.network().unwrap();
        assert_eq!(network.conf_file, Path::new(EMBEDDED_CONF_FILE));
        net.mgr.status().await.unwrap();
        let (id, ns) = net.pod("d");
        let req = AttachRequest::new(&id, &ns);
        let pod = net.mgr.setup(&req).await.unwrap();
        assert!(pod.ips[0].to_string().starts_with(&net.prefix), "{}", pod.raw);
        let lease = net
            .dir
            .path()
            .join("state/cni/networks")
            .join(DEFAULT_NETWORK_NAME)
            .join(pod.ips[0].to_string());
        assert!(lease.exists());
        assert!(link_in(&ns, "eth0").contains(",UP"));
        let forward_rules = || {
            let (_, text) = run(Command::new("iptables").args(["-w", "-S", "CNI-FORWARD"]));
            let ip = format!("{}/32", pod.ips[0]);
            text.lines().filter(|l| l.contains(&ip)).count()
        };
        assert!(forward_rules() > 0, "firewall added no rule");
        net.mgr.teardown(&req).await.unwrap();
        assert!(!lease.exists());
        assert_eq!(forward_rules(), 0);
        NetNs::remove(&ns).unwrap();
        net.mgr.teardown(&req).await.unwrap();
    }
}
