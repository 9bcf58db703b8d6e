//! Container lifecycle benchmark: latency of CreateContainer, StartContainer, StopContainer and
//! RemoveContainer over N sequential cycles in one pod, the latency of ListContainers,
//! ListPodSandbox, ListContainerStats and ListPodSandboxStats with 100 running containers in one
//! pod, then density: 110 pods (the kubelet's default maxPods) each running one container, all
//! asked for at once, the time until the last container started, the per-pod shim RSS and the
//! node's memory for the runtime (daemon + shims), then ListContainers and ListPodSandbox at scale
//! (1000 created containers in one pod, 1000 stopped pods); printed side by side with containerd's
//! CRI plugin (runc) when `containerd` and `runc` are on PATH. Last, `crictl ps -a` over 100
//! running containers (crictl from SCUTE_TEST_TOOLS or PATH) with every runtime up at once.
//!
//!   cargo bench --bench containers     (SCUTE_BENCH_CONTAINERS=N cycles, default 50; 3 without --bench;
//!                                       SCUTE_BENCH_STATS_CONTAINERS=N, default 100; 5 without --bench;
//!                                       SCUTE_BENCH_DENSITY_PODS=N, default 110; 3 without --bench;
//!                                       SCUTE_BENCH_LIST_OBJECTS=N, default 1000; 4 without --bench)
//!
//! Both runtimes pull busybox (`<registry>/e2e-test-images/busybox:1.29-2`) from one local registry
//! filled by images/build.sh (plain HTTP: loopback for scute, hosts.toml for containerd, which also
//! gets its pause image from there). Pods use the host network, so CNI stays out of the figures
//! (each daemon still gets a bridge conflist of its own so that it reports NetworkReady). The
//! containers run `sleep 3600` and are stopped with timeout 0 (SIGKILL). Figures are printed,
//! never asserted. Everything started is stopped and removed on drop, also on a panic: daemons,
//! leftover shims and container processes, mounts, netns, cgroups, the registry, temp dirs.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use scute::api;
use scute::api::image_service_client::ImageServiceClient;
use scute::api::runtime_service_client::RuntimeServiceClient;
use tonic::transport::Channel;

/// Timed ListContainerStats / ListPodSandboxStats calls (after one untimed call each).
const STATS_CALLS: usize = 20;
/// Timed rounds of `crictl ps -a` and `crictl version` against each runtime in turn.
const CRICTL_ROUNDS: usize = 60;
/// Requests in flight while the objects of the lists-at-scale phase are made and removed (untimed).
const SETUP_CONCURRENCY: usize = 8;
// Daemon, registry and host-state helpers shared with the other CRI benchmarks.
include!("common/harness.rs");

fn pod_config(name: &str, logs: &Path) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}-{}", std::process::id()),
            namespace: "bench".into(),
            attempt: 0,
        }),
        // No hostname: runc refuses to set one without a private UTS namespace (host network).
        log_directory: logs.display().to_string(),
        labels: [("app".to_string(), name.to_string())].into(),
        // Host network: CNI stays out of the figures.
        linux: Some(api::LinuxPodSandboxConfig {
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: api::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container_config(name: &str, image: &str) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        command: vec!["sleep".into(), "3600".into()],
        log_path: format!("{name}.log"),
        ..Default::default()
    }
}

struct Client<'a> {
    daemon: &'a Daemon,
    channel: Channel,
    rt: RuntimeServiceClient<Channel>,
    image: String,
    logs: PathBuf,
}

/// A pod with the config it was created from (CreateContainer sends it along).
struct Pod {
    id: String,
    config: api::PodSandboxConfig,
}

impl<'a> Client<'a> {
    /// A client of `daemon` once it is ready, making containers of `image`.
    async fn connect(daemon: &'a Daemon, image: &str) -> Client<'a> {
        let channel = scute::client::connect(&daemon.socket).await.expect("connect");
        let logs = daemon.dir.path().join("logs");
        std::fs::create_dir_all(&logs).unwrap();
        let mut rt = RuntimeServiceClient::new(channel.clone());
        daemon.wait_ready(&mut rt).await;
        Client {
            daemon,
            channel,
            rt,
            image: image.into(),
            logs,
        }
    }

    /// Pulls the client's image: how long it took.
    async fn pull(&self) -> Duration {
        let mut images = ImageServiceClient::new(self.channel.clone());
        let pull = images.pull_image(api::PullImageRequest {
            image: Some(api::ImageSpec {
                image: self.image.clone(),
                ..Default::default()
            }),
            ..Default::default()
        });
        self.daemon.timed("PullImage", pull).await.1
    }

    /// A pod `name` with `n` running containers: the pod and their IDs.
    async fn running_pod(&self, name: &str, n: usize) -> (Pod, Vec<String>) {
        let pod = self.run_pod(name).await;
        let mut ids = Vec::new();
        for i in 0..n {
            let (id, _) = self.create(&pod, &format!("{name}-{i}")).await;
            self.start(&id).await;
            ids.push(id);
        }
        (pod, ids)
    }

    /// Stops and removes `running_pod`'s containers, then the pod.
    async fn remove_running(&self, pod: &Pod, ids: &[String]) {
        for id in ids {
            self.stop(id).await;
            self.remove(id).await;
        }
        self.remove_pod(pod).await;
    }

    async fn run_pod(&self, name: &str) -> Pod {
        let mut rt = self.rt.clone();
        let config = pod_config(name, &self.logs);
        let (r, _) = self
            .daemon
            .timed(
                "RunPodSandbox",
                rt.run_pod_sandbox(api::RunPodSandboxRequest {
                    config: Some(config.clone()),
                    runtime_handler: String::new(),
                }),
            )
            .await;
        let id = r.into_inner().pod_sandbox_id;
        self.daemon.created.borrow_mut().push(id.clone());
        Pod { id, config }
    }

    async fn remove_pod(&self, pod: &Pod) {
        let mut rt = self.rt.clone();
        let stop = api::StopPodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        };
        self.daemon.timed("StopPodSandbox", rt.stop_pod_sandbox(stop)).await;
        let remove = api::RemovePodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        };
        self.daemon
            .timed("RemovePodSandbox", rt.remove_pod_sandbox(remove))
            .await;
    }

    async fn create(&self, pod: &Pod, name: &str) -> (String, Duration) {
        let mut rt = self.rt.clone();
        let (r, took) = self
            .daemon
            .timed(
                "CreateContainer",
                rt.create_container(api::CreateContainerRequest {
                    pod_sandbox_id: pod.id.clone(),
                    config: Some(container_config(name, &self.image)),
                    sandbox_config: Some(pod.config.clone()),
                }),
            )
            .await;
        let id = r.into_inner().container_id;
        self.daemon.created.borrow_mut().push(id.clone());
        (id, took)
    }

    async fn start(&self, id: &str) -> Duration {
        let mut rt = self.rt.clone();
        let req = api::StartContainerRequest {
            container_id: id.into(),
        };
        self.daemon.timed("StartContainer", rt.start_container(req)).await.1
    }

    async fn stop(&self, id: &str) -> Duration {
        let mut rt = self.rt.clone();
        let req = api::StopContainerRequest {
            container_id: id.into(),
            timeout: 0,
        };
        self.daemon.timed("StopContainer", rt.stop_container(req)).await.1
    }

    async fn remove(&self, id: &str) -> Duration {
        let mut rt = self.rt.clone();
        let req = api::RemoveContainerRequest {
            container_id: id.into(),
        };
        self.daemon.timed("RemoveContainer", rt.remove_container(req)).await.1
    }
}

#[derive(Default)]
struct Samples {
    create: Vec<Duration>,
    start: Vec<Duration>,
    stop: Vec<Duration>,
    remove: Vec<Duration>,
}

struct Figures {
    samples: Samples,
    shim_rss_kib: f64,
    shim_procs_per_pod: f64,
    /// All the density pods' shims together.
    shims_rss_kib: u64,
    /// From asking for the density pods to the last of their containers started.
    density_start: Duration,
    daemon_rss_kib: u64,
    /// Anonymous memory and PSS (smaps_rollup) of the daemon and of every shim together, at the
    /// same moment as the RSS.
    daemon_anon_kib: u64,
    daemon_pss_kib: u64,
    shims_anon_kib: u64,
    shims_pss_kib: u64,
    list_container_stats: Vec<Duration>,
    list_containers: Vec<Duration>,
    list_pods: Vec<Duration>,
    /// ListContainers with the lists-at-scale phase's created containers.
    list_containers_at_scale: Vec<Duration>,
    /// ListPodSandbox with the lists-at-scale phase's stopped pods.
    list_pods_at_scale: Vec<Duration>,
    /// containerd 1.6 fails ListPodSandboxStats for pods without a cgroup parent: its error.
    list_pod_stats: Result<Vec<Duration>, String>,
}

/// How many objects each phase makes.
#[derive(Clone, Copy)]
struct Sizes {
    cycles: usize,
    stats_containers: usize,
    density_pods: usize,
    list_objects: usize,
}

/// crictl from `SCUTE_TEST_TOOLS`, else PATH.
fn crictl() -> Option<PathBuf> {
    std::env::var_os("SCUTE_TEST_TOOLS")
        .map(|d| PathBuf::from(d).join("crictl"))
        .filter(|p| p.exists())
        .or_else(|| {
            std::env::split_paths(&std::env::var_os("PATH")?)
                .map(|d| d.join("crictl"))
                .find(|p| p.exists())
        })
}

/// What a phase found left behind, for the end of the output.
type Notes = Vec<String>;

/// Medians of one runtime's crictl runs.
struct CrictlTimes {
    /// `crictl ps -a`, the whole command.
    ps: Duration,
    /// `crictl version`: the process, its connection and the Version call crictl makes before
    /// anything else, what `ps -a` costs before it lists.
    version: Duration,
}

/// `crictl ps -a` as an operator types it, side by side: every runtime up at once, each with
/// `containers` running containers in one pod, and crictl run against each in turn
/// (`CRICTL_ROUNDS` rounds after an untimed one, the order reversed every other round), so that
/// whatever else the machine does falls on all of them alike. A Go program that takes 12 ms to
/// start, measured minutes apart per runtime, moved more than the few milliseconds compared.
/// None without crictl. Fails when fewer than `containers` rows are printed.
fn crictl_side_by_side(registry: &str, image: &str, containers: usize) -> Option<(Vec<(String, CrictlTimes)>, Notes)> {
    let crictl = crictl()?;
    let mut daemons = vec![start_scute()];
    daemons.extend(anchors().iter().map(|a| start_containerd(a, registry)));
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut filled = Vec::new();
    for daemon in &daemons {
        filled.push(runtime.block_on(async {
            let client = Client::connect(daemon, image).await;
            client.pull().await;
            let (pod, ids) = client.running_pod("bench-crictl", containers).await;
            (client, pod, ids)
        }));
    }
    let run = |daemon: &Daemon, args: &[&str]| {
        let endpoint = format!("unix://{}", daemon.socket.display());
        let started = Instant::now();
        let out = Command::new(&crictl)
            .args(["--runtime-endpoint", &endpoint, "--image-endpoint", &endpoint])
            .args(args)
            .output()
            .expect("running crictl");
        let took = started.elapsed();
        if !out.status.success() {
            daemon.fail("crictl", String::from_utf8_lossy(&out.stderr).into_owned());
        }
        (took, String::from_utf8_lossy(&out.stdout).lines().count())
    };
    let mut samples = vec![(Vec::new(), Vec::new()); daemons.len()];
    for round in 0..=CRICTL_ROUNDS {
        let mut order: Vec<usize> = (0..daemons.len()).collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for i in order {
            let (ps, rows) = run(&daemons[i], &["ps", "-a"]);
            if rows < containers + 1 {
                daemons[i].fail(
                    "crictl ps -a",
                    format!("{} of {containers} containers", rows.saturating_sub(1)),
                );
            }
            let (version, _) = run(&daemons[i], &["version"]);
            if round > 0 {
                samples[i].0.push(ps);
                samples[i].1.push(version);
            }
        }
    }
    for (client, pod, ids) in &filled {
        runtime.block_on(client.remove_running(pod, ids));
    }
    drop(filled);
    drop(runtime);
    // Last started, first stopped: each one's host snapshot was taken with the others up.
    let mut notes = Vec::new();
    for daemon in daemons.iter_mut().rev() {
        notes.extend(daemon.shutdown().into_iter().map(|n| format!("{}: {n}", daemon.name())));
    }
    let times = daemons
        .iter()
        .zip(samples)
        .map(|(d, (ps, version))| {
            let times = CrictlTimes {
                ps: median(ps),
                version: median(version),
            };
            (d.name().to_string(), times)
        })
        .collect();
    Some((times, notes))
}

fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// `calls` timed calls of ListContainers and of ListPodSandbox (after one untimed call each),
/// failing when fewer than `containers` / `pods` objects are listed.
async fn time_lists(
    client: &Client<'_>,
    calls: usize,
    containers: usize,
    pods: usize,
) -> (Vec<Duration>, Vec<Duration>) {
    let mut rt = client.rt.clone();
    let (mut list_containers, mut list_pods) = (Vec::new(), Vec::new());
    for i in 0..=calls {
        let (r, took) = client
            .daemon
            .timed(
                "ListContainers",
                rt.list_containers(api::ListContainersRequest { filter: None }),
            )
            .await;
        let listed = r.into_inner().containers.len();
        if listed < containers {
            client
                .daemon
                .fail("ListContainers", format!("{listed} of {containers} containers"));
        }
        let (r, took_list_pods) = client
            .daemon
            .timed(
                "ListPodSandbox",
                rt.list_pod_sandbox(api::ListPodSandboxRequest { filter: None }),
            )
            .await;
        let listed = r.into_inner().items.len();
        if listed < pods {
            client.daemon.fail("ListPodSandbox", format!("{listed} of {pods} pods"));
        }
        if i > 0 {
            list_containers.push(took);
            list_pods.push(took_list_pods);
        }
    }
    (list_containers, list_pods)
}

/// Every shim process of `daemon` and their RSS together (KiB). By process name: a scute
/// container created and not started waits in a process forked from the shim, with its
/// command line. (comm is cut to 15 bytes: "containerd2-shi".)
fn all_shims(daemon: &Daemon) -> (usize, u64) {
    let comm = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    let is_shim = |pid: i32| {
        let comm = comm(pid);
        let comm = comm.trim();
        !comm.is_empty() && daemon.shim_name().starts_with(comm)
    };
    let pids: Vec<i32> = processes()
        .into_iter()
        .filter(|p| p.cmdline.contains(&daemon.marker()) && is_shim(p.pid))
        .map(|p| p.pid)
        .collect();
    let kib = pids.iter().map(|&pid| proc_kib(pid as u32, "status", "VmRSS")).sum();
    (pids.len(), kib)
}

/// Lists at scale: `n` created (not started) containers in one pod, and `n` stopped pods (a
/// node's history before the kubelet's garbage collection), then ListContainers and
/// ListPodSandbox timed. Made and removed `SETUP_CONCURRENCY` at a time, untimed.
async fn lists_at_scale(client: &Client<'_>, n: usize) -> (Vec<Duration>, Vec<Duration>) {
    use futures_util::StreamExt;
    // Every create reads the mount table (libcontainer's and runc's cgroup v1 lookups): how much
    // it grows with the objects is part of what they cost.
    let mounts = || std::fs::read_to_string("/proc/self/mountinfo").map_or(0, |t| t.lines().count());
    let mounts_before = mounts();
    let started = Instant::now();
    let pod = client.run_pod("bench-lists").await;
    let containers: Vec<String> = futures_util::stream::iter(0..n)
        .map(|i| {
            let pod = &pod;
            async move { client.create(pod, &format!("listed-{i}")).await.0 }
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect()
        .await;
    let containers_made = started.elapsed();
    let pods: Vec<Pod> = futures_util::stream::iter(0..n)
        .map(|i| async move {
            let pod = client.run_pod(&format!("bench-listed-{i}")).await;
            let mut rt = client.rt.clone();
            let stop = api::StopPodSandboxRequest {
                pod_sandbox_id: pod.id.clone(),
            };
            client.daemon.timed("StopPodSandbox", rt.stop_pod_sandbox(stop)).await;
            pod
        })
        .buffer_unordered(SETUP_CONCURRENCY)
        .collect()
        .await;
    // What the stopped pods cost the node: a runtime whose shim outlives its pod's stop keeps
    // a process for each (the kubelet keeps a finished Job's pod until it is deleted).
    let made = started.elapsed();
    let (shims, shims_kib) = all_shims(client.daemon);
    println!(
        "  {:<10} lists at scale: {n} created containers and {n} stopped pods made in {:.1} s \
         (the containers {:.1} s, then the pods {:.1} s); then {shims} shim processes, {:.1} MiB RSS together, \
         {} more mounts on the node",
        client.daemon.name(),
        made.as_secs_f64(),
        containers_made.as_secs_f64(),
        (made - containers_made).as_secs_f64(),
        shims_kib as f64 / 1024.0,
        mounts().saturating_sub(mounts_before),
    );
    let figures = time_lists(client, STATS_CALLS, n, n).await;
    futures_util::stream::iter(&containers)
        .for_each_concurrent(SETUP_CONCURRENCY, |id| async move {
            client.remove(id).await;
        })
        .await;
    futures_util::stream::iter(pods.iter().chain([&pod]))
        .for_each_concurrent(SETUP_CONCURRENCY, |pod| async move {
            client.remove_pod(pod).await;
        })
        .await;
    figures
}

async fn measure(daemon: &Daemon, sizes: Sizes, image: &str) -> Figures {
    let Sizes {
        cycles,
        stats_containers,
        density_pods,
        list_objects,
    } = sizes;
    let client = Client::connect(daemon, image).await;
    let took = client.pull().await;
    println!(
        "  {:<10} pulled {image} in {:.0} ms",
        daemon.name(),
        took.as_secs_f64() * 1e3
    );

    let pod = client.run_pod("bench-ctr").await;
    // One untimed cycle: first-use work (the image's first snapshot, cgroup parents).
    let (id, c) = client.create(&pod, "warmup").await;
    let s = client.start(&id).await;
    let t = client.stop(&id).await;
    let r = client.remove(&id).await;
    println!(
        "  {:<10} warm-up cycle (untimed): create {:.1} ms, start {:.1} ms, stop {:.1} ms, remove {:.1} ms",
        daemon.name(),
        c.as_secs_f64() * 1e3,
        s.as_secs_f64() * 1e3,
        t.as_secs_f64() * 1e3,
        r.as_secs_f64() * 1e3
    );

    let mut samples = Samples::default();
    let started = Instant::now();
    for i in 0..cycles {
        let (id, took) = client.create(&pod, &format!("cycle-{i}")).await;
        samples.create.push(took);
        samples.start.push(client.start(&id).await);
        samples.stop.push(client.stop(&id).await);
        samples.remove.push(client.remove(&id).await);
    }
    println!(
        "  {:<10} {cycles} cycles in {:.1} s",
        daemon.name(),
        started.elapsed().as_secs_f64()
    );
    client.remove_pod(&pod).await;

    // Stats of `stats_containers` running containers in one pod.
    let (pod, ids) = client.running_pod("bench-stats", stats_containers).await;
    let (list_containers, list_pods) = time_lists(&client, STATS_CALLS, stats_containers, 1).await;
    let (mut list_container_stats, mut list_pod_stats) = (Vec::new(), Ok(Vec::new()));
    for i in 0..=STATS_CALLS {
        let mut rt = client.rt.clone();
        let (r, took) = client
            .daemon
            .timed(
                "ListContainerStats",
                rt.list_container_stats(api::ListContainerStatsRequest { filter: None }),
            )
            .await;
        let listed = r.into_inner().stats.len();
        if listed < stats_containers {
            client.daemon.fail(
                "ListContainerStats",
                format!("{listed} stats for {stats_containers} containers"),
            );
        }
        let started = Instant::now();
        let pods = tokio::time::timeout(
            RPC_TIMEOUT,
            rt.list_pod_sandbox_stats(api::ListPodSandboxStatsRequest { filter: None }),
        )
        .await;
        let took_pods = started.elapsed();
        if let Ok(Err(e)) = &pods {
            list_pod_stats = Err(e.message().to_string());
        } else if pods.is_err() {
            client
                .daemon
                .fail("ListPodSandboxStats", format!("no answer in {RPC_TIMEOUT:?}"));
        }
        // The first call of each is untimed: it fills the runtime's CPU sample cache.
        if i > 0 {
            list_container_stats.push(took);
            if let Ok(samples) = &mut list_pod_stats {
                samples.push(took_pods);
            }
        }
    }
    client.remove_running(&pod, &ids).await;

    // Density: `density_pods` pods, each with one running container, all asked for at once (the
    // kubelet's pod workers run side by side), timed until the last container started; then RSS.
    let started = Instant::now();
    let running: Vec<(Pod, String)> = futures_util::future::join_all((0..density_pods).map(|i| {
        let client = &client;
        async move {
            let pod = client.run_pod(&format!("bench-rss-{i}")).await;
            let (id, _) = client.create(&pod, "sleep").await;
            client.start(&id).await;
            (pod, id)
        }
    }))
    .await;
    let density_start = started.elapsed();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut rss, mut procs, mut shims_anon_kib, mut shims_pss_kib) = (0u64, 0usize, 0u64, 0u64);
    for (pod, _) in &running {
        let pids = shim_pids(daemon, &pod.id);
        if pids.is_empty() {
            client.daemon.fail(
                "RSS",
                format!("no {} process found for sandbox {}", daemon.shim_name(), pod.id),
            );
        }
        procs += pids.len();
        rss += pids.iter().map(|&pid| proc_kib(pid, "status", "VmRSS")).sum::<u64>();
        // What the node cannot reclaim (anonymous), and each page counted once over the
        // processes sharing it (PSS: the shims share their binary's pages).
        for m in pids.iter().map(|&pid| memory(pid)) {
            shims_anon_kib += m.anon;
            shims_pss_kib += m.pss;
        }
    }
    let daemon_rss_kib = proc_kib(daemon.pid(), "status", "VmRSS");
    let daemon_memory = memory(daemon.pid());
    for (pod, id) in &running {
        client.stop(id).await;
        client.remove(id).await;
        client.remove_pod(pod).await;
    }

    let (list_containers_at_scale, list_pods_at_scale) = lists_at_scale(&client, list_objects).await;
    Figures {
        samples,
        shim_rss_kib: rss as f64 / density_pods as f64,
        shim_procs_per_pod: procs as f64 / density_pods as f64,
        shims_rss_kib: rss,
        density_start,
        daemon_rss_kib,
        daemon_anon_kib: daemon_memory.anon,
        daemon_pss_kib: daemon_memory.pss,
        shims_anon_kib,
        shims_pss_kib,
        list_container_stats,
        list_containers,
        list_pods,
        list_containers_at_scale,
        list_pods_at_scale,
        list_pod_stats,
    }
}

/// Measures a daemon on a client runtime of its own, dropped (closing the connections) before the
/// daemon is shut down.
fn bench(daemon: &mut Daemon, sizes: Sizes, image: &str) -> (Figures, Vec<String>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let figures = runtime.block_on(measure(daemon, sizes, image));
    drop(runtime);
    let notes = daemon.shutdown();
    (figures, notes)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing: run quickly then.
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let cycles: usize = std::env::var("SCUTE_BENCH_CONTAINERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench_mode { 50 } else { 3 })
        .max(1);
    let stats_containers: usize = std::env::var("SCUTE_BENCH_STATS_CONTAINERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench_mode { 100 } else { 5 })
        .max(1);
    // The kubelet's default maxPods.
    let density_pods: usize = std::env::var("SCUTE_BENCH_DENSITY_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench_mode { 110 } else { 3 })
        .max(1);
    let list_objects: usize = std::env::var("SCUTE_BENCH_LIST_OBJECTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench_mode { 1000 } else { 4 })
        .max(1);
    let sizes = Sizes {
        cycles,
        stats_containers,
        density_pods,
        list_objects,
    };
    ensure_shim_built();
    println!(
        "container benchmark: {cycles} sequential CreateContainer -> StartContainer -> StopContainer(timeout 0) \
         -> RemoveContainer cycles of busybox `sleep 3600` in one host-network pod, ListContainerStats and \
         ListPodSandboxStats with {stats_containers} running containers in one pod, then {density_pods} pods \
         with one running container each, all asked for at once, for the time to start them and RSS, then \
         ListContainers and ListPodSandbox with {list_objects} created containers and {list_objects} stopped pods"
    );

    // Dropped last: after every daemon.
    let registry = Registry::start();
    registry.push_test_images();
    let image = format!("{}/e2e-test-images/busybox:1.29-2", registry.addr);

    let (results, mut notes) = each_runtime(&registry.addr, |daemon| bench(daemon, sizes, &image));
    let crictl = crictl_side_by_side(&registry.addr, &image, stats_containers);
    drop(registry);

    println!();
    println!(
        "{:<14} | {:>18} | {:>17} | {:>17} | {:>19} | {:>25} | {:>23}",
        "runtime",
        "create mean/p99 ms",
        "start mean/p99 ms",
        "stop mean/p99 ms",
        "remove mean/p99 ms",
        format!("shim RSS per pod ({density_pods} pods)"),
        format!("daemon RSS ({density_pods} pods)"),
    );
    for (name, f) in &results {
        println!(
            "{:<14} | {:>18} | {:>17} | {:>17} | {:>19} | {:>21.1} MiB | {:>19.1} MiB",
            name,
            mean_p99(f.samples.create.clone()),
            mean_p99(f.samples.start.clone()),
            mean_p99(f.samples.stop.clone()),
            mean_p99(f.samples.remove.clone()),
            f.shim_rss_kib / 1024.0,
            f.daemon_rss_kib as f64 / 1024.0,
        );
        println!(
            "{:<14}   (shim: {:.1} process(es) per pod, pause and sleep not counted)",
            "", f.shim_procs_per_pod,
        );
        println!(
            "{:<14}   density: {density_pods} pods with one container each running {:.1} s after they were asked for \
             at once; runtime memory {:.1} MiB (daemon {:.1} + shims {:.1})",
            "",
            f.density_start.as_secs_f64(),
            (f.daemon_rss_kib + f.shims_rss_kib) as f64 / 1024.0,
            f.daemon_rss_kib as f64 / 1024.0,
            f.shims_rss_kib as f64 / 1024.0,
        );
        println!(
            "{:<14}   memory the node cannot reclaim: anonymous {:.1} MiB (daemon {:.1} + shims {:.1}); \
             PSS {:.1} MiB (daemon {:.1} + shims {:.1})",
            "",
            (f.daemon_anon_kib + f.shims_anon_kib) as f64 / 1024.0,
            f.daemon_anon_kib as f64 / 1024.0,
            f.shims_anon_kib as f64 / 1024.0,
            (f.daemon_pss_kib + f.shims_pss_kib) as f64 / 1024.0,
            f.daemon_pss_kib as f64 / 1024.0,
            f.shims_pss_kib as f64 / 1024.0,
        );
        println!(
            "{:<14}   {stats_containers} running containers: ListContainers mean/p99 {} ms, ListPodSandbox mean/p99 {} ms",
            "",
            mean_p99(f.list_containers.clone()),
            mean_p99(f.list_pods.clone()),
        );
        println!(
            "{:<14}   {list_objects} created containers: ListContainers mean/p99 {} ms; {list_objects} stopped pods \
             (and the running one holding those containers): ListPodSandbox mean/p99 {} ms",
            "",
            mean_p99(f.list_containers_at_scale.clone()),
            mean_p99(f.list_pods_at_scale.clone()),
        );
        println!(
            "{:<14}   {stats_containers} running containers: ListContainerStats mean/p99 {} ms, \
             ListPodSandboxStats mean/p99 {} ({STATS_CALLS} calls each)",
            "",
            mean_p99(f.list_container_stats.clone()),
            f.list_pod_stats
                .as_ref()
                .map(|s| format!("{} ms", mean_p99(s.clone())))
                .unwrap_or_else(|e| format!("n/a: {e}")),
        );
    }
    let row = |parts: fn(&Samples) -> Vec<&Vec<Duration>>| -> Vec<(String, Duration)> {
        results
            .iter()
            .map(|(n, f)| (n.clone(), parts(&f.samples).into_iter().map(|p| mean(p)).sum()))
            .collect()
    };
    print_ratios(
        "CreateContainer + StartContainer means",
        &row(|s| vec![&s.create, &s.start]),
    );
    print_ratios(
        "StopContainer + RemoveContainer means",
        &row(|s| vec![&s.stop, &s.remove]),
    );
    print_ratios(
        "container cycle (create + start + stop + remove means)",
        &row(|s| vec![&s.create, &s.start, &s.stop, &s.remove]),
    );
    print_ratios(
        &format!("ListContainers mean, {list_objects} created containers"),
        &results
            .iter()
            .map(|(n, f)| (n.clone(), mean(&f.list_containers_at_scale)))
            .collect::<Vec<_>>(),
    );
    match crictl {
        Some((times, left)) => {
            notes.extend(left);
            println!(
                "`crictl ps -a` over {stats_containers} running containers, every runtime up at once and crictl run \
                 against each in turn ({CRICTL_ROUNDS} rounds), medians: whole command, `crictl version`, the net"
            );
            let ms = |d: Duration| d.as_secs_f64() * 1e3;
            let best = times.iter().skip(1).map(|(_, t)| t.ps).min();
            let best_net = times.iter().skip(1).map(|(_, t)| t.ps.saturating_sub(t.version)).min();
            for (name, t) in &times {
                println!(
                    "  {name:<14} {:.2} ms, {:.2} ms, {:.2} ms",
                    ms(t.ps),
                    ms(t.version),
                    ms(t.ps.saturating_sub(t.version))
                );
            }
            if let (Some(best), Some(best_net), Some((_, scute))) = (best, best_net, times.first()) {
                println!(
                    "  scute against the better: {:.2}x the whole command, {:.2}x net",
                    ms(scute.ps) / ms(best),
                    ms(scute.ps.saturating_sub(scute.version)) / ms(best_net)
                );
            }
        }
        None => println!("`crictl ps -a`: no crictl (SCUTE_TEST_TOOLS or PATH)"),
    }
    println!(
        "(target: StartContainer <= 15 ms; p99 of {cycles} samples is their maximum when fewer than 100; RSS = VmRSS)"
    );
    for note in &notes {
        println!("note: {note}");
    }
}
