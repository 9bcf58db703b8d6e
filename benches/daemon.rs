//! Daemon benchmark: idle RSS and Version/Status round-trip latency over the CRI socket,
//! printed side by side with containerd's CRI plugin when `containerd` is on PATH.
//!
//!   cargo bench --bench daemon            (SCUTE_BENCH_CALLS=N to change the call count)
//!
//! Figures are printed, never asserted: speed targets are judged by reading them.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use scute::api::runtime_service_client::RuntimeServiceClient;
use scute::api::{StatusRequest, VersionRequest};

include!("common/anchors.rs");

struct Subject {
    name: String,
    child: Child,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Subject {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_scute() -> Subject {
    let dir = tempfile::Builder::new().prefix("scute-bench-").tempdir().unwrap();
    let socket = dir.path().join("state/scute.sock");
    let child = Command::new(env!("CARGO_BIN_EXE_scute"))
        .args(["serve", "--log-level", "warn"])
        .arg("--root")
        .arg(dir.path().join("root"))
        .arg("--state")
        .arg(dir.path().join("state"))
        .arg("--address")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start scute");
    wait_socket(&socket);
    Subject {
        name: "scute".into(),
        child,
        socket,
        _dir: dir,
    }
}

/// An anchor (anchors.rs) in temp dirs, its CRI plugin with no network or registry config.
fn start_containerd(anchor: &Anchor) -> Option<Subject> {
    let dir = tempfile::Builder::new().prefix("containerd-bench-").tempdir().unwrap();
    let socket = dir.path().join("containerd.sock");
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        containerd_config(anchor, dir.path(), &socket, &CriSettings::default()),
    )
    .unwrap();
    let child = Command::new(&anchor.bin)
        .arg("--config")
        .arg(&config)
        .arg("--log-level")
        .arg("warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    wait_socket(&socket);
    Some(Subject {
        name: anchor.label.clone(),
        child,
        socket,
        _dir: dir,
    })
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

fn wait_socket(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while std::os::unix::net::UnixStream::connect(socket).is_err() {
        assert!(Instant::now() < deadline, "{} did not appear", socket.display());
        std::thread::sleep(Duration::from_millis(20));
    }
}

impl std::fmt::Display for Memory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(&format!("{}/{}/{}", self.rss, self.anon, self.pss))
    }
}

struct Latency {
    p50: Duration,
    p99: Duration,
    mean: Duration,
}

fn summarize(mut samples: Vec<Duration>) -> Latency {
    samples.sort();
    let pick = |q: f64| samples[((samples.len() as f64 - 1.0) * q).round() as usize];
    let total: Duration = samples.iter().sum();
    Latency {
        p50: pick(0.50),
        p99: pick(0.99),
        mean: total / samples.len() as u32,
    }
}

struct Figures {
    idle: Memory,
    after: Memory,
    version: Latency,
    status: Latency,
}

async fn measure(subject: &Subject, calls: usize) -> Figures {
    // Let the daemon settle before reading its idle memory.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let idle = memory(subject.child.id());
    let channel = scute::client::connect(&subject.socket).await.expect("connect");
    let mut client = RuntimeServiceClient::new(channel);
    for _ in 0..50 {
        client.version(VersionRequest::default()).await.unwrap();
    }
    let mut version = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        client.version(VersionRequest::default()).await.unwrap();
        version.push(t.elapsed());
    }
    let mut status = Vec::with_capacity(calls);
    for _ in 0..calls {
        let t = Instant::now();
        client.status(StatusRequest { verbose: false }).await.unwrap();
        status.push(t.elapsed());
    }
    Figures {
        idle,
        after: memory(subject.child.id()),
        version: summarize(version),
        status: summarize(status),
    }
}

fn micros(d: Duration) -> String {
    format!("{:.1} µs", d.as_secs_f64() * 1e6)
}

fn main() {
    // A current-thread client measures the daemon, not cross-thread wakeups in the client. The
    // runtime is dropped before the daemons so their connections close and shutdown is prompt.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing: run quickly then.
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let calls: usize = std::env::var("SCUTE_BENCH_CALLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench_mode { 2000 } else { 20 });

    let mut subjects = vec![start_scute()];
    subjects.extend(anchors().iter().filter_map(start_containerd));
    println!("daemon benchmark: {calls} sequential calls per RPC over one connection");
    println!("(memory: RSS/anonymous/PSS in KiB, from /proc/PID/smaps_rollup)");
    println!(
        "{:<14} {:>20} {:>20} {:>12} {:>12} {:>12} {:>12} {:>12}",
        "runtime",
        "idle memory",
        "memory after",
        "Version p50",
        "Version p99",
        "Version mean",
        "Status p50",
        "Status p99"
    );
    for subject in &subjects {
        let f = runtime.block_on(measure(subject, calls));
        println!(
            "{:<14} {:>20} {:>20} {:>12} {:>12} {:>12} {:>12} {:>12}",
            subject.name,
            f.idle,
            f.after,
            micros(f.version.p50),
            micros(f.version.p99),
            micros(f.version.mean),
            micros(f.status.p50),
            micros(f.status.p99),
        );
    }
    drop(runtime);
    drop(subjects);
}
