//! Containers as a user sees them: busybox containers in real pods through the shim and
//! libcontainer: process, logs, exec, exit codes, stop grace, user/env/workdir, read-only rootfs,
//! daemon restarts, and cleanup.

mod common;

use std::path::Path;
use std::time::Duration;

use common::{Daemon, Registry};
use scute::api;
use tonic::Code;

const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.29-2";

/// A daemon with the project's test images reachable through mirrors, busybox pulled, and a pod.
struct Pod {
    daemon: Daemon,
    _registry: Registry,
    id: String,
    config: api::PodSandboxConfig,
    logs: tempfile::TempDir,
    _network: Option<common::TestNetwork>,
}

async fn pod(name: &str) -> Pod {
    pod_with(name, None).await
}

/// A pod on a CNI bridge network of its own with `ports` mapped, or (None) on the host network.
async fn pod_with(name: &str, ports: Option<Vec<api::PortMapping>>) -> Pod {
    pod_full(name, ports, "", "").await
}

/// `pod_with` on a daemon configured with `extra_toml`, the pod using runtime handler `handler`.
async fn pod_full(name: &str, ports: Option<Vec<api::PortMapping>>, extra_toml: &str, handler: &str) -> Pod {
    let registry = Registry::start();
    registry.push_test_images();
    let daemon = Daemon::start(extra_toml);
    daemon.mirror_public_registries_to(&registry.addr);
    // Host network keeps most tests independent of CNI (covered by the sandbox tests).
    let network = ports.as_ref().map(|_| common::TestNetwork::install(&daemon));
    let mode = if ports.is_some() {
        api::NamespaceMode::Pod
    } else {
        api::NamespaceMode::Node
    };
    let logs = tempfile::tempdir().unwrap();
    let config = api::PodSandboxConfig {
        port_mappings: ports.unwrap_or_default(),
        metadata: Some(api::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: logs.path().display().to_string(),
        linux: Some(api::LinuxPodSandboxConfig {
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: mode as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    daemon
        .images()
        .await
        .pull_image(api::PullImageRequest {
            image: Some(api::ImageSpec {
                image: BUSYBOX.into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap();
    let id = daemon
        .runtime()
        .await
        .run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: handler.to_string(),
        })
        .await
        .unwrap()
        .into_inner()
        .pod_sandbox_id;
    Pod {
        daemon,
        _registry: registry,
        id,
        config,
        logs,
        _network: network,
    }
}

fn container(name: &str, script: &str) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: BUSYBOX.into(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), script.into()],
        log_path: format!("{name}.log"),
        ..Default::default()
    }
}

impl Pod {
    async fn create(&self, config: api::ContainerConfig) -> Result<String, tonic::Status> {
        self.daemon
            .runtime()
            .await
            .create_container(api::CreateContainerRequest {
                pod_sandbox_id: self.id.clone(),
                config: Some(config),
                sandbox_config: Some(self.config.clone()),
            })
            .await
            .map(|r| r.into_inner().container_id)
    }

    async fn run(&self, config: api::ContainerConfig) -> String {
        let id = self.create(config).await.unwrap();
        self.daemon
            .runtime()
            .await
            .start_container(api::StartContainerRequest {
                container_id: id.clone(),
            })
            .await
            .unwrap();
        id
    }

    async fn status(&self, id: &str) -> api::ContainerStatus {
        self.daemon
            .runtime()
            .await
            .container_status(api::ContainerStatusRequest {
                container_id: id.into(),
                verbose: true,
            })
            .await
            .unwrap()
            .into_inner()
            .status
            .unwrap()
    }

    async fn wait_exited(&self, id: &str) -> api::ContainerStatus {
        for _ in 0..200 {
            let s = self.status(id).await;
            if s.state() == api::ContainerState::ContainerExited {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("container {id} did not exit");
    }

    async fn exec(&self, id: &str, cmd: &[&str], timeout: i64) -> Result<api::ExecSyncResponse, tonic::Status> {
        self.daemon
            .runtime()
            .await
            .exec_sync(api::ExecSyncRequest {
                container_id: id.into(),
                cmd: cmd.iter().map(|s| s.to_string()).collect(),
                timeout,
            })
            .await
            .map(|r| r.into_inner())
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.logs.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    async fn wait_log(&self, name: &str, needle: &str) -> String {
        for _ in 0..200 {
            let log = self.log(name);
            if log.contains(needle) {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{needle:?} never appeared in {name}.log:\n{}", self.log(name));
    }

    async fn remove_all(&self) {
        let mut runtime = self.daemon.runtime().await;
        runtime
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: self.id.clone(),
            })
            .await
            .unwrap();
        runtime
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: self.id.clone(),
            })
            .await
            .unwrap();
        let left: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(self.daemon.dir().to_str().unwrap()))
            .map(str::to_string)
            .collect();
        assert!(left.is_empty(), "mounts left: {left:?}");
        assert!(
            !self.daemon.root.join("containers").exists()
                || std::fs::read_dir(self.daemon.root.join("containers")).unwrap().count() == 0
        );
    }
}

fn alive(pid: i64) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.split(") ").nth(1).unwrap_or("").starts_with('Z'))
        .unwrap_or(false)
}

fn container_pid(status_info: &str) -> i64 {
    let v: serde_json::Value = serde_json::from_str(status_info).unwrap();
    v["pid"].as_i64().unwrap()
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
    let info = pod
        .daemon
        .runtime()
        .await
        .container_status(api::ContainerStatusRequest {
            container_id: id.clone(),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner()
        .info;
    let pid = container_pid(&info["info"]);
    assert!(alive(pid));
    pod.daemon
        .runtime()
        .await
        .stop_container(api::StopContainerRequest {
            container_id: id.clone(),
            timeout: 10,
        })
        .await
        .unwrap();
    let status = pod.status(&id).await;
    assert_eq!(status.state(), api::ContainerState::ContainerExited);
    assert_eq!(status.exit_code, 128 + 15);
    assert_eq!(status.reason, "Error");
    assert!(status.finished_at >= status.started_at);
    assert!(!alive(pid));
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
    // Exited while nobody watched: its exit code is not lost.
    let s = pod.wait_exited(&quitter).await;
    assert_eq!(s.exit_code, 5);
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

#[allow(dead_code)]
fn unused(_: &Path) {}
