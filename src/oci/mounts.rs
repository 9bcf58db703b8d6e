//! A container's mounts: the defaults (proc, dev, sys, cgroup), the pod's files, the CRI mounts
//! with their propagation checked against the host's mount table.

use std::collections::HashSet;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use oci_spec::runtime::Mount as SpecMount;

use scute_sys::mountinfo::{self, Mount};

use super::ContainerSpec;
use super::{clean_absolute, default_mounts, mount, HostFacts, SpecError};
use crate::api;
use crate::api::MountPropagation;

/// The files under /proc a mount may cover: those lxcfs emulates (libcontainer 0.7's
/// `check_proc_mount` list, runc's `checkProcMount`).
const LXCFS_PROC_FILES: &[&str] = &[
    "/proc/cpuinfo",
    "/proc/diskstats",
    "/proc/meminfo",
    "/proc/stat",
    "/proc/swaps",
    "/proc/uptime",
    "/proc/loadavg",
    "/proc/slabinfo",
    "/proc/sys/kernel/ns_last_pid",
    "/proc/sys/crypto/fips_enabled",
];
/// Whether a mount on `destination` (clean, absolute, as the container sees it) would cover
/// procfs: anything in /proc but the files lxcfs emulates.
pub fn covers_procfs(destination: &str) -> bool {
    (destination == "/proc" || destination.starts_with("/proc/")) && !LXCFS_PROC_FILES.contains(&destination)
}

/// A bind mount before its source is checked: the kubelet's, or one of the pod's files.
pub(super) struct BindMount {
    pub(super) destination: String,
    pub(super) source: PathBuf,
    pub(super) readonly: bool,
    pub(super) recursive_readonly: bool,
    pub(super) propagation: MountPropagation,
    /// A CRI mount whose missing source is created; the pod's files are skipped when missing.
    pub(super) create: bool,
    pub(super) extra_options: &'static [&'static str],
}

/// The default mounts, then the kubelet's and the pod's bind mounts sorted by depth (a parent
/// before what is mounted under it); a bind mount replaces a default at the same destination,
/// and a /dev mount all defaults under /dev. Returns the mounts and the rootfs propagation
/// that rshared/rslave binds need (`private` when none does), spelled the OCI way
/// (`shared`/`slave`/`private`: libcontainer always applies it recursively and refuses runc's
/// `rshared`/`rslave`).
pub(super) fn container_mounts(
    s: &ContainerSpec<'_>,
    sc: &api::LinuxContainerSecurityContext,
    privileged: bool,
) -> Result<(Vec<SpecMount>, Option<&'static str>), SpecError> {
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
    let mut mounts: Vec<SpecMount> = default_mounts(sys_mode)?
        .into_iter()
        .chain(cgroup_mounts(&s.cgroups_path, sys_mode, s.host)?)
        .filter(|m| {
            let d = m.destination().to_string_lossy();
            let d = d.as_ref();
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
    let mut mountinfo: Option<Vec<Mount>> = None;
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
                ensure_propagation(
                    &source,
                    true,
                    mountinfo.get_or_insert_with(|| mountinfo::read().unwrap_or_default()),
                )?;
                options.push("rshared");
                rootfs_propagation = Some("shared");
            }
            MountPropagation::PropagationHostToContainer => {
                ensure_propagation(
                    &source,
                    false,
                    mountinfo.get_or_insert_with(|| mountinfo::read().unwrap_or_default()),
                )?;
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
        mounts.push(mount(&b.destination, "bind", source, &options)?);
    }
    Ok((mounts, rootfs_propagation))
}

/// The v1 controllers libcontainer's cgroupfs manager puts a container in (libcgroups
/// `v1::CONTROLLERS`): a hierarchy with one of them holds the container at its cgroups path.
pub(super) const LIBCONTAINER_V1_CONTROLLERS: &[&str] = &[
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
pub(super) fn cgroup_mounts(cgroups_path: &str, mode: &str, host: &HostFacts) -> Result<Vec<SpecMount>, SpecError> {
    if host.cgroup2 {
        return Ok(vec![mount(
            "/sys/fs/cgroup",
            "cgroup",
            "cgroup",
            &["nosuid", "noexec", "nodev", "relatime", mode],
        )?]);
    }
    let v1 = &host.v1;
    cgroup_v1_mounts(cgroups_path, mode, &v1.mounts, &v1.own_cgroup, &v1.links)
}

/// `cgroup_mounts` on a v1 host, from the daemon's mountinfo and /proc/self/cgroup and the
/// symlinks of the host's /sys/fs/cgroup (`cpu` → `cpu,cpuacct`; bound as directories).
pub(super) fn cgroup_v1_mounts(
    cgroups_path: &str,
    mode: &str,
    host_mounts: &[Mount],
    own_cgroup: &str,
    links: &[(String, String)],
) -> Result<Vec<SpecMount>, SpecError> {
    let mut mounts = vec![mount(
        "/sys/fs/cgroup",
        "tmpfs",
        "tmpfs",
        &["nosuid", "noexec", "nodev", "mode=755"],
    )?];
    let mut seen = HashSet::new();
    for m in host_mounts.iter().filter(|m| m.fstype == "cgroup") {
        let mountpoint = &m.mount_point;
        if mountpoint.parent() != Some(Path::new("/sys/fs/cgroup")) {
            continue;
        }
        let Some(name) = mountpoint.file_name().map(|n| n.to_string_lossy().into_owned()) else {
            continue;
        };
        let options: Vec<&str> = m.super_options.split(',').collect();
        let managed = options.iter().any(|o| LIBCONTAINER_V1_CONTROLLERS.contains(o));
        let root = &m.root;
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
            mounts.push(mount(
                &format!("/sys/fs/cgroup/{n}"),
                "bind",
                &source,
                &["rbind", "rprivate", "nosuid", "noexec", "nodev", mode],
            )?);
        }
    }
    Ok(mounts)
}

pub(super) fn cri_mount(m: &api::Mount) -> Result<BindMount, SpecError> {
    if !m.container_path.starts_with('/') {
        return Err(SpecError::Invalid(format!(
            "mount container_path {:?} must be an absolute path",
            m.container_path
        )));
    }
    let destination = clean_absolute(&m.container_path);
    // A bind over procfs redirects what the runtime writes there while it sets the container up
    // (sysctls, oom_score_adj, the LSM label) into the bind's source (the runc CVE-2025-52565 /
    // CVE-2025-52881 class). Only the read-only files lxcfs emulates may be covered, as runc and
    // libcontainer allow; the rest is refused here with the field named (libcontainer would
    // refuse it later, as an internal error).
    if covers_procfs(&destination) {
        return Err(SpecError::Invalid(format!(
            "mount container_path {:?} is in /proc: refused (a mount there would receive what the runtime writes to procfs; only {} may be covered)",
            m.container_path,
            LXCFS_PROC_FILES.join(", ")
        )));
    }
    // An image volume: the daemon mounted the image's read-only view and put its path (or
    // its sub-path's) in host_path; it is bound read-only, nosuid and nodev, never created.
    let image_volume = m.image.as_ref().is_some_and(|i| !i.image.is_empty());
    if m.host_path.is_empty() {
        return Err(SpecError::Invalid(if image_volume {
            format!("image volume at {destination} has no view (the daemon stages it before the spec)")
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
        readonly: m.readonly || image_volume,
        recursive_readonly: m.recursive_read_only,
        propagation,
        create: !image_volume,
        extra_options: if image_volume { &["nosuid", "nodev"] } else { &[] },
    })
}

/// containerd's ensureShared / ensureSharedOrSlave: the host mount holding `path` must
/// propagate to the container (shared; or a slave, for HOST_TO_CONTAINER).
pub(super) fn ensure_propagation(path: &Path, shared_only: bool, mounts: &[Mount]) -> Result<(), SpecError> {
    let mount = mounts
        .iter()
        .filter(|m| path.starts_with(&m.mount_point))
        .max_by_key(|m| m.mount_point.components().count())
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
        mount.mount_point.display(),
        if shared_only { "" } else { " or slave" }
    )))
}
