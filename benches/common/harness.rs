// Shared by benches/sandbox.rs and benches/containers.rs through `include!`, so each benchmark
// stays one self-contained binary with its own `use` list: starting and cleaning up scute and
// containerd daemons in temp dirs, a local registry, CNI networks, host-state snapshots that
// prove nothing was left behind, and latency/RSS helpers.

include!("anchors.rs");

const RPC_TIMEOUT: Duration = Duration::from_secs(120);

/// Where containerd's CRI plugin pins pod network namespaces (not configurable in 1.6).
const HOST_NETNS_DIR: &str = "/run/netns";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The daemon runs `scute-shim` from its own directory. `cargo bench` builds only this package's
/// binaries: build the shim into the same profile directory (a no-op when it is up to date).
fn ensure_shim_built() {
    let scute = Path::new(env!("CARGO_BIN_EXE_scute"));
    let bin_dir = scute.parent().unwrap();
    let release = bin_dir.file_name().is_some_and(|n| n == "release");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.args(["build", "--quiet", "-p", "scute-shim"])
        .current_dir(repo_root());
    if release {
        cmd.arg("--release");
    }
    let status = cmd.status().expect("run cargo build -p scute-shim");
    assert!(status.success(), "building scute-shim failed");
    let shim = bin_dir.join("scute-shim");
    assert!(shim.is_file(), "{} missing after the build", shim.display());
}

// ---------------------------------------------------------------------------------------------
// Host state: processes, mounts, links

struct Proc {
    pid: i32,
    ppid: i32,
    cmdline: String,
}

fn processes() -> Vec<Proc> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter_map(|pid| {
            let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
            // "pid (comm) state ppid ...": comm may hold spaces and parentheses.
            let after = &stat[stat.rfind(')')? + 2..];
            let mut fields = after.split(' ');
            let state = fields.next()?;
            if state == "Z" {
                return None;
            }
            let ppid = fields.next()?.parse().ok()?;
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            Some(Proc {
                pid,
                ppid,
                cmdline: String::from_utf8_lossy(&cmdline)
                    .replace('\0', " ")
                    .trim_end()
                    .to_string(),
            })
        })
        .collect()
}

/// Processes whose command line holds `marker`, with all their descendants (a shim's pause).
fn process_trees(marker: &str) -> Vec<Proc> {
    let me = std::process::id() as i32;
    let all = processes();
    let mut pids: BTreeSet<i32> = all
        .iter()
        .filter(|p| p.pid != me && p.cmdline.contains(marker))
        .map(|p| p.pid)
        .collect();
    loop {
        let before = pids.len();
        for p in &all {
            if pids.contains(&p.ppid) {
                pids.insert(p.pid);
            }
        }
        if pids.len() == before {
            break;
        }
    }
    all.into_iter().filter(|p| pids.contains(&p.pid)).collect()
}

/// SIGKILLs what `process_trees(marker)` finds and waits (5 s at most) until it is gone.
fn kill_trees(marker: &str) {
    for p in process_trees(marker) {
        let _ = kill(Pid::from_raw(p.pid), Signal::SIGKILL);
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while !process_trees(marker).is_empty() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn mount_points() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        // mountinfo escapes space, tab, newline and backslash as octal.
        .map(|p| {
            PathBuf::from(
                p.replace("\\040", " ")
                    .replace("\\011", "\t")
                    .replace("\\012", "\n")
                    .replace("\\134", "\\"),
            )
        })
        .collect()
}

/// Mount points at or under `dir`, deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let mut found: Vec<PathBuf> = mount_points().into_iter().filter(|p| p.starts_with(dir)).collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

fn unmount_under(dir: &Path) {
    for mount in mounts_under(dir) {
        if let Err(e) = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH) {
            eprintln!("umount {}: {e}", mount.display());
        }
    }
}

fn ip_links() -> String {
    Command::new("ip")
        .args(["-o", "link"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default()
}

fn dir_entries(dir: &Path) -> BTreeSet<OsString> {
    std::fs::read_dir(dir)
        .map(|es| es.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default()
}

/// A CNI bridge network of one daemon's own: a conflist with a unique bridge name and subnet,
/// host-local IPAM under the daemon's temp dir. The bridge is deleted on drop.
struct Network {
    bridge: String,
    subnet: String,
}

impl Network {
    fn install(conf_dir: &Path, ipam_dir: &Path, kind: char) -> Network {
        let tag = (std::process::id() as u64 * 31 + free_port() as u64) & 0xfffff;
        let bridge = format!("sctb{kind}{tag:05x}");
        // A /24 no route on this host uses yet (the integration tests use 10.200-249.x).
        let routes = Command::new("ip")
            .args(["-o", "-4", "route"])
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default();
        let prefix = (0..100)
            .map(|_| {
                let n = std::process::id() as u64 * 7919 + free_port() as u64;
                format!("10.{}.{}", 150 + n % 50, (n / 50) % 250 + 1)
            })
            .find(|p| !routes.contains(&format!("{p}.")))
            .expect("no free 10.x.y.0/24 subnet");
        let subnet = format!("{prefix}.0/24");
        let conflist = serde_json::json!({
            "cniVersion": "1.0.0",
            "name": format!("scute-bench-{kind}"),
            "plugins": [
                {
                    "type": "bridge", "bridge": bridge, "isGateway": true, "ipMasq": false, "hairpinMode": true,
                    "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]], "dataDir": ipam_dir},
                },
                {"type": "portmap", "capabilities": {"portMappings": true}},
            ],
        });
        std::fs::create_dir_all(conf_dir).unwrap();
        std::fs::write(conf_dir.join("10-bench.conflist"), conflist.to_string()).unwrap();
        Network { bridge, subnet }
    }

    /// Links still enslaved to the bridge (veths of pods not torn down).
    fn attached(&self) -> Vec<String> {
        let master = format!(" master {} ", self.bridge);
        ip_links()
            .lines()
            .filter(|l| l.contains(&master))
            .map(|l| l.split(':').nth(1).unwrap_or(l).trim().to_string())
            .collect()
    }
}

impl Drop for Network {
    fn drop(&mut self) {
        if ip_links().contains(&format!(": {}:", self.bridge)) {
            let _ = Command::new("ip").args(["link", "del", &self.bridge]).output();
        }
    }
}

/// What containerd creates outside its root and state (its CRI plugin pins netns in /run/netns,
/// runc keeps state in /run/containerd/runc, shims listen in /run/containerd/s, libcni caches in
/// /var/lib/cni, pods' cgroups go under /k8s.io): snapshotted before it starts, so only what
/// appeared afterwards is removed.
struct HostSnapshot {
    netns: BTreeSet<OsString>,
    netns_dir_existed: bool,
    run_containerd_existed: bool,
    shim_sockets: BTreeSet<OsString>,
    var_lib_cni_existed: bool,
    cgroup_dirs_existed: Vec<(PathBuf, bool)>,
}

impl HostSnapshot {
    fn take() -> HostSnapshot {
        let cgroup_dirs_existed = std::fs::read_dir("/sys/fs/cgroup")
            .map(|es| {
                es.flatten()
                    .map(|e| e.path().join("k8s.io"))
                    .map(|p| {
                        let existed = p.exists();
                        (p, existed)
                    })
                    .collect()
            })
            .unwrap_or_default();
        HostSnapshot {
            netns: dir_entries(Path::new(HOST_NETNS_DIR)),
            netns_dir_existed: Path::new(HOST_NETNS_DIR).exists(),
            run_containerd_existed: Path::new("/run/containerd").exists(),
            shim_sockets: dir_entries(Path::new("/run/containerd/s")),
            var_lib_cni_existed: Path::new("/var/lib/cni").exists(),
            cgroup_dirs_existed,
        }
    }

    fn new_netns(&self) -> Vec<PathBuf> {
        dir_entries(Path::new(HOST_NETNS_DIR))
            .difference(&self.netns)
            .map(|n| Path::new(HOST_NETNS_DIR).join(n))
            .collect()
    }

    /// Removes what appeared since the snapshot; returns notes on what was really left over (pod
    /// state that RemovePodSandbox should have cleaned), not on the directories a daemon keeps.
    fn clean(&self) -> Vec<String> {
        let mut notes = Vec::new();
        let mounts = mount_points();
        for ns in self.new_netns() {
            notes.push(format!("leftover netns {}", ns.display()));
            if mounts.contains(&ns) {
                let _ = nix::mount::umount2(&ns, nix::mount::MntFlags::MNT_DETACH);
            }
            let _ = std::fs::remove_file(&ns);
        }
        if !self.netns_dir_existed {
            let _ = std::fs::remove_dir(HOST_NETNS_DIR);
        }
        if self.run_containerd_existed {
            for s in dir_entries(Path::new("/run/containerd/s")).difference(&self.shim_sockets) {
                notes.push(format!(
                    "leftover shim socket /run/containerd/s/{}",
                    s.to_string_lossy()
                ));
                let _ = std::fs::remove_file(Path::new("/run/containerd/s").join(s));
            }
        } else if Path::new("/run/containerd").exists() {
            let sockets = dir_entries(Path::new("/run/containerd/s"));
            if !sockets.is_empty() {
                notes.push(format!("leftover shim sockets in /run/containerd/s: {sockets:?}"));
            }
            unmount_under(Path::new("/run/containerd"));
            let _ = std::fs::remove_dir_all("/run/containerd");
        }
        if !self.var_lib_cni_existed && Path::new("/var/lib/cni").exists() {
            let results = dir_entries(Path::new("/var/lib/cni/results"));
            if !results.is_empty() {
                notes.push(format!("leftover libcni results in /var/lib/cni/results: {results:?}"));
            }
            let _ = std::fs::remove_dir_all("/var/lib/cni");
        }
        for (dir, existed) in &self.cgroup_dirs_existed {
            if *existed || !dir.exists() {
                continue;
            }
            // Pod cgroups left under it (empty ones can be removed: rmdir on cgroupfs).
            for child in dir_entries(dir) {
                let child = dir.join(child);
                if child.is_dir() {
                    notes.push(format!("leftover cgroup {}", child.display()));
                    let _ = std::fs::remove_dir(&child);
                }
            }
            let _ = std::fs::remove_dir(dir);
        }
        notes
    }
}

// ---------------------------------------------------------------------------------------------
// Daemons, each stopped on drop (also when the benchmark panics) with everything its pods left.

#[derive(Clone, Copy, PartialEq)]
enum Kind {
    Scute,
    Containerd,
}

struct Daemon {
    kind: Kind,
    /// The row's name: "scute", or the anchor's ("containerd 2.3").
    label: String,
    /// What its shims' command lines start with.
    shim: String,
    child: Option<Child>,
    socket: PathBuf,
    log: PathBuf,
    host: Option<HostSnapshot>,
    /// Every sandbox and container ID the daemon returned, to look for their cgroups afterwards.
    created: std::cell::RefCell<Vec<String>>,
    network: Network,
    /// Removed last (field order), with nothing mounted under it any more.
    dir: tempfile::TempDir,
}

impl Daemon {
    fn name(&self) -> &str {
        &self.label
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// Every process of this daemon's runtime (daemon, shims, pause) names a path in the temp dir.
    fn marker(&self) -> String {
        self.dir.path().to_string_lossy().into_owned()
    }

    fn shim_name(&self) -> &str {
        &self.shim
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    #[allow(clippy::too_many_arguments)]
    fn spawn(
        kind: Kind,
        label: String,
        bin: &Path,
        args: &[&std::ffi::OsStr],
        dir: tempfile::TempDir,
        socket: PathBuf,
        network: Network,
        host: Option<HostSnapshot>,
    ) -> Daemon {
        let log = dir.path().join("daemon.log");
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new(bin)
            .args(args)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", bin.display()));
        let shim = match kind {
            Kind::Scute => "scute-shim".to_string(),
            Kind::Containerd => format!("{}-shim", bin.file_name().unwrap().to_string_lossy()),
        };
        let mut daemon = Daemon {
            kind,
            label,
            shim,
            child: Some(child),
            socket,
            log,
            host,
            created: Default::default(),
            network,
            dir,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&daemon.socket).is_err() {
            if let Ok(Some(status)) = daemon.child.as_mut().unwrap().try_wait() {
                panic!(
                    "{} exited during start ({status}):\n{}",
                    daemon.name(),
                    daemon.log_tail()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{} did not open {} in time:\n{}",
                daemon.name(),
                daemon.socket.display(),
                daemon.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        daemon
    }

    /// SIGTERM (SIGKILL after 15 s), then removes whatever the daemon's pods left behind:
    /// processes, mounts, netns, veths. Returns a note per leftover found.
    fn shutdown(&mut self) -> Vec<String> {
        let Some(mut child) = self.child.take() else {
            return Vec::new();
        };
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        let mut notes = Vec::new();
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                if !status.success() {
                    notes.push(format!("{} exited with {status} on SIGTERM", self.name()));
                }
                break;
            }
            if Instant::now() > deadline {
                notes.push(format!("{} ignored SIGTERM for 15 s: killed", self.name()));
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // Shims of removed pods may take a moment to exit.
        let marker = self.marker();
        let deadline = Instant::now() + Duration::from_secs(5);
        while !process_trees(&marker).is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        for p in process_trees(&marker) {
            notes.push(format!("leftover process {} {}", p.pid, p.cmdline));
        }
        kill_trees(&marker);
        for m in mounts_under(self.dir.path()) {
            notes.push(format!("leftover mount {}", m.display()));
        }
        unmount_under(self.dir.path());
        // Pod cgroups (cgroupfs): scute's under /scute/scute-<id>, containerd's under /k8s.io/<id>.
        let controllers: Vec<PathBuf> = std::fs::read_dir("/sys/fs/cgroup")
            .map(|es| es.flatten().map(|e| e.path()).collect())
            .unwrap_or_default();
        for id in self.created.borrow().iter() {
            let relative = match self.kind {
                Kind::Scute => format!("scute/scute-{id}"),
                Kind::Containerd => format!("k8s.io/{id}"),
            };
            for cgroup in controllers.iter().map(|c| c.join(&relative)).filter(|c| c.is_dir()) {
                notes.push(format!("leftover cgroup {}", cgroup.display()));
                let _ = std::fs::remove_dir(&cgroup);
            }
        }
        if let Some(host) = &self.host {
            notes.extend(host.clean());
        }
        // A netns goes (and its veth with it) a moment after its last process and mount.
        let deadline = Instant::now() + Duration::from_secs(3);
        while !self.network.attached().is_empty() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        for link in self.network.attached() {
            notes.push(format!("leftover link {link} on {}", self.network.bridge));
        }
        notes
    }
}

/// CRI calls made by the benchmarks: a failure panics with the daemon's log tail.
impl Daemon {
    fn fail(&self, what: &str, e: impl std::fmt::Display) -> ! {
        panic!("{} {what}: {e}\n{}", self.name(), self.log_tail())
    }

    /// `f`'s answer and how long it took, within RPC_TIMEOUT.
    async fn timed<T>(
        &self,
        what: &str,
        f: impl std::future::Future<Output = Result<T, tonic::Status>>,
    ) -> (T, Duration) {
        let started = Instant::now();
        match tokio::time::timeout(RPC_TIMEOUT, f).await {
            Ok(Ok(v)) => (v, started.elapsed()),
            Ok(Err(e)) => self.fail(what, e),
            Err(_) => self.fail(what, format!("no answer in {RPC_TIMEOUT:?}")),
        }
    }

    /// Until Status says RuntimeReady and NetworkReady (containerd's CRI plugin initializes after
    /// its socket opens; both load the CNI conf dir).
    async fn wait_ready(&self, rt: &mut RuntimeServiceClient<Channel>) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let last = match rt.status(api::StatusRequest { verbose: false }).await {
                Ok(r) => {
                    let conditions = r.into_inner().status.map(|s| s.conditions).unwrap_or_default();
                    // containerd 2.x adds ContainerdHasNoDeprecationWarnings, false on cgroup v1.
                    let ready = |t: &str| conditions.iter().any(|c| c.r#type == t && c.status);
                    if ready("RuntimeReady") && ready("NetworkReady") {
                        return;
                    }
                    format!("{conditions:?}")
                }
                Err(e) => e.to_string(),
            };
            if Instant::now() > deadline {
                self.fail("not ready in 30 s", last);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        for note in self.shutdown() {
            eprintln!("cleanup: {note}");
        }
        // Then `network` deletes the bridge and `dir` goes.
    }
}

fn start_scute() -> Daemon {
    // Short: the shim's socket, <state>/shims/<64-hex id>/shim.sock, must fit in sun_path (107 bytes).
    let dir = tempfile::Builder::new().prefix("scb-").tempdir().unwrap();
    let root = dir.path().join("root");
    let state = dir.path().join("state");
    let socket = state.join("scute.sock");
    let certs = dir.path().join("certs.d");
    let net = dir.path().join("net.d");
    std::fs::create_dir_all(&certs).unwrap();
    let network = Network::install(&net, &dir.path().join("cni-ipam"), 's');
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "root = {root:?}\nstate = {state:?}\n[grpc]\naddress = {socket:?}\n[cni]\nconf_dir = {net:?}\n[registry]\nconfig_path = {certs:?}\n"
        ),
    )
    .unwrap();
    let args: Vec<&std::ffi::OsStr> = vec![
        "serve".as_ref(),
        "--log-level".as_ref(),
        "warn".as_ref(),
        "--config".as_ref(),
        config.as_os_str(),
    ];
    Daemon::spawn(
        Kind::Scute,
        "scute".into(),
        Path::new(env!("CARGO_BIN_EXE_scute")),
        &args,
        dir,
        socket,
        network,
        None,
    )
}

/// An anchor (anchors.rs) with its CRI plugin in temp dirs; pause comes from `registry` over
/// plain HTTP.
fn start_containerd(anchor: &Anchor, registry: &str) -> Daemon {
    let host = HostSnapshot::take();
    let dir = tempfile::Builder::new()
        .prefix("containerd-bench-")
        .tempdir()
        .unwrap();
    let socket = dir.path().join("containerd.sock");
    let certs = dir.path().join("certs.d");
    let net = dir.path().join("net.d");
    std::fs::create_dir_all(certs.join(registry)).unwrap();
    std::fs::write(
        certs.join(registry).join("hosts.toml"),
        format!(
            "server = \"http://{registry}\"\n\n[host.\"http://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n"
        ),
    )
    .unwrap();
    let network = Network::install(&net, &dir.path().join("cni-ipam"), 'c');
    let config = dir.path().join("config.toml");
    let cri = CriSettings {
        net: Some(&net),
        certs: Some(&certs),
        pause: Some(format!("{registry}/pause:3.10")),
    };
    std::fs::write(&config, containerd_config(anchor, dir.path(), &socket, &cri)).unwrap();
    let args: Vec<&std::ffi::OsStr> = vec![
        "--config".as_ref(),
        config.as_os_str(),
        "--log-level".as_ref(),
        "warn".as_ref(),
    ];
    Daemon::spawn(
        Kind::Containerd,
        anchor.label.clone(),
        &anchor.bin,
        &args,
        dir,
        socket,
        network,
        Some(host),
    )
}

/// A local registry from hack/registry.sh, stopped on drop.
struct Registry {
    dir: tempfile::TempDir,
    addr: String,
}

impl Registry {
    fn start() -> Registry {
        let dir = tempfile::Builder::new()
            .prefix("scute-bench-registry-")
            .tempdir()
            .unwrap();
        let addr = format!("127.0.0.1:{}", free_port());
        let out = Command::new(repo_root().join("hack/registry.sh"))
            .args(["start", "--addr", &addr, "--dir"])
            .arg(dir.path())
            .output()
            .expect("run hack/registry.sh");
        assert!(
            out.status.success(),
            "hack/registry.sh start failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Registry { dir, addr }
    }

    /// images/build.sh: builds the static pause (and the other test images) and pushes them here.
    fn push_test_images(&self) {
        let started = Instant::now();
        let build = || {
            Command::new(repo_root().join("images/build.sh"))
                .arg(&self.addr)
                .current_dir(repo_root())
                .output()
                .expect("run images/build.sh")
        };
        let mut out = build();
        if !out.status.success() {
            // target/images is shared: another build.sh running at the same time can trip this one.
            eprintln!(
                "images/build.sh failed, retrying once:\n{}",
                String::from_utf8_lossy(&out.stderr)
            );
            std::thread::sleep(Duration::from_secs(5));
            out = build();
        }
        assert!(
            out.status.success(),
            "images/build.sh {} failed:\n{}{}",
            self.addr,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        println!(
            "registry {}: images/build.sh pushed the test images in {:.1} s",
            self.addr,
            started.elapsed().as_secs_f64()
        );
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("hack/registry.sh"))
            .args(["stop", "--dir"])
            .arg(self.dir.path())
            .output();
    }
}

// ---------------------------------------------------------------------------------------------
// Measuring

/// Processes of `daemon`'s shim for pod `id` (command line names the shim and the sandbox ID).
fn shim_pids(daemon: &Daemon, id: &str) -> Vec<u32> {
    processes()
        .into_iter()
        .filter(|p| {
            p.cmdline.contains(daemon.shim_name()) && p.cmdline.contains(id) && p.cmdline.contains(&daemon.marker())
        })
        .map(|p| p.pid as u32)
        .collect()
}

fn mean_p99(mut samples: Vec<Duration>) -> String {
    samples.sort();
    let p99 = samples[((samples.len() as f64 - 1.0) * 0.99).round() as usize];
    let mean = samples.iter().sum::<Duration>() / samples.len() as u32;
    format!("{:.1} / {:.1}", mean.as_secs_f64() * 1e3, p99.as_secs_f64() * 1e3)
}


/// Runs `bench` on scute, then on each anchor found (anchors.rs), each on a fresh daemon dropped
/// before the next starts: the rows `(name, figures)`, and the cleanup notes each daemon's
/// shutdown left, named. `pause` comes from `registry` for the anchors.
fn each_runtime<T>(
    registry: &str,
    mut bench: impl FnMut(&mut Daemon) -> (T, Vec<String>),
) -> (Vec<(String, T)>, Vec<String>) {
    let mut rows = Vec::new();
    let mut notes = Vec::new();
    let mut run = |mut daemon: Daemon| {
        println!(
            "  {:<14} CNI network {} {}",
            daemon.name(),
            daemon.network.bridge,
            daemon.network.subnet
        );
        let (figures, left) = bench(&mut daemon);
        notes.extend(left.into_iter().map(|n| format!("{}: {n}", daemon.name())));
        rows.push((daemon.name().to_string(), figures));
    };
    run(start_scute());
    for anchor in &anchors() {
        run(start_containerd(anchor, registry));
    }
    (rows, notes)
}
