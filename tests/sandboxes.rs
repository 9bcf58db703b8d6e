//! Pod sandboxes as a user sees them: a real shim running a real pause in real namespaces, a
//! real CNI bridge network (Debian's plugins), files, restarts and cleanup.

mod common;

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::{Daemon, TestNetwork};
use scute::api;
use tonic::Code;

fn pod_config(name: &str) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}"),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: name.into(),
        labels: [("app".to_string(), name.to_string())].into(),
        dns_config: Some(api::DnsConfig {
            servers: vec!["10.96.0.10".into()],
            searches: vec!["default.svc.cluster.local".into()],
            options: vec!["ndots:5".into()],
        }),
        ..Default::default()
    }
}

async fn run(daemon: &Daemon, config: api::PodSandboxConfig) -> Result<String, tonic::Status> {
    daemon.run_pod_sandbox(config).await
}

async fn status(daemon: &Daemon, id: &str) -> Result<api::PodSandboxStatusResponse, tonic::Status> {
    daemon
        .runtime()
        .await
        .pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: id.into(),
            verbose: true,
        })
        .await
        .map(|r| r.into_inner())
}

async fn stop(daemon: &Daemon, id: &str) {
    daemon
        .runtime()
        .await
        .stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: id.into(),
        })
        .await
        .unwrap();
}

async fn remove(daemon: &Daemon, id: &str) {
    daemon
        .runtime()
        .await
        .remove_pod_sandbox(api::RemovePodSandboxRequest {
            pod_sandbox_id: id.into(),
        })
        .await
        .unwrap();
}

fn pause_pid(status: &api::PodSandboxStatusResponse) -> i32 {
    let info: serde_json::Value = serde_json::from_str(&status.info["info"]).unwrap();
    info["pid"].as_i64().unwrap() as i32
}

fn ns_inode(path: impl AsRef<Path>) -> u64 {
    std::fs::metadata(path).unwrap().ino()
}

fn in_netns(netns: &Path, args: &[&str]) -> (bool, String) {
    let out = Command::new("nsenter")
        .arg(format!("--net={}", netns.display()))
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr),
    )
}

fn mounts_under(dir: &Path) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(dir.to_str().unwrap()))
        .map(str::to_string)
        .collect()
}

/// A process's cgroup in the memory hierarchy (v1; on pure v2 the unified one).
fn memory_cgroup(pid: i32) -> String {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let line = |prefix: &str| {
        cgroups
            .lines()
            .find_map(|l| l.split_once(prefix).map(|(_, p)| p.to_string()))
    };
    line(":memory:").or_else(|| line("0::")).unwrap()
}

fn alive(pid: i32) -> bool {
    // A zombie is not alive: it has exited.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s.split(") ").nth(1).unwrap_or("").starts_with('Z'))
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_gets_an_ip_namespaces_and_files_and_cleans_up() {
    let daemon = Daemon::start("");
    let net = TestNetwork::install(&daemon);
    let id = run(&daemon, pod_config("web")).await.unwrap();
    let st = status(&daemon, &id).await.unwrap();
    let s = st.status.as_ref().unwrap();
    assert_eq!(s.state(), api::PodSandboxState::SandboxReady);
    let ip = s.network.as_ref().unwrap().ip.clone();
    assert!(ip.starts_with(&format!("{}.", net.prefix)), "{ip}");
    assert_eq!(s.metadata.as_ref().unwrap().name, "web");
    assert_eq!(s.labels["app"], "web");

    // pause runs, in the pinned netns, with its own pid/uts/ipc namespaces.
    let pid = pause_pid(&st);
    assert!(alive(pid));
    assert_eq!(
        std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap(),
        "/pause\0"
    );
    let netns = daemon.state.join("netns").join(&id);
    assert_eq!(ns_inode(format!("/proc/{pid}/ns/net")), ns_inode(&netns));
    // Its shim (pause's subreaper, so its parent) is in a cgroup beside it, charged to the pod.
    let shim_cgroup = format!("/scute/scute-shim-{}", &id[..32]);
    let shim = common::parent_pid(pid);
    assert_eq!(memory_cgroup(shim), shim_cgroup, "the shim {shim}");
    // In every v1 hierarchy of a controller it manages (a new cpuset level needs cpus and mems
    // before it takes a process; the VM node's pure v2 has none of these lines).
    let managed = [
        "cpu",
        "cpuacct",
        "cpuset",
        "devices",
        "hugetlb",
        "pids",
        "perf_event",
        "memory",
        "blkio",
        "net_prio",
        "net_cls",
        "freezer",
    ];
    let lines = std::fs::read_to_string(format!("/proc/{shim}/cgroup")).unwrap();
    let mut moved = 0;
    for line in lines.lines() {
        let mut fields = line.splitn(3, ':').skip(1);
        let (controllers, path) = (fields.next().unwrap_or_default(), fields.next().unwrap_or_default());
        if controllers.split(',').any(|c| managed.contains(&c)) {
            assert_eq!(path, shim_cgroup, "the shim {shim} in {controllers}:\n{lines}");
            moved += 1;
        }
    }
    assert!(moved > 0 || !lines.contains(":memory:"), "{lines}");
    assert_eq!(memory_cgroup(pid), format!("/scute/scute-{id}"));
    for ns in ["pid", "uts", "ipc", "net"] {
        assert_ne!(
            ns_inode(format!("/proc/{pid}/ns/{ns}")),
            ns_inode(format!("/proc/self/ns/{ns}")),
            "{ns}"
        );
    }
    let (ok, addrs) = in_netns(&netns, &["ip", "-o", "addr"]);
    assert!(ok, "{addrs}");
    assert!(
        addrs.contains(&format!("eth0    inet {ip}/24")) || addrs.contains(&format!("inet {ip}/24")),
        "{addrs}"
    );
    assert!(addrs.contains("lo    inet 127.0.0.1/8"), "{addrs}");

    // Files the pod's containers will share.
    let dir = daemon.root.join("sandboxes").join(&id);
    assert_eq!(std::fs::read_to_string(dir.join("hostname")).unwrap(), "web\n");
    assert_eq!(
        std::fs::read_to_string(dir.join("resolv.conf")).unwrap(),
        "search default.svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
    );
    assert!(std::fs::read_to_string(dir.join("hosts"))
        .unwrap()
        .contains(&format!("{ip}\tweb\n")));
    let uts_hostname = std::fs::read_to_string(format!("/proc/{pid}/root/etc/hostname")).ok();
    let _ = uts_hostname; // pause's rootfs has no /etc; the UTS name is checked below
    let (ok, out) = (
        Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-u", "hostname"])
            .output()
            .unwrap()
            .status
            .success(),
        String::from_utf8_lossy(
            &Command::new("nsenter")
                .args(["-t", &pid.to_string(), "-u", "hostname"])
                .output()
                .unwrap()
                .stdout,
        )
        .to_string(),
    );
    assert!(ok);
    assert_eq!(out.trim(), "web");

    // List with filters.
    let list = |filter: api::PodSandboxFilter| {
        let daemon = &daemon;
        async move {
            daemon
                .runtime()
                .await
                .list_pod_sandbox(api::ListPodSandboxRequest { filter: Some(filter) })
                .await
                .unwrap()
                .into_inner()
                .items
        }
    };
    assert_eq!(
        list(api::PodSandboxFilter {
            id: id[..8].into(),
            ..Default::default()
        })
        .await
        .len(),
        1
    );
    assert_eq!(
        list(api::PodSandboxFilter {
            label_selector: [("app".into(), "nope".into())].into(),
            ..Default::default()
        })
        .await
        .len(),
        0
    );

    // Stop: pause gone, network gone, NotReady; twice is fine.
    stop(&daemon, &id).await;
    stop(&daemon, &id).await;
    assert!(!alive(pid), "pause must be stopped");
    assert!(!netns.exists(), "the pinned netns is released on stop");
    // And every mount: /dev/shm and pause's image view (a stopped pod is never started again).
    assert_eq!(mounts_under(daemon.dir()), Vec::<String>::new());
    let st = status(&daemon, &id).await.unwrap();
    assert_eq!(st.status.unwrap().state(), api::PodSandboxState::SandboxNotready);
    let ready = api::PodSandboxFilter {
        state: Some(api::PodSandboxStateValue {
            state: api::PodSandboxState::SandboxReady as i32,
        }),
        ..Default::default()
    };
    assert!(list(ready).await.is_empty());

    // Remove: nothing left; twice is fine; unknown IDs succeed on stop/remove, NotFound on status.
    remove(&daemon, &id).await;
    remove(&daemon, &id).await;
    assert!(!dir.exists());
    // The plugins ran DEL once, at the first stop: not again on its retry nor on removal (the
    // second DEL cost RemovePodSandbox 2.4x containerd's time).
    let detached = daemon
        .log()
        .lines()
        .filter(|l| l.contains("pod network detached") && l.contains(&id))
        .count();
    assert_eq!(detached, 1, "CNI DEL runs {detached} times for one pod");
    assert!(!daemon.state.join("shims").join(&id[..32]).exists());
    assert_eq!(mounts_under(daemon.dir()), Vec::<String>::new());
    assert!(!Path::new(&format!("/sys/fs/cgroup/memory/scute/scute-{id}")).exists());
    assert!(!Path::new(&format!("/sys/fs/cgroup/pids/scute/scute-{id}")).exists());
    assert!(!alive(shim));
    assert!(!Path::new(&format!("/sys/fs/cgroup/memory{shim_cgroup}")).exists());
    stop(&daemon, "0123456789abcdef").await;
    remove(&daemon, "0123456789abcdef").await;
    assert_eq!(status(&daemon, &id).await.unwrap_err().code(), Code::NotFound);
    let (_, links) = (
        true,
        String::from_utf8_lossy(&Command::new("ip").args(["-o", "link"]).output().unwrap().stdout).to_string(),
    );
    assert!(
        !links.contains(&format!("master {}", net.bridge)),
        "a veth is left on the bridge: {links}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_pods_reach_each_other_over_the_bridge() {
    let daemon = Daemon::start("");
    let _net = TestNetwork::install(&daemon);
    let a = run(&daemon, pod_config("a")).await.unwrap();
    let b = run(&daemon, pod_config("b")).await.unwrap();
    let ip_b = status(&daemon, &b).await.unwrap().status.unwrap().network.unwrap().ip;
    let (ok, out) = in_netns(
        &daemon.state.join("netns").join(&a),
        &["ping", "-c", "1", "-W", "2", &ip_b],
    );
    assert!(ok, "{out}");
    // a's removal leaves the shared parent (/scute) to b: no wait on it, nor a warning that it
    // is busy (each RemovePodSandbox waited 310 ms per hierarchy there, then said so).
    remove(&daemon, &a).await;
    assert!(Path::new(&format!("/sys/fs/cgroup/pids/scute/scute-{b}")).is_dir());
    let busy: Vec<String> = daemon
        .log()
        .lines()
        .filter(|l| l.contains("still busy"))
        .map(String::from)
        .collect();
    assert!(busy.is_empty(), "{busy:#?}");
    remove(&daemon, &b).await;
    assert!(!Path::new(&format!("/sys/fs/cgroup/pids/scute/scute-{b}")).exists());
    assert_eq!(mounts_under(daemon.dir()), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_network_pod_shares_the_host_netns() {
    let daemon = Daemon::start("");
    let mut config = pod_config("hostnet");
    config.linux = Some(api::LinuxPodSandboxConfig {
        security_context: Some(api::LinuxSandboxSecurityContext {
            namespace_options: Some(api::NamespaceOption {
                network: api::NamespaceMode::Node as i32,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    });
    let id = run(&daemon, config).await.unwrap();
    let st = status(&daemon, &id).await.unwrap();
    let pid = pause_pid(&st);
    assert_eq!(ns_inode(format!("/proc/{pid}/ns/net")), ns_inode("/proc/self/ns/net"));
    assert_eq!(st.status.unwrap().network.unwrap().ip, "");
    remove(&daemon, &id).await;
    assert!(!alive(pid));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_and_duplicates() {
    let daemon = Daemon::start("");
    let _net = TestNetwork::install(&daemon);
    let err = daemon
        .runtime()
        .await
        .run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(pod_config("x")),
            runtime_handler: "no-such-handler".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    assert!(err.message().contains("no-such-handler"));
    let err = run(&daemon, api::PodSandboxConfig::default()).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    // What no Kubernetes object can carry, named in the answer; nothing is made.
    let mut blank = pod_config("x");
    blank.metadata.as_mut().unwrap().name = " ".into();
    let mut big_label = pod_config("x");
    big_label.labels.insert("big".into(), "v".repeat(1 << 20));
    let mut no_such_sysctl = pod_config("x");
    no_such_sysctl
        .linux
        .get_or_insert_with(Default::default)
        .sysctls
        .insert("net.ipv4.no_such_sysctl".into(), "1".into());
    for (config, says) in [
        (blank, "metadata.name"),
        (big_label, "labels[\"big\"]"),
        (no_such_sysctl, "net.ipv4.no_such_sysctl"),
    ] {
        let err = run(&daemon, config).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{says}: {err:?}");
        assert!(err.message().contains(says), "{says}: {}", err.message());
    }
    assert!(std::fs::read_dir(daemon.root.join("sandboxes"))
        .map(|d| d.count() == 0)
        .unwrap_or(true));

    let id = run(&daemon, pod_config("dup")).await.unwrap();
    let err = run(&daemon, pod_config("dup")).await.unwrap_err();
    assert_eq!(err.code(), Code::AlreadyExists);
    assert!(err.message().contains(&id), "{}", err.message());
    remove(&daemon, &id).await;
    // The name is free again after removal.
    let again = run(&daemon, pod_config("dup")).await.unwrap();
    remove(&daemon, &again).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigkill_of_the_daemon_keeps_pods_running() {
    let mut daemon = Daemon::start("");
    let _net = TestNetwork::install(&daemon);
    let id = run(&daemon, pod_config("survivor")).await.unwrap();
    let before = status(&daemon, &id).await.unwrap();
    let pid = pause_pid(&before);
    daemon.kill();
    assert!(alive(pid), "pause must survive the daemon");
    daemon.start_again();
    let after = status(&daemon, &id).await.unwrap();
    assert_eq!(
        after.status.as_ref().unwrap().state(),
        api::PodSandboxState::SandboxReady
    );
    assert_eq!(pause_pid(&after), pid);
    assert_eq!(
        after.status.unwrap().network.unwrap().ip,
        before.status.unwrap().network.unwrap().ip
    );
    remove(&daemon, &id).await;
    assert!(!alive(pid));
    assert_eq!(mounts_under(daemon.dir()), Vec::<String>::new());
}

#[allow(dead_code)]
fn unused(_: PathBuf) {}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn interrupted_creations_are_removed_at_restart() {
    use scute::container::record::{ContainerRecord, ContainerState};
    use scute::sandbox::record::{SandboxRecord, SandboxState};

    let mut daemon = Daemon::start("");
    daemon.stop();
    // What a SIGKILL in the middle of RunPodSandbox / CreateContainer leaves: records whose
    // pause or process was never started, their names reserved, a directory on disk.
    {
        let store = scute::store::Store::open(&daemon.root.join("meta.redb")).unwrap();
        let sandbox_id = "a".repeat(64);
        store
            .create(
                "half_default_u_0",
                &SandboxRecord {
                    id: sandbox_id.clone(),
                    name: "half_default_u_0".into(),
                    config: SandboxRecord::encode_config(&pod_config("half")),
                    runtime_handler: String::new(),
                    created_at: 1,
                    state: SandboxState::NotReady,
                    ips: vec![],
                    netns: None,
                    pause_pid: 0,
                    cni_result: None,
                    cgroups_path: format!("/scute/scute-{sandbox_id}"),
                    unclaimed: false,
                    network_released: false,
                },
            )
            .unwrap();
        let container_id = "b".repeat(64);
        std::fs::create_dir_all(daemon.root.join("containers").join(&container_id)).unwrap();
        store
            .create(
                "c_half_default_u_0",
                &ContainerRecord {
                    id: container_id.clone(),
                    name: "c_half_default_u_0".into(),
                    sandbox_id,
                    config: vec![],
                    image_ref: "busybox".into(),
                    image_name: "busybox".into(),
                    image_id: scute::distribution::digest::Digest::of(b"x"),
                    chain_ids: vec![],
                    image_volumes: vec![],
                    state: ContainerState::Created,
                    pid: 0,
                    created_at: 1,
                    started_at: 0,
                    finished_at: 0,
                    exit_code: 0,
                    reason: String::new(),
                    message: String::new(),
                    log_path: String::new(),
                    cgroups_path: String::new(),
                    user: None,
                    unclaimed: false,
                    restored_from: None,
                    deferred: false,
                },
            )
            .unwrap();
    }
    daemon.start_again();
    let pods = daemon.pods().await;
    let mut client = daemon.runtime().await;
    assert!(pods.is_empty(), "{pods:?}");
    let containers = client
        .list_containers(api::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert!(containers.is_empty(), "{containers:?}");
    assert!(!daemon.root.join("containers").join("b".repeat(64)).exists());
}

/// The network is attached while pause is made; when the network fails (here: its one address
/// is taken), pause, its shim, the netns and every mount go again, and the name is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_whose_network_fails_leaves_nothing() {
    let daemon = Daemon::start("");
    let mut net = TestNetwork::install(&daemon);
    // A /30 whose gateway is .1: one pod address, .2.
    net.prefix = format!("10.199.{}", std::process::id() % 250);
    bridge_network(&daemon, "bridge", &net.bridge, &format!("{}.0/30", net.prefix));
    let first = run(&daemon, pod_config("first")).await.unwrap();
    let shims = common::shims_of(daemon.dir());
    let mounts = mounts_under(daemon.dir());
    let pins = || std::fs::read_dir(daemon.state.join("netns")).unwrap().count();
    assert_eq!((shims.len(), pins()), (1, 1));

    let err = run(&daemon, pod_config("second")).await.unwrap_err();
    assert_eq!(err.code(), Code::Internal, "{err:?}");
    assert!(
        err.message().contains("setting up the pod network"),
        "{}",
        err.message()
    );
    // Only the first pod is left: its shim, its mounts, its netns pin, its record and dirs.
    assert_eq!(common::shims_of(daemon.dir()), shims);
    assert_eq!(mounts_under(daemon.dir()), mounts);
    assert_eq!(pins(), 1);
    let pods = daemon.pods().await;
    assert_eq!(
        pods.iter().map(|p| p.id.as_str()).collect::<Vec<_>>(),
        vec![first.as_str()]
    );
    assert_eq!(std::fs::read_dir(daemon.root.join("sandboxes")).unwrap().count(), 1);

    // With the address free again, the name is free too.
    remove(&daemon, &first).await;
    let second = run(&daemon, pod_config("second")).await.unwrap();
    remove(&daemon, &second).await;
    assert_eq!(mounts_under(daemon.dir()), Vec::<String>::new());
    assert!(common::shims_of(daemon.dir()).is_empty());
}

/// A sysctl of the pod's interface: pause sets it, so the interface must be there first, even
/// when the network is slow to come (a bridge plugin that takes a second here).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sysctl_of_the_pod_interface_applies() {
    let daemon = Daemon::start("");
    let net = TestNetwork::install(&daemon);
    wrapped_bridge_network(&daemon, &net, "slow-bridge", "sleep 1");
    // Not what a new netns inherits from the host.
    let host = std::fs::read_to_string("/proc/sys/net/ipv4/conf/default/rp_filter").unwrap();
    let wanted = ((host.trim().parse::<u32>().unwrap() + 1) % 3).to_string();
    let mut config = pod_config("ifsysctl");
    config
        .linux
        .get_or_insert_with(Default::default)
        .sysctls
        .insert("net.ipv4.conf.eth0.rp_filter".into(), wanted.clone());
    let id = run(&daemon, config).await.unwrap();
    let netns = daemon.state.join("netns").join(&id);
    let (ok, out) = in_netns(&netns, &["cat", "/proc/sys/net/ipv4/conf/eth0/rp_filter"]);
    assert!(ok, "{out}");
    assert_eq!(out.trim(), wanted);
    remove(&daemon, &id).await;
}

/// A StopPodSandbox whose CNI DEL fails: pause is stopped and the pod's shim ended all the
/// same, so the pod is NotReady at once (nothing says its shim died or its pause exited by
/// itself), the error says why, and the kubelet's retry releases the network and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_whose_network_release_fails_leaves_the_pod_not_ready_for_a_retry() {
    let daemon = Daemon::start("");
    let net = TestNetwork::install(&daemon);
    let refuse = daemon.dir().join("refuse-del");
    let before = format!(
        "if [ \"$CNI_COMMAND\" = DEL ] && [ -e {refuse:?} ]; then\n  \
         echo '{{\"cniVersion\":\"1.0.0\",\"code\":11,\"msg\":\"DEL refused by the test\"}}'\n  exit 1\nfi"
    );
    wrapped_bridge_network(&daemon, &net, "refusing-bridge", &before);
    let id = run(&daemon, pod_config("refused")).await.unwrap();
    let pause = pause_pid(&status(&daemon, &id).await.unwrap());
    assert_eq!(common::shims_of(daemon.dir()).len(), 1);

    std::fs::write(&refuse, "").unwrap();
    let err = daemon
        .runtime()
        .await
        .stop_pod_sandbox(api::StopPodSandboxRequest {
            pod_sandbox_id: id.clone(),
        })
        .await
        .unwrap_err();
    assert!(err.message().contains("DEL refused by the test"), "{err:?}");
    let state = status(&daemon, &id).await.unwrap().status.unwrap().state();
    assert_eq!(state, api::PodSandboxState::SandboxNotready);
    assert!(!alive(pause), "pause outlived the stop");
    assert_eq!(common::shims_of(daemon.dir()), Vec::new(), "the shim outlived the stop");
    assert!(
        daemon.state.join("netns").join(&id).exists(),
        "the netns went before its DEL"
    );
    // Long enough for the exit watcher to see the shim gone (it looks again after 200 ms).
    tokio::time::sleep(std::time::Duration::from_millis(600)).await;
    let log = daemon.log();
    assert!(
        !log.contains("the pod's shim died") && !log.contains("pause exited by itself"),
        "{log}"
    );

    std::fs::remove_file(&refuse).unwrap();
    stop(&daemon, &id).await;
    assert!(
        !daemon.state.join("netns").join(&id).exists(),
        "the retry left the netns"
    );
    let master = format!("master {} ", net.bridge);
    let links = Command::new("ip").args(["-o", "link"]).output().unwrap();
    let veths: Vec<String> = String::from_utf8_lossy(&links.stdout)
        .lines()
        .filter(|l| l.contains(&master))
        .map(str::to_string)
        .collect();
    assert_eq!(veths, Vec::<String>::new(), "veths left on the bridge");
    remove(&daemon, &id).await;
    assert_eq!(mounts_under(daemon.dir()), Vec::<String>::new());
    assert!(daemon.pods().await.is_empty());
}

/// Replaces the test network with one plugin `name` of the daemon's own plugin dir: a script
/// that runs the shell lines `before` (`$CNI_COMMAND` says what was asked), then the real bridge
/// plugin, on the test network's bridge and subnet.
fn wrapped_bridge_network(daemon: &Daemon, net: &TestNetwork, name: &str, before: &str) {
    use std::os::unix::fs::PermissionsExt;
    let bins = daemon.dir().join("cni-bin");
    std::fs::create_dir_all(&bins).unwrap();
    let bridge = ["/opt/cni/bin/bridge", "/usr/lib/cni/bridge"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("the CNI bridge plugin");
    let plugin = bins.join(name);
    std::fs::write(&plugin, format!("#!/bin/sh\n{before}\nexec {bridge} \"$@\"\n")).unwrap();
    std::fs::set_permissions(&plugin, std::fs::Permissions::from_mode(0o755)).unwrap();
    bridge_network(daemon, name, &net.bridge, &format!("{}.0/24", net.prefix));
}

/// Replaces the test network with one `plugin` (the bridge plugin, or a wrapper of it) on
/// `bridge` with host-local addresses from `subnet`.
fn bridge_network(daemon: &Daemon, plugin: &str, bridge: &str, subnet: &str) {
    let conflist = serde_json::json!({
        "cniVersion": "1.0.0",
        "name": "scute-test",
        "plugins": [{
            "type": plugin, "bridge": bridge, "isGateway": true, "ipMasq": false,
            "ipam": {"type": "host-local", "ranges": [[{"subnet": subnet}]],
                     "dataDir": daemon.dir().join("cni-ipam")},
        }],
    });
    std::fs::write(daemon.cni_conf_dir.join("10-test.conflist"), conflist.to_string()).unwrap();
}
