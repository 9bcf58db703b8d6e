//! The pause container's spec: namespaces per the pod's NamespaceOption, the pinned network
//! namespace joined by path, the pod's /dev/shm, sysctls, the cgroup under the kubelet's parent.

use std::collections::BTreeMap;
use std::path::PathBuf;

use oci_spec::runtime::Spec;
use serde_json::json;

use crate::image::record::ImageConfig;
use crate::oci::userns::PodUserNs;
use crate::oci::{
    id_mapping, numeric_user, user, SpecError, DEFAULT_MASKED_PATHS, DEFAULT_PATH_ENV, DEFAULT_READONLY_PATHS,
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

    let mut namespaces = vec![json!({"type": "mount"})];
    if !s.host_pid {
        namespaces.push(json!({"type": "pid"}));
    }
    if !s.host_ipc {
        namespaces.push(json!({"type": "ipc"}));
    }
    // A host-network pod keeps the host's network and hostname (as the kubelet expects).
    if let Some(path) = &s.netns {
        if s.userns.is_some() {
            namespaces.push(json!({"type": "network"}));
        } else {
            namespaces.push(json!({"type": "network", "path": path}));
        }
        namespaces.push(json!({"type": "uts"}));
    }
    let (mut uid_mappings, mut gid_mappings) = (Vec::new(), Vec::new());
    if let Some(userns) = &s.userns {
        namespaces.push(json!({"type": "user"}));
        uid_mappings.push(id_mapping(&userns.uids));
        gid_mappings.push(id_mapping(&userns.gids));
    }

    let spec = json!({
        "ociVersion": "1.0.2",
        "process": {
            "terminal": false,
            "user": {"uid": uid, "gid": gid},
            "args": args,
            "env": env,
            "cwd": if s.image.working_dir.is_empty() { "/" } else { s.image.working_dir.as_str() },
            "noNewPrivileges": true,
            "oomScoreAdj": s.oom_score_adj,
            // pause needs no privilege at all.
            "capabilities": {"bounding": [], "effective": [], "permitted": [], "ambient": []},
        },
        "root": {"path": s.rootfs, "readonly": true},
        "hostname": if s.netns.is_some() { Some(s.hostname) } else { None },
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
            {"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
            {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
            {"destination": "/dev/shm", "type": "bind", "source": s.shm, "options": ["rbind", "nosuid", "noexec", "nodev"]},
            {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
        ],
        "annotations": s.annotations,
        "linux": {
            "namespaces": namespaces,
            "cgroupsPath": s.cgroups_path,
            "sysctl": s.sysctls,
            "maskedPaths": DEFAULT_MASKED_PATHS,
            "readonlyPaths": DEFAULT_READONLY_PATHS,
            "resources": {"devices": [{"allow": false, "access": "rwm"}]},
            "uidMappings": uid_mappings,
            "gidMappings": gid_mappings,
        },
    });
    serde_json::from_value(spec).map_err(|e| SpecError::Invalid(format!("building the sandbox spec: {e}")))
}

#[cfg(test)]
mod tests {
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
