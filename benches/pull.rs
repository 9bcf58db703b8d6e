//! Image pull benchmark: wall-clock PullImage (download + verify + unpack) of a generated
//! multi-layer image from a local registry, with the daemon's peak RSS, printed side by side with
//! containerd's CRI plugin when `containerd` is on PATH.
//!
//!   cargo bench --bench pull          (SCUTE_BENCH_PULLS=N repeated pulls, default 3;
//!                                      SCUTE_BENCH_PULL_COMPRESSIONS=gzip,zstd the variants)
//!
//! The image (LAYERS layers of FILES pseudo-random files, LAYER_SIZE bytes a layer: about 200 MB,
//! issue 21's image) is built with the image kit once per compression and cached under
//! target/bench-images/<parameters>/. Each runtime gets a fresh daemon per variant: the first pull
//! is cold, then RemoveImage + PullImage N times. Figures are printed, never asserted.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use scute::api::image_service_client::ImageServiceClient;
use scute::api::{ImageFsInfoRequest, ImageSpec, PullImageRequest, RemoveImageRequest};

const LAYERS: u32 = 10;
const FILES_PER_LAYER: u32 = 4;
const LAYER_SIZE: &str = "20M";
const REPO: &str = "bench/multilayer";
/// Bumped when the way the image is built changes, so stale caches are not reused.
const CACHE_VERSION: u32 = 2;
const PULL_TIMEOUT: Duration = Duration::from_secs(600);
/// How long after the last pull the daemon's RSS is read again.
const SETTLE: Duration = Duration::from_secs(10);

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| if p.is_absolute() { p } else { repo_root().join(p) })
        .unwrap_or_else(|| repo_root().join("target"))
}

// ---------------------------------------------------------------------------------------------
// The image

/// Builds scute-imagekit (release: gzip in a debug build is slow) and returns its path.
fn imagekit() -> PathBuf {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "--release", "-p", "scute-imagekit"])
        .current_dir(repo_root())
        .status()
        .expect("run cargo build -p scute-imagekit");
    assert!(status.success(), "building scute-imagekit failed");
    target_dir().join("release/scute-imagekit")
}

fn kit(kit: &Path, args: &[&str]) -> String {
    let out = Command::new(kit).args(args).output().expect("run scute-imagekit");
    assert!(
        out.status.success(),
        "scute-imagekit {args:?} failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The OCI layout of the benchmark image, generated on first use and cached by its parameters.
fn image_layout(kit_bin: &Path, compression: &str) -> PathBuf {
    let key = format!("multilayer-v{CACHE_VERSION}-{LAYERS}x{FILES_PER_LAYER}files-{LAYER_SIZE}-{compression}");
    let cache_root = target_dir().join("bench-images");
    let layout = cache_root.join(&key);
    if layout.join(".complete").is_file() {
        println!("image: cached layout {}", layout.display());
        return layout;
    }
    std::fs::create_dir_all(&cache_root).unwrap();
    // Generated in a temp dir next to the cache (same filesystem), renamed into place when done:
    // an interrupted run leaves no half-built layout behind.
    let work = tempfile::Builder::new()
        .prefix(".tmp-")
        .tempdir_in(&cache_root)
        .unwrap();
    let started = Instant::now();
    let mut args: Vec<String> = vec!["build".into()];
    for i in 0..LAYERS {
        let rootfs = work.path().join(format!("rootfs-{i}"));
        kit(
            kit_bin,
            &[
                "gen-rootfs",
                "--out",
                rootfs.to_str().unwrap(),
                "--files",
                &FILES_PER_LAYER.to_string(),
                "--size",
                LAYER_SIZE,
                "--seed",
                &i.to_string(),
            ],
        );
        args.extend(["--rootfs".into(), rootfs.to_str().unwrap().to_string()]);
    }
    let built = work.path().join("layout");
    args.extend([
        "--out".into(),
        built.to_str().unwrap().to_string(),
        "--compression".into(),
        compression.into(),
        "--label".into(),
        format!("bench.image={key}"),
    ]);
    kit(kit_bin, &args.iter().map(String::as_str).collect::<Vec<_>>());
    std::fs::write(built.join(".complete"), "").unwrap();
    if layout.exists() {
        std::fs::remove_dir_all(&layout).unwrap();
    }
    std::fs::rename(&built, &layout).unwrap();
    println!(
        "image: generated {} in {:.1} s",
        layout.display(),
        started.elapsed().as_secs_f64()
    );
    layout
}

/// (layer count, compressed layer bytes) from the layout's single manifest.
fn layer_sizes(layout: &Path) -> (usize, u64) {
    let read_json = |p: PathBuf| -> serde_json::Value {
        serde_json::from_slice(&std::fs::read(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))).unwrap()
    };
    let blob = |digest: &str| layout.join("blobs").join(digest.replacen(':', "/", 1));
    let index = read_json(layout.join("index.json"));
    let manifest = read_json(blob(index["manifests"][0]["digest"].as_str().unwrap()));
    let layers = manifest["layers"].as_array().unwrap();
    (layers.len(), layers.iter().map(|l| l["size"].as_u64().unwrap()).sum())
}

// ---------------------------------------------------------------------------------------------
// Processes, each stopped (and its temp dir removed) on drop, also when the benchmark panics.

/// A local registry from hack/registry.sh.
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
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = Command::new(repo_root().join("hack/registry.sh"))
            .args(["stop", "--dir"])
            .arg(self.dir.path())
            .output();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A daemon (scute or containerd) in its own temp dir.
struct Subject {
    name: &'static str,
    child: Option<Child>,
    socket: PathBuf,
    /// What the daemon stores images under (measured after RemoveImage).
    root: PathBuf,
    log: PathBuf,
    dir: tempfile::TempDir,
}

impl Subject {
    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    fn log_tail(&self) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            if let Ok(Some(status)) = self.child.as_mut().unwrap().try_wait() {
                panic!("{} exited during start ({status}):\n{}", self.name, self.log_tail());
            }
            assert!(
                Instant::now() < deadline,
                "{} did not open {} in time:\n{}",
                self.name,
                self.socket.display(),
                self.log_tail()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// SIGTERM, then SIGKILL after 15 s.
    fn stop(&mut self) {
        let Some(mut child) = self.child.take() else { return };
        let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            if let Ok(Some(_)) = child.try_wait() {
                break;
            }
            if Instant::now() > deadline {
                eprintln!("{} ignored SIGTERM for 15 s: killing it", self.name);
                let _ = child.kill();
                let _ = child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        unmount_under(self.dir.path());
    }
}

impl Drop for Subject {
    fn drop(&mut self) {
        self.stop();
        // `dir` (a TempDir) is removed after this, with nothing mounted under it any more.
    }
}

/// Mount points at or under `dir` (from /proc/self/mountinfo), deepest first.
fn mounts_under(dir: &Path) -> Vec<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut found: Vec<PathBuf> = mountinfo
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
        .filter(|p| p.starts_with(dir))
        .collect();
    found.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    found
}

fn unmount_under(dir: &Path) {
    for mount in mounts_under(dir) {
        eprintln!("unmounting leftover {}", mount.display());
        if let Err(e) = nix::mount::umount2(&mount, nix::mount::MntFlags::MNT_DETACH) {
            eprintln!("umount {}: {e}", mount.display());
        }
    }
}

fn start_scute() -> Subject {
    let dir = tempfile::Builder::new().prefix("scute-bench-pull-").tempdir().unwrap();
    let root = dir.path().join("root");
    let state = dir.path().join("state");
    let socket = state.join("scute.sock");
    let certs = dir.path().join("certs.d");
    let net = dir.path().join("net.d");
    std::fs::create_dir_all(&certs).unwrap();
    std::fs::create_dir_all(&net).unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "root = {root:?}\nstate = {state:?}\n[grpc]\naddress = {socket:?}\n[cni]\nconf_dir = {net:?}\n[registry]\nconfig_path = {certs:?}\n"
        ),
    )
    .unwrap();
    let log = dir.path().join("scute.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_scute"))
        .args(["serve", "--log-level", "warn", "--config"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start scute");
    let mut subject = Subject {
        name: "scute",
        child: Some(child),
        socket,
        root,
        log,
        dir,
    };
    subject.wait_ready();
    subject
}

/// containerd with its CRI plugin, in temp dirs, sending `registry` to plain HTTP via hosts.toml.
fn start_containerd(bin: &Path, registry: &str) -> Subject {
    let dir = tempfile::Builder::new()
        .prefix("containerd-bench-pull-")
        .tempdir()
        .unwrap();
    let root = dir.path().join("root");
    let state = dir.path().join("state");
    let socket = dir.path().join("containerd.sock");
    let certs = dir.path().join("certs.d");
    let net = dir.path().join("net.d");
    std::fs::create_dir_all(certs.join(registry)).unwrap();
    std::fs::create_dir_all(&net).unwrap();
    std::fs::write(
        certs.join(registry).join("hosts.toml"),
        format!(
            "server = \"http://{registry}\"\n\n[host.\"http://{registry}\"]\n  capabilities = [\"pull\", \"resolve\"]\n  skip_verify = true\n"
        ),
    )
    .unwrap();
    let config = dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            r#"version = 2
root = {root:?}
state = {state:?}
# Nothing here needs these; "opt" would otherwise install into /opt/containerd.
disabled_plugins = [
  "io.containerd.internal.v1.opt",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.tracing.processor.v1.otlp",
  "io.containerd.internal.v1.tracing",
]

[grpc]
  address = {socket:?}

[plugins."io.containerd.grpc.v1.cri".cni]
  conf_dir = {net:?}

[plugins."io.containerd.grpc.v1.cri".registry]
  config_path = {certs:?}
"#
        ),
    )
    .unwrap();
    let log = dir.path().join("containerd.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(bin)
        .arg("--config")
        .arg(&config)
        .args(["--log-level", "warn"])
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start containerd");
    let mut subject = Subject {
        name: "containerd",
        child: Some(child),
        socket,
        root,
        log,
        dir,
    };
    subject.wait_ready();
    subject
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(name))
            .find(|p| p.is_file())
    })
}

// ---------------------------------------------------------------------------------------------
// Measuring

fn proc_status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim_start_matches(':').split_whitespace().next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// Bytes of regular files under `dir` (not following symlinks).
fn disk_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    entries
        .flatten()
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => disk_bytes(&e.path()),
            Ok(t) if t.is_file() => e.metadata().map(|m| m.len()).unwrap_or(0),
            _ => 0,
        })
        .sum()
}

struct Figures {
    first: Duration,
    repeated: Vec<Duration>,
    idle_rss_kib: u64,
    peak_rss_kib: u64,
    settled_rss_kib: u64,
    on_disk_pulled: u64,
    on_disk_removed: u64,
}

fn spec(image: &str) -> Option<ImageSpec> {
    Some(ImageSpec {
        image: image.to_string(),
        ..Default::default()
    })
}

/// `measure` on a client runtime of its own, dropped before the daemon is, so that connections
/// close and the daemon's shutdown is prompt.
fn measure_on(subject: &Subject, image: &str, repeats: usize) -> Figures {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(measure(subject, image, repeats))
}

async fn measure(subject: &Subject, image: &str, repeats: usize) -> Figures {
    let channel = scute::client::connect(&subject.socket).await.expect("connect");
    let mut client = ImageServiceClient::new(channel);
    // containerd's CRI plugin initializes after its socket opens: wait until it answers.
    let deadline = Instant::now() + Duration::from_secs(30);
    while let Err(e) = client.image_fs_info(ImageFsInfoRequest {}).await {
        assert!(
            Instant::now() < deadline,
            "{} ImageService not ready: {e}\n{}",
            subject.name,
            subject.log_tail()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let idle_rss_kib = proc_status_kib(subject.pid(), "VmRSS");

    let mut times = Vec::with_capacity(repeats + 1);
    let mut on_disk_pulled = 0;
    let mut on_disk_removed = 0;
    let mut image_id: Option<String> = None;
    for run in 0..=repeats {
        if run > 0 {
            let id = image_id.take().unwrap_or_else(|| image.to_string());
            client
                .remove_image(RemoveImageRequest { image: spec(&id) })
                .await
                .unwrap_or_else(|e| panic!("{} RemoveImage: {e}\n{}", subject.name, subject.log_tail()));
            on_disk_removed = disk_bytes(&subject.root);
        }
        let started = Instant::now();
        let pulled = tokio::time::timeout(
            PULL_TIMEOUT,
            client.pull_image(PullImageRequest {
                image: spec(image),
                ..Default::default()
            }),
        )
        .await
        .unwrap_or_else(|_| panic!("{} PullImage took over {PULL_TIMEOUT:?}", subject.name))
        .unwrap_or_else(|e| panic!("{} PullImage: {e}\n{}", subject.name, subject.log_tail()));
        let took = started.elapsed();
        times.push(took);
        image_id = Some(pulled.into_inner().image_ref);
        if run == 0 {
            on_disk_pulled = disk_bytes(&subject.root);
        }
        println!(
            "  {:<10} pull {}: {:.3} s{}",
            subject.name,
            run + 1,
            took.as_secs_f64(),
            if run == 0 { " (cold)" } else { "" }
        );
    }
    // Peak RSS over the daemon's whole life so far: start, idle, every pull and removal.
    let peak_rss_kib = proc_status_kib(subject.pid(), "VmHWM");
    // What it keeps once the pulls are over (issue 21's goal: 16 MiB within 10 s).
    tokio::time::sleep(SETTLE).await;
    let settled_rss_kib = proc_status_kib(subject.pid(), "VmRSS");
    let first = times.remove(0);
    Figures {
        first,
        repeated: times,
        idle_rss_kib,
        peak_rss_kib,
        settled_rss_kib,
        on_disk_pulled,
        on_disk_removed,
    }
}

fn mb(bytes: u64) -> f64 {
    bytes as f64 / 1e6
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing: run quickly then.
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let repeats: usize = std::env::var("SCUTE_BENCH_PULLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench_mode { 3 } else { 1 })
        .max(1);
    let compressions: Vec<String> = std::env::var("SCUTE_BENCH_PULL_COMPRESSIONS")
        .unwrap_or_else(|_| if bench_mode { "gzip,zstd" } else { "gzip" }.into())
        .split(',')
        .map(|c| c.trim().to_string())
        .filter(|c| !c.is_empty())
        .collect();

    let kit_bin = imagekit();
    let registry = Registry::start();
    let containerd = which("containerd");
    if containerd.is_none() {
        println!("(containerd not on PATH: scute figures only)");
    }

    // (image variant, runtime, compressed MB, figures)
    let mut results: Vec<(String, &'static str, u64, Figures)> = Vec::new();
    for compression in &compressions {
        let layout = image_layout(&kit_bin, compression);
        let (layer_count, compressed) = layer_sizes(&layout);
        let image = format!("{}/{REPO}:{compression}", registry.addr);
        kit(
            &kit_bin,
            &[
                "push",
                "--layout",
                layout.to_str().unwrap(),
                "--to",
                &image,
                "--plain-http",
            ],
        );
        println!(
            "image: {image}: {layer_count} {compression} layers, {:.1} MB compressed; 1 cold pull + {repeats} × (RemoveImage, PullImage) per runtime, each on a fresh daemon",
            mb(compressed)
        );
        {
            let subject = start_scute();
            let figures = measure_on(&subject, &image, repeats);
            results.push((compression.clone(), subject.name, compressed, figures));
        }
        if let Some(bin) = &containerd {
            let mut subject = start_containerd(bin, &registry.addr);
            let figures = measure_on(&subject, &image, repeats);
            results.push((compression.clone(), subject.name, compressed, figures));
            subject.stop();
            let left = mounts_under(subject.dir.path());
            if !left.is_empty() {
                println!("note: containerd left mounts under its temp dir (unmounted): {left:?}");
            }
        }
    }
    drop(registry);

    println!();
    println!(
        "{:<6} {:<11} {:>9} {:>8} {:>9} {:>10} {:>10} {:>10} {:>10} {:>11} {:>11} {:>13}",
        "format",
        "runtime",
        "first s",
        "best s",
        "median s",
        "MB/s first",
        "MB/s best",
        "peak RSS",
        "idle RSS",
        "RSS +10 s",
        "disk pulled",
        "disk after rm"
    );
    for (compression, name, compressed, f) in &results {
        let mut sorted = f.repeated.clone();
        sorted.sort();
        let best = sorted[0];
        let median = sorted[sorted.len() / 2];
        println!(
            "{:<6} {:<11} {:>9.3} {:>8.3} {:>9.3} {:>10.1} {:>10.1} {:>6.1} MiB {:>6.1} MiB {:>7.1} MiB {:>8.1} MB {:>10.1} MB",
            compression,
            name,
            f.first.as_secs_f64(),
            best.as_secs_f64(),
            median.as_secs_f64(),
            mb(*compressed) / f.first.as_secs_f64(),
            mb(*compressed) / best.as_secs_f64(),
            f.peak_rss_kib as f64 / 1024.0,
            f.idle_rss_kib as f64 / 1024.0,
            f.settled_rss_kib as f64 / 1024.0,
            mb(f.on_disk_pulled),
            mb(f.on_disk_removed),
        );
    }
    println!(
        "(first = the cold pull on a fresh daemon; best/median over the {repeats} pulls after RemoveImage; MB/s = compressed MB / wall s; \
         peak RSS = VmHWM over the daemon's life; RSS +10 s = VmRSS 10 s after the last pull; disk = regular-file bytes under the \
         daemon's root after the cold pull / after the last RemoveImage)"
    );
}
