//! Mounts: defaults, the pod's files, the kubelet's mounts and their propagation, the
//! container's /sys/fs/cgroup on a v1 host.

use super::*;

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

    // Nothing is mounted into procfs but lxcfs's files, however the path is spelt.
    for target in [
        "/proc",
        "/proc/sys/kernel/core_pattern",
        "/proc/self/attr/current",
        "//proc/../proc/sys/",
    ] {
        c.mounts = vec![api::Mount {
            container_path: target.into(),
            host_path: f.root.join("ro").to_str().unwrap().into(),
            ..Default::default()
        }];
        match build(&f, &c) {
            Err(SpecError::Invalid(m)) => assert!(m.contains("is in /proc"), "{m}"),
            other => panic!("{target}: {other:?}"),
        }
    }
    // A path that only starts like it is fine, and so are lxcfs's files.
    for target in ["/procedures", "/proc/meminfo", "/proc/cpuinfo", "/proc//uptime"] {
        c.mounts = vec![api::Mount {
            container_path: target.into(),
            host_path: f.root.join("ro").to_str().unwrap().into(),
            ..Default::default()
        }];
        assert!(build(&f, &c).is_ok(), "{target}");
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

#[test]
fn cgroup_v1_hierarchies_are_bound_one_by_one() {
    // Combined cpu,cpuacct with its symlinks, name=systemd mounted from a sub-tree, a
    // hierarchy libcontainer does not manage, one outside /sys/fs/cgroup, and cgroup2.
    let (host_mounts, own, links) = (mountinfo::parse(V1_MOUNTINFO), V1_OWN_CGROUP, v1_links());
    let v1_mounts = |path: &str, mode: &str, host_mounts: &[mountinfo::Mount], links: &[(String, String)]| {
        serde_json::to_value(cgroup_v1_mounts(path, mode, host_mounts, own, links).unwrap()).unwrap()
    };
    let mounts = v1_mounts("/kubepods/pod1/c1", "ro", &host_mounts, &links);
    let mounts = mounts.as_array().unwrap();
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
    let rw = v1_mounts("/c", "rw", &host_mounts, &[]);
    assert!(strings(&rw[1]["options"]).contains(&"rw".to_string()));
    assert_eq!(
        cgroup_v1_mounts("/c", "ro", &[], "", &[]).unwrap().len(),
        1,
        "just the tmpfs"
    );
}
