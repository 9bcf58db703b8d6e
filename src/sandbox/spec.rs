//! The pause container's spec: namespaces per the pod's NamespaceOption, the pinned network
//! namespace joined by path, the pod's /dev/shm, sysctls, the cgroup under the kubelet's parent.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::PathBuf;

use oci_spec::runtime::{
    LinuxBuilder, LinuxNamespaceType, LinuxResourcesBuilder, ProcessBuilder, RootBuilder, Spec, SpecBuilder,
    UserBuilder,
};

use crate::image::record::ImageConfig;
use crate::oci::userns::PodUserNs;
use crate::oci::{
    capability_sets, clear_example_defaults, default_mounts, device_rule, id_mapping, mount, namespace, numeric_user,
    user, SpecError, DEFAULT_MASKED_PATHS, DEFAULT_PATH_ENV, DEFAULT_READONLY_PATHS, OCI_VERSION,
};

/// What the pause container's spec is made from.
pub struct SandboxSpec<'a> {
    pub hostname: &'a str,
    pub rootfs: PathBuf,
    /// The pinned network namespace to join; None for a host-network pod.
    pub netns: Option<PathBuf>,
    /// The pod's own user namespace, made by pause with these mappings. pause then makes the
    /// network namespace too (one the user namespace owns, so sysfs can be mounted in it); the
    /// daemon pins it once pause runs.
    pub userns: Option<PodUserNs>,
    pub host_pid: bool,
    pub host_ipc: bool,
    /// Source of the pod's /dev/shm (a tmpfs the daemon mounted, or the host's /dev/shm).
    pub shm: PathBuf,
    pub cgroups_path: String,
    pub sysctls: &'a BTreeMap<String, String>,
    pub image: &'a ImageConfig,
    pub run_as_user: Option<i64>,
    pub run_as_group: Option<i64>,
    pub oom_score_adj: i32,
    pub annotations: BTreeMap<String, String>,
}

pub fn pause_spec(s: &SandboxSpec<'_>) -> Result<Spec, SpecError> {
    let mut args: Vec<String> = s.image.entrypoint.iter().chain(&s.image.cmd).cloned().collect();
    if args.is_empty() {
        args = vec!["/pause".to_string()];
    }
    let (image_uid, image_gid) = numeric_user(&s.image.user)?;
    let uid = match s.run_as_user {
        Some(u) => user::id32(u, "the pod's run_as_user")?,
        None => image_uid,
    };
    let gid = match s.run_as_group {
        Some(g) => user::id32(g, "the pod's run_as_group")?,
        None if s.run_as_user.is_some() => 0,
        None => image_gid,
    };
    let what = format!("the sandbox process (uid {uid}, gid {gid})");
    user::check_id(uid, user::Kind::Uid, &what, s.userns.as_ref())?;
    user::check_id(gid, user::Kind::Gid, &what, s.userns.as_ref())?;
    let mut env = s.image.env.clone();
    if !env.iter().any(|e| e.starts_with("PATH=")) {
        env.push(DEFAULT_PATH_ENV.into());
    }

    let mut namespaces = vec![namespace(LinuxNamespaceType::Mount, None)?];
    if !s.host_pid {
        namespaces.push(namespace(LinuxNamespaceType::Pid, None)?);
    }
    if !s.host_ipc {
        namespaces.push(namespace(LinuxNamespaceType::Ipc, None)?);
    }
    // A host-network pod keeps the host's network and hostname (as the kubelet expects).
    if let Some(path) = &s.netns {
        // In its own user namespace pause makes the network namespace (the daemon pins it).
        let join = s.userns.is_none().then(|| path.clone());
        namespaces.push(namespace(LinuxNamespaceType::Network, join)?);
        namespaces.push(namespace(LinuxNamespaceType::Uts, None)?);
    }
    let mut linux = LinuxBuilder::default()
        .cgroups_path(&s.cgroups_path)
        .sysctl(s.sysctls.clone().into_iter().collect::<HashMap<_, _>>())
        .masked_paths(DEFAULT_MASKED_PATHS.iter().map(|p| p.to_string()).collect::<Vec<_>>())
        .readonly_paths(DEFAULT_READONLY_PATHS.iter().map(|p| p.to_string()).collect::<Vec<_>>())
        .resources(
            LinuxResourcesBuilder::default()
                .devices(vec![device_rule(false, None, None, None, "rwm")?])
                .build()?,
        );
    if let Some(userns) = &s.userns {
        namespaces.push(namespace(LinuxNamespaceType::User, None)?);
        linux = linux
            .uid_mappings(vec![id_mapping(&userns.uids)?])
            .gid_mappings(vec![id_mapping(&userns.gids)?]);
    }
    let linux = linux.namespaces(namespaces).build()?;

    let mut mounts = default_mounts("ro")?;
    mounts.push(mount(
        "/dev/shm",
        "bind",
        &s.shm,
        &["rbind", "nosuid", "noexec", "nodev"],
    )?);
    let cwd = if s.image.working_dir.is_empty() {
        "/"
    } else {
        s.image.working_dir.as_str()
    };
    let mut process = ProcessBuilder::default()
        .terminal(false)
        .user(UserBuilder::default().uid(uid).gid(gid).build()?)
        .args(args)
        .env(env)
        .cwd(cwd)
        .no_new_privileges(true)
        .oom_score_adj(s.oom_score_adj)
        // pause needs no privilege at all.
        .capabilities(capability_sets(&BTreeSet::new(), &BTreeSet::new())?)
        .build()?;
    clear_example_defaults(&mut process);
    let mut spec = SpecBuilder::default()
        .version(OCI_VERSION)
        .process(process)
        .root(RootBuilder::default().path(&s.rootfs).readonly(true).build()?)
        .mounts(mounts)
        .annotations(s.annotations.clone().into_iter().collect::<HashMap<_, _>>())
        .linux(linux)
        .build()?;
    spec.set_hostname(s.netns.is_some().then(|| s.hostname.to_string()));
    Ok(spec)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn input<'a>(
        image: &'a ImageConfig,
        sysctls: &'a BTreeMap<String, String>,
        netns: Option<PathBuf>,
    ) -> SandboxSpec<'a> {
        SandboxSpec {
            hostname: "web-0",
            rootfs: "/r/rootfs".into(),
            netns,
            userns: None,
            host_pid: false,
            host_ipc: false,
            shm: "/r/shm".into(),
            cgroups_path: "/kubepods/pod1/scute-abc".into(),
            sysctls,
            image,
            run_as_user: None,
            run_as_group: None,
            oom_score_adj: -998,
            annotations: BTreeMap::new(),
        }
    }

    #[test]
    fn pause_spec_joins_the_pinned_netns_and_keeps_pod_namespaces() {
        let image = ImageConfig {
            user: "65535:65535".into(),
            entrypoint: vec!["/pause".into()],
            ..Default::default()
        };
        let sysctls = BTreeMap::from([("net.ipv4.ip_unprivileged_port_start".to_string(), "0".to_string())]);
        let spec = pause_spec(&input(&image, &sysctls, Some("/run/scute/netns/abc".into()))).unwrap();
        let v = serde_json::to_value(&spec).unwrap();
        assert_eq!(v["process"]["args"], json!(["/pause"]));
        assert_eq!(v["process"]["user"]["uid"], 65535);
        assert_eq!(v["hostname"], "web-0");
        let ns = v["linux"]["namespaces"].as_array().unwrap();
        assert!(ns.contains(&json!({"type": "network", "path": "/run/scute/netns/abc"})));
        for t in ["pid", "ipc", "uts", "mount"] {
            assert!(ns.iter().any(|n| n["type"] == t), "{t}");
        }
        assert_eq!(v["linux"]["sysctl"]["net.ipv4.ip_unprivileged_port_start"], "0");
        assert_eq!(v["root"]["readonly"], true);
    }

    #[test]
    fn host_namespaces_are_not_created() {
        let image = ImageConfig::default();
        let sysctls = BTreeMap::new();
        let mut i = input(&image, &sysctls, None);
        i.host_pid = true;
        i.host_ipc = true;
        let v = serde_json::to_value(pause_spec(&i).unwrap()).unwrap();
        let types: Vec<&str> = v["linux"]["namespaces"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n["type"].as_str().unwrap())
            .collect();
        assert_eq!(types, vec!["mount"]);
        assert_eq!(v["process"]["args"], json!(["/pause"]));
    }

    #[test]
    fn named_sandbox_user_is_refused() {
        let image = ImageConfig {
            user: "nobody".into(),
            ..Default::default()
        };
        let sysctls = BTreeMap::new();
        assert!(pause_spec(&input(&image, &sysctls, None)).is_err());
    }
}
