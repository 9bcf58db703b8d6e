//! scute-shim end to end (root): the daemon's shim client spawns a real shim, which runs the
//! repository's static pause binary in new namespaces through libcontainer; then everything is
//! torn down and nothing may be left (process, cgroup, mount, files).

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use scute::shim_client::{read_exit_file, ContainerStatus, ShimClient, ShimError, SpawnOptions};

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
    let cgroups: Vec<String> = ["pause", "p2", "p3", "bad"]
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
    };
    let shim = ShimClient::spawn(&opts).await.expect("spawn shim");
    let shim_pid = shim.shim_pid().unwrap();
    assert_eq!(shim.sandbox_id(), "sb-test");

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
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
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

    // Nothing left: cgroups, mounts, files other than the log.
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
