//! ImageService against a real local registry (Debian's docker-registry) filled by the image kit:
//! pulls through hosts.toml mirrors, by tag / digest / no tag, multi-arch indexes, layer formats,
//! auth, list/status/remove semantics, restart persistence, concurrent pulls, deadline + resume,
//! hostile layers, ImageFsInfo and the embedded pause image.

mod common;

use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{kit, Daemon, Registry};
use scute::api;
use sha2::{Digest as _, Sha256};
use tonic::Code;

/// A small rootfs with a marker file, so each test image has content to check.
fn rootfs(dir: &Path, name: &str, marker: &str) -> PathBuf {
    let root = dir.join(name);
    std::fs::create_dir_all(root.join("etc")).unwrap();
    std::fs::create_dir_all(root.join("bin")).unwrap();
    std::fs::write(root.join("etc/marker"), marker).unwrap();
    std::fs::write(root.join("bin/tool"), "#!/bin/sh\necho tool\n").unwrap();
    std::fs::set_permissions(root.join("bin/tool"), std::fs::Permissions::from_mode(0o755)).unwrap();
    root
}

/// Builds a one-layer image from a fresh rootfs and pushes it; returns the layout dir.
fn push_image(registry: &Registry, work: &Path, repo_tag: &str, marker: &str, extra: &[&str]) -> PathBuf {
    let name = repo_tag.replace(['/', ':'], "_");
    let root = rootfs(work, &format!("rootfs-{name}"), marker);
    let layout = work.join(format!("layout-{name}"));
    let mut args = vec![
        "build",
        "--rootfs",
        root.to_str().unwrap(),
        "--out",
        layout.to_str().unwrap(),
        "--label",
    ];
    let label = format!("test.marker={marker}");
    args.push(&label);
    args.extend_from_slice(extra);
    kit(&args);
    push_layout(registry, &layout, repo_tag, &[]);
    layout
}

fn push_layout(registry: &Registry, layout: &Path, repo_tag: &str, also_tags: &[&str]) {
    let to = format!("{}/{repo_tag}", registry.addr);
    let mut args = vec![
        "push",
        "--layout",
        layout.to_str().unwrap(),
        "--to",
        &to,
        "--plain-http",
    ];
    for tag in also_tags {
        args.extend_from_slice(&["--also-tag", tag]);
    }
    kit(&args);
}

fn spec(image: &str) -> Option<api::ImageSpec> {
    Some(api::ImageSpec {
        image: image.to_string(),
        ..Default::default()
    })
}

async fn pull(daemon: &Daemon, image: &str) -> Result<String, tonic::Status> {
    daemon
        .images()
        .await
        .pull_image(api::PullImageRequest {
            image: spec(image),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().image_ref)
}

async fn remove(daemon: &Daemon, image: &str) -> Result<(), tonic::Status> {
    daemon
        .images()
        .await
        .remove_image(api::RemoveImageRequest { image: spec(image) })
        .await
        .map(|_| ())
}

async fn status(daemon: &Daemon, image: &str) -> Option<api::Image> {
    daemon
        .images()
        .await
        .image_status(api::ImageStatusRequest {
            image: spec(image),
            verbose: false,
        })
        .await
        .unwrap()
        .into_inner()
        .image
}

async fn list(daemon: &Daemon) -> Vec<api::Image> {
    daemon
        .images()
        .await
        .list_images(api::ListImagesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .images
}

/// The image's layer snapshot dirs, top first, read from verbose ImageStatus.
async fn snapshot_dirs(daemon: &Daemon, image: &str) -> Vec<PathBuf> {
    let info = daemon
        .images()
        .await
        .image_status(api::ImageStatusRequest {
            image: spec(image),
            verbose: true,
        })
        .await
        .unwrap()
        .into_inner()
        .info;
    let detail: serde_json::Value = serde_json::from_str(&info["info"]).unwrap();
    detail["layers"]
        .as_array()
        .unwrap()
        .iter()
        .rev()
        .map(|l| {
            let chain = l["chainID"].as_str().unwrap().trim_start_matches("sha256:").to_string();
            daemon.root.join("snapshots").join(chain).join("fs")
        })
        .collect()
}

fn manifest_digest(registry: &Registry, repo: &str, tag: &str) -> String {
    let out = std::process::Command::new("curl")
        .args([
            "-fsSI",
            "-H",
            "Accept: application/vnd.oci.image.manifest.v1+json,application/vnd.oci.image.index.v1+json,application/vnd.docker.distribution.manifest.v2+json,application/vnd.docker.distribution.manifest.list.v2+json",
        ])
        .arg(format!("http://{}/v2/{repo}/manifests/{tag}", registry.addr))
        .output()
        .unwrap();
    let headers = String::from_utf8_lossy(&out.stdout).to_string();
    headers
        .lines()
        .find_map(|l| {
            l.strip_prefix("Docker-Content-Digest: ")
                .or_else(|| l.strip_prefix("docker-content-digest: "))
        })
        .unwrap_or_else(|| panic!("no digest header: {headers}"))
        .trim()
        .to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_by_tag_digest_and_no_tag_through_mirrors() {
    let registry = Registry::start();
    let work = tempfile::tempdir().unwrap();
    push_image(
        &registry,
        work.path(),
        "e2e-test-images/demo:1.0",
        "demo",
        &["--user", "1002"],
    );
    push_image(
        &registry,
        work.path(),
        "library/plain:latest",
        "plain",
        &["--user", "www-data:1004"],
    );
    let daemon = Daemon::start("");
    daemon.mirror_public_registries_to(&registry.addr);

    // By tag, through the registry.k8s.io mirror.
    let id = pull(&daemon, "registry.k8s.io/e2e-test-images/demo:1.0").await.unwrap();
    assert!(id.starts_with("sha256:") && id.len() == 71, "{id}");
    let image = status(&daemon, "registry.k8s.io/e2e-test-images/demo:1.0")
        .await
        .unwrap();
    assert_eq!(image.id, id);
    assert_eq!(image.repo_tags, vec!["registry.k8s.io/e2e-test-images/demo:1.0"]);
    let digest = manifest_digest(&registry, "e2e-test-images/demo", "1.0");
    assert_eq!(
        image.repo_digests,
        vec![format!("registry.k8s.io/e2e-test-images/demo@{digest}")]
    );
    assert_eq!(image.uid.unwrap().value, 1002);
    assert_eq!(image.username, "");
    assert!(image.size > 0);
    assert!(!image.pinned);

    // The same image by ID, ID prefix (with and without sha256:) and digest.
    for name in [
        id.clone(),
        id[7..19].to_string(),
        id[..19].to_string(),
        format!("registry.k8s.io/e2e-test-images/demo@{digest}"),
    ] {
        assert_eq!(status(&daemon, &name).await.as_ref(), Some(&image), "by {name}");
    }

    // The rootfs is unpacked: the marker file is there with its content and mode.
    let dirs = snapshot_dirs(&daemon, &id).await;
    assert_eq!(std::fs::read_to_string(dirs[0].join("etc/marker")).unwrap(), "demo");
    assert_eq!(
        std::fs::metadata(dirs[0].join("bin/tool")).unwrap().mode() & 0o777,
        0o755
    );

    // No registry and no tag: docker.io/library/plain:latest, through the docker.io mirror.
    let plain = pull(&daemon, "plain").await.unwrap();
    let image = status(&daemon, "plain").await.unwrap();
    assert_eq!(image.id, plain);
    assert_eq!(image.repo_tags, vec!["docker.io/library/plain:latest"]);
    assert_eq!(image.uid, None);
    assert_eq!(image.username, "www-data");

    // By digest only: RepoDigests gets the name, RepoTags nothing new.
    let daemon2 = Daemon::start("");
    daemon2.mirror_public_registries_to(&registry.addr);
    let by_digest = format!("registry.k8s.io/e2e-test-images/demo@{digest}");
    assert_eq!(pull(&daemon2, &by_digest).await.unwrap(), id);
    let image = status(&daemon2, &by_digest).await.unwrap();
    assert!(image.repo_tags.is_empty(), "{:?}", image.repo_tags);
    assert_eq!(image.repo_digests, vec![by_digest.clone()]);

    // Unknown images: NotFound from the pull, no image from ImageStatus.
    let err = pull(&daemon, "registry.k8s.io/e2e-test-images/missing:1.0")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::NotFound, "{err:?}");
    assert!(status(&daemon, "registry.k8s.io/e2e-test-images/missing:1.0")
        .await
        .is_none());
    let err = pull(&daemon, "Not A Reference").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
    let err = pull(&daemon, "").await.unwrap_err();
    assert_eq!(err.code(), Code::InvalidArgument);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_arch_index_selects_this_platform() {
    let registry = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let amd = rootfs(work.path(), "amd", "amd64");
    let arm = rootfs(work.path(), "arm", "arm64");
    let (amd_layout, arm_layout, index) = (
        work.path().join("l-amd"),
        work.path().join("l-arm"),
        work.path().join("l-index"),
    );
    kit(&[
        "build",
        "--rootfs",
        amd.to_str().unwrap(),
        "--out",
        amd_layout.to_str().unwrap(),
        "--platform",
        "linux/amd64",
    ]);
    kit(&[
        "build",
        "--rootfs",
        arm.to_str().unwrap(),
        "--out",
        arm_layout.to_str().unwrap(),
        "--platform",
        "linux/arm64",
    ]);
    for (docker, repo) in [(false, "multi/oci:1"), (true, "multi/docker:1")] {
        let _ = std::fs::remove_dir_all(&index);
        let mut args = vec![
            "index".to_string(),
            "--out".into(),
            index.display().to_string(),
            "--manifest".into(),
            format!("linux/arm64={}", arm_layout.display()),
            "--manifest".into(),
            format!("linux/amd64={}", amd_layout.display()),
        ];
        if docker {
            args.push("--docker-media-types".into());
        }
        kit(&args.iter().map(String::as_str).collect::<Vec<_>>());
        push_layout(&registry, &index, repo, &[]);
    }
    let daemon = Daemon::start("");
    daemon.mirror_public_registries_to(&registry.addr);
    for repo in ["gcr.io/multi/oci:1", "gcr.io/multi/docker:1"] {
        let id = pull(&daemon, repo).await.unwrap();
        let dirs = snapshot_dirs(&daemon, &id).await;
        assert_eq!(
            std::fs::read_to_string(dirs[0].join("etc/marker")).unwrap(),
            "amd64",
            "{repo}"
        );
        let image = status(&daemon, repo).await.unwrap();
        // RepoDigests name the index (what the tag points at), as containerd records it.
        let index_digest = manifest_digest(&registry, &repo["gcr.io/".len()..repo.len() - 2], "1");
        let by_index_digest = format!("{}@{index_digest}", &repo[..repo.len() - 2]);
        // (Both indexes select the same amd64 image, so it carries both repositories' digests.)
        assert!(
            image.repo_digests.contains(&by_index_digest),
            "{:?}",
            image.repo_digests
        );
        // ... and pulling or looking up by that digest finds the same image.
        assert_eq!(status(&daemon, &by_index_digest).await.unwrap().id, id);
        assert_eq!(pull(&daemon, &by_index_digest).await.unwrap(), id);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_formats_and_whiteouts() {
    let registry = Registry::start();
    let work = tempfile::tempdir().unwrap();
    push_image(
        &registry,
        work.path(),
        "formats/zstd:1",
        "zstd",
        &["--compression", "zstd"],
    );
    push_image(
        &registry,
        work.path(),
        "formats/plain:1",
        "plain",
        &["--compression", "none"],
    );
    push_image(
        &registry,
        work.path(),
        "formats/docker:1",
        "docker",
        &["--docker-media-types"],
    );

    // Three layers; the third deletes /etc/marker and hides /opt's lower contents.
    let l1 = rootfs(work.path(), "l1", "one");
    std::fs::create_dir_all(l1.join("opt/old")).unwrap();
    let l2 = work.path().join("l2");
    std::fs::create_dir_all(l2.join("etc")).unwrap();
    std::fs::write(l2.join("etc/second"), "two").unwrap();
    let l3 = work.path().join("l3");
    std::fs::create_dir_all(l3.join("etc")).unwrap();
    std::fs::create_dir_all(l3.join("opt")).unwrap();
    std::fs::write(l3.join("opt/new"), "three").unwrap();
    let layout = work.path().join("l-multi");
    kit(&[
        "build",
        "--rootfs",
        l1.to_str().unwrap(),
        "--rootfs",
        l2.to_str().unwrap(),
        "--rootfs",
        l3.to_str().unwrap(),
        "--whiteout",
        "/etc/marker",
        "--opaque",
        "/opt",
        "--out",
        layout.to_str().unwrap(),
    ]);
    push_layout(&registry, &layout, "formats/layers:1", &[]);

    let daemon = Daemon::start("");
    daemon.mirror_public_registries_to(&registry.addr);
    for (repo, marker) in [("zstd", "zstd"), ("plain", "plain"), ("docker", "docker")] {
        let name = format!("gcr.io/formats/{repo}:1");
        let id = pull(&daemon, &name).await.unwrap_or_else(|e| panic!("{name}: {e:?}"));
        let dirs = snapshot_dirs(&daemon, &id).await;
        assert_eq!(std::fs::read_to_string(dirs[0].join("etc/marker")).unwrap(), marker);
    }
    let id = pull(&daemon, "gcr.io/formats/layers:1").await.unwrap();
    let dirs = snapshot_dirs(&daemon, &id).await;
    assert_eq!(dirs.len(), 3);
    // Overlay whiteout: a 0:0 character device where the deleted file was.
    let whiteout = std::fs::symlink_metadata(dirs[0].join("etc/marker")).unwrap();
    assert!(whiteout.file_type().is_char_device());
    assert_eq!(whiteout.rdev(), 0);
    let opaque = xattr(&dirs[0].join("opt"), "trusted.overlay.opaque");
    assert_eq!(opaque.as_deref(), Some(&b"y"[..]));
    assert_eq!(std::fs::read_to_string(dirs[1].join("etc/second")).unwrap(), "two");
    assert_eq!(std::fs::read_to_string(dirs[2].join("etc/marker")).unwrap(), "one");
}

fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    let c_name = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 64];
    let n = unsafe { libc::lgetxattr(c_path.as_ptr(), c_name.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    (n >= 0).then(|| buf[..n as usize].to_vec())
}

/// A registry serving HTTPS with a certificate no system root vouches for: the pull is refused
/// with an error about its certificate, goes through once hosts.toml names the CA (read at
/// every pull, beside the system's roots the daemon read once), and with skip_verify.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_registry_is_trusted_through_the_ca_its_hosts_toml_names() {
    let registry = Registry::start();
    let work = tempfile::tempdir().unwrap();
    push_image(&registry, work.path(), "e2e-test-images/tls:1", "tls", &[]);
    registry.stop();
    let (cert, key) = common::self_signed_cert(work.path());
    registry.restart_over_tls(&cert, &key);
    let image = format!("{}/e2e-test-images/tls:1", registry.addr);

    let daemon = Daemon::start("");
    let hosts = daemon.dir().join("certs.d").join(&registry.addr);
    std::fs::create_dir_all(&hosts).unwrap();
    let server = format!("server = \"https://{}\"\n", registry.addr);
    std::fs::write(hosts.join("hosts.toml"), &server).unwrap();
    let err = pull(&daemon, &image).await.unwrap_err();
    assert!(
        err.message().contains("certificate"),
        "{:?}: {}",
        err.code(),
        err.message()
    );

    std::fs::write(hosts.join("hosts.toml"), format!("{server}ca = {cert:?}\n")).unwrap();
    pull(&daemon, &image).await.unwrap();
    remove(&daemon, &image).await.unwrap();

    std::fs::write(hosts.join("hosts.toml"), format!("{server}skip_verify = true\n")).unwrap();
    pull(&daemon, &image).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_with_basic_credentials() {
    let registry = Registry::start_with_htpasswd("alice:wonderland");
    let work = tempfile::tempdir().unwrap();
    let root = rootfs(work.path(), "r", "secret");
    let layout = work.path().join("layout");
    kit(&[
        "build",
        "--rootfs",
        root.to_str().unwrap(),
        "--out",
        layout.to_str().unwrap(),
    ]);
    let to = format!("{}/private/app:1", registry.addr);
    kit(&[
        "push",
        "--layout",
        layout.to_str().unwrap(),
        "--to",
        &to,
        "--plain-http",
        "--username",
        "alice",
        "--password",
        "wonderland",
    ]);
    let daemon = Daemon::start("");
    let pull_with = |auth: Option<api::AuthConfig>| {
        let daemon = &daemon;
        let to = to.clone();
        async move {
            daemon
                .images()
                .await
                .pull_image(api::PullImageRequest {
                    image: spec(&to),
                    auth,
                    sandbox_config: None,
                })
                .await
        }
    };
    let err = pull_with(None).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    let err = pull_with(Some(api::AuthConfig {
        username: "alice".into(),
        password: "wrong".into(),
        ..Default::default()
    }))
    .await
    .unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(err.message().contains("credentials"), "{}", err.message());
    pull_with(Some(api::AuthConfig {
        username: "alice".into(),
        password: "wonderland".into(),
        ..Default::default()
    }))
    .await
    .unwrap();
    assert!(status(&daemon, &to).await.is_some());
    // Without alice's credentials the next pull is refused again, now that registry clients are
    // kept between pulls. (scute's manifest requests carry each pull's own credentials, so this
    // holds whichever clients are shared; that only anonymous ones are is in registry.rs.)
    remove(&daemon, &to).await.unwrap();
    let err = pull_with(None).await.unwrap_err();
    assert_eq!(err.code(), Code::Unauthenticated, "{err:?}");
    assert!(status(&daemon, &to).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_mirror_falls_back_to_the_next_endpoint() {
    let registry = Registry::start();
    let work = tempfile::tempdir().unwrap();
    push_image(&registry, work.path(), "e2e-test-images/fallback:1", "fb", &[]);
    let daemon = Daemon::start("");
    let dir = daemon.dir().join("certs.d/registry.k8s.io");
    std::fs::create_dir_all(&dir).unwrap();
    let dead = common::free_port();
    std::fs::write(
        dir.join("hosts.toml"),
        format!(
            "server = \"http://{}\"\n[host.\"http://127.0.0.1:{dead}\"]\ncapabilities = [\"pull\", \"resolve\"]\n",
            registry.addr
        ),
    )
    .unwrap();
    pull(&daemon, "registry.k8s.io/e2e-test-images/fallback:1")
        .await
        .unwrap();

    // Nothing reachable: a clear, retryable error naming the endpoints tried.
    std::fs::write(
        dir.join("hosts.toml"),
        format!("server = \"http://127.0.0.1:{dead}\"\n"),
    )
    .unwrap();
    let err = pull(&daemon, "registry.k8s.io/e2e-test-images/other:1")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains(&format!("127.0.0.1:{dead}")),
        "{}",
        err.message()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_status_and_remove_semantics() {
    let registry = Registry::start();
    let work = tempfile::tempdir().unwrap();
    // One image under three tags, and two other images sharing nothing.
    let layout = push_image(
        &registry,
        work.path(),
        "k8s-staging-cri-tools/test-image-tags:1",
        "tags",
        &[],
    );
    push_layout(
        &registry,
        &layout,
        "k8s-staging-cri-tools/test-image-tags:1",
        &["2", "3"],
    );
    push_image(
        &registry,
        work.path(),
        "k8s-staging-cri-tools/test-image-1:latest",
        "one",
        &[],
    );
    push_image(
        &registry,
        work.path(),
        "k8s-staging-cri-tools/test-image-2:latest",
        "two",
        &[],
    );
    let daemon = Daemon::start("");
    daemon.mirror_public_registries_to(&registry.addr);
    let baseline = list(&daemon).await.len(); // the embedded pause image

    let mut ids = Vec::new();
    for tag in ["1", "2", "3"] {
        ids.push(
            pull(&daemon, &format!("gcr.io/k8s-staging-cri-tools/test-image-tags:{tag}"))
                .await
                .unwrap(),
        );
    }
    assert!(ids.iter().all(|i| i == &ids[0]), "one image under three tags: {ids:?}");
    let one = pull(&daemon, "gcr.io/k8s-staging-cri-tools/test-image-1")
        .await
        .unwrap();
    pull(&daemon, "gcr.io/k8s-staging-cri-tools/test-image-2")
        .await
        .unwrap();
    let images = list(&daemon).await;
    assert_eq!(images.len(), baseline + 3);
    let tagged = images.iter().find(|i| i.id == ids[0]).unwrap();
    assert_eq!(
        tagged.repo_tags,
        vec![
            "gcr.io/k8s-staging-cri-tools/test-image-tags:1",
            "gcr.io/k8s-staging-cri-tools/test-image-tags:2",
            "gcr.io/k8s-staging-cri-tools/test-image-tags:3",
        ]
    );
    // ListImages with a filter names one image.
    let filtered = daemon
        .images()
        .await
        .list_images(api::ListImagesRequest {
            filter: Some(api::ImageFilter {
                image: spec("gcr.io/k8s-staging-cri-tools/test-image-1"),
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .images;
    assert_eq!(
        filtered.iter().map(|i| i.id.clone()).collect::<Vec<_>>(),
        vec![one.clone()]
    );

    // Removing by one tag removes the image with all its tags, and frees its snapshots.
    let dirs = snapshot_dirs(&daemon, &ids[0]).await;
    assert!(dirs[0].exists());
    remove(&daemon, "gcr.io/k8s-staging-cri-tools/test-image-tags:2")
        .await
        .unwrap();
    for tag in ["1", "2", "3"] {
        assert!(
            status(&daemon, &format!("gcr.io/k8s-staging-cri-tools/test-image-tags:{tag}"))
                .await
                .is_none()
        );
    }
    assert!(!dirs[0].exists(), "snapshot of a removed image must be freed");
    assert_eq!(list(&daemon).await.len(), baseline + 2);
    // The others are untouched.
    let one_dirs = snapshot_dirs(&daemon, &one).await;
    assert!(one_dirs[0].join("etc/marker").exists());

    // Removing again, or something never pulled, succeeds (the kubelet retries).
    for name in [
        "gcr.io/k8s-staging-cri-tools/test-image-tags:2",
        "never/pulled:1",
        &ids[0],
    ] {
        remove(&daemon, name)
            .await
            .unwrap_or_else(|e| panic!("remove {name}: {e:?}"));
    }
    // Remove by ID works too.
    remove(&daemon, &one).await.unwrap();
    assert!(status(&daemon, &one).await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_and_snapshots_survive_restart() {
    let registry = Registry::start();
    let work = tempfile::tempdir().unwrap();
    push_image(&registry, work.path(), "e2e-test-images/keep:1", "keep", &[]);
    let mut daemon = Daemon::start("");
    daemon.mirror_public_registries_to(&registry.addr);
    let id = pull(&daemon, "registry.k8s.io/e2e-test-images/keep:1").await.unwrap();
    let before = status(&daemon, &id).await.unwrap();
    daemon.restart();
    let after = status(&daemon, "registry.k8s.io/e2e-test-images/keep:1").await.unwrap();
    assert_eq!(before, after);
    let dirs = snapshot_dirs(&daemon, &id).await;
    assert_eq!(std::fs::read_to_string(dirs[0].join("etc/marker")).unwrap(), "keep");
    // Pulling again after a restart downloads nothing new and keeps the same ID.
    registry.stop();
    daemon.kill();
    daemon.start_again();
    let again = status(&daemon, &id).await.unwrap();
    assert_eq!(again.id, id);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pulls_share_one_download() {
    let registry = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let big = work.path().join("big");
    kit(&[
        "gen-rootfs",
        "--out",
        big.to_str().unwrap(),
        "--files",
        "8",
        "--size",
        "16M",
    ]);
    let layout = work.path().join("layout");
    kit(&[
        "build",
        "--rootfs",
        big.to_str().unwrap(),
        "--out",
        layout.to_str().unwrap(),
    ]);
    push_layout(&registry, &layout, "e2e-test-images/shared:1", &[]);
    let daemon = Daemon::start_with_args("", &["--log-level", "scute=debug"]);
    daemon.mirror_public_registries_to(&registry.addr);
    let pulls = (0..4).map(|_| {
        let daemon = &daemon;
        async move { pull(daemon, "registry.k8s.io/e2e-test-images/shared:1").await }
    });
    let ids: Vec<String> = futures_util::future::join_all(pulls)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert!(ids.iter().all(|i| i == &ids[0]));
    let log = daemon.log();
    assert_eq!(
        log.matches("downloading layer").count(),
        1,
        "one download for four pulls:\n{log}"
    );
}

/// A pull cut by its caller's deadline, with layer blobs kept (`discard_unpacked_layers =
/// false`): the partial download stays in the ingest, and the next pull resumes it. With the
/// default (blobs dropped once unpacked) the download is never written: nothing stays, and the
/// next pull starts over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deadline_exceeded_leaves_a_resumable_download() {
    let registry = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let big = work.path().join("big");
    kit(&[
        "gen-rootfs",
        "--out",
        big.to_str().unwrap(),
        "--files",
        "16",
        "--size",
        "192M",
    ]);
    let layout = work.path().join("layout");
    kit(&[
        "build",
        "--rootfs",
        big.to_str().unwrap(),
        "--out",
        layout.to_str().unwrap(),
        "--compression",
        "none",
    ]);
    push_layout(&registry, &layout, "e2e-test-images/slow:1", &[]);
    let image = "registry.k8s.io/e2e-test-images/slow:1";

    // Pulls with shorter and longer deadlines until one is cut with bytes received; returns
    // the bytes the ingest holds after it (the directory as a whole: the file may be gone).
    async fn cut_by_a_deadline(daemon: &Daemon, image: &str) -> u64 {
        let ingest_dir = daemon.root.join("content/ingest");
        let partial = || -> u64 {
            std::fs::read_dir(&ingest_dir)
                .map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
                .unwrap_or(0)
        };
        for timeout_ms in [150u64, 300, 600, 1200, 2400] {
            let mut request = tonic::Request::new(api::PullImageRequest {
                image: spec(image),
                ..Default::default()
            });
            request.set_timeout(std::time::Duration::from_millis(timeout_ms));
            let result = daemon.images().await.pull_image(request).await;
            match result {
                Err(e) if e.code() == Code::DeadlineExceeded || e.code() == Code::Cancelled => {
                    // Give the server side a moment to notice and stop writing.
                    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
                    if partial() > 0 || bytes_not_kept(&daemon.log()) > 0 {
                        return partial();
                    }
                }
                Err(e) => panic!("unexpected error: {e:?}"),
                Ok(_) => break,
            }
        }
        panic!("no deadline cut a download that had begun; the machine is too fast for this test");
    }

    let keeping = Daemon::start_with_args(
        "[image]\ndiscard_unpacked_layers = false\n",
        &["--log-level", "scute=debug"],
    );
    keeping.mirror_public_registries_to(&registry.addr);
    let kept = cut_by_a_deadline(&keeping, image).await;
    assert!(kept > 0, "the cut download was not kept:\n{}", keeping.log());
    pull(&keeping, image).await.unwrap();
    assert!(keeping.log().contains("resuming layer download"), "{}", keeping.log());
    let ingest = keeping.root.join("content/ingest");
    let left: Vec<_> = std::fs::read_dir(&ingest)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(
        left.is_empty(),
        "the ingest file becomes a blob once verified (had {kept} bytes): {left:?}"
    );

    let dropping = Daemon::start_with_args("", &["--log-level", "scute=debug"]);
    dropping.mirror_public_registries_to(&registry.addr);
    assert_eq!(
        cut_by_a_deadline(&dropping, image).await,
        0,
        "a download whose blob is dropped once unpacked is not written"
    );
    assert!(bytes_not_kept(&dropping.log()) > 0, "{}", dropping.log());
    pull(&dropping, image).await.unwrap();
    assert!(
        !dropping.log().contains("resuming layer download"),
        "{}",
        dropping.log()
    );
}

/// The most bytes a cut download had received when the daemon's debug log said it kept none.
fn bytes_not_kept(log: &str) -> u64 {
    log.lines()
        .filter(|l| l.contains("download cut short, nothing kept"))
        .filter_map(|l| l.split("received=").nth(1))
        .filter_map(|v| v.split(|c: char| !c.is_ascii_digit()).next()?.parse().ok())
        .max()
        .unwrap_or(0)
}

/// What a power cut during a pull can leave of its partial download: bytes the disk never got
/// (zeros here). Resumed from, they do not unpack; kept, every retry would fail the same way. The
/// pull that finds it says so with a code the kubelet retries (Unavailable), drops the partial
/// download, and the next pull starts over and succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partial_download_a_power_cut_damaged_is_dropped_not_resumed_forever() {
    let registry = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let rootfs = work.path().join("rootfs");
    kit(&[
        "gen-rootfs",
        "--out",
        rootfs.to_str().unwrap(),
        "--files",
        "4",
        "--size",
        "2M",
    ]);
    let layout = work.path().join("layout");
    kit(&[
        "build",
        "--rootfs",
        rootfs.to_str().unwrap(),
        "--out",
        layout.to_str().unwrap(),
        "--compression",
        "gzip",
    ]);
    push_layout(&registry, &layout, "e2e-test-images/cut:1", &[]);
    let daemon = Daemon::start_with_args("", &["--log-level", "scute=debug"]);
    daemon.mirror_public_registries_to(&registry.addr);
    let image = "registry.k8s.io/e2e-test-images/cut:1";

    // The layer's digest, from the layout's manifest.
    let read_json = |digest: &str| -> serde_json::Value {
        let hex = digest.strip_prefix("sha256:").unwrap();
        serde_json::from_slice(&std::fs::read(layout.join("blobs/sha256").join(hex)).unwrap()).unwrap()
    };
    let index: serde_json::Value = serde_json::from_slice(&std::fs::read(layout.join("index.json")).unwrap()).unwrap();
    let manifest = read_json(index["manifests"][0]["digest"].as_str().unwrap());
    let layer = manifest["layers"][0]["digest"].as_str().unwrap().to_string();
    let ingest = daemon
        .root
        .join("content/ingest")
        .join(layer.strip_prefix("sha256:").unwrap());
    std::fs::create_dir_all(ingest.parent().unwrap()).unwrap();
    std::fs::write(&ingest, vec![0u8; 4096]).unwrap();

    let err = pull(&daemon, image).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err:?}");
    assert!(
        err.message().contains("partial download of 4096 bytes") && err.message().contains("starts over"),
        "{}",
        err.message()
    );
    assert!(!ingest.exists(), "the damaged partial download is dropped");
    pull(&daemon, image).await.unwrap();
}

/// Writes an OCI layout by hand whose only layer is `tar` (the kit refuses to build hostile ones).
fn hostile_layout(dir: &Path, tar: &[u8]) -> PathBuf {
    let layout = dir.join("hostile");
    let blobs = layout.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| -> (String, usize) {
        let hex = hex::encode(Sha256::digest(bytes));
        std::fs::write(blobs.join(&hex), bytes).unwrap();
        (format!("sha256:{hex}"), bytes.len())
    };
    let (layer, layer_size) = put(tar);
    let config = serde_json::json!({
        "architecture": "amd64", "os": "linux", "config": {},
        "rootfs": {"type": "layers", "diff_ids": [layer.clone()]},
    });
    let (config_digest, config_size) = put(&serde_json::to_vec(&config).unwrap());
    let manifest = serde_json::json!({
        "schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": config_digest, "size": config_size},
        "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar", "digest": layer, "size": layer_size}],
    });
    let (manifest_digest, manifest_size) = put(&serde_json::to_vec(&manifest).unwrap());
    std::fs::write(layout.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    std::fs::write(
        layout.join("index.json"),
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": manifest_digest, "size": manifest_size}],
        }))
        .unwrap(),
    )
    .unwrap();
    layout
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_layer_fails_the_pull_and_leaves_nothing() {
    let registry = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let mut tar = tar::Builder::new(Vec::new());
    let mut header = tar::Header::new_gnu();
    header.set_size(4);
    header.set_mode(0o644);
    header.set_entry_type(tar::EntryType::Regular);
    let name = b"../../../../../../tmp/scute-escaped";
    header.as_old_mut().name[..name.len()].copy_from_slice(name);
    header.set_cksum();
    tar.append(&header, &b"evil"[..]).unwrap();
    let layout = hostile_layout(work.path(), &tar.into_inner().unwrap());
    push_layout(&registry, &layout, "e2e-test-images/hostile:1", &[]);
    let daemon = Daemon::start("");
    daemon.mirror_public_registries_to(&registry.addr);
    let _ = std::fs::remove_file("/tmp/scute-escaped");
    let err = pull(&daemon, "registry.k8s.io/e2e-test-images/hostile:1")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains("unsafe"), "{}", err.message());
    assert!(!Path::new("/tmp/scute-escaped").exists());
    assert!(status(&daemon, "registry.k8s.io/e2e-test-images/hostile:1")
        .await
        .is_none());
    let tmp = std::fs::read_dir(daemon.root.join("snapshots/tmp")).unwrap().count();
    assert_eq!(tmp, 0, "the failed unpack must be removed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn embedded_pause_image_and_image_fs_info() {
    let registry = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let big = work.path().join("big");
    kit(&[
        "gen-rootfs",
        "--out",
        big.to_str().unwrap(),
        "--files",
        "4",
        "--size",
        "4M",
    ]);
    let layout = work.path().join("layout");
    kit(&[
        "build",
        "--rootfs",
        big.to_str().unwrap(),
        "--out",
        layout.to_str().unwrap(),
    ]);
    push_layout(&registry, &layout, "e2e-test-images/fs:1", &[]);
    let daemon = Daemon::start("");
    daemon.mirror_public_registries_to(&registry.addr);

    let pause = status(&daemon, "registry.k8s.io/pause:3.10")
        .await
        .expect("embedded pause image");
    assert!(pause.pinned);
    assert_eq!(pause.uid.unwrap().value, 65535);
    let dirs = snapshot_dirs(&daemon, &pause.id).await;
    let binary = std::fs::metadata(dirs[0].join("pause")).unwrap();
    assert_eq!(binary.mode() & 0o777, 0o755);

    let fs_info = || image_fs_info(&daemon);
    let before = fs_info().await;
    let usage = &before.image_filesystems[0];
    assert!(usage
        .fs_id
        .as_ref()
        .unwrap()
        .mountpoint
        .starts_with(daemon.root.to_str().unwrap()));
    let used = |i: &api::ImageFsInfoResponse| i.image_filesystems[0].used_bytes.as_ref().unwrap().value;
    let inodes = |i: &api::ImageFsInfoResponse| i.image_filesystems[0].inodes_used.as_ref().unwrap().value;
    assert!(used(&before) > 0 && inodes(&before) > 0);
    pull(&daemon, "registry.k8s.io/e2e-test-images/fs:1").await.unwrap();
    let after = fs_info().await;
    assert!(
        used(&after) >= used(&before) + (4 << 20),
        "{} -> {}",
        used(&before),
        used(&after)
    );
    assert!(inodes(&after) > inodes(&before));
    assert_eq!(after.container_filesystems.len(), 1);
    // Asked again with nothing changed: the same figures (the walk is reused).
    assert_eq!(used(&fs_info().await), used(&after));
    // Removed: its blobs and snapshot go, and the next answer says so at once.
    remove(&daemon, "registry.k8s.io/e2e-test-images/fs:1").await.unwrap();
    let removed = fs_info().await;
    assert!(
        used(&removed) + (4 << 20) <= used(&after),
        "{} -> {}",
        used(&after),
        used(&removed)
    );

    // The same ID at every start: the image is built deterministically.
    let mut daemon = daemon;
    daemon.restart();
    assert_eq!(
        status(&daemon, "registry.k8s.io/pause:3.10").await.unwrap().id,
        pause.id
    );
}

async fn image_fs_info(daemon: &Daemon) -> api::ImageFsInfoResponse {
    daemon
        .images()
        .await
        .image_fs_info(api::ImageFsInfoRequest {})
        .await
        .unwrap()
        .into_inner()
}

/// An ImageFsInfo whose last walk is over 10 s old with nothing put in or taken out since is
/// answered from that walk at once and walked again in the background: the bytes a pull in
/// progress wrote meanwhile (a partial download here) show in a later answer. (Before, the
/// caller waited for the walk: on a node with many images, a kubelet housekeeping call every
/// 10 s waited for a walk of every image's files.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_image_fs_walk_is_answered_and_redone_in_the_background() {
    let daemon = Daemon::start("");
    let used = || async {
        image_fs_info(&daemon).await.image_filesystems[0]
            .used_bytes
            .unwrap()
            .value
    };
    let before = used().await;
    // What a download in progress writes: bytes no change count knows of.
    let partial = daemon.root.join("content/ingest/an-image-fs-test-partial");
    std::fs::write(&partial, vec![7u8; 1 << 20]).unwrap();
    assert_eq!(used().await, before, "a fresh walk is reused");
    tokio::time::sleep(Duration::from_millis(10_500)).await;
    assert_eq!(used().await, before, "the old walk's figure, answered at once");
    let mut after = before;
    for _ in 0..100 {
        after = used().await;
        if after != before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    std::fs::remove_file(&partial).unwrap();
    assert!(
        after >= before + (1 << 20),
        "{before} -> {after}: the background walk never landed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_spares_pulls_in_flight() {
    let registry = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let big = work.path().join("big");
    kit(&[
        "gen-rootfs",
        "--out",
        big.to_str().unwrap(),
        "--files",
        "8",
        "--size",
        "64M",
    ]);
    let layout = work.path().join("layout");
    kit(&[
        "build",
        "--rootfs",
        big.to_str().unwrap(),
        "--out",
        layout.to_str().unwrap(),
    ]);
    push_layout(&registry, &layout, "e2e-test-images/big:1", &[]);
    push_image(&registry, work.path(), "e2e-test-images/small:1", "small", &[]);
    let daemon = Daemon::start("");
    daemon.mirror_public_registries_to(&registry.addr);

    // While the big image downloads, pull and remove another image over and over: each removal
    // garbage-collects, and must not take the big pull's blobs or snapshots with it.
    let big_pull = pull(&daemon, "registry.k8s.io/e2e-test-images/big:1");
    let churn = async {
        for _ in 0..5 {
            pull(&daemon, "registry.k8s.io/e2e-test-images/small:1").await.unwrap();
            remove(&daemon, "registry.k8s.io/e2e-test-images/small:1")
                .await
                .unwrap();
        }
    };
    let (id, ()) = tokio::join!(big_pull, churn);
    let id = id.unwrap();
    let dirs = snapshot_dirs(&daemon, &id).await;
    assert_eq!(
        std::fs::read_dir(&dirs[0]).unwrap().count(),
        8,
        "the big image's files are all there"
    );
    let config = daemon.root.join("content/blobs/sha256").join(&id[7..]);
    assert!(config.exists(), "the big image's config blob survived");
}

/// The digest of the one layer of an OCI layout's image.
fn layout_layer(layout: &Path) -> String {
    let read = |path: PathBuf| -> serde_json::Value { serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap() };
    let index = read(layout.join("index.json"));
    let manifest = index["manifests"][0]["digest"]
        .as_str()
        .unwrap()
        .strip_prefix("sha256:")
        .unwrap()
        .to_string();
    let manifest = read(layout.join("blobs/sha256").join(manifest));
    manifest["layers"][0]["digest"].as_str().unwrap().to_string()
}

/// `[image] discard_unpacked_layers` (on by default): a pulled layer's compressed blob is dropped
/// once its snapshot is unpacked, so the disk gets each layer once; the image's manifest and
/// config stay, the image runs from its snapshot, and pulls again after RemoveImage. A checkpoint
/// image keeps its layer (a restore reads it), and so does every image with the setting off.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_blobs_are_dropped_once_unpacked_unless_kept() {
    let registry = Registry::start();
    let work = tempfile::tempdir().unwrap();
    let plain = push_image(&registry, work.path(), "e2e-test-images/plain:1", "plain", &[]);
    let checkpoint = push_image(
        &registry,
        work.path(),
        "e2e-test-images/checkpoint:1",
        "checkpoint",
        &["--annotation", "checkpointctl.annotation.checkpoint.name=c"],
    );
    let blob = |daemon: &Daemon, digest: &str| {
        daemon
            .root
            .join("content/blobs/sha256")
            .join(digest.strip_prefix("sha256:").unwrap())
    };
    let (plain_layer, checkpoint_layer) = (layout_layer(&plain), layout_layer(&checkpoint));

    let daemon = Daemon::start("");
    daemon.mirror_public_registries_to(&registry.addr);
    for round in ["first", "after RemoveImage"] {
        let id = pull(&daemon, "registry.k8s.io/e2e-test-images/plain:1").await.unwrap();
        assert!(
            !blob(&daemon, &plain_layer).exists(),
            "{round} pull: the layer blob was kept"
        );
        assert!(blob(&daemon, &id).exists(), "{round} pull: the config blob is gone");
        let dirs = snapshot_dirs(&daemon, &id).await;
        assert_eq!(std::fs::read_to_string(dirs[0].join("etc/marker")).unwrap(), "plain");
        if round == "first" {
            remove(&daemon, "registry.k8s.io/e2e-test-images/plain:1")
                .await
                .unwrap();
            assert!(!dirs[0].exists(), "RemoveImage left the snapshot");
        }
    }
    pull(&daemon, "registry.k8s.io/e2e-test-images/checkpoint:1")
        .await
        .unwrap();
    assert!(
        blob(&daemon, &checkpoint_layer).exists(),
        "a checkpoint image's layer blob was dropped"
    );
    let ingests: Vec<_> = std::fs::read_dir(daemon.root.join("content/ingest"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    assert!(ingests.is_empty(), "downloads left behind: {ingests:?}");

    let keeping = Daemon::start("[image]\ndiscard_unpacked_layers = false\n");
    keeping.mirror_public_registries_to(&registry.addr);
    pull(&keeping, "registry.k8s.io/e2e-test-images/plain:1").await.unwrap();
    assert!(
        blob(&keeping, &plain_layer).exists(),
        "discard_unpacked_layers = false dropped the layer"
    );
}
