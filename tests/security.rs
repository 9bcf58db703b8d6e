//! The security fixes of issue 13, tried through the CRI as an attacker would: ids that mean
//! "unchanged" to the kernel, ExecSync output past the kubelet's message cap, and images whose
//! /dev, /etc or a mount target's parent is a symlink.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::pod::{container, pod, pod_on, Pod};
use common::Registry;
use scute::api;

/// Builds the images/build.sh busybox rootfs, changed by `edit`, as `registry.k8s.io/scute-test/<name>:1`
/// in `registry` (registry.k8s.io is mirrored there), with USER `user` when given.
fn custom_image(registry: &Registry, name: &str, user: Option<&str>, edit: impl FnOnce(&Path)) -> String {
    let work = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| common::repo_root().join("target"))
        .join("images");
    let tmp = tempfile::tempdir().unwrap();
    let rootfs = tmp.path().join("rootfs");
    // build.sh rebuilds the rootfs under this lock: copy it under the same lock.
    let status = Command::new("flock")
        .arg(work.join(".lock"))
        .args(["cp", "-a"])
        .arg(work.join("rootfs/busybox"))
        .arg(&rootfs)
        .status()
        .unwrap();
    assert!(status.success(), "copying the busybox rootfs");
    edit(&rootfs);
    let layout = tmp.path().join("layout");
    let mut args = vec![
        "build".to_string(),
        "--rootfs".into(),
        rootfs.display().to_string(),
        "--out".into(),
        layout.display().to_string(),
    ];
    if let Some(user) = user {
        args.extend(["--user".into(), user.into()]);
    }
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    common::kit(&args);
    common::kit(&[
        "push",
        "--layout",
        layout.to_str().unwrap(),
        "--to",
        &format!("{}/scute-test/{name}:1", registry.addr),
        "--plain-http",
    ]);
    format!("registry.k8s.io/scute-test/{name}:1")
}

async fn pull(pod: &Pod, image: &str) -> api::Image {
    pod.daemon
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
        .unwrap();
    pod.image_status(image).await
}

fn with_image(mut c: api::ContainerConfig, image: &str) -> api::ContainerConfig {
    c.image = Some(api::ImageSpec {
        image: image.into(),
        ..Default::default()
    });
    c
}

fn security(c: &mut api::ContainerConfig) -> &mut api::LinuxContainerSecurityContext {
    c.linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
}

fn refused(r: Result<String, tonic::Status>, needles: &[&str]) {
    let err = r.expect_err("the create must be refused");
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    for n in needles {
        assert!(err.message().contains(n), "{n:?} not in {:?}", err.message());
    }
}

/// (uid_t)-1 keeps root through setresuid: a container asking for it, from the request or from
/// the image, is refused before anything runs — the kubelet's runAsNonRoot check reads the
/// image's uid (4294967295, "not root") from ImageStatus and would let it through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_meaning_unchanged_are_refused_before_anything_runs() {
    let pod = pod("ids").await;
    let evil_uid = custom_image(pod.registry(), "user-max-uid", Some("4294967295"), |_| {});
    let evil_name = custom_image(pod.registry(), "user-max-name", Some("evil"), |root| {
        let passwd = root.join("etc/passwd");
        let mut text = std::fs::read_to_string(&passwd).unwrap();
        text.push_str("evil:x:4294967295:4294967295::/:/bin/sh\n");
        std::fs::write(passwd, text).unwrap();
    });
    let image = pull(&pod, &evil_uid).await;
    assert_eq!(
        image.uid.map(|u| u.value),
        Some(4294967295),
        "what the kubelet's runAsNonRoot check sees"
    );
    pull(&pod, &evil_name).await;

    let script = "id -u > /dev/termination-log; sleep 60";
    refused(
        pod.create(with_image(container("max-uid", script), &evil_uid)).await,
        &["image's USER", "4294967295"],
    );
    refused(
        pod.create(with_image(container("max-name", script), &evil_name)).await,
        &["image's USER \"evil\"", "4294967295"],
    );
    let mut c = container("run-as-max", script);
    security(&mut c).run_as_user = Some(api::Int64Value { value: 4294967295 });
    refused(pod.create(c).await, &["run_as_user 4294967295"]);
    let mut c = container("group-max", script);
    security(&mut c).run_as_user = Some(api::Int64Value { value: 1000 });
    security(&mut c).run_as_group = Some(api::Int64Value { value: 4294967295 });
    refused(pod.create(c).await, &["run_as_group 4294967295"]);
    let mut c = container("supplemental-max", script);
    security(&mut c).supplemental_groups = vec![4294967295];
    refused(pod.create(c).await, &["supplemental_groups 4294967295"]);
    let mut c = container("supplemental-wrap", script);
    security(&mut c).supplemental_groups = vec![4294967296];
    refused(pod.create(c).await, &["supplemental_groups 4294967296"]);
    assert_eq!(pod.containers().await.len(), 0, "nothing was created");

    // A pod whose sandbox would run as (uid_t)-1 is refused as well.
    let mut runtime = pod.daemon.runtime().await;
    let mut config = pod.sibling("ids-pod-max");
    let sc = config
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default);
    sc.run_as_user = Some(api::Int64Value { value: 4294967295 });
    let err = runtime
        .run_pod_sandbox(api::RunPodSandboxRequest {
            config: Some(config),
            runtime_handler: String::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("run_as_user 4294967295"), "{err:?}");

    // An ordinary id still runs, as that id.
    let mut c = container("uid-1234", "id -u; id -G");
    security(&mut c).run_as_user = Some(api::Int64Value { value: 1234 });
    let id = pod.run(c).await;
    pod.wait_exited(&id).await;
    let log = pod.wait_log("uid-1234", "1234").await;
    assert!(log.contains(" 1234\n"), "{log}");
    pod.remove_all().await;
}

/// ExecSync with more output than the kubelet accepts in one message still answers: the output
/// is cut to fit and the exit code kept (was: "encoded message length too large", no reply).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_sync_output_past_the_kubelets_cap_is_truncated() {
    let pod = pod("exec-big").await;
    let id = pod.run(container("big", "sleep 600")).await;
    // The kubelet's client: 16 MiB per received message.
    let mut client = api::runtime_service_client::RuntimeServiceClient::new(common::connect(&pod.daemon.socket).await)
        .max_decoding_message_size(16 << 20);
    let reply = client
        .exec_sync(api::ExecSyncRequest {
            container_id: id.clone(),
            cmd: vec![
                "sh".into(),
                "-c".into(),
                "head -c 20000000 /dev/zero | tr '\\0' o; head -c 20000000 /dev/zero | tr '\\0' e >&2; exit 3".into(),
            ],
            timeout: 60,
        })
        .await
        .expect("a reply, not a transport error")
        .into_inner();
    assert_eq!(reply.exit_code, 3);
    let total = reply.stdout.len() + reply.stderr.len();
    assert!(total <= 16 << 20, "{total}");
    assert!(total >= 15 << 20, "as much as fits is kept: {total}");
    assert!(reply.stdout.len() >= 7 << 20 && reply.stdout.iter().all(|&b| b == b'o'));
    assert!(reply.stderr.len() >= 7 << 20 && reply.stderr.iter().all(|&b| b == b'e'));

    // Small output is untouched.
    let reply = pod
        .exec(&id, &["sh", "-c", "echo out; echo err >&2; exit 4"], 10)
        .await
        .unwrap();
    assert_eq!(
        (reply.stdout.as_slice(), reply.stderr.as_slice(), reply.exit_code),
        (&b"out\n"[..], &b"err\n"[..], 4)
    );
    pod.remove_all().await;
}

/// An image's /dev, /etc, or a volume target's parent that is a symlink is resolved inside the
/// container's root, as runc does, and never on the host: an absolute /dev link naming a host
/// directory once made the runtime create /dev's links (fd, stdin, ptmx) there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_symlinks_resolve_inside_the_root_never_on_the_host() {
    use std::os::unix::fs::symlink;
    let pod = pod("symlinks").await;
    let canary = tempfile::Builder::new().prefix("scute-canary-").tempdir().unwrap();
    let canary_path = canary.path().to_path_buf();
    let dev_link = custom_image(pod.registry(), "dev-symlink", None, |root| {
        let _ = std::fs::remove_dir_all(root.join("dev"));
        symlink(&canary_path, root.join("dev")).unwrap();
    });
    let etc_link = custom_image(pod.registry(), "etc-symlink", None, |root| {
        std::fs::rename(root.join("etc"), root.join("usr/etc")).unwrap();
        symlink("usr/etc", root.join("etc")).unwrap();
    });
    let parent_link = custom_image(pod.registry(), "mount-parent-symlink", None, |root| {
        std::fs::create_dir_all(root.join("srv")).unwrap();
        symlink("/srv", root.join("data")).unwrap();
    });
    for image in [&dev_link, &etc_link, &parent_link] {
        pull(&pod, image).await;
    }

    // /dev is the container's own tmpfs with its device nodes and links.
    let script = "test -c /dev/null && test -L /dev/fd && test -L /dev/ptmx && echo dev-ok; stat -f -c %T /dev";
    let id = pod.run(with_image(container("dev", script), &dev_link)).await;
    let status = pod.wait_exited(&id).await;
    let log = pod.wait_log("dev", "tmpfs").await;
    assert_eq!(status.exit_code, 0, "{log}");
    assert!(log.contains("dev-ok"), "{log}");
    let on_host: Vec<_> = std::fs::read_dir(canary.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        on_host.is_empty(),
        "created on the host through the image's /dev link: {on_host:?}"
    );

    // /etc → usr/etc: the pod's hostname, hosts and resolv.conf land in usr/etc, inside the
    // root, and read as they do in an image with a plain /etc.
    let script = "cat /etc/hostname /etc/hosts /etc/resolv.conf; readlink /etc || echo plain";
    let mut outputs = Vec::new();
    for (name, image) in [("etc-plain", common::pod::BUSYBOX), ("etc", etc_link.as_str())] {
        let id = pod.run(with_image(container(name, script), image)).await;
        let status = pod.wait_exited(&id).await;
        let log = pod.wait_log(name, "\n").await;
        assert_eq!(status.exit_code, 0, "{log}");
        let text: Vec<String> = log
            .lines()
            .map(|l| l.splitn(4, ' ').nth(3).unwrap_or("").to_string())
            .collect();
        outputs.push(text);
    }
    let (plain, linked) = (&outputs[0], &outputs[1]);
    assert_eq!(plain.last().map(String::as_str), Some("plain"));
    assert_eq!(linked.last().map(String::as_str), Some("usr/etc"));
    assert_eq!(plain[..plain.len() - 1], linked[..linked.len() - 1]);
    assert!(plain.len() > 2, "{plain:?}");

    // A volume at /data/vol with /data → /srv: mounted at /srv/vol inside the root.
    let volume = tempfile::tempdir().unwrap();
    std::fs::write(volume.path().join("file"), "from the volume\n").unwrap();
    let mut c = with_image(container("parent", "cat /data/vol/file /srv/vol/file"), &parent_link);
    c.mounts = vec![api::Mount {
        container_path: "/data/vol".into(),
        host_path: volume.path().display().to_string(),
        readonly: true,
        ..Default::default()
    }];
    let id = pod.run(c).await;
    let status = pod.wait_exited(&id).await;
    let log = pod.wait_log("parent", "from the volume").await;
    assert_eq!(status.exit_code, 0, "{log}");
    assert_eq!(log.matches("from the volume").count(), 2, "{log}");
    pod.remove_all().await;
}

/// Descriptors the runtime holds must never reach a container (runc CVE-2024-21626): a container
/// and an exec see only 0–2 (plus the directory `ls` itself opened); a working directory under
/// /proc (/proc/self/fd/N would put the process on the host through a leaked directory
/// descriptor) is InvalidArgument; one reaching /proc/self/fd/N through a symlink in the image
/// never starts a process outside the container's root.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_runtime_descriptor_reaches_a_container() {
    let pod = pod("fds").await;
    let id = pod
        .run(container("fds", "ls -l /proc/self/fd; echo listed; sleep 600"))
        .await;
    let log = pod.wait_log("fds", "listed").await;
    let exec = pod.exec(&id, &["ls", "-l", "/proc/self/fd"], 10).await.unwrap();
    let exec_out = String::from_utf8_lossy(&exec.stdout).to_string();
    for (who, listing) in [("container", log.as_str()), ("exec", exec_out.as_str())] {
        let mut fds = Vec::new();
        for line in listing.lines().filter(|l| l.contains(" -> ")) {
            let (head, target) = line.split_once(" -> ").unwrap();
            let fd: u32 = head.split_whitespace().last().unwrap().parse().unwrap();
            assert!(
                fd <= 2 || target.starts_with("/proc/"),
                "{who} holds fd {fd} -> {target}:\n{listing}"
            );
            fds.push(fd);
        }
        assert!([0, 1, 2].iter().all(|fd| fds.contains(fd)), "{who}: {listing}");
    }

    for cwd in ["/proc/self/fd/3", "/proc/1/cwd", "/tmp/../proc/self/fd/5", "/proc"] {
        let mut config = container("cwd-proc", "pwd");
        config.working_dir = cwd.into();
        let err = pod.create(config).await.unwrap_err();
        assert_eq!(err.code(), tonic::Code::InvalidArgument, "{cwd}: {err:?}");
        assert!(err.message().contains("/proc"), "{cwd}: {}", err.message());
    }

    // Through symlinks in the image: libcontainer's chdir happens with no directory descriptor
    // open, so each fails to start (or, were one a directory, runs inside the root).
    let image = custom_image(pod.registry(), "fd-links", None, |rootfs| {
        for fd in 3..=12 {
            std::os::unix::fs::symlink(format!("/proc/self/fd/{fd}"), rootfs.join(format!("fd{fd}"))).unwrap();
        }
    });
    pull(&pod, &image).await;
    for fd in 3..=12 {
        let name = format!("cwd-link-{fd}");
        let mut config = with_image(container(&name, "pwd -P; echo ran"), &image);
        config.working_dir = format!("/fd{fd}");
        let Ok(cid) = pod.create(config).await else { continue };
        let started = pod
            .daemon
            .runtime()
            .await
            .start_container(api::StartContainerRequest {
                container_id: cid.clone(),
            })
            .await;
        if started.is_ok() {
            pod.wait_exited(&cid).await;
            let log = pod.log(&name);
            assert!(!log.contains("unreachable"), "/fd{fd} started outside the root:\n{log}");
        }
    }
    pod.remove_all().await;
}

/// ExecSync is what the kubelet's exec probes use: a command that leaves a background child
/// holding its stdout, or one that never stops writing, still answers by its timeout (a probe
/// that never returns wedges the pod's worker), the endless output capped as above.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_sync_ends_by_its_timeout_whatever_the_command_leaves_behind() {
    let pod = pod("exec-bg").await;
    let id = pod.run(container("main", "sleep 600")).await;

    // The command exits at once; its child keeps stdout open for ten minutes.
    let started = std::time::Instant::now();
    let reply = pod
        .exec(&id, &["sh", "-c", "sleep 600 & echo started; exit 5"], 3)
        .await
        .unwrap();
    let took = started.elapsed();
    assert_eq!((reply.stdout.as_slice(), reply.exit_code), (&b"started\n"[..], 5));
    assert!(took < std::time::Duration::from_secs(10), "answered after {took:?}");

    // Output that never ends: killed at the timeout, DeadlineExceeded (which the kubelet turns
    // into a probe timeout), the daemon's memory unmoved by what was written.
    // The daemon's resident memory, sampled every 5 ms while the exec runs (its lifetime peak,
    // VmHWM, may have been set earlier by a pull).
    let rss = |pid: i32| common::status_kib(pid, "VmRSS").unwrap_or(0);
    let pid = pod.daemon.pid().as_raw();
    let before = rss(pid);
    let done = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = std::thread::spawn({
        let done = done.clone();
        move || {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::SeqCst) {
                peak = peak.max(rss(pid));
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            peak
        }
    });
    let started = std::time::Instant::now();
    let err = pod.exec(&id, &["sh", "-c", "yes scute"], 2).await.unwrap_err();
    let took = started.elapsed();
    done.store(true, std::sync::atomic::Ordering::SeqCst);
    let peak = sampler.join().unwrap();
    assert_eq!(err.code(), tonic::Code::DeadlineExceeded, "{err:?}");
    assert!(took < std::time::Duration::from_secs(10), "answered after {took:?}");
    let grew = peak.saturating_sub(before);
    eprintln!("figure: an endless ExecSync writer: daemon VmRSS {before} KiB, at most {peak} KiB meanwhile");
    assert!(grew < 16 << 10, "the daemon's RSS grew by {grew} KiB");

    // The container is unharmed and the next exec is quick.
    let reply = pod.exec(&id, &["echo", "ok"], 5).await.unwrap();
    assert_eq!((reply.stdout.as_slice(), reply.exit_code), (&b"ok\n"[..], 0));
    pod.remove_all().await;
}

/// Annotations a pod or container carries cannot stand in for scute's own keys or change what it
/// does (CRI-O CVE-2024-3154: an annotation became a systemd property of the container's scope):
/// the bundles' `io.kubernetes.cri.*` keys are scute's whatever the request said, and keys other
/// runtimes act on (`org.systemd.property.*`, `run.oci.*`) are plain annotations that change
/// nothing (the container stays confined to its devices). Only `cdi.k8s.io/` keys have an effect
/// (tests/cdi.rs), as docs/cri.md says.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn annotations_neither_forge_scutes_keys_nor_change_what_it_does() {
    let forged = |extra: &[(&str, &str)]| -> std::collections::HashMap<String, String> {
        [
            ("io.kubernetes.cri.sandbox-id", "forged"),
            ("io.kubernetes.cri.sandbox-name", "forged"),
            ("io.kubernetes.cri.sandbox-uid", "forged"),
            ("org.systemd.property.DevicePolicy", "auto"),
            ("org.systemd.property.DeviceAllow", "char-* rwm"),
            ("run.oci.keep_original_groups", "1"),
        ]
        .iter()
        .chain(extra)
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
    };
    let pod = common::pod::pod_edited("annotated", None, "", "", |c| {
        c.annotations = forged(&[("io.kubernetes.cri.container-type", "container")]);
    })
    .await;
    let mut c = container(
        "main",
        "mknod /tmp/kmsg c 1 11 && echo mknod-ok && echo x > /tmp/kmsg && echo kmsg-open; sleep 600",
    );
    c.annotations = forged(&[
        ("io.kubernetes.cri.container-type", "sandbox"),
        ("io.kubernetes.cri.container-name", "forged"),
        ("io.kubernetes.cri.image-name", "forged"),
    ]);
    let id = pod.run(c).await;

    let annotations = |bundle: PathBuf| -> serde_json::Value {
        let spec: serde_json::Value =
            serde_json::from_slice(&std::fs::read(bundle.join("config.json")).unwrap()).unwrap();
        spec["annotations"].clone()
    };
    let root = &pod.daemon.root;
    let sandbox = annotations(root.join("sandboxes").join(&pod.id).join("bundle"));
    assert_eq!(sandbox["io.kubernetes.cri.container-type"], "sandbox", "{sandbox:#}");
    assert_eq!(sandbox["io.kubernetes.cri.sandbox-id"], pod.id.as_str(), "{sandbox:#}");
    let ctr = annotations(root.join("containers").join(&id).join("bundle"));
    for (key, want) in [
        ("io.kubernetes.cri.container-type", "container"),
        ("io.kubernetes.cri.sandbox-id", pod.id.as_str()),
        ("io.kubernetes.cri.sandbox-name", "annotated"),
        ("io.kubernetes.cri.container-name", "main"),
        ("io.kubernetes.cri.image-name", common::pod::BUSYBOX),
    ] {
        assert_eq!(ctr[key], want, "{key}: {ctr:#}");
    }
    // Passed through, without effect.
    assert_eq!(ctr["org.systemd.property.DevicePolicy"], "auto");
    let log = pod.wait_log("main", "Operation not permitted").await;
    assert!(log.contains("mknod-ok") && !log.contains("kmsg-open"), "{log}");
    assert_eq!(pod.status(&id).await.state(), api::ContainerState::ContainerRunning);
    pod.remove_all().await;
}

/// An image whose /dev/null is a symlink (to a file the container can read) and whose
/// /dev/console is a directory cannot turn masking into a bind of something else (runc
/// CVE-2025-31133): the container's /dev is its own, /dev/null the real device, every masked
/// path masked (reads empty) or refused, /proc/sys read-only, the linked file unchanged; a
/// mount into /proc is refused before anything is made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masking_binds_the_real_dev_null_whatever_the_image_has() {
    use std::os::unix::fs::symlink;
    let pod = pod("masked").await;
    let image = custom_image(pod.registry(), "dev-null-symlink", None, |root| {
        let dev = root.join("dev");
        let _ = std::fs::remove_dir_all(&dev);
        std::fs::create_dir_all(dev.join("console")).unwrap();
        std::fs::write(root.join("etc/target"), "image file\n").unwrap();
        symlink("/etc/target", dev.join("null")).unwrap();
    });
    pull(&pod, &image).await;
    let script = "\
        test -c /dev/null && ! test -L /dev/null && echo null-is-a-device; \
        echo x > /dev/null; cat /etc/target; \
        for f in /proc/keys /proc/timer_list /proc/kcore; do echo \"$f $(cat $f 2>/dev/null | wc -c) bytes\"; done; \
        echo \"/proc/acpi $(ls /proc/acpi 2>/dev/null | wc -l) entries\"; \
        echo 1 > /proc/sys/kernel/sysrq 2>/dev/null || echo sysctl-readonly; \
        echo done";
    let id = pod.run(with_image(container("m", script), &image)).await;
    let status = pod.wait_exited(&id).await;
    let log = pod.wait_log("m", "done").await;
    assert_eq!(status.exit_code, 0, "{log}");
    for want in [
        "null-is-a-device",
        "image file",
        "/proc/keys 0 bytes",
        "/proc/timer_list 0 bytes",
        "/proc/kcore 0 bytes",
        "/proc/acpi 0 entries",
        "sysctl-readonly",
    ] {
        assert!(log.contains(want), "{want} not in {log}");
    }
    // The host has what was masked (so the check above means something).
    assert!(std::fs::read_to_string("/proc/keys").is_ok_and(|k| !k.is_empty()));

    let mut c = container("procmount", "true");
    c.mounts = vec![api::Mount {
        container_path: "/proc/sys/kernel/core_pattern".into(),
        host_path: "/etc/hostname".into(),
        ..Default::default()
    }];
    refused(pod.create(c).await, &["/proc/sys/kernel/core_pattern", "/proc"]);
    pod.remove_all().await;
}

/// An image whose /proc and /sys are symlinks (to a directory of look-alike files in the image,
/// and to /etc): procfs and sysfs are mounted where the container looks, on the container's
/// own mount points, never through the links (runc CVE-2025-52881 redirected procfs writes);
/// the look-alikes and the link targets are untouched and the masks still apply.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proc_and_sys_are_the_kernels_whatever_the_image_links() {
    use std::os::unix::fs::symlink;
    let pod = pod("proclink").await;
    let image = custom_image(pod.registry(), "proc-symlink", None, |root| {
        for dir in ["proc", "sys"] {
            let _ = std::fs::remove_dir_all(root.join(dir));
        }
        std::fs::create_dir_all(root.join("fakeproc/sys/kernel")).unwrap();
        std::fs::write(root.join("fakeproc/keys"), "fake keys\n").unwrap();
        std::fs::write(root.join("fakeproc/sys/kernel/hostname"), "fake\n").unwrap();
        symlink("/fakeproc", root.join("proc")).unwrap();
        symlink("/etc", root.join("sys")).unwrap();
    });
    pull(&pod, &image).await;
    let script = "\
        echo \"proc is $(stat -f -c %T /proc)\"; echo \"sys is $(stat -f -c %T /sys)\"; \
        test -L /proc || echo proc-not-a-link; \
        echo \"self $(cat /proc/self/comm)\"; \
        echo \"/proc/keys $(cat /proc/keys 2>/dev/null | wc -c) bytes\"; \
        cat /fakeproc/keys /fakeproc/sys/kernel/hostname; \
        echo done";
    let id = pod.run(with_image(container("p", script), &image)).await;
    let status = pod.wait_exited(&id).await;
    let log = pod.wait_log("p", "done").await;
    assert_eq!(status.exit_code, 0, "{log}");
    for want in [
        "proc is proc",
        "sys is sysfs",
        "proc-not-a-link",
        "self cat",
        "/proc/keys 0 bytes",
        "fake keys",
        "fake\n",
    ] {
        assert!(log.contains(want), "{want:?} not in {log}");
    }
    pod.remove_all().await;
}

/// A bind whose destination the image's symlinks lead into procfs (`/data` -> `/proc/sys`,
/// dangling until procfs is mounted) is refused before anything runs, naming the mount and
/// where it leads (the runc CVE-2025-52565 class: a bind there would receive the runtime's
/// procfs writes); nothing is left of the refused container and the image runs without it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binds_the_image_leads_into_proc_are_refused() {
    let pod = pod("procbind").await;
    let image = custom_image(pod.registry(), "data-to-proc", None, |root| {
        std::os::unix::fs::symlink("/proc/sys", root.join("data")).unwrap();
        std::os::unix::fs::symlink("../proc/self", root.join("etc/self")).unwrap();
    });
    pull(&pod, &image).await;
    let host = tempfile::tempdir().unwrap();
    std::fs::write(host.path().join("core_pattern"), "host file\n").unwrap();
    for (destination, lands) in [
        ("/data/kernel", "/proc/sys/kernel"),
        ("/etc/self/attr", "/proc/self/attr"),
    ] {
        let mut c = with_image(container("bind", "true"), &image);
        c.mounts = vec![api::Mount {
            container_path: destination.into(),
            host_path: host.path().display().to_string(),
            ..Default::default()
        }];
        let err = pod.create(c).await.expect_err("the create must be refused");
        assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
        for needle in [destination, lands, "symlinks"] {
            assert!(err.message().contains(needle), "{needle:?} not in {:?}", err.message());
        }
    }
    assert!(pod.containers().await.is_empty(), "a refused create left a container");
    assert_eq!(
        std::fs::read_to_string(host.path().join("core_pattern")).unwrap(),
        "host file\n"
    );
    // The same image with its mount elsewhere runs.
    let mut c = with_image(container("ok", "cat /data/kernel/ostype; echo done"), &image);
    c.mounts = vec![api::Mount {
        container_path: "/srv".into(),
        host_path: host.path().display().to_string(),
        ..Default::default()
    }];
    let id = pod.run(c).await;
    let status = pod.wait_exited(&id).await;
    let log = pod.wait_log("ok", "done").await;
    assert_eq!(status.exit_code, 0, "{log}");
    assert!(log.contains("Linux"), "{log}");
    pod.remove_all().await;
}

/// A hostPath directory swapped for a symlink after scute checked it and before libcontainer
/// mounts it (anyone who can write the path's parent could: another pod with a hostPath above
/// it): the start (where the process and its mounts are made) is refused naming the mount, and
/// nothing of it is left but the exited container. The swap lands in that window by
/// construction, not by timing: the daemon's root is a tmpfs this test watches with fanotify,
/// and the shim's first open of the container's config.json (after scute pinned the source,
/// before libcontainer reads the spec it mounts from) waits while the test swaps.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_path_swapped_for_a_symlink_before_its_mount_is_refused() {
    let daemon = common::Daemon::start_on_tmpfs("", "size=1g");
    let (root, daemon_pid) = (daemon.root.clone(), daemon.pid().as_raw());
    let pod = pod_on(daemon, "swap").await;
    let host = tempfile::tempdir().unwrap();
    let top = std::fs::canonicalize(host.path()).unwrap();
    let (real, decoy) = (top.join("real"), top.join("decoy"));
    for (dir, which) in [(&real, "real\n"), (&decoy, "decoy\n")] {
        std::fs::create_dir_all(dir.join("data")).unwrap();
        std::fs::write(dir.join("data/which"), which).unwrap();
    }
    // The swap, made while the shim's open of the container's config.json waits.
    let watch = common::open_watch::OpenWatch::start(&root, daemon_pid, false, {
        let (real, decoy) = (real.clone(), decoy.clone());
        move || {
            std::fs::rename(&real, real.with_file_name("moved")).unwrap();
            std::os::unix::fs::symlink(&decoy, &real).unwrap();
        }
    });

    let mut c = container("swapped", "cat /srv/which");
    c.mounts = vec![api::Mount {
        container_path: "/srv".into(),
        host_path: real.join("data").display().to_string(),
        ..Default::default()
    }];
    let mounts = common::mounts_under(&root);
    let id = pod
        .create(c)
        .await
        .expect("the create (the source is checked again at the start)");
    let started = pod
        .daemon
        .runtime()
        .await
        .start_container(api::StartContainerRequest {
            container_id: id.clone(),
        })
        .await;
    let (path, opener) = watch
        .finish()
        .expect("the shim never opened the container's config.json: no swap was made");
    let err = started.expect_err(&format!(
        "a start whose source was swapped (at {} by pid {opener}) must be refused",
        path.display()
    ));
    assert_eq!(err.code(), tonic::Code::FailedPrecondition, "{err:?}");
    assert!(
        err.message().contains("/srv") && err.message().contains("is not"),
        "{err:?}"
    );
    let status = pod.status(&id).await;
    assert_eq!(status.state(), api::ContainerState::ContainerExited, "{status:?}");
    assert_eq!(status.reason, "StartError");
    assert_eq!(common::mounts_under(&root), mounts, "a refused start left a mount");
    assert!(!pod.log("swapped").contains("decoy"), "the container ran on the decoy");
    assert_eq!(std::fs::read_to_string(decoy.join("data/which")).unwrap(), "decoy\n");
    pod.remove_all().await;
}
