//! A real kubelet (v1.36.2, standalone, static pods) driving scute (issue 14): each test checks
//! what the kubelet reports against what actually runs on the host (processes, namespaces, cgroup
//! files, log files, exit codes) and what scute answers over CRI. Skipped, saying so, without
//! `../shared/tools`. The harness is tests/common/kubelet.rs.

mod common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::kubelet::{container_id, container_status, figure, Node};
use common::pod::BUSYBOX;
use scute::api;
use serde_json::{json, Value};

const HTTPD: &str = "registry.k8s.io/e2e-test-images/httpd:2.4.39-4";
/// How long a pod may take to get where a test waits for it: 120 s, times
/// `SCUTE_TEST_TIME_SCALE` (the VM node sets 3: an emulated guest on a busy host runs at a
/// tenth of the host's speed or less).
fn start() -> Duration {
    let scale = std::env::var("SCUTE_TEST_TIME_SCALE")
        .ok()
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(1)
        .max(1);
    Duration::from_secs(120) * scale
}

/// scute's verbose ContainerStatus: the CRI status and the container's host pid.
async fn cri_container(node: &Node, id: &str) -> (api::ContainerStatus, i32) {
    let reply = node
        .daemon
        .runtime()
        .await
        .container_status(api::ContainerStatusRequest {
            container_id: id.into(),
            verbose: true,
        })
        .await
        .unwrap_or_else(|e| panic!("ContainerStatus {id}: {e}"))
        .into_inner();
    let info: Value = serde_json::from_str(reply.info.get("info").map(String::as_str).unwrap_or("{}")).unwrap();
    (reply.status.unwrap(), info["pid"].as_i64().unwrap_or(0) as i32)
}

/// The inode of a process's namespace `kind`.
fn ns_inode(pid: i32, kind: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(format!("/proc/{pid}/ns/{kind}"))
        .unwrap_or_else(|e| panic!("/proc/{pid}/ns/{kind}: {e}"))
        .ino()
}

/// The lines a container wrote, from the kubelet's pod log dir (CRI log format: time, stream,
/// P/F tag, text), as (stream, text).
fn log_lines(node: &Node, pod: &Value, container: &str) -> Vec<(String, String)> {
    let dir = node.pod_logs_dir().join(format!(
        "{}_{}_{}/{container}",
        pod["metadata"]["namespace"].as_str().unwrap(),
        pod["metadata"]["name"].as_str().unwrap(),
        pod["metadata"]["uid"].as_str().unwrap()
    ));
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    let mut lines = Vec::new();
    for file in files {
        for line in std::fs::read_to_string(&file).unwrap_or_default().lines() {
            let mut parts = line.splitn(4, ' ');
            let (Some(time), Some(stream), Some(tag), text) = (parts.next(), parts.next(), parts.next(), parts.next())
            else {
                panic!("{}: not a CRI log line: {line:?}", file.display());
            };
            assert!(
                chrono_like(time) && (stream == "stdout" || stream == "stderr") && (tag == "F" || tag == "P"),
                "{}: not a CRI log line: {line:?}",
                file.display()
            );
            lines.push((stream.to_string(), text.unwrap_or_default().to_string()));
        }
    }
    lines
}

/// An RFC 3339 timestamp with nanoseconds, as the CRI log format has.
fn chrono_like(time: &str) -> bool {
    time.len() >= 20 && time.as_bytes()[4] == b'-' && time.as_bytes()[10] == b'T' && time.contains(':')
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pod_runs_ready_and_its_containers_share_the_network() {
    let Some(node) = Node::start("ready", json!({})) else {
        return;
    };
    let written = Instant::now();
    let name = node.apply(json!({
        "metadata": {"name": "web"},
        "spec": {"containers": [
            {"name": "httpd", "image": HTTPD,
             "readinessProbe": {"httpGet": {"path": "/", "port": 80}, "periodSeconds": 1}},
            {"name": "client", "image": BUSYBOX, "command": ["sh", "-c",
                "until wget -q -O /tmp/page http://127.0.0.1:80/; do sleep 0.2; done; echo fetched over loopback; sleep 3600"]},
        ]},
    }));
    let pod = node.wait_ready(&name, start()).await;
    common::kubelet::figure(&format!("manifest → Ready: {:?}", written.elapsed()));

    // The kubelet's containers are scute's, running, in one network namespace with pause.
    let mut pids = Vec::new();
    for container in ["httpd", "client"] {
        let status = container_status(&pod, container);
        assert_eq!(status["ready"], true, "{container}: {status:#}");
        assert!(status["state"]["running"].is_object(), "{container}: {status:#}");
        assert_eq!(status["image"], if container == "httpd" { HTTPD } else { BUSYBOX });
        let (cri, pid) = cri_container(&node, &container_id(&status)).await;
        assert_eq!(cri.state, api::ContainerState::ContainerRunning as i32, "{container}");
        assert!(pid > 0 && common::alive(pid), "{container}: pid {pid} not running");
        pids.push(pid);
    }
    assert_eq!(ns_inode(pids[0], "net"), ns_inode(pids[1], "net"));
    assert_ne!(
        ns_inode(pids[0], "net"),
        ns_inode(std::process::id() as i32, "net"),
        "the pod is not on the host network"
    );

    // The pod IP the kubelet reports is the one scute's CNI network gave the sandbox.
    let mut runtime = node.daemon.runtime().await;
    let sandboxes = runtime
        .list_pod_sandbox(api::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .into_inner()
        .items;
    assert_eq!(sandboxes.len(), 1, "{sandboxes:#?}");
    let sandbox = runtime
        .pod_sandbox_status(api::PodSandboxStatusRequest {
            pod_sandbox_id: sandboxes[0].id.clone(),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .status
        .unwrap();
    let ip = sandbox.network.unwrap().ip;
    assert!(!ip.is_empty());
    assert_eq!(pod["status"]["podIP"], ip.as_str());

    // The client reached httpd on 127.0.0.1: its log line, in CRI format in the kubelet's dir.
    let deadline = Instant::now() + Duration::from_secs(20);
    while !log_lines(&node, &pod, "client").contains(&("stdout".into(), "fetched over loopback".into())) {
        assert!(
            Instant::now() < deadline,
            "client log: {:?}",
            log_lines(&node, &pod, "client")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The restart count and the last termination's exit code of a container, from the kubelet.
fn restarts(pod: &Value, container: &str) -> i64 {
    container_status(pod, container)["restartCount"].as_i64().unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restart_policies_always_on_failure_never() {
    let Some(node) = Node::start("restarts", json!({})) else {
        return;
    };
    let exiting = |name: &str, policy: &str, code: i32| {
        json!({
            "metadata": {"name": name},
            "spec": {"restartPolicy": policy, "containers": [
                {"name": "main", "image": BUSYBOX, "command": ["sh", "-c", format!("echo attempt; exit {code}")]},
            ]},
        })
    };
    let always = node.apply(exiting("always", "Always", 1));
    let done = node.apply(exiting("onfailure", "OnFailure", 0));
    let failed = node.apply(exiting("never", "Never", 3));

    // Never: Failed with the exit code scute reported, not restarted. (The kubelet removes a
    // terminated pod's containers at once, so scute's own record may already be gone.)
    let pod = node.wait_phase(&failed, "Failed", start()).await;
    let status = container_status(&pod, "main");
    assert_eq!(status["state"]["terminated"]["exitCode"], 3, "{status:#}");
    assert_eq!(restarts(&pod, "main"), 0);

    // OnFailure with exit 0: Succeeded, never restarted.
    let pod = node.wait_phase(&done, "Succeeded", start()).await;
    assert_eq!(container_status(&pod, "main")["state"]["terminated"]["exitCode"], 0);
    assert_eq!(restarts(&pod, "main"), 0);

    // Always: restarted after each exit; each attempt is a new scute container: the attempt
    // lastState names changes from one restart to the next. (Between attempts, in its back-off,
    // the kubelet names the exited container as both the current and the last one; and it
    // removes all but the newest exited attempt, so the one lastState names may be gone.)
    let pod = node
        .wait_for(&always, "restarted", start(), |p| restarts(p, "main") >= 1)
        .await;
    let status = container_status(&pod, "main");
    assert_eq!(status["lastState"]["terminated"]["exitCode"], 1, "{status:#}");
    let first = container_id(&status["lastState"]["terminated"]);
    assert!(!first.is_empty(), "{status:#}");
    // The attempt seen first may be the one in back-off (named as current and last), which the
    // next attempt's lastState names again: wait for lastState to name another container, which
    // only a new scute container for a later attempt can give.
    let pod = node
        .wait_for(&always, "restarted with a new container", start(), |p| {
            let last = container_id(&container_status(p, "main")["lastState"]["terminated"]);
            !last.is_empty() && last != first
        })
        .await;
    let status = container_status(&pod, "main");
    assert_eq!(status["lastState"]["terminated"]["exitCode"], 1, "{status:#}");
    let pod_uid = pod["metadata"]["uid"].as_str().unwrap().to_string();
    let attempts: Vec<u32> = node
        .daemon
        .runtime()
        .await
        .list_containers(api::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers
        .into_iter()
        .filter(|c| c.labels.get("io.kubernetes.pod.uid") == Some(&pod_uid))
        .map(|c| c.metadata.unwrap().attempt)
        .collect();
    assert!(
        attempts.iter().any(|a| *a >= 1),
        "no restarted attempt among scute's containers of the pod: {attempts:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_drive_restarts_and_readiness() {
    let Some(node) = Node::start("probes", json!({})) else {
        return;
    };
    // Liveness (exec): alive while /tmp/alive exists; it is removed after 3 s.
    let liveness = node.apply(json!({
        "metadata": {"name": "liveness"},
        "spec": {"containers": [{"name": "main", "image": BUSYBOX,
            "command": ["sh", "-c", "touch /tmp/alive; sleep 3; rm /tmp/alive; sleep 3600"],
            "livenessProbe": {"exec": {"command": ["cat", "/tmp/alive"]}, "periodSeconds": 1, "failureThreshold": 1},
        }]},
    }));
    // Startup (tcpSocket) then readiness (httpGet) on httpd; a readiness probe that never passes.
    let web = node.apply(json!({
        "metadata": {"name": "web"},
        "spec": {"containers": [
            {"name": "httpd", "image": HTTPD,
             "startupProbe": {"tcpSocket": {"port": 80}, "periodSeconds": 1, "failureThreshold": 30},
             "readinessProbe": {"httpGet": {"path": "/", "port": 80}, "periodSeconds": 1}},
            {"name": "never-ready", "image": BUSYBOX, "command": ["sleep", "3600"],
             "readinessProbe": {"exec": {"command": ["false"]}, "periodSeconds": 1}},
        ]},
    }));

    let pod = node
        .wait_for(&web, "httpd started and ready", start(), |p| {
            let httpd = container_status(p, "httpd");
            httpd["started"] == true && httpd["ready"] == true
        })
        .await;
    let never = container_status(&pod, "never-ready");
    assert_eq!(never["ready"], false, "{never:#}");
    assert!(never["state"]["running"].is_object(), "{never:#}");
    assert!(
        !common::kubelet::condition(&pod, "Ready"),
        "a pod with an unready container is not Ready"
    );

    // The liveness failure restarted the container: a new scute container, the old one killed.
    let pod = node
        .wait_for(&liveness, "restarted by its liveness probe", start(), |p| {
            restarts(p, "main") >= 1
        })
        .await;
    let status = container_status(&pod, "main");
    let killed = container_id(&status["lastState"]["terminated"]);
    assert_ne!(killed, container_id(&status));
    let (cri, _) = cri_container(&node, &killed).await;
    assert_eq!(cri.state, api::ContainerState::ContainerExited as i32);
    assert_eq!(cri.exit_code, 137, "killed by SIGKILL after SIGTERM: {cri:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_containers_run_in_order_and_volumes_are_shared() {
    let Some(node) = Node::start("init", json!({})) else {
        return;
    };
    let host_dir = tempfile::tempdir().unwrap();
    std::fs::write(host_dir.path().join("note"), "from the host\n").unwrap();
    let name = node.apply(json!({
        "metadata": {"name": "init"},
        "spec": {
            "initContainers": [
                {"name": "first", "image": BUSYBOX, "command": ["sh", "-c", "echo first >> /work/order; echo secret > /mem/token"],
                 "volumeMounts": [{"name": "work", "mountPath": "/work"}, {"name": "mem", "mountPath": "/mem"}]},
                {"name": "second", "image": BUSYBOX, "command": ["sh", "-c", "echo second >> /work/order"],
                 "volumeMounts": [{"name": "work", "mountPath": "/work"}]},
            ],
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c",
                "cat /work/order /mem/token /host/note; touch /host/x 2>/dev/null && echo host writable || echo host read-only; sleep 3600"],
                "volumeMounts": [{"name": "work", "mountPath": "/work"}, {"name": "mem", "mountPath": "/mem"},
                                 {"name": "host", "mountPath": "/host", "readOnly": true}]}],
            "volumes": [
                {"name": "work", "emptyDir": {}},
                {"name": "mem", "emptyDir": {"medium": "Memory"}},
                {"name": "host", "hostPath": {"path": host_dir.path(), "type": "Directory"}},
            ],
        },
    }));
    let pod = node.wait_phase(&name, "Running", start()).await;
    for init in ["first", "second"] {
        let status = container_status(&pod, init);
        assert_eq!(status["state"]["terminated"]["exitCode"], 0, "{init}: {status:#}");
    }
    let first_done = container_status(&pod, "first")["state"]["terminated"]["finishedAt"].clone();
    let second_started = container_status(&pod, "second")["state"]["terminated"]["startedAt"].clone();
    assert!(
        first_done.as_str() <= second_started.as_str(),
        "{first_done} / {second_started}"
    );

    let expected = ["first", "second", "secret", "from the host", "host read-only"];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lines: Vec<String> = log_lines(&node, &pod, "main").into_iter().map(|(_, l)| l).collect();
        if lines == expected {
            break;
        }
        assert!(Instant::now() < deadline, "main's log: {lines:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(!host_dir.path().join("x").exists());

    // On the host: the Memory emptyDir is a tmpfs in the container's mount namespace.
    let (_, pid) = cri_container(&node, &container_id(&container_status(&pod, "main"))).await;
    let mounts = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    let mem = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/mem"))
        .unwrap_or_else(|| panic!("no /mem mount:\n{mounts}"));
    assert!(mem.contains(" - tmpfs "), "{mem}");
    let host = mounts
        .lines()
        .find(|l| l.split_whitespace().nth(4) == Some("/host"))
        .unwrap_or_else(|| panic!("no /host mount:\n{mounts}"));
    assert!(
        host.split_whitespace().nth(5).unwrap().split(',').any(|o| o == "ro"),
        "{host}"
    );
}

/// cgroup v2's cpu.weight for cgroup v1 cpu.shares, the quadratic fit runc 1.3.2 introduced
/// (opencontainers/cgroups#20): keeps 2 → 1, 1024 → 100 and 262144 → 10000.
fn runc_weight(shares: u64) -> u64 {
    if shares <= 2 {
        return 1;
    }
    if shares >= 262_144 {
        return 10_000;
    }
    let l = (shares as f64).log2();
    let exponent = (l * l + 125.0 * l) / 612.0 - 7.0 / 34.0;
    (10f64.powf(exponent).ceil() as u64).clamp(1, 10_000)
}

/// A value from the cgroup of a process (v1: the controller's hierarchy; v2: the unified one).
fn cgroup_value(pid: i32, controller: &str, file: &str) -> String {
    let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = cgroups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        controllers
            .split(',')
            .any(|c| c == controller)
            .then(|| path.to_string())
    });
    let full = match path {
        Some(path) => format!("/sys/fs/cgroup/{controller}{path}/{file}"),
        None => {
            let path = cgroups.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
            format!("/sys/fs/cgroup{path}/{file}")
        }
    };
    std::fs::read_to_string(&full)
        .unwrap_or_else(|e| panic!("{full}: {e}"))
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_and_limits_reach_the_cgroups_and_oom_kills_show() {
    let Some(node) = Node::start("resources", json!({})) else {
        return;
    };
    let resources = |requests: Value, limits: Value| json!({"requests": requests, "limits": limits});
    let sleeper = |name: &str, resources: Value| {
        json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"], "resources": resources}]},
        })
    };
    let guaranteed = node.apply(sleeper(
        "guaranteed",
        resources(
            json!({"cpu": "250m", "memory": "64Mi"}),
            json!({"cpu": "250m", "memory": "64Mi"}),
        ),
    ));
    let burstable = node.apply(sleeper(
        "burstable",
        resources(json!({"cpu": "100m", "memory": "32Mi"}), json!({"memory": "96Mi"})),
    ));
    let best_effort = node.apply(sleeper("besteffort", json!({})));
    let oom = node.apply(json!({
        "metadata": {"name": "oom"},
        "spec": {"restartPolicy": "Never", "containers": [{"name": "main", "image": BUSYBOX,
            // tail buffers a line that never ends: it grows until the limit.
            "command": ["tail", "/dev/zero"],
            "resources": {"limits": {"memory": "32Mi"}}}]},
    }));

    // (pod, QoS class, cpu.shares, cfs quota, memory limit)
    let cases = [
        (&guaranteed, "Guaranteed", "256", "25000", (64u64 << 20).to_string()),
        (&burstable, "Burstable", "102", "-1", (96u64 << 20).to_string()),
        (&best_effort, "BestEffort", "2", "-1", "9223372036854771712".to_string()),
    ];
    for (name, class, shares, quota, memory) in cases {
        let pod = node.wait_phase(name, "Running", start()).await;
        assert_eq!(pod["status"]["qosClass"], class, "{name}");
        let (_, pid) = cri_container(&node, &container_id(&container_status(&pod, "main"))).await;
        let cgroups = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
        let uid = pod["metadata"]["uid"].as_str().unwrap();
        let pod_cgroup = format!("{}/", node.pod_cgroup(class, uid));
        // v1 (hybrid too): the memory and pids hierarchies; pure v2: the one unified line.
        let v1 = cgroups.contains(":memory:");
        let wanted = |l: &&str| {
            if v1 {
                l.contains(":memory:") || l.contains(":pids:")
            } else {
                l.starts_with("0::")
            }
        };
        let lines: Vec<&str> = cgroups.lines().filter(wanted).collect();
        assert!(
            !lines.is_empty() && lines.iter().all(|l| l.contains(&pod_cgroup)),
            "{name}: the container is not in {pod_cgroup}:\n{cgroups}"
        );
        // The pod's shim (the container's subreaper, so its parent) is charged to the pod too,
        // in a cgroup of its own beside the containers.
        let shim = common::parent_pid(pid);
        let shim_cgroups = std::fs::read_to_string(format!("/proc/{shim}/cgroup")).unwrap();
        let shim_lines: Vec<&str> = shim_cgroups.lines().filter(wanted).collect();
        assert!(
            !shim_lines.is_empty()
                && shim_lines.iter().all(|l| {
                    let path = l.splitn(3, ':').nth(2).unwrap_or_default();
                    path.strip_prefix(&pod_cgroup)
                        .is_some_and(|name| name.starts_with("scute-shim-"))
                }),
            "{name}: the shim {shim} is not beside the containers in {pod_cgroup}:\n{shim_cgroups}"
        );
        if v1 {
            assert_eq!(cgroup_value(pid, "cpu", "cpu.shares"), shares, "{name}");
            assert_eq!(cgroup_value(pid, "cpu", "cpu.cfs_quota_us"), quota, "{name}");
            assert_eq!(cgroup_value(pid, "memory", "memory.limit_in_bytes"), memory, "{name}");
        } else {
            // cgroup v2: max and weight instead.
            let max = cgroup_value(pid, "", "memory.max");
            let expected = if class == "BestEffort" {
                "max".to_string()
            } else {
                memory
            };
            assert_eq!(max, expected, "{name}");
            let cpu_max = cgroup_value(pid, "", "cpu.max");
            let expected = if quota == "-1" {
                "max 100000".to_string()
            } else {
                format!("{quota} 100000")
            };
            assert_eq!(cpu_max, expected, "{name}");
            // cpu.weight from the shares by runc's conversion (runc 1.3.2+, libcgroups, as
            // containerd and CRI-O nodes get it): 1024 shares are weight 100.
            let weight = cgroup_value(pid, "", "cpu.weight");
            assert_eq!(weight, runc_weight(shares.parse().unwrap()).to_string(), "{name}");
            let pod_weight = std::fs::read_to_string(format!("/sys/fs/cgroup{pod_cgroup}cpu.weight")).unwrap();
            figure(&format!(
                "{class}: container cpu.weight {weight} for {shares} shares; the kubelet's pod cgroup {}",
                pod_weight.trim()
            ));
        }
    }

    let pod = node.wait_phase(&oom, "Failed", start()).await;
    let terminated = &container_status(&pod, "main")["state"]["terminated"];
    assert_eq!(terminated["reason"], "OOMKilled", "{terminated:#}");
    assert_eq!(terminated["exitCode"], 137, "{terminated:#}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_termination_runs_hooks_then_sigterm_then_sigkill() {
    let Some(node) = Node::start("termination", json!({})) else {
        return;
    };
    let hooks = tempfile::tempdir().unwrap();
    const GRACE: u64 = 4;
    let name = node.apply(json!({
        "metadata": {"name": "graceful"},
        "spec": {
            "terminationGracePeriodSeconds": GRACE,
            "containers": [
                {"name": "polite", "image": BUSYBOX,
                 "command": ["sh", "-c", "trap 'echo TERM > /hooks/polite-term; exit 0' TERM; while true; do sleep 0.1; done"],
                 "lifecycle": {
                    "postStart": {"exec": {"command": ["sh", "-c", "echo started > /hooks/poststart"]}},
                    "preStop": {"exec": {"command": ["sh", "-c", "echo stopping > /hooks/prestop"]}},
                 },
                 "volumeMounts": [{"name": "hooks", "mountPath": "/hooks"}]},
                {"name": "stubborn", "image": BUSYBOX,
                 "command": ["sh", "-c", "trap '' TERM; while true; do sleep 0.1; done"]},
            ],
            "volumes": [{"name": "hooks", "hostPath": {"path": hooks.path(), "type": "Directory"}}],
        },
    }));
    let pod = node.wait_phase(&name, "Running", start()).await;
    assert_eq!(
        std::fs::read_to_string(hooks.path().join("poststart")).unwrap(),
        "started\n"
    );
    let (_, polite) = cri_container(&node, &container_id(&container_status(&pod, "polite"))).await;
    let (_, stubborn) = cri_container(&node, &container_id(&container_status(&pod, "stubborn"))).await;

    let deleted = Instant::now();
    node.delete("graceful");
    let mut polite_gone = None;
    while common::alive(stubborn) {
        if polite_gone.is_none() && !common::alive(polite) {
            polite_gone = Some(deleted.elapsed());
        }
        assert!(
            deleted.elapsed() < Duration::from_secs(GRACE + 20),
            "the stubborn container outlived its grace period"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stubborn_gone = deleted.elapsed();
    let stubborn_gone_at = std::time::SystemTime::now();
    let polite_gone = polite_gone.unwrap_or(stubborn_gone);
    common::kubelet::figure(&format!("SIGTERM-handling container gone after {polite_gone:?}, SIGTERM-ignoring one after {stubborn_gone:?} (grace {GRACE} s)"));
    assert_eq!(
        std::fs::read_to_string(hooks.path().join("prestop")).unwrap(),
        "stopping\n"
    );
    assert_eq!(
        std::fs::read_to_string(hooks.path().join("polite-term")).unwrap(),
        "TERM\n"
    );
    assert!(
        polite_gone < Duration::from_secs(GRACE),
        "the polite container ran past SIGTERM: {polite_gone:?}"
    );
    // Killed at the end of the grace period (which the preStop hook counts against), within a
    // second, counted from the kubelet starting the termination: the preStop hook's write. (The
    // kubelet notices a deleted static pod by polling its manifest dir, up to a second or two
    // after the deletion: not scute's to count.)
    let prestop_at = std::fs::metadata(hooks.path().join("prestop"))
        .unwrap()
        .modified()
        .unwrap();
    let killed_after = stubborn_gone_at.duration_since(prestop_at).unwrap_or_default();
    common::kubelet::figure(&format!(
        "SIGKILL {killed_after:?} after the preStop hook ran (grace {GRACE} s)"
    ));
    assert!(
        killed_after >= Duration::from_secs(GRACE) - Duration::from_secs(1)
            && killed_after <= Duration::from_secs(GRACE + 1),
        "SIGKILL {killed_after:?} after the preStop hook, grace {GRACE} s"
    );
}

/// The container and sandbox IDs scute holds.
async fn cri_ids(node: &Node) -> (Vec<String>, Vec<String>) {
    let mut runtime = node.daemon.runtime().await;
    let mut sandboxes: Vec<String> = runtime
        .list_pod_sandbox(api::ListPodSandboxRequest::default())
        .await
        .unwrap()
        .into_inner()
        .items
        .into_iter()
        .map(|s| s.id)
        .collect();
    let mut containers: Vec<String> = runtime
        .list_containers(api::ListContainersRequest::default())
        .await
        .unwrap()
        .into_inner()
        .containers
        .into_iter()
        .map(|c| c.id)
        .collect();
    sandboxes.sort();
    containers.sort();
    (sandboxes, containers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_survive_kubelet_and_scute_restarts() {
    let Some(mut node) = Node::start("restarts-of-both", json!({})) else {
        return;
    };
    let name = node.apply(json!({
        "metadata": {"name": "steady"},
        "spec": {"containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"],
            "readinessProbe": {"exec": {"command": ["true"]}, "periodSeconds": 1}}]},
    }));
    let pod = node.wait_ready(&name, start()).await;
    let id = container_id(&container_status(&pod, "main"));
    let (_, pid) = cri_container(&node, &id).await;
    let before = cri_ids(&node).await;

    node.restart_kubelet();
    let pod = node.wait_ready(&name, start()).await;
    // A few sync loops under the new kubelet.
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(container_id(&container_status(&pod, "main")), id);
    assert_eq!(restarts(&pod, "main"), 0);
    assert_eq!(
        cri_ids(&node).await,
        before,
        "the restarted kubelet made or removed pods/containers"
    );
    assert!(common::alive(pid));

    node.daemon.restart();
    tokio::time::sleep(Duration::from_secs(8)).await;
    let pod = node.wait_ready(&name, start()).await;
    assert_eq!(container_id(&container_status(&pod, "main")), id);
    assert_eq!(restarts(&pod, "main"), 0);
    assert_eq!(
        cri_ids(&node).await,
        before,
        "the kubelet made or removed pods/containers after scute restarted"
    );
    assert!(common::alive(pid), "scute's restart touched the container");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_evented_pleg_sees_starts_and_exits() {
    // With EventedPLEG the kubelet relists only every 5 minutes: what it sees in time it saw
    // through scute's GetContainerEvents.
    let Some(node) = Node::start("evented-pleg", json!({"featureGates": {"EventedPLEG": true}})) else {
        return;
    };
    let name = node.apply(json!({
        "metadata": {"name": "crashing"},
        "spec": {"containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c", "sleep 2; exit 7"]}]},
    }));
    let pod = node
        .wait_for(&name, "restarted after its exit", start(), |p| restarts(p, "main") >= 1)
        .await;
    let status = container_status(&pod, "main");
    assert_eq!(status["lastState"]["terminated"]["exitCode"], 7, "{status:#}");
    // It falls back to relisting (and logs this) when the event stream fails.
    assert!(
        !node
            .kubelet_log()
            .contains("Evented PLEG: Failed to get container events"),
        "the kubelet's event stream from scute failed"
    );
}

/// A number of a pod's container in `/stats/summary`.
fn summary_value(summary: &Value, pod: &str, path: &[&str]) -> u64 {
    let pod = summary["pods"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|p| p["podRef"]["name"] == pod)
        .unwrap_or_else(|| panic!("{pod} not in /stats/summary: {summary:#}"));
    let container = pod["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["name"] == "main")
        .unwrap_or_else(|| panic!("no container main: {pod:#}"));
    let mut value = container;
    for key in path {
        value = &value[key];
    }
    value
        .as_u64()
        .unwrap_or_else(|| panic!("{path:?} missing: {container:#}"))
}

/// Whether `a` and `b` differ by at most 10 % of the larger.
fn close(a: u64, b: u64) -> bool {
    a.abs_diff(b) * 10 <= a.max(b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stats_summary_agrees_with_the_cgroups() {
    for from_cri in [false, true] {
        let gates = json!({"featureGates": {"PodAndContainerStatsFromCRI": from_cri}});
        let Some(node) = Node::start("stats", gates) else {
            return;
        };
        let name = node.apply(json!({
            "metadata": {"name": "busy"},
            "spec": {"containers": [{"name": "main", "image": BUSYBOX,
                // 16 MB held in a shell variable, and half a core burnt.
                "command": ["sh", "-c", "x=$(head -c 16000000 /dev/zero | tr '\\0' a); touch /tmp/filled; while :; do :; done"],
                "resources": {"limits": {"cpu": "500m", "memory": "128Mi"}}}]},
        }));
        let pod = node.wait_phase(&name, "Running", start()).await;
        let (_, pid) = cri_container(&node, &container_id(&container_status(&pod, "main"))).await;
        // Until the variable is filled (the shell holds it, and its copies while it was built are
        // gone: it touched /tmp/filled; seconds on the host, longer on the VM node).
        let filled = PathBuf::from(format!("/proc/{pid}/root/tmp/filled"));
        let deadline = Instant::now() + Duration::from_secs(120);
        while !filled.exists() {
            assert!(Instant::now() < deadline, "the container never filled its 16 MB");
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // The kubelet's figures are samples (cAdvisor's housekeeping runs every 10-15 s; scute's
        // as asked): compare each sample with the cgroup read right after it, until they agree
        // or a minute passes (then the last pair is the failure).
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let summary = node.stats_summary().await;
            let cpu = summary_value(&summary, &name, &["cpu", "usageCoreNanoSeconds"]);
            let working_set = summary_value(&summary, &name, &["memory", "workingSetBytes"]);
            let (host_cpu, host_working_set) = cgroup_usage(pid);
            let agree = close(cpu, host_cpu) && close(working_set, host_working_set);
            if agree || Instant::now() > deadline {
                common::kubelet::figure(&format!(
                    "/stats/summary with PodAndContainerStatsFromCRI={from_cri}: cpu {cpu} ns (cgroup {host_cpu}), working set {working_set} B (cgroup {host_working_set})"
                ));
                assert!(
                    working_set > 16_000_000,
                    "working set {working_set} B: the 16 MB are not counted"
                );
                assert!(close(cpu, host_cpu), "cpu: kubelet {cpu} ns, cgroup {host_cpu} ns");
                assert!(
                    close(working_set, host_working_set),
                    "working set: kubelet {working_set} B, cgroup {host_working_set} B"
                );
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    }
}

/// The CPU time (ns) and working set (usage less inactive file pages, as cAdvisor counts it) of
/// the cgroup of `pid`, v1 or v2.
fn cgroup_usage(pid: i32) -> (u64, u64) {
    if std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .unwrap()
        .contains(":memory:")
    {
        let usage: u64 = cgroup_value(pid, "memory", "memory.usage_in_bytes").parse().unwrap();
        let stat = cgroup_value(pid, "memory", "memory.stat");
        let inactive: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("total_inactive_file "))
            .unwrap()
            .parse()
            .unwrap();
        (
            cgroup_value(pid, "cpuacct", "cpuacct.usage").parse::<u64>().unwrap(),
            usage.saturating_sub(inactive),
        )
    } else {
        let stat = cgroup_value(pid, "", "cpu.stat");
        let usec: u64 = stat
            .lines()
            .find_map(|l| l.strip_prefix("usage_usec "))
            .unwrap()
            .parse()
            .unwrap();
        let usage: u64 = cgroup_value(pid, "", "memory.current").parse().unwrap();
        let memory_stat = cgroup_value(pid, "", "memory.stat");
        let inactive: u64 = memory_stat
            .lines()
            .find_map(|l| l.strip_prefix("inactive_file "))
            .unwrap()
            .parse()
            .unwrap();
        (usec * 1000, usage.saturating_sub(inactive))
    }
}

/// The median of `values`.
fn median(mut values: Vec<Duration>) -> Duration {
    values.sort();
    values[values.len() / 2]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn figures_manifest_to_running() {
    let Some(node) = Node::start("figures", json!({})) else {
        return;
    };
    let sleeper = |name: String| {
        json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"]}]},
        })
    };
    let mut one_by_one = Vec::new();
    for i in 0..10 {
        let written = Instant::now();
        let name = node.apply(sleeper(format!("one-{i}")));
        node.wait_phase(&name, "Running", start()).await;
        one_by_one.push(written.elapsed());
    }
    let written = Instant::now();
    let names: Vec<String> = (0..30).map(|i| node.apply(sleeper(format!("many-{i}")))).collect();
    for name in &names {
        node.wait_phase(name, "Running", Duration::from_secs(300)).await;
    }
    let all = written.elapsed();
    common::kubelet::figure(&format!(
        "manifest → Running, median of 10 pods one at a time: {:?}; 30 pods written at once all Running after {all:?}",
        median(one_by_one)
    ));
    // 40 pods run on scute, each with pause and one container.
    let (sandboxes, containers) = cri_ids(&node).await;
    assert_eq!((sandboxes.len(), containers.len()), (40, 40));
}

/// Every line of a container's logs in order: rotated files (plain or gzipped, by their
/// timestamp suffix) first, then the current one. Texts only.
fn all_log_texts(dir: &std::path::Path) -> (Vec<String>, usize) {
    use std::io::Read;
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir).unwrap().flatten().map(|e| e.path()).collect();
    // "0.log" is the current file; "0.log.<timestamp>[.gz]" are rotated ones.
    files.sort_by_key(|p| {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        (name.ends_with(".log"), name.trim_end_matches(".gz").to_string())
    });
    let mut texts = Vec::new();
    for file in &files {
        let bytes = std::fs::read(file).unwrap();
        let text = if file.extension().is_some_and(|e| e == "gz") {
            let mut out = String::new();
            flate2::read::GzDecoder::new(&bytes[..])
                .read_to_string(&mut out)
                .unwrap();
            out
        } else {
            String::from_utf8(bytes).unwrap()
        };
        texts.extend(
            text.lines()
                .map(|l| l.splitn(4, ' ').nth(3).unwrap_or_default().to_string()),
        );
    }
    (texts, files.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_rotate_without_losing_a_line() {
    let config = json!({
        "containerLogMaxSize": "2Ki",
        "containerLogMaxFiles": 100,
        "containerLogMonitorInterval": "3s",
    });
    let Some(node) = Node::start("logs", config) else {
        return;
    };
    const LINES: usize = 1500;
    let name = node.apply(json!({
        "metadata": {"name": "chatty"},
        "spec": {"containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c",
            format!("i=0; while [ $i -lt {LINES} ]; do echo line-$i; i=$((i+1)); usleep 10000; done; echo done; sleep 3600")]}]},
    }));
    let pod = node.wait_phase(&name, "Running", start()).await;
    let dir = node.pod_logs_dir().join(format!(
        "{}_{}_{}/main",
        node.namespace,
        name,
        pod["metadata"]["uid"].as_str().unwrap()
    ));
    let deadline = Instant::now() + Duration::from_secs(180);
    let (texts, files) = loop {
        let (texts, files) = all_log_texts(&dir);
        if texts.last().is_some_and(|l| l == "done") {
            break (texts, files);
        }
        assert!(
            Instant::now() < deadline,
            "no 'done' after 180 s; {} lines in {files} files",
            texts.len()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let expected: Vec<String> = (0..LINES)
        .map(|i| format!("line-{i}"))
        .chain(["done".to_string()])
        .collect();
    assert!(files >= 3, "the kubelet rotated {} times", files - 1);
    assert_eq!(texts, expected, "lines lost or repeated across {files} files");
    common::kubelet::figure(&format!("{LINES} log lines across {files} files, none lost"));
}

/// How many times scute pulled `image` (its "image pulled" log line).
fn pulls(node: &Node, image: &str) -> usize {
    node.daemon
        .log()
        .lines()
        .filter(|l| l.contains("image pulled") && l.contains(image))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_pull_policies() {
    let Some(node) = Node::start("pull-policies", json!({})) else {
        return;
    };
    let sleeper = |name: &str, image: &str, policy: &str| {
        json!({
            "metadata": {"name": name},
            "spec": {"containers": [{"name": "main", "image": image, "imagePullPolicy": policy, "command": ["sleep", "3600"]}]},
        })
    };
    // Never, and the image is not there: the kubelet's ErrImageNeverPull, no pull.
    let never = node.apply(sleeper("never", HTTPD, "Never"));
    let pod = node
        .wait_for(&never, "waiting on ErrImageNeverPull", start(), |p| {
            container_status(p, "main")["state"]["waiting"]["reason"] == "ErrImageNeverPull"
        })
        .await;
    assert_eq!(pod["status"]["phase"], "Pending");
    assert_eq!(pulls(&node, HTTPD), 0);

    // IfNotPresent pulls once through the mirrors; a second pod does not pull again.
    let first = node.apply(sleeper("first", BUSYBOX, "IfNotPresent"));
    node.wait_phase(&first, "Running", start()).await;
    assert_eq!(pulls(&node, BUSYBOX), 1);
    let second = node.apply(sleeper("second", BUSYBOX, "IfNotPresent"));
    node.wait_phase(&second, "Running", start()).await;
    assert_eq!(pulls(&node, BUSYBOX), 1);

    // Always pulls again, although the image is there.
    let always = node.apply(sleeper("always", BUSYBOX, "Always"));
    node.wait_phase(&always, "Running", start()).await;
    assert_eq!(pulls(&node, BUSYBOX), 2);
}

/// A field of /proc/<pid>/status.
fn proc_status(pid: i32, field: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_contexts_reach_the_processes() {
    let Some(node) = Node::start("security", json!({})) else {
        return;
    };
    let name = node.apply(json!({
        "metadata": {"name": "secure"},
        "spec": {
            "securityContext": {"supplementalGroups": [3456], "sysctls": [{"name": "net.ipv4.ip_unprivileged_port_start", "value": "80"}]},
            "containers": [
                {"name": "ids", "image": BUSYBOX, "command": ["sleep", "3600"],
                 "securityContext": {"runAsUser": 1234, "runAsGroup": 2345}},
                {"name": "readonly", "image": BUSYBOX, "command": ["sh", "-c",
                    "touch /x 2>/dev/null && echo writable || echo read-only; cat /proc/sys/net/ipv4/ip_unprivileged_port_start; sleep 3600"],
                 "securityContext": {"readOnlyRootFilesystem": true}},
                {"name": "caps", "image": BUSYBOX, "command": ["sleep", "3600"],
                 "securityContext": {"capabilities": {"drop": ["ALL"], "add": ["NET_ADMIN"]},
                                     "seccompProfile": {"type": "RuntimeDefault"}}},
            ],
        },
    }));
    let nonroot = node.apply(json!({
        "metadata": {"name": "nonroot"},
        "spec": {"securityContext": {"runAsNonRoot": true},
                 "containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"]}]},
    }));
    let hostnet = node.apply(json!({
        "metadata": {"name": "hostnet"},
        "spec": {"hostNetwork": true, "containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"]}]},
    }));
    let userns = node.apply(json!({
        "metadata": {"name": "userns"},
        "spec": {"hostUsers": false, "containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"]}]},
    }));

    let pod = node.wait_phase(&name, "Running", start()).await;
    let pid = |pod: &Value, container: &str| {
        let id = container_id(&container_status(pod, container));
        let node = &node;
        async move { cri_container(node, &id).await.1 }
    };
    let ids = pid(&pod, "ids").await;
    assert_eq!(proc_status(ids, "Uid"), "1234 1234 1234 1234");
    assert_eq!(proc_status(ids, "Gid"), "2345 2345 2345 2345");
    assert!(
        proc_status(ids, "Groups").split(' ').any(|g| g == "3456"),
        "{}",
        proc_status(ids, "Groups")
    );
    let caps = pid(&pod, "caps").await;
    assert_eq!(
        proc_status(caps, "CapEff"),
        format!("{:016x}", 1u64 << 12),
        "NET_ADMIN only"
    );
    assert_eq!(proc_status(caps, "Seccomp"), "2", "RuntimeDefault is a seccomp filter");
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lines: Vec<String> = log_lines(&node, &pod, "readonly").into_iter().map(|(_, l)| l).collect();
        if lines.len() >= 2 {
            assert_eq!(lines, ["read-only", "80"]);
            break;
        }
        assert!(Instant::now() < deadline, "readonly's log: {lines:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // runAsNonRoot with an image that runs as root: the kubelet refuses it (from ImageStatus's uid).
    let pod = node
        .wait_for(&nonroot, "refused to run as root", start(), |p| {
            container_status(p, "main")["state"]["waiting"]["reason"] == "CreateContainerConfigError"
        })
        .await;
    let message = container_status(&pod, "main")["state"]["waiting"]["message"].clone();
    assert!(
        message
            .as_str()
            .unwrap_or_default()
            .contains("runAsNonRoot and image will run as root"),
        "{message}"
    );

    let pod = node.wait_phase(&hostnet, "Running", start()).await;
    let main = pid(&pod, "main").await;
    assert_eq!(ns_inode(main, "net"), ns_inode(std::process::id() as i32, "net"));

    // hostUsers: false — root in the container is an unprivileged id on the host.
    let pod = node.wait_phase(&userns, "Running", start()).await;
    let main = pid(&pod, "main").await;
    let uid_map = std::fs::read_to_string(format!("/proc/{main}/uid_map")).unwrap();
    let fields: Vec<u64> = uid_map.split_whitespace().map(|f| f.parse().unwrap()).collect();
    assert_eq!(fields.len(), 3, "{uid_map}");
    assert_eq!(fields[0], 0);
    assert!(fields[1] >= 65536, "container root is host uid {}", fields[1]);
    assert_eq!(
        proc_status(main, "Uid").split(' ').next(),
        Some(fields[1].to_string().as_str())
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn container_status_fields_after_restarts_and_a_manifest_change() {
    // Issue 22: the kubelet copies ContainerStatus.image into containerStatuses[].image (and
    // user and resources into the API); what /pods shows must be what the manifest says, also
    // after the kubelet restarts and after the manifest names another image. (A standalone
    // kubelet fills no volumeMounts status: it has no RuntimeClass manager to ask about
    // recursive read-only support, so that field is not checked here.)
    let Some(mut node) = Node::start("image-names", json!({})) else {
        return;
    };
    let manifest = |image: &str| {
        json!({
            "metadata": {"name": "app"},
            "spec": {
                "securityContext": {"runAsUser": 1234, "runAsGroup": 2345, "supplementalGroups": [3456]},
                "containers": [{"name": "main", "image": image, "command": ["sleep", "3600"],
                    "resources": {"requests": {"cpu": "100m", "memory": "32Mi"}, "limits": {"memory": "64Mi"}}}],
            },
        })
    };
    let check = |pod: &Value, image: &str| {
        let status = container_status(pod, "main");
        assert_eq!(status["image"], image, "{status:#}");
        assert!(
            status["imageID"].as_str().unwrap_or_default().contains("sha256:"),
            "{status:#}"
        );
        assert_eq!(
            status["user"]["linux"],
            json!({"uid": 1234, "gid": 2345, "supplementalGroups": [2345, 3456]}),
            "{status:#}"
        );
        assert_eq!(status["resources"]["limits"]["memory"], "64Mi", "{status:#}");
        assert_eq!(status["resources"]["requests"]["cpu"], "100m", "{status:#}");
    };

    let name = node.apply(manifest(BUSYBOX));
    let pod = node.wait_phase(&name, "Running", start()).await;
    check(&pod, BUSYBOX);

    node.restart_kubelet();
    let pod = node.wait_phase(&name, "Running", start()).await;
    check(&pod, BUSYBOX);

    // Another image in the manifest: a new static pod (new UID) with that image's name.
    let other = "docker.io/library/busybox:1.36";
    let old_uid = pod["metadata"]["uid"].clone();
    node.apply(manifest(other));
    let pod = node
        .wait_for(&name, "running with the new image", start(), |p| {
            p["metadata"]["uid"] != old_uid && p["status"]["phase"] == "Running"
        })
        .await;
    check(&pod, other);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_volumes_whole_and_sub_path_are_read_only() {
    let Some(node) = Node::start("image-volumes", json!({})) else {
        return;
    };
    // The kubelet pulls the volume's image itself, then hands it to CreateContainer.
    let name = node.apply(json!({
        "metadata": {"name": "imgvol"},
        "spec": {
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sh", "-c",
                "head -1 /etc-from-image/passwd; test -x /img/bin/busybox && echo whole image; \
                 touch /img/x 2>/dev/null && echo img writable || echo img read-only; \
                 touch /etc-from-image/x 2>/dev/null && echo sub writable || echo sub read-only; sleep 3600"],
                "volumeMounts": [{"name": "img", "mountPath": "/img"},
                                 {"name": "img", "mountPath": "/etc-from-image", "subPath": "etc"}]}],
            "volumes": [{"name": "img", "image": {"reference": HTTPD, "pullPolicy": "IfNotPresent"}}],
        },
    }));
    let pod = node.wait_phase(&name, "Running", start()).await;
    let expected = [
        "root:x:0:0:root:/root:/bin/sh",
        "whole image",
        "img read-only",
        "sub read-only",
    ];
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let lines: Vec<String> = log_lines(&node, &pod, "main").into_iter().map(|(_, l)| l).collect();
        if lines == expected {
            break;
        }
        assert!(Instant::now() < deadline, "main's log: {lines:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // What scute reports for the mounts: the image each resolved to.
    let (status, _) = cri_container(&node, &container_id(&container_status(&pod, "main"))).await;
    let images: Vec<_> = status
        .mounts
        .iter()
        .filter_map(|m| m.image.as_ref())
        .map(|i| i.image_ref.clone())
        .collect();
    assert_eq!(images.len(), 2, "{:?}", status.mounts);
    assert!(images.iter().all(|r| r.starts_with("sha256:")), "{images:?}");

    // A sub-path the image does not have: the kubelet reports the create failure.
    let missing = node.apply(json!({
        "metadata": {"name": "imgvol-missing"},
        "spec": {
            "containers": [{"name": "main", "image": BUSYBOX, "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "img", "mountPath": "/x", "subPath": "no/such/dir"}]}],
            "volumes": [{"name": "img", "image": {"reference": HTTPD, "pullPolicy": "IfNotPresent"}}],
        },
    }));
    let pod = node
        .wait_for(&missing, "waiting on CreateContainerError", start(), |p| {
            container_status(p, "main")["state"]["waiting"]["reason"] == "CreateContainerError"
        })
        .await;
    let message = container_status(&pod, "main")["state"]["waiting"]["message"].to_string();
    assert!(message.contains("no/such/dir"), "{message}");
}

/// The kubelet's checkpoint endpoint (KEP-2008): `POST /checkpoint/{namespace}/{pod}/{container}`
/// on its server makes it call CheckpointContainer; the archive lands in its root's checkpoints/
/// and the container runs on, not restarted. The archive then restores the way a pod spec does
/// it: a checkpoint image (the archive's files as its one layer, annotated as a checkpoint)
/// named as a new pod's image carries on counting. Where `criu check` fails the kubelet passes
/// scute's FailedPrecondition on, naming CRIU.
#[tokio::test]
async fn checkpoint_endpoint_writes_an_archive() {
    let port = common::free_port();
    let Some(node) = Node::start("checkpoint", json!({"enableServer": true, "port": port})) else {
        return;
    };
    let name = node.apply(json!({
        "metadata": {"name": "counter"},
        "spec": {"containers": [{"name": "count", "image": BUSYBOX, "command": ["sh", "-c",
            "i=0; while true; do i=$((i+1)); echo $i; sleep 0.2; done"]}]},
    }));
    node.wait_ready(&name, start()).await;
    let url = format!("https://127.0.0.1:{port}/checkpoint/{}/{name}/count", node.namespace);
    let out = std::process::Command::new("curl")
        .args(["-sk", "--max-time", "300", "-X", "POST", "-w", "\n%{http_code}", &url])
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
    match scute::criu::probe() {
        Ok(version) => {
            assert_eq!(code, "200", "{body}\n{}", node.kubelet_log());
            let answer: Value = serde_json::from_str(body).unwrap();
            let archive = PathBuf::from(answer["items"][0].as_str().unwrap());
            assert!(archive.starts_with(node.root_dir().join("checkpoints")), "{archive:?}");
            let mut names = Vec::new();
            for entry in tar::Archive::new(std::fs::File::open(&archive).unwrap())
                .entries()
                .unwrap()
            {
                names.push(entry.unwrap().path().unwrap().display().to_string());
            }
            for want in [
                "config.dump",
                "spec.dump",
                "checkpoint/inventory.img",
                "rootfs-diff.tar",
            ] {
                assert!(names.iter().any(|n| n == want), "{want} missing: {names:?}");
            }
            let pod = node.pod(&name).await.unwrap();
            let status = container_status(&pod, "count");
            assert!(status["state"]["running"].is_object(), "{status:#}");
            assert_eq!(status["restartCount"], 0, "{status:#}");
            figure(&format!("kubelet /checkpoint with CRIU {version}: {archive:?}"));

            // A checkpoint image made from the archive, as `checkpointctl build` or buildah make
            // one, pushed where the node pulls from, named in a new pod.
            let (files, layout) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
            tar::Archive::new(std::fs::File::open(&archive).unwrap())
                .unpack(files.path())
                .unwrap();
            let at_checkpoint = std::fs::read_to_string(files.path().join("container.log"))
                .unwrap()
                .lines()
                .rev()
                .find_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
                .unwrap();
            let layout = layout.path().join("image");
            common::kit(&[
                "build",
                "--rootfs",
                files.path().to_str().unwrap(),
                "--out",
                layout.to_str().unwrap(),
                "--annotation",
                "checkpointctl.annotation.checkpoint.name=count",
            ]);
            common::kit(&[
                "push",
                "--layout",
                layout.to_str().unwrap(),
                "--to",
                &format!("{}/scute-test/checkpoint-count:1", node.registry_addr()),
                "--plain-http",
            ]);
            let restored = node.apply(json!({
                "metadata": {"name": "restored"},
                "spec": {"containers": [{"name": "count", "image": "registry.k8s.io/scute-test/checkpoint-count:1",
                    "command": ["sh", "-c", "exit 3"]}]},
            }));
            let pod = node.wait_ready(&restored, start()).await;
            let (cri, pid) = cri_container(&node, &container_id(&container_status(&pod, "count"))).await;
            assert!(pid > 0 && common::alive(pid));
            assert!(
                cri.image.unwrap().image.contains("busybox"),
                "the restored container shows its base image"
            );
            let mut counts: Vec<u64> = Vec::new();
            for _ in 0..200 {
                let log = std::fs::read_to_string(&cri.log_path).unwrap_or_default();
                counts = log.lines().filter_map(|l| l.rsplit(' ').next()?.parse().ok()).collect();
                if counts.last().is_some_and(|n| *n > at_checkpoint + 3) {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            let resumed = counts.iter().skip_while(|n| **n <= at_checkpoint).copied().next();
            assert!(
                resumed.is_some_and(|n| n <= at_checkpoint + 10) && counts.first() == Some(&1),
                "the restored pod's counter does not go on from {at_checkpoint}: {counts:?}"
            );
            let pod = node.pod(&restored).await.unwrap();
            assert_eq!(container_status(&pod, "count")["restartCount"], 0, "{pod:#}");
        }
        Err(why) => {
            assert_eq!(code, "500", "{body}");
            assert!(body.contains("CRIU"), "{body}");
            eprintln!("no working CRIU here ({why}): the kubelet passed scute's error on: {body}");
        }
    }
}
