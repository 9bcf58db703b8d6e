//! Integration test rig: a real `scute serve` with a temp root, state dir and socket, a tonic
//! client generated from our proto over the unix socket, and a real local registry
//! (hack/registry.sh, Debian's docker-registry). Everything a test starts is stopped and
//! removed on drop, also when the test fails.

#![allow(dead_code)]

pub mod device_plugin;
pub mod kubelet;
pub mod open_watch;
pub mod pod;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use scute::api::image_service_client::ImageServiceClient;
use scute::api::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

pub const SCUTE: &str = env!("CARGO_BIN_EXE_scute");

/// The repository root (hack/ and images/ live there).
pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Opens a gRPC channel over a unix socket, the way crictl and the kubelet connect.
pub async fn connect(socket: &Path) -> Channel {
    scute::client::connect(socket)
        .await
        .expect("connect to the daemon socket")
}

/// A running `scute serve` in its own temp dirs.
pub struct Daemon {
    child: Option<Child>,
    dir: tempfile::TempDir,
    pub config_path: PathBuf,
    pub root: PathBuf,
    pub state: PathBuf,
    pub socket: PathBuf,
    pub cni_conf_dir: PathBuf,
    extra_args: Vec<String>,
    /// `root` is a filesystem the test mounted (start_on_tmpfs), unmounted last.
    root_mounted: bool,
}

impl Daemon {
    /// Starts a daemon with the default config except paths, plus `extra_toml` appended (it may
    /// add keys to the tables the rig already writes: use `[grpc]`-free extras, or whole tables).
    pub fn start(extra_toml: &str) -> Daemon {
        Self::start_with_args(extra_toml, &[])
    }

    pub fn start_with_args(extra_toml: &str, extra_args: &[&str]) -> Daemon {
        let mut daemon = Daemon::configure(extra_toml, extra_args);
        daemon.spawn();
        daemon
    }

    /// Like `start`, with `root` on its own tmpfs mounted with `options` ("size=512m"): a disk
    /// a test can fill.
    pub fn start_on_tmpfs(extra_toml: &str, options: &str) -> Daemon {
        let mut daemon = Daemon::configure(extra_toml, &[]);
        std::fs::create_dir_all(&daemon.root).unwrap();
        nix::mount::mount(
            Some("tmpfs"),
            &daemon.root,
            Some("tmpfs"),
            nix::mount::MsFlags::empty(),
            Some(options),
        )
        .expect("mount a tmpfs for the daemon's root");
        daemon.root_mounted = true;
        daemon.spawn();
        daemon
    }

    fn configure(extra_toml: &str, extra_args: &[&str]) -> Daemon {
        let mut extra_args: Vec<&str> = extra_args.to_vec();
        if systemd_driver() {
            extra_args.extend(["--cgroup-driver", "systemd"]);
        }
        let dir = tempfile::Builder::new()
            .prefix("scute-it-")
            .tempdir()
            .expect("temp dir");
        let root = dir.path().join("root");
        let state = dir.path().join("state");
        let socket = state.join("scute.sock");
        let cni_conf_dir = dir.path().join("net.d");
        std::fs::create_dir_all(&cni_conf_dir).unwrap();
        let config_path = dir.path().join("config.toml");
        // `<dir>/cni-bin` first: a test may add a plugin of its own there.
        let config = format!(
            "root = {root:?}\nstate = {state:?}\n[grpc]\naddress = {socket:?}\n[cni]\nconf_dir = {cni_conf_dir:?}\nbin_dirs = [{bins:?}, \"/opt/cni/bin\", \"/usr/lib/cni\"]\n[registry]\nconfig_path = {certs:?}\n{extra_toml}",
            certs = dir.path().join("certs.d"),
            bins = dir.path().join("cni-bin"),
        );
        std::fs::write(&config_path, config).unwrap();
        Daemon {
            child: None,
            dir,
            config_path,
            root,
            state,
            socket,
            cni_conf_dir,
            extra_args: extra_args.iter().map(|s| s.to_string()).collect(),
            root_mounted: false,
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    pub fn log_path(&self) -> PathBuf {
        self.dir.path().join("scute.log")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    pub fn pid(&self) -> Pid {
        Pid::from_raw(self.child.as_ref().expect("daemon running").id() as i32)
    }

    /// The daemon's peak resident memory (VmHWM), KiB.
    pub fn peak_rss_kib(&self) -> u64 {
        status_kib(self.pid().as_raw(), "VmHWM").expect("VmHWM in /proc/<pid>/status")
    }

    fn spawn(&mut self) {
        ensure_shim_built();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.log_path())
            .unwrap();
        let child = Command::new(SCUTE)
            .arg("serve")
            .arg("--config")
            .arg(&self.config_path)
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("spawn scute serve");
        self.child = Some(child);
        self.wait_ready();
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            if std::os::unix::net::UnixStream::connect(&self.socket).is_ok() {
                return;
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("scute exited during start ({status}):\n{}", self.log());
            }
            if Instant::now() > deadline {
                panic!("scute did not open {} in time:\n{}", self.socket.display(), self.log());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends SIGTERM and waits for the exit.
    pub fn stop(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("daemon running");
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        wait_or_kill(&mut child, Duration::from_secs(15))
    }

    /// SIGKILL, as a crash would.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("daemon running");
        let _ = child.kill();
        let _ = child.wait();
    }

    pub fn restart(&mut self) {
        if self.child.is_some() {
            let status = self.stop();
            assert!(status.success(), "scute exited {status} on SIGTERM:\n{}", self.log());
        }
        self.spawn();
    }

    /// Starts the daemon again after `kill`/`stop`.
    pub fn start_again(&mut self) {
        assert!(self.child.is_none());
        self.spawn();
    }

    pub async fn runtime(&self) -> RuntimeServiceClient<Channel> {
        RuntimeServiceClient::new(connect(&self.socket).await)
    }

    pub async fn images(&self) -> ImageServiceClient<Channel> {
        ImageServiceClient::new(connect(&self.socket).await)
    }

    /// RunPodSandbox of `config` with the default runtime handler; answers the pod's ID.
    pub async fn run_pod_sandbox(&self, config: scute::api::PodSandboxConfig) -> Result<String, tonic::Status> {
        self.runtime()
            .await
            .run_pod_sandbox(scute::api::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
            .map(|r| r.into_inner().pod_sandbox_id)
    }

    /// Every pod sandbox the daemon lists (ListPodSandbox without a filter).
    pub async fn pods(&self) -> Vec<scute::api::PodSandbox> {
        self.runtime()
            .await
            .list_pod_sandbox(scute::api::ListPodSandboxRequest::default())
            .await
            .unwrap()
            .into_inner()
            .items
    }

    /// The verbose ContainerStatus's `info` (pid, cgroupsPath, runtimeSpec, …).
    pub async fn container_info(&self, id: &str) -> serde_json::Value {
        let info = self
            .runtime()
            .await
            .container_status(scute::api::ContainerStatusRequest {
                container_id: id.to_string(),
                verbose: true,
            })
            .await
            .unwrap()
            .into_inner()
            .info;
        serde_json::from_str(&info["info"]).unwrap()
    }
}

impl Daemon {
    /// Stops and removes every pod still there, so a test that failed half way leaves no
    /// shim, pause, mount, netns or cgroup behind. Runs its own runtime on a thread: Drop may
    /// run inside a test's runtime, which cannot be blocked on.
    fn remove_all_pods(&self) {
        let socket = self.socket.clone();
        let _ = std::thread::spawn(move || {
            let Ok(runtime) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            runtime.block_on(async {
                let Ok(channel) = scute::client::connect(&socket).await else {
                    return;
                };
                // Pods with huge annotations (the paging tests) make a list above the default
                // 4 MiB decode limit.
                let mut client = RuntimeServiceClient::new(channel).max_decoding_message_size(64 << 20);
                let Ok(pods) = client
                    .list_pod_sandbox(scute::api::ListPodSandboxRequest::default())
                    .await
                else {
                    return;
                };
                for pod in pods.into_inner().items {
                    let id = pod.id;
                    let _ = client
                        .stop_pod_sandbox(scute::api::StopPodSandboxRequest {
                            pod_sandbox_id: id.clone(),
                        })
                        .await;
                    let _ = client
                        .remove_pod_sandbox(scute::api::RemovePodSandboxRequest { pod_sandbox_id: id })
                        .await;
                }
            });
        })
        .join();
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let was_running = self.child.is_some();
        if was_running {
            self.remove_all_pods();
        }
        if let Some(mut child) = self.child.take() {
            let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
            wait_or_kill(&mut child, Duration::from_secs(15));
        }
        // A daemon that was running had every pod removed: what is still there leaked, a bug in
        // scute. After a test that failed, or one that left the daemon killed, it is only
        // cleaned up.
        let mut left = sweep_leftovers(self.dir.path());
        // The sweep unmounted the test's own root filesystem last (deepest first).
        left.retain(|l| !(self.root_mounted && *l == format!("mount {}", self.root.display())));
        if was_running && !left.is_empty() && !std::thread::panicking() {
            panic!(
                "left behind after every pod was removed and the daemon stopped: {left:#?}\n{}",
                self.log()
            );
        }
    }
}

/// Kills the processes and unmounts the mounts a daemon under `dir` left: shims serving a state
/// dir there, processes whose root is there (containers), and mounts there (rootfs, netns, shm).
/// Answers what it found.
fn sweep_leftovers(dir: &Path) -> Vec<String> {
    let mut found = Vec::new();
    for (pid, cmdline) in shims_of(dir) {
        found.push(format!("shim {pid}: {cmdline}"));
        let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    }
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        if std::fs::read_link(entry.path().join("root")).is_ok_and(|root| root.starts_with(dir)) {
            found.push(format!("process {pid} rooted in {}", dir.display()));
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
    let mut mounts = mounts_under(dir);
    // Deepest first: a rootfs before the overlay under it.
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for mount in mounts {
        found.push(format!("mount {mount}"));
        let _ = nix::mount::umount2(mount.as_str(), nix::mount::MntFlags::MNT_DETACH);
    }
    found
}

/// The mount points under `dir`.
pub fn mounts_under(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| Path::new(m).starts_with(dir))
        .map(str::to_string)
        .collect()
}

/// Live scute-shim processes serving a state dir under `dir`: (pid, command line).
pub fn shims_of(dir: &Path) -> Vec<(i32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let shim = args.first().is_some_and(|a| a.ends_with("scute-shim"));
        if shim && args.iter().any(|a| Path::new(a).starts_with(dir)) && alive(pid) {
            found.push((pid, args.join(" ")));
        }
    }
    found
}

/// The parent of a process (a container's or pause's is its shim, their subreaper).
pub fn parent_pid(pid: i32) -> i32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("PPid:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no PPid in /proc/{pid}/status"))
}

/// Running (not a zombie).
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.split(") ").nth(1).unwrap_or("").starts_with('Z'))
        .unwrap_or(false)
}

fn wait_or_kill(child: &mut Child, timeout: Duration) -> ExitStatus {
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return child.wait().unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Whether the tests' daemons use systemd's cgroup driver: `SCUTE_TEST_CGROUP_DRIVER=systemd`,
/// which the VM test node (hack/vm.sh) sets; cgroupfs otherwise.
pub fn systemd_driver() -> bool {
    std::env::var("SCUTE_TEST_CGROUP_DRIVER").is_ok_and(|d| d == "systemd")
}

/// A real local registry (Debian's docker-registry) on a free loopback port, stopped on drop.
pub struct Registry {
    dir: tempfile::TempDir,
    pub addr: String,
    /// `SCUTE_TEST_REGISTRY`'s: filled and stopped by whoever started it.
    external: bool,
}

impl Registry {
    pub fn start() -> Registry {
        Self::start_with(&[])
    }

    /// A registry holding the project's test images: the run's shared one when
    /// `SCUTE_TEST_IMAGES_REGISTRY` names it (hack/test.sh starts and fills one for every test
    /// process, instead of a registry and an images/build.sh run per test), else one of the
    /// test's own, filled here. Tests that stop their registry or need it empty use `start`.
    pub fn with_test_images() -> Registry {
        if let Some(addr) = std::env::var("SCUTE_TEST_IMAGES_REGISTRY")
            .ok()
            .filter(|a| !a.is_empty())
        {
            return Registry {
                dir: tempfile::Builder::new().prefix("scute-registry-").tempdir().unwrap(),
                addr,
                external: true,
            };
        }
        let registry = Self::start();
        registry.push_test_images();
        registry
    }

    /// A registry that wants HTTP basic auth for `user:password`.
    pub fn start_with_htpasswd(user_password: &str) -> Registry {
        Self::start_with(&["--htpasswd", user_password])
    }

    fn start_with(extra: &[&str]) -> Registry {
        let dir = tempfile::Builder::new().prefix("scute-registry-").tempdir().unwrap();
        // The VM test node has no cargo to build the test images with: its tests use the host's
        // registry, filled with them (hack/vm.sh).
        if let (Ok(addr), true) = (std::env::var("SCUTE_TEST_REGISTRY"), extra.is_empty()) {
            return Registry {
                dir,
                addr,
                external: true,
            };
        }
        let addr = format!("127.0.0.1:{}", free_port());
        registry_sh_start(&addr, dir.path(), extra);
        Registry {
            dir,
            addr,
            external: false,
        }
    }

    /// Fills the registry with the project's test images (images/build.sh: pause, busybox,
    /// httpd under their mirrored public names). build.sh serialises concurrent runs itself.
    pub fn push_test_images(&self) {
        if self.external {
            return;
        }
        let out = Command::new(repo_root().join("images/build.sh"))
            .arg(&self.addr)
            .output()
            .expect("run images/build.sh");
        assert!(
            out.status.success(),
            "images/build.sh failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Starts the stopped registry again on its address and storage, serving HTTPS with `cert`
    /// and `key` (PEM): what was pushed to it over HTTP is there.
    pub fn restart_over_tls(&self, cert: &Path, key: &Path) {
        assert!(!self.external, "an external registry is not ours to restart");
        let (cert, key) = (cert.to_str().unwrap(), key.to_str().unwrap());
        registry_sh_start(&self.addr, self.dir.path(), &["--tls-cert", cert, "--tls-key", key]);
    }

    pub fn stop(&self) {
        if let Some(out) = self.run_stop() {
            assert!(
                out.status.success(),
                "hack/registry.sh stop failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
    }

    /// Stops the registry and removes its dir, for a registry that is never dropped (a static).
    pub fn shut_down(&self) {
        let _ = self.run_stop();
        // Also an external registry's (empty) dir: a static is never dropped.
        let _ = std::fs::remove_dir_all(self.dir.path());
    }

    /// `hack/registry.sh stop` on this registry's dir; None for an external registry (not ours
    /// to stop).
    fn run_stop(&self) -> Option<std::process::Output> {
        if self.external {
            return None;
        }
        let out = Command::new(repo_root().join("hack/registry.sh"))
            .args(["stop", "--dir"])
            .arg(self.dir.path())
            .output()
            .expect("run hack/registry.sh");
        Some(out)
    }
}

/// `hack/registry.sh start` on `addr` with its storage in `dir` and the `extra` flags.
fn registry_sh_start(addr: &str, dir: &Path, extra: &[&str]) {
    let out = Command::new(repo_root().join("hack/registry.sh"))
        .args(["start", "--addr", addr])
        .args(extra)
        .arg("--dir")
        .arg(dir)
        .output()
        .expect("run hack/registry.sh");
    assert!(
        out.status.success(),
        "hack/registry.sh start failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.run_stop();
    }
}

/// A self-signed certificate for 127.0.0.1 (an end entity, its own trust anchor) and its key,
/// written to `dir` as cert.pem and key.pem by openssl.
#[allow(dead_code)] // not every test binary serves TLS
pub fn self_signed_cert(dir: &Path) -> (PathBuf, PathBuf) {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .args([
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .args(["-addext", "basicConstraints=critical,CA:FALSE"])
        .output()
        .expect("run openssl");
    assert!(made.status.success(), "{}", String::from_utf8_lossy(&made.stderr));
    (cert, key)
}

/// The image kit binary (images/kit), built on first use.
pub fn imagekit() -> PathBuf {
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            // hack/test.sh builds every binary before the tests (each test is a process of its
            // own under nextest: a cargo run apiece would queue on the target dir's lock).
            let built = repo_root().join("target/debug/scute-imagekit");
            if std::env::var_os("SCUTE_TEST_NO_BUILD").is_some() && built.is_file() {
                return built;
            }
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = Command::new(cargo)
                .args(["build", "--quiet", "-p", "scute-imagekit"])
                .current_dir(repo_root())
                .status()
                .expect("run cargo build -p scute-imagekit");
            assert!(status.success(), "building scute-imagekit failed");
            repo_root().join("target/debug/scute-imagekit")
        })
        .clone()
}

/// The daemon runs `scute-shim` from its own directory: make sure it is built there too
/// (`cargo test -p scute` alone would not build another package's binary).
pub fn ensure_shim_built() {
    static BUILT: std::sync::OnceLock<()> = std::sync::OnceLock::new();
    BUILT.get_or_init(|| {
        // The VM test node has the host's binaries and no cargo; hack/test.sh builds them all
        // before the tests.
        if std::env::var_os("SCUTE_TEST_NO_BUILD").is_some() {
            let shim = Path::new(SCUTE).with_file_name("scute-shim");
            assert!(
                shim.is_file(),
                "SCUTE_TEST_NO_BUILD is set but {} is missing",
                shim.display()
            );
            return;
        }
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "--quiet", "-p", "scute-shim"])
            .current_dir(repo_root())
            .status()
            .expect("run cargo build -p scute-shim");
        assert!(status.success(), "building scute-shim failed");
    });
}

/// Runs the image kit, panicking with its output on failure; returns stdout.
pub fn kit(args: &[&str]) -> String {
    let out = Command::new(imagekit())
        .args(args)
        .output()
        .expect("run scute-imagekit");
    assert!(
        out.status.success(),
        "scute-imagekit {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Daemon {
    /// Sends registry.k8s.io, docker.io and gcr.io to `registry` through hosts.toml mirrors, as an
    /// offline node would (read per pull: no restart needed).
    pub fn mirror_public_registries_to(&self, registry: &str) {
        for host in ["registry.k8s.io", "docker.io", "gcr.io"] {
            let dir = self.dir().join("certs.d").join(host);
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(
                dir.join("hosts.toml"),
                format!("server = \"https://{host}\"\n\n[host.\"http://{registry}\"]\ncapabilities = [\"pull\", \"resolve\"]\n"),
            )
            .unwrap();
        }
    }
}

/// A loopback TCP port free now, from below the kernel's ephemeral range: a port the kernel
/// handed out (bind to port 0) is one any outgoing connection on the host may be given next,
/// before the process it was picked for (a kubelet, a registry) binds it — seen as "address
/// already in use" under load. Ports below the range are only ever taken by explicit binds.
pub fn free_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|range| range.split_whitespace().next()?.parse::<u32>().ok())
        .unwrap_or(32768);
    let (low, high) = (ephemeral_low.saturating_sub(12000).max(1024), ephemeral_low.max(2048));
    // Spread over the range by process and time, so that tests running side by side do not
    // walk the same ports in step.
    let seed = std::process::id().wrapping_mul(2_654_435_761)
        ^ std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
    for _ in 0..1000 {
        let step = NEXT.fetch_add(1, Ordering::Relaxed).wrapping_mul(7919);
        let port = low + seed.wrapping_add(step) % (high - low);
        if std::net::TcpListener::bind(("127.0.0.1", port as u16)).is_ok() {
            return port as u16;
        }
    }
    panic!("no free port in {low}-{high} on 127.0.0.1");
}

/// The first `program` on PATH, as a shell would find it (None when it is not installed).
pub fn which(program: &str) -> Option<PathBuf> {
    let paths = std::env::var_os("PATH")?;
    std::env::split_paths(&paths)
        .map(|dir| dir.join(program))
        .find(|p| p.is_file())
}

/// Runs the scute binary with `args`, returning (exit code, stdout, stderr).
pub fn scute(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(SCUTE).args(args).output().expect("run scute");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A CNI bridge network of its own for one test: unique bridge name and subnet, removed on drop.
pub struct TestNetwork {
    pub bridge: String,
    pub prefix: String,
}

impl TestNetwork {
    pub fn install(daemon: &Daemon) -> TestNetwork {
        let n = (std::process::id() as u64 * 7919 + free_port() as u64) % 250 + 1;
        let tag = format!(
            "{:05x}",
            (std::process::id() as u64 * 31 + free_port() as u64) & 0xfffff
        );
        let bridge = format!("sct{tag}");
        let prefix = format!("10.{}.{}", 200 + (n % 50), n);
        let conflist = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": "scute-test",
            "plugins": [
                {
                    "type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": false, "hairpinMode": true,
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": format!("{prefix}.0/24")}]],
                             "dataDir": daemon.dir().join("cni-ipam")},
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        });
        std::fs::write(daemon.cni_conf_dir.join("10-test.conflist"), conflist.to_string()).unwrap();
        TestNetwork { bridge, prefix }
    }
}

impl Drop for TestNetwork {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
    }
}

/// A `kB` field (VmRSS, VmHWM, …) of /proc/<pid>/status; None once the process is gone.
pub fn status_kib(pid: i32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}
