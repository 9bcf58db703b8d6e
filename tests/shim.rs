//! scute-shim end to end (root): the daemon's shim client spawns a real shim, which runs the
//! repository's static pause binary in new namespaces through libcontainer, and containers of
//! Debian's busybox (logs, exec, OOM kills); then everything is torn down and nothing may be left
//! (process, cgroup, mount, files).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use scute::config::CgroupDriver;
use scute::shim_client::{
    pb::ErrorCode, read_exit_file, AttachOptions, ContainerStatus, CreateOptions, ExecOptions, ExecStreamOptions,
    SessionOutput, SessionOutputs, ShimClient, ShimError, ShimSession, SpawnOptions,
};

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// target/debug/scute-shim, built once per test binary (`cargo test -p scute` alone would not
/// build another package's binary); SCUTE_TEST_SHIM names another build (e.g. a release one, to
/// read its RSS).
fn shim_binary() -> PathBuf {
    if let Some(path) = std::env::var_os("SCUTE_TEST_SHIM") {
        return PathBuf::from(path);
    }
    static BUILT: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let built = repo_root().join("target/debug/scute-shim");
            // hack/test.sh builds every binary before the tests run.
            if std::env::var_os("SCUTE_TEST_NO_BUILD").is_some() && built.is_file() {
                return built;
            }
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let status = Command::new(cargo)
                .args(["build", "--quiet", "-p", "scute-shim"])
                .current_dir(repo_root())
                .status()
                .expect("run cargo build -p scute-shim");
            assert!(status.success(), "building scute-shim failed");
            repo_root().join("target/debug/scute-shim")
        })
        .clone()
}

/// /proc/<pid>/stat fields after the command name: (state, ppid, session).
fn proc_stat(pid: u32) -> Option<(char, u32, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some((f[0].chars().next()?, f[1].parse().ok()?, f[3].parse().ok()?))
}

/// Running (a zombie has exited).
fn alive(pid: u32) -> bool {
    matches!(proc_stat(pid), Some((s, _, _)) if s != 'Z' && s != 'X')
}

fn ns(pid: &str, kind: &str) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/{kind}"))
        .unwrap()
        .to_string_lossy()
        .into_owned()
}

/// A /proc/<pid>/status memory field in KiB (VmRSS, RssAnon, RssFile).
fn status_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status
        .lines()
        .find(|l| l.strip_prefix(field).is_some_and(|r| r.starts_with(':')))
        .unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// What a process's descriptors point at, other than stdio and plain files.
fn fd_targets(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .map(|t| t.to_string_lossy().into_owned())
        .filter(|t| t.starts_with("socket:") || t.starts_with("anon_inode:"))
        .collect()
}

/// Every cgroup directory (any v1 controller, or the unified hierarchy) named `name`.
fn cgroup_dirs(name: &str) -> Vec<PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
        let dir = entry.path().join(name);
        if dir.is_dir() {
            found.push(dir);
        }
    }
    if Path::new("/sys/fs/cgroup").join(name).is_dir() {
        found.push(Path::new("/sys/fs/cgroup").join(name));
    }
    found
}

/// An OCI bundle running /pause as 65535 in new pid/ipc/uts/mount/network namespaces.
fn bundle(dir: &Path, name: &str, cgroup: &str) -> PathBuf {
    let bundle = dir.join(format!("bundle-{name}"));
    let rootfs = bundle.join("rootfs");
    for d in ["proc", "dev", "sys"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    let pause = rootfs.join("pause");
    std::fs::copy(env!("SCUTE_PAUSE_BINARY"), &pause).unwrap();
    std::fs::set_permissions(&pause, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = serde_json::json!({
        "ociVersion": "1.2.0",
        "process": {
            "terminal": false,
            "user": {"uid": 65535, "gid": 65535},
            "args": ["/pause"],
            "env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
            "cwd": "/",
            "capabilities": {"bounding": [], "effective": [], "permitted": []},
            "noNewPrivileges": true,
        },
        "root": {"path": rootfs, "readonly": true},
        "hostname": format!("shim-test-{name}"),
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        ],
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}],
            "cgroupsPath": format!("/{cgroup}"),
            "resources": {"devices": [{"allow": false, "access": "rwm"}]},
            "maskedPaths": ["/proc/kcore", "/sys/firmware"],
            "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger"],
        },
    });
    std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
    bundle
}

/// Kills whatever a failed test left running and removes its cgroups.
struct Leftovers {
    state_dir: PathBuf,
    cgroups: Vec<String>,
}

impl Drop for Leftovers {
    fn drop(&mut self) {
        if let Ok(pid) = std::fs::read_to_string(self.state_dir.join("shim.pid")) {
            if let Ok(pid) = pid.trim().parse::<i32>() {
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
        for cg in &self.cgroups {
            for dir in cgroup_dirs(cg) {
                if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                    for pid in procs.lines().filter_map(|p| p.parse::<i32>().ok()) {
                        unsafe { libc::kill(pid, libc::SIGKILL) };
                    }
                }
                for _ in 0..50 {
                    if std::fs::remove_dir(&dir).is_ok() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
            }
        }
    }
}

async fn wait_stopped(shim: &ShimClient, id: &str) -> scute::shim_client::ContainerState {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let s = shim.state(id).await.unwrap();
        if s.status == ContainerStatus::Stopped || Instant::now() > deadline {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test]
async fn pause_sandbox_lifecycle() {
    let tmp = tempfile::Builder::new().prefix("scute-shim-it-").tempdir().unwrap();
    let state_dir = tmp.path().join("state");
    let tag = format!("scute-shim-it-{}", std::process::id());
    let cgroups: Vec<String> = ["pause", "p2", "p3", "bad", "shim"]
        .iter()
        .map(|n| format!("{tag}-{n}"))
        .collect();
    let _leftovers = Leftovers {
        state_dir: state_dir.clone(),
        cgroups: cgroups.clone(),
    };

    let opts = SpawnOptions {
        sandbox_id: "sb-test".into(),
        state_dir: state_dir.clone(),
        shim_binary: shim_binary(),
        log_level: "debug".into(),
        cgroup_driver: CgroupDriver::Cgroupfs,
        cgroup: format!("/{}", cgroups[4]),
    };
    let shim = ShimClient::spawn(&opts).await.expect("spawn shim");
    let shim_pid = shim.shim_pid().unwrap();
    assert_eq!(shim.sandbox_id(), "sb-test");
    // It moved into the cgroup it was given before it answered.
    let shim_cgroup = std::fs::read_to_string(format!("/proc/{shim_pid}/cgroup")).unwrap();
    assert!(shim_cgroup.contains(&format!(":/{}\n", cgroups[4])), "{shim_cgroup}");

    // Detached: not our child, its own session; socket 0600; pid file.
    let (_, ppid, session) = proc_stat(shim_pid).unwrap();
    assert_ne!(ppid, std::process::id(), "the shim must not be the spawner's child");
    assert_eq!(session, shim_pid, "the shim leads its own session");
    let mode = std::fs::metadata(state_dir.join("shim.sock"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let pid_file = std::fs::read_to_string(state_dir.join("shim.pid")).unwrap();
    assert_eq!(pid_file.trim(), shim_pid.to_string());

    // A second shim for the same state dir refuses to start, and says why.
    match ShimClient::spawn(&opts).await {
        Err(ShimError::Start(m)) => assert!(m.contains("another shim"), "{m}"),
        other => panic!("second spawn: {:?}", other.map(|_| ())),
    }
    assert!(alive(shim_pid));

    // The pause container, in its own namespaces and cgroup.
    let b = bundle(tmp.path(), "pause", &cgroups[0]);
    let pid = shim.create_container("pause", &b).await.expect("create pause");
    // Started means told to start: the exec of /pause may take a moment more.
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut cmdline = Vec::new();
    while Instant::now() < deadline {
        cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        if cmdline == b"/pause\0" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(cmdline, b"/pause\0");
    for kind in ["pid", "uts", "ipc", "net", "mnt"] {
        assert_ne!(
            ns(&pid.to_string(), kind),
            ns("self", kind),
            "{kind} namespace is the host's"
        );
    }
    let proc_cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(proc_cgroup.contains(&format!("/{}", cgroups[0])), "{proc_cgroup}");
    assert!(!cgroup_dirs(&cgroups[0]).is_empty());
    // The shim is pause's parent (as subreaper), not libcontainer's helper.
    assert_eq!(proc_stat(pid).unwrap().1, shim_pid);
    // Signal state is a fresh process's, not the shim's (SIGCHLD blocked, SIGPIPE ignored) nor
    // the spawner's (this test binary ignores signal 32, for one). pause, a Rust program, ignores
    // SIGPIPE itself.
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let mask = |field: &str| {
        let line = status.lines().find(|l| l.starts_with(field)).unwrap();
        u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
    };
    assert_eq!(mask("SigBlk:"), 0, "{status}");
    assert_eq!(mask("SigIgn:") & !(1 << (libc::SIGPIPE - 1)), 0, "{status}");
    let s = shim.state("pause").await.unwrap();
    assert_eq!((s.pid, s.status, s.exit_code), (pid, ContainerStatus::Running, None));
    assert!(s.started_at_ns >= s.created_at_ns && s.created_at_ns > 0);
    match shim.create_container("pause", &b).await {
        Err(ShimError::Remote { message, .. }) => assert!(message.contains("exists"), "{message}"),
        other => panic!("duplicate create: {other:?}"),
    }

    // The shim outlives its client; a new client (a restarted daemon) sees the same state.
    drop(shim);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(alive(shim_pid) && alive(pid));
    let shim = ShimClient::connect(&state_dir).await.expect("reconnect");
    assert_eq!(shim.shim_pid(), Some(shim_pid));
    assert_eq!(shim.state("pause").await.unwrap().status, ContainerStatus::Running);
    // The shim trims its memory once idle for a second (shim/src/memory.rs).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    eprintln!(
        "idle shim with pause running: VmRSS {} KiB (anon {} KiB, file {} KiB); pause: {} KiB",
        status_kib(shim_pid, "VmRSS"),
        status_kib(shim_pid, "RssAnon"),
        status_kib(shim_pid, "RssFile"),
        status_kib(pid, "VmRSS"),
    );

    // SIGKILL: STOPPED, 137, on disk.
    shim.kill("pause", libc::SIGKILL, false).await.unwrap();
    let s = wait_stopped(&shim, "pause").await;
    assert_eq!(s.status, ContainerStatus::Stopped);
    assert_eq!(s.exit_code, Some(137));
    let finished = s.finished_at_ns.expect("finished_at_ns");
    let rec = read_exit_file(&state_dir, "pause").unwrap().expect("exit file");
    assert_eq!((rec.exit_code, rec.finished_at_ns), (137, finished));
    assert!(!alive(pid) && proc_stat(pid).is_none(), "pause must be reaped");
    shim.kill("pause", libc::SIGTERM, false)
        .await
        .expect("killing a stopped container is fine");

    shim.delete_container("pause").await.unwrap();
    shim.delete_container("pause").await.unwrap();
    assert!(matches!(shim.state("pause").await, Err(ShimError::NotFound(_))));
    assert_eq!(read_exit_file(&state_dir, "pause").unwrap(), None);
    assert!(cgroup_dirs(&cgroups[0]).is_empty(), "pause's cgroup is left");

    // Create, then start; deleting a running container kills it.
    let b2 = bundle(tmp.path(), "p2", &cgroups[1]);
    let pid2 = shim.create_container_only("p2", &b2).await.unwrap();
    assert_eq!(shim.state("p2").await.unwrap().status, ContainerStatus::Created);
    assert!(alive(pid2));
    // Waiting for its start, init still has what it inherited: none of the shim's descriptors.
    let shim_fds = fd_targets(shim_pid);
    let shared: Vec<_> = fd_targets(pid2).into_iter().filter(|t| shim_fds.contains(t)).collect();
    assert!(shared.is_empty(), "created init holds the shim's {shared:?}");
    shim.start_container("p2").await.unwrap();
    assert_eq!(shim.state("p2").await.unwrap().status, ContainerStatus::Running);
    assert!(matches!(
        shim.start_container("p2").await,
        Err(ShimError::Remote { .. })
    ));
    shim.delete_container("p2").await.unwrap();
    assert!(proc_stat(pid2).is_none(), "p2 must be gone");
    assert!(cgroup_dirs(&cgroups[1]).is_empty());

    // A container that cannot start fails its create with a reason and leaves nothing behind.
    let bad = bundle(tmp.path(), "bad", &cgroups[3]);
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(bad.join("config.json")).unwrap()).unwrap();
    config["process"]["args"] = serde_json::json!(["/no-such-binary"]);
    std::fs::write(bad.join("config.json"), config.to_string()).unwrap();
    match shim.create_container("bad", &bad).await {
        Err(ShimError::Remote { message, .. }) => assert!(message.contains("shim.log"), "{message}"),
        other => panic!("create of a broken bundle: {other:?}"),
    }
    assert!(matches!(shim.state("bad").await, Err(ShimError::NotFound(_))));
    assert!(cgroup_dirs(&cgroups[3]).is_empty(), "a failed create left its cgroup");
    assert!(!state_dir.join("containers/bad").exists());
    let log = std::fs::read_to_string(state_dir.join("shim.log")).unwrap();
    assert!(
        log.contains("no-such-binary"),
        "libcontainer's reason is in the log:\n{log}"
    );

    // Shutdown deletes what still runs, and the shim exits.
    let b3 = bundle(tmp.path(), "p3", &cgroups[2]);
    let pid3 = shim.create_container("p3", &b3).await.unwrap();
    shim.shutdown().await.expect("shutdown");
    assert!(proc_stat(shim_pid).is_none_or(|(s, _, _)| s == 'Z'), "shim still runs");
    assert!(proc_stat(pid3).is_none(), "p3 must be gone");
    shim.shutdown().await.expect("second shutdown");
    assert!(matches!(ShimClient::connect(&state_dir).await, Err(ShimError::Gone(_))));

    // Nothing left: cgroups, mounts, files other than the log. The shim's own cgroup is the
    // daemon's to remove with the pod, as here: it can, since the shim left it empty.
    scute::cgroups::remove_dirs(&format!("/{}", cgroups[4]));
    for cg in &cgroups {
        assert!(cgroup_dirs(cg).is_empty(), "cgroup {cg} is left");
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(tmp.path().to_str().unwrap()),
        "a mount is left:\n{mounts}"
    );
    let mut left: Vec<String> = std::fs::read_dir(&state_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    left.sort();
    assert_eq!(left, vec!["shim.log"]);
    let log = std::fs::read_to_string(state_dir.join("shim.log")).unwrap();
    assert!(log.contains("shim ready") && log.contains("container exited"), "{log}");
    std::fs::remove_dir_all(&state_dir).unwrap();
}

// ---------------------------------------------------------------------------------------------
// Containers of busybox: logs, exec, OOM kills.

/// A rootfs with Debian's /bin/busybox (dynamically linked: it and the libraries `ldd` lists, at
/// the same paths) and a symlink per applet in /bin.
fn busybox_rootfs(dir: &Path) -> PathBuf {
    let rootfs = dir.join("busybox-rootfs");
    for d in ["proc", "dev", "sys", "bin", "tmp"] {
        std::fs::create_dir_all(rootfs.join(d)).unwrap();
    }
    let busybox = Path::new("/bin/busybox");
    assert!(busybox.exists(), "/bin/busybox is needed (apt-get install busybox)");
    let ldd = Command::new("ldd").arg(busybox).output().unwrap();
    let mut files = vec![busybox.to_path_buf()];
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        // "libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)" or "/lib64/ld-linux-x86-64.so.2 (0x...)"
        if let Some(path) = line.split_whitespace().find(|w| w.starts_with('/')) {
            files.push(PathBuf::from(path));
        }
    }
    for f in files {
        let target = rootfs.join(f.strip_prefix("/").unwrap());
        std::fs::create_dir_all(target.parent().unwrap()).unwrap();
        std::fs::copy(&f, &target).unwrap();
    }
    let list = Command::new(busybox).arg("--list").output().unwrap();
    for applet in String::from_utf8_lossy(&list.stdout).lines() {
        let link = rootfs.join("bin").join(applet);
        if applet != "busybox" && !link.exists() {
            std::os::unix::fs::symlink("busybox", link).unwrap();
        }
    }
    rootfs
}

const PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// A bundle running `args` as 1000:1000 on the busybox rootfs (read-only), in new namespaces;
/// `tweak` edits the config.
fn busybox_bundle(
    dir: &Path,
    rootfs: &Path,
    name: &str,
    cgroup: &str,
    args: &[&str],
    tweak: impl FnOnce(&mut serde_json::Value),
) -> PathBuf {
    let bundle = dir.join(format!("bundle-{name}"));
    std::fs::create_dir_all(&bundle).unwrap();
    let mut config = serde_json::json!({
        "ociVersion": "1.2.0",
        "process": {
            "terminal": false,
            "user": {"uid": 1000, "gid": 1000},
            "args": args,
            "env": [PATH_ENV, "GREETING=hello"],
            "cwd": "/tmp",
            "capabilities": {"bounding": [], "effective": [], "permitted": []},
            "noNewPrivileges": true,
        },
        "root": {"path": rootfs, "readonly": true},
        "hostname": format!("shim-test-{name}"),
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=777", "size=65536k"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
            {"destination": "/tmp", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "nodev", "mode=1777"]},
        ],
        "linux": {
            "namespaces": [{"type": "pid"}, {"type": "ipc"}, {"type": "uts"}, {"type": "mount"}, {"type": "network"}],
            "cgroupsPath": format!("/{cgroup}"),
            "resources": {"devices": [{"allow": false, "access": "rwm"}]},
            "maskedPaths": ["/proc/kcore", "/sys/firmware"],
            "readonlyPaths": ["/proc/sys", "/proc/sysrq-trigger"],
        },
    });
    tweak(&mut config);
    std::fs::write(bundle.join("config.json"), config.to_string()).unwrap();
    bundle
}

/// Seconds since the epoch of a CRI log timestamp `YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ`, if it is one.
fn parse_timestamp(ts: &str) -> Option<f64> {
    let b = ts.as_bytes();
    if b.len() != 30
        || &ts[4..5] != "-"
        || &ts[7..8] != "-"
        || &ts[10..11] != "T"
        || &ts[19..20] != "."
        || b[29] != b'Z'
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| -> Option<i64> {
        ts.get(r.clone())
            .filter(|s| s.bytes().all(|c| c.is_ascii_digit()))
            .and_then(|s| s.parse().ok())
    };
    let (y, m, d) = (num(0..4)?, num(5..7)?, num(8..10)?);
    let (hh, mm, ss, ns) = (num(11..13)?, num(14..16)?, num(17..19)?, num(20..29)?);
    // Days from civil (Howard Hinnant).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some((days * 86_400 + hh * 3600 + mm * 60 + ss) as f64 + ns as f64 / 1e9)
}

/// The entries of a CRI log file: (stream, tag, content), after checking each timestamp.
fn log_entries(path: &Path) -> Vec<(String, String, String)> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    text.lines()
        .map(|line| {
            let mut f = line.splitn(4, ' ');
            let (ts, stream, tag) = (f.next().unwrap(), f.next().unwrap(), f.next().unwrap());
            let t = parse_timestamp(ts).unwrap_or_else(|| panic!("bad timestamp in {line:?}"));
            assert!((now - 120.0..=now + 1.0).contains(&t), "timestamp {ts} is not recent");
            (stream.to_string(), tag.to_string(), f.next().unwrap_or("").to_string())
        })
        .collect()
}

fn entry(stream: &str, tag: &str, content: &str) -> (String, String, String) {
    (stream.into(), tag.into(), content.into())
}

/// Waits (bounded) until the log file has an entry with `content`.
async fn wait_for_log(path: &Path, content: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !log_entries(path).iter().any(|e| e.2 == content) {
        assert!(Instant::now() < deadline, "{content:?} never reached {path:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Pids in a cgroup (the pids controller's view).
fn cgroup_pids(cgroup: &str) -> Vec<u32> {
    let dir = Path::new("/sys/fs/cgroup/pids").join(cgroup);
    let dir = if dir.is_dir() {
        dir
    } else {
        Path::new("/sys/fs/cgroup").join(cgroup)
    };
    std::fs::read_to_string(dir.join("cgroup.procs"))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.parse().ok())
        .collect()
}

/// One shim, its state dir and cgroup names, for one test; `finish` shuts it down and checks that
/// nothing is left.
struct Pod {
    // Dropped first (fields drop in order): it reads the shim's pid file before `tmp` goes.
    _leftovers: Leftovers,
    tmp: tempfile::TempDir,
    state_dir: PathBuf,
    cgroups: Vec<String>,
    shim: ShimClient,
    rootfs: PathBuf,
}

impl Pod {
    async fn start(name: &str, containers: &[&str]) -> Pod {
        let tmp = tempfile::Builder::new().prefix("scute-shim-it-").tempdir().unwrap();
        let state_dir = tmp.path().join("state");
        let tag = format!("scute-shim-it-{}-{name}", std::process::id());
        let mut cgroups: Vec<String> = containers.iter().map(|n| format!("{tag}-{n}")).collect();
        cgroups.push(format!("{tag}-shim"));
        let leftovers = Leftovers {
            state_dir: state_dir.clone(),
            cgroups: cgroups.clone(),
        };
        let shim = ShimClient::spawn(&SpawnOptions {
            sandbox_id: format!("sb-{name}"),
            state_dir: state_dir.clone(),
            shim_binary: shim_binary(),
            log_level: "debug".into(),
            cgroup_driver: CgroupDriver::Cgroupfs,
            cgroup: format!("/{tag}-shim"),
        })
        .await
        .expect("spawn shim");
        let rootfs = busybox_rootfs(tmp.path());
        Pod {
            _leftovers: leftovers,
            tmp,
            state_dir,
            cgroups,
            shim,
            rootfs,
        }
    }

    fn cgroup(&self, container: &str) -> String {
        self.cgroups
            .iter()
            .find(|c| c.ends_with(&format!("-{container}")))
            .unwrap()
            .clone()
    }

    fn bundle(&self, name: &str, args: &[&str], tweak: impl FnOnce(&mut serde_json::Value)) -> PathBuf {
        busybox_bundle(self.tmp.path(), &self.rootfs, name, &self.cgroup(name), args, tweak)
    }

    fn log_path(&self, name: &str) -> PathBuf {
        // Parent directories that do not exist yet: the shim creates them.
        self.tmp.path().join(format!("pods/ns_pod_uid/{name}/0.log"))
    }

    async fn run(&self, name: &str, args: &[&str], opts: CreateOptions) -> u32 {
        let b = self.bundle(name, args, |_| {});
        let pid = self.shim.create_container_with(name, &b, &opts).await.expect("create");
        assert_eq!(self.shim.state(name).await.unwrap().status, ContainerStatus::Created);
        self.shim.start_container(name).await.expect("start");
        pid
    }

    async fn finish(self) {
        let shim_pid = self.shim.shim_pid().unwrap();
        self.shim.shutdown().await.expect("shutdown");
        if std::env::var_os("SCUTE_TEST_SHIM_LOG").is_some() {
            eprintln!("{}", std::fs::read_to_string(self.state_dir.join("shim.log")).unwrap());
        }
        assert!(proc_stat(shim_pid).is_none_or(|(s, _, _)| s == 'Z'), "shim still runs");
        // The shim's own cgroup is the daemon's to remove with the pod, as here.
        scute::cgroups::remove_dirs(&format!("/{}", self.cgroup("shim")));
        for cg in &self.cgroups {
            assert!(cgroup_dirs(cg).is_empty(), "cgroup {cg} is left");
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        assert!(
            !mounts.contains(self.tmp.path().to_str().unwrap()),
            "a mount is left:\n{mounts}"
        );
        let left: Vec<String> = std::fs::read_dir(&self.state_dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(left, vec!["shim.log"]);
    }
}

#[tokio::test]
async fn container_logs() {
    let pod = Pod::start("logs", &["hello", "long", "rot", "many", "null"]).await;
    let shim = &pod.shim;

    // Whole lines of both streams, and the end of stdout without a newline.
    let log = pod.log_path("hello");
    let opts = CreateOptions {
        log_path: Some(log.clone()),
        ..Default::default()
    };
    pod.run("hello", &["sh", "-c", "echo out; echo err >&2; printf partial"], opts)
        .await;
    let s = wait_stopped(shim, "hello").await;
    assert_eq!(
        (s.status, s.exit_code, s.oom_killed),
        (ContainerStatus::Stopped, Some(0), false)
    );
    // Everything is in the file once the exit is reported.
    let entries = log_entries(&log);
    assert_eq!(entries.len(), 3, "{entries:?}");
    for e in [
        entry("stdout", "F", "out"),
        entry("stderr", "F", "err"),
        entry("stdout", "P", "partial"),
    ] {
        assert!(entries.contains(&e), "{e:?} missing in {entries:?}");
    }
    let out_pos = entries.iter().position(|e| e.2 == "out").unwrap();
    let partial_pos = entries.iter().position(|e| e.2 == "partial").unwrap();
    assert!(out_pos < partial_pos, "{entries:?}");
    let mode = std::fs::metadata(&log).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o640);
    // Reopening after the output ended is fine and writes nothing.
    shim.reopen_log("hello").await.unwrap();
    assert_eq!(log_entries(&log).len(), 3);

    // A line longer than the maximum: P chunks, then F.
    let log = pod.log_path("long");
    let opts = CreateOptions {
        log_path: Some(log.clone()),
        max_log_line_bytes: Some(1024),
        ..Default::default()
    };
    pod.run(
        "long",
        &["sh", "-c", r#"head -c 3000 /dev/zero | tr '\0' a; echo; echo short"#],
        opts,
    )
    .await;
    assert_eq!(
        wait_stopped(shim, "long").await.exit_code,
        Some(0),
        "{:?}",
        log_entries(&log)
    );
    let a = |n: usize| "a".repeat(n);
    assert_eq!(
        log_entries(&log),
        vec![
            entry("stdout", "P", &a(1024)),
            entry("stdout", "P", &a(1024)),
            entry("stdout", "F", &a(952)),
            entry("stdout", "F", "short"),
        ]
    );

    // Rotation: the kubelet renames the file, then asks for a reopen; the container runs on.
    let log = pod.log_path("rot");
    let opts = CreateOptions {
        log_path: Some(log.clone()),
        ..Default::default()
    };
    pod.run(
        "rot",
        &[
            "sh",
            "-c",
            "echo before; while [ ! -e /tmp/go ]; do sleep 0.02; done; echo after; echo after >&2",
        ],
        opts,
    )
    .await;
    wait_for_log(&log, "before").await;
    let rotated = log.with_extension("log.20261121-161244");
    std::fs::rename(&log, &rotated).unwrap();
    shim.reopen_log("rot").await.unwrap();
    assert!(log.exists(), "reopen creates the file");
    let go = shim
        .exec("rot", &["touch".into(), "/tmp/go".into()], Duration::from_secs(10), 0)
        .await
        .unwrap();
    assert_eq!(go.exit_code, 0, "{go:?}");
    assert_eq!(wait_stopped(shim, "rot").await.exit_code, Some(0));
    assert_eq!(log_entries(&rotated), vec![entry("stdout", "F", "before")]);
    let mut after = log_entries(&log);
    after.sort();
    assert_eq!(
        after,
        vec![entry("stderr", "F", "after"), entry("stdout", "F", "after")]
    );

    // Much output: drained as it comes, every line in the file once the exit is reported.
    let log = pod.log_path("many");
    let opts = CreateOptions {
        log_path: Some(log.clone()),
        ..Default::default()
    };
    let started = Instant::now();
    pod.run("many", &["sh", "-c", "yes abcdefghij | head -n 200000"], opts)
        .await;
    assert_eq!(wait_stopped(shim, "many").await.exit_code, Some(0));
    let entries = log_entries(&log);
    assert_eq!(entries.len(), 200_000);
    assert!(entries.iter().all(|e| *e == entry("stdout", "F", "abcdefghij")));
    eprintln!("200000 log lines in {:?}", started.elapsed());

    // No log path: output goes nowhere, and nothing is created.
    pod.run("null", &["sh", "-c", "echo nowhere"], CreateOptions::default())
        .await;
    assert_eq!(wait_stopped(shim, "null").await.exit_code, Some(0));
    shim.reopen_log("null").await.unwrap();
    assert!(matches!(shim.reopen_log("nope").await, Err(ShimError::NotFound(_))));

    // A terminal must be what the bundle's process.terminal says.
    let b = pod.bundle("null", &["true"], |_| {});
    let tty = CreateOptions {
        tty: true,
        ..Default::default()
    };
    match shim.create_container_with("x", &b, &tty).await {
        Err(ShimError::Remote {
            code: ErrorCode::InvalidArgument,
            message,
        }) => assert!(message.contains("process.terminal"), "{message}"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(shim.state("x").await, Err(ShimError::NotFound(_))));

    for c in ["hello", "long", "rot", "many", "null"] {
        shim.delete_container(c).await.unwrap();
    }
    // Logs belong to the kubelet: they stay.
    assert!(pod.log_path("hello").exists());
    pod.finish().await;
}

#[tokio::test]
async fn exec_sync() {
    let pod = Pod::start("exec", &["box", "created"]).await;
    let shim = &pod.shim;
    let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let log = pod.log_path("box");
    let opts = CreateOptions {
        log_path: Some(log.clone()),
        ..Default::default()
    };
    let init = pod.run("box", &["sh", "-c", "echo ready; exec sleep 1000"], opts).await;
    wait_for_log(&log, "ready").await;
    let cgroup = pod.cgroup("box");
    assert_eq!(cgroup_pids(&cgroup), vec![init]);

    // Output and exit code; the container's user, cwd and environment.
    let r = shim
        .exec(
            "box",
            &args(&["sh", "-c", "echo hi; exit 3"]),
            Duration::from_secs(10),
            0,
        )
        .await
        .unwrap();
    assert_eq!(
        (r.exit_code, r.stdout.as_slice(), r.stderr.as_slice(), r.timed_out),
        (3, &b"hi\n"[..], &b""[..], false)
    );
    let r = shim
        .exec_with(
            "box",
            &ExecOptions {
                args: args(&[
                    "sh",
                    "-c",
                    "echo $(id -u):$(id -g) $(pwd) $GREETING $EXTRA; echo oops >&2",
                ]),
                env: vec!["EXTRA=more".into(), "GREETING=hi".into()],
                timeout: Duration::from_secs(10),
                max_output: 0,
            },
        )
        .await
        .unwrap();
    assert_eq!(String::from_utf8_lossy(&r.stdout), "1000:1000 /tmp hi more\n");
    assert_eq!(r.stderr, b"oops\n");
    // Its namespaces.
    let r = shim
        .exec("box", &args(&["hostname"]), Duration::from_secs(10), 0)
        .await
        .unwrap();
    assert_eq!(r.stdout, b"shim-test-box\n");
    // Output beyond the cap is dropped (and the process is not blocked by it).
    let r = shim
        .exec(
            "box",
            &args(&["head", "-c", "300000", "/dev/zero"]),
            Duration::from_secs(10),
            1000,
        )
        .await
        .unwrap();
    assert_eq!((r.exit_code, r.stdout.len(), r.stdout_dropped), (0, 1000, 299_000));

    // A timeout kills the process, and the answer comes then, not when the process would have ended.
    let started = Instant::now();
    let r = shim
        .exec("box", &args(&["sleep", "10"]), Duration::from_millis(200), 0)
        .await
        .unwrap();
    let took = started.elapsed();
    assert!(r.timed_out && r.exit_code == 137, "{r:?}");
    assert!(
        took >= Duration::from_millis(200) && took < Duration::from_secs(10),
        "{took:?}"
    );
    assert_eq!(cgroup_pids(&cgroup), vec![init], "the timed-out process is left");

    // While an exec runs, the shim serves State, Kill and other execs. The slow exec waits for a
    // file (in the container's /tmp, a tmpfs) that another exec creates only after State, an exec
    // and Kill have answered: what is checked is that they did not queue behind it, with no clock
    // in the assertion.
    let shim = std::sync::Arc::new(ShimClient::connect(&pod.state_dir).await.unwrap());
    let slow = {
        let shim = shim.clone();
        let a = args(&[
            "sh",
            "-c",
            "until [ -e /tmp/release ]; do sleep 0.05; done; echo released",
        ]);
        tokio::spawn(async move { shim.exec("box", &a, Duration::from_secs(60), 0).await })
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while cgroup_pids(&cgroup).len() < 2 {
        assert!(Instant::now() < deadline, "the slow exec never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Were any of them queued behind the slow exec, it would never be released: they get a
    // bound to fail by instead of hanging the test.
    let bound = Duration::from_secs(30);
    let state = tokio::time::timeout(bound, shim.state("box"))
        .await
        .expect("State queued behind the running exec");
    assert_eq!(state.unwrap().status, ContainerStatus::Running);
    let r = tokio::time::timeout(
        bound,
        shim.exec("box", &args(&["echo", "quick"]), Duration::from_secs(10), 0),
    )
    .await
    .expect("an exec queued behind the running exec")
    .unwrap();
    assert_eq!(r.stdout, b"quick\n");
    tokio::time::timeout(bound, shim.kill("box", libc::SIGWINCH, false))
        .await
        .expect("Kill queued behind the running exec")
        .unwrap();
    assert!(
        !slow.is_finished(),
        "the slow exec ended before it was released: {slow:?}"
    );
    let r = shim
        .exec("box", &args(&["touch", "/tmp/release"]), Duration::from_secs(10), 0)
        .await
        .unwrap();
    assert_eq!(r.exit_code, 0, "{r:?}");
    let slow = tokio::time::timeout(Duration::from_secs(30), slow)
        .await
        .expect("the slow exec ends once released")
        .unwrap()
        .unwrap();
    assert_eq!((slow.exit_code, slow.stdout.as_slice()), (0, &b"released\n"[..]));

    // A client that gives up (drops the call): the shim kills the process.
    let _ = tokio::time::timeout(
        Duration::from_millis(300),
        shim.exec("box", &args(&["sleep", "100"]), Duration::ZERO, 0),
    )
    .await;
    let deadline = Instant::now() + Duration::from_secs(5);
    while cgroup_pids(&cgroup) != vec![init] {
        assert!(
            Instant::now() < deadline,
            "abandoned exec still runs: {:?}",
            cgroup_pids(&cgroup)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Failures.
    let e = shim
        .exec("box", &args(&["/no/such/binary"]), Duration::from_secs(10), 0)
        .await;
    assert!(
        matches!(
            e,
            Err(ShimError::Remote {
                code: ErrorCode::Internal,
                ..
            })
        ),
        "{e:?}"
    );
    assert!(matches!(
        shim.exec("nope", &args(&["true"]), Duration::from_secs(1), 0).await,
        Err(ShimError::NotFound(_))
    ));
    let b = pod.bundle("created", &["true"], |_| {});
    shim.create_container_with("created", &b, &CreateOptions::default())
        .await
        .unwrap();
    assert!(matches!(
        shim.exec("created", &args(&["true"]), Duration::from_secs(1), 0).await,
        Err(ShimError::Remote {
            code: ErrorCode::FailedPrecondition,
            ..
        })
    ));
    // The exec answers' files are gone.
    let stray: Vec<_> = std::fs::read_dir(&pod.state_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("exec-"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");

    // The idle shim, with a container whose log pipes it watches, after all this.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let shim_pid = shim.shim_pid().unwrap();
    eprintln!(
        "idle shim after execs, a logging container running: VmRSS {} KiB (anon {} KiB, file {} KiB)",
        status_kib(shim_pid, "VmRSS"),
        status_kib(shim_pid, "RssAnon"),
        status_kib(shim_pid, "RssFile"),
    );

    // Stopped: no exec. A SIGKILL that is no OOM kill is not reported as one.
    shim.kill("box", libc::SIGKILL, false).await.unwrap();
    let s = wait_stopped(&shim, "box").await;
    assert_eq!((s.exit_code, s.oom_killed), (Some(137), false));
    assert!(matches!(
        shim.exec("box", &args(&["true"]), Duration::from_secs(1), 0).await,
        Err(ShimError::Remote {
            code: ErrorCode::FailedPrecondition,
            ..
        })
    ));
    drop(shim);
    pod.finish().await;
}

#[tokio::test]
async fn oom_kill_is_reported() {
    let memory = Path::new("/sys/fs/cgroup/memory");
    let pod = Pod::start("oom", &["hog"]).await;
    let b = pod.bundle(
        "hog",
        &[
            "sh",
            "-c",
            r#"x=$(head -c 100000000 /dev/zero | tr '\0' a); echo survived"#,
        ],
        |c| {
            c["linux"]["resources"]["memory"] = serde_json::json!({"limit": 32 << 20});
        },
    );
    let shim = &pod.shim;
    shim.create_container_with("hog", &b, &CreateOptions::default())
        .await
        .unwrap();
    if memory.is_dir() {
        let limit = std::fs::read_to_string(memory.join(pod.cgroup("hog")).join("memory.limit_in_bytes")).unwrap();
        assert_eq!(limit.trim(), (32u64 << 20).to_string());
    }
    shim.start_container("hog").await.unwrap();
    let s = wait_stopped(shim, "hog").await;
    assert_eq!(
        (s.status, s.exit_code, s.oom_killed),
        (ContainerStatus::Stopped, Some(137), true)
    );
    let rec = read_exit_file(&pod.state_dir, "hog").unwrap().unwrap();
    assert!(rec.oom_killed);
    shim.delete_container("hog").await.unwrap();
    pod.finish().await;
}

#[tokio::test]
async fn exits_are_pushed_to_every_subscriber() {
    let pod = Pod::start("exits", &["quick", "slow"]).await;
    let mut first = pod.shim.subscribe_exits().await.unwrap();
    let mut second = pod.shim.subscribe_exits().await.unwrap();
    pod.run("slow", &["sh", "-c", "sleep 1; exit 4"], CreateOptions::default())
        .await;
    pod.run("quick", &["sh", "-c", "exit 3"], CreateOptions::default())
        .await;
    for subscription in [&mut first, &mut second] {
        let mut got = Vec::new();
        for _ in 0..2 {
            let exit = tokio::time::timeout(Duration::from_secs(10), subscription.next())
                .await
                .expect("an exit within 10 s")
                .unwrap();
            assert!(exit.finished_at_ns > 0);
            got.push((exit.container_id, exit.exit_code));
        }
        assert_eq!(got, [("quick".to_string(), 3), ("slow".to_string(), 4)]);
    }
    // What was pushed is what the exit file and State say.
    let rec = read_exit_file(&pod.state_dir, "slow").unwrap().unwrap();
    assert_eq!(rec.exit_code, 4);
    // A dropped subscription is closed on the shim's side; the other goes on to the shutdown.
    drop(first);
    for id in ["quick", "slow"] {
        pod.shim.delete_container(id).await.unwrap();
    }
    pod.finish().await;
    assert!(matches!(second.next().await, Err(ShimError::Gone(_))));
}

// ---------------------------------------------------------------------------------------------
// Streaming sessions: ExecStream and Attach, with pipes and terminals.

/// Gives the container its own devpts (terminals are opened there) and sets process.terminal.
fn with_terminal(terminal: bool) -> impl FnOnce(&mut serde_json::Value) {
    move |c| {
        c["mounts"].as_array_mut().unwrap().push(serde_json::json!({
            "destination": "/dev/pts", "type": "devpts", "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        }));
        c["process"]["terminal"] = serde_json::json!(terminal);
    }
}

/// What a session yielded so far.
#[derive(Default)]
struct Collected {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    exit: Option<i32>,
    /// The shim closed the session.
    closed: bool,
}

impl Collected {
    fn out(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    fn err(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

impl std::fmt::Debug for Collected {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cut = |s: String| {
            if s.len() > 2000 {
                format!("{}…", &s[..2000])
            } else {
                s
            }
        };
        write!(
            f,
            "stdout {:?}, stderr {:?}, exit {:?}, closed {}",
            cut(self.out()),
            cut(self.err()),
            self.exit,
            self.closed
        )
    }
}

/// Reads the session until `done` says so or the shim closes it (at most 10 s).
async fn read_until(out: &mut SessionOutputs, got: &mut Collected, done: impl Fn(&Collected) -> bool) {
    read_session(out, got, done, false).await
}

async fn read_session(
    out: &mut SessionOutputs,
    got: &mut Collected,
    done: impl Fn(&Collected) -> bool,
    allow_cut: bool,
) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !done(got) && !got.closed {
        let left = deadline.saturating_duration_since(Instant::now());
        match tokio::time::timeout(left, out.next()).await {
            Err(_) => panic!("session: nothing more in time; so far {got:?}"),
            Ok(None) => got.closed = true,
            Ok(Some(Ok(SessionOutput::Stdout(b)))) => got.stdout.extend_from_slice(&b),
            Ok(Some(Ok(SessionOutput::Stderr(b)))) => got.stderr.extend_from_slice(&b),
            Ok(Some(Ok(SessionOutput::Exit(code)))) => {
                assert_eq!(got.exit, None, "two exits");
                got.exit = Some(code);
            }
            // Cut in the middle of a frame: a session dropped for falling behind.
            Ok(Some(Err(ShimError::Gone(_)))) if allow_cut => got.closed = true,
            Ok(Some(Err(e))) => panic!("session: {e}; so far {got:?}"),
        }
    }
}

/// Reads the whole session.
async fn read_all(s: &mut ShimSession) -> Collected {
    let mut got = Collected::default();
    read_until(&mut s.output, &mut got, |_| false).await;
    got
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().count()
}

/// Waits (bounded) until the shim holds `n` descriptors again (reaping is asynchronous).
async fn wait_fd_count(pid: u32, n: usize) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while fd_count(pid) != n {
        assert!(
            Instant::now() < deadline,
            "the shim holds {} descriptors, {n} before: {:?}",
            fd_count(pid),
            std::fs::read_dir(format!("/proc/{pid}/fd"))
                .unwrap()
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn strings(a: &[&str]) -> Vec<String> {
    a.iter().map(|s| s.to_string()).collect()
}

#[tokio::test]
async fn exec_sessions() {
    let pod = Pod::start("xs", &["box", "created"]).await;
    let shim = &pod.shim;
    let log = pod.log_path("box");
    let b = pod.bundle(
        "box",
        &["sh", "-c", "echo ready; exec sleep 1000"],
        with_terminal(false),
    );
    let init = shim
        .create_container_with(
            "box",
            &b,
            &CreateOptions {
                log_path: Some(log.clone()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    shim.start_container("box").await.unwrap();
    wait_for_log(&log, "ready").await;
    let cgroup = pod.cgroup("box");
    let shim_pid = shim.shim_pid().unwrap();
    let fds = fd_count(shim_pid);
    let opts = |args: &[&str]| ExecStreamOptions {
        args: strings(args),
        ..Default::default()
    };

    // Without a terminal: stdout and stderr apart, the exit code after all output, then the end.
    let mut s = shim
        .exec_stream("box", &opts(&["sh", "-c", "echo out; echo err >&2; echo more; exit 3"]))
        .await
        .unwrap();
    assert!(s.pid > 0 && !s.tty);
    let got = read_all(&mut s).await;
    assert_eq!(
        (got.out(), got.err(), got.exit, got.closed),
        ("out\nmore\n".into(), "err\n".into(), Some(3), true),
        "{got:?}"
    );
    // The container's user, cwd and environment, as ExecSync.
    let mut s = shim
        .exec_stream(
            "box",
            &ExecStreamOptions {
                env: strings(&["EXTRA=more"]),
                ..opts(&["sh", "-c", "echo $(id -u) $(pwd) $GREETING $EXTRA"])
            },
        )
        .await
        .unwrap();
    assert_eq!(read_all(&mut s).await.out(), "1000 /tmp hello more\n");

    // stdin: what the session sends reaches the process; closing it ends `cat`.
    let mut s = shim
        .exec_stream(
            "box",
            &ExecStreamOptions {
                stdin: true,
                ..opts(&["cat"])
            },
        )
        .await
        .unwrap();
    let mut got = Collected::default();
    s.input.stdin(b"hello\n").await.unwrap();
    read_until(&mut s.output, &mut got, |g| g.stdout.ends_with(b"hello\n")).await;
    let big = vec![b'z'; 300_000];
    s.input.stdin(&big).await.unwrap();
    s.input.close_stdin().await.unwrap();
    read_until(&mut s.output, &mut got, |_| false).await;
    assert_eq!(got.stdout.len(), 6 + big.len());
    assert_eq!((got.exit, got.closed), (Some(0), true));

    // Much output read slowly: all of it arrives, the process waits for the session, the shim
    // does not buffer it.
    let rss_before = status_kib(shim_pid, "VmRSS");
    let mut s = shim
        .exec_stream(
            "box",
            &opts(&["sh", "-c", r#"head -c 8000000 /dev/zero | tr '\0' a; echo; exit 0"#]),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(700)).await;
    let rss_held = status_kib(shim_pid, "VmRSS");
    let got = read_all(&mut s).await;
    assert_eq!((got.stdout.len(), got.exit), (8_000_001, Some(0)));
    assert!(got.stdout[..8_000_000].iter().all(|&b| b == b'a'));
    eprintln!("shim VmRSS {rss_before} KiB, {rss_held} KiB with an exec session's output waiting");
    assert!(
        rss_held < rss_before + 4096,
        "the shim buffers a slow session's output: {rss_before} -> {rss_held} KiB"
    );

    // On a terminal: the initial size, a resize, the container's own devpts; stderr is stdout.
    let mut s = shim
        .exec_stream(
            "box",
            &ExecStreamOptions {
                tty: true,
                stdin: true,
                width: 100,
                height: 30,
                ..opts(&["sh"])
            },
        )
        .await
        .unwrap();
    assert!(s.tty);
    let mut got = Collected::default();
    s.input.stdin(b"stty size; tty; echo to-stderr >&2\n").await.unwrap();
    read_until(&mut s.output, &mut got, |g| {
        let o = g.out();
        o.contains("30 100") && o.contains("/dev/pts/") && o.contains("\nto-stderr")
    })
    .await;
    s.input.resize(120, 40).await.unwrap();
    s.input.stdin(b"stty size\n").await.unwrap();
    read_until(&mut s.output, &mut got, |g| g.out().contains("40 120")).await;
    s.input.stdin(b"exit 5\n").await.unwrap();
    read_until(&mut s.output, &mut got, |_| false).await;
    assert_eq!(got.exit, Some(5), "{got:?}");
    assert!(got.stderr.is_empty(), "{got:?}");

    // On a terminal, closing stdin sends ^D: cat ends.
    let mut s = shim
        .exec_stream(
            "box",
            &ExecStreamOptions {
                tty: true,
                stdin: true,
                ..opts(&["cat"])
            },
        )
        .await
        .unwrap();
    let mut got = Collected::default();
    s.input.stdin(b"abc\n").await.unwrap();
    // Echoed by the terminal, then by cat.
    read_until(&mut s.output, &mut got, |g| g.out().matches("abc").count() == 2).await;
    s.input.close_stdin().await.unwrap();
    read_until(&mut s.output, &mut got, |_| false).await;
    assert_eq!(got.exit, Some(0), "{got:?}");

    // A client that drops its session: the process is killed and reaped.
    let s = shim.exec_stream("box", &opts(&["sleep", "1000"])).await.unwrap();
    let pid = s.pid;
    assert!(alive(pid));
    assert_eq!(cgroup_pids(&cgroup).len(), 2);
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(5);
    while proc_stat(pid).is_some() || cgroup_pids(&cgroup) != vec![init] {
        assert!(Instant::now() < deadline, "the dropped session's process still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Also while the process is blocked writing output nobody reads.
    let s = shim.exec_stream("box", &opts(&["sh", "-c", "yes"])).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    drop(s);
    let deadline = Instant::now() + Duration::from_secs(5);
    while cgroup_pids(&cgroup) != vec![init] {
        assert!(Instant::now() < deadline, "the dropped session's process still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // Failures answer at once, before any session.
    assert!(matches!(
        shim.exec_stream("nope", &opts(&["true"])).await,
        Err(ShimError::NotFound(_))
    ));
    match shim.exec_stream("box", &opts(&["/no/such/binary"])).await {
        Err(ShimError::Remote {
            code: ErrorCode::Internal,
            ..
        }) => {}
        other => panic!("{:?}", other.map(|s| s.pid)),
    }
    let created = pod.bundle("created", &["true"], |_| {});
    shim.create_container_with("created", &created, &CreateOptions::default())
        .await
        .unwrap();
    assert!(matches!(
        shim.exec_stream("created", &opts(&["true"])).await,
        Err(ShimError::Remote {
            code: ErrorCode::FailedPrecondition,
            ..
        })
    ));
    shim.delete_container("created").await.unwrap();

    // Nothing left behind: descriptors, console sockets, libcontainer's console links.
    wait_fd_count(shim_pid, fds).await;
    let stray: Vec<_> = std::fs::read_dir(&pod.state_dir)
        .unwrap()
        .chain(std::fs::read_dir(pod.state_dir.join("containers/box")).unwrap())
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.starts_with("tty-") || n.starts_with("tenant-tty-") || n.starts_with("exec-"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");

    shim.kill("box", libc::SIGKILL, false).await.unwrap();
    wait_stopped(shim, "box").await;
    shim.delete_container("box").await.unwrap();
    pod.finish().await;
}

#[tokio::test]
async fn attach_sessions() {
    let pod = Pod::start("at", &["reader", "once", "once2", "tty", "flood"]).await;
    let shim = &pod.shim;
    let shim_pid = shim.shim_pid().unwrap();
    let fds = fd_count(shim_pid);
    let create = |name: &'static str, args: &'static [&'static str], opts: CreateOptions| {
        let pod = &pod;
        async move {
            let tty = opts.tty;
            let b = pod.bundle(name, args, with_terminal(tty));
            let opts = CreateOptions {
                log_path: Some(pod.log_path(name)),
                ..opts
            };
            pod.shim.create_container_with(name, &b, &opts).await.unwrap()
        }
    };
    let attach = |stdin: bool, stdout: bool, stderr: bool| AttachOptions { stdin, stdout, stderr };
    let with_stdin = CreateOptions {
        stdin: true,
        ..Default::default()
    };

    // A container reading stdin: several sessions at once, input from each, output to each that
    // wants it and to the log.
    create(
        "reader",
        &[
            "sh",
            "-c",
            "while read x; do echo got $x; echo err $x >&2; done; echo eof",
        ],
        with_stdin.clone(),
    )
    .await;
    shim.start_container("reader").await.unwrap();
    let mut a = shim.attach("reader", &attach(true, true, true)).await.unwrap();
    assert_eq!((a.pid, a.tty), (0, false));
    let mut b = shim.attach("reader", &attach(false, true, false)).await.unwrap();
    a.input.stdin(b"one\n").await.unwrap();
    let (mut got_a, mut got_b) = (Collected::default(), Collected::default());
    read_until(&mut a.output, &mut got_a, |g| {
        g.out() == "got one\n" && g.err() == "err one\n"
    })
    .await;
    read_until(&mut b.output, &mut got_b, |g| g.out() == "got one\n").await;
    let log = pod.log_path("reader");
    wait_for_log(&log, "got one").await;
    wait_for_log(&log, "err one").await;
    // Its input ends (not stdin_once): the container's stdin stays open for the next session.
    a.input.close_stdin().await.unwrap();
    drop(a);
    let mut c = shim.attach("reader", &attach(true, false, false)).await.unwrap();
    c.input.stdin(b"two\n").await.unwrap();
    read_until(&mut b.output, &mut got_b, |g| g.out().ends_with("got two\n")).await;
    // A session that only shuts its input half down keeps getting output (and the container is
    // untouched).
    let ShimSession { input, output, .. } = c;
    drop(input);
    let mut d = shim.attach("reader", &attach(true, true, false)).await.unwrap();
    d.input.stdin(b"three\n").await.unwrap();
    read_until(&mut b.output, &mut got_b, |g| g.out().ends_with("got three\n")).await;
    assert_eq!(got_b.stderr, b"", "stderr was not asked for");
    // The exit, after the output, ends every session.
    shim.kill("reader", libc::SIGKILL, false).await.unwrap();
    let mut got_c = Collected::default();
    let mut output = output;
    read_until(&mut output, &mut got_c, |_| false).await;
    assert_eq!(
        (got_c.out(), got_c.exit, got_c.closed),
        (String::new(), Some(137), true)
    );
    read_until(&mut b.output, &mut got_b, |_| false).await;
    assert_eq!((got_b.exit, got_b.closed), (Some(137), true));
    let mut got_d = Collected::default();
    read_until(&mut d.output, &mut got_d, |_| false).await;
    assert_eq!((got_d.out(), got_d.exit), ("got three\n".into(), Some(137)));
    assert!(matches!(
        shim.attach("reader", &attach(false, true, true)).await,
        Err(ShimError::Remote {
            code: ErrorCode::FailedPrecondition,
            ..
        })
    ));

    // stdin_once: the first session that ends its input (by closing) closes stdin for good.
    let once = CreateOptions {
        stdin_once: true,
        ..with_stdin.clone()
    };
    create("once", &["sh", "-c", "cat; echo done; exec sleep 1000"], once.clone()).await;
    shim.start_container("once").await.unwrap();
    let mut a = shim.attach("once", &attach(true, true, false)).await.unwrap();
    let mut watch = shim.attach("once", &attach(false, true, false)).await.unwrap();
    a.input.stdin(b"x\n").await.unwrap();
    let mut got = Collected::default();
    read_until(&mut a.output, &mut got, |g| g.out() == "x\n").await;
    drop(a);
    let mut got = Collected::default();
    read_until(&mut watch.output, &mut got, |g| g.out() == "x\ndone\n").await;
    match shim.attach("once", &attach(true, true, false)).await {
        Err(ShimError::Remote {
            code: ErrorCode::FailedPrecondition,
            message,
        }) => assert!(message.contains("stdin_once"), "{message}"),
        other => panic!("{:?}", other.map(|s| s.pid)),
    }
    drop(watch);
    // Ended by CloseStdin, on a container attached before its start; the exit code.
    create("once2", &["sh", "-c", "cat; echo done; exit 7"], once).await;
    let mut a = shim.attach("once2", &attach(true, true, true)).await.unwrap();
    shim.start_container("once2").await.unwrap();
    a.input.stdin(b"y\n").await.unwrap();
    a.input.close_stdin().await.unwrap();
    let got = read_all(&mut a).await;
    assert_eq!((got.out(), got.exit, got.closed), ("y\ndone\n".into(), Some(7), true));
    let entries = log_entries(&pod.log_path("once2"));
    assert_eq!(entries, vec![entry("stdout", "F", "y"), entry("stdout", "F", "done")]);

    // A terminal: attached before the start, resized, output logged as stdout.
    let tty = CreateOptions {
        tty: true,
        ..with_stdin.clone()
    };
    create("tty", &["sh"], tty).await;
    let mut t = shim.attach("tty", &attach(true, true, false)).await.unwrap();
    assert!(t.tty);
    shim.start_container("tty").await.unwrap();
    t.input.resize(90, 20).await.unwrap();
    t.input.stdin(b"stty size; tty; echo hi-$((40+2)) >&2\n").await.unwrap();
    let mut got = Collected::default();
    read_until(&mut t.output, &mut got, |g| {
        let o = g.out();
        o.contains("20 90") && o.contains("/dev/pts/0") && o.contains("\nhi-42")
    })
    .await;
    t.input.stdin(b"exit 4\n").await.unwrap();
    read_until(&mut t.output, &mut got, |_| false).await;
    assert_eq!((got.exit, got.closed), (Some(4), true), "{got:?}");
    assert!(got.stderr.is_empty());
    let entries = log_entries(&pod.log_path("tty"));
    assert!(
        entries.iter().any(|e| e.0 == "stdout" && e.2.starts_with("hi-42")),
        "{entries:?}"
    );
    assert!(entries.iter().all(|e| e.0 == "stdout"), "{entries:?}");

    // A session that does not keep up with a container's output is dropped; the container and
    // its log go on.
    create(
        "flood",
        &[
            "sh",
            "-c",
            r#"sleep 0.3; head -c 20000000 /dev/zero | tr '\0' a; echo; echo end; exec sleep 1000"#,
        ],
        CreateOptions::default(),
    )
    .await;
    shim.start_container("flood").await.unwrap();
    let mut slow = shim.attach("flood", &attach(false, true, true)).await.unwrap();
    let log = pod.log_path("flood");
    wait_for_log(&log, "end").await;
    let mut got = Collected::default();
    read_session(&mut slow.output, &mut got, |_| false, true).await;
    assert!(got.closed && got.exit.is_none(), "{got:?}");
    assert!(got.stdout.len() < 20_000_000, "{} bytes", got.stdout.len());
    let (fds_before, rss_before) = (fd_count(shim_pid), status_kib(shim_pid, "VmRSS"));
    // Without stdin, none can be asked for.
    match shim.attach("flood", &attach(true, true, true)).await {
        Err(ShimError::Remote {
            code: ErrorCode::FailedPrecondition,
            message,
        }) => assert!(message.contains("without stdin"), "{message}"),
        other => panic!("{:?}", other.map(|s| s.pid)),
    }
    assert!(matches!(
        shim.attach("nope", &attach(false, true, true)).await,
        Err(ShimError::NotFound(_))
    ));

    // Attach/detach loops (issue 19, API memory class): 400 sessions opened and dropped at once
    // or after a yield leave the shim's descriptors and memory where they were (the baseline
    // is taken before the refused attaches: the shim closes their connections after answering).
    for i in 0..400 {
        let session = shim.attach("flood", &attach(false, true, true)).await.unwrap();
        if i % 2 == 1 {
            tokio::task::yield_now().await;
        }
        drop(session);
    }
    wait_fd_count(shim_pid, fds_before).await;
    let rss_after = status_kib(shim_pid, "VmRSS");
    eprintln!("figure: shim VmRSS {rss_before} KiB before 400 attach/detach cycles, {rss_after} KiB after");
    assert!(rss_after < rss_before + 2048, "{rss_before} -> {rss_after} KiB");

    for c in ["reader", "once", "once2", "tty", "flood"] {
        shim.delete_container(c).await.unwrap();
    }
    wait_fd_count(shim_pid, fds).await;
    pod.finish().await;
}
