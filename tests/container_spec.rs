//! What a user observes inside busybox containers, for each part of the OCI spec scute builds
//! (src/oci/): command/args merging, env, users and groups,
//! bind mounts and propagation, the pod's /etc files, masked and read-only paths, capabilities,
//! seccomp, a read-only rootfs, cgroup resources and OOM kills, and log rotation. Every test runs
//! its own daemon, registry and pod, and checks after StopPodSandbox + RemovePodSandbox that no
//! mount, process or cgroup of its containers is left.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::{Daemon, Registry};
use scute::api;
use scute::api::security_profile::ProfileType;

const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.29-2";
/// Built by `custom_image`: busybox with an Entrypoint, a Cmd, its own env and USER daemon.
const CUSTOM: &str = "registry.k8s.io/scute-test/entrypoint:1";

/// images/build.sh assembles its rootfs dirs in one work dir: one run at a time in this process
/// (the script flocks against other processes).
static IMAGE_BUILD: Mutex<()> = Mutex::new(());

#[derive(Default)]
struct PodOpts {
    /// A CNI bridge network of the test's own (own network and UTS namespaces), else the host's.
    cni: bool,
    dns: Option<api::DnsConfig>,
    privileged: bool,
    /// Also build, push and pull `CUSTOM`.
    custom_image: bool,
}

/// A daemon with the test images reachable through mirrors, busybox pulled, and one pod.
struct Pod {
    daemon: Daemon,
    registry: Registry,
    id: String,
    config: api::PodSandboxConfig,
    logs: tempfile::TempDir,
    /// Every container created in the pod (checked for leftovers at the end).
    containers: Mutex<Vec<String>>,
    /// Set by `remove_all`; a pod dropped without it (a failed test) is removed in `drop`.
    removed: std::sync::atomic::AtomicBool,
    _network: Option<common::TestNetwork>,
}

impl Drop for Pod {
    /// The daemon never stops containers when it exits: a failed test still removes its pod
    /// (and so its shim, containers, mounts and cgroups) before the daemon goes.
    fn drop(&mut self) {
        if self.removed.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let socket = self.daemon.socket.clone();
        let id = self.id.clone();
        // Drop may run inside the test's runtime: a runtime of its own on another thread.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let mut runtime =
                    scute::api::runtime_service_client::RuntimeServiceClient::new(common::connect(&socket).await);
                let _ = runtime
                    .stop_pod_sandbox(api::StopPodSandboxRequest {
                        pod_sandbox_id: id.clone(),
                    })
                    .await;
                let _ = runtime
                    .remove_pod_sandbox(api::RemovePodSandboxRequest { pod_sandbox_id: id })
                    .await;
            });
        })
        .join();
    }
}

/// The test images' registry (built under the same lock as `custom_image` reads the rootfs).
fn registry_with_test_images() -> Registry {
    let _one_build = IMAGE_BUILD.lock().unwrap_or_else(|p| p.into_inner());
    Registry::with_test_images()
}

/// The busybox rootfs of images/build.sh as an image with Entrypoint ["echo", "ep"],
/// Cmd ["c1", "c2"], a PATH of its own, two more variables and USER daemon, pushed to `registry`
/// as `CUSTOM` (registry.k8s.io is mirrored there).
fn custom_image(registry: &Registry) {
    let work = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::repo_root().join("target"))
        .join("images");
    let layout = tempfile::tempdir().unwrap();
    let kit = common::imagekit();
    // build.sh rebuilds the rootfs under this lock: read it under the same lock.
    let _one_build = IMAGE_BUILD.lock().unwrap_or_else(|p| p.into_inner());
    let out = Command::new("flock")
        .arg(work.join(".lock"))
        .arg(&kit)
        .args(["build", "--rootfs"])
        .arg(work.join("rootfs/busybox"))
        .arg("--out")
        .arg(layout.path())
        .args([
            "--entrypoint",
            r#"["echo","ep"]"#,
            "--cmd",
            r#"["c1","c2"]"#,
            "--env",
            "PATH=/custom/bin:/bin:/usr/bin",
            "--env",
            "IMGVAR=from-image",
            "--env",
            "OVERRIDE=image",
            "--user",
            "daemon",
            "--label",
            "scute.test/image=container-spec-entrypoint",
        ])
        .output()
        .expect("run scute-imagekit build");
    assert!(
        out.status.success(),
        "scute-imagekit build failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    common::kit(&[
        "push",
        "--layout",
        layout.path().to_str().unwrap(),
        "--to",
        &format!("{}/scute-test/entrypoint:1", registry.addr),
        "--plain-http",
    ]);
}

async fn pull(daemon: &Daemon, image: &str) {
    daemon
        .images()
        .await
        .pull_image(api::PullImageRequest {
            image: Some(api::ImageSpec {
                image: image.into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .unwrap_or_else(|e| panic!("pulling {image}: {e:?}"));
}

async fn pod(name: &str) -> Pod {
    pod_with(name, PodOpts::default()).await
}

async fn pod_with(name: &str, opts: PodOpts) -> Pod {
    let registry = registry_with_test_images();
    if opts.custom_image {
        custom_image(&registry);
    }
    let daemon = Daemon::start("");
    daemon.mirror_public_registries_to(&registry.addr);
    let network = opts.cni.then(|| common::TestNetwork::install(&daemon));
    let mode = if opts.cni {
        api::NamespaceMode::Pod
    } else {
        api::NamespaceMode::Node
    };
    let logs = tempfile::tempdir().unwrap();
    let config = api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        log_directory: logs.path().display().to_string(),
        dns_config: opts.dns.clone(),
        linux: Some(api::LinuxPodSandboxConfig {
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: mode as i32,
                    ..Default::default()
                }),
                privileged: opts.privileged,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    pull(&daemon, BUSYBOX).await;
    if opts.custom_image {
        pull(&daemon, CUSTOM).await;
    }
    let id = daemon
        .runtime()
        .await
        .run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(config.clone()),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e:?}\n{}", daemon.log()))
        .into_inner()
        .pod_sandbox_id;
    Pod {
        daemon,
        registry,
        id,
        config,
        logs,
        containers: Mutex::new(Vec::new()),
        removed: Default::default(),
        _network: network,
    }
}

/// A busybox container running `sh -c script`, logging to `<name>.log`.
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

fn security(config: &mut api::ContainerConfig) -> &mut api::LinuxContainerSecurityContext {
    config
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
}

fn resources(config: &mut api::ContainerConfig) -> &mut api::LinuxContainerResources {
    config
        .linux
        .get_or_insert_with(Default::default)
        .resources
        .get_or_insert_with(Default::default)
}

fn caps(config: &mut api::ContainerConfig, add: &[&str], drop: &[&str]) {
    security(config).capabilities = Some(api::Capability {
        add_capabilities: add.iter().map(|s| s.to_string()).collect(),
        drop_capabilities: drop.iter().map(|s| s.to_string()).collect(),
        add_ambient_capabilities: vec![],
    });
}

fn seccomp(config: &mut api::ContainerConfig, ty: ProfileType) {
    security(config).seccomp = Some(api::SecurityProfile {
        profile_type: ty as i32,
        localhost_ref: String::new(),
    });
}

fn bind(container_path: &str, host_path: &Path, readonly: bool) -> api::Mount {
    api::Mount {
        container_path: container_path.into(),
        host_path: host_path.display().to_string(),
        readonly,
        ..Default::default()
    }
}

/// The messages of one stream of a CRI log, partial lines (`P`) joined to their line.
fn stream(log: &str, which: &str) -> Vec<String> {
    let mut lines = Vec::new();
    let mut partial = String::new();
    for line in log.lines() {
        let mut f = line.splitn(4, ' ');
        let (_, Some(s), Some(tag)) = (f.next(), f.next(), f.next()) else {
            continue;
        };
        if s != which {
            continue;
        }
        partial.push_str(f.next().unwrap_or(""));
        if tag == "F" {
            lines.push(std::mem::take(&mut partial));
        }
    }
    lines
}

/// What a finished container printed.
struct Output {
    status: api::ContainerStatus,
    stdout: Vec<String>,
    stderr: Vec<String>,
    log: String,
}

impl Output {
    fn stdout_text(&self) -> String {
        self.stdout.join("\n")
    }
}

impl Pod {
    async fn create(&self, config: api::ContainerConfig) -> Result<String, tonic::Status> {
        let id = self
            .daemon
            .runtime()
            .await
            .create_container(api::CreateContainerRequest {
                pod_sandbox_id: self.id.clone(),
                config: Some(config),
                sandbox_config: Some(self.config.clone()),
            })
            .await
            .map(|r| r.into_inner().container_id)?;
        self.containers.lock().unwrap().push(id.clone());
        Ok(id)
    }

    async fn start(&self, id: &str) -> Result<(), tonic::Status> {
        self.daemon
            .runtime()
            .await
            .start_container(api::StartContainerRequest {
                container_id: id.into(),
            })
            .await
            .map(|_| ())
    }

    async fn run(&self, config: api::ContainerConfig) -> String {
        let name = config.metadata.as_ref().unwrap().name.clone();
        let id = self
            .create(config)
            .await
            .unwrap_or_else(|e| panic!("CreateContainer {name}: {e:?}\n{}", self.diagnostics()));
        self.start(&id)
            .await
            .unwrap_or_else(|e| panic!("StartContainer {name}: {e:?}\n{}", self.diagnostics()));
        id
    }

    /// The daemon's log and the tail of every shim's log (both go with the temp dir).
    fn diagnostics(&self) -> String {
        let mut out = self.daemon.log();
        for entry in std::fs::read_dir(self.daemon.state.join("shims"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let log = std::fs::read_to_string(entry.path().join("shim.log")).unwrap_or_default();
            let lines: Vec<&str> = log.lines().collect();
            let tail = lines[lines.len().saturating_sub(40)..].join("\n");
            out.push_str(&format!("\n--- shim {}:\n{tail}", entry.file_name().to_string_lossy()));
        }
        out
    }

    /// Runs a container to its exit and returns what it printed.
    async fn run_to_exit(&self, config: api::ContainerConfig) -> Output {
        let name = config.metadata.as_ref().unwrap().name.clone();
        let id = self.run(config).await;
        let status = self.wait_exited(&id, Duration::from_secs(20)).await;
        let log = self.log(&name);
        Output {
            status,
            stdout: stream(&log, "stdout"),
            stderr: stream(&log, "stderr"),
            log,
        }
    }

    async fn status_and_info(&self, id: &str) -> (api::ContainerStatus, serde_json::Value) {
        let r = self
            .daemon
            .runtime()
            .await
            .container_status(api::ContainerStatusRequest {
                container_id: id.into(),
                verbose: true,
            })
            .await
            .unwrap()
            .into_inner();
        let info = serde_json::from_str(&r.info["info"]).unwrap();
        (r.status.unwrap(), info)
    }

    async fn status(&self, id: &str) -> api::ContainerStatus {
        self.status_and_info(id).await.0
    }

    async fn wait_exited(&self, id: &str, timeout: Duration) -> api::ContainerStatus {
        let deadline = Instant::now() + timeout;
        loop {
            let s = self.status(id).await;
            if s.state() == api::ContainerState::ContainerExited {
                return s;
            }
            if Instant::now() > deadline {
                panic!("container {id} did not exit in {timeout:?}: {s:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    async fn exec(&self, id: &str, script: &str) -> api::ExecSyncResponse {
        self.daemon
            .runtime()
            .await
            .exec_sync(api::ExecSyncRequest {
                container_id: id.into(),
                cmd: vec!["sh".into(), "-c".into(), script.into()],
                timeout: 10,
            })
            .await
            .unwrap_or_else(|e| panic!("ExecSync {script:?}: {e:?}"))
            .into_inner()
    }

    /// ExecSync's stdout, asserting exit 0.
    async fn exec_ok(&self, id: &str, script: &str) -> String {
        let r = self.exec(id, script).await;
        assert_eq!(
            r.exit_code,
            0,
            "{script:?} exited {}: stdout {:?} stderr {:?}",
            r.exit_code,
            String::from_utf8_lossy(&r.stdout),
            String::from_utf8_lossy(&r.stderr)
        );
        String::from_utf8_lossy(&r.stdout).into_owned()
    }

    fn log_path(&self, name: &str) -> PathBuf {
        self.logs.path().join(format!("{name}.log"))
    }

    fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.log_path(name)).unwrap_or_default()
    }

    async fn wait_log(&self, name: &str, needle: &str) -> String {
        for _ in 0..400 {
            let log = self.log(name);
            if log.contains(needle) {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{needle:?} never appeared in {name}.log:\n{}", self.log(name));
    }

    fn sandbox_dir(&self) -> PathBuf {
        self.daemon.root.join("sandboxes").join(&self.id)
    }

    /// StopPodSandbox + RemovePodSandbox, then: no mount under the daemon's dirs, no container
    /// directory, no process and no cgroup of any of the pod's containers.
    async fn remove_all(&self) {
        self.removed.store(true, std::sync::atomic::Ordering::SeqCst);
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
        let left = common::mounts_under(self.daemon.dir());
        assert!(left.is_empty(), "mounts left: {left:?}");
        let containers = self.daemon.root.join("containers");
        assert!(
            !containers.exists() || std::fs::read_dir(&containers).unwrap().count() == 0,
            "container directories left"
        );
        let ids = self.containers.lock().unwrap().clone();
        let tags: Vec<String> = ids.iter().map(|id| format!("scute-{id}")).collect();
        // Processes may take a moment to be reaped after the SIGKILL of their cgroup.
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let procs = processes_in(&tags);
            if procs.is_empty() {
                break;
            }
            assert!(Instant::now() < deadline, "container processes left: {procs:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let mut cgroups = Vec::new();
        for tag in &tags {
            for ctrl in ["memory", "cpu", "pids", "freezer", "devices", "unified"] {
                let p = Path::new("/sys/fs/cgroup").join(ctrl).join("scute").join(tag);
                if p.exists() {
                    cgroups.push(p);
                }
            }
        }
        assert!(cgroups.is_empty(), "cgroups left: {cgroups:?}");
    }
}

/// (pid, cgroup line) of every process in a cgroup named by one of `tags`.
fn processes_in(tags: &[String]) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if !name.bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(cg) = std::fs::read_to_string(entry.path().join("cgroup")) else {
            continue;
        };
        if let Some(line) = cg.lines().find(|l| tags.iter().any(|t| l.contains(t.as_str()))) {
            out.push((name, line.to_string()));
        }
    }
    out
}

/// A capability set of /proc/<pid>/status text (`CapEff`, `CapBnd`, …) as a number.
fn cap_field(status: &str, field: &str) -> u64 {
    let line = status
        .lines()
        .find(|l| l.starts_with(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in {status:?}"));
    u64::from_str_radix(line.split_whitespace().nth(1).unwrap(), 16).unwrap()
}

/// The default capabilities: CHOWN DAC_OVERRIDE FOWNER FSETID KILL SETGID SETUID SETPCAP
/// NET_BIND_SERVICE NET_RAW SYS_CHROOT MKNOD AUDIT_WRITE SETFCAP.
const DEFAULT_CAPS: u64 = (1 << 0)
    | (1 << 1)
    | (1 << 3)
    | (1 << 4)
    | (1 << 5)
    | (1 << 6)
    | (1 << 7)
    | (1 << 8)
    | (1 << 10)
    | (1 << 13)
    | (1 << 18)
    | (1 << 27)
    | (1 << 29)
    | (1 << 31);
const CAP_SYS_ADMIN: u64 = 1 << 21;

fn sh(cmd: &str) {
    let out = Command::new("sh").args(["-c", cmd]).output().unwrap();
    assert!(out.status.success(), "{cmd}: {}", String::from_utf8_lossy(&out.stderr));
}

// ---------------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn command_args_and_env_merge_with_the_image() {
    let pod = pod_with(
        "cmd",
        PodOpts {
            custom_image: true,
            ..Default::default()
        },
    )
    .await;
    let custom = |name: &str, command: &[&str], args: &[&str]| {
        let mut c = container(name, "");
        c.image = Some(api::ImageSpec {
            image: CUSTOM.into(),
            ..Default::default()
        });
        c.command = command.iter().map(|s| s.to_string()).collect();
        c.args = args.iter().map(|s| s.to_string()).collect();
        c
    };
    // Image: Entrypoint ["echo", "ep"], Cmd ["c1", "c2"].
    let cases: Vec<(api::ContainerConfig, &str)> = vec![
        (custom("image-only", &[], &[]), "ep c1 c2"),
        (custom("args-replace-cmd", &[], &["a1", "a2"]), "ep a1 a2"),
        (custom("command-drops-cmd", &["echo", "own"], &[]), "own"),
        (custom("command-and-args", &["echo", "own"], &["a1"]), "own a1"),
    ];
    for (config, want) in cases {
        let name = config.metadata.as_ref().unwrap().name.clone();
        let out = pod.run_to_exit(config).await;
        assert_eq!(out.status.exit_code, 0, "{name}: {}", out.log);
        assert_eq!(out.stdout, vec![want.to_string()], "{name}: {}", out.log);
    }
    // busybox: no Entrypoint, Cmd ["sh"].
    let mut c = container("bb-args", "");
    c.command = vec![];
    c.args = vec!["echo".into(), "args-are-the-command".into()];
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.stdout, vec!["args-are-the-command".to_string()], "{}", out.log);
    let mut c = container("bb-both", "");
    c.command = vec!["sh".into(), "-c".into(), "echo \"$0|$1|$#\"".into()];
    c.args = vec!["x y".into(), "z".into()];
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.stdout, vec!["x y|z|1".to_string()], "{}", out.log);
    // A working directory the image does not have is created.
    let mut c = container("new-cwd", "pwd; ls -ld . | cut -c1-10");
    c.working_dir = "/not/in/the/image".into();
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.stdout[0], "/not/in/the/image", "{}", out.log);
    // No command and no args: the image's Cmd `sh`, which exits at EOF on stdin.
    let mut c = container("bb-default", "");
    c.command = vec![];
    let out = pod.run_to_exit(c).await;
    assert_eq!(
        (out.status.exit_code, out.status.reason.as_str()),
        (0, "Completed"),
        "{}",
        out.log
    );

    // Env: the image's PATH is kept; the config's variables are added and win over the image's;
    // the image's USER (daemon) applies when the security context names none.
    let mut c = custom("env", &["sh", "-c", "env | sort; echo uid=$(id -u) gid=$(id -g)"], &[]);
    c.envs = vec![
        api::KeyValue {
            key: "OVERRIDE".into(),
            value: "config".into(),
        },
        api::KeyValue {
            key: "ADDED".into(),
            value: "with spaces = and equals".into(),
        },
    ];
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.status.exit_code, 0, "{}", out.log);
    for want in [
        "PATH=/custom/bin:/bin:/usr/bin",
        "IMGVAR=from-image",
        "OVERRIDE=config",
        "ADDED=with spaces = and equals",
        "HOSTNAME=cmd",
        "uid=1 gid=1",
    ] {
        assert!(out.stdout.iter().any(|l| l == want), "{want:?} missing: {}", out.log);
    }
    assert!(!out.stdout.iter().any(|l| l == "OVERRIDE=image"), "{}", out.log);
    assert_eq!(out.stdout.iter().filter(|l| l.starts_with("PATH=")).count(), 1);

    // Names that are no shell identifiers reach the process as given (envFrom with a ConfigMap's
    // keys and a prefix gives `data-1`, `p-data.1`; Kubernetes allows any printable name but
    // `=`): printed by `env` run as the container's process, no shell in between to drop them.
    let mut c = container("env-names", "");
    c.command = vec!["env".into()];
    c.envs = ["data-1", "p-data.1", "1st", "with space"]
        .iter()
        .map(|key| api::KeyValue {
            key: key.to_string(),
            value: format!("value of {key}").into(),
        })
        .collect();
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.status.exit_code, 0, "{}", out.log);
    for key in ["data-1", "p-data.1", "1st", "with space"] {
        let want = format!("{key}=value of {key}");
        assert!(out.stdout.contains(&want), "{want:?} missing: {}", out.log);
    }

    // busybox's own PATH (the image's ENV) reaches a plain container.
    let out = pod.run_to_exit(container("bb-env", "echo $PATH")).await;
    assert_eq!(
        out.stdout,
        vec!["/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string()]
    );
    pod.remove_all().await;
}

/// An image of 60 layers (Docker allows 127) runs: its rootfs overlay names its layers in fewer
/// bytes than the one page mount(2) takes, which their absolute paths overflow (about 100 bytes
/// each here), and the container sees the files of its lowest and highest layers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_of_sixty_layers_runs() {
    let pod = pod("layers").await;
    let work = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::repo_root().join("target"))
        .join("images");
    let (layers, layout) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let mut build = Command::new("flock");
    build
        .arg(work.join(".lock"))
        .arg(common::imagekit())
        .args(["build", "--rootfs"]);
    build.arg(work.join("rootfs/busybox"));
    for i in 1..60 {
        let dir = layers.path().join(i.to_string());
        std::fs::create_dir_all(dir.join("layers")).unwrap();
        std::fs::write(dir.join("layers").join(i.to_string()), format!("{i}\n")).unwrap();
        build.arg("--rootfs").arg(&dir);
    }
    let out = {
        let _one_build = IMAGE_BUILD.lock().unwrap_or_else(|p| p.into_inner());
        build
            .arg("--out")
            .arg(layout.path())
            .output()
            .expect("run scute-imagekit build")
    };
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    common::kit(&[
        "push",
        "--layout",
        layout.path().to_str().unwrap(),
        "--to",
        &format!("{}/scute-test/layers:60", pod.registry.addr),
        "--plain-http",
    ]);
    let image = "registry.k8s.io/scute-test/layers:60";
    pull(&pod.daemon, image).await;
    let mut config = container("sixty", "cat /layers/1 /layers/59");
    config.image = Some(api::ImageSpec {
        image: image.into(),
        ..Default::default()
    });
    let out = pod.run_to_exit(config).await;
    assert_eq!(out.status.exit_code, 0, "{}\n{}", out.log, pod.daemon.log());
    assert_eq!(out.stdout, vec!["1", "59"]);
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn users_and_supplemental_groups() {
    let pod = pod("users").await;
    let script = "echo uid=$(id -u) gid=$(id -g) groups=$(id -G)";

    let mut c = container("uid1000", script);
    security(&mut c).run_as_user = Some(api::Int64Value { value: 1000 });
    security(&mut c).supplemental_groups = vec![1234];
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.status.exit_code, 0, "{}", out.log);
    let line = out.stdout_text();
    assert!(line.starts_with("uid=1000 gid=0 "), "{line}");
    let groups: Vec<&str> = line.split("groups=").nth(1).unwrap().split(' ').collect();
    assert!(groups.contains(&"1234"), "{line}");

    let mut c = container("daemon", script);
    security(&mut c).run_as_username = "daemon".into();
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.stdout, vec!["uid=1 gid=1 groups=1".to_string()], "{}", out.log);

    let mut c = container("uid-gid", script);
    security(&mut c).run_as_user = Some(api::Int64Value { value: 33 });
    security(&mut c).run_as_group = Some(api::Int64Value { value: 4000 });
    let out = pod.run_to_exit(c).await;
    assert_eq!(
        out.stdout,
        vec!["uid=33 gid=4000 groups=4000".to_string()],
        "{}",
        out.log
    );

    // root is a member of wheel (10) in the image's /etc/group: Merge (the default) adds it,
    // Strict keeps to the primary group and the listed ones.
    for (policy, want) in [
        (api::SupplementalGroupsPolicy::Merge, "uid=0 gid=0 groups=0 10 1234"),
        (api::SupplementalGroupsPolicy::Strict, "uid=0 gid=0 groups=0 1234"),
    ] {
        let name = format!("policy-{}", policy.as_str_name().to_ascii_lowercase());
        let mut c = container(&name, script);
        security(&mut c).run_as_user = Some(api::Int64Value { value: 0 });
        security(&mut c).supplemental_groups = vec![1234];
        security(&mut c).supplemental_groups_policy = policy as i32;
        let out = pod.run_to_exit(c).await;
        assert_eq!(out.stdout, vec![want.to_string()], "{name}: {}", out.log);
    }

    // A user the image does not know is refused at create.
    let mut c = container("nobody-here", script);
    security(&mut c).run_as_username = "no-such-user".into();
    let err = pod.create(c).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_mounts_rw_ro_and_created_sources() {
    let pod = pod("mounts").await;
    let host = tempfile::tempdir().unwrap();
    let rw = host.path().join("rw");
    let ro = host.path().join("ro");
    std::fs::create_dir_all(&rw).unwrap();
    std::fs::create_dir_all(&ro).unwrap();
    std::fs::write(ro.join("given"), "from the host\n").unwrap();
    let missing = host.path().join("not/there/yet");

    let mut c = container(
        "binds",
        "echo written-inside > /data/out && echo rw-ok; \
         cat /ro/given; touch /ro/new && echo ro-writable || echo ro-refused; \
         test -d /created && echo created-is-dir; \
         grep -E ' /(data|ro|created) ' /proc/self/mountinfo | awk '{print $5, $6}' | sort",
    );
    c.mounts = vec![
        bind("/data", &rw, false),
        bind("/ro", &ro, true),
        bind("/created", &missing, false),
    ];
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.status.exit_code, 0, "{}", out.log);
    let stdout = out.stdout_text();
    for want in ["rw-ok", "from the host", "ro-refused", "created-is-dir"] {
        assert!(out.stdout.iter().any(|l| l == want), "{want:?} missing: {}", out.log);
    }
    assert!(
        out.stderr.iter().any(|l| l.contains("Read-only file system")),
        "{}",
        out.log
    );
    assert!(stdout.contains("/ro ro,"), "{stdout}");
    assert!(stdout.contains("/data rw,"), "{stdout}");
    assert_eq!(std::fs::read_to_string(rw.join("out")).unwrap(), "written-inside\n");
    assert!(!ro.join("new").exists());
    assert!(missing.is_dir(), "a missing host path is created as a directory");
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_to_container_propagation() {
    let pod = pod("prop").await;
    // The source must sit on a shared (or slave) mount: a shared tmpfs of the test's own.
    let host = tempfile::tempdir().unwrap();
    let shared = host.path().join("shared");
    std::fs::create_dir_all(&shared).unwrap();
    sh(&format!(
        "mount -t tmpfs scute-prop {0} && mount --make-shared {0}",
        shared.display()
    ));
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg("-R").arg("-l").arg(&self.0).status();
        }
    }
    let _unmount = Unmount(shared.clone());
    let src = shared.join("src");
    std::fs::create_dir_all(src.join("sub")).unwrap();

    let mut c = container("prop", "exec sleep 3600");
    let mut m = bind("/prop", &src, false);
    m.propagation = api::MountPropagation::PropagationHostToContainer as i32;
    c.mounts = vec![m];
    let id = pod.run(c).await;
    let line = pod.exec_ok(&id, "grep ' /prop ' /proc/self/mountinfo").await;
    assert!(line.contains("master:"), "rslave: {line}");

    // A mount the host makes under the source after the start shows up inside…
    let sub = src.join("sub");
    sh(&format!("mount -t tmpfs scute-prop-sub {}", sub.display()));
    std::fs::write(sub.join("marker"), "propagated\n").unwrap();
    let seen = pod.exec_ok(&id, "cat /prop/sub/marker").await;
    assert_eq!(seen, "propagated\n");
    // …and so does its unmount.
    sh(&format!("umount {}", sub.display()));
    let after = pod
        .exec_ok(&id, "test -e /prop/sub/marker && echo still || echo gone")
        .await;
    assert_eq!(after, "gone\n");

    // A private mount (the default) does not see host mounts made later.
    let mut c = container("private", "exec sleep 3600");
    c.mounts = vec![bind("/priv", &src, false)];
    let private = pod.run(c).await;
    let line = pod.exec_ok(&private, "grep ' /priv ' /proc/self/mountinfo").await;
    assert!(
        !line.contains("master:") && !line.contains("shared:"),
        "rprivate: {line}"
    );
    sh(&format!("mount -t tmpfs scute-prop-sub {}", sub.display()));
    std::fs::write(sub.join("marker"), "late\n").unwrap();
    let r = pod
        .exec_ok(&private, "test -e /priv/sub/marker && echo seen || echo unseen")
        .await;
    assert_eq!(r, "unseen\n");
    assert_eq!(pod.exec_ok(&id, "cat /prop/sub/marker").await, "late\n");
    sh(&format!("umount {}", sub.display()));

    // BIDIRECTIONAL: a mount made inside (with CAP_SYS_ADMIN) shows up on the host.
    std::fs::create_dir_all(src.join("sub2")).unwrap();
    let mut c = container("bidi", "exec sleep 3600");
    let mut m = bind("/bidi", &src, false);
    m.propagation = api::MountPropagation::PropagationBidirectional as i32;
    c.mounts = vec![m];
    caps(&mut c, &["SYS_ADMIN"], &[]);
    let bidi = pod.run(c).await;
    let line = pod.exec_ok(&bidi, "grep ' /bidi ' /proc/self/mountinfo").await;
    assert!(line.contains("shared:"), "rshared: {line}");
    pod.exec_ok(
        &bidi,
        "mount -t tmpfs from-inside /bidi/sub2 && echo inside > /bidi/sub2/f",
    )
    .await;
    let sub2 = src.join("sub2");
    let back = std::fs::read_to_string(sub2.join("f"));
    // Unmount on the host whatever happened (it would outlive the container).
    let _ = Command::new("umount").arg("-l").arg(&sub2).status();
    assert_eq!(back.unwrap(), "inside\n");

    // Without a shared or slave host mount, HOST_TO_CONTAINER is refused at create.
    let plain = host.path().join("plain");
    std::fs::create_dir_all(&plain).unwrap();
    let plain_shared = shared_mount_of(&plain);
    if !plain_shared {
        let mut c = container("unpropagated", "true");
        let mut m = bind("/p", &plain, false);
        m.propagation = api::MountPropagation::PropagationHostToContainer as i32;
        c.mounts = vec![m];
        let err = pod.create(c).await.unwrap_err();
        assert!(err.message().contains("shared"), "{err:?}");
    }
    pod.remove_all().await;
}

/// Whether the mount holding `path` is shared or a slave.
fn shared_mount_of(path: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Some((f.get(4)?.to_string(), l.to_string()))
        })
        .filter(|(m, _)| path.starts_with(m))
        .max_by_key(|(m, _)| m.len())
        .is_some_and(|(_, l)| l.contains(" shared:") || l.contains(" master:"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_files_hostname_hosts_and_resolv_conf() {
    let pod = pod_with(
        "files",
        PodOpts {
            cni: true,
            dns: Some(api::DnsConfig {
                servers: vec!["10.96.0.10".into()],
                searches: vec!["default.svc.cluster.local".into(), "svc.cluster.local".into()],
                options: vec!["ndots:5".into()],
            }),
            ..Default::default()
        },
    )
    .await;
    let id = pod.run(container("files", "exec sleep 3600")).await;
    let dir = pod.sandbox_dir();
    for (inside, file) in [
        ("/etc/hostname", "hostname"),
        ("/etc/hosts", "hosts"),
        ("/etc/resolv.conf", "resolv.conf"),
    ] {
        let got = pod.exec_ok(&id, &format!("cat {inside}")).await;
        let want = std::fs::read_to_string(dir.join(file)).unwrap();
        assert_eq!(got, want, "{inside}");
    }
    let resolv = pod.exec_ok(&id, "cat /etc/resolv.conf").await;
    assert!(resolv.contains("nameserver 10.96.0.10"), "{resolv}");
    assert!(
        resolv.contains("search default.svc.cluster.local svc.cluster.local"),
        "{resolv}"
    );
    assert!(resolv.contains("options ndots:5"), "{resolv}");
    assert_eq!(pod.exec_ok(&id, "hostname").await, "files\n");
    assert_eq!(pod.exec_ok(&id, "cat /etc/hostname").await.trim(), "files");
    // /etc/hosts names the pod's IP.
    let ip = pod
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
    let hosts = pod.exec_ok(&id, "cat /etc/hosts").await;
    assert!(hosts.contains(&format!("{ip}\tfiles")), "{hosts}");
    // They are the pod's files, not copies: a write inside is the pod's (kubelet-managed) file.
    pod.exec_ok(&id, "echo '10.1.2.3 extra' >> /etc/hosts").await;
    assert!(std::fs::read_to_string(dir.join("hosts"))
        .unwrap()
        .contains("10.1.2.3 extra"));
    // And the pod's /dev/shm, shared with the other containers.
    pod.exec_ok(&id, "echo shm > /dev/shm/x").await;
    assert_eq!(std::fs::read_to_string(dir.join("shm/x")).unwrap(), "shm\n");
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masked_and_readonly_paths_and_privileged() {
    // Own network + UTS namespaces: nothing here can touch the node's hostname or domain.
    let pod = pod_with(
        "masks",
        PodOpts {
            cni: true,
            privileged: true,
            ..Default::default()
        },
    )
    .await;
    // (/proc/kcore is masked too, but not every kernel has it: timer_list stands in.)
    let script = "echo timer_list=$(cat /proc/timer_list 2>/dev/null | head -c 16 | wc -c); \
                  echo firmware=$(ls -A /sys/firmware | wc -l); \
                  echo keys=$(cat /proc/keys 2>/dev/null | wc -c); \
                  if echo scute > /proc/sys/kernel/domainname; then echo sys=writable; else echo sys=readonly; fi; \
                  echo proc_sys_mounts=$(grep -c ' /proc/sys ' /proc/self/mountinfo); \
                  awk '$5 == \"/sys\" {split($6, o, \",\"); print \"sysfs=\" o[1]}' /proc/self/mountinfo; \
                  awk '$5 == \"/sys/fs/cgroup/memory\" || ($5 == \"/sys/fs/cgroup\" && $0 !~ / - tmpfs /) \
                       {split($6, o, \",\"); print \"cgroup=\" o[1]; exit}' /proc/self/mountinfo; \
                  echo devices=$(find /dev -type b -o -type c | wc -l)";
    let out = pod.run_to_exit(container("plain", script)).await;
    let plain_devices: usize = out
        .stdout
        .last()
        .and_then(|l| l.strip_prefix("devices="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", out.log));
    assert_eq!(
        out.stdout[..out.stdout.len() - 1],
        [
            "timer_list=0",
            "firmware=0",
            "keys=0",
            "sys=readonly",
            "proc_sys_mounts=1",
            "sysfs=ro",
            "cgroup=ro"
        ],
        "{}",
        out.log
    );
    assert!(
        out.stderr.iter().any(|l| l.contains("Read-only file system")),
        "{}",
        out.log
    );
    // The host does have them.
    assert!(std::fs::read_dir("/sys/firmware").unwrap().count() > 0);
    assert!(!std::fs::read("/proc/timer_list").unwrap().is_empty());

    let mut c = container("privileged", script);
    security(&mut c).privileged = true;
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.status.exit_code, 0, "{}", out.log);
    assert!(out.stdout.iter().any(|l| l == "timer_list=16"), "{}", out.log);
    assert!(!out.stdout.iter().any(|l| l == "firmware=0"), "{}", out.log);
    assert!(out.stdout.iter().any(|l| l == "sys=writable"), "{}", out.log);
    assert!(out.stdout.iter().any(|l| l == "proc_sys_mounts=0"), "{}", out.log);
    assert!(out.stdout.iter().any(|l| l == "sysfs=rw"), "{}", out.log);
    assert!(out.stdout.iter().any(|l| l == "cgroup=rw"), "{}", out.log);
    // The host's devices.
    let devices: usize = out
        .stdout
        .last()
        .and_then(|l| l.strip_prefix("devices="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{}", out.log));
    assert!(
        devices > plain_devices + 10,
        "{devices} vs {plain_devices}: {}",
        out.log
    );
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn capabilities_default_drop_add_and_privileged() {
    let pod = pod_with(
        "caps",
        PodOpts {
            privileged: true,
            ..Default::default()
        },
    )
    .await;
    let script = "grep Cap /proc/self/status";
    let host = std::fs::read_to_string("/proc/self/status").unwrap();
    let host_bnd = cap_field(&host, "CapBnd");
    assert_eq!(DEFAULT_CAPS, 0xa80425fb);

    let out = pod.run_to_exit(container("default", script)).await;
    let status = out.stdout_text();
    for field in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(cap_field(&status, field), DEFAULT_CAPS, "{field}: {status}");
    }
    assert_eq!(cap_field(&status, "CapAmb"), 0, "{status}");

    let mut c = container("drop-all", script);
    caps(&mut c, &[], &["ALL"]);
    let status = pod.run_to_exit(c).await.stdout_text();
    for field in ["CapEff", "CapPrm", "CapBnd"] {
        assert_eq!(cap_field(&status, field), 0, "{field}: {status}");
    }

    let mut c = container("add-admin", script);
    caps(&mut c, &["SYS_ADMIN"], &["NET_RAW"]);
    let status = pod.run_to_exit(c).await.stdout_text();
    assert_eq!(
        cap_field(&status, "CapEff"),
        (DEFAULT_CAPS | CAP_SYS_ADMIN) & !(1 << 13),
        "{status}"
    );

    // "ALL" is every capability the node (the daemon) has.
    let mut c = container("add-all", script);
    caps(&mut c, &["ALL"], &["CHOWN"]);
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.status.exit_code, 0, "{}", out.log);
    assert_eq!(cap_field(&out.stdout_text(), "CapEff"), host_bnd & !1, "{}", out.log);

    let mut c = container("privileged", script);
    security(&mut c).privileged = true;
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.status.exit_code, 0, "{}", out.log);
    let status = out.stdout_text();
    assert_eq!(cap_field(&status, "CapBnd"), host_bnd, "{status}");
    assert_eq!(cap_field(&status, "CapEff"), host_bnd, "{status}");

    // Non-root without ambient capabilities: nothing effective.
    let mut c = container("nonroot", script);
    security(&mut c).run_as_user = Some(api::Int64Value { value: 1000 });
    let status = pod.run_to_exit(c).await.stdout_text();
    assert_eq!(cap_field(&status, "CapEff"), 0, "{status}");
    assert_eq!(cap_field(&status, "CapBnd"), DEFAULT_CAPS, "{status}");

    // Ambient: a non-root process keeps NET_BIND_SERVICE.
    let mut c = container("ambient", script);
    security(&mut c).run_as_user = Some(api::Int64Value { value: 1000 });
    security(&mut c).capabilities = Some(api::Capability {
        add_ambient_capabilities: vec!["NET_BIND_SERVICE".into()],
        drop_capabilities: vec!["ALL".into()],
        ..Default::default()
    });
    let status = pod.run_to_exit(c).await.stdout_text();
    for field in ["CapEff", "CapAmb", "CapBnd"] {
        assert_eq!(cap_field(&status, field), 1 << 10, "{field}: {status}");
    }
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seccomp_runtime_default_and_unconfined() {
    // Own namespaces: the mounts and namespaces tried here must not reach the node.
    let pod = pod_with(
        "seccomp",
        PodOpts {
            cni: true,
            ..Default::default()
        },
    )
    .await;
    let script = "echo mode=$(grep '^Seccomp:' /proc/self/status | awk '{print $2}'); \
                  unshare -U true && echo userns=ok || echo userns=denied; \
                  mkdir -p /mnt/t; mount -t tmpfs none /mnt/t && echo mount=ok || echo mount=denied";

    // Unconfined, default capabilities: a user namespace needs no capability, mount does.
    let mut c = container("unconfined", script);
    seccomp(&mut c, ProfileType::Unconfined);
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.stdout, vec!["mode=0", "userns=ok", "mount=denied"], "{}", out.log);

    // RuntimeDefault: unshare is filtered (EPERM) even though no capability is missing.
    let mut c = container("default", script);
    seccomp(&mut c, ProfileType::RuntimeDefault);
    let out = pod.run_to_exit(c).await;
    assert_eq!(
        out.stdout,
        vec!["mode=2", "userns=denied", "mount=denied"],
        "{}",
        out.log
    );
    assert!(
        out.stderr
            .iter()
            .any(|l| l.contains("unshare") && l.contains("Operation not permitted")),
        "{}",
        out.log
    );

    // RuntimeDefault with CAP_SYS_ADMIN lifts the namespace and mount group.
    let mut c = container("default-admin", script);
    seccomp(&mut c, ProfileType::RuntimeDefault);
    caps(&mut c, &["SYS_ADMIN"], &[]);
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.stdout, vec!["mode=2", "userns=ok", "mount=ok"], "{}", out.log);

    // Unconfined + CAP_SYS_ADMIN: mount works.
    let mut c = container("unconfined-admin", script);
    seccomp(&mut c, ProfileType::Unconfined);
    caps(&mut c, &["SYS_ADMIN"], &[]);
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.stdout, vec!["mode=0", "userns=ok", "mount=ok"], "{}", out.log);

    // Syscalls denied to everyone under RuntimeDefault, whatever the capabilities.
    let mut c = container("swapoff", "swapoff /nonexistent; echo rc=$?");
    seccomp(&mut c, ProfileType::RuntimeDefault);
    caps(&mut c, &["ALL"], &[]);
    let out = pod.run_to_exit(c).await;
    assert!(
        out.stderr.iter().any(|l| l.contains("Operation not permitted")),
        "swapoff must be filtered: {}",
        out.log
    );
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readonly_rootfs_with_writable_mounts() {
    let pod = pod("rofs").await;
    let host = tempfile::tempdir().unwrap();
    let script = "for p in /probe /tmp/probe /etc/probe /dev/shm/probe /scratch/probe; do \
                    if touch $p 2>/dev/null; then echo $p=rw; else echo $p=ro; fi; done; \
                  echo x >> /etc/hosts && echo hosts=rw || echo hosts=ro";
    let mut c = container("ro", script);
    security(&mut c).readonly_rootfs = true;
    c.mounts = vec![bind("/scratch", host.path(), false)];
    let out = pod.run_to_exit(c).await;
    assert_eq!(
        out.stdout,
        vec![
            "/probe=ro",
            "/tmp/probe=ro",
            "/etc/probe=ro",
            "/dev/shm/probe=rw",
            "/scratch/probe=rw",
            "hosts=ro"
        ],
        "{}",
        out.log
    );
    assert!(
        out.stderr.iter().any(|l| l.contains("Read-only file system")),
        "{}",
        out.log
    );
    assert!(host.path().join("probe").exists());

    // A mount provides a writable /tmp.
    let tmp = tempfile::tempdir().unwrap();
    let mut c = container("ro-tmp", script);
    security(&mut c).readonly_rootfs = true;
    c.mounts = vec![bind("/tmp", tmp.path(), false)];
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.stdout[..2], ["/probe=ro", "/tmp/probe=rw"], "{}", out.log);

    // The same container without readonly_rootfs writes its own layer.
    let out = pod.run_to_exit(container("rw", script)).await;
    assert_eq!(
        out.stdout[..3],
        ["/probe=rw", "/tmp/probe=rw", "/etc/probe=rw"],
        "{}",
        out.log
    );
    pod.remove_all().await;
}

fn cgroup_file(ctrl: &str, cgroups_path: &str, file: &str) -> String {
    let p = Path::new("/sys/fs/cgroup")
        .join(ctrl)
        .join(cgroups_path.trim_start_matches('/'))
        .join(file);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cgroup_resources_and_oom_kill() {
    let pod = pod("res").await;
    let mut c = container("limited", "exec sleep 3600");
    *resources(&mut c) = api::LinuxContainerResources {
        memory_limit_in_bytes: 64 << 20,
        cpu_quota: 50_000,
        cpu_period: 100_000,
        cpu_shares: 512,
        cpuset_cpus: "0".into(),
        oom_score_adj: 500,
        ..Default::default()
    };
    let id = pod.run(c).await;
    // One CPU to run on, and the OOM score asked for.
    assert_eq!(
        pod.exec_ok(&id, "nproc; cat /proc/self/oom_score_adj").await,
        "1\n500\n"
    );
    let (_, info) = pod.status_and_info(&id).await;
    let path = info["cgroupsPath"].as_str().unwrap().to_string();
    assert!(path.ends_with(&format!("scute-{id}")), "{path}");
    let pid = info["pid"].as_i64().unwrap();
    // The container's process is in that cgroup.
    let own = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    assert!(
        own.lines().any(|l| l.contains(":memory:") && l.ends_with(&path)),
        "{own}"
    );
    if Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists() {
        assert_eq!(cgroup_file("memory", &path, "memory.limit_in_bytes"), "67108864");
        assert_eq!(cgroup_file("cpu", &path, "cpu.cfs_quota_us"), "50000");
        assert_eq!(cgroup_file("cpu", &path, "cpu.cfs_period_us"), "100000");
        assert_eq!(cgroup_file("cpu", &path, "cpu.shares"), "512");
        assert_eq!(cgroup_file("cpuset", &path, "cpuset.cpus"), "0");
        // As the container sees it, read-only: it cannot lift its own limits.
        let inside = pod
            .exec_ok(
                &id,
                "cat /sys/fs/cgroup/memory/memory.limit_in_bytes /sys/fs/cgroup/cpu/cpu.cfs_quota_us",
            )
            .await;
        assert_eq!(inside, "67108864\n50000\n");
        let r = pod
            .exec(&id, "echo -1 > /sys/fs/cgroup/memory/memory.limit_in_bytes")
            .await;
        assert_ne!(r.exit_code, 0);
        assert!(
            String::from_utf8_lossy(&r.stderr).contains("Read-only file system"),
            "{:?}",
            String::from_utf8_lossy(&r.stderr)
        );
        assert_eq!(cgroup_file("memory", &path, "memory.limit_in_bytes"), "67108864");
    } else {
        assert_eq!(cgroup_file("", &path, "memory.max"), "67108864");
        assert_eq!(cgroup_file("", &path, "cpu.max"), "50000 100000");
    }

    // More than the limit: the kernel's OOM killer, reported as OOMKilled / 137.
    let mut c = container(
        "hog",
        "echo start; a=$(head -c 134217728 /dev/zero | tr '\\000' x); echo survived ${#a}",
    );
    resources(&mut c).memory_limit_in_bytes = 32 << 20;
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.stdout, vec!["start".to_string()], "{}", out.log);
    assert_eq!(out.status.exit_code, 137, "{:?}\n{}", out.status, out.log);
    assert_eq!(out.status.reason, "OOMKilled", "{:?}", out.status);

    // A plain SIGKILL is not an OOM kill.
    let mut c = container("killed", "kill -9 $$");
    resources(&mut c).memory_limit_in_bytes = 32 << 20;
    let out = pod.run_to_exit(c).await;
    assert_eq!(
        (out.status.exit_code, out.status.reason.as_str()),
        (137, "Error"),
        "{:?}",
        out.status
    );
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn log_rotation_with_reopen() {
    let pod = pod("logs").await;
    let id = pod
        .run(container(
            "ticker",
            "i=0; while true; do i=$((i+1)); echo line-$i; sleep 0.1; done",
        ))
        .await;
    pod.wait_log("ticker", "line-5").await;
    let path = pod.log_path("ticker");
    let rotated = path.with_extension("log.1");
    std::fs::rename(&path, &rotated).unwrap();
    // Until the reopen, lines go on into the renamed file.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!path.exists());
    pod.daemon
        .runtime()
        .await
        .reopen_container_log(api::ReopenContainerLogRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap();
    pod.wait_log("ticker", "line-").await;
    let old_len = std::fs::metadata(&rotated).unwrap().len();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(
        std::fs::metadata(&rotated).unwrap().len(),
        old_len,
        "the rotated file must stop growing after ReopenContainerLog"
    );
    let new = pod.log("ticker");
    assert!(new.lines().count() >= 3, "{new}");
    // Nothing lost, nothing doubled: the new file continues where the old one ended.
    let numbers = |text: &str| -> Vec<u64> {
        stream(text, "stdout")
            .iter()
            .map(|l| l.strip_prefix("line-").unwrap().parse().unwrap())
            .collect()
    };
    let old = numbers(&std::fs::read_to_string(&rotated).unwrap());
    let fresh = numbers(&new);
    assert_eq!(old.first(), Some(&1));
    assert_eq!(fresh[0], old.last().unwrap() + 1, "old {old:?} new {fresh:?}");
    for w in old.windows(2).chain(fresh.windows(2)) {
        assert_eq!(w[1], w[0] + 1, "old {old:?} new {fresh:?}");
    }
    // A stopped container's log cannot be reopened.
    pod.daemon
        .runtime()
        .await
        .stop_container(api::StopContainerRequest {
            container_id: id.clone(),
            timeout: 2,
        })
        .await
        .unwrap();
    let err = pod
        .daemon
        .runtime()
        .await
        .reopen_container_log(api::ReopenContainerLogRequest {
            container_id: id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    let _ = &pod.registry;
    pod.remove_all().await;
}

/// Every container of a pod joins the pod's PID namespace, numbered 2, 3, … there: each one
/// still gets its own cgroups at /sys/fs/cgroup (libcontainer's own v1 emulation looked them up by
/// that in-pod number in the host's /proc and failed where the host had no such PID).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_containers_in_one_pod_see_their_own_cgroups() {
    let pod = pod("many").await;
    let v1 = Path::new("/sys/fs/cgroup/memory/memory.limit_in_bytes").exists();
    let file = if v1 {
        "/sys/fs/cgroup/memory/memory.limit_in_bytes"
    } else {
        "/sys/fs/cgroup/memory.max"
    };
    for i in 0..14u64 {
        let name = format!("c{i}");
        let mut c = container(&name, &format!("cat {file}; echo pid=$$"));
        resources(&mut c).memory_limit_in_bytes = ((64 + i) << 20) as i64;
        let out = pod.run_to_exit(c).await;
        assert_eq!(out.status.exit_code, 0, "{name}: {}", out.log);
        assert_eq!(out.stdout[0], ((64 + i) << 20).to_string(), "{name}: {}", out.log);
    }
    pod.remove_all().await;
}

/// The container for the exec tests: non-root with supplemental groups, one ambient capability,
/// no_new_privs, RuntimeDefault seccomp, its own working directory and env.
fn identity_container(name: &str, script: &str) -> api::ContainerConfig {
    let mut c = container(name, &format!("{script}; exec sleep 3600"));
    security(&mut c).run_as_user = Some(api::Int64Value { value: 1000 });
    security(&mut c).run_as_group = Some(api::Int64Value { value: 2000 });
    security(&mut c).supplemental_groups = vec![1234];
    security(&mut c).no_new_privs = true;
    security(&mut c).capabilities = Some(api::Capability {
        add_ambient_capabilities: vec!["NET_BIND_SERVICE".into()],
        drop_capabilities: vec!["ALL".into()],
        ..Default::default()
    });
    seccomp(&mut c, ProfileType::RuntimeDefault);
    c.working_dir = "/tmp".into();
    c.envs = vec![api::KeyValue {
        key: "FOO".into(),
        value: "bar".into(),
    }];
    c
}

/// ExecSync runs as the container does: user and groups, env, working directory, capabilities
/// and no_new_privs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_runs_with_the_containers_identity() {
    let pod = pod("execid").await;
    let script = "echo uid=$(id -u) gid=$(id -g) groups=$(id -G) pwd=$(pwd) FOO=$FOO; \
                  grep -E '^(CapEff|CapBnd|NoNewPrivs):' /proc/self/status | tr -s '\t' ' '";
    let id = pod.run(identity_container("id", script)).await;
    let log = pod.wait_log("id", "NoNewPrivs").await;
    let want = vec![
        "uid=1000 gid=2000 groups=2000 1234 pwd=/tmp FOO=bar".to_string(),
        "CapEff: 0000000000000400".to_string(),
        "CapBnd: 0000000000000400".to_string(),
        "NoNewPrivs: 1".to_string(),
    ];
    assert_eq!(stream(&log, "stdout"), want, "{log}");
    let from_exec = pod.exec_ok(&id, script).await;
    assert_eq!(from_exec.lines().collect::<Vec<_>>(), want);
    pod.remove_all().await;
}

/// An exec'd process is under the container's seccomp filter, as runc's exec is: a probe or a
/// `kubectl exec` must not be a way around RuntimeDefault.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_keeps_the_seccomp_filter() {
    let pod = pod("execsec").await;
    let script = "grep '^Seccomp:' /proc/self/status | tr -s '\t' ' '; \
                  unshare -U true && echo userns=ok || echo userns=denied";
    let id = pod.run(identity_container("sec", script)).await;
    let log = pod.wait_log("sec", "userns=").await;
    let want = vec!["Seccomp: 2".to_string(), "userns=denied".to_string()];
    assert_eq!(stream(&log, "stdout"), want, "{log}");
    let from_exec = pod.exec(&id, script).await;
    assert_eq!(
        String::from_utf8_lossy(&from_exec.stdout).lines().collect::<Vec<_>>(),
        want
    );

    // As root without no_new_privs (the Kubernetes default), loading the filter needs a moment of
    // CAP_SYS_ADMIN: the exec'd process must end up with exactly the container's sets.
    let script = "grep -E '^(Seccomp|NoNewPrivs|Cap(Inh|Prm|Eff|Bnd|Amb)):' /proc/self/status | tr -s '\t' ' '; \
                  unshare -U true && echo userns=ok || echo userns=denied";
    let mut c = container("root", &format!("{script}; exec sleep 3600"));
    seccomp(&mut c, ProfileType::RuntimeDefault);
    let id = pod.run(c).await;
    let log = pod.wait_log("root", "userns=").await;
    let want = stream(&log, "stdout");
    assert!(want.contains(&"Seccomp: 2".to_string()), "{log}");
    assert!(want.contains(&"NoNewPrivs: 0".to_string()), "{log}");
    assert!(want.contains(&"userns=denied".to_string()), "{log}");
    let from_exec = pod.exec(&id, script).await;
    assert_eq!(
        String::from_utf8_lossy(&from_exec.stdout).lines().collect::<Vec<_>>(),
        want,
        "{}",
        String::from_utf8_lossy(&from_exec.stderr)
    );
    pod.remove_all().await;
}

/// Devices: a requested host device at its container path; the device cgroup refuses the rest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_requested_and_refused() {
    let pod = pod("devices").await;
    // The host's root block device: a node for it can be made, never opened.
    let root_dev = std::fs::metadata("/").unwrap();
    use std::os::unix::fs::MetadataExt;
    let (major, minor) = (
        nix::sys::stat::major(root_dev.dev()),
        nix::sys::stat::minor(root_dev.dev()),
    );
    let script = format!(
        "echo x > /dev/xnull && echo xnull=ok; \
         ls /dev | sort | tr '\\n' ' '; echo; \
         mknod /tmp/blk b {major} {minor} && echo mknod=ok; \
         head -c 1 /tmp/blk > /dev/null && echo blk=readable || echo blk=refused"
    );
    let mut c = container("dev", &script);
    c.devices = vec![api::Device {
        container_path: "/dev/xnull".into(),
        host_path: "/dev/null".into(),
        permissions: "rw".into(),
    }];
    let out = pod.run_to_exit(c).await;
    assert_eq!(out.stdout[0], "xnull=ok", "{}", out.log);
    for d in [
        "full", "null", "ptmx", "pts", "random", "shm", "tty", "urandom", "xnull", "zero", "mqueue",
    ] {
        assert!(
            out.stdout[1].split(' ').any(|e| e == d),
            "/dev/{d} missing: {}",
            out.log
        );
    }
    assert_eq!(out.stdout[2..], ["mknod=ok", "blk=refused"], "{}", out.log);
    assert!(
        out.stderr.iter().any(|l| l.contains("Operation not permitted")),
        "{}",
        out.log
    );
    pod.remove_all().await;
}
