//! Pods with their own user namespace (NamespaceOption.userns_options, POD mode): the pod's root
//! is an unprivileged host id, the image's files appear as the pod's own through idmapped
//! layers, exec'd processes land in the same namespace, and what CRI forbids is refused.

mod common;

use common::pod::{container, pod_edited, Pod};
use scute::api;

const HOST_ID: u32 = 200_000;
const LENGTH: u32 = 65_536;

fn mapping(container_id: u32, host_id: u32, length: u32) -> api::IdMapping {
    api::IdMapping {
        container_id,
        host_id,
        length,
    }
}

fn userns(mode: api::NamespaceMode, maps: Vec<api::IdMapping>) -> api::UserNamespace {
    api::UserNamespace {
        mode: mode as i32,
        uids: maps.clone(),
        gids: maps,
    }
}

fn set_userns(config: &mut api::PodSandboxConfig, options: api::UserNamespace) {
    let security = config
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default);
    security
        .namespace_options
        .get_or_insert_with(Default::default)
        .userns_options = Some(options);
}

/// A pod on a CNI network of its own with user namespace 0 → HOST_ID (LENGTH ids).
async fn userns_pod(name: &str) -> Pod {
    pod_edited(name, Some(vec![]), "", "", |config| {
        set_userns(
            config,
            userns(api::NamespaceMode::Pod, vec![mapping(0, HOST_ID, LENGTH)]),
        )
    })
    .await
}

/// A container's linux config with its pod's namespace options: the kubelet repeats them on
/// each container.
fn pod_namespaces(pod: &Pod) -> api::LinuxContainerConfig {
    api::LinuxContainerConfig {
        security_context: Some(api::LinuxContainerSecurityContext {
            namespace_options: pod
                .config
                .linux
                .as_ref()
                .and_then(|l| l.security_context.as_ref())
                .and_then(|s| s.namespace_options.clone()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn uid_map_line(text: &str) -> Vec<u64> {
    text.lines()
        .find_map(|l| {
            let fields: Vec<u64> = l.split_whitespace().filter_map(|f| f.parse().ok()).collect();
            (fields.len() == 3).then_some(fields)
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn pod_user_namespace_maps_root_to_an_unprivileged_host_id() {
    let pod = userns_pod("userns-pod").await;
    let status = pod
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
        .unwrap();
    // The network namespace pause made inside the user namespace was pinned and got an address.
    let ip = status.network.map(|n| n.ip).unwrap_or_default();
    assert!(!ip.is_empty(), "the userns pod has no IP");

    // A volume the kubelet asks to be idmapped with the pod's mappings.
    let volume = tempfile::tempdir().unwrap();
    std::fs::write(volume.path().join("from-host"), "x").unwrap();
    let pod_mapping = vec![mapping(0, HOST_ID, LENGTH)];
    let mut config = container(
        "main",
        "cat /proc/self/uid_map; echo owner=$(stat -c %u /bin/busybox); \
         touch /root/mine && echo mine=$(stat -c %u /root/mine); grep CapEff /proc/self/status; \
         echo volume=$(stat -c %u /vol/from-host); touch /vol/from-pod && echo wrote-volume; \
         echo loflags=$(cat /sys/class/net/lo/flags); echo ready; sleep 3600",
    );
    config.mounts = vec![api::Mount {
        container_path: "/vol".into(),
        host_path: volume.path().display().to_string(),
        uid_mappings: pod_mapping.clone(),
        gid_mappings: pod_mapping.clone(),
        ..Default::default()
    }];
    // The kubelet repeats the pod's options on each container.
    config.linux = Some(pod_namespaces(&pod));
    let id = pod.run(config).await;
    let log = pod.wait_log("main", "ready").await;
    assert_eq!(uid_map_line(&log), vec![0, HOST_ID as u64, LENGTH as u64], "{log}");
    // The daemon brought lo up in the namespace pause made (IFF_UP | IFF_LOOPBACK).
    assert!(log.contains("loflags=0x9"), "{log}");
    // Layers are owned by the host's root; through the idmapped view they are the pod's root's.
    assert!(log.contains("owner=0"), "{log}");
    // And the pod's root can write where root can.
    assert!(log.contains("mine=0"), "{log}");
    // The host's root's file in the volume is the pod's root's, and what the pod's root writes
    // there lands on disk as the host's root's (the idmapped mount maps it back), not as
    // HOST_ID, which is what a plain bind would have written.
    assert!(log.contains("volume=0") && log.contains("wrote-volume"), "{log}");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(volume.path().join("from-pod")).unwrap().uid(), 0);
    let main_caps = log
        .lines()
        .find_map(|l| l.split("CapEff:").nth(1))
        .map(str::trim)
        .unwrap()
        .to_string();

    // From the host, the pod's root is HOST_ID.
    let pid = pod.daemon.container_info(&id).await["pid"].as_u64().unwrap() as u32;
    let host_status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let uid_line = host_status.lines().find(|l| l.starts_with("Uid:")).unwrap();
    assert!(
        uid_line.split_whitespace().skip(1).all(|u| u == HOST_ID.to_string()),
        "{uid_line}"
    );

    // An exec'd process joins the same user namespace with the container's identity and caps.
    let exec = pod
        .exec(
            &id,
            &[
                "sh",
                "-c",
                "cat /proc/self/uid_map; id -u; grep CapEff /proc/self/status",
            ],
            10,
        )
        .await
        .unwrap();
    let out = String::from_utf8_lossy(&exec.stdout).into_owned();
    assert_eq!(exec.exit_code, 0, "{out} {}", String::from_utf8_lossy(&exec.stderr));
    assert_eq!(uid_map_line(&out), vec![0, HOST_ID as u64, LENGTH as u64], "{out}");
    assert!(out.lines().any(|l| l.trim() == "0"), "{out}");
    assert!(
        out.contains(&main_caps),
        "exec caps differ from the container's {main_caps}: {out}"
    );

    // Mappings other than the pod's cannot be honoured through its user namespace.
    let mut other = container("other-mapping", "true");
    other.mounts = vec![api::Mount {
        container_path: "/vol".into(),
        host_path: volume.path().display().to_string(),
        uid_mappings: vec![mapping(0, HOST_ID + LENGTH, LENGTH)],
        gid_mappings: vec![mapping(0, HOST_ID + LENGTH, LENGTH)],
        ..Default::default()
    }];
    let err = pod
        .create(other)
        .await
        .expect_err("mount mappings that are not the pod's");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");

    pod.remove_all().await;
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains("idmapped-"), "idmapped views left mounted");
    // The volume is untouched by the removal.
    assert!(volume.path().join("from-host").exists());
}

#[tokio::test]
async fn user_namespace_options_cri_forbids_are_refused() {
    let pod = common::pod::pod("userns-refusals").await;
    let mut runtime = pod.daemon.runtime().await;
    let cases = [
        (
            "two mappings",
            userns(
                api::NamespaceMode::Pod,
                vec![mapping(0, 1000, 100), mapping(100, 5000, 100)],
            ),
        ),
        (
            "container id 0 unmapped",
            userns(api::NamespaceMode::Pod, vec![mapping(1, 1000, 100000)]),
        ),
        ("CONTAINER mode", userns(api::NamespaceMode::Container, vec![])),
        ("TARGET mode", userns(api::NamespaceMode::Target, vec![])),
        (
            "NODE mode with mappings",
            userns(api::NamespaceMode::Node, vec![mapping(0, 1000, 10)]),
        ),
    ];
    for (what, options) in cases {
        let mut config = pod.config.clone();
        config.metadata.as_mut().unwrap().name = format!("refused-{}", what.replace(' ', "-").to_lowercase());
        // On a pod network: a host-network pod with its own user namespace is refused anyway.
        config
            .linux
            .as_mut()
            .unwrap()
            .security_context
            .as_mut()
            .unwrap()
            .namespace_options = Some(api::NamespaceOption::default());
        set_userns(&mut config, options);
        let err = runtime
            .run_pod_sandbox(api::RunPodSandboxRequest {
                config: Some(config),
                runtime_handler: String::new(),
            })
            .await
            .expect_err(what);
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{what}: {err:?}");
    }
    // A container cannot ask for a user namespace its pod does not have.
    let mut config = container("wants-userns", "true");
    config.linux = Some(api::LinuxContainerConfig {
        security_context: Some(api::LinuxContainerSecurityContext {
            namespace_options: Some(api::NamespaceOption {
                network: api::NamespaceMode::Node as i32,
                userns_options: Some(userns(api::NamespaceMode::Pod, vec![mapping(0, HOST_ID, LENGTH)])),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let err = pod
        .create(config)
        .await
        .expect_err("container userns without a pod userns");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    // Nothing was left half-made by the refusals.
    let pods = runtime
        .list_pod_sandbox(api::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(pods.len(), 1, "{pods:?}");
    pod.remove_all().await;
}

#[tokio::test]
async fn status_advertises_user_namespaces_and_recursive_read_only_mounts() {
    let daemon = common::Daemon::start("");
    let status = daemon
        .runtime()
        .await
        .status(api::StatusRequest { verbose: false })
        .await
        .unwrap()
        .into_inner();
    assert!(!status.runtime_handlers.is_empty());
    for handler in status.runtime_handlers {
        let features = handler.features.unwrap();
        assert!(features.user_namespaces, "{}", handler.name);
        assert!(features.recursive_read_only_mounts, "{}", handler.name);
    }
}

#[tokio::test]
async fn image_volumes_are_idmapped_like_the_rootfs() {
    let pod = userns_pod("userns-image-volume").await;
    let image_id = pod.image_status(common::pod::BUSYBOX).await.id;
    let pod_mapping = vec![mapping(0, HOST_ID, LENGTH)];
    let mut config = container(
        "main",
        "echo owner=$(stat -c %u /img/bin/busybox) etc=$(stat -c %u /etc-img); \
         touch /img/x 2>/dev/null && echo img-writable || echo img-read-only; echo ready; sleep 3600",
    );
    // As the kubelet sends them in a hostUsers: false pod: the pod's mappings on every mount.
    config.mounts = ["/img", "/etc-img"]
        .iter()
        .zip(["", "etc"])
        .map(|(at, sub)| api::Mount {
            container_path: at.to_string(),
            image: Some(api::ImageSpec {
                image: image_id.clone(),
                ..Default::default()
            }),
            image_sub_path: sub.into(),
            readonly: true,
            uid_mappings: pod_mapping.clone(),
            gid_mappings: pod_mapping.clone(),
            ..Default::default()
        })
        .collect();
    config.linux = Some(pod_namespaces(&pod));
    pod.run(config).await;
    let log = pod.wait_log("main", "ready").await;
    // The image's files are the host root's; through the idmapped layers, the pod root's.
    assert!(log.contains("owner=0 etc=0"), "{log}");
    // Even the pod's root cannot write to it.
    assert!(log.contains("img-read-only"), "{log}");
    pod.remove_all().await;
    assert!(
        common::mounts_under(&pod.daemon.root)
            .iter()
            .all(|m| !m.contains("/image-volumes/")),
        "{:?}",
        common::mounts_under(&pod.daemon.root)
    );
}
