//! CheckpointContainer end to end: CRIU dumps a running container through its pod's shim into an
//! archive in the anchors' layout (checkpointctl reads it), the container runs on; bad requests
//! and hosts without a working CRIU get FailedPrecondition or InvalidArgument saying why; a dump
//! CRIU refuses leaves the container running. Where `criu check` fails (this project's host: CRIU
//! 3.17 predates its kernel) the tests that need CRIU check the error and say they skipped.

mod common;

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::pod::{container, pod, pod_with, Pod};
use scute::api;
use tonic::Code;

async fn checkpoint(pod: &Pod, id: &str, location: &Path, timeout: i64) -> Result<(), tonic::Status> {
    pod.daemon
        .runtime()
        .await
        .checkpoint_container(api::CheckpointContainerRequest {
            container_id: id.into(),
            location: location.display().to_string(),
            timeout,
        })
        .await
        .map(|_| ())
}

/// Path → content of every regular file in a tar.
fn tar_files(bytes: &[u8]) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    for entry in tar::Archive::new(bytes).entries().unwrap() {
        let mut entry = entry.unwrap();
        if entry.header().entry_type() != tar::EntryType::Regular {
            continue;
        }
        let path = entry.path().unwrap().display().to_string();
        let mut content = Vec::new();
        entry.read_to_end(&mut content).unwrap();
        out.insert(path, content);
    }
    out
}

/// A PID namespace of its own, as the kubelet asks for every container (CRI's default is the
/// pod's, where a daemon the script starts would be the pause process's child, outside the
/// container's process tree that CRIU dumps).
fn own_pid_namespace(mut config: api::ContainerConfig) -> api::ContainerConfig {
    let linux = config.linux.get_or_insert_with(Default::default);
    let security = linux.security_context.get_or_insert_with(Default::default);
    security.namespace_options = Some(api::NamespaceOption {
        pid: api::NamespaceMode::Container as i32,
        ..Default::default()
    });
    config
}

/// The counter the container's script last wrote to its log.
fn last_count(pod: &Pod, name: &str) -> u64 {
    pod.log(name)
        .lines()
        .rev()
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0)
}

async fn wait_count_above(pod: &Pod, name: &str, above: u64) -> u64 {
    for _ in 0..600 {
        let n = last_count(pod, name);
        if n > above {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{name} never counted past {above}:\n{}", pod.log(name));
}

/// The process state letter of `pid` (`/proc/PID/stat`): `t` or `T` would be a container left
/// stopped by a dump.
fn proc_state(pid: i64) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    stat.rsplit(") ").next().unwrap().chars().next().unwrap()
}

#[tokio::test]
async fn checkpoint_requests_are_checked() {
    let pod = pod("ckpt-checks").await;
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("a.tar");

    let err = checkpoint(&pod, "no-such-container", &archive, 0).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let created = pod.create(container("created", "sleep 1000")).await.unwrap();
    for (location, why) in [
        (PathBuf::new(), "is required"),
        (PathBuf::from("relative.tar"), "absolute"),
        (dir.path().to_path_buf(), "is a directory"),
        (dir.path().join("missing/a.tar"), "does not exist"),
    ] {
        let err = checkpoint(&pod, &created, &location, 0).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{location:?}: {err:?}");
        assert!(err.message().contains(why), "{location:?}: {}", err.message());
    }
    let err = checkpoint(&pod, &created, &archive, 0).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("CONTAINER_CREATED"), "{}", err.message());

    let running = pod.run(container("running", "sleep 1000")).await;
    if let Err(why) = scute::criu::probe() {
        let err = checkpoint(&pod, &running, &archive, 0).await.unwrap_err();
        assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
        assert!(
            err.message().contains("needs a working CRIU") && err.message().contains(why.split(':').next().unwrap()),
            "{} / {why}",
            err.message()
        );
        eprintln!("no working CRIU here ({why}): FailedPrecondition checked");
    }
    assert!(!archive.exists(), "a failed checkpoint left {archive:?}");
    assert_eq!(
        std::fs::read_dir(dir.path()).unwrap().count(),
        0,
        "files left beside the archive"
    );
    pod.remove_all().await;
}

#[tokio::test]
async fn running_container_is_checkpointed_and_runs_on() {
    if let Err(why) = scute::criu::probe() {
        eprintln!("SKIPPED: needs a working CRIU: {why}");
        return;
    }
    // Its own network namespace (a CNI bridge), as a pod has.
    let pod = pod_with("ckpt-run", Some(vec![])).await;
    let script = "echo kept > /tmp/written; rm /etc/group; httpd -p 8080 -h /tmp; \
                  i=0; while true; do i=$((i+1)); echo $i; sleep 0.1; done";
    let id = pod.run(own_pid_namespace(container("counter", script))).await;
    let before = wait_count_above(&pod, "counter", 5).await;
    let fetch = ["wget", "-q", "-O", "-", "http://127.0.0.1:8080/written"];
    let served = pod.exec(&id, &fetch, 30).await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&served.stdout),
        "kept\n",
        "the server does not answer: {served:?}"
    );
    let pid = pod.daemon.container_info(&id).await["pid"].as_i64().unwrap();

    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("counter.tar");
    checkpoint(&pod, &id, &archive, 60).await.unwrap();

    // It runs on: the same process, not stopped, still counting.
    assert_eq!(pod.status(&id).await.state(), api::ContainerState::ContainerRunning);
    assert!(
        common::alive(pid as i32),
        "the container's process is gone after the checkpoint"
    );
    let after = wait_count_above(&pod, "counter", last_count(&pod, "counter") + 3).await;
    assert!(after > before);
    assert!(
        !matches!(proc_state(pid), 't' | 'T'),
        "left stopped: {}",
        proc_state(pid)
    );

    let bytes = std::fs::read(&archive).unwrap();
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&archive).unwrap().permissions().mode() & 0o777, 0o600);
    let files = tar_files(&bytes);
    let names: Vec<&str> = files.keys().map(String::as_str).collect();
    for name in [
        "config.dump",
        "spec.dump",
        "status.dump",
        "rootfs-diff.tar",
        "deleted.files",
        "dump.log",
        "stats-dump",
        "checkpoint/inventory.img",
        "container.log",
    ] {
        assert!(names.contains(&name), "{name} missing from the archive: {names:?}");
    }
    assert!(
        names.iter().any(|n| n.starts_with("checkpoint/pages-")),
        "no memory pages: {names:?}"
    );
    let config: serde_json::Value = serde_json::from_slice(&files["config.dump"]).unwrap();
    assert_eq!(config["id"], id.as_str());
    assert_eq!(config["runtime"], "scute");
    assert!(
        config["rootfsImageName"].as_str().unwrap().contains("busybox"),
        "{config}"
    );
    let spec: serde_json::Value = serde_json::from_slice(&files["spec.dump"]).unwrap();
    assert_eq!(spec["annotations"]["io.kubernetes.cri.container-name"], "counter");
    let status: serde_json::Value = serde_json::from_slice(&files["status.dump"]).unwrap();
    assert_eq!(status["metadata"]["name"], "counter");
    let deleted: Vec<String> = serde_json::from_slice(&files["deleted.files"]).unwrap();
    assert!(deleted.contains(&"/etc/group".to_string()), "{deleted:?}");
    let diff = tar_files(&files["rootfs-diff.tar"]);
    assert_eq!(
        diff.get("tmp/written").map(Vec::as_slice),
        Some(&b"kept\n"[..]),
        "{:?}",
        diff.keys()
    );

    // The field's reader of these archives.
    match common::kubelet::tools_dir()
        .map(|d| d.join("checkpointctl"))
        .filter(|p| p.is_file())
    {
        Some(checkpointctl) => {
            let out = std::process::Command::new(checkpointctl)
                .arg("show")
                .arg(&archive)
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "checkpointctl show: {text}{}",
                String::from_utf8_lossy(&out.stderr)
            );
            for want in ["counter", "scute", &id[..12]] {
                assert!(text.contains(want), "checkpointctl show lacks {want:?}:\n{text}");
            }
            eprintln!("{text}");
        }
        None => eprintln!("checkpointctl not available (no ../shared/tools): its reading not checked"),
    }

    // Restored as a new container in another pod (its own network namespace and address): the
    // counter carries on from where the checkpoint caught it, the server answers, the writable
    // layer is back.
    let at_checkpoint = String::from_utf8_lossy(&files["container.log"])
        .lines()
        .rev()
        .find_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .unwrap();
    let other = pod.run_sandbox(pod.sibling("ckpt-restored")).await;
    let mut config = own_pid_namespace(container("counter", "exit 3"));
    config.log_path = "restored.log".into();
    config.image.as_mut().unwrap().image = archive.display().to_string();
    let restored = pod
        .daemon
        .runtime()
        .await
        .create_container(api::CreateContainerRequest {
            pod_sandbox_id: other.clone(),
            config: Some(config),
            sandbox_config: Some(pod.sibling("ckpt-restored")),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;
    let status = pod.status(&restored).await;
    assert_eq!(status.state(), api::ContainerState::ContainerCreated);
    assert!(
        status.image.unwrap().image.contains("busybox"),
        "the restored container shows its image, not the archive"
    );
    pod.start(&restored).await;
    assert_eq!(
        pod.status(&restored).await.state(),
        api::ContainerState::ContainerRunning
    );
    // Its log: the checkpointed container's lines, then the restored process's, continuing.
    // The archive's log ends where the process stood when CRIU froze it (lines still in the pipe
    // then may be missing), so the restored process goes on at, or just after, the next count.
    let copied = String::from_utf8_lossy(&files["container.log"]).lines().count();
    let mut counts: Vec<u64> = Vec::new();
    for _ in 0..400 {
        counts = pod
            .log("restored")
            .lines()
            .filter_map(|l| l.rsplit(' ').next()?.parse().ok())
            .collect();
        if counts.len() > copied + 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        counts.len() > copied + 3,
        "the restored container does not count: {counts:?}"
    );
    let first = counts[copied];
    assert!(
        first > at_checkpoint && first <= at_checkpoint + 10,
        "the restored counter did not continue from {at_checkpoint}: {counts:?}"
    );
    assert!(counts[copied..].windows(2).all(|w| w[1] == w[0] + 1), "{counts:?}");
    let written = pod.exec(&restored, &["cat", "/tmp/written"], 30).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&written.stdout), "kept\n");
    let group = pod.exec(&restored, &["ls", "/etc/group"], 30).await.unwrap();
    assert_ne!(group.exit_code, 0, "/etc/group, deleted before the checkpoint, is back");
    let served = pod
        .exec(
            &restored,
            &["wget", "-q", "-O", "-", "http://127.0.0.1:8080/written"],
            30,
        )
        .await
        .unwrap();
    let seen = pod
        .exec(
            &restored,
            &[
                "sh",
                "-c",
                "ps; netstat -ltn; readlink /proc/1/ns/net /proc/self/ns/net",
            ],
            30,
        )
        .await
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&served.stdout),
        "kept\n",
        "the restored server does not answer: {}\n{}",
        String::from_utf8_lossy(&served.stderr),
        String::from_utf8_lossy(&seen.stdout)
    );
    // Stopped and removed like any container: nothing of it is left.
    let mut runtime = pod.daemon.runtime().await;
    runtime
        .stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: other.clone(),
        })
        .await
        .unwrap();
    runtime
        .remove_pod_sandbox(api::RemovePodSandboxRequest { pod_sandbox_id: other })
        .await
        .unwrap();
    pod.remove_all().await;
}

#[tokio::test]
async fn a_dump_cut_short_leaves_the_container_running() {
    if let Err(why) = scute::criu::probe() {
        eprintln!("SKIPPED: needs a working CRIU: {why}");
        return;
    }
    let pod = pod_with("ckpt-cut", Some(vec![])).await;
    // 512 MiB of touched memory (dd's buffer, dd blocked writing to a pipe nobody reads): CRIU
    // needs seconds to dump it, and the request gives it one. CRIU is killed mid-way.
    let script = "dd if=/dev/zero bs=512M count=1 2>/dev/null | sleep 100000 & \
                  i=0; while true; do i=$((i+1)); echo $i; sleep 0.1; done";
    let id = pod.run(container("big", script)).await;
    wait_count_above(&pod, "big", 20).await;
    let pid = pod.daemon.container_info(&id).await["pid"].as_i64().unwrap();
    let dd_state = || async {
        let out = pod
            .exec(
                &id,
                &["sh", "-c", "grep -E '^(State|VmRSS)' /proc/$(pidof dd)/status"],
                30,
            )
            .await
            .unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let before = dd_state().await;
    assert!(before.contains("VmRSS"), "dd is not holding its memory: {before}");
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("big.tar");
    let started = std::time::Instant::now();
    let err = checkpoint(&pod, &id, &archive, 1).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert!(err.message().contains("took longer than 1s"), "{}", err.message());
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the limit was not kept: {:?}",
        started.elapsed()
    );
    assert!(!archive.exists());
    // Everything runs on: the container, its counter, and dd (not left stopped by CRIU).
    assert_eq!(pod.status(&id).await.state(), api::ContainerState::ContainerRunning);
    assert!(
        !matches!(proc_state(pid), 't' | 'T'),
        "left stopped: {}",
        proc_state(pid)
    );
    wait_count_above(&pod, "big", last_count(&pod, "big") + 3).await;
    let after = dd_state().await;
    // Blocked writing to its pipe (S), or caught in the restarted write (R): not stopped.
    assert!(
        after.contains("State:\tS") || after.contains("State:\tR"),
        "dd after the cut dump: {after}"
    );
    // And nothing of CRIU's is left running.
    let criu = std::process::Command::new("pgrep")
        .args(["-x", "criu"])
        .output()
        .unwrap();
    assert!(
        criu.stdout.is_empty(),
        "criu left running: {}",
        String::from_utf8_lossy(&criu.stdout)
    );
    pod.remove_all().await;
}

/// A tar of `files` (name, content).
fn tar_of(files: &[(&str, &[u8])]) -> Vec<u8> {
    let mut tar = tar::Builder::new(Vec::new());
    for (name, content) in files {
        let mut header = tar::Header::new_gnu();
        header.set_size(content.len() as u64);
        header.set_mode(0o600);
        header.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut header, name, *content).unwrap();
    }
    tar.into_inner().unwrap()
}

#[tokio::test]
async fn restore_requests_are_checked() {
    let pod = pod("ckpt-restore-checks").await;
    let dir = tempfile::tempdir().unwrap();
    let create = |image: PathBuf| {
        let mut config = container("restored", "exit 3");
        config.image.as_mut().unwrap().image = image.display().to_string();
        pod.create(config)
    };
    let config_dump = |image: &str| {
        serde_json::to_vec(&serde_json::json!({
            "id": "x", "name": "x", "rootfsImageName": image, "createdTime": "2026-11-28T00:00:00Z",
        }))
        .unwrap()
    };
    let not_tar = dir.path().join("not.tar");
    std::fs::write(&not_tar, "hello").unwrap();
    let no_image = dir.path().join("no-image.tar");
    std::fs::write(
        &no_image,
        tar_of(&[("config.dump", &config_dump("example.com/nowhere:1"))]),
    )
    .unwrap();
    let no_criu = dir.path().join("no-criu.tar");
    std::fs::write(&no_criu, tar_of(&[("config.dump", &config_dump(common::pod::BUSYBOX))])).unwrap();
    let hostile = dir.path().join("hostile.tar");
    let climbing = tar_of(&[
        ("config.dump", &config_dump(common::pod::BUSYBOX)),
        ("checkpoint/inventory.img", b"x"),
    ]);
    // A CRIU image name with a directory in it, written raw (tar's builder refuses such names).
    let mut raw = climbing.clone();
    let at = raw.windows(24).position(|w| w == b"checkpoint/inventory.img").unwrap();
    raw[at..at + 24].copy_from_slice(b"checkpoint/../../escape0");
    // (the header checksum is recomputed by hand: it covers the name)
    let header = &mut raw[512 * 2..512 * 3];
    header[148..156].copy_from_slice(b"        ");
    let sum: u32 = header.iter().map(|b| *b as u32).sum();
    header[148..156].copy_from_slice(format!("{sum:06o}\0 ").as_bytes());
    std::fs::write(&hostile, raw).unwrap();

    for (archive, code, why) in [
        (&not_tar, Code::InvalidArgument, "config.dump"),
        (&no_image, Code::NotFound, "pull example.com/nowhere:1 first"),
        (&no_criu, Code::InvalidArgument, "no CRIU images"),
        (&hostile, Code::InvalidArgument, "not a clean relative path"),
    ] {
        let err = create(archive.clone()).await.unwrap_err();
        assert_eq!(err.code(), code, "{archive:?}: {err:?}");
        assert!(err.message().contains(why), "{archive:?}: {}", err.message());
    }
    assert!(pod.containers().await.is_empty(), "a refused restore left a container");
    assert!(!dir.path().join("escape0").exists());
    pod.remove_all().await;
}

/// Every cgroup directory whose name holds `id`, on any hierarchy.
fn cgroups_named(id: &str) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    let mut stack = vec![std::path::PathBuf::from("/sys/fs/cgroup")];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for entry in entries.flatten() {
            if entry.file_type().is_ok_and(|t| t.is_dir()) {
                if entry.file_name().to_string_lossy().contains(id) {
                    found.push(entry.path());
                }
                stack.push(entry.path());
            }
        }
    }
    found
}

#[tokio::test]
async fn a_restore_criu_refuses_leaves_nothing() {
    if let Err(why) = scute::criu::probe() {
        eprintln!("SKIPPED: needs a working CRIU: {why}");
        return;
    }
    let pod = pod_with("ckpt-bad-restore", Some(vec![])).await;
    let id = pod
        .run(own_pid_namespace(container(
            "counter",
            "i=0; while true; do i=$((i+1)); echo $i; sleep 0.1; done",
        )))
        .await;
    wait_count_above(&pod, "counter", 5).await;
    let dir = tempfile::tempdir().unwrap();
    let archive = dir.path().join("counter.tar");
    checkpoint(&pod, &id, &archive, 60).await.unwrap();
    // The same archive with CRIU's inventory replaced by garbage.
    let mut files: Vec<(String, Vec<u8>)> = tar_files(&std::fs::read(&archive).unwrap()).into_iter().collect();
    for (name, content) in &mut files {
        if name == "checkpoint/inventory.img" {
            *content = b"not an inventory".to_vec();
        }
    }
    let broken = dir.path().join("broken.tar");
    let named: Vec<(&str, &[u8])> = files.iter().map(|(n, c)| (n.as_str(), c.as_slice())).collect();
    std::fs::write(&broken, tar_of(&named)).unwrap();

    let mut config = own_pid_namespace(container("restored", "exit 3"));
    config.image.as_mut().unwrap().image = broken.display().to_string();
    let restored = pod.create(config).await.unwrap();
    let err = pod
        .daemon
        .runtime()
        .await
        .start_container(api::StartContainerRequest {
            container_id: restored.clone(),
        })
        .await
        .unwrap_err();
    assert!(err.message().contains("CRIU"), "{err:?}");
    let status = pod.status(&restored).await;
    assert_eq!(status.state(), api::ContainerState::ContainerExited);
    assert_eq!(status.reason, "StartError");
    assert!(
        cgroups_named(&restored).is_empty(),
        "cgroups left: {:?}",
        cgroups_named(&restored)
    );
    // The original is untouched.
    assert_eq!(pod.status(&id).await.state(), api::ContainerState::ContainerRunning);
    pod.remove_all().await;
    assert!(
        cgroups_named(&restored).is_empty(),
        "cgroups left: {:?}",
        cgroups_named(&restored)
    );
}
