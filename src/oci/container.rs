//! A pod container's spec (CreateContainer), composed of the parts in the sibling modules, with
//! the kubelet's semantics as containerd's CRI plugin implements them: command/args over the
//! image's Entrypoint/Cmd, env, user, working dir, annotations, oom_score_adj.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use oci_spec::runtime::{LinuxBuilder, Mount, ProcessBuilder, RootBuilder, Spec, SpecBuilder, UserBuilder};

use super::capabilities::{capabilities, capability_sets, ALL_CAPABILITIES};
use super::devices::container_devices;
use super::mounts::container_mounts;
use super::namespaces::container_namespaces;
use super::resources::linux_resources;
use super::{
    clear_example_defaults, or_defaults, seccomp, user, ContainerSpec, SpecError, DEFAULT_MASKED_PATHS,
    DEFAULT_PATH_ENV, DEFAULT_READONLY_PATHS, OCI_VERSION,
};
use crate::api;
use crate::image::record::ImageConfig;

pub const ANNOTATION_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";

pub const ANNOTATION_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";

pub const ANNOTATION_SANDBOX_NAME: &str = "io.kubernetes.cri.sandbox-name";

pub const ANNOTATION_SANDBOX_NAMESPACE: &str = "io.kubernetes.cri.sandbox-namespace";

pub const ANNOTATION_SANDBOX_UID: &str = "io.kubernetes.cri.sandbox-uid";

pub const ANNOTATION_CONTAINER_NAME: &str = "io.kubernetes.cri.container-name";

pub const ANNOTATION_IMAGE_NAME: &str = "io.kubernetes.cri.image-name";

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

    let args = process_args(&s.config.command, &s.config.args, s.image)?;
    let env = container_env(s.image, &s.config.envs, &env_hostname(s.sandbox));
    let cwd = working_dir(s.config, s.image)?;
    let user = user::resolve(&s.rootfs, Some(sc), &s.image.user, s.userns.as_ref())?;
    let (caps, ambient) = capabilities(sc, privileged, s.host)?;
    let cap_names: Vec<&str> = caps.iter().map(|&i| ALL_CAPABILITIES[i]).collect();
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

    let user = UserBuilder::default()
        .uid(user.uid)
        .gid(user.gid)
        .additional_gids(user.additional_gids)
        .build()?;
    let mut process = ProcessBuilder::default()
        .terminal(s.config.tty)
        .user(user)
        .args(args)
        .env(env)
        .cwd(cwd)
        .capabilities(capability_sets(&caps, &ambient)?)
        .oom_score_adj(oom_score_adj(resources, s.oom_score_adj_floor))
        .build()?;
    // libcontainer treats a present `false` as set (and then loads seccomp after dropping
    // privileges, which fails for non-root users): only ever write `true`.
    process.set_no_new_privileges(sc.no_new_privs.then_some(true));
    clear_example_defaults(&mut process);

    let mut linux = LinuxBuilder::default()
        .namespaces(namespaces)
        .cgroups_path(&s.cgroups_path)
        .resources(linux_resources(resources, device_rules, s.host)?)
        .devices(devices)
        .masked_paths(masked)
        .readonly_paths(readonly);
    if let Some(seccomp) = seccomp {
        linux = linux.seccomp(seccomp);
    }
    if let Some(propagation) = rootfs_propagation {
        linux = linux.rootfs_propagation(propagation);
    }
    let mut spec = SpecBuilder::default()
        .version(OCI_VERSION)
        .process(process)
        .root(
            RootBuilder::default()
                .path(&s.rootfs)
                .readonly(sc.readonly_rootfs)
                .build()?,
        )
        .mounts(mounts)
        .annotations(container_annotations(s).into_iter().collect::<HashMap<_, _>>())
        .linux(linux.build()?)
        .build()?;
    // Joined from pause (which set it); a host-network container keeps the host's UTS namespace.
    let hostname = (!s.host_network && !s.sandbox.hostname.is_empty()).then(|| s.sandbox.hostname.clone());
    spec.set_hostname(hostname);
    Ok(spec)
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

pub(super) fn sandbox_privileged(sandbox: &api::PodSandboxConfig) -> bool {
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
pub(super) fn env_hostname(sandbox: &api::PodSandboxConfig) -> String {
    if !sandbox.hostname.is_empty() {
        return sandbox.hostname.clone();
    }
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// Default PATH, HOSTNAME, then the image's env, then the container's: a later value of a key
/// replaces an earlier one in place; an image entry without `=` unsets the key (containerd).
pub(super) fn container_env(image: &ImageConfig, envs: &[api::KeyValue], hostname: &str) -> Vec<String> {
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

pub(super) fn working_dir(config: &api::ContainerConfig, image: &ImageConfig) -> Result<String, SpecError> {
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
    // /proc/self/fd/N and /proc/<pid>/cwd name whatever the starting process holds: with a
    // leaked directory descriptor that is the host (runc CVE-2024-21626). No workload works
    // from /proc; refused plainly rather than left to the runtime's chdir.
    if super::clean_absolute(cwd).split('/').nth(1) == Some("proc") {
        return Err(SpecError::Invalid(format!(
            "working directory {cwd:?} is under /proc: refused (a descriptor path there can name a directory outside the container)"
        )));
    }
    Ok(cwd.to_string())
}

/// A working directory the image does not have is created in the container's rootfs (its
/// writable layer), as runc and Docker do and libcontainer does not (its chdir fails). One under
/// a mount is left alone: it is not the rootfs's to create.
pub(super) fn ensure_working_dir(rootfs: &Path, cwd: &str, mounts: &[Mount]) -> Result<(), SpecError> {
    let cwd_path = Path::new(cwd);
    let under_mount = mounts
        .iter()
        .map(|m| m.destination())
        .any(|d| d != Path::new("/") && cwd_path.starts_with(d));
    if cwd == "/" || under_mount {
        return Ok(());
    }
    user::ensure_dir_in_root(rootfs, cwd).map(|_| ()).map_err(|e| {
        SpecError::Invalid(format!(
            "working directory {cwd:?}: cannot create it in the container: {e}"
        ))
    })
}

pub(super) fn oom_score_adj(resources: Option<&api::LinuxContainerResources>, floor: i32) -> i32 {
    let requested = resources.map_or(0, |r| r.oom_score_adj);
    let floor = i64::from(floor.clamp(-1000, 1000));
    // In -1000..=1000 after the clamp.
    requested.clamp(floor, 1000) as i32
}

/// The container's annotations, then containerd's CRI annotations (which win).
pub(super) fn container_annotations(s: &ContainerSpec<'_>) -> BTreeMap<String, String> {
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
