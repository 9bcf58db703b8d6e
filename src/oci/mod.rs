//! OCI runtime specs (config.json) that the shim hands to libcontainer, built below the sandbox
//! and container managers: a pod container's spec in parts (process and user, mounts, devices,
//! capabilities, resources, seccomp, namespaces), each a function of the request and the host's
//! facts (`HostFacts`, gathered once at start, so unit tests pin a cgroup v1 or v2 host); the
//! pause container's spec lives with the sandbox code (`sandbox::spec`) and uses the shared parts
//! here. Every part is built with oci-spec's typed builders, so a misspelt field does not
//! compile (a `json!` literal would drop it silently at deserialisation).

mod capabilities;
mod container;
mod devices;
mod host;
mod mounts;
mod namespaces;
mod resources;
pub mod seccomp;
pub mod user;
pub mod userns;

#[cfg(test)]
mod tests;

pub(crate) use capabilities::capability_sets;
pub use container::{container_spec, process_args, security_warnings};
pub(crate) use devices::device_rule;
pub use host::{HostFacts, V1Cgroups};
pub use mounts::covers_procfs;
pub use namespaces::check_namespace_options;
pub(crate) use namespaces::namespace;
pub use resources::{check_resources, update_resources};

use std::path::{Component, Path, PathBuf};

use oci_spec::runtime::{LinuxIdMapping, LinuxIdMappingBuilder, Mount, MountBuilder};

use crate::api;
use crate::image::record::ImageConfig;
use crate::oci::userns::{IdRange, PodUserNs};

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
    /// oci-spec refused a value scute built (a bug in scute, not in the request).
    #[error("building the OCI spec: {0}")]
    Build(#[from] oci_spec::OciSpecError),
}

pub(crate) fn id_mapping(range: &IdRange) -> Result<LinuxIdMapping, SpecError> {
    Ok(LinuxIdMappingBuilder::default()
        .container_id(range.container_id)
        .host_id(range.host_id)
        .size(range.length)
        .build()?)
}

/// One entry of the spec's mounts.
pub(crate) fn mount(
    destination: &str,
    typ: &str,
    source: impl Into<PathBuf>,
    options: &[&str],
) -> Result<Mount, SpecError> {
    Ok(MountBuilder::default()
        .destination(destination)
        .typ(typ)
        .source(source)
        .options(options.iter().map(|o| o.to_string()).collect::<Vec<_>>())
        .build()?)
}

/// The mounts every container (pause included) starts from: proc, a tmpfs /dev with devpts and
/// mqueue, and sysfs, read-only unless `sys_mode` is "rw" (privileged).
pub(crate) fn default_mounts(sys_mode: &str) -> Result<Vec<Mount>, SpecError> {
    Ok(vec![
        mount("/proc", "proc", "proc", &["nosuid", "noexec", "nodev"])?,
        mount(
            "/dev",
            "tmpfs",
            "tmpfs",
            &["nosuid", "strictatime", "mode=755", "size=65536k"],
        )?,
        mount(
            "/dev/pts",
            "devpts",
            "devpts",
            &["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"],
        )?,
        mount("/dev/mqueue", "mqueue", "mqueue", &["nosuid", "noexec", "nodev"])?,
        mount("/sys", "sysfs", "sysfs", &["nosuid", "noexec", "nodev", sys_mode])?,
    ])
}

/// `uid[:gid]` of an image USER; names need the image's /etc/passwd, which the sandbox image
/// has no business needing.
pub(crate) fn numeric_user(user: &str) -> Result<(u32, u32), SpecError> {
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

/// The runtime-spec version scute's specs follow.
pub const OCI_VERSION: &str = "1.0.2";

/// oci-spec's builders start a process from runc's example (`sh`, TERM, RLIMIT_NOFILE 1024,
/// noNewPrivileges): of those, a built spec keeps only what scute set from the request.
pub(crate) fn clear_example_defaults(process: &mut oci_spec::runtime::Process) {
    process.set_rlimits(None);
}

/// The PATH a container gets when its image sets none.
pub const DEFAULT_PATH_ENV: &str = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

pub(crate) fn or_defaults(given: &[String], defaults: &[&str]) -> Vec<String> {
    if given.is_empty() {
        defaults.iter().map(|p| p.to_string()).collect()
    } else {
        given.to_vec()
    }
}

/// `/a//b/./c/../d/` → `/a/b/d` (lexically, like Go's filepath.Clean).
pub(crate) fn clean_absolute(path: &str) -> String {
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
    /// The host's cgroup layout and scute's capabilities, gathered when the daemon started.
    pub host: &'a HostFacts,
}
