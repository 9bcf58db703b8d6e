//! Image volumes (KEP-4639) as a container sees them: an image pulled from the real local
//! registry mounted read-only, whole or at a sub-path, kept through RemoveImage while mounted,
//! and hostile sub-paths refused with InvalidArgument, leaving nothing mounted.

mod common;

use std::path::Path;

use common::pod::{container, pod, Pod};
use common::{kit, mounts_under};
use scute::api;
use tonic::Code;

/// Pushed to the test registry; pulled by the name the daemon mirrors there.
const DATA: &str = "registry.k8s.io/scute-test/image-volume-data:1";

/// An image of plain files: a config tree, a symlink out by an absolute path, one out through
/// "..", one that stays inside.
fn push_data_image(pod: &Pod) {
    let work = tempfile::tempdir().unwrap();
    let rootfs = work.path().join("rootfs");
    std::fs::create_dir_all(rootfs.join("etc/app/conf.d")).unwrap();
    std::fs::write(rootfs.join("etc/app/app.conf"), "hello from the image\n").unwrap();
    std::fs::write(rootfs.join("etc/app/conf.d/extra.conf"), "extra\n").unwrap();
    std::os::unix::fs::symlink("/etc", rootfs.join("escape")).unwrap();
    std::os::unix::fs::symlink("../../../..", rootfs.join("etc/app/up")).unwrap();
    std::os::unix::fs::symlink("etc/app", rootfs.join("app")).unwrap();
    let layout = work.path().join("layout");
    kit(&[
        "build",
        "--rootfs",
        rootfs.to_str().unwrap(),
        "--out",
        layout.to_str().unwrap(),
    ]);
    push(pod, &layout, "scute-test/image-volume-data:1");
}

fn push(pod: &Pod, layout: &Path, repo_tag: &str) {
    kit(&[
        "push",
        "--layout",
        layout.to_str().unwrap(),
        "--to",
        &format!("{}/{repo_tag}", pod.registry().addr),
        "--plain-http",
    ]);
}

fn image_mount(container_path: &str, image: &str, sub_path: &str) -> api::Mount {
    api::Mount {
        container_path: container_path.into(),
        image: Some(api::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        image_sub_path: sub_path.into(),
        readonly: true,
        ..Default::default()
    }
}

fn image_volume_mounts(root: &Path) -> Vec<String> {
    mounts_under(root)
        .into_iter()
        .filter(|m| m.contains("/image-volumes/"))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_is_mounted_read_only_whole_or_at_a_sub_path() {
    let pod = pod("image-volume").await;
    push_data_image(&pod);
    let image_id = pod.pull(DATA).await;
    assert!(image_id.starts_with("sha256:"), "{image_id}");

    let mut config = container(
        "reader",
        "cat /vol/etc/app/app.conf /conf/app.conf /linked/app.conf; \
         touch /vol/new 2>/dev/null || echo vol-is-read-only; \
         touch /conf/new 2>/dev/null || echo conf-is-read-only; \
         grep -E ' /(vol|conf) ' /proc/self/mountinfo; echo done; exec sleep 3600",
    );
    // As the kubelet sends them: the image by the reference PullImage answered.
    config.mounts = vec![
        image_mount("/vol", &image_id, ""),
        image_mount("/conf", &image_id, "etc/app"),
        // A symlink inside the image resolves inside it.
        image_mount("/linked", DATA, "app"),
    ];
    let id = pod.run(config).await;
    let log = pod.wait_log("reader", "stdout F done").await;
    assert_eq!(log.matches("stdout F hello from the image").count(), 3, "{log}");
    assert!(log.contains("stdout F vol-is-read-only"), "{log}");
    assert!(log.contains("stdout F conf-is-read-only"), "{log}");
    for point in [" /vol ", " /conf "] {
        let line = log
            .lines()
            .find(|l| l.contains(point))
            .unwrap_or_else(|| panic!("{point} not in the container's mountinfo:\n{log}"));
        let line = line.split_once(" stdout F ").map_or(line, |(_, l)| l);
        // mountinfo: id, parent, dev, root, mount point, per-mount options, ...
        let options = line.split(' ').nth(5).unwrap_or_default();
        for flag in ["ro", "nosuid", "nodev"] {
            assert!(options.split(',').any(|o| o == flag), "{point} lacks {flag}: {line}");
        }
    }
    assert_eq!(image_volume_mounts(&pod.daemon.root).len(), 3);

    // ContainerStatus reports each mount with the image it resolved to.
    let status = pod.status(&id).await;
    let reported: Vec<_> = status
        .mounts
        .iter()
        .map(|m| m.image.as_ref().map(|i| i.image_ref.clone()).unwrap_or_default())
        .collect();
    assert_eq!(reported, vec![image_id.clone(); 3]);

    // Removing the image while it is mounted succeeds; the volume stays readable.
    pod.daemon
        .images()
        .await
        .remove_image(api::RemoveImageRequest {
            image: Some(api::ImageSpec {
                image: image_id.clone(),
                ..Default::default()
            }),
        })
        .await
        .unwrap();
    let out = pod.exec(&id, &["cat", "/conf/conf.d/extra.conf"], 5).await.unwrap();
    assert_eq!(String::from_utf8_lossy(&out.stdout), "extra\n");
    assert_eq!(out.exit_code, 0);

    pod.remove_all().await;
    assert_eq!(image_volume_mounts(&pod.daemon.root), Vec::<String>::new());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_sub_paths_and_missing_images_are_refused() {
    let pod = pod("image-volume-hostile").await;
    push_data_image(&pod);
    pod.pull(DATA).await;
    for (sub_path, says) in [
        ("/etc", "relative"),
        ("../etc", "relative"),
        ("etc/../../etc", "relative"),
        ("escape", "leads out of the image"),
        ("escape/passwd", "leads out of the image"),
        ("etc/app/up", "leads out of the image"),
        ("etc/missing", "does not exist"),
    ] {
        let mut config = container("hostile", "exit 0");
        config.mounts = vec![image_mount("/vol", DATA, sub_path)];
        let err = pod.create(config).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{sub_path}: {err:?}");
        assert!(
            err.message().contains(sub_path) && err.message().contains(says),
            "{sub_path}: {}",
            err.message()
        );
        assert_eq!(
            image_volume_mounts(&pod.daemon.root),
            Vec::<String>::new(),
            "{sub_path}"
        );
    }
    let mut config = container("missing", "exit 0");
    config.mounts = vec![image_mount("/vol", "registry.k8s.io/scute-test/never-pulled:1", "")];
    let err = pod.create(config).await.unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(err.message().contains("never-pulled"), "{}", err.message());
    assert!(pod.containers().await.is_empty());
    pod.remove_all().await;
}

/// An OCI artifact (image-spec 1.1, as ORAS pushes one): the empty config, one layer per file.
fn push_artifact(pod: &Pod) {
    let work = tempfile::tempdir().unwrap();
    let (config, model) = (work.path().join("config.yaml"), work.path().join("model.bin"));
    std::fs::write(&config, "threshold: 0.5\n").unwrap();
    std::fs::write(&model, [0u8, 1, 2, 3, 255]).unwrap();
    let layout = work.path().join("layout");
    kit(&[
        "artifact",
        "--file",
        config.to_str().unwrap(),
        "--file",
        model.to_str().unwrap(),
        "--artifact-type",
        "application/vnd.scute.test.model",
        "--out",
        layout.to_str().unwrap(),
    ]);
    push(pod, &layout, "scute-test/model-artifact:1");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oci_artifact_is_mounted_as_its_files() {
    const ARTIFACT: &str = "registry.k8s.io/scute-test/model-artifact:1";
    let pod = pod("image-volume-artifact").await;
    push_artifact(&pod);
    let id = pod.pull(ARTIFACT).await;
    // The manifest's digest is its ID (its config is the shared empty one).
    let image = pod.image_status(ARTIFACT).await;
    assert_eq!(image.id, id);
    assert_eq!(image.size, 15 + 5);

    // No runnable image: refused as a container's image, naming what it is.
    let mut config = container("runs-artifact", "exit 0");
    config.image = Some(api::ImageSpec {
        image: ARTIFACT.into(),
        ..Default::default()
    });
    let err = pod.create(config).await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument, "{err:?}");
    assert!(err.message().contains("artifact"), "{}", err.message());

    let mut config = container(
        "reader",
        "ls /art; cat /art/config.yaml; od -An -tu1 /model; \
         touch /art/x 2>/dev/null || echo art-is-read-only; echo done; exec sleep 3600",
    );
    config.mounts = vec![image_mount("/art", &id, ""), image_mount("/model", &id, "model.bin")];
    let container_id = pod.run(config).await;
    let log = pod.wait_log("reader", "stdout F done").await;
    let lines: Vec<&str> = log
        .lines()
        .filter_map(|l| l.split_once(" stdout F ").map(|(_, t)| t))
        .collect();
    assert_eq!(
        lines,
        [
            "config.yaml",
            "model.bin",
            "threshold: 0.5",
            "   0   1   2   3 255",
            "art-is-read-only",
            "done"
        ],
        "{log}"
    );
    assert_eq!(
        pod.status(&container_id).await.mounts[0]
            .image
            .as_ref()
            .unwrap()
            .image_ref,
        id
    );
    // An artifact's records are whole to `scute doctor` (its manifest is no layer to size).
    let doctor = std::process::Command::new(common::SCUTE)
        .args(["doctor", "--config"])
        .arg(&pod.daemon.config_path)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        doctor.status.success() && report.contains("no problem found"),
        "{report}"
    );
    pod.remove_all().await;
    assert_eq!(image_volume_mounts(&pod.daemon.root), Vec::<String>::new());
}

/// A start that fails after it mounted an image volume's view and before the container's rootfs
/// (mounted last; here the container's writable layer is a file, not a directory) leaves
/// nothing mounted once it has answered, not until RemoveContainer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_start_failing_before_its_rootfs_leaves_no_view_mounted() {
    let pod = pod("image-volume-failed-start").await;
    push_data_image(&pod);
    let image_id = pod.pull(DATA).await;
    let mut config = container("unstartable", "exec sleep 3600");
    config.mounts = vec![image_mount("/vol", &image_id, "")];
    let id = pod.create(config).await.unwrap();
    assert_eq!(
        image_volume_mounts(&pod.daemon.root),
        Vec::<String>::new(),
        "mounted at create"
    );
    let upper = pod.daemon.root.join("containers").join(&id).join("upper");
    std::fs::remove_dir_all(&upper).unwrap();
    std::fs::write(&upper, "not a directory").unwrap();

    let err = pod
        .daemon
        .runtime()
        .await
        .start_container(api::StartContainerRequest {
            container_id: id.clone(),
        })
        .await
        .expect_err("a start without its writable layer");
    assert!(err.message().contains("rootfs"), "{err:?}");
    let status = pod.status(&id).await;
    assert_eq!(status.state(), api::ContainerState::ContainerExited);
    assert_eq!(status.reason, "StartError");
    assert_eq!(
        image_volume_mounts(&pod.daemon.root),
        Vec::<String>::new(),
        "the failed start left its image volume mounted"
    );
    assert_eq!(
        mounts_under(&pod.daemon.root.join("containers").join(&id)),
        Vec::<String>::new()
    );
    pod.remove_all().await;
}
