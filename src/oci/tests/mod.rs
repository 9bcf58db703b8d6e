//! The container spec builder's unit tests: fixtures and the pinned v1/v2 hosts here, with the
//! process tests (command, env, user); mounts, security and resources in their own files.

mod mounts;
mod resources;
mod security;

use std::collections::{BTreeSet, HashMap};
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{json, Value};

use super::capabilities::{capabilities, held_from_status, ALL_CAPABILITIES, DEFAULT_CAPABILITIES};
use super::container::{
    container_spec, oom_score_adj, process_args, security_warnings, ANNOTATION_CONTAINER_NAME,
    ANNOTATION_CONTAINER_TYPE, ANNOTATION_IMAGE_NAME, ANNOTATION_SANDBOX_ID, ANNOTATION_SANDBOX_NAME,
    ANNOTATION_SANDBOX_NAMESPACE, ANNOTATION_SANDBOX_UID,
};
use scute_sys::mountinfo;

use super::mounts::{cgroup_v1_mounts, ensure_propagation};
use super::{
    clean_absolute, ContainerSpec, HostFacts, SpecError, V1Cgroups, DEFAULT_MASKED_PATHS, DEFAULT_PATH_ENV,
    DEFAULT_READONLY_PATHS,
};
use crate::api;
use crate::api::{MountPropagation, NamespaceMode};
use crate::image::record::ImageConfig;
use api::security_profile::ProfileType;

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    rootfs: PathBuf,
    sandbox_dir: PathBuf,
    /// The host the spec is built for: a pinned cgroup v2 node unless a test says otherwise.
    host: HostFacts,
}

/// A cgroup v1 (hybrid) host's hierarchies: combined cpu,cpuacct with its symlinks, name=systemd
/// mounted from a sub-tree, a hierarchy libcontainer does not manage, one outside
/// /sys/fs/cgroup, and cgroup2 beside them.
const V1_MOUNTINFO: &str = "\
31 27 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,memory
36 31 0:33 /docker/abc /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,pids
40 31 0:37 /user.slice /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/misc rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,misc
42 31 0:39 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw
43 27 0:40 / /mnt/other rw - cgroup cgroup rw,pids
";
const V1_OWN_CGROUP: &str = "12:misc:/\n9:name=systemd:/user.slice/user-0.slice/session-1.scope\n4:memory:/daemon\n1:cpu,cpuacct:/daemon\n0::/daemon\n";

fn v1_links() -> Vec<(String, String)> {
    [
        ("cpu", "cpu,cpuacct"),
        ("cpuacct", "cpu,cpuacct"),
        ("net_cls", "net_cls,net_prio"),
    ]
    .iter()
    .map(|(a, b)| (a.to_string(), b.to_string()))
    .collect()
}

/// A pure cgroup v2 node with swap and hugetlb, scute holding every capability of a kernel whose
/// last is 40 (unit tests need not run as root).
fn v2_host() -> HostFacts {
    HostFacts {
        cgroup2: true,
        swap: true,
        hugetlb: true,
        last_cap: 40,
        held_caps: (0..=40).collect(),
        v1: V1Cgroups::default(),
    }
}

/// A cgroup v1 hybrid host without swap accounting or hugetlb.
fn v1_host() -> HostFacts {
    HostFacts {
        cgroup2: false,
        swap: false,
        hugetlb: false,
        v1: V1Cgroups {
            mounts: mountinfo::parse(V1_MOUNTINFO),
            own_cgroup: V1_OWN_CGROUP.into(),
            links: v1_links(),
        },
        ..v2_host()
    }
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = fs::canonicalize(dir.path()).unwrap();
    let rootfs = root.join("containers/c1/rootfs");
    fs::create_dir_all(rootfs.join("etc")).unwrap();
    fs::write(
        rootfs.join("etc/passwd"),
        "root:x:0:0::/root:/bin/sh\nalice:x:1000:1001::/home/alice:/bin/sh\n",
    )
    .unwrap();
    fs::write(rootfs.join("etc/group"), "root:x:0:\nalice:x:1001:\nstaff:x:50:alice\n").unwrap();
    let sandbox_dir = root.join("sandboxes/sb123");
    fs::create_dir_all(sandbox_dir.join("shm")).unwrap();
    for f in ["hostname", "hosts", "resolv.conf"] {
        fs::write(sandbox_dir.join(f), f).unwrap();
    }
    Fixture {
        _dir: dir,
        root,
        rootfs,
        sandbox_dir,
        host: v2_host(),
    }
}

fn config() -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: "app".into(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: "docker.io/library/busybox:latest".into(),
            ..Default::default()
        }),
        command: vec!["/bin/sh".into()],
        ..Default::default()
    }
}

fn sandbox(privileged: bool) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: "web-0".into(),
            uid: "uid-1".into(),
            namespace: "default".into(),
            attempt: 0,
        }),
        hostname: "web-0".into(),
        linux: Some(api::LinuxPodSandboxConfig {
            security_context: Some(api::LinuxSandboxSecurityContext {
                privileged,
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn sc(config: &mut api::ContainerConfig) -> &mut api::LinuxContainerSecurityContext {
    config
        .linux
        .get_or_insert_with(Default::default)
        .security_context
        .get_or_insert_with(Default::default)
}

#[derive(Clone, Copy, Default)]
struct Host {
    network: bool,
    ipc: bool,
    pid: bool,
}

fn build_with(
    f: &Fixture,
    config: &api::ContainerConfig,
    sandbox: &api::PodSandboxConfig,
    image: &ImageConfig,
    host: Host,
) -> Result<Value, SpecError> {
    let s = ContainerSpec {
        id: "c1",
        config,
        sandbox,
        image,
        rootfs: f.rootfs.clone(),
        pause_pid: 4242,
        sandbox_dir: f.sandbox_dir.clone(),
        host_network: host.network,
        host_ipc: host.ipc,
        host_pid: host.pid,
        userns: None,
        cgroups_path: "/kubepods/pod1/c1".into(),
        oom_score_adj_floor: -998,
        host: &f.host,
    };
    container_spec(&s).map(|spec| serde_json::to_value(spec).unwrap())
}

fn build(f: &Fixture, config: &api::ContainerConfig) -> Result<Value, SpecError> {
    build_with(f, config, &sandbox(false), &ImageConfig::default(), Host::default())
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|a| a.iter().map(|s| s.as_str().unwrap().to_string()).collect())
        .unwrap_or_default()
}

/// The options of the container's cgroup mounts (the `cgroup` mount on v2, the binds of the
/// hierarchies on v1).
fn cgroup_options(v: &Value) -> Vec<Vec<String>> {
    let out: Vec<Vec<String>> = v["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["destination"].as_str().unwrap().starts_with("/sys/fs/cgroup") && m["type"] != "tmpfs")
        .map(|m| strings(&m["options"]))
        .collect();
    assert!(!out.is_empty());
    out
}

fn mount<'v>(v: &'v Value, destination: &str) -> Vec<&'v Value> {
    v["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["destination"] == destination)
        .collect()
}

#[test]
fn command_and_args_follow_the_kubelet() {
    let image = ImageConfig {
        entrypoint: vec!["/ep".into()],
        cmd: vec!["c1".into(), "c2".into()],
        ..Default::default()
    };
    let v = |x: &[&str]| x.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    let table: &[(&[&str], &[&str], &[&str])] = &[
        (&[], &[], &["/ep", "c1", "c2"]),
        (&["/x"], &[], &["/x"]),
        (&[], &["a"], &["/ep", "a"]),
        (&["/x"], &["a", "b"], &["/x", "a", "b"]),
    ];
    for (command, args, want) in table {
        assert_eq!(
            process_args(&v(command), &v(args), &image).unwrap(),
            v(want),
            "{command:?} {args:?}"
        );
    }
    let reset = ImageConfig {
        entrypoint: vec!["".into()],
        cmd: vec!["sh".into()],
        ..Default::default()
    };
    assert_eq!(process_args(&[], &[], &reset).unwrap(), v(&["sh"]));
    let empty = ImageConfig::default();
    assert_eq!(
        process_args(&[], &v(&["/bin/true"]), &empty).unwrap(),
        v(&["/bin/true"])
    );
    let e = process_args(&[], &[], &empty).unwrap_err();
    assert_eq!(e.to_string(), "no command specified");

    let f = fixture();
    let mut c = config();
    c.command.clear();
    assert!(matches!(build(&f, &c), Err(SpecError::Invalid(_))));
    c.args = vec!["/bin/true".into()];
    assert_eq!(build(&f, &c).unwrap()["process"]["args"], json!(["/bin/true"]));
}

#[test]
fn env_image_then_config_and_cwd() {
    let f = fixture();
    let mut c = config();
    c.envs = vec![
        api::KeyValue {
            key: "A".into(),
            value: b"override".to_vec(),
        },
        api::KeyValue {
            key: "C".into(),
            value: b"3".to_vec(),
        },
    ];
    let image = ImageConfig {
        env: vec!["PATH=/img/bin".into(), "A=1".into(), "B=2".into()],
        working_dir: "/srv".into(),
        ..Default::default()
    };
    let v = build_with(&f, &c, &sandbox(false), &image, Host::default()).unwrap();
    assert_eq!(
        strings(&v["process"]["env"]),
        ["PATH=/img/bin", "HOSTNAME=web-0", "A=override", "B=2", "C=3"]
    );
    assert_eq!(v["process"]["cwd"], "/srv");
    assert_eq!(v["process"]["terminal"], false);

    let v = build(&f, &c).unwrap();
    assert_eq!(strings(&v["process"]["env"])[0], DEFAULT_PATH_ENV);
    assert_eq!(v["process"]["cwd"], "/");

    c.working_dir = "/work".into();
    c.tty = true;
    let v = build_with(&f, &c, &sandbox(false), &image, Host::default()).unwrap();
    assert_eq!(v["process"]["cwd"], "/work");
    assert_eq!(v["process"]["terminal"], true);
    c.working_dir = "relative".into();
    assert!(matches!(build(&f, &c), Err(SpecError::Invalid(_))));
}

#[test]
fn user_from_the_image_and_the_security_context() {
    let f = fixture();
    let mut c = config();
    let image = ImageConfig {
        user: "alice".into(),
        ..Default::default()
    };
    let v = build_with(&f, &c, &sandbox(false), &image, Host::default()).unwrap();
    assert_eq!(
        v["process"]["user"],
        json!({"uid": 1000, "gid": 1001, "additionalGids": [50, 1001]})
    );

    sc(&mut c).run_as_user = Some(api::Int64Value { value: 0 });
    sc(&mut c).supplemental_groups = vec![7];
    let v = build_with(&f, &c, &sandbox(false), &image, Host::default()).unwrap();
    assert_eq!(
        v["process"]["user"],
        json!({"uid": 0, "gid": 0, "additionalGids": [0, 7]})
    );

    let unknown = ImageConfig {
        user: "mallory".into(),
        ..Default::default()
    };
    let e = build_with(&f, &config(), &sandbox(false), &unknown, Host::default()).unwrap_err();
    assert!(
        matches!(e, SpecError::Invalid(_)) && e.to_string().contains("mallory"),
        "{e}"
    );
}
