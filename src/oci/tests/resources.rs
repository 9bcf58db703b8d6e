//! Resources, devices, annotations, warnings and the host facts of v1 and v2 hosts.

use super::*;

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
    let update =
        crate::oci::update_resources(c.linux.as_ref().unwrap().resources.as_ref().unwrap(), &v2_host()).unwrap();
    assert_eq!(update.memory().unwrap().swap(), Some(64 << 20));
    let update =
        crate::oci::update_resources(c.linux.as_ref().unwrap().resources.as_ref().unwrap(), &v1_host()).unwrap();
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
