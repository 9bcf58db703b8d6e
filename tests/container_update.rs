//! UpdateContainerResources end to end: a running busybox container in a real pod gets new CPU and
//! memory limits through its shim (libcgroups in the shim's helper), the cgroup files hold them,
//! ContainerStatus reports them; unknown IDs, bad values and exited containers behave as with
//! containerd; nothing is left behind.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use common::pod::{pod, Pod, BUSYBOX};
use scute::api;
use tonic::Code;

const MIB: i64 = 1 << 20;

/// What these tests ask of the pod beyond what `common::pod` offers.
trait UpdateRig {
    async fn status_and_info(&self, id: &str) -> (api::ContainerStatus, serde_json::Value);
    async fn devices_work_and_stay_confined(&self, id: &str);
    async fn update(&self, id: &str, linux: api::LinuxContainerResources) -> Result<(), tonic::Status>;
}

impl UpdateRig for Pod {
    /// The status and the verbose info's JSON.
    async fn status_and_info(&self, id: &str) -> (api::ContainerStatus, serde_json::Value) {
        let resp = self
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
        let info = serde_json::from_str(&resp.info["info"]).unwrap();
        (resp.status.unwrap(), info)
    }

    /// /dev/null and /dev/zero work; a node the container makes of a device its spec does not
    /// allow (/dev/kmsg, 1:11) is made (mknod is allowed, as in every runtime) but does not open:
    /// the device cgroup, whichever the driver.
    async fn devices_work_and_stay_confined(&self, id: &str) {
        let script = "echo x > /dev/null && head -c 4 /dev/zero | wc -c && rm -f /tmp/kmsg && \
            mknod /tmp/kmsg c 1 11 && echo mknod-ok && echo scute-device-test > /tmp/kmsg && echo kmsg-open";
        let out = self
            .daemon
            .runtime()
            .await
            .exec_sync(api::ExecSyncRequest {
                container_id: id.into(),
                cmd: ["sh", "-c", script].map(String::from).to_vec(),
                timeout: 10,
            })
            .await
            .unwrap()
            .into_inner();
        let (stdout, stderr) = (
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr),
        );
        assert_eq!(stdout.lines().collect::<Vec<_>>(), ["4", "mknod-ok"], "{stderr}");
        assert!(stderr.contains("Operation not permitted"), "{stderr}");
        assert_ne!(out.exit_code, 0);
    }

    async fn update(&self, id: &str, linux: api::LinuxContainerResources) -> Result<(), tonic::Status> {
        self.daemon
            .runtime()
            .await
            .update_container_resources(api::UpdateContainerResourcesRequest {
                container_id: id.into(),
                linux: Some(linux),
                ..Default::default()
            })
            .await
            .map(|_| ())
    }
}

fn resources(status: &api::ContainerStatus) -> api::LinuxContainerResources {
    status
        .resources
        .as_ref()
        .and_then(|r| r.linux.clone())
        .expect("ContainerStatus.resources.linux")
}

/// Where the cgroup v1 hierarchy with `controller` is mounted (`cpu`, `cpu,cpuacct`, ...).
fn v1_mount(controller: &str) -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    mountinfo.lines().find_map(|line| {
        let (left, right) = line.split_once(" - ")?;
        let mut right = right.split(' ');
        if right.next()? != "cgroup" {
            return None;
        }
        let options = right.nth(1)?;
        if !options.split(',').any(|o| o == controller) {
            return None;
        }
        left.split(' ').nth(4).map(PathBuf::from)
    })
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
        .trim()
        .to_string()
}

/// The container's CPU and memory limits as the kernel has them: (memory limit, cpu shares or
/// weight, quota, period).
fn cgroup_limits(cgroups_path: &str) -> (String, String, String, String) {
    let rel = cgroups_path.trim_start_matches('/');
    match (v1_mount("memory"), v1_mount("cpu")) {
        (Some(memory), Some(cpu)) => {
            let cpu = cpu.join(rel);
            (
                read(&memory.join(rel).join("memory.limit_in_bytes")),
                read(&cpu.join("cpu.shares")),
                read(&cpu.join("cpu.cfs_quota_us")),
                read(&cpu.join("cpu.cfs_period_us")),
            )
        }
        _ => {
            // cgroup v2 only.
            let dir = Path::new("/sys/fs/cgroup").join(rel);
            let max = read(&dir.join("cpu.max"));
            let (quota, period) = max.split_once(' ').unwrap();
            (
                read(&dir.join("memory.max")),
                read(&dir.join("cpu.weight")),
                quota.to_string(),
                period.to_string(),
            )
        }
    }
}

fn is_v1() -> bool {
    v1_mount("memory").is_some() && v1_mount("cpu").is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn running_container_gets_new_cpu_and_memory_limits() {
    let pod = pod("upd").await;
    let config = api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: "main".into(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: BUSYBOX.into(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), "exec sleep 3600".into()],
        log_path: "main.log".into(),
        linux: Some(api::LinuxContainerConfig {
            resources: Some(api::LinuxContainerResources {
                memory_limit_in_bytes: 64 * MIB,
                cpu_shares: 512,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = pod.run(config).await;
    let (status, info) = pod.status_and_info(&id).await;
    assert_eq!(status.state(), api::ContainerState::ContainerRunning);
    let cgroups_path = scute::cgroups::dir(info["cgroupsPath"].as_str().unwrap());
    assert!(!cgroups_path.is_empty());
    pod.devices_work_and_stay_confined(&id).await;
    let before = cgroup_limits(&cgroups_path);
    assert_eq!(before.0, (64 * MIB).to_string());
    if is_v1() {
        assert_eq!(before.1, "512");
        assert_eq!(before.2, "-1", "no quota at creation");
    }
    assert_eq!(resources(&status).memory_limit_in_bytes, 64 * MIB);

    pod.update(
        &id,
        api::LinuxContainerResources {
            memory_limit_in_bytes: 128 * MIB,
            cpu_shares: 1024,
            cpu_quota: 50_000,
            cpu_period: 100_000,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let after = cgroup_limits(&cgroups_path);
    assert_eq!(after.0, (128 * MIB).to_string(), "memory limit");
    if is_v1() {
        assert_eq!(after.1, "1024", "cpu.shares");
        let memsw = v1_mount("memory")
            .unwrap()
            .join(cgroups_path.trim_start_matches('/'))
            .join("memory.memsw.limit_in_bytes");
        if memsw.exists() {
            // No swap beyond the limit, as at creation.
            assert_eq!(read(&memsw), (128 * MIB).to_string());
        }
    } else {
        assert_ne!(after.1, before.1, "cpu.weight follows the shares");
    }
    assert_eq!(
        (after.2.as_str(), after.3.as_str()),
        ("50000", "100000"),
        "quota, period"
    );

    let (status, _) = pod.status_and_info(&id).await;
    assert_eq!(status.state(), api::ContainerState::ContainerRunning);
    let r = resources(&status);
    assert_eq!(
        (r.memory_limit_in_bytes, r.cpu_shares, r.cpu_quota, r.cpu_period),
        (128 * MIB, 1024, 50_000, 100_000)
    );

    // The container still works, its devices and their confinement included.
    pod.devices_work_and_stay_confined(&id).await;

    // A field left zero keeps its value; only the memory limit changes.
    pod.update(
        &id,
        api::LinuxContainerResources {
            memory_limit_in_bytes: 96 * MIB,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let now = cgroup_limits(&cgroups_path);
    assert_eq!(now.0, (96 * MIB).to_string());
    assert_eq!((&now.1, &now.2), (&after.1, &after.2));
    let r = resources(&pod.status_and_info(&id).await.0);
    assert_eq!((r.memory_limit_in_bytes, r.cpu_shares), (96 * MIB, 1024));

    // Bad requests.
    let err = pod
        .update(
            "0123456789abcdef-unknown",
            api::LinuxContainerResources {
                memory_limit_in_bytes: 128 * MIB,
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    let err = pod
        .update(
            &id,
            api::LinuxContainerResources {
                cpu_shares: -5,
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert_eq!(cgroup_limits(&cgroups_path).1, now.1, "nothing applied");

    // An exited container: as containerd, the update is recorded, nothing else.
    pod.daemon
        .runtime()
        .await
        .stop_container(api::StopContainerRequest {
            container_id: id.clone(),
            timeout: 0,
        })
        .await
        .unwrap();
    let mut exited = false;
    for _ in 0..100 {
        if pod.status_and_info(&id).await.0.state() == api::ContainerState::ContainerExited {
            exited = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(exited);
    pod.update(
        &id,
        api::LinuxContainerResources {
            memory_limit_in_bytes: 256 * MIB,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let (status, _) = pod.status_and_info(&id).await;
    assert_eq!(status.state(), api::ContainerState::ContainerExited);
    assert_eq!(resources(&status).memory_limit_in_bytes, 256 * MIB);

    // Cleanup leaves nothing: no cgroup, mount or container directory (remove_all checks the
    // last two).
    pod.remove_all().await;
    let rel = cgroups_path.trim_start_matches('/');
    let dirs: Vec<PathBuf> = if is_v1() {
        ["memory", "cpu", "cpuset", "pids"]
            .iter()
            .filter_map(|c| v1_mount(c))
            .map(|m| m.join(rel))
            .collect()
    } else {
        vec![Path::new("/sys/fs/cgroup").join(rel)]
    };
    for dir in dirs {
        assert!(!dir.exists(), "cgroup left: {}", dir.display());
    }
}

/// The kubelet's CPU and memory managers update a container between its create and its start
/// (PreStartContainer): the cgroup its start makes has the updated limits (the ones the update
/// left alone as created), its device rules still confine it, its status reports them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_container_starts_with_the_limits_updated_before_its_start() {
    let pod = pod("updc").await;
    let mut config = common::pod::container("main", "exec sleep 3600");
    config.linux = Some(api::LinuxContainerConfig {
        resources: Some(api::LinuxContainerResources {
            memory_limit_in_bytes: 64 * MIB,
            cpu_shares: 512,
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = pod.create(config).await.unwrap();
    pod.update(
        &id,
        api::LinuxContainerResources {
            memory_limit_in_bytes: 96 * MIB,
            cpu_quota: 20_000,
            cpu_period: 100_000,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let (status, _) = pod.status_and_info(&id).await;
    assert_eq!(status.state(), api::ContainerState::ContainerCreated);
    assert_eq!(resources(&status).memory_limit_in_bytes, 96 * MIB);
    pod.start(&id).await;
    let (status, info) = pod.status_and_info(&id).await;
    assert_eq!(status.state(), api::ContainerState::ContainerRunning);
    let cgroups_path = scute::cgroups::dir(info["cgroupsPath"].as_str().unwrap());
    let (memory, shares, quota, period) = cgroup_limits(&cgroups_path);
    assert_eq!(memory, (96 * MIB).to_string(), "memory limit");
    assert_eq!((quota.as_str(), period.as_str()), ("20000", "100000"), "CPU quota");
    if is_v1() {
        assert_eq!(shares, "512", "the shares the update left alone");
    }
    pod.devices_work_and_stay_confined(&id).await;
    assert_eq!(resources(&status).memory_limit_in_bytes, 96 * MIB);
    pod.remove_all().await;
}

/// The controllers this pure cgroup v2 host has (None on a v1 or hybrid host).
fn v2_controllers() -> Option<Vec<String>> {
    let text = std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers").ok()?;
    Some(text.split_whitespace().map(str::to_string).collect())
}

/// On pure cgroup v2 (the VM node runs this with each driver): hugepage limits, the swap limit
/// of LimitedSwap and unified keys reach the container's cgroup files at creation and with an
/// update. libcgroups' systemd manager has no unit property for hugetlb or for unified keys such
/// as memory.oom.group and drops them; the shim writes them into the scope (enabling hugetlb,
/// which systemd leaves off), as runc's systemd driver does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pure_v2_hugetlb_swap_and_unified_keys_reach_the_cgroup() {
    let Some(controllers) = v2_controllers() else {
        eprintln!("skipped: not a pure cgroup v2 host (the VM node runs this test)");
        return;
    };
    let has = |c: &str| controllers.iter().any(|x| x == c);
    assert!(has("memory"), "controllers: {controllers:?}");
    let hugetlb = has("hugetlb");
    if !hugetlb {
        eprintln!("this kernel has no hugetlb controller: hugepage limits are not checked");
    }
    // io is a controller systemd manages: it turns it on only for units that ask for an IO
    // setting (the IOWeight property, which libcgroups does not map io.weight to), and may turn
    // it off again. So io.weight is checked with the cgroupfs driver only.
    let io_weight = !common::systemd_driver();
    let unified = |oom_group: &str, weight: &str| {
        let mut keys = vec![("memory.oom.group".to_string(), oom_group.to_string())];
        if io_weight {
            keys.push(("io.weight".to_string(), format!("default {weight}")));
        }
        keys.into_iter().collect::<std::collections::HashMap<_, _>>()
    };
    let pod = pod("v2files").await;
    let hugepages = |limit: u64| {
        if hugetlb {
            vec![api::HugepageLimit {
                page_size: "2MB".into(),
                limit,
            }]
        } else {
            vec![]
        }
    };
    let config = api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: "main".into(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: BUSYBOX.into(),
            ..Default::default()
        }),
        command: vec!["sh".into(), "-c".into(), "exec sleep 3600".into()],
        log_path: "main.log".into(),
        linux: Some(api::LinuxContainerConfig {
            resources: Some(api::LinuxContainerResources {
                memory_limit_in_bytes: 64 * MIB,
                // The kubelet's LimitedSwap: memory + swap, as runc's and the CRI's unit.
                memory_swap_limit_in_bytes: 96 * MIB,
                hugepage_limits: hugepages(4 << 20),
                unified: unified("1", "300"),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    };
    let id = pod.run(config).await;
    let (status, info) = pod.status_and_info(&id).await;
    assert_eq!(status.state(), api::ContainerState::ContainerRunning);
    let dir = Path::new("/sys/fs/cgroup")
        .join(scute::cgroups::dir(info["cgroupsPath"].as_str().unwrap()).trim_start_matches('/'));
    assert_eq!(read(&dir.join("memory.max")), (64 * MIB).to_string());
    assert_eq!(
        read(&dir.join("memory.swap.max")),
        (32 * MIB).to_string(),
        "swap beyond the memory limit"
    );
    assert_eq!(read(&dir.join("memory.oom.group")), "1");
    if io_weight {
        assert_eq!(read(&dir.join("io.weight")), "default 300");
    }
    if hugetlb {
        assert_eq!(read(&dir.join("hugetlb.2MB.max")), (4u64 << 20).to_string());
    }

    pod.update(
        &id,
        api::LinuxContainerResources {
            memory_limit_in_bytes: 64 * MIB,
            memory_swap_limit_in_bytes: 128 * MIB,
            hugepage_limits: hugepages(8 << 20),
            unified: unified("0", "200"),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    assert_eq!(read(&dir.join("memory.swap.max")), (64 * MIB).to_string());
    assert_eq!(read(&dir.join("memory.oom.group")), "0");
    if io_weight {
        assert_eq!(read(&dir.join("io.weight")), "default 200");
    }
    if hugetlb {
        assert_eq!(read(&dir.join("hugetlb.2MB.max")), (8u64 << 20).to_string());
    }
    // A unified key that names no file of this host is refused, not dropped.
    let err = pod
        .update(
            &id,
            api::LinuxContainerResources {
                unified: [("memory.nonexistent".to_string(), "1".to_string())].into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert!(err.message().contains("memory.nonexistent"), "{err:?}");

    pod.remove_all().await;
    assert!(!dir.exists(), "cgroup left: {}", dir.display());
}
