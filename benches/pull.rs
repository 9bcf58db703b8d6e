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

/// A generated image: `layers` layers of `files` pseudo-random files, `layer_size` a layer.
struct Shape {
    /// The row's name, and the repository's.
    name: &'static str,
    layers: u32,
    files: u32,
    layer_size: &'static str,
}

/// Issue 21's image: about 200 MB, what a large application image is.
const LARGE: Shape = Shape {
    name: "200MB",
    layers: 10,
    files: 4,
    layer_size: "20M",
};
/// About 1 MB in one layer, as most images a node pulls are small (busybox, pause, agnhost's
/// base): here a pull's fixed costs, not its bytes, set the time.
const SMALL: Shape = Shape {
    name: "1MB",
    layers: 1,
    files: 4,
    layer_size: "1M",
};
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
fn image_layout(kit_bin: &Path, shape: &Shape, compression: &str) -> PathBuf {
    let key = format!(
        "multilayer-v{CACHE_VERSION}-{}x{}files-{}-{compression}",
        shape.layers, shape.files, shape.layer_size
    );
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
    for i in 0..shape.layers {
        let rootfs = work.path().join(format!("rootfs-{i}"));
        kit(
            kit_bin,
            &[
                "gen-rootfs",
                "--out",
                rootfs.to_str().unwrap(),
                "--files",
                &shape.files.to_string(),
                "--size",
                shape.layer_size,
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

include!("common/anchors.rs");

/// A daemon (scute or containerd) in its own temp dir.
struct Subject {
    name: String,
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

/// scute with its defaults, or keeping every layer blob (`[image] discard_unpacked_layers =
/// false`): the second row shows what writing each layer twice costs.
fn start_scute(keep_blobs: bool) -> Subject {
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
            "root = {root:?}\nstate = {state:?}\n[grpc]\naddress = {socket:?}\n[cni]\nconf_dir = {net:?}\n[registry]\nconfig_path = {certs:?}\n[image]\ndiscard_unpacked_layers = {}\n",
            !keep_blobs
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
        name: if keep_blobs { "scute (blobs)" } else { "scute" }.into(),
        child: Some(child),
        socket,
        root,
        log,
        dir,
    };
    subject.wait_ready();
    subject
}

/// An anchor (anchors.rs) with its CRI plugin, in temp dirs, sending `registry` to plain HTTP via
/// hosts.toml.
fn start_containerd(anchor: &Anchor, registry: &str) -> Subject {
    let dir = tempfile::Builder::new()
        .prefix("containerd-bench-pull-")
        .tempdir()
        .unwrap();
    let root = dir.path().join("root");
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
    let cri = CriSettings {
        net: Some(&net),
        certs: Some(&certs),
        pause: None,
    };
    std::fs::write(&config, containerd_config(anchor, dir.path(), &socket, &cri)).unwrap();
    let log = dir.path().join("containerd.log");
    let out = std::fs::File::create(&log).unwrap();
    let child = Command::new(&anchor.bin)
        .arg("--config")
        .arg(&config)
        .args(["--log-level", "warn"])
        .stdin(Stdio::null())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .spawn()
        .expect("start containerd");
    let mut subject = Subject {
        name: anchor.label.clone(),
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

/// A process's user and system CPU time, from /proc/<pid>/stat (clock ticks).
fn cpu_time(pid: u32) -> [Duration; 2] {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // "pid (comm) state ...": utime and stime are the 12th and 13th fields after comm.
    let after = stat.rfind(')').map(|i| &stat[i + 2..]).unwrap_or("");
    let fields: Vec<u64> = after
        .split(' ')
        .skip(11)
        .take(2)
        .filter_map(|f| f.parse().ok())
        .collect();
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    let ticks = |i: usize| Duration::from_millis(fields.get(i).copied().unwrap_or(0) * 1000 / hz);
    [ticks(0), ticks(1)]
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
    /// The daemon's user and system CPU time over every pull and removal.
    cpu: [Duration; 2],
    first: Duration,
    repeated: Vec<Duration>,
    idle_rss_kib: u64,
    peak_rss_kib: u64,
    settled_rss_kib: u64,
    on_disk_pulled: u64,
    on_disk_removed: u64,
}

impl Figures {
    /// The pulls after RemoveImage, fastest first.
    fn sorted(&self) -> Vec<Duration> {
        let mut sorted = self.repeated.clone();
        sorted.sort();
        sorted
    }
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
    let idle_rss_kib = proc_kib(subject.pid(), "status", "VmRSS");
    let cpu_before = cpu_time(subject.pid());

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
    }
    let cpu_after = cpu_time(subject.pid());
    let cpu = [cpu_after[0] - cpu_before[0], cpu_after[1] - cpu_before[1]];
    println!(
        "  {:<14} pulls (s): {}",
        subject.name,
        times
            .iter()
            .enumerate()
            .map(|(i, t)| format!("{:.3}{}", t.as_secs_f64(), if i == 0 { " (cold)" } else { "" }))
            .collect::<Vec<_>>()
            .join(" ")
    );
    // Peak RSS over the daemon's whole life so far: start, idle, every pull and removal.
    let peak_rss_kib = proc_kib(subject.pid(), "status", "VmHWM");
    // What it keeps once the pulls are over (issue 21's goal: 16 MiB within 10 s).
    tokio::time::sleep(SETTLE).await;
    let settled_rss_kib = proc_kib(subject.pid(), "status", "VmRSS");
    let first = times.remove(0);
    Figures {
        cpu,
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

    let small_repeats: usize = std::env::var("SCUTE_BENCH_SMALL_PULLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench_mode { 20 } else { 1 })
        .max(1);
    let mut variants: Vec<(&Shape, String, usize)> =
        compressions.iter().map(|c| (&LARGE, c.clone(), repeats)).collect();
    variants.push((&SMALL, "gzip".into(), small_repeats));

    let kit_bin = imagekit();
    let registry = Registry::start();
    let anchors = anchors();

    // (image variant, runtime, compressed MB, figures)
    let mut results: Vec<(String, String, u64, Figures)> = Vec::new();
    for (shape, compression, repeats) in &variants {
        let layout = image_layout(&kit_bin, shape, compression);
        let (layer_count, compressed) = layer_sizes(&layout);
        let image = format!("{}/bench/{}:{compression}", registry.addr, shape.name.to_lowercase());
        let variant = format!("{} {compression}", shape.name);
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
            "image: {image}: {layer_count} {compression} layer(s), {:.1} MB compressed; 1 cold pull + {repeats} × (RemoveImage, PullImage) per runtime, each on a fresh daemon",
            mb(compressed)
        );
        for keep_blobs in [false, true] {
            let subject = start_scute(keep_blobs);
            let figures = measure_on(&subject, &image, *repeats);
            results.push((variant.clone(), subject.name.clone(), compressed, figures));
        }
        for anchor in &anchors {
            let mut subject = start_containerd(anchor, &registry.addr);
            let figures = measure_on(&subject, &image, *repeats);
            results.push((variant.clone(), subject.name.clone(), compressed, figures));
            subject.stop();
            let left = mounts_under(subject.dir.path());
            if !left.is_empty() {
                println!(
                    "note: {} left mounts under its temp dir (unmounted): {left:?}",
                    anchor.label
                );
            }
        }
    }
    drop(registry);

    println!();
    println!(
        "{:<10} {:<14} {:>9} {:>8} {:>9} {:>10} {:>10} {:>9} {:>9} {:>10} {:>10} {:>11} {:>11} {:>13}",
        "image",
        "runtime",
        "first s",
        "best s",
        "median s",
        "MB/s first",
        "MB/s best",
        "CPU s/GB",
        "user+sys",
        "peak RSS",
        "idle RSS",
        "RSS +10 s",
        "disk pulled",
        "disk after rm"
    );
    for (variant, name, compressed, f) in &results {
        let sorted = f.sorted();
        let best = sorted[0];
        let median = sorted[sorted.len() / 2];
        let pulled_gb = *compressed as f64 * (f.repeated.len() + 1) as f64 / 1e9;
        println!(
            "{:<10} {:<14} {:>9.3} {:>8.3} {:>9.3} {:>10.1} {:>10.1} {:>9.2} {:>9} {:>6.1} MiB {:>6.1} MiB {:>7.1} MiB {:>8.1} MB {:>10.1} MB",
            variant,
            name,
            f.first.as_secs_f64(),
            best.as_secs_f64(),
            median.as_secs_f64(),
            mb(*compressed) / f.first.as_secs_f64(),
            mb(*compressed) / best.as_secs_f64(),
            (f.cpu[0] + f.cpu[1]).as_secs_f64() / pulled_gb,
            format!(
                "{:.2}+{:.2}",
                f.cpu[0].as_secs_f64() / pulled_gb,
                f.cpu[1].as_secs_f64() / pulled_gb
            ),
            f.peak_rss_kib as f64 / 1024.0,
            f.idle_rss_kib as f64 / 1024.0,
            f.settled_rss_kib as f64 / 1024.0,
            mb(f.on_disk_pulled),
            mb(f.on_disk_removed),
        );
    }
    println!(
        "(first = the cold pull on a fresh daemon; best/median over the pulls after RemoveImage ({repeats} of 200MB, \
         {small_repeats} of 1MB); MB/s = compressed MB / wall s; CPU s/GB = the daemon's user + system CPU over every pull \
         and removal per compressed GB pulled (containerd's unpack runs in the daemon too), then split into user + system; peak RSS = VmHWM over the \
         daemon's life; RSS +10 s = VmRSS 10 s after the last pull; disk = regular-file bytes under the daemon's root \
         after the cold pull / after the last RemoveImage)"
    );
    for (shape, compression, _) in &variants {
        let variant = format!("{} {compression}", shape.name);
        let medians: Vec<(String, Duration)> = results
            .iter()
            .filter(|(v, ..)| *v == variant)
            .map(|(_, name, _, f)| (name.clone(), f.sorted()[f.repeated.len() / 2]))
            .collect();
        print_ratios(&format!("{variant} pull, median after RemoveImage"), &medians);
    }
}
