//! `scute doctor` and the daemon's own check after an unclean stop, against a real store: each
//! kind of damage is made by hand (a blob whose bytes changed, a snapshot directory gone, a
//! directory, blob, snapshot and netns pin nothing records, a partial download), found by a
//! read-only run that changes nothing, removed by `--repair` (through the running daemon, and
//! with the daemon stopped), while the pod, its running container and the images they use go
//! on untouched.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::pod::{container, pod, pod_with, Pod, BUSYBOX};
use common::Daemon;
use scute::api;
use sha2::{Digest as _, Sha256};

const HTTPD: &str = "registry.k8s.io/e2e-test-images/httpd:2.4.39-4";

/// `scute doctor --config <the daemon's> args`: exit code and output.
fn doctor(daemon: &Daemon, args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(common::SCUTE)
        .arg("doctor")
        .arg("--config")
        .arg(&daemon.config_path)
        .args(args)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("scute doctor {args:?} -> {:?}\n{text}", out.status.code());
    (out.status.code().unwrap_or(-1), text)
}

/// Back-dates `path` by two hours (past the running daemon's one-minute grace).
fn age(path: &Path) {
    let file = std::fs::File::open(path).unwrap();
    file.set_modified(SystemTime::now() - Duration::from_secs(7200))
        .unwrap();
}

fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// Snapshot dirs no overlay mount under the daemon's dir uses (httpd's, here).
fn unused_snapshots(daemon: &Daemon) -> Vec<PathBuf> {
    // An overlay names its layers through links `l<N>` beside its mount point (docs/design.md):
    // the layers of every overlay of this daemon mounted now.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let used: Vec<PathBuf> = mountinfo
        .lines()
        .filter(|l| l.contains(" - overlay "))
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|mount_point| mount_point.starts_with(daemon.dir().to_str().unwrap()))
        .filter_map(|mount_point| std::fs::read_dir(Path::new(mount_point).parent()?).ok())
        .flat_map(|entries| entries.flatten())
        .filter(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.len() > 1 && name.starts_with('l') && name[1..].bytes().all(|b| b.is_ascii_digit())
        })
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .collect();
    std::fs::read_dir(daemon.root.join("snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().len() == 64 && !used.iter().any(|u| u.starts_with(p)))
        .collect()
}

/// Where the test's pods get their cgroups (the default parent, /scute), in the pids
/// hierarchy of a v1 host or the unified one.
fn cgroup_parent_dir() -> PathBuf {
    let root = Path::new("/sys/fs/cgroup");
    let dir = if scute_sys::cgroupfs::is_cgroup2(root) {
        root.join("scute")
    } else {
        root.join("pids/scute")
    };
    assert!(dir.is_dir(), "{} exists while a pod runs", dir.display());
    dir
}

/// A cgroup's path as doctor names it: below its hierarchy's root.
fn cgroup_path(dir: &Path) -> String {
    let path = dir.to_str().unwrap();
    let below = path.strip_prefix("/sys/fs/cgroup/pids").unwrap_or(path);
    below.strip_prefix("/sys/fs/cgroup").unwrap_or(below).to_string()
}

/// The pod's cached CNI attachment copied for pod `id` (which nothing records), with an address
/// leased to it in the pod network's host-local data dir: (the cache file, the lease).
fn forge_attachment(pod: &Pod, id: &str) -> (PathBuf, PathBuf) {
    let results = pod.daemon.state.join("cni/results");
    let own = std::fs::read_dir(&results)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().ends_with(&format!("-{}-eth0", pod.id)))
        .expect("the pod's attachment is cached");
    let mut cached: serde_json::Value = serde_json::from_slice(&std::fs::read(&own).unwrap()).unwrap();
    cached["containerId"] = id.into();
    let name = own.file_name().unwrap().to_string_lossy().replace(&pod.id, id);
    let forged = results.join(name);
    std::fs::write(&forged, cached.to_string()).unwrap();
    let ipam = pod.daemon.dir().join("cni-ipam");
    let network = std::fs::read_dir(&ipam).unwrap().flatten().next().unwrap().path();
    let own_lease = std::fs::read_dir(&network)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| {
            p.file_name()
                .unwrap()
                .to_string_lossy()
                .parse::<std::net::Ipv4Addr>()
                .is_ok()
        })
        .expect("the pod holds a lease");
    let address: std::net::Ipv4Addr = own_lease.file_name().unwrap().to_str().unwrap().parse().unwrap();
    let [a, b, c, _] = address.octets();
    let lease = network.join(std::net::Ipv4Addr::new(a, b, c, 250).to_string());
    std::fs::write(&lease, format!("{id}\r\neth0")).unwrap();
    (forged, lease)
}

/// SIGKILLs the pod's shim (found by its state dir) and the processes it started.
fn kill_shim_and_pause(pod: &Pod) {
    let shim_dir = pod.daemon.state.join("shims").join(&pod.id[..32]);
    let processes: Vec<(i32, i32, Vec<u8>)> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let pid: i32 = e.file_name().to_str()?.parse().ok()?;
            let status = std::fs::read_to_string(e.path().join("status")).ok()?;
            let ppid = status
                .lines()
                .find_map(|l| l.strip_prefix("PPid:"))?
                .trim()
                .parse()
                .ok()?;
            Some((pid, ppid, std::fs::read(e.path().join("cmdline")).ok()?))
        })
        .collect();
    let wanted = shim_dir.to_str().unwrap().as_bytes();
    let shim = processes
        .iter()
        .find(|(_, _, cmdline)| cmdline.split(|b| *b == 0).any(|a| a == wanted))
        .map(|(pid, _, _)| *pid)
        .expect("the pod's shim runs");
    // (A child listed above may have exited since: gone is as good as killed.)
    let kill =
        |pid: i32| match nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL) {
            Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
            Err(e) => panic!("killing {pid}: {e}"),
        };
    for (pid, _, _) in processes.iter().filter(|(_, ppid, _)| *ppid == shim) {
        kill(*pid);
    }
    kill(shim);
    let socket = shim_dir.join("shim.sock");
    for _ in 0..100 {
        if std::os::unix::net::UnixStream::connect(&socket).is_err() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    panic!("the shim still answers");
}

async fn image_names(pod: &Pod) -> Vec<String> {
    pod.daemon
        .images()
        .await
        .list_images(api::ListImagesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .images
        .into_iter()
        .flat_map(|i| i.repo_tags)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn doctor_finds_and_repairs_each_kind_of_damage_and_leaves_what_is_in_use() {
    let mut pod = pod_with("doctor", Some(vec![])).await;
    let busybox_id = pod.pull(BUSYBOX).await;
    let id = pod.run(container("c", "echo up; exec sleep 3600")).await;
    pod.wait_log("c", "up").await;
    pod.pull(HTTPD).await;
    let (root, state) = (pod.daemon.root.clone(), pod.daemon.state.clone());

    let (code, out) = doctor(&pod.daemon, &[]);
    assert_eq!(code, 0, "a store in use is clean: {out}");
    assert!(out.contains("no problem found"), "{out}");

    // The damage.
    let config_blob = root
        .join("content/blobs/sha256")
        .join(busybox_id.trim_start_matches("sha256:"));
    let mut bytes = std::fs::read(&config_blob).unwrap();
    bytes[0] ^= 0x20;
    std::fs::write(&config_blob, &bytes).unwrap();
    let unused = unused_snapshots(&pod.daemon);
    assert!(!unused.is_empty(), "httpd has layers of its own");
    let gone_snapshot = unused[0].clone();
    std::fs::remove_dir_all(&gone_snapshot).unwrap();
    let orphan_snapshot = root.join("snapshots").join("ab".repeat(32));
    std::fs::create_dir_all(orphan_snapshot.join("fs")).unwrap();
    std::fs::write(orphan_snapshot.join("fs/file"), vec![1u8; 1 << 20]).unwrap();
    let stray = b"a blob nothing references".to_vec();
    let orphan_blob = root.join("content/blobs/sha256").join(sha256_hex(&stray));
    std::fs::write(&orphan_blob, &stray).unwrap();
    let ingest = root.join("content/ingest").join("cd".repeat(32));
    std::fs::write(&ingest, vec![2u8; 1 << 20]).unwrap();
    let orphan_dir = root.join("containers").join("ef".repeat(32));
    std::fs::create_dir_all(orphan_dir.join("bundle")).unwrap();
    std::fs::write(orphan_dir.join("bundle/config.json"), "{}").unwrap();
    age(&orphan_dir);
    let fresh_dir = root.join("containers").join("01".repeat(32));
    std::fs::create_dir_all(&fresh_dir).unwrap();
    let netns = state.join("netns/stale-pod");
    std::fs::create_dir_all(state.join("netns")).unwrap();
    std::fs::write(&netns, "").unwrap();
    nix::mount::mount(
        Some("/proc/self/ns/net"),
        &netns,
        None::<&str>,
        nix::mount::MsFlags::MS_BIND,
        None::<&str>,
    )
    .unwrap();

    // Cgroups named for members no record knows, as a crash between libcontainer making them and
    // the records being written leaves them: a pod's, with a process nothing would stop, and a
    // container's, each with its shim state dir (a pod's shim dir, a container's dir in one).
    // And one with no trace in this daemon's state: another daemon's, whose shim died.
    let cgroups = cgroup_parent_dir();
    // A pod's shim cgroup (`scute-shim-<32 hex>`) whose pod no record knows, likewise.
    let (busy_id, empty_id, shim_pod) = (
        scute::ids::random_id(),
        scute::ids::random_id(),
        scute::ids::random_id(),
    );
    let (busy_cgroup, empty_cgroup, foreign_cgroup, shim_cgroup) = (
        cgroups.join(format!("scute-{busy_id}")),
        cgroups.join(format!("scute-{empty_id}")),
        cgroups.join(format!("scute-{}", scute::ids::random_id())),
        cgroups.join(format!("scute-shim-{}", &shim_pod[..32])),
    );
    let shims = state.join("shims");
    std::fs::create_dir_all(shims.join(&busy_id[..32])).unwrap();
    std::fs::create_dir_all(shims.join(&busy_id[..32]).join("containers").join(&empty_id)).unwrap();
    std::fs::create_dir_all(shims.join(&shim_pod[..32])).unwrap();
    let mut stray_process = std::process::Command::new("sleep").arg("3600").spawn().unwrap();
    for dir in [&busy_cgroup, &empty_cgroup, &foreign_cgroup, &shim_cgroup] {
        std::fs::create_dir(dir).unwrap();
        age(dir);
    }
    std::fs::write(busy_cgroup.join("cgroup.procs"), stray_process.id().to_string()).unwrap();
    // The network of a pod no record knows: its attachment still cached, its address leased
    // (as the pod's own are), and a lease in scute's default network with no attachment.
    let (attachment, lease) = forge_attachment(&pod, &"56".repeat(32));
    let default_lease = state.join("cni/networks/scute/10.88.0.7");
    std::fs::create_dir_all(default_lease.parent().unwrap()).unwrap();
    std::fs::write(&default_lease, format!("{}\r\neth0", "78".repeat(32))).unwrap();
    for path in [&attachment, &lease, &default_lease] {
        age(path);
    }

    // Found, through the running daemon, and nothing changed.
    let (code, out) = doctor(&pod.daemon, &[]);
    assert_eq!(code, 1, "{out}");
    let gone_chain = format!("sha256:{}", gone_snapshot.file_name().unwrap().to_string_lossy());
    let damage = [
        ("corrupt-blob", busybox_id.clone()),
        ("missing-snapshot", gone_chain.clone()),
        ("damaged-image", HTTPD.to_string()),
        ("orphan-snapshot", format!("sha256:{}", "ab".repeat(32))),
        ("orphan-blob", format!("sha256:{}", sha256_hex(&stray))),
        ("partial-download", ingest.display().to_string()),
        ("orphan-dir", orphan_dir.display().to_string()),
        ("stale-netns", netns.display().to_string()),
        ("orphan-cgroup", cgroup_path(&busy_cgroup)),
        ("orphan-cgroup", cgroup_path(&empty_cgroup)),
        ("orphan-cgroup", cgroup_path(&shim_cgroup)),
        ("stale-attachment", attachment.display().to_string()),
        ("stale-lease", default_lease.display().to_string()),
    ];
    for (kind, subject) in &damage {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{kind}\t{subject}\t"))),
            "{kind} {subject} not found:\n{out}"
        );
    }
    assert!(
        out.contains("1 process(es) nothing can stop"),
        "the cgroup's process is counted: {out}"
    );
    assert!(
        !out.contains(&cgroup_path(&foreign_cgroup)),
        "another daemon's cgroup is not this one's to report: {out}"
    );
    assert!(
        !out.contains(&fresh_dir.display().to_string()),
        "a fresh dir may be a create in flight: {out}"
    );
    assert!(!out.contains("repaired"), "{out}");
    assert!(config_blob.exists() && orphan_snapshot.exists() && ingest.exists() && orphan_dir.exists());
    assert!(scute_sys::mountinfo::is_mountpoint(&netns));
    assert!(
        stray_process.try_wait().unwrap().is_none(),
        "a read-only run kills nothing"
    );
    assert!(busy_cgroup.exists() && empty_cgroup.exists() && shim_cgroup.exists());
    assert!(attachment.exists() && lease.exists());
    let (code, quick) = doctor(&pod.daemon, &["--quick"]);
    assert_eq!(code, 1);
    assert!(
        quick.contains(&format!("corrupt-blob\t{busybox_id}")),
        "a document is read back even then: {quick}"
    );

    // Repaired, and what is in use goes on.
    let (code, out) = doctor(&pod.daemon, &["--repair"]);
    assert_eq!(code, 0, "{out}");
    for (kind, subject) in &damage {
        assert!(
            out.lines()
                .any(|l| l.starts_with(&format!("{kind}\t{subject}\t")) && l.ends_with("\trepaired")),
            "{kind} {subject} not repaired:\n{out}"
        );
    }
    assert!(!config_blob.exists() && !orphan_snapshot.exists() && !ingest.exists() && !orphan_dir.exists());
    assert!(!netns.exists() && !scute_sys::mountinfo::is_mountpoint(&netns));
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(
        stray_process.wait().unwrap().signal(),
        Some(9),
        "the stray process is killed"
    );
    assert!(!busy_cgroup.exists() && !empty_cgroup.exists() && !shim_cgroup.exists());
    assert!(foreign_cgroup.exists(), "another daemon's cgroup is left alone");
    std::fs::remove_dir(&foreign_cgroup).unwrap();
    assert!(!attachment.exists(), "the attachment's DEL ran");
    assert!(!lease.exists(), "host-local released its address in that DEL");
    assert!(!default_lease.exists());
    assert!(fresh_dir.exists());
    let (code, out) = doctor(&pod.daemon, &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("no problem found"), "{out}");
    assert_eq!(
        pod.status(&id).await.state,
        api::ContainerState::ContainerRunning as i32
    );
    let out = pod.exec(&id, &["cat", "/etc/hostname"], 10).await.unwrap();
    assert_eq!(out.exit_code, 0, "{out:?}");
    let names = image_names(&pod).await;
    assert!(names.iter().any(|n| n == BUSYBOX), "{names:?}");
    assert!(
        !names.iter().any(|n| n == HTTPD),
        "the damaged image is dropped: {names:?}"
    );
    pod.pull(HTTPD).await;

    // With the daemon stopped, doctor reads the store itself: a leftover is found at once.
    pod.daemon.stop();
    std::fs::create_dir_all(root.join("sandboxes").join("23".repeat(32))).unwrap();
    let (code, out) = doctor(&pod.daemon, &["--repair"]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains(&format!(
            "orphan-dir\t{}",
            root.join("sandboxes").join("23".repeat(32)).display()
        )),
        "{out}"
    );
    std::fs::remove_dir(&fresh_dir).unwrap_or_default();
    let (code, out) = doctor(&pod.daemon, &[]);
    assert_eq!(code, 0, "{out}");
    pod.daemon.start_again();
    assert_eq!(
        pod.status(&id).await.state,
        api::ContainerState::ContainerRunning as i32
    );
    pod.remove_all().await;
}

/// A daemon killed (a crash, a power cut) leaves its running marker: the next start runs the
/// cheap check and repairs what the crash left (here a snapshot directory lost with it, so its
/// image is dropped and pulls again), keeping partial downloads to resume.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_after_a_crash_settles_the_store() {
    let mut pod = pod("crash").await;
    pod.pull(HTTPD).await;
    let root = pod.daemon.root.clone();
    pod.daemon.kill();
    assert!(root.join("running").exists());
    // The pod's shim and pause died too (a power cut takes everything): the stopped daemon's
    // doctor sees a pod recorded ready that no shim serves.
    kill_shim_and_pause(&pod);
    let (code, out) = doctor(&pod.daemon, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains(&format!("dead-shim\t{}\t", pod.id)), "{out}");
    let unused = unused_snapshots(&pod.daemon);
    std::fs::remove_dir_all(&unused[0]).unwrap();
    let ingest = root.join("content/ingest").join("cd".repeat(32));
    std::fs::write(&ingest, vec![2u8; 4096]).unwrap();
    pod.daemon.start_again();
    let log = pod.daemon.log();
    assert!(
        log.contains("after an unclean stop") && log.contains("missing-snapshot"),
        "{log}"
    );
    assert!(!image_names(&pod).await.iter().any(|n| n == HTTPD));
    assert!(ingest.exists(), "a partial download stays to resume");
    let (_, out) = doctor(&pod.daemon, &[]);
    assert!(!out.contains("dead-shim"), "the start marked the pod NotReady: {out}");
    pod.pull(HTTPD).await;

    // A clean stop leaves no marker: the next start checks nothing.
    pod.daemon.stop();
    assert!(!root.join("running").exists());
    pod.daemon.start_again();
    assert_eq!(
        pod.daemon
            .log()
            .matches("checked the store after an unclean stop")
            .count(),
        1
    );
    // Its pause died with the shim, and RemovePodSandbox removes the pause's cgroup itself.
    let pause_cgroup = cgroup_parent_dir().join(format!("scute-{}", pod.id));
    assert!(pause_cgroup.exists(), "{}", pause_cgroup.display());
    pod.remove_all().await;
    assert!(!pause_cgroup.exists(), "{} left behind", pause_cgroup.display());
}

/// The largest regular file under `dirs` (a layer file with data in it).
fn largest_file(dirs: &[PathBuf]) -> (PathBuf, u64) {
    let mut best = (PathBuf::new(), 0);
    let mut stack = dirs.to_vec();
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let meta = entry.metadata().unwrap();
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() && meta.len() > best.1 {
                best = (entry.path(), meta.len());
            }
        }
    }
    assert!(best.1 > 0, "no file with data under {dirs:?}");
    best
}

/// What a power cut right after a pull leaves when a layer's data never reached the disk
/// (containerd#8895): a file of an unpacked layer emptied, its name and mode intact. The
/// snapshot's tally, taken at commit, finds it: `scute doctor` reports it, and the daemon's next
/// start in another boot (as after a real power cut) drops the snapshot and its image, so the
/// next pull unpacks the layer again. After the daemon alone was killed (the same boot: the
/// page cache kept what it wrote) the start checks records only and walks no snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_start_after_a_power_cut_finds_layer_files_the_disk_lost() {
    let mut pod = pod("powercut").await;
    // Busybox's layers in use by a container, httpd's not: the victim is one of httpd's.
    pod.run(container("sleeper", "exec sleep 100000")).await;
    pod.pull(HTTPD).await;
    let root = pod.daemon.root.clone();
    let (victim, size) = largest_file(&unused_snapshots(&pod.daemon));

    pod.daemon.kill();
    std::fs::File::options()
        .write(true)
        .open(&victim)
        .unwrap()
        .set_len(0)
        .unwrap();
    pod.daemon.start_again();
    let log = pod.daemon.log();
    let found_at_start = |log: &str| {
        log.lines()
            .any(|l| l.contains("after an unclean stop") && l.contains("damaged-snapshot"))
    };
    assert!(log.contains("machine_went_down=false"), "{log}");
    assert!(!found_at_start(&log), "{log}");
    // Found by the operator's doctor, which changes nothing without --repair.
    let (code, out) = doctor(&pod.daemon, &[]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("damaged-snapshot\tsha256:"), "{out}");
    assert!(out.contains(&format!("damaged-image\t{HTTPD}\t")), "{out}");
    assert!(image_names(&pod).await.iter().any(|n| n == HTTPD));

    // The machine goes down: everything is killed, and the marker holds another boot's ID.
    pod.daemon.kill();
    kill_shim_and_pause(&pod);
    std::fs::write(root.join("running"), "00000000-0000-4000-8000-000000000000\n").unwrap();
    pod.daemon.start_again();
    let log = pod.daemon.log();
    assert!(log.contains("machine_went_down=true"), "{log}");
    assert!(found_at_start(&log), "{log}");
    assert!(!victim.exists(), "the damaged snapshot is removed");
    assert!(!image_names(&pod).await.iter().any(|n| n == HTTPD));
    assert!(
        image_names(&pod).await.iter().any(|n| n == BUSYBOX),
        "the pod's image is intact"
    );
    pod.pull(HTTPD).await;
    assert_eq!(std::fs::metadata(&victim).unwrap().len(), size, "unpacked again");
    let (code, out) = doctor(&pod.daemon, &[]);
    assert_eq!(code, 0, "{out}");
    pod.remove_all().await;
}
