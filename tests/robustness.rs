//! Robustness (issue 8): what the kubelet does to a runtime on a bad day. Creates it times out on
//! and retries, many create/remove cycles, a daemon killed while pods are being made, and
//! requests no kubelet should send. Each test checks that nothing is left behind: no mount,
//! netns, cgroup, veth, shim process or file of its own.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::pod::{container, pod, pod_with, Pod};
use common::{alive, mounts_under, shims_of, Daemon};
use scute::api;
use tonic::Code;

// ---------------------------------------------------------------------------------------------
// What a test can observe of the machine.

/// Entries of a directory (empty when it does not exist).
fn entries(dir: &Path) -> BTreeSet<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

/// The cgroup dirs under `parent` in every hierarchy (v1 controllers and the unified one).
fn cgroups_under(parent: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let dir = hierarchy.path().join(parent.trim_start_matches('/'));
        for child in entries(&dir) {
            if dir.join(&child).is_dir() {
                found.push(dir.join(child));
            }
        }
    }
    found
}

/// Removes the pod cgroup parent the test made (the kubelet's job in a cluster).
fn remove_cgroup_parent(parent: &str) -> Vec<PathBuf> {
    let mut left = Vec::new();
    for hierarchy in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let dir = hierarchy.path().join(parent.trim_start_matches('/'));
        if dir.exists() && std::fs::remove_dir(&dir).is_err() {
            left.push(dir);
        }
    }
    left
}

fn links() -> Vec<String> {
    let out = Command::new("ip").args(["-o", "link"]).output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect()
}

fn veths_on(bridge: &str) -> Vec<String> {
    links()
        .into_iter()
        .filter(|l| l.contains(&format!("master {bridge} ")))
        .collect()
}

fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

fn rss_kib(pid: i32) -> u64 {
    status_kib(pid, "VmRSS:")
}

/// A `Name: N kB` line of /proc/<pid>/status (RssAnon: what the node cannot reclaim).
fn status_kib(pid: i32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// A cgroup parent of the test's own, so its cgroup checks see only its own pods; removed on
/// drop (the kubelet's job in a cluster), also when the test fails. Made before the test's
/// daemon, so dropped after it (which removes the pods first).
struct CgroupParent(String);

impl CgroupParent {
    fn new(test: &str) -> CgroupParent {
        CgroupParent(format!("/scute-robust-{test}-{}", std::process::id()))
    }
}

impl std::ops::Deref for CgroupParent {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl Drop for CgroupParent {
    fn drop(&mut self) {
        let left = remove_cgroup_parent(&self.0);
        if !left.is_empty() && !std::thread::panicking() {
            panic!("cgroups left: {left:?}");
        }
    }
}

/// Checks that nothing of the daemon's pods is left on the machine.
fn assert_nothing_left(daemon: &Daemon, parent: &str, bridge: Option<&str>) {
    assert_eq!(mounts_under(daemon.dir()), Vec::<String>::new(), "mounts left");
    assert_eq!(entries(&daemon.state.join("netns")), BTreeSet::new(), "netns left");
    assert_eq!(entries(&daemon.state.join("shims")), BTreeSet::new(), "shim dirs left");
    assert_eq!(
        entries(&daemon.root.join("sandboxes")),
        BTreeSet::new(),
        "sandbox dirs left"
    );
    assert_eq!(
        entries(&daemon.root.join("containers")),
        BTreeSet::new(),
        "container dirs left"
    );
    assert_eq!(shims_of(&daemon.state), Vec::new(), "shim processes left");
    assert_eq!(cgroups_under(parent), Vec::<PathBuf>::new(), "cgroups left");
    if let Some(bridge) = bridge {
        assert_eq!(veths_on(bridge), Vec::<String>::new(), "veths left on {bridge}");
    }
}

/// Prints the daemon's log when the test fails (its temp dir goes with it).
/// Prints the daemon's log when the test fails.
struct LogOnFailure(PathBuf);

impl LogOnFailure {
    fn of(daemon: &Daemon) -> LogOnFailure {
        LogOnFailure(daemon.log_path())
    }
}

impl Drop for LogOnFailure {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!(
                "---- daemon log ----\n{}",
                std::fs::read_to_string(&self.0).unwrap_or_default()
            );
        }
    }
}

fn panics_in(daemon: &Daemon) -> Vec<String> {
    daemon
        .log()
        .lines()
        .filter(|l| l.contains("panicked"))
        .map(str::to_string)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Requests.

/// A pod on the CNI network (or the host's), under `parent`, logging into `logs`.
fn pod_config(name: &str, parent: &str, logs: &Path, host_network: bool) -> api::PodSandboxConfig {
    let mode = if host_network {
        api::NamespaceMode::Node
    } else {
        api::NamespaceMode::Pod
    };
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "robust".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: logs.display().to_string(),
        linux: Some(api::LinuxPodSandboxConfig {
            cgroup_parent: parent.into(),
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: mode as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn with_timeout<T>(message: T, timeout: Option<Duration>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(timeout) = timeout {
        request.set_timeout(timeout);
    }
    request
}

async fn run_pod(
    daemon: &Daemon,
    config: &api::PodSandboxConfig,
    timeout: Option<Duration>,
) -> Result<String, tonic::Status> {
    daemon
        .runtime()
        .await
        .run_pod_sandbox(with_timeout(
            api::RunPodSandboxRequest {
                config: Some(config.clone()),
                runtime_handler: String::new(),
            },
            timeout,
        ))
        .await
        .map(|r| r.into_inner().pod_sandbox_id)
}

async fn create_container(
    daemon: &Daemon,
    sandbox: &str,
    sandbox_config: &api::PodSandboxConfig,
    config: &api::ContainerConfig,
    timeout: Option<Duration>,
) -> Result<String, tonic::Status> {
    daemon
        .runtime()
        .await
        .create_container(with_timeout(
            api::CreateContainerRequest {
                pod_sandbox_id: sandbox.into(),
                config: Some(config.clone()),
                sandbox_config: Some(sandbox_config.clone()),
            },
            timeout,
        ))
        .await
        .map(|r| r.into_inner().container_id)
}

async fn pods_named(daemon: &Daemon, name: &str) -> Vec<String> {
    daemon
        .pods()
        .await
        .into_iter()
        .filter(|p| p.metadata.as_ref().is_some_and(|m| m.name == name))
        .map(|p| p.id)
        .collect()
}

async fn containers_named(daemon: &Daemon, name: &str) -> Vec<String> {
    daemon
        .runtime()
        .await
        .list_containers(api::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers
        .into_iter()
        .filter(|c| c.metadata.as_ref().is_some_and(|m| m.name == name))
        .map(|c| c.id)
        .collect()
}

async fn remove_pod(daemon: &Daemon, id: &str) {
    let mut runtime = daemon.runtime().await;
    runtime
        .stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        })
        .await
        .unwrap();
    runtime
        .remove_pod_sandbox(api::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        })
        .await
        .unwrap();
}

/// Waits until `check` gives Some, panicking after 20 s.
async fn eventually<T, F, Fut>(what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

// ---------------------------------------------------------------------------------------------
// 1. A create the kubelet timed out on, retried with the same config, gets the same object.

/// What a retried create makes: a pod (in its own cgroup parent) or a container in the base pod.
#[derive(Clone, Copy, Debug)]
enum Made {
    Pod,
    Container,
}

impl Made {
    async fn create(
        self,
        base: &Pod,
        parent: &str,
        name: &str,
        timeout: Option<Duration>,
    ) -> Result<String, tonic::Status> {
        match self {
            Made::Pod => {
                run_pod(
                    &base.daemon,
                    &pod_config(name, parent, base.logs.path(), false),
                    timeout,
                )
                .await
            }
            Made::Container => {
                let config = container(name, "sleep 100");
                create_container(&base.daemon, &base.id, &base.config, &config, timeout).await
            }
        }
    }

    async fn named(self, daemon: &Daemon, name: &str) -> Vec<String> {
        match self {
            Made::Pod => pods_named(daemon, name).await,
            Made::Container => containers_named(daemon, name).await,
        }
    }
}

/// When the retry comes: at once (the first create is most likely still running, and the retry
/// waits for it), after the first finished (the kept object is handed over), or after the first
/// finished and the daemon restarted (the kept object is found in the store).
#[derive(Clone, Copy, Debug, PartialEq)]
enum Retry {
    AtOnce,
    Later,
    AfterRestart,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timed_out_creates_are_handed_to_the_retry() {
    let started = Instant::now();
    let parent = CgroupParent::new("retry");
    let mut base = pod_with("retrybase", Some(vec![])).await;
    let _log = LogOnFailure::of(&base.daemon);

    let gate = tempfile::tempdir().unwrap();
    gate_cni_adds(&base, gate.path());
    for made in [Made::Pod, Made::Container] {
        for retry in [Retry::AtOnce, Retry::Later, Retry::AfterRestart] {
            let name = format!("{made:?}-{retry:?}").to_lowercase();
            abandon_create(made, &base, &parent, &name, gate.path()).await;
            if retry != Retry::AtOnce {
                let daemon = &base.daemon;
                let id = eventually("the abandoned create", || async {
                    made.named(daemon, &name).await.pop()
                })
                .await;
                eventually("the abandoned create to be kept", || async {
                    daemon
                        .log()
                        .lines()
                        .any(|l| l.contains(&id) && l.contains("kept for its retry"))
                        .then_some(())
                })
                .await;
            }
            if retry == Retry::AfterRestart {
                base.daemon.restart();
            }
            let id = made.create(&base, &parent, &name, None).await.unwrap();
            assert_eq!(made.named(&base.daemon, &name).await, vec![id.clone()], "{name}");
            // The retry got it: a further create of the name is the kubelet's real duplicate.
            let dup = made.create(&base, &parent, &name, None).await.unwrap_err();
            assert_eq!(dup.code(), Code::AlreadyExists, "{name}: {dup:?}");
            assert!(dup.message().contains(&id), "{}", dup.message());
            if let Made::Container = made {
                // The handed-over container works.
                base.daemon
                    .runtime()
                    .await
                    .start_container(api::StartContainerRequest {
                        container_id: id.clone(),
                    })
                    .await
                    .unwrap();
            }
        }
    }

    // A plain duplicate of a create that was answered is refused, also while nothing timed out.
    let id = Made::Container.create(&base, &parent, "plain", None).await.unwrap();
    let dup = Made::Container.create(&base, &parent, "plain", None).await.unwrap_err();
    assert_eq!(dup.code(), Code::AlreadyExists);
    assert!(dup.message().contains(&id));

    let daemon = &base.daemon;
    for id in daemon.pods().await.into_iter().map(|p| p.id) {
        remove_pod(daemon, &id).await;
    }
    assert_nothing_left(daemon, &parent, Some(&bridge_of(&base)));
    assert_eq!(panics_in(daemon), Vec::<String>::new());
    eprintln!("retry test took {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// Pod starts take turns (`runtime.max_parallel_sandbox_starts`), and a stuck one lets the next by.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_starts_take_turns_and_a_stuck_one_lets_the_next_by() {
    let parent = CgroupParent::new("turns");
    let base = common::pod::pod_full(
        "turnsbase",
        Some(vec![]),
        "[runtime]\nmax_parallel_sandbox_starts = 1\n",
        "",
    )
    .await;
    let daemon = &base.daemon;
    let _log = LogOnFailure::of(daemon);
    let gate = tempfile::tempdir().unwrap();
    gate_cni_adds(&base, gate.path());
    std::fs::write(gate.path().join("hold"), "").unwrap();

    // The first start holds the one turn, stuck in its CNI ADD.
    let stuck = pod_config("stuck", &parent, base.logs.path(), false);
    let first_answered = std::sync::atomic::AtomicBool::new(false);
    let first = async {
        let answer = run_pod(daemon, &stuck, None).await;
        first_answered.store(true, std::sync::atomic::Ordering::SeqCst);
        answer
    };
    let rest = async {
        eventually("the first start's CNI ADD", || async {
            gate.path().join("started").exists().then_some(())
        })
        .await;

        // The next (on the host network: no ADD) waits for that turn, which the stuck start
        // gives up after a second, and is made while the first is still stuck.
        let next = run_pod(daemon, &pod_config("next", &parent, base.logs.path(), true), None)
            .await
            .unwrap();
        assert!(
            !first_answered.load(std::sync::atomic::Ordering::SeqCst),
            "the stuck start answered before its ADD was let go"
        );
        let log = daemon.log();
        let lines: Vec<&str> = log.lines().collect();
        let gave_up = lines
            .iter()
            .position(|l| l.contains("the next start goes ahead"))
            .expect("the stuck start gave up its turn");
        assert!(lines[gave_up].contains("stuck"), "{}", lines[gave_up]);
        let next_ready = lines
            .iter()
            .position(|l| l.contains(&next) && l.contains("pod sandbox ready"))
            .expect("the next pod's ready line");
        assert!(
            gave_up < next_ready,
            "the next pod was made before the stuck one gave up its turn:\n{log}"
        );
        std::fs::remove_file(gate.path().join("hold")).unwrap();
    };
    let (first, ()) = tokio::join!(first, rest);
    first.unwrap();
    for id in daemon.pods().await.into_iter().map(|p| p.id) {
        remove_pod(daemon, &id).await;
    }
    assert_nothing_left(daemon, &parent, Some(&bridge_of(&base)));
    assert_eq!(panics_in(daemon), Vec::<String>::new());
}

/// Puts a gate before the test network's bridge plugin: while `dir/hold` exists, a CNI ADD
/// touches `dir/started` and waits. (The plugin's dir, `<daemon dir>/cni-bin`, is searched first.)
fn gate_cni_adds(base: &Pod, dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let bins = base.daemon.dir().join("cni-bin");
    std::fs::create_dir_all(&bins).unwrap();
    let bridge = ["/opt/cni/bin/bridge", "/usr/lib/cni/bridge"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("the CNI bridge plugin");
    let (hold, started) = (dir.join("hold"), dir.join("started"));
    let script = format!(
        "#!/bin/sh\nif [ \"$CNI_COMMAND\" = ADD ] && [ -e {hold:?} ]; then\n  : > {started:?}\n  \
         while [ -e {hold:?} ]; do sleep 0.02; done\nfi\nexec {bridge} \"$@\"\n"
    );
    std::fs::write(bins.join("gated-bridge"), script).unwrap();
    std::fs::set_permissions(bins.join("gated-bridge"), std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = base.daemon.cni_conf_dir.join("10-test.conflist");
    let mut conflist: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    conflist["plugins"][0]["type"] = "gated-bridge".into();
    std::fs::write(&path, conflist.to_string()).unwrap();
}

/// A create the caller gives up on while the daemon is still at it, as a kubelet whose deadline
/// passed: the create is held inside the daemon (a pod in its CNI ADD at `gate`'s hold, a
/// container at its pod's shim, stopped with SIGSTOP) until the daemon is seen working on it
/// (the ADD started; a request waiting unread in the stopped shim's socket), then the client
/// drops the call (its HTTP/2 stream is reset) and the hold is released. No deadline races the
/// request's delivery.
async fn abandon_create(made: Made, base: &Pod, parent: &str, name: &str, gate: &Path) {
    use nix::sys::signal::{kill, Signal};
    let (hold, started) = (gate.join("hold"), gate.join("started"));
    let _ = std::fs::remove_file(&started);
    let shim = match made {
        Made::Pod => {
            std::fs::write(&hold, "").unwrap();
            None
        }
        Made::Container => {
            let (pid, _) = shims_of(&base.daemon.state)
                .into_iter()
                .find(|(_, args)| args.contains(&base.id))
                .expect("the base pod's shim");
            let pid = nix::unistd::Pid::from_raw(pid);
            kill(pid, Signal::SIGSTOP).unwrap();
            Some(pid)
        }
    };
    let working = async {
        loop {
            let seen = match made {
                Made::Pod => started.exists(),
                Made::Container => shim.is_some_and(|pid| unread_request(pid.as_raw())),
            };
            if seen {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let gone_before = callers_gone(base);
    let outcome = {
        let create = made.create(base, parent, name, None);
        tokio::select! {
            result = create => Some(result),
            () = working => None,
        }
        // The call is dropped here: the client gave up.
    };
    // The gate stays shut until the daemon has seen the client go (its reset of the stream): a
    // container's create is only a few milliseconds past the shim's answer since its process
    // is made at StartContainer, and one that finished before the daemon saw the reset would be
    // answered to the closed stream instead of kept.
    eventually("the daemon to see the caller go", || async {
        (callers_gone(base) > gone_before).then_some(())
    })
    .await;
    let _ = std::fs::remove_file(&hold);
    if let Some(pid) = shim {
        kill(pid, Signal::SIGCONT).unwrap();
    }
    assert!(outcome.is_none(), "{name}: the held create answered: {outcome:?}");
}

/// How many creates the daemon has seen their caller stop waiting for (`handover`'s log line).
fn callers_gone(pod: &Pod) -> usize {
    pod.daemon.log().matches("the caller stopped waiting").count()
}

/// Whether a unix socket of process `pid` holds bytes it has not read (`ss`'s Recv-Q).
fn unread_request(pid: i32) -> bool {
    let out = Command::new("ss").args(["-xpnH"]).output().expect("run ss");
    String::from_utf8_lossy(&out.stdout).lines().any(|line| {
        let recv_q = line.split_whitespace().nth(2).and_then(|q| q.parse::<u64>().ok());
        line.contains(&format!("pid={pid},")) && recv_q.is_some_and(|q| q > 0)
    })
}

/// The bridge of the test network `pod_with` installed (named in its conflist).
fn bridge_of(pod: &Pod) -> String {
    let conflist = std::fs::read_to_string(pod.daemon.cni_conf_dir.join("10-test.conflist")).unwrap();
    let conflist: serde_json::Value = serde_json::from_str(&conflist).unwrap();
    conflist["plugins"][0]["bridge"].as_str().unwrap().to_string()
}

// ---------------------------------------------------------------------------------------------
// 2. Churn: many create/start/stop/remove cycles leave nothing behind and do not grow the daemon.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn churn_leaves_nothing_behind() {
    let started = Instant::now();
    let cycles: usize = std::env::var("SCUTE_CHURN_CYCLES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let parent = CgroupParent::new("churn");
    let base = pod_with("churnbase", Some(vec![])).await;
    let daemon = &base.daemon;
    let _log = LogOnFailure::of(daemon);
    let bridge = bridge_of(&base);
    let logs = tempfile::tempdir().unwrap();
    let pid = daemon.pid().as_raw();

    async fn cycle(daemon: &Daemon, parent: &str, logs: &Path, i: usize) {
        let name = format!("churn-{i}");
        let config = pod_config(&name, parent, logs, false);
        let sandbox = run_pod(daemon, &config, None).await.unwrap();
        let mut runtime = daemon.runtime().await;
        let id = create_container(daemon, &sandbox, &config, &container("work", "sleep 100"), None)
            .await
            .unwrap();
        runtime
            .start_container(api::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .unwrap();
        runtime
            .stop_container(api::StopContainerRequest {
                container_id: id.clone(),
                timeout: 0,
            })
            .await
            .unwrap();
        runtime
            .remove_container(api::RemoveContainerRequest { container_id: id })
            .await
            .unwrap();
        remove_pod(daemon, &sandbox).await;
    }

    // One warm-up cycle: lazily made things (connections, caches, thread pools) exist afterwards.
    cycle(daemon, &parent, logs.path(), 0).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let links_before = links().len();
    let fds_before = fd_count(pid);
    let rss_before = rss_kib(pid);
    let anon_before = status_kib(pid, "RssAnon:");
    let shims_before = shims_of(&daemon.state).len();

    let churn = Instant::now();
    for i in 1..=cycles {
        cycle(daemon, &parent, logs.path(), i).await;
    }
    let took = churn.elapsed();
    tokio::time::sleep(Duration::from_millis(500)).await;

    let links_after = links().len();
    let fds_after = fd_count(pid);
    let rss_after = rss_kib(pid);
    let anon_after = status_kib(pid, "RssAnon:");
    eprintln!(
        "churn: {cycles} cycles in {took:?} ({:?}/cycle); daemon fds {fds_before} -> {fds_after}, \
         RSS {rss_before} KiB -> {rss_after} KiB (anonymous {anon_before} -> {anon_after} KiB), \
         links {links_before} -> {links_after}",
        took / cycles.max(1) as u32
    );
    // Only the base pod is left.
    assert_eq!(
        daemon.pods().await.into_iter().map(|p| p.id).collect::<Vec<_>>(),
        vec![base.id.clone()]
    );
    assert_eq!(shims_of(&daemon.state).len(), shims_before, "shim processes left");
    assert_eq!(entries(&daemon.state.join("netns")), BTreeSet::from([base.id.clone()]));
    assert_eq!(cgroups_under(&parent), Vec::<PathBuf>::new(), "cgroups left");
    assert_eq!(links_after, links_before, "links left:\n{}", links().join("\n"));
    assert_eq!(
        veths_on(&bridge).len(),
        1,
        "only the base pod's veth: {:?}",
        veths_on(&bridge)
    );
    assert!(
        fds_after <= fds_before + 8,
        "daemon fds grew: {fds_before} -> {fds_after}"
    );
    assert!(
        rss_after <= rss_before + 20 * 1024,
        "daemon RSS grew: {rss_before} KiB -> {rss_after} KiB"
    );

    remove_pod(daemon, &base.id).await;
    assert_nothing_left(daemon, &parent, Some(&bridge));
    assert_eq!(panics_in(daemon), Vec::<String>::new());
    eprintln!("churn test took {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// 3. SIGKILL of the daemon while pods and containers are being created: after the restart each
// one is fully there or fully gone.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_during_concurrent_creation_leaves_whole_pods_or_none() {
    const PODS: usize = 20;
    const CONTAINERS: usize = 4;
    let started = Instant::now();
    let parent = CgroupParent::new("crash");
    let mut base = pod_with("crashbase", Some(vec![])).await;
    let bridge = bridge_of(&base);
    let logs = tempfile::tempdir().unwrap();
    let socket = base.daemon.socket.clone();

    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..PODS {
        let config = pod_config(&format!("crash-{i}"), &parent, logs.path(), false);
        let socket = socket.clone();
        tasks.spawn(async move {
            let mut client = api::runtime_service_client::RuntimeServiceClient::new(common::connect(&socket).await);
            let result = client
                .run_pod_sandbox(api::RunPodSandboxRequest {
                    config: Some(config),
                    runtime_handler: String::new(),
                })
                .await
                .map(|r| r.into_inner().pod_sandbox_id);
            (true, result)
        });
    }
    for i in 0..CONTAINERS {
        let request = api::CreateContainerRequest {
            pod_sandbox_id: base.id.clone(),
            config: Some(container(&format!("crash-c{i}"), "sleep 100")),
            sandbox_config: Some(base.config.clone()),
        };
        let socket = socket.clone();
        tasks.spawn(async move {
            let mut client = api::runtime_service_client::RuntimeServiceClient::new(common::connect(&socket).await);
            let result = client
                .create_container(request)
                .await
                .map(|r| r.into_inner().container_id);
            (false, result)
        });
    }
    // Kill shortly after the first pod is answered: some pods are done (maybe unanswered),
    // the rest in flight at every step.
    let mut answered = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while let Ok(Some(done)) = tokio::time::timeout_at(deadline, tasks.join_next()).await {
        let (is_pod, result) = done.unwrap();
        answered.push(result);
        if is_pod {
            break;
        }
    }
    tokio::time::sleep(Duration::from_millis(30)).await;
    base.daemon.kill();
    while let Some(done) = tasks.join_next().await {
        answered.push(done.unwrap().1);
    }
    let succeeded = answered.iter().filter(|r| r.is_ok()).count();
    eprintln!(
        "crash: {succeeded} of {} creations answered before the kill",
        PODS + CONTAINERS
    );

    base.daemon.start_again();
    let daemon = &base.daemon;
    let _log = LogOnFailure::of(daemon);
    let after = daemon.pods().await;
    let log = daemon.log();
    eprintln!(
        "crash: {} pods after the restart; {} interrupted creations removed, {} starting shims killed",
        after.len(),
        log.matches("creation was interrupted").count(),
        log.matches("killing a shim left by").count()
    );
    let listed: BTreeSet<String> = after.iter().map(|p| p.id.clone()).collect();
    // Every creation answered with an ID is there.
    for id in answered.iter().flatten() {
        let known = listed.contains(id) || !containers_named_id(daemon, id).await.is_empty();
        assert!(known, "{id} was answered but is gone after the restart");
    }
    // Every pod listed is whole: a ready one has its pause, netns and shim; a not-ready one
    // has released its network.
    let mut runtime = daemon.runtime().await;
    for pod in &after {
        let status = runtime
            .pod_sandbox_status(api::PodSandboxStatusRequest {
                pod_sandbox_id: pod.id.clone(),
                verbose: true,
            })
            .await
            .unwrap()
            .into_inner();
        let state = status.status.as_ref().unwrap().state();
        let netns = daemon.state.join("netns").join(&pod.id);
        let info: serde_json::Value = serde_json::from_str(&status.info["info"]).unwrap();
        let pause = info["pid"].as_i64().unwrap_or(0) as i32;
        match state {
            api::PodSandboxState::SandboxReady => {
                assert!(netns.exists(), "ready pod {} has no netns", pod.id);
                assert!(pause > 0 && alive(pause), "ready pod {} has no pause", pod.id);
                assert!(
                    shims_of(&daemon.state).iter().any(|(_, c)| c.contains(&pod.id)),
                    "ready pod {} has no shim",
                    pod.id
                );
            }
            _ => assert!(!netns.exists(), "not-ready pod {} keeps its netns", pod.id),
        }
    }
    // Nothing exists for a pod that is not listed.
    let known = |set: BTreeSet<String>| -> Vec<String> { set.into_iter().filter(|e| !listed.contains(e)).collect() };
    assert_eq!(
        known(entries(&daemon.state.join("netns"))),
        Vec::<String>::new(),
        "stray netns"
    );
    assert_eq!(
        known(entries(&daemon.root.join("sandboxes"))),
        Vec::<String>::new(),
        "stray sandbox dirs"
    );
    let shim_dirs: Vec<String> = entries(&daemon.state.join("shims"))
        .into_iter()
        .filter(|d| !listed.iter().any(|id| id.starts_with(d.as_str())))
        .collect();
    assert_eq!(shim_dirs, Vec::<String>::new(), "stray shim dirs");
    let stray_shims: Vec<(i32, String)> = shims_of(&daemon.state)
        .into_iter()
        .filter(|(_, cmdline)| !listed.iter().any(|id| cmdline.contains(id.as_str())))
        .collect();
    assert_eq!(stray_shims, Vec::new(), "stray shim processes");
    let stray_cgroups: Vec<PathBuf> = cgroups_under(&parent)
        .into_iter()
        .filter(|dir| {
            let name = dir.file_name().unwrap().to_string_lossy();
            // A listed pod's pause and its shim (beside it, named by 32 hex digits of the ID).
            !listed
                .iter()
                .any(|id| name == format!("scute-{id}") || name == format!("scute-shim-{}", &id[..32]))
        })
        .collect();
    assert_eq!(stray_cgroups, Vec::<PathBuf>::new(), "stray cgroups");
    assert_eq!(
        veths_on(&bridge).len(),
        listed_ready_with_network(daemon, &after).await,
        "veths"
    );
    // Containers: each listed one is whole (it starts and runs; until then it holds no mount),
    // the rest left no directory.
    let containers = runtime
        .list_containers(api::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers;
    let container_ids: BTreeSet<String> = containers.iter().map(|c| c.id.clone()).collect();
    assert_eq!(
        entries(&daemon.root.join("containers")),
        container_ids,
        "container dirs"
    );
    for c in &containers {
        let rootfs = daemon.root.join("containers").join(&c.id).join("rootfs");
        assert!(
            !scute_sys::mountinfo::is_mountpoint(&rootfs),
            "created container {} holds its rootfs mounted",
            c.id
        );
        runtime
            .start_container(api::StartContainerRequest {
                container_id: c.id.clone(),
            })
            .await
            .unwrap_or_else(|e| panic!("starting container {} created before the kill: {e:?}", c.id));
        let status = runtime
            .container_status(api::ContainerStatusRequest {
                container_id: c.id.clone(),
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap();
        assert_eq!(
            status.state(),
            api::ContainerState::ContainerRunning,
            "container {}",
            c.id
        );
        assert!(
            scute_sys::mountinfo::is_mountpoint(&rootfs),
            "started container {} has no rootfs",
            c.id
        );
    }

    // The kubelet's retries of what is gone succeed; then everything is removed.
    for i in 0..PODS {
        let name = format!("crash-{i}");
        if pods_named(daemon, &name).await.is_empty() {
            run_pod(daemon, &pod_config(&name, &parent, logs.path(), false), None)
                .await
                .unwrap_or_else(|e| panic!("retrying {name}: {e:?}"));
        }
    }
    for pod in daemon.pods().await {
        remove_pod(daemon, &pod.id).await;
    }
    drop(runtime);
    assert_nothing_left(daemon, &parent, Some(&bridge));
    assert_eq!(panics_in(daemon), Vec::<String>::new());
    eprintln!("crash test took {:?}", started.elapsed());
}

async fn containers_named_id(daemon: &Daemon, id: &str) -> Vec<String> {
    daemon
        .runtime()
        .await
        .list_containers(api::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers
        .into_iter()
        .filter(|c| c.id == id)
        .map(|c| c.id)
        .collect()
}

/// Pods with a netns of their own keep one veth each on the bridge.
async fn listed_ready_with_network(daemon: &Daemon, pods: &[api::PodSandbox]) -> usize {
    pods.iter()
        .filter(|p| daemon.state.join("netns").join(&p.id).exists())
        .count()
}

// ---------------------------------------------------------------------------------------------
// 4. Requests no kubelet should send are refused with InvalidArgument (NotFound for unknown IDs),
// and nothing panics.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_requests_are_refused_cleanly() {
    let started = Instant::now();
    let base = pod("malformed").await;
    let daemon = &base.daemon;
    let _log = LogOnFailure::of(daemon);
    let mut rt = daemon.runtime().await.max_decoding_message_size(64 << 20);
    let mut img = daemon.images().await.max_decoding_message_size(64 << 20);
    let running = base.run(container("running", "sleep 100")).await;
    let huge = "x".repeat(1 << 20);
    let unknown = "f".repeat(64);
    let mut failures = Vec::new();
    let mut check = |what: &str, result: Result<(), tonic::Status>, want: Code| match result {
        Err(status) if status.code() == want => {
            assert!(
                status.message().len() < 8192,
                "{what}: a {} byte message",
                status.message().len()
            );
            assert!(!status.message().is_empty(), "{what}: no message");
        }
        other => failures.push(format!("{what}: want {want:?}, got {other:?}")),
    };
    macro_rules! expect {
        ($want:expr, $what:expr, $call:expr) => {
            check($what, $call.await.map(|_| ()), $want)
        };
    }
    use Code::{InvalidArgument as Invalid, NotFound};

    // RunPodSandbox.
    let logs = base.logs.path().to_path_buf();
    let good_pod = pod_config("malformed-pod", "", &logs, true);
    let run = |config: Option<api::PodSandboxConfig>| api::RunPodSandboxRequest {
        config,
        runtime_handler: String::new(),
    };
    let mut bad_pods: Vec<(&str, Option<api::PodSandboxConfig>)> = vec![("pod: no config", None)];
    let mut edit = |what: &'static str, f: &dyn Fn(&mut api::PodSandboxConfig)| {
        let mut c = good_pod.clone();
        f(&mut c);
        bad_pods.push((what, Some(c)));
    };
    edit("pod: no metadata", &|c| c.metadata = None);
    edit("pod: empty name", &|c| c.metadata.as_mut().unwrap().name.clear());
    edit("pod: 1 MiB name", &|c| {
        c.metadata.as_mut().unwrap().name = "x".repeat(1 << 20)
    });
    edit("pod: NUL in namespace", &|c| {
        c.metadata.as_mut().unwrap().namespace = "a\0b".into()
    });
    edit("pod: network mode 99", &|c| {
        let linux = c.linux.as_mut().unwrap();
        linux
            .security_context
            .as_mut()
            .unwrap()
            .namespace_options
            .as_mut()
            .unwrap()
            .network = 99;
    });
    edit("pod: pid mode -1", &|c| {
        let linux = c.linux.as_mut().unwrap();
        linux
            .security_context
            .as_mut()
            .unwrap()
            .namespace_options
            .as_mut()
            .unwrap()
            .pid = -1;
    });
    edit("pod: protocol 42", &|c| {
        c.port_mappings = vec![api::PortMapping {
            protocol: 42,
            container_port: 80,
            host_port: 8080,
            host_ip: String::new(),
        }]
    });
    edit("pod: negative port", &|c| {
        c.port_mappings = vec![api::PortMapping {
            protocol: 0,
            container_port: -80,
            host_port: 0,
            host_ip: String::new(),
        }]
    });
    edit("pod: relative log directory", &|c| c.log_directory = "logs/here".into());
    edit("pod: NUL in log directory", &|c| c.log_directory = "/tmp/a\0b".into());
    edit("pod: cgroup parent with ..", &|c| {
        c.linux.as_mut().unwrap().cgroup_parent = "/kubepods/../../etc".into()
    });
    edit("pod: hostname with NUL", &|c| c.hostname = "a\0b".into());
    edit("pod: 1 MiB hostname", &|c| c.hostname = "x".repeat(1 << 20));
    edit("pod: negative cpu", &|c| {
        c.linux.as_mut().unwrap().resources = Some(api::LinuxContainerResources {
            cpu_shares: -5,
            ..Default::default()
        })
    });
    for (what, config) in bad_pods {
        expect!(Invalid, what, rt.run_pod_sandbox(run(config)));
    }
    expect!(
        Invalid,
        "pod: unknown handler",
        rt.run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(good_pod.clone()),
            runtime_handler: "nope\0".into(),
        })
    );

    // CreateContainer.
    let create = |sandbox: &str, config: Option<api::ContainerConfig>| api::CreateContainerRequest {
        pod_sandbox_id: sandbox.into(),
        config,
        sandbox_config: Some(base.config.clone()),
    };
    let good = container("bad", "true");
    expect!(
        Invalid,
        "ctr: empty sandbox id",
        rt.create_container(create("", Some(good.clone())))
    );
    expect!(
        NotFound,
        "ctr: unknown sandbox",
        rt.create_container(create(&unknown, Some(good.clone())))
    );
    expect!(
        NotFound,
        "ctr: 1 MiB sandbox id",
        rt.create_container(create(&huge, Some(good.clone())))
    );
    expect!(Invalid, "ctr: no config", rt.create_container(create(&base.id, None)));
    let mut bad_containers: Vec<(&str, api::ContainerConfig)> = Vec::new();
    let mut edit = |what: &'static str, f: &dyn Fn(&mut api::ContainerConfig)| {
        let mut c = good.clone();
        f(&mut c);
        bad_containers.push((what, c));
    };
    edit("ctr: no metadata", &|c| c.metadata = None);
    edit("ctr: empty name", &|c| c.metadata.as_mut().unwrap().name.clear());
    edit("ctr: 1 MiB name", &|c| {
        c.metadata.as_mut().unwrap().name = "x".repeat(1 << 20)
    });
    edit("ctr: slash in name", &|c| {
        c.metadata.as_mut().unwrap().name = "a/b".into()
    });
    edit("ctr: no image", &|c| c.image = None);
    edit("ctr: 1 MiB image", &|c| {
        c.image.as_mut().unwrap().image = "x".repeat(1 << 20)
    });
    let mount = |container_path: &str, host_path: &str, propagation: i32| api::Mount {
        container_path: container_path.into(),
        host_path: host_path.into(),
        propagation,
        ..Default::default()
    };
    edit("ctr: relative mount target", &|c| {
        c.mounts = vec![mount("data", "/tmp", 0)]
    });
    edit("ctr: mount target with ..", &|c| {
        c.mounts = vec![mount("/data/../../etc", "/tmp", 0)]
    });
    edit("ctr: NUL in mount target", &|c| {
        c.mounts = vec![mount("/da\0ta", "/tmp", 0)]
    });
    edit("ctr: relative mount source", &|c| {
        c.mounts = vec![mount("/data", "tmp", 0)]
    });
    edit("ctr: propagation 7", &|c| c.mounts = vec![mount("/data", "/tmp", 7)]);
    edit("ctr: relative working dir", &|c| c.working_dir = "work".into());
    edit("ctr: NUL in command", &|c| c.command = vec!["sh\0".into()]);
    edit("ctr: NUL in args", &|c| c.args = vec!["a\0b".into()]);
    edit("ctr: NUL in env", &|c| {
        c.envs = vec![api::KeyValue {
            key: "A".into(),
            value: "b\0".into(),
        }]
    });
    edit("ctr: = in env key", &|c| {
        c.envs = vec![api::KeyValue {
            key: "A=B".into(),
            value: "c".into(),
        }]
    });
    edit("ctr: log path with ..", &|c| c.log_path = "../../escape.log".into());
    edit("ctr: absolute log path", &|c| c.log_path = "/etc/escape.log".into());
    edit("ctr: relative device", &|c| {
        c.devices = vec![api::Device {
            container_path: "dev/null2".into(),
            host_path: "/dev/null".into(),
            permissions: "rwm".into(),
        }]
    });
    edit("ctr: negative cpu shares", &|c| {
        c.linux = Some(api::LinuxContainerConfig {
            resources: Some(api::LinuxContainerResources {
                cpu_shares: -5,
                ..Default::default()
            }),
            ..Default::default()
        })
    });
    edit("ctr: negative memory", &|c| {
        c.linux = Some(api::LinuxContainerConfig {
            resources: Some(api::LinuxContainerResources {
                memory_limit_in_bytes: -1,
                ..Default::default()
            }),
            ..Default::default()
        })
    });
    edit("ctr: pid mode 99", &|c| {
        c.linux = Some(api::LinuxContainerConfig {
            security_context: Some(api::LinuxContainerSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    pid: 99,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        })
    });
    for (what, config) in bad_containers {
        expect!(Invalid, what, rt.create_container(create(&base.id, Some(config))));
    }

    // StartContainer, ExecSync, Exec, Attach, UpdateContainerResources, ContainerStats.
    let start = |id: &str| api::StartContainerRequest {
        container_id: id.into(),
    };
    expect!(Invalid, "start: empty id", rt.start_container(start("")));
    expect!(NotFound, "start: unknown id", rt.start_container(start(&unknown)));
    expect!(NotFound, "start: 1 MiB id", rt.start_container(start(&huge)));
    let exec_sync = |id: &str, cmd: &[&str], timeout: i64| api::ExecSyncRequest {
        container_id: id.into(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        timeout,
    };
    expect!(
        Invalid,
        "exec_sync: empty id",
        rt.exec_sync(exec_sync("", &["true"], 0))
    );
    expect!(
        NotFound,
        "exec_sync: unknown id",
        rt.exec_sync(exec_sync(&unknown, &["true"], 0))
    );
    expect!(Invalid, "exec_sync: no cmd", rt.exec_sync(exec_sync(&running, &[], 0)));
    expect!(
        Invalid,
        "exec_sync: empty cmd",
        rt.exec_sync(exec_sync(&running, &[""], 0))
    );
    expect!(
        Invalid,
        "exec_sync: NUL in cmd",
        rt.exec_sync(exec_sync(&running, &["tr\0ue"], 0))
    );
    expect!(
        Invalid,
        "exec_sync: negative timeout",
        rt.exec_sync(exec_sync(&running, &["true"], -1))
    );
    let exec = |id: &str, cmd: &[&str]| api::ExecRequest {
        container_id: id.into(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        stdout: true,
        ..Default::default()
    };
    expect!(Invalid, "exec: empty id", rt.exec(exec("", &["true"])));
    expect!(NotFound, "exec: unknown id", rt.exec(exec(&unknown, &["true"])));
    expect!(Invalid, "exec: no cmd", rt.exec(exec(&running, &[])));
    expect!(Invalid, "exec: NUL in cmd", rt.exec(exec(&running, &["tr\0ue"])));
    let attach = |id: &str, stdout: bool| api::AttachRequest {
        container_id: id.into(),
        stdout,
        ..Default::default()
    };
    expect!(Invalid, "attach: empty id", rt.attach(attach("", true)));
    expect!(NotFound, "attach: unknown id", rt.attach(attach(&unknown, true)));
    expect!(Invalid, "attach: no stream", rt.attach(attach(&running, false)));
    let update = |id: &str, resources: Option<api::LinuxContainerResources>| api::UpdateContainerResourcesRequest {
        container_id: id.into(),
        linux: resources,
        ..Default::default()
    };
    let negative = Some(api::LinuxContainerResources {
        memory_limit_in_bytes: -7,
        ..Default::default()
    });
    expect!(
        Invalid,
        "update: empty id",
        rt.update_container_resources(update("", None))
    );
    expect!(
        NotFound,
        "update: unknown id",
        rt.update_container_resources(update(&unknown, None))
    );
    expect!(
        Invalid,
        "update: negative memory",
        rt.update_container_resources(update(&running, negative))
    );
    let stats = |id: &str| api::ContainerStatsRequest {
        container_id: id.into(),
    };
    expect!(Invalid, "stats: empty id", rt.container_stats(stats("")));
    expect!(NotFound, "stats: unknown id", rt.container_stats(stats(&unknown)));
    expect!(NotFound, "stats: 1 MiB id", rt.container_stats(stats(&huge)));

    // PortForward.
    let forward = |id: &str, port: Vec<i32>| api::PortForwardRequest {
        pod_sandbox_id: id.into(),
        port,
    };
    expect!(
        Invalid,
        "port_forward: empty id",
        rt.port_forward(forward("", vec![80]))
    );
    expect!(
        NotFound,
        "port_forward: unknown id",
        rt.port_forward(forward(&unknown, vec![80]))
    );
    expect!(
        Invalid,
        "port_forward: port 0",
        rt.port_forward(forward(&base.id, vec![0]))
    );
    expect!(
        Invalid,
        "port_forward: port 70000",
        rt.port_forward(forward(&base.id, vec![70000]))
    );

    // PullImage, ImageStatus.
    let spec = |image: &str| {
        Some(api::ImageSpec {
            image: image.into(),
            ..Default::default()
        })
    };
    let pull = |image: Option<api::ImageSpec>| api::PullImageRequest {
        image,
        ..Default::default()
    };
    expect!(Invalid, "pull: no image", img.pull_image(pull(None)));
    expect!(Invalid, "pull: empty image", img.pull_image(pull(spec(""))));
    expect!(
        Invalid,
        "pull: bad reference",
        img.pull_image(pull(spec("UPPER/Case::bad")))
    );
    expect!(
        Invalid,
        "pull: NUL in reference",
        img.pull_image(pull(spec("busy\0box")))
    );
    expect!(Invalid, "pull: 1 MiB reference", img.pull_image(pull(spec(&huge))));
    let status = |image: Option<api::ImageSpec>| api::ImageStatusRequest { image, verbose: true };
    expect!(Invalid, "image_status: no image", img.image_status(status(None)));
    expect!(Invalid, "image_status: empty image", img.image_status(status(spec(""))));
    expect!(
        Invalid,
        "image_status: NUL in reference",
        img.image_status(status(spec("busy\0box")))
    );

    // Stop/Remove of unknown IDs succeed (the kubelet retries them).
    rt.stop_container(api::StopContainerRequest {
        container_id: unknown.clone(),
        timeout: 0,
    })
    .await
    .unwrap();
    rt.remove_container(api::RemoveContainerRequest {
        container_id: unknown.clone(),
    })
    .await
    .unwrap();
    rt.stop_pod_sandbox(api::StopPodSandboxRequest {
        pod_sandbox_id: unknown.clone(),
    })
    .await
    .unwrap();
    rt.remove_pod_sandbox(api::RemovePodSandboxRequest {
        pod_sandbox_id: unknown.clone(),
    })
    .await
    .unwrap();

    assert!(
        failures.is_empty(),
        "{} wrong answers:\n{}",
        failures.len(),
        failures.join("\n")
    );
    // Alive, sane, and nothing half made.
    rt.version(api::VersionRequest::default()).await.unwrap();
    assert_eq!(panics_in(daemon), Vec::<String>::new());
    assert_eq!(daemon.pods().await.len(), 1, "only the base pod");
    assert_eq!(containers_named(daemon, "bad").await, Vec::<String>::new());
    drop((rt, img));
    base.remove_all().await;
    assert_nothing_left(daemon, "/scute-robust-none", None);
    eprintln!("malformed test took {:?}", started.elapsed());
}

// ---------------------------------------------------------------------------------------------
// 5. A pod's shim SIGKILLed while its pod runs: the daemon keeps answering, records the
// containers exited and the pod NotReady, ends what the shim ran, and the kubelet's stop and
// removal leave nothing behind.

/// The processes in the cgroups under `parent` whose dir name contains `id`.
fn procs_of(parent: &str, id: &str) -> BTreeSet<i32> {
    cgroups_under(parent)
        .into_iter()
        .filter(|dir| dir.to_string_lossy().contains(id))
        .flat_map(|dir| {
            std::fs::read_to_string(dir.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter_map(|l| l.trim().parse().ok())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_shim_takes_its_pod_down_and_leaves_nothing() {
    let parent = CgroupParent::new("deadshim");
    let base = pod_with("deadshimbase", Some(vec![])).await;
    let daemon = &base.daemon;
    let _log = LogOnFailure::of(daemon);
    let bridge = bridge_of(&base);
    let logs = tempfile::tempdir().unwrap();
    let config = pod_config("deadshim", &parent, logs.path(), false);
    let sandbox = run_pod(daemon, &config, None).await.unwrap();
    let id = create_container(daemon, &sandbox, &config, &container("work", "sleep 100"), None)
        .await
        .unwrap();
    let mut runtime = daemon.runtime().await;
    runtime
        .start_container(api::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap();
    let workload = procs_of(&parent, &id);
    let pause = procs_of(&parent, &sandbox);
    assert_eq!((workload.len(), pause.len()), (1, 1), "{workload:?} {pause:?}");
    let shim = shims_of(&daemon.state.join("shims").join(&sandbox[..32]));
    assert_eq!(shim.len(), 1, "{shim:?}");

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(shim[0].0), nix::sys::signal::Signal::SIGKILL).unwrap();

    // The lists keep answering (the kubelet's relist fails the whole node otherwise), with the
    // container exited and the pod NotReady.
    let status = eventually("the container recorded exited", || {
        let id = id.clone();
        async move {
            let listed = daemon
                .runtime()
                .await
                .list_containers(api::ListContainersRequest::default())
                .await
                .expect("ListContainers answers")
                .into_inner();
            let ours = listed.containers.iter().find(|c| c.id == id)?;
            (ours.state == api::ContainerState::ContainerExited as i32).then_some(())?;
            daemon
                .runtime()
                .await
                .container_status(api::ContainerStatusRequest {
                    container_id: id,
                    verbose: false,
                })
                .await
                .unwrap()
                .into_inner()
                .status
        }
    })
    .await;
    assert_eq!((status.exit_code, status.reason.as_str()), (255, "Unknown"));
    assert_eq!(status.message, "the pod's shim is gone");
    let pods = daemon.pods().await;
    let ours = pods.iter().find(|p| p.id == sandbox).unwrap();
    assert_eq!(ours.state, api::PodSandboxState::SandboxNotready as i32);
    // What the shim ran is ended, not left running under a record that says it exited.
    let ended: Vec<i32> = workload.iter().chain(&pause).copied().collect();
    eventually("the shim's processes ended", || {
        let ended = ended.clone();
        async move { ended.iter().all(|&pid| !alive(pid)).then_some(()) }
    })
    .await;

    // The kubelet's clean-up of the pod goes through.
    runtime
        .stop_container(api::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await
        .unwrap();
    runtime
        .remove_container(api::RemoveContainerRequest { container_id: id })
        .await
        .unwrap();
    remove_pod(daemon, &sandbox).await;
    remove_pod(daemon, &base.id).await;
    assert_nothing_left(daemon, &parent, Some(&bridge));
    assert_eq!(panics_in(daemon), Vec::<String>::new());
    // Said once, of the killed shim: a removal shutting its pod's shim down is no death.
    assert_eq!(
        daemon.log().matches("the pod's shim died").count(),
        1,
        "{}",
        daemon.log()
    );
}

/// A container that exited while the daemon was down, its shim then SIGKILLed: the exit the
/// shim had written to disk before it died is the container's (a Job's 0 stays a success), not
/// the 255 of a shim gone under a running container.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_shims_written_exit_is_kept() {
    let parent = CgroupParent::new("deadshimexit");
    let mut base = pod("deadshimexitbase").await;
    let logs = tempfile::tempdir().unwrap();
    let config = pod_config("deadshimexit", &parent, logs.path(), true);
    let (sandbox, id, pid) = {
        let daemon = &base.daemon;
        let sandbox = run_pod(daemon, &config, None).await.unwrap();
        let script = "trap 'exit 0' TERM; echo ready; while :; do sleep 0.1; done";
        let id = create_container(daemon, &sandbox, &config, &container("job", script), None)
            .await
            .unwrap();
        daemon
            .runtime()
            .await
            .start_container(api::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .unwrap();
        let pid = daemon.container_info(&id).await["pid"].as_i64().unwrap() as i32;
        (sandbox, id, pid)
    };
    // The trap is set (a signal to a PID namespace's init without a handler is dropped), and
    // the shim's helpers, which carry its command line, are done.
    let log = logs.path().join("job.log");
    eventually("the trap set", || {
        let log = log.clone();
        async move { std::fs::read_to_string(log).ok()?.contains("ready").then_some(()) }
    })
    .await;
    let shim_dir = base.daemon.state.join("shims").join(&sandbox[..32]);
    let shim = eventually("one shim process", || {
        let shim = shims_of(&shim_dir);
        async move { (shim.len() == 1).then_some(shim) }
    })
    .await;

    // With the daemon down, the container exits 0 and its shim writes the exit; then the shim
    // is killed before any daemon has heard of it.
    base.daemon.kill();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGTERM).unwrap();
    let exit_file = shim_dir.join("exits").join(format!("{id}.json"));
    eventually("the shim wrote the exit", || {
        let exit_file = exit_file.clone();
        async move { exit_file.exists().then_some(()) }
    })
    .await;
    let shim_pid = shim[0].0;
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(shim_pid), nix::sys::signal::Signal::SIGKILL).unwrap();
    eventually(
        "the shim ended",
        move || async move { (!alive(shim_pid)).then_some(()) },
    )
    .await;

    base.daemon.start_again();
    let daemon = &base.daemon;
    let _log = LogOnFailure::of(daemon);
    let status = eventually("the container recorded exited", || {
        let id = id.clone();
        async move {
            daemon
                .runtime()
                .await
                .container_status(api::ContainerStatusRequest {
                    container_id: id,
                    verbose: false,
                })
                .await
                .unwrap()
                .into_inner()
                .status
                .filter(|s| s.state() == api::ContainerState::ContainerExited)
        }
    })
    .await;
    assert_eq!(
        (status.exit_code, status.reason.as_str()),
        (0, "Completed"),
        "{status:?}"
    );
    let pods = daemon.pods().await;
    let ours = pods.iter().find(|p| p.id == sandbox).unwrap();
    assert_eq!(ours.state, api::PodSandboxState::SandboxNotready as i32);

    let mut runtime = daemon.runtime().await;
    runtime
        .remove_container(api::RemoveContainerRequest { container_id: id })
        .await
        .unwrap();
    remove_pod(daemon, &sandbox).await;
    base.remove_all().await;
    assert_nothing_left(daemon, &parent, None);
    assert_eq!(panics_in(daemon), Vec::<String>::new());
}
