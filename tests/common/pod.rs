//! A pod to run containers in, shared by the container and streaming suites: a daemon with the
//! project's test images reachable through mirrors, busybox pulled, and a pod sandbox (on the host
//! network, or on a CNI bridge of its own with port mappings). `remove_all` checks that nothing
//! is left behind.

use std::time::Duration;

use super::{Daemon, Registry, TestNetwork};
use scute::api;

pub const BUSYBOX: &str = "registry.k8s.io/e2e-test-images/busybox:1.29-2";

/// A daemon with the project's test images reachable through mirrors, busybox pulled, and a pod.
pub struct Pod {
    pub daemon: Daemon,
    _registry: Registry,
    pub id: String,
    pub config: api::PodSandboxConfig,
    pub logs: tempfile::TempDir,
    _network: Option<TestNetwork>,
}

pub async fn pod(name: &str) -> Pod {
    pod_with(name, None).await
}

/// A pod on a CNI bridge network of its own with `ports` mapped, or (None) on the host network.
pub async fn pod_with(name: &str, ports: Option<Vec<api::PortMapping>>) -> Pod {
    pod_full(name, ports, "", "").await
}

/// `pod_with` on a daemon configured with `extra_toml`, the pod using runtime handler `handler`.
pub async fn pod_full(name: &str, ports: Option<Vec<api::PortMapping>>, extra_toml: &str, handler: &str) -> Pod {
    pod_edited(name, ports, extra_toml, handler, |_| {}).await
}

/// `pod_full` with the pod's config changed by `edit` before RunPodSandbox.
pub async fn pod_edited(
    name: &str,
    ports: Option<Vec<api::PortMapping>>,
    extra_toml: &str,
    handler: &str,
    edit: impl FnOnce(&mut api::PodSandboxConfig),
) -> Pod {
    pod_in(Daemon::start(extra_toml), name, ports, handler, edit).await
}

/// A host-network pod on `daemon` (one started some other way: `Daemon::start_on_tmpfs`).
pub async fn pod_on(daemon: Daemon, name: &str) -> Pod {
    pod_in(daemon, name, None, "", |_| {}).await
}

async fn pod_in(
    daemon: Daemon,
    name: &str,
    ports: Option<Vec<api::PortMapping>>,
    handler: &str,
    edit: impl FnOnce(&mut api::PodSandboxConfig),
) -> Pod {
    let registry = Registry::with_test_images();
    daemon.mirror_public_registries_to(&registry.addr);
    // Host network keeps most tests independent of CNI (covered by the sandbox tests).
    let network = ports.as_ref().map(|_| TestNetwork::install(&daemon));
    let mode = if ports.is_some() {
        api::NamespaceMode::Pod
    } else {
        api::NamespaceMode::Node
    };
    let logs = tempfile::tempdir().unwrap();
    let mut config = api::PodSandboxConfig {
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
    edit(&mut config);
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

pub fn container(name: &str, script: &str) -> api::ContainerConfig {
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
    /// The registry the daemon's mirrors send public names to.
    pub fn registry(&self) -> &Registry {
        &self._registry
    }

    pub async fn create(&self, config: api::ContainerConfig) -> Result<String, tonic::Status> {
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

    pub async fn run(&self, config: api::ContainerConfig) -> String {
        let id = self.create(config).await.unwrap();
        self.start(&id).await;
        id
    }

    pub async fn start(&self, id: &str) {
        self.daemon
            .runtime()
            .await
            .start_container(api::StartContainerRequest {
                container_id: id.into(),
            })
            .await
            .unwrap_or_else(|e| panic!("StartContainer {id}: {e:?}"));
    }

    /// This pod's config under another name (and the uid `uid-<name>`), for a second pod on the
    /// same daemon.
    pub fn sibling(&self, name: &str) -> api::PodSandboxConfig {
        let mut config = self.config.clone();
        let metadata = config.metadata.as_mut().expect("the pod's config has metadata");
        metadata.name = name.into();
        metadata.uid = format!("uid-{name}");
        config
    }

    /// RunPodSandbox of `config` (e.g. a `sibling`) on this pod's daemon; answers its ID.
    pub async fn run_sandbox(&self, config: api::PodSandboxConfig) -> String {
        self.daemon
            .run_pod_sandbox(config)
            .await
            .unwrap_or_else(|e| panic!("RunPodSandbox: {e:?}"))
    }

    /// PullImage through the daemon's mirrors; answers the image's ID.
    pub async fn pull(&self, image: &str) -> String {
        self.daemon
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
            .unwrap_or_else(|e| panic!("pulling {image}: {e:?}"))
            .into_inner()
            .image_ref
    }

    pub async fn status(&self, id: &str) -> api::ContainerStatus {
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

    /// ImageStatus of `image`; panics when the daemon does not have it.
    pub async fn image_status(&self, image: &str) -> api::Image {
        self.daemon
            .images()
            .await
            .image_status(api::ImageStatusRequest {
                image: Some(api::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                verbose: false,
            })
            .await
            .unwrap()
            .into_inner()
            .image
            .unwrap_or_else(|| panic!("{image} is not there"))
    }

    /// Every container the daemon lists.
    pub async fn containers(&self) -> Vec<api::Container> {
        self.daemon
            .runtime()
            .await
            .list_containers(api::ListContainersRequest::default())
            .await
            .unwrap()
            .into_inner()
            .containers
    }

    pub async fn wait_exited(&self, id: &str) -> api::ContainerStatus {
        for _ in 0..200 {
            let s = self.status(id).await;
            if s.state() == api::ContainerState::ContainerExited {
                return s;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("container {id} did not exit");
    }

    pub async fn exec(&self, id: &str, cmd: &[&str], timeout: i64) -> Result<api::ExecSyncResponse, tonic::Status> {
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

    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.logs.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    pub async fn wait_log(&self, name: &str, needle: &str) -> String {
        for _ in 0..200 {
            let log = self.log(name);
            if log.contains(needle) {
                return log;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("{needle:?} never appeared in {name}.log:\n{}", self.log(name));
    }

    pub async fn remove_all(&self) {
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
        // (Not the root itself when the rig mounted a tmpfs there: start_on_tmpfs.)
        let root = self.daemon.root.display().to_string();
        let left: Vec<_> = super::mounts_under(self.daemon.dir())
            .into_iter()
            .filter(|m| *m != root)
            .collect();
        assert!(left.is_empty(), "mounts left: {left:?}");
        assert!(
            !self.daemon.root.join("containers").exists()
                || std::fs::read_dir(self.daemon.root.join("containers")).unwrap().count() == 0
        );
    }
}
