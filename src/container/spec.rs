//! OCI runtime specs (config.json) that the shim hands to libcontainer:
//!
//! - `pause_spec`: the pod sandbox's pause container: namespaces per the pod's NamespaceOption,
//!   the pinned network namespace joined by path, the pod's /dev/shm, sysctls, cgroup under the
//!   kubelet's parent.
//! - `container_spec`: a pod's container (CreateContainer), with the kubelet's semantics as
//!   containerd's CRI plugin implements them: command/args over the image's Entrypoint/Cmd, env,
//!   user (see `user`), mounts, the pause container's namespaces, capabilities, seccomp (see
//!   `seccomp`), masked paths, devices and resources.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};
use std::sync::OnceLock;

use oci_spec::runtime::Spec;
use serde_json::{json, Map, Value};

use super::{seccomp, user};
use crate::api;
use crate::api::{MountPropagation, NamespaceMode};
use crate::image::record::ImageConfig;
use crate::sandbox::userns::{IdRange, PodUserNs};

/// runc's defaults: paths a container must not read or write through.
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];
pub const DEFAULT_READONLY_PATHS: &[&str] = &["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"];

#[derive(Debug, thiserror::Error)]
pub enum SpecError {
    /// The request cannot be honoured as given (InvalidArgument).
    #[error("{0}")]
    Invalid(String),
    /// The host is not in a state the request needs (a mount source that cannot be created,
    /// a propagation the host mount does not allow, no pause process).
    #[error("{0}")]
    Host(String),
}

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

fn id_mapping(range: &IdRange) -> Value {
    json!({"containerID": range.container_id, "hostID": range.host_id, "size": range.length})
}

/// `uid[:gid]` of an image USER; names need the image's /etc/passwd, which the sandbox image
/// has no business needing.
fn numeric_user(user: &str) -> Result<(u32, u32), SpecError> {
    if user.is_empty() {
        return Ok((0, 0));
    }
    let (u, g) = user.split_once(':').unwrap_or((user, ""));
    let uid: u32 = u
        .parse()
        .map_err(|_| SpecError::Invalid(format!("sandbox image USER {user:?} must be numeric (uid[:gid])")))?;
    let gid: u32 = if g.is_empty() {
        0
    } else {
        g.parse()
            .map_err(|_| SpecError::Invalid(format!("sandbox image USER {user:?} must be numeric (uid[:gid])")))?
    };
    Ok((uid, gid))
}

/// The PATH a container gets when its image sets none.
pub const DEFAULT_PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// Every capability oci-spec (and Linux 5.9+) knows, in bit order: the index is the number.
pub const ALL_CAPABILITIES: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// runc's and containerd's capabilities for an unprivileged container.
pub const DEFAULT_CAPABILITIES: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

pub const ANNOTATION_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
pub const ANNOTATION_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
pub const ANNOTATION_SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";
pub const ANNOTATION_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";
pub const ANNOTATION_SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";
pub const ANNOTATION_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";
pub const ANNOTATION_IMAGE_NAME: &str = "io.kubernetes.cri.image-name";

/// Directories of /dev that hold no device a privileged container should get (runc's list).
const HOST_DEV_SKIP: &[&str] = &[".lxc", ".lxd-mounts", ".mount", ".udev", "fd", "mqueue", "pts", "shm"];

/// What a pod container's spec is made from.
pub struct ContainerSpec<'a> {
    pub id: &'a str,
    pub config: &'a api::ContainerConfig,
    pub sandbox: &'a api::PodSandboxConfig,
    pub image: &'a ImageConfig,
    /// The container's mounted rw overlay (the daemon mounts it). Read for /etc/passwd and
    /// /etc/group, through `openat2(RESOLVE_IN_ROOT)` only.
    pub rootfs: PathBuf,
    /// The pod's pause process: network/ipc/uts (and pid in POD mode) are joined through
    /// /proc/<pid>/ns/*.
    pub pause_pid: u32,
    /// `<root>/sandboxes/<sandbox id>/`: hostname, hosts, resolv.conf, shm/. Its last component
    /// is the sandbox ID reported in the `io.kubernetes.cri.sandbox-id` annotation.
    pub sandbox_dir: PathBuf,
    pub host_network: bool,
    pub host_ipc: bool,
    pub host_pid: bool,
    /// The pod's own user namespace (pause's, joined); None for the host's.
    pub userns: Option<PodUserNs>,
    pub cgroups_path: String,
    /// The daemon's own oom_score_adj: a container cannot ask for less (no CAP_SYS_RESOURCE).
    pub oom_score_adj_floor: i32,
}

/// The OCI spec of a pod's container. Host side effects: a missing host_path of a CRI mount is
/// created as a directory (as containerd does); nothing else is written.
pub fn container_spec(s: &ContainerSpec<'_>) -> Result<Spec, SpecError> {
    let default_sc = api::LinuxContainerSecurityContext::default();
    let linux = s.config.linux.as_ref();
    let sc = linux.and_then(|l| l.security_context.as_ref()).unwrap_or(&default_sc);
    let resources = linux.and_then(|l| l.resources.as_ref());
    let privileged = sc.privileged;
    if privileged && !sandbox_privileged(s.sandbox) {
        return Err(SpecError::Invalid(
            "no privileged container allowed in a sandbox that is not privileged".into(),
        ));
    }

    if let Some(cdi) = s.config.cdi_devices.first() {
        return Err(SpecError::Invalid(format!(
            "CDI devices ({:?}) are not supported",
            cdi.name
        )));
    }

    let args = process_args(&s.config.command, &s.config.args, s.image)?;
    let env = container_env(s.image, &s.config.envs, &env_hostname(s.sandbox));
    let cwd = working_dir(s.config, s.image)?;
    let user = user::resolve(&s.rootfs, Some(sc), &s.image.user, s.userns.as_ref())?;
    let (caps, ambient) = capabilities(sc, privileged)?;
    let cap_names: Vec<&str> = caps.iter().map(|&i| ALL_CAPABILITIES[i]).collect();
    let ambient_names: Vec<&str> = ambient.iter().map(|&i| ALL_CAPABILITIES[i]).collect();
    let (mounts, rootfs_propagation) = container_mounts(s, sc, privileged)?;
    ensure_working_dir(&s.rootfs, &cwd, &mounts)?;
    let namespaces = container_namespaces(s, sc, privileged)?;
    let seccomp = seccomp::for_container(sc, privileged, &cap_names)?;
    let (devices, device_rules) = container_devices(&s.config.devices, privileged)?;
    let (masked, readonly): (Vec<String>, Vec<String>) = if privileged {
        (Vec::new(), Vec::new())
    } else {
        (
            or_defaults(&sc.masked_paths, DEFAULT_MASKED_PATHS),
            or_defaults(&sc.readonly_paths, DEFAULT_READONLY_PATHS),
        )
    };

    let mut process = json!({
        "terminal": s.config.tty,
        "user": {"uid": user.uid, "gid": user.gid, "additionalGids": user.additional_gids},
        "args": args,
        "env": env,
        "cwd": cwd,
        "capabilities": {
            "bounding": cap_names,
            "effective": cap_names,
            "permitted": cap_names,
            "inheritable": ambient_names,
            "ambient": ambient_names,
        },
        "oomScoreAdj": oom_score_adj(resources, s.oom_score_adj_floor),
    });
    // libcontainer treats a present `false` as set (and then loads seccomp after dropping
    // privileges, which fails for non-root users): only ever write `true`.
    if sc.no_new_privs {
        process["noNewPrivileges"] = json!(true);
    }
    let mut linux = json!({
        "namespaces": namespaces,
        "cgroupsPath": s.cgroups_path,
        "resources": linux_resources(resources, device_rules),
        "devices": devices,
        "maskedPaths": masked,
        "readonlyPaths": readonly,
    });
    if let Some(seccomp) = seccomp {
        linux["seccomp"] = seccomp;
    }
    if let Some(propagation) = rootfs_propagation {
        linux["rootfsPropagation"] = json!(propagation);
    }
    let mut spec = json!({
        "ociVersion": "1.0.2",
        "process": process,
        "root": {"path": s.rootfs, "readonly": sc.readonly_rootfs},
        "mounts": mounts,
        "annotations": container_annotations(s),
        "linux": linux,
    });
    // Joined from pause (which set it); a host-network container keeps the host's UTS namespace.
    if !s.host_network && !s.sandbox.hostname.is_empty() {
        spec["hostname"] = json!(s.sandbox.hostname);
    }
    serde_json::from_value(spec)
        .map_err(|e| SpecError::Invalid(format!("building the spec of container {}: {e}", s.id)))
}

/// Messages for the daemon to log: security options scute accepts but cannot apply here
/// (AppArmor, SELinux). Nothing about them is written into the spec.
pub fn security_warnings(config: &api::ContainerConfig) -> Vec<String> {
    use api::security_profile::ProfileType;
    let Some(sc) = config.linux.as_ref().and_then(|l| l.security_context.as_ref()) else {
        return Vec::new();
    };
    let mut warnings = Vec::new();
    #[allow(deprecated)]
    let apparmor = match &sc.apparmor {
        Some(p) => match ProfileType::try_from(p.profile_type) {
            Ok(ProfileType::Unconfined) => None,
            Ok(ProfileType::Localhost) => Some(format!("localhost/{}", p.localhost_ref)),
            _ => Some("runtime/default".to_string()),
        },
        None => match sc.apparmor_profile.as_str() {
            "" | "unconfined" => None,
            other => Some(other.to_string()),
        },
    };
    if let (Some(profile), false) = (apparmor, sc.privileged) {
        warnings.push(format!(
            "AppArmor profile {profile:?} requested, but AppArmor is not supported on this host: the container runs without it"
        ));
    }
    if let Some(se) = &sc.selinux_options {
        if !(se.user.is_empty() && se.role.is_empty() && se.r#type.is_empty() && se.level.is_empty()) {
            warnings.push(format!(
                "SELinux options (user {:?}, role {:?}, type {:?}, level {:?}) requested, but SELinux is not supported on this host: no label is applied",
                se.user, se.role, se.r#type, se.level
            ));
        }
    }
    warnings
}

fn sandbox_privileged(sandbox: &api::PodSandboxConfig) -> bool {
    sandbox
        .linux
        .as_ref()
        .and_then(|l| l.security_context.as_ref())
        .is_some_and(|sc| sc.privileged)
}

/// The kubelet's (Docker's) rules: `command` replaces the image's Entrypoint, `args` its Cmd;
/// a command without args does not get the image's Cmd; an Entrypoint of `[""]` is none.
pub fn process_args(command: &[String], args: &[String], image: &ImageConfig) -> Result<Vec<String>, SpecError> {
    let mut command = command.to_vec();
    let mut args = args.to_vec();
    if command.is_empty() {
        if args.is_empty() {
            args = image.cmd.clone();
        }
        if !(image.entrypoint.len() == 1 && image.entrypoint[0].is_empty()) {
            command = image.entrypoint.clone();
        }
    }
    command.extend(args);
    if command.is_empty() {
        return Err(SpecError::Invalid("no command specified".into()));
    }
    Ok(command)
}

/// The pod's hostname for HOSTNAME; a host-network pod without one gets the node's.
fn env_hostname(sandbox: &api::PodSandboxConfig) -> String {
    if !sandbox.hostname.is_empty() {
        return sandbox.hostname.clone();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// Default PATH, HOSTNAME, then the image's env, then the container's: a later value of a key
/// replaces an earlier one in place; an image entry without `=` unsets the key (containerd).
fn container_env(image: &ImageConfig, envs: &[api::KeyValue], hostname: &str) -> Vec<String> {
    let mut out: Vec<Option<String>> = Vec::new();
    let mut index: std::collections::HashMap<String, usize> = std::collections::HashMap::new();
    let base = [DEFAULT_PATH_ENV.to_string(), format!("HOSTNAME={hostname}")];
    let config = envs
        .iter()
        .map(|kv| format!("{}={}", kv.key, String::from_utf8_lossy(&kv.value)));
    for entry in base.into_iter().chain(image.env.iter().cloned()).chain(config) {
        match entry.split_once('=') {
            Some((key, _)) => match index.get(key) {
                Some(&i) => out[i] = Some(entry),
                None => {
                    index.insert(key.to_string(), out.len());
                    out.push(Some(entry));
                }
            },
            None => {
                if let Some(i) = index.remove(&entry) {
                    out[i] = None;
                }
            }
        }
    }
    out.into_iter().flatten().collect()
}

fn working_dir(config: &api::ContainerConfig, image: &ImageConfig) -> Result<String, SpecError> {
    let cwd = if !config.working_dir.is_empty() {
        config.working_dir.as_str()
    } else if !image.working_dir.is_empty() {
        image.working_dir.as_str()
    } else {
        "/"
    };
    if !cwd.starts_with('/') {
        return Err(SpecError::Invalid(format!(
            "working directory {cwd:?} must be an absolute path"
        )));
    }
    Ok(cwd.to_string())
}

/// A working directory the image does not have is created in the container's rootfs (its
/// writable layer), as runc and Docker do and libcontainer does not (its chdir fails). One under
/// a mount is left alone: it is not the rootfs's to create.
fn ensure_working_dir(rootfs: &Path, cwd: &str, mounts: &[Value]) -> Result<(), SpecError> {
    let cwd_path = Path::new(cwd);
    let under_mount = mounts
        .iter()
        .filter_map(|m| m["destination"].as_str())
        .any(|d| d != "/" && cwd_path.starts_with(d));
    if cwd == "/" || under_mount {
        return Ok(());
    }
    user::ensure_dir_in_root(rootfs, cwd).map(|_| ()).map_err(|e| {
        SpecError::Invalid(format!(
            "working directory {cwd:?}: cannot create it in the container: {e}"
        ))
    })
}

fn or_defaults(given: &[String], defaults: &[&str]) -> Vec<String> {
    if given.is_empty() {
        defaults.iter().map(|p| p.to_string()).collect()
    } else {
        given.to_vec()
    }
}

/// The highest capability number this kernel knows (`/proc/sys/kernel/cap_last_cap`).
fn last_cap() -> usize {
    static LAST: OnceLock<usize> = OnceLock::new();
    *LAST.get_or_init(|| {
        std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
            .ok()
            .and_then(|s| s.trim().parse::<usize>().ok())
            .unwrap_or(ALL_CAPABILITIES.len() - 1)
            .min(ALL_CAPABILITIES.len() - 1)
    })
}

/// `NET_ADMIN`, `net_admin` or `CAP_NET_ADMIN` → its number.
fn cap_index(name: &str) -> Result<usize, SpecError> {
    let upper = name.trim().to_ascii_uppercase();
    let full = if upper.starts_with("CAP_") {
        upper
    } else {
        format!("CAP_{upper}")
    };
    ALL_CAPABILITIES
        .iter()
        .position(|c| *c == full)
        .ok_or_else(|| SpecError::Invalid(format!("unknown capability {name:?}")))
}

/// The capabilities scute itself holds (its effective set, as containerd's `cap.Current()`), of
/// those this kernel knows: a container cannot be given more (capset fails), so this is what
/// "ALL" and privileged mean. Every known one when /proc/self/status cannot be read.
#[cfg_attr(test, allow(dead_code))]
fn held_capabilities() -> &'static BTreeSet<usize> {
    static HELD: OnceLock<BTreeSet<usize>> = OnceLock::new();
    HELD.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        held_from_status(&status, last_cap())
    })
}

/// The capabilities in the `CapEff:` mask of /proc/<pid>/status text, up to `last`; every one
/// up to `last` without a readable mask.
fn held_from_status(status: &str, last: usize) -> BTreeSet<usize> {
    let effective = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
    (0..=last.min(63))
        .filter(|&c| effective.is_none_or(|mask| mask & (1u64 << c) != 0))
        .collect()
}

/// (bounding = effective = permitted, ambient = inheritable) as capability numbers, following
/// containerd: "ALL" in add, then "ALL" in drop, then the named adds, then the named drops.
/// Capabilities this kernel does not have are left out; "ALL" and privileged get all that scute
/// holds, defaults scute does not hold are left out, and a named one it does not hold is refused
/// (libcontainer could not grant it).
fn capabilities(
    sc: &api::LinuxContainerSecurityContext,
    privileged: bool,
) -> Result<(BTreeSet<usize>, BTreeSet<usize>), SpecError> {
    // Unit tests need not run as root: they see a runtime holding every capability.
    #[cfg(test)]
    let held = &(0..=last_cap()).collect();
    #[cfg(not(test))]
    let held = held_capabilities();
    capabilities_with(sc, privileged, held)
}

fn capabilities_with(
    sc: &api::LinuxContainerSecurityContext,
    privileged: bool,
    held: &BTreeSet<usize>,
) -> Result<(BTreeSet<usize>, BTreeSet<usize>), SpecError> {
    let supported: BTreeSet<usize> = (0..=last_cap()).collect();
    let requested = sc.capabilities.clone().unwrap_or_default();
    let is_all = |n: &String| n.trim().eq_ignore_ascii_case("ALL");
    let mut set = BTreeSet::new();
    for name in DEFAULT_CAPABILITIES {
        set.insert(cap_index(name)?);
    }
    set.retain(|c| held.contains(c));
    if requested.add_capabilities.iter().any(is_all) {
        set.clone_from(held);
    }
    if requested.drop_capabilities.iter().any(is_all) {
        set.clear();
    }
    let not_held = |name: &str, c: usize| {
        SpecError::Invalid(format!(
            "capability {name:?} ({}) was requested, but scute does not hold it, so no container can get it",
            ALL_CAPABILITIES[c]
        ))
    };
    let dropped: BTreeSet<usize> = requested
        .drop_capabilities
        .iter()
        .filter(|n| !is_all(n))
        .map(|n| cap_index(n))
        .collect::<Result<_, _>>()?;
    for name in requested.add_capabilities.iter().filter(|n| !is_all(n)) {
        let c = cap_index(name)?;
        if !privileged && supported.contains(&c) && !held.contains(&c) && !dropped.contains(&c) {
            return Err(not_held(name, c));
        }
        set.insert(c);
    }
    for c in &dropped {
        set.remove(c);
    }
    let mut ambient = BTreeSet::new();
    for name in &requested.add_ambient_capabilities {
        if is_all(name) {
            return Err(SpecError::Invalid(
                "\"ALL\" is not accepted as an ambient capability".into(),
            ));
        }
        let c = cap_index(name)?;
        if !privileged && supported.contains(&c) && !held.contains(&c) {
            return Err(not_held(name, c));
        }
        ambient.insert(c);
    }
    // An ambient capability must be permitted and inheritable too.
    set.extend(ambient.iter().copied());
    if privileged {
        set.clone_from(held);
    }
    set.retain(|c| held.contains(c));
    ambient.retain(|c| held.contains(c));
    Ok((set, ambient))
}

fn oom_score_adj(resources: Option<&api::LinuxContainerResources>, floor: i32) -> i32 {
    let requested = resources.map_or(0, |r| r.oom_score_adj);
    let floor = i64::from(floor.clamp(-1000, 1000));
    // In -1000..=1000 after the clamp.
    requested.clamp(floor, 1000) as i32
}

/// A bind mount before its source is checked: the kubelet's, or one of the pod's files.
struct BindMount {
    destination: String,
    source: PathBuf,
    readonly: bool,
    recursive_readonly: bool,
    propagation: MountPropagation,
    /// A CRI mount whose missing source is created; the pod's files are skipped when missing.
    create: bool,
    extra_options: &'static [&'static str],
}

/// The default mounts, then the kubelet's and the pod's bind mounts sorted by depth (a parent
/// before what is mounted under it); a bind mount replaces a default at the same destination,
/// and a /dev mount all defaults under /dev. Returns the mounts and the rootfs propagation
/// that rshared/rslave binds need (`private` when none does), spelled the OCI way
/// (`shared`/`slave`/`private`: libcontainer always applies it recursively and refuses runc's
/// `rshared`/`rslave`).
fn container_mounts(
    s: &ContainerSpec<'_>,
    sc: &api::LinuxContainerSecurityContext,
    privileged: bool,
) -> Result<(Vec<Value>, Option<&'static str>), SpecError> {
    let mut binds = Vec::new();
    for m in &s.config.mounts {
        binds.push(cri_mount(m)?);
    }
    let supplied: HashSet<String> = binds.iter().map(|b| b.destination.clone()).collect();
    for (destination, file) in [
        ("/etc/hostname", "hostname"),
        ("/etc/hosts", "hosts"),
        ("/etc/resolv.conf", "resolv.conf"),
    ] {
        let source = s.sandbox_dir.join(file);
        if !supplied.contains(destination) && source.exists() {
            binds.push(BindMount {
                destination: destination.into(),
                source,
                readonly: sc.readonly_rootfs,
                recursive_readonly: false,
                propagation: MountPropagation::PropagationPrivate,
                create: false,
                extra_options: &[],
            });
        }
    }
    if !supplied.contains("/dev/shm") {
        let source = if s.host_ipc {
            PathBuf::from("/dev/shm")
        } else {
            s.sandbox_dir.join("shm")
        };
        if source.exists() {
            binds.push(BindMount {
                destination: "/dev/shm".into(),
                source,
                readonly: false,
                recursive_readonly: false,
                propagation: MountPropagation::PropagationPrivate,
                create: false,
                extra_options: &["nosuid", "noexec", "nodev"],
            });
        }
    }
    binds.sort_by_key(|b| b.destination.matches('/').count());
    let destinations: HashSet<&str> = binds.iter().map(|b| b.destination.as_str()).collect();

    let sys_mode = if privileged { "rw" } else { "ro" };
    let defaults = [
        json!({"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/dev", "type": "tmpfs", "source": "tmpfs", "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]}),
        json!({"destination": "/dev/pts", "type": "devpts", "source": "devpts", "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]}),
        json!({"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]}),
        json!({"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", sys_mode]}),
    ];
    let mut mounts: Vec<Value> = defaults
        .into_iter()
        .chain(cgroup_mounts(&s.cgroups_path, sys_mode))
        .filter(|m| {
            let d = m["destination"].as_str().unwrap_or_default();
            let under_supplied_dev = destinations.contains("/dev") && d.starts_with("/dev/");
            let under_supplied_cgroup = destinations.contains("/sys/fs/cgroup") && d.starts_with("/sys/fs/cgroup/");
            !(destinations.contains(d) || under_supplied_dev || under_supplied_cgroup)
        })
        .collect();

    // libcontainer 0.7 drops the propagation options of a mount (its open_tree/move_mount path
    // never sets one): a bind inherits the propagation its source has in the container's mount
    // namespace, which is what rootfsPropagation makes of the host's mounts. Its default there
    // is rslave, which would make every "rprivate" bind a slave that receives the host's later
    // mounts; "private" keeps them private while no bind asks for more.
    let mut rootfs_propagation = Some("private");
    let mut mountinfo: Option<Vec<MountInfo>> = None;
    for b in binds {
        if b.create && std::fs::metadata(&b.source).is_err() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(&b.source)
                .map_err(|e| SpecError::Host(format!("creating mount source {}: {e}", b.source.display())))?;
        }
        let source = std::fs::canonicalize(&b.source)
            .map_err(|e| SpecError::Host(format!("resolving mount source {}: {e}", b.source.display())))?;
        let mut options = vec!["rbind"];
        match b.propagation {
            MountPropagation::PropagationPrivate => options.push("rprivate"),
            MountPropagation::PropagationBidirectional => {
                ensure_propagation(&source, true, mountinfo.get_or_insert_with(read_mountinfo))?;
                options.push("rshared");
                rootfs_propagation = Some("shared");
            }
            MountPropagation::PropagationHostToContainer => {
                ensure_propagation(&source, false, mountinfo.get_or_insert_with(read_mountinfo))?;
                options.push("rslave");
                if rootfs_propagation != Some("shared") {
                    rootfs_propagation = Some("slave");
                }
            }
        }
        options.push(match (b.readonly, b.recursive_readonly) {
            (true, true) => "rro",
            (true, false) => "ro",
            (false, _) => "rw",
        });
        options.extend_from_slice(b.extra_options);
        mounts.push(json!({"destination": b.destination, "type": "bind", "source": source, "options": options}));
    }
    Ok((mounts, rootfs_propagation))
}

/// The v1 controllers libcontainer's cgroupfs manager puts a container in (libcgroups
/// `v1::CONTROLLERS`): a hierarchy with one of them holds the container at its cgroups path.
const LIBCONTAINER_V1_CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "hugetlb",
    "memory",
    "pids",
    "perf_event",
    "blkio",
    "net_prio",
    "net_cls",
    "freezer",
];

/// The container's /sys/fs/cgroup, read-only unless `mode` is "rw" (privileged).
///
/// cgroup v2: a `cgroup` mount, which libcontainer mounts as cgroup2 in the container's cgroup
/// namespace. cgroup v1 and hybrid hosts: a tmpfs and one bind mount per v1 hierarchy of the
/// container's own cgroup there — the layout libcontainer would emulate for a `cgroup` mount,
/// spelled out because libcontainer 0.7's emulation (`mount_cgroup_v1`) binds every hierarchy
/// read-write whatever the options say (a container could raise its own memory limit), and
/// looks its cgroups up in /proc/<its PID in its own PID namespace> of the host's procfs: for a
/// container in its pod's PID namespace that is some unrelated host process, and the creation
/// fails when the host has no process with that number.
fn cgroup_mounts(cgroups_path: &str, mode: &str) -> Vec<Value> {
    if cgroup2() {
        return vec![json!({
            "destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
            "options": ["nosuid", "noexec", "nodev", "relatime", mode],
        })];
    }
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    // The shim (and so a container, in a hierarchy libcontainer leaves alone) is in the daemon's
    // cgroups: it inherits them.
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let links: Vec<(String, String)> = std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let target = std::fs::read_link(e.path()).ok()?;
            let target = target.file_name()?.to_string_lossy().into_owned();
            Some((e.file_name().to_string_lossy().into_owned(), target))
        })
        .collect();
    cgroup_v1_mounts(cgroups_path, mode, &mountinfo, &own, &links)
}

/// `cgroup_mounts` on a v1 host, from the daemon's mountinfo and /proc/self/cgroup and the
/// symlinks of the host's /sys/fs/cgroup (`cpu` → `cpu,cpuacct`; bound as directories).
fn cgroup_v1_mounts(
    cgroups_path: &str,
    mode: &str,
    mountinfo: &str,
    own_cgroup: &str,
    links: &[(String, String)],
) -> Vec<Value> {
    let mut mounts = vec![json!({
        "destination": "/sys/fs/cgroup", "type": "tmpfs", "source": "tmpfs",
        "options": ["nosuid", "noexec", "nodev", "mode=755"],
    })];
    let mut seen = HashSet::new();
    for line in mountinfo.lines() {
        let Some((left, right)) = line.split_once(" - ") else {
            continue;
        };
        let left: Vec<&str> = left.split(' ').collect();
        let right: Vec<&str> = right.split(' ').collect();
        if left.len() < 5 || right.len() < 3 || right[0] != "cgroup" {
            continue;
        }
        let mountpoint = PathBuf::from(unescape_mountinfo(left[4]));
        if mountpoint.parent() != Some(Path::new("/sys/fs/cgroup")) {
            continue;
        }
        let Some(name) = mountpoint.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        let options: Vec<&str> = right[2].split(',').collect();
        let managed = options.iter().any(|o| LIBCONTAINER_V1_CONTROLLERS.contains(o));
        let root = unescape_mountinfo(left[3]);
        let path = if managed {
            // libcgroups joins the cgroups path to the mount point, whatever the mount's root.
            format!("{}{}", root.trim_end_matches('/'), cgroups_path)
        } else {
            // Another hierarchy (name=systemd, misc, …): the cgroup the container inherits.
            let found = own_cgroup.lines().find_map(|l| {
                let mut f = l.splitn(3, ':');
                let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
                (!controllers.is_empty() && controllers.split(',').any(|c| options.contains(&c)))
                    .then(|| path.to_string())
            });
            match found {
                Some(p) => p,
                None => continue,
            }
        };
        let below = if root == "/" {
            Some(path.as_str())
        } else {
            path.strip_prefix(root.as_str())
                .filter(|r| r.is_empty() || r.starts_with('/'))
        };
        let Some(below) = below else {
            continue;
        };
        if !seen.insert(name.clone()) {
            continue;
        }
        let below = below.trim_start_matches('/');
        let source = if below.is_empty() {
            mountpoint.clone()
        } else {
            mountpoint.join(below)
        };
        let names = std::iter::once(name.clone()).chain(
            links
                .iter()
                .filter(|(_, target)| *target == name)
                .map(|(link, _)| link.clone()),
        );
        for n in names {
            mounts.push(json!({
                "destination": format!("/sys/fs/cgroup/{n}"), "type": "bind", "source": source,
                "options": ["rbind", "rprivate", "nosuid", "noexec", "nodev", mode],
            }));
        }
    }
    mounts
}

fn cri_mount(m: &api::Mount) -> Result<BindMount, SpecError> {
    if !m.container_path.starts_with('/') {
        return Err(SpecError::Invalid(format!(
            "mount container_path {:?} must be an absolute path",
            m.container_path
        )));
    }
    let destination = clean_absolute(&m.container_path);
    if m.host_path.is_empty() {
        return Err(SpecError::Invalid(if m.image.is_some() {
            format!("image volume mount at {destination} is not supported")
        } else {
            format!("mount at {destination} has no host_path")
        }));
    }
    if !m.host_path.starts_with('/') {
        return Err(SpecError::Invalid(format!(
            "mount host_path {:?} must be an absolute path",
            m.host_path
        )));
    }
    if !m.uid_mappings.is_empty() || !m.gid_mappings.is_empty() {
        return Err(SpecError::Invalid(format!(
            "mount at {destination}: idmapped mounts need the pod's own user namespace"
        )));
    }
    let propagation = MountPropagation::try_from(m.propagation).unwrap_or(MountPropagation::PropagationPrivate);
    if m.recursive_read_only {
        if !m.readonly {
            return Err(SpecError::Invalid(format!(
                "mount at {destination}: recursive read-only conflicts with a read-write mount"
            )));
        }
        if propagation != MountPropagation::PropagationPrivate {
            return Err(SpecError::Invalid(format!(
                "mount at {destination}: recursive read-only needs private propagation"
            )));
        }
    }
    Ok(BindMount {
        destination,
        source: PathBuf::from(&m.host_path),
        readonly: m.readonly,
        recursive_readonly: m.recursive_read_only,
        propagation,
        create: true,
        extra_options: &[],
    })
}

/// `/a//b/./c/../d/` → `/a/b/d` (lexically, like Go's filepath.Clean).
fn clean_absolute(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in Path::new(path).components() {
        match c {
            Component::Normal(p) => parts.push(p.to_str().unwrap_or_default()),
            Component::ParentDir => {
                parts.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    format!("/{}", parts.join("/"))
}

/// One line of /proc/self/mountinfo, the parts propagation checks need.
#[derive(Debug, Clone, PartialEq, Eq)]
struct MountInfo {
    mountpoint: PathBuf,
    /// Optional fields: `shared:N`, `master:N`, `propagate_from:N`, `unbindable`.
    optional: Vec<String>,
}

fn read_mountinfo() -> Vec<MountInfo> {
    parse_mountinfo(&std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
}

fn parse_mountinfo(text: &str) -> Vec<MountInfo> {
    text.lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split(' ').collect();
            if fields.len() < 7 {
                return None;
            }
            let optional = fields[6..]
                .iter()
                .take_while(|f| **f != "-")
                .map(|f| f.to_string())
                .collect();
            Some(MountInfo {
                mountpoint: PathBuf::from(unescape_mountinfo(fields[4])),
                optional,
            })
        })
        .collect()
}

/// Undoes the kernel's octal escapes (`\040` for a space, …).
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\\' && i + 3 < bytes.len() && bytes[i + 1..i + 4].iter().all(|b| (b'0'..=b'7').contains(b)) {
            let v = (bytes[i + 1] - b'0') as u32 * 64 + (bytes[i + 2] - b'0') as u32 * 8 + (bytes[i + 3] - b'0') as u32;
            out.push(v as u8);
            i += 4;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// containerd's ensureShared / ensureSharedOrSlave: the host mount holding `path` must
/// propagate to the container (shared; or a slave, for HOST_TO_CONTAINER).
fn ensure_propagation(path: &Path, shared_only: bool, mounts: &[MountInfo]) -> Result<(), SpecError> {
    let mount = mounts
        .iter()
        .filter(|m| path.starts_with(&m.mountpoint))
        .max_by_key(|m| m.mountpoint.components().count())
        .ok_or_else(|| SpecError::Host(format!("no mount found holding {}", path.display())))?;
    let ok = mount
        .optional
        .iter()
        .any(|o| o.starts_with("shared:") || (!shared_only && o.starts_with("master:")));
    if ok {
        return Ok(());
    }
    Err(SpecError::Host(format!(
        "path {} is mounted on {} but it is not a shared{} mount",
        path.display(),
        mount.mountpoint.display(),
        if shared_only { "" } else { " or slave" }
    )))
}

fn container_namespaces(
    s: &ContainerSpec<'_>,
    sc: &api::LinuxContainerSecurityContext,
    privileged: bool,
) -> Result<Vec<Value>, SpecError> {
    let options = sc.namespace_options.clone().unwrap_or_default();
    // A container lives in its pod's user namespace; it can only ask for that one.
    let asked = crate::sandbox::userns::pod_user_namespace(&options).map_err(SpecError::Invalid)?;
    let asks_pod_userns = options
        .userns_options
        .as_ref()
        .is_some_and(|u| u.mode() == NamespaceMode::Pod);
    if asks_pod_userns && asked != s.userns {
        return Err(SpecError::Invalid(
            "the container's user namespace options differ from its pod's".into(),
        ));
    }
    let pause = |kind: &str| -> Result<Value, SpecError> {
        if s.pause_pid == 0 {
            return Err(SpecError::Host("the pod sandbox has no running pause process".into()));
        }
        Ok(json!({"type": kind_name(kind), "path": format!("/proc/{}/ns/{kind}", s.pause_pid)}))
    };
    let mut namespaces = vec![json!({"type": "mount"})];
    // Joined first (libcontainer enters the user namespace before the others).
    if s.userns.is_some() {
        namespaces.push(pause("user")?);
    }
    if !s.host_network {
        namespaces.push(pause("net")?);
        namespaces.push(pause("uts")?);
    }
    if !s.host_ipc {
        namespaces.push(pause("ipc")?);
    }
    match options.pid() {
        NamespaceMode::Pod => {
            if !s.host_pid {
                namespaces.push(pause("pid")?);
            }
        }
        NamespaceMode::Container => namespaces.push(json!({"type": "pid"})),
        NamespaceMode::Node => {
            if !s.host_pid {
                return Err(SpecError::Invalid(
                    "the container asks for the host PID namespace but its pod does not use it".into(),
                ));
            }
        }
        NamespaceMode::Target => {
            return Err(SpecError::Invalid(format!(
                "sharing the PID namespace of container {:?} (NamespaceMode TARGET) is not supported",
                options.target_id
            )))
        }
    }
    // As containerd: hide the host's cgroup tree on cgroup v2, except from privileged containers.
    if cgroup2() && !privileged {
        namespaces.push(json!({"type": "cgroup"}));
    }
    Ok(namespaces)
}

fn kind_name(kind: &str) -> &str {
    if kind == "net" {
        "network"
    } else {
        kind
    }
}

fn cgroup2() -> bool {
    Path::new("/sys/fs/cgroup/cgroup.controllers").exists()
}

/// A device node as the spec lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct DeviceNode {
    path: String,
    kind: &'static str,
    major: u64,
    minor: u64,
    mode: u32,
    uid: u32,
    gid: u32,
}

impl DeviceNode {
    fn from_metadata(path: String, md: &std::fs::Metadata) -> Option<DeviceNode> {
        let ft = md.file_type();
        let kind = if ft.is_char_device() {
            "c"
        } else if ft.is_block_device() {
            "b"
        } else {
            return None;
        };
        Some(DeviceNode {
            path,
            kind,
            major: nix::sys::stat::major(md.rdev()),
            minor: nix::sys::stat::minor(md.rdev()),
            mode: md.mode() & 0o7777,
            uid: md.uid(),
            gid: md.gid(),
        })
    }

    fn spec(&self) -> Value {
        json!({
            "path": self.path, "type": self.kind, "major": self.major, "minor": self.minor,
            "fileMode": self.mode, "uid": self.uid, "gid": self.gid,
        })
    }
}

/// (linux.devices, linux.resources.devices): deny all, then runc's defaults (or everything for
/// a privileged container, with every host device), then each requested device.
fn container_devices(requested: &[api::Device], privileged: bool) -> Result<(Vec<Value>, Vec<Value>), SpecError> {
    let mut nodes = Vec::new();
    let mut rules = vec![json!({"allow": false, "access": "rwm"})];
    if privileged {
        host_devices(Path::new("/dev"), Path::new("/dev"), "/dev", true, &mut nodes)
            .map_err(|e| SpecError::Host(format!("listing the host's devices: {e}")))?;
        rules.push(json!({"allow": true, "access": "rwm"}));
    } else {
        rules.extend(default_device_rules());
    }
    for d in requested {
        let access = device_access(&d.permissions)?;
        for node in requested_device(d)? {
            rules.push(
                json!({"allow": true, "type": node.kind, "major": node.major, "minor": node.minor, "access": access}),
            );
            nodes.push(node);
        }
    }
    // A requested device replaces a host device at the same path.
    let mut seen = HashSet::new();
    let mut unique: Vec<DeviceNode> = nodes
        .into_iter()
        .rev()
        .filter(|n| seen.insert(n.path.clone()))
        .collect();
    unique.reverse();
    Ok((unique.iter().map(DeviceNode::spec).collect(), rules))
}

/// runc's allowed devices: mknod of anything, null, zero, full, tty, random, urandom, ptmx, pts.
fn default_device_rules() -> Vec<Value> {
    let mut rules = vec![
        json!({"allow": true, "type": "c", "access": "m"}),
        json!({"allow": true, "type": "b", "access": "m"}),
    ];
    for (major, minor) in [(1, 3), (1, 5), (1, 7), (5, 0), (1, 8), (1, 9), (5, 2)] {
        rules.push(json!({"allow": true, "type": "c", "major": major, "minor": minor, "access": "rwm"}));
    }
    rules.push(json!({"allow": true, "type": "c", "major": 136, "access": "rwm"}));
    rules
}

/// "" means "rwm"; otherwise a subset of `rwm`, each letter once.
fn device_access(permissions: &str) -> Result<String, SpecError> {
    if permissions.is_empty() {
        return Ok("rwm".into());
    }
    let mut seen = HashSet::new();
    for c in permissions.chars() {
        if !matches!(c, 'r' | 'w' | 'm') || !seen.insert(c) {
            return Err(SpecError::Invalid(format!(
                "device permissions {permissions:?} must be a subset of \"rwm\""
            )));
        }
    }
    Ok(permissions.to_string())
}

/// The device node(s) of a CRI Device: one for a device file, every device below a directory.
fn requested_device(d: &api::Device) -> Result<Vec<DeviceNode>, SpecError> {
    if !d.host_path.starts_with('/') {
        return Err(SpecError::Invalid(format!(
            "device host_path {:?} must be an absolute path",
            d.host_path
        )));
    }
    let container = if d.container_path.is_empty() {
        &d.host_path
    } else {
        &d.container_path
    };
    if !container.starts_with('/') {
        return Err(SpecError::Invalid(format!(
            "device container_path {container:?} must be an absolute path"
        )));
    }
    let container = clean_absolute(container);
    let invalid = |e: std::io::Error| SpecError::Invalid(format!("device {}: {e}", d.host_path));
    let host = std::fs::canonicalize(&d.host_path).map_err(invalid)?;
    let md = std::fs::metadata(&host).map_err(invalid)?;
    if md.is_dir() {
        let mut nodes = Vec::new();
        host_devices(&host, &host, &container, false, &mut nodes).map_err(invalid)?;
        return Ok(nodes);
    }
    DeviceNode::from_metadata(container, &md)
        .map(|n| vec![n])
        .ok_or_else(|| SpecError::Invalid(format!("device {} is not a character or block device", d.host_path)))
}

/// Every device below `dir` (not following symlinks), at `prefix` + its path below `root`.
fn host_devices(
    root: &Path,
    dir: &Path,
    prefix: &str,
    skip_runc: bool,
    out: &mut Vec<DeviceNode>,
) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.filter_map(Result::ok).collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let Ok(md) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let name = entry.file_name();
        let name = name.to_string_lossy();
        if md.is_dir() {
            if !(skip_runc && HOST_DEV_SKIP.contains(&name.as_ref())) {
                host_devices(root, &path, prefix, skip_runc, out)?;
            }
            continue;
        }
        if skip_runc && name == "console" {
            continue;
        }
        let below = path.strip_prefix(root).unwrap_or(&path);
        let container = format!("{}/{}", prefix.trim_end_matches('/'), below.display());
        if let Some(node) = DeviceNode::from_metadata(container, &md) {
            out.push(node);
        }
    }
    Ok(())
}

/// linux.resources: the device rules, CPU, memory (swap = limit unless asked otherwise, when
/// the host has a swap controller), hugepages (when the host has hugetlb), unified.
fn linux_resources(r: Option<&api::LinuxContainerResources>, device_rules: Vec<Value>) -> Value {
    let mut out = json!({"devices": device_rules});
    let Some(r) = r else {
        return out;
    };
    let mut cpu = Map::new();
    if r.cpu_shares > 0 {
        cpu.insert("shares".into(), json!(r.cpu_shares));
    }
    if r.cpu_quota != 0 {
        cpu.insert("quota".into(), json!(r.cpu_quota));
    }
    if r.cpu_period > 0 {
        cpu.insert("period".into(), json!(r.cpu_period));
    }
    if !r.cpuset_cpus.is_empty() {
        cpu.insert("cpus".into(), json!(r.cpuset_cpus));
    }
    if !r.cpuset_mems.is_empty() {
        cpu.insert("mems".into(), json!(r.cpuset_mems));
    }
    if !cpu.is_empty() {
        out["cpu"] = Value::Object(cpu);
    }
    let mut memory = Map::new();
    if r.memory_limit_in_bytes != 0 {
        memory.insert("limit".into(), json!(r.memory_limit_in_bytes));
        if r.memory_swap_limit_in_bytes == 0 && swap_controller() {
            memory.insert("swap".into(), json!(r.memory_limit_in_bytes));
        }
    }
    if r.memory_swap_limit_in_bytes != 0 && swap_controller() {
        memory.insert("swap".into(), json!(r.memory_swap_limit_in_bytes));
    }
    if !memory.is_empty() {
        out["memory"] = Value::Object(memory);
    }
    if !r.hugepage_limits.is_empty() && hugetlb_controller() {
        let limits: Vec<Value> = r
            .hugepage_limits
            .iter()
            .map(|h| json!({"pageSize": h.page_size, "limit": i64::try_from(h.limit).unwrap_or(i64::MAX)}))
            .collect();
        out["hugepageLimits"] = json!(limits);
    }
    if !r.unified.is_empty() {
        let unified: BTreeMap<&String, &String> = r.unified.iter().collect();
        out["unified"] = json!(unified);
    }
    out
}

/// linux.resources as `container_spec` builds it from `r`, without device rules, typed: what
/// UpdateContainerResources applies to a created or running container.
pub fn update_resources(r: &api::LinuxContainerResources) -> Result<oci_spec::runtime::LinuxResources, SpecError> {
    let mut v = linux_resources(Some(r), Vec::new());
    if let Some(fields) = v.as_object_mut() {
        fields.remove("devices");
    }
    serde_json::from_value(v).map_err(|e| SpecError::Invalid(format!("container resources: {e}")))
}

/// Whether memory.swap (v2: memory.swap.max; v1: memsw) can be set on this host.
fn swap_controller() -> bool {
    static SWAP: OnceLock<bool> = OnceLock::new();
    *SWAP.get_or_init(|| {
        let root = Path::new("/sys/fs/cgroup");
        if !cgroup2() {
            return root.join("memory/memory.memsw.limit_in_bytes").exists();
        }
        let own = std::fs::read_to_string("/proc/self/cgroup").ok().and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("0::").map(|p| p.trim().to_string()))
        });
        match own {
            Some(p) if p != "/" && root.join(p.trim_start_matches('/')).join("memory.swap.max").exists() => true,
            _ => std::fs::read_dir(root)
                .into_iter()
                .flatten()
                .flatten()
                .any(|e| e.path().join("memory.swap.max").exists()),
        }
    })
}

fn hugetlb_controller() -> bool {
    static HUGETLB: OnceLock<bool> = OnceLock::new();
    *HUGETLB.get_or_init(|| {
        if cgroup2() {
            std::fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
                .is_ok_and(|c| c.split_whitespace().any(|c| c == "hugetlb"))
        } else {
            Path::new("/sys/fs/cgroup/hugetlb").exists()
        }
    })
}

/// The container's annotations, then containerd's CRI annotations (which win).
fn container_annotations(s: &ContainerSpec<'_>) -> BTreeMap<String, String> {
    let mut out: BTreeMap<String, String> = s
        .config
        .annotations
        .iter()
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    let meta = s.sandbox.metadata.clone().unwrap_or_default();
    let sandbox_id = s
        .sandbox_dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    for (k, v) in [
        (ANNOTATION_CONTAINER_TYPE, "container".to_string()),
        (ANNOTATION_SANDBOX_ID, sandbox_id),
        (ANNOTATION_SANDBOX_NAME, meta.name),
        (ANNOTATION_SANDBOX_NAMESPACE, meta.namespace),
        (ANNOTATION_SANDBOX_UID, meta.uid),
        (
            ANNOTATION_CONTAINER_NAME,
            s.config.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default(),
        ),
        (
            ANNOTATION_IMAGE_NAME,
            s.config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default(),
        ),
    ] {
        out.insert(k.to_string(), v);
    }
    out
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

#[cfg(test)]
mod container_tests {
    use std::collections::HashMap;
    use std::fs;

    use super::*;
    use api::security_profile::ProfileType;

    struct Fixture {
        _dir: tempfile::TempDir,
        root: PathBuf,
        rootfs: PathBuf,
        sandbox_dir: PathBuf,
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
        assert_eq!(
            out.is_empty(),
            !cgroup2() && !Path::new("/sys/fs/cgroup/memory").exists()
        );
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
        let info = parse_mountinfo(
            "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n\
             30 22 0:5 / /mnt/private rw - tmpfs tmpfs rw\n\
             31 22 0:6 / /mnt/slave rw master:7 - tmpfs tmpfs rw\n\
             32 22 0:7 / /mnt/with\\040space rw shared:9 master:2 - tmpfs tmpfs rw\n",
        );
        assert_eq!(info[3].mountpoint, Path::new("/mnt/with space"));
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
        let shared = ensure_propagation(&host, true, &read_mountinfo()).is_ok();
        match build(&f, &c) {
            Ok(v) => {
                assert!(shared);
                assert_eq!(strings(&mount(&v, "/shared")[0]["options"]), ["rbind", "rshared", "rw"]);
                assert_eq!(v["linux"]["rootfsPropagation"], "shared");
            }
            Err(e) => assert!(!shared && matches!(e, SpecError::Host(_)), "{e}"),
        }
        c.mounts[0].propagation = MountPropagation::PropagationHostToContainer as i32;
        let slave = ensure_propagation(&host, false, &read_mountinfo()).is_ok();
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
        assert_eq!(cgroupns, cgroup2());
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
        ALL_CAPABILITIES[..=last_cap()].iter().map(|c| c.to_string()).collect()
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
            capabilities_with(&sc, privileged, &held)
        };
        let (set, _) = with(&[], &[], false).unwrap();
        assert_eq!(set.len(), DEFAULT_CAPABILITIES.len() - 1, "NET_RAW is left out");
        assert!(!set.contains(&13));
        let (set, _) = with(&["ALL"], &[], false).unwrap();
        assert_eq!(set, held.iter().copied().filter(|&c| c <= last_cap()).collect());
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
        let mountinfo = "\
31 27 0:28 / /sys/fs/cgroup ro,nosuid,nodev,noexec - tmpfs tmpfs ro,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid,nodev,noexec,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,memory
36 31 0:33 /docker/abc /sys/fs/cgroup/pids rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,pids
40 31 0:37 /user.slice /sys/fs/cgroup/systemd rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/misc rw,nosuid,nodev,noexec,relatime - cgroup cgroup rw,misc
42 31 0:39 / /sys/fs/cgroup/unified rw,nosuid,nodev,noexec,relatime - cgroup2 cgroup2 rw
43 27 0:40 / /mnt/other rw - cgroup cgroup rw,pids
";
        let own = "12:misc:/\n9:name=systemd:/user.slice/user-0.slice/session-1.scope\n4:memory:/daemon\n1:cpu,cpuacct:/daemon\n0::/daemon\n";
        let links = [
            ("cpu".to_string(), "cpu,cpuacct".to_string()),
            ("cpuacct".to_string(), "cpu,cpuacct".to_string()),
            ("net_cls".to_string(), "net_cls,net_prio".to_string()),
        ];
        let mounts = cgroup_v1_mounts("/kubepods/pod1/c1", "ro", mountinfo, own, &links);
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
        let rw = cgroup_v1_mounts("/c", "rw", mountinfo, own, &[]);
        assert!(strings(&rw[1]["options"]).contains(&"rw".to_string()));
        assert_eq!(cgroup_v1_mounts("/c", "ro", "", "", &[]).len(), 1, "just the tmpfs");
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
        assert_eq!(r["memory"].get("swap").is_some(), swap_controller());
        if swap_controller() {
            assert_eq!(r["memory"]["swap"], 64 << 20, "no swap beyond the limit by default");
        }
        assert_eq!(r.get("hugepageLimits").is_some(), hugetlb_controller());
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
}
