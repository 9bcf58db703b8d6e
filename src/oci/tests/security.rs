//! Namespaces, capabilities, privileged containers, masked paths, no_new_privs, seccomp.

use super::*;

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
