//! The container spec builder's unit tests.

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

#[test]
fn default_mounts_pod_files_and_order() {
    let f = fixture();
    let v = build(&f, &config()).unwrap();
    let destinations: Vec<&str> = v["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["destination"].as_str().unwrap())
        .filter(|d| !d.starts_with("/sys/fs/cgroup/"))
        .collect();
    assert_eq!(
        destinations,
        [
            "/proc",
            "/dev",
            "/dev/pts",
            "/dev/mqueue",
            "/sys",
            "/sys/fs/cgroup",
            "/etc/hostname",
            "/etc/hosts",
            "/etc/resolv.conf",
            "/dev/shm"
        ]
    );
    assert!(strings(&mount(&v, "/sys")[0]["options"]).contains(&"ro".to_string()));
    assert!(cgroup_options(&v).iter().all(|o| o.contains(&"ro".to_string())));
    let hosts = mount(&v, "/etc/hosts")[0];
    assert_eq!(hosts["source"], json!(f.sandbox_dir.join("hosts")));
    assert_eq!(strings(&hosts["options"]), ["rbind", "rprivate", "rw"]);
    let shm = mount(&v, "/dev/shm")[0];
    assert_eq!(shm["source"], json!(f.sandbox_dir.join("shm")));
    assert_eq!(
        strings(&shm["options"]),
        ["rbind", "rprivate", "rw", "nosuid", "noexec", "nodev"]
    );
    assert_eq!(v["root"], json!({"path": f.rootfs, "readonly": false}));

    // Host IPC: the host's /dev/shm. Missing pod files are not mounted.
    fs::remove_file(f.sandbox_dir.join("hostname")).unwrap();
    let host = Host {
        ipc: true,
        ..Default::default()
    };
    let v = build_with(&f, &config(), &sandbox(false), &ImageConfig::default(), host).unwrap();
    assert_eq!(
        mount(&v, "/dev/shm")[0]["source"],
        json!(fs::canonicalize("/dev/shm").unwrap())
    );
    assert!(mount(&v, "/etc/hostname").is_empty());
}

#[test]
fn kubelet_mounts() {
    let f = fixture();
    let mut c = config();
    let kubelet_hosts = f.root.join("kubelet/etc-hosts");
    fs::create_dir_all(kubelet_hosts.parent().unwrap()).unwrap();
    fs::write(&kubelet_hosts, "hosts").unwrap();
    let link = f.root.join("link-to-data");
    fs::create_dir(f.root.join("data")).unwrap();
    std::os::unix::fs::symlink(f.root.join("data"), &link).unwrap();
    c.mounts = vec![
        api::Mount {
            container_path: "/data/sub/".into(),
            host_path: f.root.join("missing/deep").to_str().unwrap().into(),
            readonly: true,
            ..Default::default()
        },
        api::Mount {
            container_path: "/data".into(),
            host_path: link.to_str().unwrap().into(),
            ..Default::default()
        },
        api::Mount {
            container_path: "/etc/hosts".into(),
            host_path: kubelet_hosts.to_str().unwrap().into(),
            ..Default::default()
        },
    ];
    let v = build(&f, &c).unwrap();
    // Created, as containerd does; the symlink is resolved.
    assert!(f.root.join("missing/deep").is_dir());
    let binds: Vec<(&str, &str)> = v["mounts"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["type"] == "bind" && !m["destination"].as_str().unwrap().starts_with("/sys/fs/cgroup/"))
        .map(|m| (m["destination"].as_str().unwrap(), m["source"].as_str().unwrap()))
        .collect();
    let data = f.root.join("data");
    let deep = f.root.join("missing/deep");
    let shm = f.sandbox_dir.join("shm");
    let hostname = f.sandbox_dir.join("hostname");
    let resolv = f.sandbox_dir.join("resolv.conf");
    assert_eq!(
        binds,
        [
            ("/data", data.to_str().unwrap()),
            ("/data/sub", deep.to_str().unwrap()),
            ("/etc/hosts", kubelet_hosts.to_str().unwrap()),
            ("/etc/hostname", hostname.to_str().unwrap()),
            ("/etc/resolv.conf", resolv.to_str().unwrap()),
            ("/dev/shm", shm.to_str().unwrap()),
        ]
    );
    assert_eq!(
        strings(&mount(&v, "/data/sub")[0]["options"]),
        ["rbind", "rprivate", "ro"]
    );
    assert_eq!(strings(&mount(&v, "/data")[0]["options"]), ["rbind", "rprivate", "rw"]);
    assert_eq!(v["linux"]["rootfsPropagation"], "private");

    // A kubelet /dev replaces every default under /dev.
    c.mounts = vec![api::Mount {
        container_path: "/dev".into(),
        host_path: f.root.join("fakedev").to_str().unwrap().into(),
        ..Default::default()
    }];
    let v = build(&f, &c).unwrap();
    for d in ["/dev/pts", "/dev/mqueue"] {
        assert!(mount(&v, d).is_empty(), "{d}");
    }
    assert_eq!(mount(&v, "/dev")[0]["type"], "bind");
    assert_eq!(
        mount(&v, "/dev/shm")[0]["type"],
        "bind",
        "the pod's shm still goes on top"
    );

    // Recursive read-only.
    c.mounts = vec![api::Mount {
        container_path: "/ro".into(),
        host_path: f.root.join("ro").to_str().unwrap().into(),
        readonly: true,
        recursive_read_only: true,
        ..Default::default()
    }];
    assert_eq!(
        strings(&mount(&build(&f, &c).unwrap(), "/ro")[0]["options"]),
        ["rbind", "rprivate", "rro"]
    );

    for bad in [
        api::Mount {
            container_path: "relative".into(),
            host_path: "/tmp".into(),
            ..Default::default()
        },
        api::Mount {
            container_path: "/x".into(),
            host_path: "relative".into(),
            ..Default::default()
        },
        api::Mount {
            container_path: "/x".into(),
            ..Default::default()
        },
        api::Mount {
            container_path: "/x".into(),
            host_path: "/tmp".into(),
            recursive_read_only: true,
            ..Default::default()
        },
        api::Mount {
            container_path: "/x".into(),
            host_path: "/tmp".into(),
            uid_mappings: vec![api::IdMapping {
                host_id: 1000,
                container_id: 0,
                length: 1,
            }],
            ..Default::default()
        },
    ] {
        c.mounts = vec![bad.clone()];
        assert!(matches!(build(&f, &c), Err(SpecError::Invalid(_))), "{bad:?}");
    }
}

#[test]
fn readonly_rootfs_makes_the_pod_files_readonly() {
    let f = fixture();
    let mut c = config();
    sc(&mut c).readonly_rootfs = true;
    let v = build(&f, &c).unwrap();
    assert_eq!(v["root"]["readonly"], true);
    for d in ["/etc/hostname", "/etc/hosts", "/etc/resolv.conf"] {
        assert_eq!(strings(&mount(&v, d)[0]["options"]).last().unwrap(), "ro", "{d}");
    }
    assert_eq!(strings(&mount(&v, "/dev/shm")[0]["options"])[2], "rw");
}

#[test]
fn propagation_needs_a_shared_or_slave_host_mount() {
    let info = mountinfo::parse(
        "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
         30 22 0:5 / /mnt/private rw - tmpfs tmpfs rw\n\
         31 22 0:6 / /mnt/slave rw master:7 - tmpfs tmpfs rw\n\
         32 22 0:7 / /mnt/with\\040space rw shared:9 master:2 - tmpfs tmpfs rw\n",
    );
    assert_eq!(info[3].mount_point, Path::new("/mnt/with space"));
    assert!(ensure_propagation(Path::new("/var/lib/x"), true, &info).is_ok());
    assert!(ensure_propagation(Path::new("/mnt/private/x"), false, &info).is_err());
    assert!(
        ensure_propagation(Path::new("/mnt/privatex"), true, &info).is_ok(),
        "component-wise prefix"
    );
    assert!(ensure_propagation(Path::new("/mnt/slave/a"), false, &info).is_ok());
    let e = ensure_propagation(Path::new("/mnt/slave/a"), true, &info).unwrap_err();
    assert!(e.to_string().contains("not a shared mount"), "{e}");
    assert!(ensure_propagation(Path::new("/mnt/with space/a"), true, &info).is_ok());
    assert_eq!(clean_absolute("/a//b/./c/../d/"), "/a/b/d");
    assert_eq!(clean_absolute("/"), "/");
}

#[test]
fn propagation_options_against_this_host() {
    let f = fixture();
    let mut c = config();
    let host = f.root.join("shared");
    c.mounts = vec![api::Mount {
        container_path: "/shared".into(),
        host_path: host.to_str().unwrap().into(),
        propagation: MountPropagation::PropagationBidirectional as i32,
        ..Default::default()
    }];
    let shared = ensure_propagation(&host, true, &mountinfo::read().unwrap()).is_ok();
    match build(&f, &c) {
        Ok(v) => {
            assert!(shared);
            assert_eq!(strings(&mount(&v, "/shared")[0]["options"]), ["rbind", "rshared", "rw"]);
            assert_eq!(v["linux"]["rootfsPropagation"], "shared");
        }
        Err(e) => assert!(!shared && matches!(e, SpecError::Host(_)), "{e}"),
    }
    c.mounts[0].propagation = MountPropagation::PropagationHostToContainer as i32;
    let slave = ensure_propagation(&host, false, &mountinfo::read().unwrap()).is_ok();
    match build(&f, &c) {
        Ok(v) => {
            assert!(slave);
            assert_eq!(strings(&mount(&v, "/shared")[0]["options"]), ["rbind", "rslave", "rw"]);
            assert_eq!(v["linux"]["rootfsPropagation"], "slave");
        }
        Err(e) => assert!(!slave && matches!(e, SpecError::Host(_)), "{e}"),
    }
}

fn namespaces(v: &Value) -> Vec<(String, Option<String>)> {
    v["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|n| n["type"] != "cgroup")
        .map(|n| {
            (
                n["type"].as_str().unwrap().to_string(),
                n["path"].as_str().map(String::from),
            )
        })
        .collect()
}

fn ns(t: &str, path: Option<&str>) -> (String, Option<String>) {
    (t.to_string(), path.map(String::from))
}

#[test]
fn namespaces_per_mode() {
    let f = fixture();
    let mut c = config();
    let v = build(&f, &c).unwrap();
    assert_eq!(
        namespaces(&v),
        [
            ns("mount", None),
            ns("network", Some("/proc/4242/ns/net")),
            ns("uts", Some("/proc/4242/ns/uts")),
            ns("ipc", Some("/proc/4242/ns/ipc")),
            ns("pid", Some("/proc/4242/ns/pid")),
        ]
    );
    let cgroupns = v["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n["type"] == "cgroup");
    assert_eq!(cgroupns, f.host.cgroup2);
    assert_eq!(v["hostname"], "web-0");

    let set_pid = |c: &mut api::ContainerConfig, mode: NamespaceMode| {
        sc(c)
            .namespace_options
            .get_or_insert_with(Default::default)
            .set_pid(mode);
    };
    set_pid(&mut c, NamespaceMode::Container);
    let host = Host {
        network: true,
        ipc: true,
        pid: false,
    };
    let v = build_with(&f, &c, &sandbox(false), &ImageConfig::default(), host).unwrap();
    assert_eq!(namespaces(&v), [ns("mount", None), ns("pid", None)]);
    assert!(
        v.get("hostname").is_none(),
        "host network keeps the host's UTS namespace"
    );
    assert!(strings(&v["process"]["env"]).contains(&"HOSTNAME=web-0".to_string()));

    set_pid(&mut c, NamespaceMode::Node);
    assert!(
        matches!(build(&f, &c), Err(SpecError::Invalid(_))),
        "host PID in a non-host-PID pod"
    );
    let host = Host {
        pid: true,
        ..Default::default()
    };
    let v = build_with(&f, &c, &sandbox(false), &ImageConfig::default(), host).unwrap();
    assert!(!namespaces(&v).iter().any(|(t, _)| t == "pid"));

    set_pid(&mut c, NamespaceMode::Pod);
    let v = build_with(&f, &c, &sandbox(false), &ImageConfig::default(), host).unwrap();
    assert!(
        !namespaces(&v).iter().any(|(t, _)| t == "pid"),
        "the pod's PID namespace is the host's"
    );

    set_pid(&mut c, NamespaceMode::Target);
    let e = build(&f, &c).unwrap_err();
    assert!(e.to_string().contains("TARGET"), "{e}");

    let mut c = config();
    sc(&mut c).namespace_options = Some(api::NamespaceOption {
        userns_options: Some(api::UserNamespace {
            mode: NamespaceMode::Pod as i32,
            ..Default::default()
        }),
        ..Default::default()
    });
    assert!(matches!(build(&f, &c), Err(SpecError::Invalid(_))));
}

/// In bit order (oci-spec keeps capability sets in hash sets).
fn caps(v: &Value, set: &str) -> Vec<String> {
    let mut c = strings(&v["process"]["capabilities"][set]);
    c.sort_by_key(|c| ALL_CAPABILITIES.iter().position(|a| a == c));
    c
}

fn supported() -> Vec<String> {
    ALL_CAPABILITIES[..=40].iter().map(|c| c.to_string()).collect()
}

#[test]
fn default_capabilities_and_add_drop() {
    let f = fixture();
    let mut c = config();
    let v = build(&f, &c).unwrap();
    let mut want: Vec<String> = DEFAULT_CAPABILITIES.iter().map(|c| c.to_string()).collect();
    want.sort_by_key(|c| ALL_CAPABILITIES.iter().position(|a| a == c));
    for set in ["bounding", "effective", "permitted"] {
        assert_eq!(caps(&v, set), want, "{set}");
    }
    assert!(caps(&v, "inheritable").is_empty());
    assert!(caps(&v, "ambient").is_empty());

    let mut set_caps = |add: &[&str], drop: &[&str]| {
        sc(&mut c).capabilities = Some(api::Capability {
            add_capabilities: add.iter().map(|s| s.to_string()).collect(),
            drop_capabilities: drop.iter().map(|s| s.to_string()).collect(),
            add_ambient_capabilities: vec![],
        });
        build(&f, &c)
    };
    let v = set_caps(&["NET_ADMIN", "cap_sys_time"], &["KILL", "MKNOD"]).unwrap();
    let b = caps(&v, "bounding");
    assert!(b.contains(&"CAP_NET_ADMIN".into()) && b.contains(&"CAP_SYS_TIME".into()));
    assert!(!b.contains(&"CAP_KILL".into()) && !b.contains(&"CAP_MKNOD".into()));
    assert_eq!(b.len(), DEFAULT_CAPABILITIES.len());

    let v = set_caps(&["ALL"], &["CHOWN"]).unwrap();
    let mut all_but_chown = supported();
    all_but_chown.retain(|c| c != "CAP_CHOWN");
    assert_eq!(caps(&v, "bounding"), all_but_chown);

    let v = set_caps(&["NET_BIND_SERVICE"], &["ALL"]).unwrap();
    assert_eq!(caps(&v, "effective"), ["CAP_NET_BIND_SERVICE"]);
    let v = set_caps(&["all"], &["all"]).unwrap();
    assert!(caps(&v, "permitted").is_empty());
    let v = set_caps(&["SYS_ADMIN"], &["SYS_ADMIN"]).unwrap();
    assert!(!caps(&v, "bounding").contains(&"CAP_SYS_ADMIN".into()), "drop wins");
    assert!(matches!(set_caps(&["NOT_A_CAP"], &[]), Err(SpecError::Invalid(_))));
    assert!(matches!(set_caps(&[], &["BOGUS"]), Err(SpecError::Invalid(_))));

    sc(&mut c).capabilities = Some(api::Capability {
        add_ambient_capabilities: vec!["NET_BIND_SERVICE".into()],
        drop_capabilities: vec!["ALL".into()],
        ..Default::default()
    });
    let v = build(&f, &c).unwrap();
    for set in ["bounding", "effective", "permitted", "inheritable", "ambient"] {
        assert_eq!(caps(&v, set), ["CAP_NET_BIND_SERVICE"], "{set}");
    }
}

#[test]
fn capabilities_are_limited_to_what_scute_holds() {
    // A runtime without CAP_SYS_RESOURCE (24) and CAP_NET_RAW (13), as in some sandboxes.
    let status = "Name:\tscute\nCapInh:\t0000000000000000\nCapEff:\t000001fffeffdfff\n";
    let held = held_from_status(status, 40);
    assert_eq!(held.len(), 39);
    assert!(!held.contains(&24) && !held.contains(&13) && held.contains(&40));
    assert_eq!(held_from_status("garbage", 3), BTreeSet::from([0, 1, 2, 3]));
    let with = |add: &[&str], drop: &[&str], privileged: bool| {
        let sc = api::LinuxContainerSecurityContext {
            capabilities: Some(api::Capability {
                add_capabilities: add.iter().map(|s| s.to_string()).collect(),
                drop_capabilities: drop.iter().map(|s| s.to_string()).collect(),
                add_ambient_capabilities: vec![],
            }),
            ..Default::default()
        };
        let host = HostFacts {
            held_caps: held.clone(),
            ..v2_host()
        };
        capabilities(&sc, privileged, &host)
    };
    let (set, _) = with(&[], &[], false).unwrap();
    assert_eq!(set.len(), DEFAULT_CAPABILITIES.len() - 1, "NET_RAW is left out");
    assert!(!set.contains(&13));
    let (set, _) = with(&["ALL"], &[], false).unwrap();
    assert_eq!(set, held.iter().copied().filter(|&c| c <= 40).collect());
    let (set, _) = with(&[], &[], true).unwrap();
    assert!(!set.contains(&24));
    let e = with(&["SYS_RESOURCE"], &[], false).unwrap_err();
    assert!(e.to_string().contains("CAP_SYS_RESOURCE"), "{e}");
    assert!(
        with(&["SYS_RESOURCE"], &["SYS_RESOURCE"], false).is_ok(),
        "dropped again"
    );
    assert!(
        with(&["SYS_RESOURCE"], &[], true).is_ok(),
        "privileged gets what there is"
    );
}

#[test]
fn cgroup_v1_hierarchies_are_bound_one_by_one() {
    // Combined cpu,cpuacct with its symlinks, name=systemd mounted from a sub-tree, a
    // hierarchy libcontainer does not manage, one outside /sys/fs/cgroup, and cgroup2.
    let (host_mounts, own, links) = (mountinfo::parse(V1_MOUNTINFO), V1_OWN_CGROUP, v1_links());
    let mounts = cgroup_v1_mounts("/kubepods/pod1/c1", "ro", &host_mounts, own, &links);
    assert_eq!(mounts[0]["type"], "tmpfs");
    assert_eq!(mounts[0]["destination"], "/sys/fs/cgroup");
    let binds: Vec<(&str, &str)> = mounts[1..]
        .iter()
        .map(|m| (m["destination"].as_str().unwrap(), m["source"].as_str().unwrap()))
        .collect();
    assert_eq!(
        binds,
        [
            (
                "/sys/fs/cgroup/cpu,cpuacct",
                "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/c1"
            ),
            ("/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/c1"),
            ("/sys/fs/cgroup/cpuacct", "/sys/fs/cgroup/cpu,cpuacct/kubepods/pod1/c1"),
            ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/memory/kubepods/pod1/c1"),
            ("/sys/fs/cgroup/pids", "/sys/fs/cgroup/pids/kubepods/pod1/c1"),
            (
                "/sys/fs/cgroup/systemd",
                "/sys/fs/cgroup/systemd/user-0.slice/session-1.scope"
            ),
            ("/sys/fs/cgroup/misc", "/sys/fs/cgroup/misc"),
        ]
    );
    for m in &mounts[1..] {
        assert_eq!(
            strings(&m["options"]),
            ["rbind", "rprivate", "nosuid", "noexec", "nodev", "ro"]
        );
    }
    // Valid mounts for oci-spec.
    let _: Vec<oci_spec::runtime::Mount> = serde_json::from_value(json!(mounts)).unwrap();
    let rw = cgroup_v1_mounts("/c", "rw", &host_mounts, own, &[]);
    assert!(strings(&rw[1]["options"]).contains(&"rw".to_string()));
    assert_eq!(cgroup_v1_mounts("/c", "ro", &[], "", &[]).len(), 1, "just the tmpfs");
}

#[test]
fn privileged_containers() {
    let f = fixture();
    let mut c = config();
    sc(&mut c).privileged = true;
    sc(&mut c).seccomp = Some(api::SecurityProfile {
        profile_type: ProfileType::RuntimeDefault as i32,
        localhost_ref: String::new(),
    });
    sc(&mut c).capabilities = Some(api::Capability {
        drop_capabilities: vec!["ALL".into()],
        ..Default::default()
    });
    let e = build(&f, &c).unwrap_err();
    assert!(e.to_string().contains("privileged"), "{e}");

    let v = build_with(&f, &c, &sandbox(true), &ImageConfig::default(), Host::default()).unwrap();
    assert_eq!(caps(&v, "bounding"), supported());
    assert_eq!(caps(&v, "effective"), supported());
    assert!(v["linux"]["maskedPaths"].as_array().unwrap().is_empty());
    assert!(v["linux"]["readonlyPaths"].as_array().unwrap().is_empty());
    assert!(v["linux"].get("seccomp").is_none());
    assert!(strings(&mount(&v, "/sys")[0]["options"]).contains(&"rw".into()));
    assert!(cgroup_options(&v).iter().all(|o| o.contains(&"rw".to_string())));
    assert_eq!(
        v["linux"]["resources"]["devices"],
        json!([{"allow": false, "access": "rwm"}, {"allow": true, "access": "rwm"}])
    );
    let devices = v["linux"]["devices"].as_array().unwrap();
    if Path::new("/dev/null").exists() {
        assert!(devices
            .iter()
            .any(|d| d["path"] == "/dev/null" && d["major"] == 1 && d["minor"] == 3));
    }
    assert!(!devices
        .iter()
        .any(|d| d["path"].as_str().unwrap().starts_with("/dev/pts/")));
    assert!(!v["linux"]["namespaces"]
        .as_array()
        .unwrap()
        .iter()
        .any(|n| n["type"] == "cgroup"));
}

#[test]
fn masked_and_readonly_paths() {
    let f = fixture();
    let mut c = config();
    let v = build(&f, &c).unwrap();
    assert_eq!(strings(&v["linux"]["maskedPaths"]), DEFAULT_MASKED_PATHS);
    assert_eq!(strings(&v["linux"]["readonlyPaths"]), DEFAULT_READONLY_PATHS);
    sc(&mut c).masked_paths = vec!["/proc/kcore".into()];
    sc(&mut c).readonly_paths = vec!["/proc/sys".into()];
    let v = build(&f, &c).unwrap();
    assert_eq!(strings(&v["linux"]["maskedPaths"]), ["/proc/kcore"]);
    assert_eq!(strings(&v["linux"]["readonlyPaths"]), ["/proc/sys"]);
}

#[test]
fn no_new_privileges_is_only_ever_true() {
    let f = fixture();
    let mut c = config();
    assert!(build(&f, &c).unwrap()["process"].get("noNewPrivileges").is_none());
    sc(&mut c).no_new_privs = true;
    assert_eq!(build(&f, &c).unwrap()["process"]["noNewPrivileges"], true);
}

#[test]
fn seccomp_profiles() {
    let f = fixture();
    let mut c = config();
    assert!(
        build(&f, &c).unwrap()["linux"].get("seccomp").is_none(),
        "unset: unconfined"
    );
    let mut set = |ty: ProfileType, r: &str| {
        sc(&mut c).seccomp = Some(api::SecurityProfile {
            profile_type: ty as i32,
            localhost_ref: r.into(),
        });
        build(&f, &c)
    };
    let v = set(ProfileType::RuntimeDefault, "").unwrap();
    assert_eq!(v["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ALLOW");
    assert!(strings(&v["linux"]["seccomp"]["syscalls"][0]["names"]).contains(&"mount".into()));
    assert!(set(ProfileType::Unconfined, "").unwrap()["linux"]
        .get("seccomp")
        .is_none());
    let profile = f.root.join("profile.json");
    fs::write(&profile, r#"{"defaultAction":"SCMP_ACT_LOG"}"#).unwrap();
    let v = set(ProfileType::Localhost, profile.to_str().unwrap()).unwrap();
    assert_eq!(v["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_LOG");
    assert!(matches!(
        set(ProfileType::Localhost, f.root.join("nope.json").to_str().unwrap()),
        Err(SpecError::Invalid(_))
    ));

    // With CAP_SYS_ADMIN the default profile lets mount through.
    let mut c = config();
    #[allow(deprecated)]
    {
        sc(&mut c).seccomp_profile_path = "runtime/default".into();
    }
    sc(&mut c).capabilities = Some(api::Capability {
        add_capabilities: vec!["SYS_ADMIN".into()],
        ..Default::default()
    });
    let v = build(&f, &c).unwrap();
    assert!(!strings(&v["linux"]["seccomp"]["syscalls"][0]["names"]).contains(&"mount".into()));
}

#[test]
fn resources_and_oom_score_adj() {
    let f = fixture();
    let mut c = config();
    assert_eq!(build(&f, &c).unwrap()["process"]["oomScoreAdj"], 0);
    let resources = c
        .linux
        .get_or_insert_with(Default::default)
        .resources
        .get_or_insert_with(Default::default);
    *resources = api::LinuxContainerResources {
        cpu_period: 100_000,
        cpu_quota: 50_000,
        cpu_shares: 512,
        memory_limit_in_bytes: 64 << 20,
        oom_score_adj: -999,
        cpuset_cpus: "0-1".into(),
        cpuset_mems: "0".into(),
        hugepage_limits: vec![api::HugepageLimit {
            page_size: "2MB".into(),
            limit: 4 << 20,
        }],
        unified: HashMap::from([("memory.high".to_string(), "50000000".to_string())]),
        memory_swap_limit_in_bytes: 0,
    };
    let v = build(&f, &c).unwrap();
    assert_eq!(v["process"]["oomScoreAdj"], -998, "clamped to the daemon's own");
    let r = &v["linux"]["resources"];
    assert_eq!(
        r["cpu"],
        json!({"shares": 512, "quota": 50000, "period": 100000, "cpus": "0-1", "mems": "0"})
    );
    assert_eq!(r["memory"]["limit"], 64 << 20);
    assert_eq!(r["memory"]["swap"], 64 << 20, "no swap beyond the limit by default");
    assert_eq!(r["hugepageLimits"], json!([{"pageSize": "2MB", "limit": 4 << 20}]));
    assert_eq!(r["unified"]["memory.high"], "50000000");
    assert_eq!(v["linux"]["cgroupsPath"], "/kubepods/pod1/c1");

    let resources = c.linux.as_mut().unwrap().resources.as_mut().unwrap();
    resources.oom_score_adj = 1500;
    assert_eq!(build(&f, &c).unwrap()["process"]["oomScoreAdj"], 1000);
    let resources = c.linux.as_mut().unwrap().resources.as_mut().unwrap();
    resources.oom_score_adj = 250;
    assert_eq!(build(&f, &c).unwrap()["process"]["oomScoreAdj"], 250);
    assert_eq!(oom_score_adj(None, 300), 300);
    assert_eq!(oom_score_adj(None, -2000), 0);
}

#[test]
fn devices() {
    let f = fixture();
    let mut c = config();
    let v = build(&f, &c).unwrap();
    assert!(v["linux"]["devices"].as_array().unwrap().is_empty());
    let rules = v["linux"]["resources"]["devices"].as_array().unwrap();
    assert_eq!(rules[0], json!({"allow": false, "access": "rwm"}));
    assert!(rules.contains(&json!({"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rwm"})));
    assert!(rules.contains(&json!({"allow": true, "type": "c", "major": 136, "access": "rwm"})));

    if Path::new("/dev/null").exists() {
        c.devices = vec![api::Device {
            container_path: "/dev/mynull".into(),
            host_path: "/dev/null".into(),
            permissions: "rw".into(),
        }];
        let v = build(&f, &c).unwrap();
        let d = &v["linux"]["devices"][0];
        assert_eq!(
            (d["path"].as_str(), d["type"].as_str()),
            (Some("/dev/mynull"), Some("c"))
        );
        assert_eq!((d["major"].as_u64(), d["minor"].as_u64()), (Some(1), Some(3)));
        assert_eq!(
            v["linux"]["resources"]["devices"].as_array().unwrap().last().unwrap(),
            &json!({"allow": true, "type": "c", "major": 1, "minor": 3, "access": "rw"})
        );
        c.devices[0].permissions = "rwx".into();
        assert!(matches!(build(&f, &c), Err(SpecError::Invalid(_))));
        c.devices[0].permissions = "rr".into();
        assert!(matches!(build(&f, &c), Err(SpecError::Invalid(_))));
    }
    let file = f.root.join("not-a-device");
    fs::write(&file, "").unwrap();
    for host in [file.to_str().unwrap(), "/nonexistent/dev", "dev/null"] {
        c.devices = vec![api::Device {
            container_path: "/dev/x".into(),
            host_path: host.into(),
            permissions: String::new(),
        }];
        assert!(matches!(build(&f, &c), Err(SpecError::Invalid(_))), "{host}");
    }
    c.devices.clear();
    c.cdi_devices = vec![api::CdiDevice {
        name: "vendor.com/gpu=0".into(),
    }];
    assert!(matches!(build(&f, &c), Err(SpecError::Invalid(_))));
    c.cdi_devices.clear();
    c.devices = vec![api::Device {
        container_path: "/dev/x".into(),
        host_path: String::new(),
        permissions: String::new(),
    }];
    // A directory of devices: none in an empty directory.
    c.devices[0].host_path = f.root.join("sandboxes").to_str().unwrap().into();
    assert!(build(&f, &c).unwrap()["linux"]["devices"]
        .as_array()
        .unwrap()
        .is_empty());
}

#[test]
fn annotations() {
    let f = fixture();
    let mut c = config();
    c.annotations = HashMap::from([
        ("a".to_string(), "b".to_string()),
        (ANNOTATION_CONTAINER_TYPE.to_string(), "sandbox".to_string()),
    ]);
    let v = build(&f, &c).unwrap();
    let a = &v["annotations"];
    assert_eq!(a["a"], "b");
    assert_eq!(a[ANNOTATION_CONTAINER_TYPE], "container");
    assert_eq!(a[ANNOTATION_SANDBOX_ID], "sb123");
    assert_eq!(a[ANNOTATION_CONTAINER_NAME], "app");
    assert_eq!(a[ANNOTATION_IMAGE_NAME], "docker.io/library/busybox:latest");
    assert_eq!(a[ANNOTATION_SANDBOX_NAME], "web-0");
    assert_eq!(a[ANNOTATION_SANDBOX_NAMESPACE], "default");
    assert_eq!(a[ANNOTATION_SANDBOX_UID], "uid-1");
    assert!(v["process"].get("rlimits").is_none());
}

#[test]
fn apparmor_and_selinux_are_warnings() {
    let mut c = config();
    assert!(security_warnings(&c).is_empty());
    sc(&mut c).apparmor = Some(api::SecurityProfile {
        profile_type: ProfileType::Unconfined as i32,
        localhost_ref: String::new(),
    });
    assert!(security_warnings(&c).is_empty());
    sc(&mut c).apparmor = Some(api::SecurityProfile {
        profile_type: ProfileType::Localhost as i32,
        localhost_ref: "k8s-apparmor".into(),
    });
    sc(&mut c).selinux_options = Some(api::SeLinuxOption {
        level: "s0:c1,c2".into(),
        ..Default::default()
    });
    let w = security_warnings(&c);
    assert_eq!(w.len(), 2);
    assert!(
        w[0].contains("localhost/k8s-apparmor") && w[1].contains("s0:c1,c2"),
        "{w:?}"
    );
    // Accepted: the spec builds and carries neither.
    let f = fixture();
    let v = build(&f, &c).unwrap();
    assert!(v["process"].get("apparmorProfile").is_none());
    assert!(v["process"].get("selinuxLabel").is_none());
}

#[test]
fn cgroup_v1_and_v2_hosts() {
    let mut f = fixture();
    let mut c = config();
    c.linux.get_or_insert_with(Default::default).resources = Some(api::LinuxContainerResources {
        memory_limit_in_bytes: 64 << 20,
        hugepage_limits: vec![api::HugepageLimit {
            page_size: "2MB".into(),
            limit: 4 << 20,
        }],
        ..Default::default()
    });
    let cgroupns = |v: &Value| {
        v["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n["type"] == "cgroup")
    };

    // v2: one cgroup2 mount (libcontainer mounts it in the container's cgroup namespace), a
    // cgroup namespace, swap limited to the memory limit, hugepages.
    let v = build(&f, &c).unwrap();
    let cg = mount(&v, "/sys/fs/cgroup");
    assert_eq!(cg.len(), 1);
    assert_eq!(cg[0]["type"], "cgroup");
    assert!(strings(&cg[0]["options"]).contains(&"ro".to_string()));
    assert!(cgroupns(&v));
    let r = &v["linux"]["resources"];
    assert_eq!(r["memory"], json!({"limit": 64 << 20, "swap": 64 << 20}));
    assert_eq!(r["hugepageLimits"][0]["pageSize"], "2MB");
    let mut p = c.clone();
    sc(&mut p).privileged = true;
    let privileged = build_with(&f, &p, &sandbox(true), &ImageConfig::default(), Host::default()).unwrap();
    assert!(
        !cgroupns(&privileged),
        "a privileged container sees the host's cgroup tree"
    );

    // v1: a tmpfs and a read-only bind per hierarchy (the container's own cgroup in each), no
    // cgroup namespace, no swap or hugepage limits the host could not apply.
    f.host = v1_host();
    let v = build(&f, &c).unwrap();
    assert_eq!(mount(&v, "/sys/fs/cgroup")[0]["type"], "tmpfs");
    let memory = mount(&v, "/sys/fs/cgroup/memory");
    assert_eq!(memory[0]["source"], "/sys/fs/cgroup/memory/kubepods/pod1/c1");
    assert!(cgroup_options(&v).iter().all(|o| o.contains(&"ro".to_string())));
    assert!(!cgroupns(&v));
    let r = &v["linux"]["resources"];
    assert_eq!(r["memory"], json!({"limit": 64 << 20}));
    assert!(r.get("hugepageLimits").is_none());
    let mut p = c.clone();
    sc(&mut p).privileged = true;
    let privileged = build_with(&f, &p, &sandbox(true), &ImageConfig::default(), Host::default()).unwrap();
    assert!(cgroup_options(&privileged)
        .iter()
        .all(|o| o.contains(&"rw".to_string())));

    // UpdateContainerResources applies the same conversion.
    let update = super::update_resources(c.linux.as_ref().unwrap().resources.as_ref().unwrap(), &v2_host()).unwrap();
    assert_eq!(update.memory().unwrap().swap(), Some(64 << 20));
    let update = super::update_resources(c.linux.as_ref().unwrap().resources.as_ref().unwrap(), &v1_host()).unwrap();
    assert_eq!(update.memory().unwrap().swap(), None);
    assert!(update.hugepage_limits().is_none());
}

#[test]
fn host_facts_of_this_host() {
    // Whatever this host is, its facts agree with its /sys/fs/cgroup.
    let h = HostFacts::gather();
    assert_eq!(h.cgroup2, Path::new("/sys/fs/cgroup/cgroup.controllers").exists());
    assert_eq!(h.v1.mounts.is_empty(), h.cgroup2);
    assert!(h.last_cap >= 36 && h.last_cap < ALL_CAPABILITIES.len());
    assert!(h.held_caps.iter().all(|c| *c <= h.last_cap));
}
