//! `scute doctor` and the daemon's own check after an unclean stop, against a real store: each
//! kind of damage is made by hand (a blob whose bytes changed, a snapshot directory gone, a
//! directory, blob, snapshot and netns pin nothing records, a partial download), found by a
//! read-only run that changes nothing, removed by `--repair` (through the running daemon, and
//! with the daemon stopped), while the pod, its running container and the images they use go
//! on untouched.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use common::pod::{container, pod, Pod, BUSYBOX};
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
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let used: String = mountinfo
        .lines()
        .filter(|l| l.contains(daemon.dir().to_str().unwrap()) && l.contains("lowerdir="))
        .collect();
    std::fs::read_dir(daemon.root.join("snapshots"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.file_name().unwrap().len() == 64 && !used.contains(p.to_str().unwrap()))
        .collect()
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
    let mut pod = pod("doctor").await;
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

    // Found, through the running daemon, and nothing changed.
    let (code, out) = doctor(&pod.daemon, &[]);
    assert_eq!(code, 1, "{out}");
    let gone_chain = format!("sha256:{}", gone_snapshot.file_name().unwrap().to_string_lossy());
    for (kind, subject) in [
        ("corrupt-blob", busybox_id.clone()),
        ("missing-snapshot", gone_chain.clone()),
        ("damaged-image", HTTPD.to_string()),
        ("orphan-snapshot", format!("sha256:{}", "ab".repeat(32))),
        ("orphan-blob", format!("sha256:{}", sha256_hex(&stray))),
        ("partial-download", ingest.display().to_string()),
        ("orphan-dir", orphan_dir.display().to_string()),
        ("stale-netns", netns.display().to_string()),
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(&format!("{kind}\t{subject}\t"))),
            "{kind} {subject} not found:\n{out}"
        );
    }
    assert!(
        !out.contains(&fresh_dir.display().to_string()),
        "a fresh dir may be a create in flight: {out}"
    );
    assert!(!out.contains("repaired"), "{out}");
    assert!(config_blob.exists() && orphan_snapshot.exists() && ingest.exists() && orphan_dir.exists());
    assert!(scute_sys::mountinfo::is_mountpoint(&netns));
    let (code, quick) = doctor(&pod.daemon, &["--quick"]);
    assert_eq!(code, 1);
    assert!(
        quick.contains(&format!("corrupt-blob\t{busybox_id}")),
        "a document is read back even then: {quick}"
    );

    // Repaired, and what is in use goes on.
    let (code, out) = doctor(&pod.daemon, &["--repair"]);
    assert_eq!(code, 0, "{out}");
    assert_eq!(out.lines().filter(|l| l.ends_with("\trepaired")).count(), 8, "{out}");
    assert!(!config_blob.exists() && !orphan_snapshot.exists() && !ingest.exists() && !orphan_dir.exists());
    assert!(!netns.exists() && !scute_sys::mountinfo::is_mountpoint(&netns));
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
    pod.remove_all().await;
}
