//! Pod sandbox benchmark: latency of RunPodSandbox, StopPodSandbox and RemovePodSandbox over N
//! sequential cycles, the per-pod shim RSS and the daemon's RSS with 10 pods running, printed side
//! by side with containerd's CRI plugin (runc) when `containerd` and `runc` are on PATH.
//!
//!   cargo bench --bench sandbox          (SCUTE_BENCH_PODS=N cycles, default 50; 3 without --bench)
//!
//! Each runtime gets a fresh daemon in temp dirs with a CNI bridge network of its own (unique
//! bridge name and subnet; bridge + host-local + portmap from /usr/lib/cni). scute runs its
//! embedded pause image; containerd gets this repo's static pause from a local registry
//! (hack/registry.sh + images/build.sh), pulled through CRI before anything is timed. Figures are
//! printed, never asserted. Everything started is stopped and removed on drop, also on a panic:
//! daemons, leftover shims and pause processes, mounts, pinned netns, the bridges.

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

/// Pods running at once while RSS is read.
const RSS_PODS: usize = 10;
// Daemon, registry and host-state helpers shared with the other CRI benchmarks.
include!("common/harness.rs");

fn pod_config(name: &str) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}-{}", std::process::id()),
            namespace: "bench".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        labels: [("app".to_string(), name.to_string())].into(),
        dns_config: Some(api::DnsConfig {
            servers: vec!["10.96.0.10".into()],
            searches: vec!["bench.svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        }),
        ..Default::default()
    }
}

struct Client<'a> {
    daemon: &'a Daemon,
    rt: RuntimeServiceClient<Channel>,
}

impl Client<'_> {
    async fn run(&mut self, name: &str) -> (String, Duration) {
        let mut rt = self.rt.clone();
        let (r, took) = self
            .daemon
            .timed(
                "RunPodSandbox",
                rt.run_pod_sandbox(api::RunPodSandboxRequest {
                    config: Some(pod_config(name)),
                    runtime_handler: String::new(),
                }),
            )
            .await;
        let id = r.into_inner().pod_sandbox_id;
        self.daemon.created.borrow_mut().push(id.clone());
        (id, took)
    }

    async fn stop(&mut self, id: &str) -> Duration {
        let mut rt = self.rt.clone();
        let req = api::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.daemon.timed("StopPodSandbox", rt.stop_pod_sandbox(req)).await.1
    }

    async fn remove(&mut self, id: &str) -> Duration {
        let mut rt = self.rt.clone();
        let req = api::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        };
        self.daemon
            .timed("RemovePodSandbox", rt.remove_pod_sandbox(req))
            .await
            .1
    }
}

#[derive(Default)]
struct Samples {
    run: Vec<Duration>,
    stop: Vec<Duration>,
    remove: Vec<Duration>,
}

struct Figures {
    samples: Samples,
    shim_rss_kib: f64,
    shim_pss_kib: f64,
    shim_procs_per_pod: f64,
    daemon_rss_kib: u64,
    daemon_idle_rss_kib: u64,
}

async fn measure(daemon: &Daemon, cycles: usize, prepull: Option<&str>) -> Figures {
    let channel = scute::client::connect(&daemon.socket).await.expect("connect");
    let mut client = Client {
        daemon,
        rt: RuntimeServiceClient::new(channel.clone()),
    };
    client.daemon.wait_ready(&mut client.rt).await;
    if let Some(image) = prepull {
        let mut images = ImageServiceClient::new(channel.clone());
        let (_, took) = client
            .daemon
            .timed(
                "PullImage",
                images.pull_image(api::PullImageRequest {
                    image: Some(api::ImageSpec {
                        image: image.into(),
                        ..Default::default()
                    }),
                    ..Default::default()
                }),
            )
            .await;
        println!(
            "  {:<10} pre-pulled {image} in {:.0} ms",
            daemon.name(),
            took.as_secs_f64() * 1e3
        );
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let daemon_idle_rss_kib = proc_kib(daemon.pid(), "status", "VmRSS");

    // One untimed cycle: first-use work (cgroup parents, the sandbox image's first snapshot).
    let (id, warm_run) = client.run("bench-warmup").await;
    let warm_stop = client.stop(&id).await;
    let warm_remove = client.remove(&id).await;
    println!(
        "  {:<10} warm-up cycle (untimed): run {:.1} ms, stop {:.1} ms, remove {:.1} ms",
        daemon.name(),
        warm_run.as_secs_f64() * 1e3,
        warm_stop.as_secs_f64() * 1e3,
        warm_remove.as_secs_f64() * 1e3
    );

    let mut samples = Samples::default();
    let started = Instant::now();
    for i in 0..cycles {
        let (id, run) = client.run(&format!("bench-cycle-{i}")).await;
        samples.run.push(run);
        samples.stop.push(client.stop(&id).await);
        samples.remove.push(client.remove(&id).await);
    }
    println!(
        "  {:<10} {cycles} cycles in {:.1} s",
        daemon.name(),
        started.elapsed().as_secs_f64()
    );

    // RSS with RSS_PODS pods running.
    let mut ids = Vec::new();
    for i in 0..RSS_PODS {
        ids.push(client.run(&format!("bench-rss-{i}")).await.0);
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut rss, mut pss, mut procs) = (0u64, 0u64, 0usize);
    for id in &ids {
        let pids = shim_pids(daemon, id);
        if pids.is_empty() {
            client.daemon.fail(
                "RSS",
                format!("no {} process found for sandbox {id}", daemon.shim_name()),
            );
        }
        procs += pids.len();
        for pid in pids {
            rss += proc_kib(pid, "status", "VmRSS");
            pss += proc_kib(pid, "smaps_rollup", "Pss");
        }
    }
    let daemon_rss_kib = proc_kib(daemon.pid(), "status", "VmRSS");
    for id in &ids {
        client.stop(id).await;
        client.remove(id).await;
    }
    Figures {
        samples,
        shim_rss_kib: rss as f64 / RSS_PODS as f64,
        shim_pss_kib: pss as f64 / RSS_PODS as f64,
        shim_procs_per_pod: procs as f64 / RSS_PODS as f64,
        daemon_rss_kib,
        daemon_idle_rss_kib,
    }
}

/// Runs `f` against a daemon on a client runtime of its own, dropped (closing the connections)
/// before the daemon is shut down.
fn bench(daemon: &mut Daemon, cycles: usize, prepull: Option<&str>) -> (Figures, Vec<String>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let figures = runtime.block_on(measure(daemon, cycles, prepull));
    drop(runtime);
    let notes = daemon.shutdown();
    (figures, notes)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing: run quickly then.
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let cycles: usize = std::env::var("SCUTE_BENCH_PODS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench_mode { 50 } else { 3 })
        .max(1);
    ensure_shim_built();
    println!(
        "sandbox benchmark: {cycles} sequential RunPodSandbox -> StopPodSandbox -> RemovePodSandbox cycles \
         (CNI bridge + host-local + portmap), then {RSS_PODS} pods at once for RSS"
    );

    let registry = Registry::start();
    registry.push_test_images();
    let pause = format!("{}/pause:3.10", registry.addr);
    // scute's pause is built in; containerd's is pulled once, untimed.
    let (results, notes) = each_runtime(&registry.addr, |daemon| {
        let prepull = (daemon.kind == Kind::Containerd).then_some(pause.as_str());
        bench(daemon, cycles, prepull)
    });
    drop(registry);

    println!();
    println!(
        "{:<14} | {:>17} | {:>17} | {:>19} | {:>16} | {:>23}",
        "runtime",
        "run mean/p99 ms",
        "stop mean/p99 ms",
        "remove mean/p99 ms",
        "shim RSS per pod",
        "daemon RSS with 10 pods"
    );
    for (name, f) in &results {
        println!(
            "{:<14} | {:>17} | {:>17} | {:>19} | {:>12.1} MiB | {:>19.1} MiB",
            name,
            mean_p99(f.samples.run.clone()),
            mean_p99(f.samples.stop.clone()),
            mean_p99(f.samples.remove.clone()),
            f.shim_rss_kib / 1024.0,
            f.daemon_rss_kib as f64 / 1024.0,
        );
        println!(
            "{:<14}   (shim: {:.1} process(es) per pod, PSS {:.1} MiB per pod; daemon idle RSS before the pods {:.1} MiB)",
            "",
            f.shim_procs_per_pod,
            f.shim_pss_kib / 1024.0,
            f.daemon_idle_rss_kib as f64 / 1024.0,
        );
    }
    println!("(p99 of {cycles} samples is their maximum when fewer than 100; RSS = VmRSS, PSS from smaps_rollup)");
    let row = |parts: fn(&Samples) -> Vec<&Vec<Duration>>| -> Vec<(String, Duration)> {
        results
            .iter()
            .map(|(n, f)| (n.clone(), parts(&f.samples).into_iter().map(|p| mean(p)).sum()))
            .collect()
    };
    print_ratios("RunPodSandbox mean", &row(|s| vec![&s.run]));
    print_ratios(
        "StopPodSandbox + RemovePodSandbox means",
        &row(|s| vec![&s.stop, &s.remove]),
    );
    print_ratios(
        "pod cycle (run + stop + remove means)",
        &row(|s| vec![&s.run, &s.stop, &s.remove]),
    );
    for note in &notes {
        println!("note: {note}");
    }
}
