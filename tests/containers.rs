//! Containers as a user sees them: busybox containers in real pods through the shim and
//! libcontainer: process, logs, exec, exit codes, stop grace, user/env/workdir, read-only rootfs,
//! daemon restarts, and cleanup.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::pod::{container, pod, pod_full, pod_with, Pod, BUSYBOX};
use scute::api;
use tonic::Code;

fn alive(pid: i64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.split(") ").nth(1).unwrap_or("").starts_with('Z'))
        .unwrap_or(false)
}

/// What a container holds on the node: the mounts under its directory and its cgroup's
/// directories (one per hierarchy that has it).
fn held_on_the_node(pod: &Pod, id: &str, cgroups_path: &str) -> (Vec<String>, Vec<PathBuf>) {
    let rel = scute::cgroups::dir(cgroups_path);
    let cgroups = common::kubelet::cgroup_hierarchies()
        .into_iter()
        .map(|h| h.join(rel.trim_start_matches('/')))
        .filter(|d| d.exists())
        .collect();
    (
        common::mounts_under(&pod.daemon.root.join("containers").join(id)),
        cgroups,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lifecycle_logs_exec_and_stop() {
    let pod = pod("life").await;
    let id = pod
        .run(container("main", "echo hello; echo oops >&2; exec sleep 3600"))
        .await;
    let status = pod.status(&id).await;
    assert_eq!(status.state(), api::ContainerState::ContainerRunning);
    assert!(status.started_at > 0 && status.created_at > 0);
    assert!(status.image_ref.starts_with("sha256:"));
    let log = pod.wait_log("main", "stderr F oops").await;
    assert!(log.lines().any(|l| l.ends_with(" stdout F hello")), "{log}");
    // CRI log timestamps are RFC 3339 with nanoseconds.
    let ts = log.lines().next().unwrap().split(' ').next().unwrap();
    assert!(ts.ends_with('Z') && ts.contains('T') && ts.len() >= 20, "{ts}");

    // ExecSync: output and exit code; a host-network pod has the node's hostname.
    let out = pod
        .exec(&id, &["sh", "-c", "hostname; echo err >&2; exit 3"], 5)
        .await
        .unwrap();
    let node = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), node);
    assert_eq!(String::from_utf8_lossy(&out.stderr), "err\n");
    assert_eq!(out.exit_code, 3);
    let err = pod.exec(&id, &["sleep", "30"], 1).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");

    // `sleep` ignores nothing: SIGTERM stops it within the grace period.
    let info = pod.daemon.container_info(&id).await;
    let pid = info["pid"].as_i64().unwrap();
    assert!(alive(pid));
    let cgroups_path = info["cgroupsPath"].as_str().unwrap().to_string();
    let (mounts, cgroups) = held_on_the_node(&pod, &id, &cgroups_path);
    assert!(!mounts.is_empty() && !cgroups.is_empty(), "{mounts:?} {cgroups:?}");
    pod.daemon
        .runtime()
        .await
        .stop_container(api::StopContainerRequest {
            container_id: id.clone(),
            timeout: 10,
        })
        .await
        .unwrap();
    // Released at its exit, before StopContainer answered (containerd deletes the task at exit):
    // no mount, no cgroup. Its status, log and writable layer stay until it is removed.
    assert_eq!(held_on_the_node(&pod, &id, &cgroups_path), (vec![], vec![]));
    let status = pod.status(&id).await;
    assert_eq!(status.state(), api::ContainerState::ContainerExited);
    assert_eq!(status.exit_code, 128 + 15);
    assert_eq!(status.reason, "Error");
    assert!(status.finished_at >= status.started_at);
    assert!(!alive(pid));
    assert!(pod.log("main").contains(" stdout F hello"));
    let stats = pod
        .daemon
        .runtime()
        .await
        .container_stats(api::ContainerStatsRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .stats
        .unwrap();
    assert!(stats.writable_layer.is_some_and(|w| w.used_bytes.is_some()));
    let err = pod.exec(&id, &["true"], 1).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);

    // Remove is idempotent; unknown IDs succeed on stop/remove and are NotFound on status.
    for _ in 0..2 {
        pod.daemon
            .runtime()
            .await
            .remove_container(api::RemoveContainerRequest {
                container_id: id.clone(),
            })
            .await
            .unwrap();
    }
    let err = pod
        .daemon
        .runtime()
        .await
        .container_status(api::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: false,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound);
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exit_codes_reasons_and_grace() {
    let pod = pod("exits").await;
    let ok = pod.run(container("ok", "exit 0")).await;
    let bad = pod.run(container("bad", "exit 7")).await;
    let s = pod.wait_exited(&ok).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (0, "Completed"));
    // A container that exits by itself is released too, once its exit is stored.
    let dir = pod.daemon.root.join("containers").join(&ok);
    let cgroups_path = pod.daemon.container_info(&ok).await["cgroupsPath"]
        .as_str()
        .unwrap()
        .to_string();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let held = held_on_the_node(&pod, &ok, &cgroups_path);
        if held == (vec![], vec![]) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{held:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        dir.join("upper").is_dir(),
        "the writable layer stays until RemoveContainer"
    );
    let s = pod.wait_exited(&bad).await;
    assert_eq!((s.exit_code, s.reason.as_str()), (7, "Error"));

    // A process that ignores SIGTERM is killed after the grace period.
    let stubborn = pod
        .run(container("stubborn", "trap '' TERM; while true; do sleep 0.1; done"))
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // let the trap be installed
    let started = std::time::Instant::now();
    pod.daemon
        .runtime()
        .await
        .stop_container(api::StopContainerRequest {
            container_id: stubborn.clone(),
            timeout: 1,
        })
        .await
        .unwrap();
    let elapsed = started.elapsed();
    let s = pod.status(&stubborn).await;
    assert_eq!(s.exit_code, 137);
    assert!(
        elapsed >= Duration::from_millis(900),
        "killed before the grace period: {elapsed:?}"
    );

    // Duplicate names are refused; a created container only starts once.
    let err = pod.create(container("ok", "true")).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    let err = pod
        .daemon
        .runtime()
        .await
        .start_container(api::StartContainerRequest {
            container_id: ok.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    // Missing images are NotFound.
    let mut missing = container("missing", "true");
    missing.image = Some(api::ImageSpec {
        image: "registry.k8s.io/never/pulled:1".into(),
        ..Default::default()
    });
    assert_eq!(pod.create(missing).await.unwrap_err().code(), Code::NotFound);
    // A blank name is no name.
    let err = pod.create(container(" ", "true")).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("config.metadata.name"), "{}", err.message());
    pod.remove_all().await;
}

/// StopPodSandbox kills the pod's containers at once, with no grace period (the CRI says the
/// kubelet has stopped them gracefully before; containerd kills too): a container that would
/// exit 0 on SIGTERM ends by SIGKILL instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_pod_sandbox_kills_without_grace() {
    let pod = pod("stopp").await;
    let id = pod
        .run(container(
            "polite",
            "trap 'exit 0' TERM; echo ready; while true; do sleep 0.1; done",
        ))
        .await;
    pod.wait_log("polite", "stdout F ready").await;
    pod.daemon
        .runtime()
        .await
        .stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        })
        .await
        .unwrap();
    let s = pod.status(&id).await;
    assert_eq!(s.state(), api::ContainerState::ContainerExited);
    assert_eq!(
        (s.exit_code, s.reason.as_str()),
        (137, "Error"),
        "StopPodSandbox gave the container a grace period: it ran its TERM trap"
    );
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_user_workdir_and_readonly_rootfs() {
    let pod = pod("sec").await;
    let mut config = container(
        "who",
        "echo FOO=$FOO; id -u; id -g; pwd; touch /probe && echo wrote || echo readonly",
    );
    config.envs = vec![api::KeyValue {
        key: "FOO".into(),
        value: "bar".into(),
    }];
    config.working_dir = "/tmp".into();
    config.linux = Some(api::LinuxContainerConfig {
        security_context: Some(api::LinuxContainerSecurityContext {
            run_as_user: Some(api::Int64Value { value: 1000 }),
            run_as_group: Some(api::Int64Value { value: 3000 }),
            readonly_rootfs: true,
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = pod.run(config).await;
    let status = pod.wait_exited(&id).await;
    let user = status.user.and_then(|u| u.linux).expect("ContainerStatus.user");
    assert_eq!((user.uid, user.gid), (1000, 3000));
    assert!(user.supplemental_groups.contains(&3000));
    let log = pod.log("who");
    let stdout: Vec<&str> = log
        .lines()
        .filter(|l| l.split(' ').nth(1) == Some("stdout"))
        .map(|l| l.splitn(4, ' ').nth(3).unwrap_or(""))
        .collect();
    assert_eq!(stdout, vec!["FOO=bar", "1000", "3000", "/tmp", "readonly"], "{log}");
    assert!(log.contains("stderr F touch: /probe: Read-only file system"), "{log}");
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn containers_survive_daemon_restarts() {
    let mut pod = pod("restart").await;
    let ticker = pod
        .run(container("ticker", "while true; do echo tick; sleep 0.1; done"))
        .await;
    let quitter = pod.run(container("quitter", "sleep 1; exit 5")).await;
    pod.wait_log("ticker", "tick").await;
    pod.daemon.kill();
    let before = pod.log("ticker").lines().count();
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let during = pod.log("ticker").lines().count();
    assert!(
        during > before,
        "logging must go on while the daemon is down ({before} → {during})"
    );
    pod.daemon.start_again();
    assert_eq!(pod.status(&ticker).await.state(), api::ContainerState::ContainerRunning);
    // Exited while nobody watched: its exit code is not lost, and it is released all the same.
    let s = pod.wait_exited(&quitter).await;
    assert_eq!(s.exit_code, 5);
    let dir = pod.daemon.root.join("containers").join(&quitter);
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !common::mounts_under(&dir).is_empty() {
        assert!(std::time::Instant::now() < deadline, "{:?}", common::mounts_under(&dir));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_port_reaches_a_web_server_in_the_pod() {
    let host_port = common::free_port() as i32;
    let pod = pod_with(
        "web",
        Some(vec![api::PortMapping {
            protocol: api::Protocol::Tcp as i32,
            container_port: 80,
            host_port,
            host_ip: String::new(),
        }]),
    )
    .await;
    let httpd = "registry.k8s.io/e2e-test-images/httpd:2.4.39-4";
    pod.daemon
        .images()
        .await
        .pull_image(api::PullImageRequest {
            image: Some(api::ImageSpec {
                image: httpd.into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut config = container("httpd", "");
    config.command = vec![];
    config.image = Some(api::ImageSpec {
        image: httpd.into(),
        ..Default::default()
    });
    let id = pod.run(config).await;
    assert_eq!(pod.status(&id).await.state(), api::ContainerState::ContainerRunning);
    // The host port on 127.0.0.1 forwards to port 80 of the pod's IP on the bridge.
    let pod_ip = pod
        .daemon
        .runtime()
        .await
        .pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: pod.id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap()
        .network
        .unwrap()
        .ip;
    assert!(!pod_ip.is_empty());
    let mut last = String::new();
    for _ in 0..50 {
        let out = std::process::Command::new("curl")
            .args(["-fsS", "--max-time", "2", &format!("http://127.0.0.1:{host_port}/")])
            .output()
            .unwrap();
        if out.status.success() {
            last = String::from_utf8_lossy(&out.stdout).into_owned();
            break;
        }
        last = String::from_utf8_lossy(&out.stderr).into_owned();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        last.contains("It works!"),
        "no answer through host port {host_port}: {last}"
    );
    // The pod's status lists its containers (the kubelet's Evented PLEG reads them there).
    let statuses = pod
        .daemon
        .runtime()
        .await
        .pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: pod.id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .containers_statuses;
    assert_eq!(statuses.iter().map(|s| s.id.clone()).collect::<Vec<_>>(), vec![id]);
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_handler_defaults_apply_to_its_pods() {
    let hardened = "[runtime.handlers.hardened]\ndefault_seccomp = \"runtime/default\"\n";
    let pod = pod_full("hard", None, hardened, "hardened").await;
    let id = pod.run(container("probe", "grep Seccomp: /proc/self/status")).await;
    pod.wait_exited(&id).await;
    // Mode 2: a seccomp filter is in force although the container asked for none.
    assert!(
        pod.log("probe").contains("stdout F Seccomp:\t2"),
        "{}",
        pod.log("probe")
    );
    // An explicit Unconfined still wins.
    let mut config = container("open", "grep Seccomp: /proc/self/status");
    config.linux = Some(api::LinuxContainerConfig {
        security_context: Some(api::LinuxContainerSecurityContext {
            seccomp: Some(api::SecurityProfile {
                profile_type: api::security_profile::ProfileType::Unconfined as i32,
                localhost_ref: String::new(),
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = pod.run(config).await;
    pod.wait_exited(&id).await;
    assert!(pod.log("open").contains("stdout F Seccomp:\t0"), "{}", pod.log("open"));
    pod.remove_all().await;
}

/// Containers with a terminal or a stdin run (attach itself is in tests/shim.rs and the streaming
/// tests): a tty container's output is on its own terminal and logged as stdout; a stdin
/// container waits on its stdin, which gives no EOF by itself.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tty_and_stdin_containers() {
    let pod = pod("interactive").await;
    let mut term = container("term", "tty; echo on-a-terminal >&2; exec sleep 3600");
    term.tty = true;
    term.stdin = true;
    term.stdin_once = true;
    let term = pod.run(term).await;
    let log = pod.wait_log("term", "on-a-terminal").await;
    assert!(
        log.lines().any(|l| l.contains(" stdout F /dev/pts/0")),
        "the container's own devpts: {log}"
    );
    assert!(!log.contains(" stderr "), "a terminal is one stream: {log}");
    assert_eq!(pod.status(&term).await.state(), api::ContainerState::ContainerRunning);

    let mut input = container("input", "echo started; cat; echo cat-ended");
    input.stdin = true;
    let input = pod.run(input).await;
    pod.wait_log("input", "started").await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(pod.status(&input).await.state(), api::ContainerState::ContainerRunning);
    assert!(!pod.log("input").contains("cat-ended"), "{}", pod.log("input"));
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_container_keeps_its_layers_when_its_image_is_removed() {
    let pod = pod("orphan").await;
    let id = pod
        .create(container(
            "main",
            "cat /etc/hostname >/dev/null && echo still here; exec sleep 3600",
        ))
        .await
        .unwrap();
    let snapshots = || {
        let mut dirs: Vec<_> = std::fs::read_dir(pod.daemon.root.join("snapshots"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        dirs.sort();
        dirs
    };
    let before = snapshots();
    pod.daemon
        .images()
        .await
        .remove_image(api::RemoveImageRequest {
            image: Some(api::ImageSpec {
                image: BUSYBOX.into(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let listed = pod
        .daemon
        .images()
        .await
        .list_images(api::ListImagesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .images;
    assert!(
        !listed.iter().any(|i| i.repo_tags.iter().any(|t| t == BUSYBOX)),
        "{listed:?}"
    );
    // The removal collected garbage, and the container's layers were not garbage.
    assert_eq!(snapshots(), before);
    pod.start(&id).await;
    pod.wait_log("main", "stdout F still here").await;
    pod.remove_all().await;
}

/// StopPodSandbox ends the pod's shim once it holds nothing but pause (the kubelet keeps a
/// finished Job's stopped pod, which then costs no process); the exited container keeps its
/// status and log, and removal leaves nothing. A shim that still holds a container never
/// started stays until RemovePodSandbox, which ends it and that container's process.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_pod_keeps_no_shim_unless_it_holds_a_container() {
    let pod = pod("shimless").await;
    let dir = pod.daemon.dir().to_path_buf();
    let done = pod.run(container("done", "echo bye; exit 3")).await;
    pod.wait_exited(&done).await;
    let cgroups_path = pod.daemon.container_info(&done).await["cgroupsPath"]
        .as_str()
        .unwrap()
        .to_string();
    // The shim's short-lived helpers (its release of the exit) carry its command line.
    let settled = |n: usize| {
        let dir = dir.clone();
        async move {
            for _ in 0..100 {
                if common::shims_of(&dir).len() == n {
                    return true;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            false
        }
    };
    assert!(
        settled(1).await,
        "a running pod has one shim: {:?}",
        common::shims_of(&dir)
    );

    let mut runtime = pod.daemon.runtime().await;
    runtime
        .stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        })
        .await
        .unwrap();
    assert_eq!(common::shims_of(&dir), Vec::new(), "the stopped pod's shim is left");
    let status = pod.status(&done).await;
    assert_eq!(status.state(), api::ContainerState::ContainerExited);
    assert_eq!(status.exit_code, 3);
    assert!(pod.log("done").contains("bye"), "{}", pod.log("done"));
    assert_eq!(pod.containers().await.len(), 1);
    // A second stop (the kubelet retries) finds no shim and succeeds.
    runtime
        .stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        })
        .await
        .unwrap();
    runtime
        .remove_container(api::RemoveContainerRequest {
            container_id: done.clone(),
        })
        .await
        .unwrap();
    assert_eq!(held_on_the_node(&pod, &done, &cgroups_path), (Vec::new(), Vec::new()));
    runtime
        .remove_pod_sandbox(api::RemovePodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        })
        .await
        .unwrap();
    assert!(!pod.daemon.state.join("shims").join(&pod.id[..32]).exists());

    // A container created and never started holds no process and no mount (its process is
    // made at StartContainer): its pod's stop ends the shim, and it cannot start afterwards.
    let config = pod.sibling("holding");
    let holding = pod.run_sandbox(config.clone()).await;
    let pod_mounts = common::mounts_under(&dir);
    let created = runtime
        .create_container(api::CreateContainerRequest {
            pod_sandbox_id: holding.clone(),
            config: Some(container("never", "exit 0")),
            sandbox_config: Some(config),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;
    assert_eq!(
        pod.daemon.container_info(&created).await["pid"].as_i64(),
        Some(0),
        "a created container has a process"
    );
    assert_eq!(
        common::mounts_under(&dir),
        pod_mounts,
        "a created container holds a mount"
    );
    runtime
        .stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: holding.clone(),
        })
        .await
        .unwrap();
    assert_eq!(
        common::shims_of(&dir),
        Vec::new(),
        "the shim of a stopped pod holding only a created container is left"
    );
    assert_eq!(
        pod.status(&created).await.state(),
        api::ContainerState::ContainerCreated
    );
    let refused = runtime
        .start_container(api::StartContainerRequest {
            container_id: created.clone(),
        })
        .await
        .expect_err("a container of a stopped pod started");
    assert_eq!(refused.code(), Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("not ready"), "{refused:?}");
    let status = pod.status(&created).await;
    assert_eq!(status.state(), api::ContainerState::ContainerExited);
    assert_eq!(status.reason, "StartError");
    runtime
        .remove_pod_sandbox(api::RemovePodSandboxRequest {
            pod_sandbox_id: holding.clone(),
        })
        .await
        .unwrap();
    assert_eq!(common::shims_of(&dir), Vec::new());
    assert_eq!(common::mounts_under(&dir), Vec::<String>::new());
    assert_eq!(pod.containers().await, Vec::new());
}

/// A StartContainer that races StopPodSandbox of its pod either starts the container before
/// the stop (which then kills it) or finds the pod not ready (its process is never made). Never
/// a process left behind, a shim the stop ended under a running container, or a shim left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_racing_its_pods_stop_never_loses_the_shim() {
    let pod = pod("racing").await;
    let dir = pod.daemon.dir().to_path_buf();
    let mut runtime = pod.daemon.runtime().await;
    runtime
        .remove_pod_sandbox(api::RemovePodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        })
        .await
        .unwrap();
    let (mut started, mut refused) = (0, 0);
    for round in 0..16u64 {
        let config = pod.sibling(&format!("race-{round}"));
        let id = pod.run_sandbox(config.clone()).await;
        let container = runtime
            .create_container(api::CreateContainerRequest {
                pod_sandbox_id: id.clone(),
                config: Some(container("late", "sleep 600")),
                sandbox_config: Some(config),
            })
            .await
            .unwrap()
            .into_inner()
            .container_id;
        let (mut starter, mut stopper) = (pod.daemon.runtime().await, pod.daemon.runtime().await);
        // One starts up to 16 ms after the other, round by round, so that the stop lands
        // before, in every step of, and after the start.
        let lead = Duration::from_millis(2 * round.abs_diff(8));
        let (start_after, stop_after) = if round < 8 {
            (lead, Duration::ZERO)
        } else {
            (Duration::ZERO, lead)
        };
        let start = async {
            tokio::time::sleep(start_after).await;
            starter
                .start_container(api::StartContainerRequest {
                    container_id: container.clone(),
                })
                .await
        };
        let stop = async {
            tokio::time::sleep(stop_after).await;
            stopper
                .stop_pod_sandbox(api::StopPodSandboxRequest {
                    pod_sandbox_id: id.clone(),
                })
                .await
        };
        let (start, stop) = tokio::join!(start, stop);
        stop.unwrap();
        let status = pod.status(&container).await;
        assert_eq!(status.state(), api::ContainerState::ContainerExited, "round {round}");
        match start {
            Ok(_) => {
                started += 1;
                assert_eq!(
                    status.exit_code, 137,
                    "round {round}: not killed by the stop: {status:?}"
                );
            }
            Err(e) => {
                refused += 1;
                assert_eq!(e.code(), Code::FailedPrecondition, "round {round}: {e:?}");
                assert_eq!(status.reason, "StartError", "round {round}");
            }
        }
        assert_eq!(
            common::shims_of(&dir),
            Vec::new(),
            "round {round}: the stopped pod's shim is left"
        );
        let pid = pod.daemon.container_info(&container).await["pid"].as_i64().unwrap_or(0);
        assert!(
            pid == 0 || !alive(pid),
            "round {round}: the container's process outlived its pod's stop"
        );
        runtime
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: id.clone(),
            })
            .await
            .unwrap();
        assert_eq!(common::mounts_under(&dir), Vec::<String>::new(), "round {round}");
    }
    eprintln!("{started} containers started before the stop, {refused} refused after it");
    assert_eq!(pod.containers().await, Vec::new());
}

/// The daemon killed in a StartContainer after the shim started the process and before Running
/// was stored: after the restart the container is Running with that process (not Created with a
/// process the kubelet cannot see), and StopContainer ends it. The kill lands in that window by
/// construction: strace holds every pwrite(2) of the daemon (its store's writes) from before the
/// start until the daemon is dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_cut_short_after_the_process_started_is_running_after_the_restart() {
    let mut pod = pod("startedcut").await;
    let id = pod
        .create(container("started", "echo started; exec sleep 600"))
        .await
        .unwrap();
    let daemon_pid = pod.daemon.pid().as_raw();
    let mut strace = std::process::Command::new("strace")
        .args(["-f", "-qq", "-o", "/dev/null", "-e", "trace=pwrite64"])
        .args([
            "-e",
            "inject=pwrite64:delay_enter=60000000",
            "-p",
            &daemon_pid.to_string(),
        ])
        .spawn()
        .expect("strace (hack/setup.sh installs it)");
    // Attached once every thread of the daemon has a tracer.
    let traced = || {
        std::fs::read_dir(format!("/proc/{daemon_pid}/task")).is_ok_and(|tasks| {
            tasks.flatten().all(|task| {
                std::fs::read_to_string(task.path().join("status")).is_ok_and(|s| {
                    s.lines()
                        .any(|l| l.starts_with("TracerPid:") && l.trim_end() != "TracerPid:\t0")
                })
            })
        })
    };
    for _ in 0..200 {
        if traced() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(traced(), "strace did not attach to the daemon");
    let mut starter = pod.daemon.runtime().await;
    let start = tokio::spawn({
        let id = id.clone();
        async move {
            starter
                .start_container(api::StartContainerRequest { container_id: id })
                .await
        }
    });
    pod.wait_log("started", "started").await;
    // SIGKILL first: a tracee with a fatal signal pending skips the held write when strace
    // lets go of it (and strace's hold would delay the daemon's reaping until it ends).
    nix::sys::signal::kill(pod.daemon.pid(), nix::sys::signal::Signal::SIGKILL).unwrap();
    let _ = strace.kill();
    let _ = strace.wait();
    pod.daemon.kill();
    assert!(start.await.unwrap().is_err(), "a start answered by a killed daemon");

    pod.daemon.start_again();
    let status = pod.status(&id).await;
    assert_eq!(
        status.state(),
        api::ContainerState::ContainerRunning,
        "the started process is hidden behind a Created container"
    );
    let pid = pod.daemon.container_info(&id).await["pid"].as_i64().unwrap_or(0);
    assert!(pid > 0 && alive(pid), "pid {pid}");
    assert!(
        std::fs::read_to_string(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with("sleep")),
        "pid {pid} is not the container's process"
    );
    pod.daemon
        .runtime()
        .await
        .stop_container(api::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await
        .unwrap();
    assert!(!alive(pid), "the container's process outlived StopContainer");
    assert_eq!(pod.status(&id).await.state(), api::ContainerState::ContainerExited);
    assert_eq!(
        pod.log("started").matches("started").count(),
        1,
        "{}",
        pod.log("started")
    );
    pod.remove_all().await;
}

/// The daemon killed in the middle of a StartContainer, while the shim is making the process:
/// the container stays Created with its rootfs mounted and the shim holding what it made, and
/// the kubelet's next StartContainer after the restart releases that and starts the container
/// whole (one process, its log). The kill lands in that window by construction: the daemon's
/// root is a tmpfs this test watches with fanotify, and the shim's open of the container's
/// config.json waits until the daemon is dead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_cut_short_by_a_crash_starts_whole_after_the_restart() {
    let daemon = common::Daemon::start_on_tmpfs("", "size=1g");
    let (root, daemon_pid) = (daemon.root.clone(), daemon.pid().as_raw());
    let mut pod = common::pod::pod_on(daemon, "cutshort").await;
    let id = pod
        .create(container("cut", "echo started; exec sleep 600"))
        .await
        .unwrap();
    let watch = common::open_watch::OpenWatch::start(&root, daemon_pid, true, || {});
    let mut starter = pod.daemon.runtime().await;
    let start = tokio::spawn({
        let id = id.clone();
        async move {
            starter
                .start_container(api::StartContainerRequest { container_id: id })
                .await
        }
    });
    let (_, shim) = tokio::task::block_in_place(|| watch.first_open(Duration::from_secs(60)))
        .expect("the shim never opened the container's config.json");
    pod.daemon.kill();
    assert!(start.await.unwrap().is_err(), "a start answered by a killed daemon");
    // Let the shim make the process now that nobody waits for it.
    watch.release();
    let state = pod
        .daemon
        .state
        .join("shims")
        .join(&pod.id[..32])
        .join("containers")
        .join(&id)
        .join("state.json");
    let mut made = false;
    for _ in 0..200 {
        watch.poke();
        if std::fs::read_to_string(&state).is_ok_and(|s| s.contains("\"created\"")) {
            made = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    watch.finish();
    assert!(
        made,
        "the shim (pid {shim}) did not make the process after the daemon died"
    );

    pod.daemon.start_again();
    let status = pod.status(&id).await;
    assert_eq!(status.state(), api::ContainerState::ContainerCreated);
    let rootfs = root.join("containers").join(&id).join("rootfs");
    assert!(
        scute_sys::mountinfo::is_mountpoint(&rootfs),
        "the cut start's rootfs is gone"
    );
    pod.start(&id).await;
    pod.wait_log("cut", "started").await;
    let status = pod.status(&id).await;
    assert_eq!(status.state(), api::ContainerState::ContainerRunning);
    let cgroups_path = pod.daemon.container_info(&id).await["cgroupsPath"]
        .as_str()
        .unwrap()
        .to_string();
    let (_, cgroups) = held_on_the_node(&pod, &id, &cgroups_path);
    let procs = std::fs::read_to_string(cgroups[0].join("cgroup.procs")).unwrap();
    assert_eq!(
        procs.lines().count(),
        1,
        "the process the cut start made is left beside the started one: {procs}"
    );
    assert_eq!(pod.log("cut").matches("started").count(), 1, "{}", pod.log("cut"));
    pod.remove_all().await;
}
