//! A real kubelet (v1.36.2 from `../shared/tools`) in standalone mode driving a test daemon:
//! static pods from a temp manifest dir, its read-only port (`/pods`, `/stats/summary`) on a
//! free loopback port, its own root, cert and pod-log dirs, and a cgroup root of its own in every
//! hierarchy. What the kubelet needs on this host kind is in `../shared/tools/README.md`.
//!
//! Without `../shared/tools` (a user's clone) `Node::start` answers None and the test says it
//! was skipped. Kubelet tests run one at a time (a process-wide lock): the kubelet sets host
//! sysctls, which are saved before it starts and restored when the node is dropped.
//!
//! On drop: the manifests are removed and the kubelet given time to stop the pods, the kubelet
//! is stopped by PID, the daemon removes what is left (and checks nothing leaked), the kubelet's
//! cgroup root is removed (a process still in it is a leak), the sysctls are restored and the
//! `/var/log/containers` links of the node's namespace removed. The kubelet's log is printed when
//! the test failed.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use serde_json::{json, Value};

use super::{free_port, repo_root, wait_or_kill, Daemon, Registry, TestNetwork};

/// The device plugin API's fixed directory (v1beta1.DevicePluginPath); the kubelet makes it
/// (and /var/lib/kubelet) whatever its root dir.
const DEVICE_PLUGINS_DIR: &str = "/var/lib/kubelet/device-plugins";

/// The sysctls the kubelet sets at start (`setupKernelTunables`, protectKernelDefaults off).
const KUBELET_SYSCTLS: [&str; 6] = [
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
];

/// The directory holding the `kubelet`, `crictl` and `critest` binaries: `SCUTE_TEST_TOOLS`
/// (hack/test.sh sets it), else what `../shared/tools/install.sh` unpacks. None without either.
pub fn tools_dir() -> Option<PathBuf> {
    static DIR: OnceLock<Option<PathBuf>> = OnceLock::new();
    DIR.get_or_init(|| {
        if let Some(dir) = std::env::var_os("SCUTE_TEST_TOOLS").map(PathBuf::from) {
            return dir.join("kubelet").is_file().then_some(dir);
        }
        let install = repo_root().join("../shared/tools/install.sh");
        if !install.is_file() {
            return None;
        }
        let out = Command::new(&install).output().expect("run ../shared/tools/install.sh");
        assert!(
            out.status.success(),
            "../shared/tools/install.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Some(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim()))
    })
    .clone()
}

/// One registry with the test images for every node of this test binary (starting and filling
/// one per node cost about 10 s each): stopped and removed when the process exits.
fn shared_registry() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    extern "C" fn stop_registry() {
        if let Some(registry) = REGISTRY.get() {
            registry.shut_down();
        }
    }
    REGISTRY.get_or_init(|| {
        let registry = Registry::with_test_images();
        // SAFETY: registers a plain function; libtest's exit (success or failure) runs it.
        unsafe { libc::atexit(stop_registry) };
        registry
    })
}

/// The lock every node holds: one kubelet at a time on the host.
fn host_lock() -> MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A node: the binary's shared registry with the test images, a daemon mirroring public registries to it on
/// a CNI bridge network of its own, and a kubelet running the manifests written with `apply`.
pub struct Node {
    pub daemon: Daemon,
    _network: TestNetwork,
    kubelet: Option<Child>,
    kubelet_bin: PathBuf,
    dir: tempfile::TempDir,
    /// /var/lib/kubelet did not exist before this node's kubelet made it: removed on drop.
    made_var_lib_kubelet: bool,
    pub name: String,
    /// The namespace every pod of this node is put in (log links are found by it).
    pub namespace: String,
    pub cgroup_root: String,
    pub read_only_port: u16,
    http: reqwest::Client,
    sysctls: Vec<(PathBuf, String)>,
    _host: MutexGuard<'static, ()>,
}

impl Node {
    /// Starts a node; `config` holds extra KubeletConfiguration fields (merged over the harness's).
    /// None, after saying so, when the kubelet is not available.
    pub fn start(test: &str, config: Value) -> Option<Node> {
        Self::start_with_daemon(test, config, "")
    }

    /// `start` with `daemon_toml` added to the daemon's config.
    pub fn start_with_daemon(test: &str, config: Value, daemon_toml: &str) -> Option<Node> {
        let Some(tools) = tools_dir() else {
            eprintln!("SKIPPED {test}: no kubelet (../shared/tools is not beside this checkout)");
            return None;
        };
        let host = host_lock();
        let daemon = Daemon::start(daemon_toml);
        daemon.mirror_public_registries_to(&shared_registry().addr);
        let network = TestNetwork::install(&daemon);
        let dir = tempfile::Builder::new().prefix("scute-kubelet-").tempdir().unwrap();
        let tag = format!("{}-{}", std::process::id(), free_port());
        let mut node = Node {
            daemon,
            _network: network,
            kubelet: None,
            kubelet_bin: tools.join("kubelet"),
            name: format!("kt-{tag}"),
            namespace: format!("kt-{}", test.replace('_', "-")),
            // systemd's driver takes the slice tree under "/" (kubepods.slice); the VM node runs
            // one kubelet at a time.
            cgroup_root: if super::systemd_driver() {
                "/".to_string()
            } else {
                format!("/scute-kubelet-{tag}")
            },
            read_only_port: free_port(),
            http: reqwest::Client::new(),
            sysctls: KUBELET_SYSCTLS
                .iter()
                .map(|name| {
                    let path = Path::new("/proc/sys").join(name);
                    let value = std::fs::read_to_string(&path).unwrap_or_default();
                    (path, value)
                })
                .collect(),
            dir,
            made_var_lib_kubelet: !Path::new(DEVICE_PLUGINS_DIR).parent().unwrap().exists(),
            _host: host,
        };
        for sub in ["manifests", "root", "pki", "pod-logs", "volume-plugins"] {
            std::fs::create_dir_all(node.dir.path().join(sub)).unwrap();
        }
        std::fs::write(node.dir.path().join("resolv.conf"), "nameserver 127.0.0.1\n").unwrap();
        if !super::systemd_driver() {
            for hierarchy in cgroup_hierarchies() {
                make_cgroup(&hierarchy, &node.cgroup_root);
            }
        }
        node.write_config(config);
        share_root_dir(&node.dir.path().join("root"));
        // A socket an earlier kubelet left would pass for this one's until it replaced it.
        let _ = std::fs::remove_file(Path::new(DEVICE_PLUGINS_DIR).join("kubelet.sock"));
        node.spawn_kubelet();
        Some(node)
    }

    fn write_config(&self, extra: Value) {
        let dir = self.dir.path();
        let mut config = json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "containerRuntimeEndpoint": format!("unix://{}", self.daemon.socket.display()),
            "staticPodPath": dir.join("manifests"),
            "fileCheckFrequency": "1s",
            "syncFrequency": "5s",
            "address": "127.0.0.1",
            "readOnlyPort": self.read_only_port,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": free_port(),
            "enableServer": false,
            "authentication": {"anonymous": {"enabled": true}, "webhook": {"enabled": false}},
            "authorization": {"mode": "AlwaysAllow"},
            "failSwapOn": false,
            "cgroupDriver": if super::systemd_driver() { "systemd" } else { "cgroupfs" },
            "cgroupRoot": self.cgroup_root,
            "cgroupsPerQOS": true,
            "oomScoreAdj": 0,
            "makeIPTablesUtilChains": false,
            "protectKernelDefaults": false,
            "evictionHard": {"memory.available": "0%", "nodefs.available": "0%", "nodefs.inodesFree": "0%", "imagefs.available": "0%"},
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "resolvConf": dir.join("resolv.conf"),
            "podLogsDir": dir.join("pod-logs"),
            "volumePluginDir": dir.join("volume-plugins"),
            "serializeImagePulls": false,
        });
        // kubelet 1.35+ refuses cgroup v1 hosts unless told otherwise; a v2 node keeps its default.
        if !scute::cgroups::unified_only() {
            config["failCgroupV1"] = json!(false);
        }
        if let (Some(base), Value::Object(extra)) = (config.as_object_mut(), extra) {
            base.extend(extra);
        }
        // JSON is YAML: the kubelet reads it as its config file.
        std::fs::write(dir.join("config.json"), config.to_string()).unwrap();
    }

    fn spawn_kubelet(&mut self) {
        let dir = self.dir.path();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.kubelet_log_path())
            .unwrap();
        let mut command = Command::new(&self.kubelet_bin);
        // A test process that dies (or a drop that never runs) takes its kubelet with it.
        unsafe {
            use std::os::unix::process::CommandExt;
            command.pre_exec(|| {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command
            .arg("--config")
            .arg(dir.join("config.json"))
            .arg("--root-dir")
            .arg(dir.join("root"))
            .arg("--cert-dir")
            .arg(dir.join("pki"))
            .arg("--hostname-override")
            .arg(&self.name)
            .arg("-v=2")
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn kubelet");
        self.kubelet = Some(child);
        self.wait_healthy();
    }

    fn wait_healthy(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let addr = format!("127.0.0.1:{}", self.read_only_port);
        loop {
            if let Some(status) = self.kubelet.as_mut().unwrap().try_wait().unwrap() {
                panic!("the kubelet exited during start ({status}):\n{}", self.kubelet_log());
            }
            // Its read-only server opens once the kubelet has checked the runtime and the host.
            if std::net::TcpStream::connect(&addr).is_ok() {
                return;
            }
            if Instant::now() > deadline {
                panic!("the kubelet did not open {addr} in 60 s:\n{}", self.kubelet_log());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// The cgroup (below a hierarchy's root) the kubelet made for a pod of QoS `class`
    /// ("Guaranteed", "Burstable", "BestEffort"), as each cgroup driver names it.
    pub fn pod_cgroup(&self, class: &str, uid: &str) -> String {
        let qos = match class {
            "Guaranteed" => "",
            "Burstable" => "burstable",
            "BestEffort" => "besteffort",
            other => panic!("no QoS class {other}"),
        };
        if super::systemd_driver() {
            // systemd escapes the '-' of a slice name's part as '_'.
            let uid = uid.replace('-', "_");
            match qos {
                "" => format!("/kubepods.slice/kubepods-pod{uid}.slice"),
                q => format!("/kubepods.slice/kubepods-{q}.slice/kubepods-{q}-pod{uid}.slice"),
            }
        } else {
            let root = self.cgroup_root.trim_end_matches('/');
            match qos {
                "" => format!("{root}/kubepods/pod{uid}"),
                q => format!("{root}/kubepods/{q}/pod{uid}"),
            }
        }
    }

    /// Where device plugins register (`kubelet.sock`) and serve: fixed by the device plugin
    /// API, not under the kubelet's root dir.
    pub fn device_plugins_dir(&self) -> PathBuf {
        PathBuf::from(DEVICE_PLUGINS_DIR)
    }

    /// The registry the node's daemon pulls registry.k8s.io names from (its mirror).
    pub fn registry_addr(&self) -> String {
        shared_registry().addr.clone()
    }

    /// The kubelet's `--root-dir`.
    pub fn root_dir(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    pub fn kubelet_log_path(&self) -> PathBuf {
        self.dir.path().join("kubelet.log")
    }

    pub fn kubelet_log(&self) -> String {
        std::fs::read_to_string(self.kubelet_log_path()).unwrap_or_default()
    }

    /// Where the kubelet keeps the pods' logs (`podLogsDir`).
    pub fn pod_logs_dir(&self) -> PathBuf {
        self.dir.path().join("pod-logs")
    }

    /// Writes (or replaces) a static pod: `pod` is a Pod object; apiVersion, kind and the node's
    /// namespace are filled in, and a 2 s grace period unless it sets one. Answers the name the
    /// kubelet gives the pod (`<name>-<node>`).
    pub fn apply(&self, mut pod: Value) -> String {
        let name = pod["metadata"]["name"].as_str().expect("metadata.name").to_string();
        pod["apiVersion"] = json!("v1");
        pod["kind"] = json!("Pod");
        pod["metadata"]["namespace"] = json!(self.namespace);
        if pod["spec"]["terminationGracePeriodSeconds"].is_null() {
            pod["spec"]["terminationGracePeriodSeconds"] = json!(2);
        }
        let manifests = self.dir.path().join("manifests");
        // The kubelet skips dot files: write one, then rename it in place.
        let tmp = manifests.join(format!(".{name}.json"));
        std::fs::write(&tmp, pod.to_string()).unwrap();
        std::fs::rename(&tmp, manifests.join(format!("{name}.json"))).unwrap();
        format!("{name}-{}", self.name)
    }

    /// Removes a static pod's manifest: the kubelet stops and removes the pod.
    pub fn delete(&self, name: &str) {
        let _ = std::fs::remove_file(self.dir.path().join("manifests").join(format!("{name}.json")));
    }

    /// The kubelet's `/pods`: its pods with their status (static pods carry it in standalone mode).
    pub async fn pods(&self) -> Vec<Value> {
        let list = self.get("/pods").await;
        list["items"].as_array().cloned().unwrap_or_default()
    }

    /// The kubelet's view of one pod (by the name `apply` answered), if it has it.
    pub async fn pod(&self, name: &str) -> Option<Value> {
        self.pods().await.into_iter().find(|p| p["metadata"]["name"] == name)
    }

    /// `/stats/summary`.
    pub async fn stats_summary(&self) -> Value {
        self.get("/stats/summary").await
    }

    async fn get(&self, path: &str) -> Value {
        get(&self.http, self.read_only_port, path)
            .await
            .unwrap_or_else(|e| panic!("{e}"))
    }

    /// Waits until the kubelet's view of pod `name` satisfies `ready`; panics with the pod and the
    /// kubelet's log after `timeout`.
    pub async fn wait_for(&self, name: &str, what: &str, timeout: Duration, ready: impl Fn(&Value) -> bool) -> Value {
        let deadline = Instant::now() + timeout;
        loop {
            let pod = self.pod(name).await;
            if let Some(pod) = pod.as_ref().filter(|p| ready(p)) {
                return pod.clone();
            }
            if Instant::now() > deadline {
                panic!(
                    "pod {name}: not {what} after {timeout:?}; the kubelet has:\n{:#}\nkubelet log (tail):\n{}",
                    pod.unwrap_or(Value::Null),
                    tail(&self.kubelet_log(), 60)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits for the pod's phase to be `phase` (Running, Succeeded, Failed).
    pub async fn wait_phase(&self, name: &str, phase: &str, timeout: Duration) -> Value {
        self.wait_for(name, phase, timeout, |p| p["status"]["phase"] == phase)
            .await
    }

    /// Waits for the pod to be Running with condition Ready true.
    pub async fn wait_ready(&self, name: &str, timeout: Duration) -> Value {
        self.wait_for(name, "Ready", timeout, is_ready).await
    }

    /// Stops the kubelet (SIGTERM, as systemd would) and starts it again with the same config.
    pub fn restart_kubelet(&mut self) {
        self.stop_kubelet();
        self.spawn_kubelet();
    }

    fn stop_kubelet(&mut self) {
        if let Some(mut child) = self.kubelet.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            wait_or_kill(&mut child, Duration::from_secs(20));
        }
    }

    /// Removes every manifest and waits (bounded) for the kubelet to stop the pods: until its
    /// `/pods` is empty and no container runs on the runtime. (`/pods` empties as soon as the
    /// manifests go, while the kubelet is still stopping the containers: a kubelet stopped then
    /// left them to the daemon's removal, each pod after a 10 s grace period of its own, which
    /// was 400 s of a 40-pod test's teardown.)
    fn delete_all(&self) {
        let manifests = self.dir.path().join("manifests");
        for entry in std::fs::read_dir(&manifests).into_iter().flatten().flatten() {
            let _ = std::fs::remove_file(entry.path());
        }
        // Its own runtime on a thread: Drop may run inside a test's runtime, which cannot block.
        let port = self.read_only_port;
        let socket = self.daemon.socket.clone();
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            let http = reqwest::Client::new();
            let running = || async {
                let channel = scute::client::connect(&socket).await.ok()?;
                let mut client = scute::api::runtime_service_client::RuntimeServiceClient::new(channel);
                let filter = scute::api::ContainerFilter {
                    state: Some(scute::api::ContainerStateValue {
                        state: scute::api::ContainerState::ContainerRunning as i32,
                    }),
                    ..Default::default()
                };
                let reply = client
                    .list_containers(scute::api::ListContainersRequest { filter: Some(filter) })
                    .await
                    .ok()?;
                Some(reply.into_inner().containers.len())
            };
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                let pods = runtime.block_on(get(&http, port, "/pods"));
                let forgotten = pods.is_ok_and(|p| p["items"].as_array().is_none_or(|items| items.is_empty()));
                if forgotten && runtime.block_on(running()).is_none_or(|n| n == 0) {
                    return;
                }
                std::thread::sleep(Duration::from_millis(300));
            }
        })
        .join();
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let failed = std::thread::panicking();
        if failed {
            eprintln!("kubelet log (tail):\n{}", tail(&self.kubelet_log(), 200));
        }
        if self.kubelet.is_some() {
            self.delete_all();
        }
        self.stop_kubelet();
        // The daemon removes the pods the kubelet did not and checks nothing leaked.
        self.daemon.remove_all_pods();
        // The kubelet's volumes (tmpfs emptyDirs, projected files) under its root dir.
        let mut mounts = super::mounts_under(self.dir.path());
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mount in mounts {
            let _ = nix::mount::umount2(mount.as_str(), nix::mount::MntFlags::MNT_DETACH);
        }
        let mut leaked = Vec::new();
        if super::systemd_driver() {
            // The kubelet's slices are systemd's units: processes left in them are leaks; the
            // slices go with `systemctl stop` (a kubelet leaves them for its next start).
            leaked.extend(kill_procs_in_tree(Path::new("/sys/fs/cgroup/kubepods.slice")));
            let _ = Command::new("systemctl").args(["stop", "kubepods.slice"]).status();
        } else {
            for hierarchy in cgroup_hierarchies() {
                leaked.extend(remove_cgroup_tree(
                    &hierarchy.join(self.cgroup_root.trim_start_matches('/')),
                ));
            }
        }
        for (path, value) in &self.sysctls {
            if !value.is_empty() {
                let _ = std::fs::write(path, value);
            }
        }
        if self.made_var_lib_kubelet {
            let _ = std::fs::remove_dir_all(Path::new(DEVICE_PLUGINS_DIR).parent().unwrap());
        }
        for entry in std::fs::read_dir("/var/log/containers").into_iter().flatten().flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.contains(&format!("_{}_", self.namespace)) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
        if !leaked.is_empty() && !failed {
            panic!("processes left in the kubelet's cgroups after every pod was removed: {leaked:#?}");
        }
    }
}

/// Makes the kubelet's root dir a shared mount of its own, as the kubelet does at start when it is
/// not one: the kubelet's own bind mount races its pod-resources listener, whose socket, made under
/// the root dir just before the mount, then cannot be renamed into place (EXDEV) and the kubelet
/// exits. Done first, the kubelet finds the dir shared and mounts nothing. Drop unmounts it.
fn share_root_dir(root: &Path) {
    use nix::mount::{mount, MsFlags};
    mount(Some(root), root, None::<&str>, MsFlags::MS_BIND, None::<&str>).expect("bind-mount the kubelet's root dir");
    mount(None::<&str>, root, None::<&str>, MsFlags::MS_SHARED, None::<&str>)
        .expect("make the kubelet's root dir shared");
}

/// GET on the kubelet's read-only port, as JSON.
async fn get(http: &reqwest::Client, port: u16, path: &str) -> Result<Value, String> {
    let url = format!("http://127.0.0.1:{port}{path}");
    let reply = http.get(&url).send().await.map_err(|e| format!("GET {url}: {e}"))?;
    if !reply.status().is_success() {
        return Err(format!("GET {url}: {}", reply.status()));
    }
    let body = reply.text().await.map_err(|e| format!("GET {url}: {e}"))?;
    serde_json::from_str(&body).map_err(|e| format!("GET {url}: {e}: {body}"))
}

/// Prints a figure a user cares about past the test harness's capture (straight to stderr), so
/// that it shows in hack/test.sh's output for passing tests too.
pub fn figure(text: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "figure: {text}");
}

/// Running, and condition Ready true.
pub fn is_ready(pod: &Value) -> bool {
    pod["status"]["phase"] == "Running" && condition(pod, "Ready")
}

/// Whether the pod's condition `kind` is "True".
pub fn condition(pod: &Value, kind: &str) -> bool {
    pod["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|c| c["type"] == kind && c["status"] == "True")
}

/// The status of container `name` (containerStatuses or initContainerStatuses).
pub fn container_status(pod: &Value, name: &str) -> Value {
    ["containerStatuses", "initContainerStatuses"]
        .iter()
        .filter_map(|field| pod["status"][field].as_array())
        .flatten()
        .find(|c| c["name"] == name)
        .cloned()
        .unwrap_or(Value::Null)
}

/// The CRI id of a container from its kubelet status (`cri://<id>`, whatever the scheme).
pub fn container_id(status: &Value) -> String {
    let id = status["containerID"].as_str().unwrap_or_default();
    id.rsplit("://").next().unwrap_or_default().to_string()
}

fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The mount points of every cgroup hierarchy (v1 controllers, named ones, and cgroup2).
pub fn cgroup_hierarchies() -> Vec<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = mountinfo
        .lines()
        .filter_map(|line| {
            let (left, right) = line.split_once(" - ")?;
            let fstype = right.split_whitespace().next()?;
            let mount_point = left.split_whitespace().nth(4)?;
            (fstype == "cgroup" || fstype == "cgroup2").then(|| PathBuf::from(mount_point))
        })
        .collect();
    found.sort();
    found.dedup();
    found
}

/// Makes `/<hierarchy>/<root>`; a cpuset cgroup gets its parent's cpus and mems (it cannot take
/// a task without them).
fn make_cgroup(hierarchy: &Path, root: &str) {
    let dir = hierarchy.join(root.trim_start_matches('/'));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
    for file in ["cpuset.cpus", "cpuset.mems"] {
        if let Ok(value) = std::fs::read_to_string(hierarchy.join(file)) {
            let _ = std::fs::write(dir.join(file), value.trim());
        }
    }
}

/// Removes a cgroup and every cgroup under it, deepest first; answers the processes still in it.
fn remove_cgroup_tree(dir: &Path) -> Vec<String> {
    let leaked = kill_procs_in_tree(dir);
    let mut dirs = vec![dir.to_path_buf()];
    let mut i = 0;
    while i < dirs.len() {
        for entry in std::fs::read_dir(&dirs[i]).into_iter().flatten().flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                dirs.push(entry.path());
            }
        }
        i += 1;
    }
    for dir in dirs.iter().rev() {
        let _ = std::fs::remove_dir(dir);
    }
    leaked
}

/// SIGKILLs every process in a cgroup tree; answers what they were.
fn kill_procs_in_tree(dir: &Path) -> Vec<String> {
    let mut leaked = Vec::new();
    if !dir.is_dir() {
        return leaked;
    }
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            leaked.extend(kill_procs_in_tree(&entry.path()));
        }
    }
    let procs = std::fs::read_to_string(dir.join("cgroup.procs")).unwrap_or_default();
    for pid in procs.split_whitespace() {
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
        leaked.push(format!("{pid} ({}) in {}", comm.trim(), dir.display()));
        if let Ok(pid) = pid.parse() {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    if !leaked.is_empty() {
        std::thread::sleep(Duration::from_millis(200));
    }
    leaked
}
