//! CDI devices as a container sees them: a vendor spec (written while the daemon runs) that
//! exposes the host's /dev/null and /dev/zero under other names, with env, a mount and hooks;
//! devices asked for through `CDI_devices` and through `cdi.k8s.io/` annotations; an unknown
//! device refused with InvalidArgument naming it, leaving nothing behind; `scute check` listing
//! what it found.

mod common;

use std::path::Path;
use std::time::Duration;

use common::pod::{container, pod_full};
use scute::api;
use tonic::Code;

/// Device `null0`: the host's /dev/null at /dev/vendor-null, env, a read-only mount of
/// `share`, createRuntime, poststart and poststop hooks (run on the host by the runtime: each
/// keeps the container state it is given) and a startContainer hook (run in the container).
/// Device `zero0`: the host's /dev/zero at /dev/vendor-zero. Device `kmsg0`: the host's /dev/kmsg
/// (1:11, which no container may open by default) at /dev/vendor-kmsg, write-only. Spec-wide: env.
fn vendor_spec(work: &Path) -> String {
    format!(
        r#"{{
  "cdiVersion": "0.6.0",
  "kind": "scute.test/fake",
  "containerEdits": {{ "env": ["VENDOR_SPEC=fake"] }},
  "devices": [
    {{
      "name": "null0",
      "containerEdits": {{
        "deviceNodes": [ {{ "path": "/dev/vendor-null", "hostPath": "/dev/null", "permissions": "rw" }} ],
        "env": ["VENDOR_DEVICE=null0"],
        "mounts": [ {{ "hostPath": "{share}", "containerPath": "/vendor", "options": ["ro", "bind"] }} ],
        "hooks": [
          {{ "hookName": "createRuntime", "path": "/bin/sh", "args": ["sh", "-c", "cat > {state}"] }},
          {{ "hookName": "startContainer", "path": "/bin/sh", "args": ["sh", "-c", "echo started > /tmp/start-hook"] }},
          {{ "hookName": "poststart", "path": "/bin/sh", "args": ["sh", "-c", "cat > {poststart}"] }},
          {{ "hookName": "poststop", "path": "/bin/sh", "args": ["sh", "-c", "cat > {poststop}"] }}
        ]
      }}
    }},
    {{
      "name": "zero0",
      "containerEdits": {{
        "deviceNodes": [ {{ "path": "/dev/vendor-zero", "hostPath": "/dev/zero" }} ]
      }}
    }},
    {{
      "name": "kmsg0",
      "containerEdits": {{
        "deviceNodes": [ {{ "path": "/dev/vendor-kmsg", "hostPath": "/dev/kmsg", "permissions": "w" }} ]
      }}
    }}
  ]
}}"#,
        share = work.join("share").display(),
        state = work.join("create-runtime-state").display(),
        poststart = work.join("poststart-state").display(),
        poststop = work.join("poststop-state").display(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cdi_devices_get_their_nodes_env_mounts_and_hooks() {
    let work = tempfile::tempdir().unwrap();
    let (etc_cdi, run_cdi) = (work.path().join("etc-cdi"), work.path().join("run-cdi"));
    std::fs::create_dir_all(&etc_cdi).unwrap();
    std::fs::create_dir_all(&run_cdi).unwrap();
    std::fs::create_dir_all(work.path().join("share")).unwrap();
    std::fs::write(work.path().join("share/hello"), "from the vendor\n").unwrap();
    let pod = pod_full(
        "cdi",
        None,
        &format!("[cdi]\nspec_dirs = [{etc_cdi:?}, {run_cdi:?}]\n"),
        "",
    )
    .await;

    // Written after the daemon started, as a vendor's daemon does: no restart needed. A broken
    // file beside it does not hide it.
    std::fs::write(run_cdi.join("broken.yaml"), "cdiVersion: [\n").unwrap();
    std::fs::write(run_cdi.join("fake.json"), vendor_spec(work.path())).unwrap();

    let mut config = container(
        "uses-devices",
        "stat -c '%F %t:%T' /dev/vendor-null /dev/vendor-zero; echo written > /dev/vendor-null && echo null-writable; \
         head -c 3 /dev/vendor-zero | od -An -tx1; echo env $VENDOR_SPEC $VENDOR_DEVICE; cat /vendor/hello; \
         touch /vendor/new 2>/dev/null || echo vendor-read-only; \
         echo scute-cdi-test > /dev/vendor-kmsg && echo kmsg-writable; cat /tmp/start-hook; sleep 300",
    );
    config.cdi_devices = vec![
        api::CdiDevice {
            name: "scute.test/fake=null0".into(),
        },
        api::CdiDevice {
            name: "scute.test/fake=kmsg0".into(),
        },
    ];
    config
        .annotations
        .insert("cdi.k8s.io/scute-test".into(), "scute.test/fake=zero0".into());
    let id = pod.run(config).await;
    let log = pod.wait_log("uses-devices", "started").await;
    assert!(log.contains("character special file 1:3"), "{log}");
    assert!(log.contains("character special file 1:5"), "{log}");
    assert!(log.contains("null-writable"), "{log}");
    assert!(log.contains(" 00 00 00"), "{log}");
    assert!(log.contains("env fake null0"), "{log}");
    assert!(log.contains("from the vendor"), "{log}");
    assert!(log.contains("vendor-read-only"), "{log}");
    assert!(log.contains("kmsg-writable"), "{log}");
    // The createRuntime hook ran on the host and was handed this container's state.
    let state = std::fs::read_to_string(work.path().join("create-runtime-state")).unwrap();
    assert!(state.contains(&id), "{state}");
    let state = std::fs::read_to_string(work.path().join("poststart-state")).unwrap();
    assert!(state.contains(&id), "{state}");
    assert!(!work.path().join("poststop-state").exists());

    // The device cgroup rule came with the device: a container without it cannot open 1:11.
    pod.run(container(
        "no-devices",
        "mknod /tmp/kmsg c 1 11 && echo mknod-ok && echo scute-cdi-test > /tmp/kmsg && echo kmsg-allowed; echo done",
    ))
    .await;
    let log = pod.wait_log("no-devices", "done").await;
    assert!(
        log.contains("mknod-ok") && log.contains("Operation not permitted"),
        "{log}"
    );
    assert!(!log.contains("kmsg-allowed"), "{log}");

    pod.remove_all().await;
    // The poststop hook ran when the container was deleted.
    let state = std::fs::read_to_string(work.path().join("poststop-state")).unwrap();
    assert!(state.contains(&id), "{state}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_cdi_devices_fail_the_create_naming_them() {
    let work = tempfile::tempdir().unwrap();
    std::fs::write(work.path().join("fake.json"), vendor_spec(work.path())).unwrap();
    std::fs::create_dir_all(work.path().join("share")).unwrap();
    let extra = format!("[cdi]\nspec_dirs = [{:?}]\n", work.path());
    let pod = pod_full("cdi-unknown", None, &extra, "").await;

    let mut config = container("wants-gpu", "true");
    config.cdi_devices = vec![
        api::CdiDevice {
            name: "scute.test/fake=null0".into(),
        },
        api::CdiDevice {
            name: "nvidia.com/gpu=0".into(),
        },
    ];
    let err = pod.create(config).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("\"nvidia.com/gpu=0\""), "{}", err.message());
    assert!(!err.message().contains("null0"), "{}", err.message());

    let mut config = container("bad-annotation", "true");
    config.annotations.insert("cdi.k8s.io/plugin".into(), "gpu0".into());
    let err = pod.create(config).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("cdi.k8s.io/plugin"), "{}", err.message());

    assert!(pod.containers().await.is_empty());

    let (code, stdout, stderr) = common::scute(&["check", "--config", pod.daemon.config_path.to_str().unwrap()]);
    let cdi: Vec<&str> = stdout.lines().filter(|l| l.contains(" cdi ")).collect();
    assert!(
        cdi.iter().any(|l| l.contains("fake.json")
            && l.contains("scute.test/fake=kmsg0, scute.test/fake=null0, scute.test/fake=zero0")),
        "exit {code}\n{stdout}\n{stderr}"
    );
    pod.remove_all().await;
}

/// The path DRA-era device plugins take: a device plugin (tests/common/device_plugin.rs)
/// registers `scute.test/fake` with a real kubelet and answers Allocate with CDI names only; a
/// static pod asking for one of its devices sees the node, the env and the mount the vendor's
/// spec describes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_plugin_hands_cdi_devices_to_a_kubelet_pod() {
    use common::kubelet::{container_status, Node};
    use serde_json::json;

    let work = tempfile::tempdir().unwrap();
    let specs = work.path().join("cdi");
    std::fs::create_dir_all(&specs).unwrap();
    std::fs::create_dir_all(work.path().join("share")).unwrap();
    std::fs::write(work.path().join("share/hello"), "from the vendor\n").unwrap();
    std::fs::write(
        specs.join("fake.yaml"),
        format!(
            "cdiVersion: \"0.6.0\"\nkind: scute.test/fake\ndevices:\n  - name: dev0\n    containerEdits:\n      \
             deviceNodes: [{{path: /dev/vendor-null, hostPath: /dev/null}}]\n      env: [VENDOR_DEVICE=dev0]\n      \
             mounts: [{{hostPath: {}, containerPath: /vendor, options: [ro, bind]}}]\n",
            work.path().join("share").display()
        ),
    )
    .unwrap();
    let Some(node) = Node::start_with_daemon(
        "cdi-device-plugin",
        json!({}),
        &format!("[cdi]\nspec_dirs = [{specs:?}]\n"),
    ) else {
        return;
    };
    let _plugin = common::device_plugin::register(
        &node.device_plugins_dir(),
        "scute.test/fake",
        "scute.test/fake",
        &["dev0"],
    )
    .await;
    let name = node.apply(json!({
        "metadata": {"name": "cdi-plugin"},
        "spec": {
            "containers": [{"name": "main", "image": common::pod::BUSYBOX, "command": ["sh", "-c",
                "stat -c '%F %t:%T' /dev/vendor-null; echo env $VENDOR_DEVICE; cat /vendor/hello; sleep 3600"],
                "resources": {"limits": {"scute.test/fake": "1"}}}],
        },
    }));
    let pod = node.wait_phase(&name, "Running", Duration::from_secs(120)).await;
    let id = common::kubelet::container_id(&container_status(&pod, "main"));
    let expected = ["character special file 1:3", "env dev0", "from the vendor"];
    let dir = node.pod_logs_dir().join(format!(
        "{}_{}_{}/main",
        pod["metadata"]["namespace"].as_str().unwrap(),
        pod["metadata"]["name"].as_str().unwrap(),
        pod["metadata"]["uid"].as_str().unwrap()
    ));
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        // CRI log lines: time, stream, tag, text.
        let lines: Vec<String> = std::fs::read_dir(&dir)
            .into_iter()
            .flatten()
            .flatten()
            .flat_map(|f| {
                std::fs::read_to_string(f.path())
                    .unwrap_or_default()
                    .lines()
                    .map(String::from)
                    .collect::<Vec<_>>()
            })
            .filter_map(|l| l.splitn(4, ' ').nth(3).map(String::from))
            .collect();
        if lines == expected {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "main ({id}) logged: {lines:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
