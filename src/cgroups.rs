//! Where pods and containers get their cgroups, for each cgroup driver.
//!
//! The OCI spec's `linux.cgroupsPath` takes the driver's form, and so do the store's records:
//!
//! - cgroupfs: a path, `<cgroup_parent>/scute-<id>` (`/kubepods/burstable/pod<uid>/scute-<id>`);
//! - systemd: `<slice>:scute:<id>`, which libcontainer (youki's libcgroups) turns into the
//!   transient unit `scute-<id>.scope` with `Delegate=yes` in the pod's slice, started through
//!   systemd's D-Bus API (`kubepods-burstable-pod<uid>.slice:scute:<id>` is the cgroup
//!   `/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<uid>.slice/scute-<id>.scope`).
//!
//! Whoever reads cgroup files (stats, cleanup) wants the cgroupfs path either way: [`dir`].

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use crate::config::CgroupDriver;

/// The parent of pods the kubelet gave none (critest, crictl): every such pod shares it.
pub const DEFAULT_CGROUPFS_PARENT: &str = "/scute";
/// The systemd driver's default parent, as runc's (scopes in it need no slice of their own).
pub const DEFAULT_SLICE: &str = "system.slice";
/// The prefix of scute's cgroups: `scute-<id>` dirs, `scute-<id>.scope` units.
const PREFIX: &str = "scute";
/// The prefix of shims' cgroups: `scute-shim-<id>` dirs, `scute-shim-<id>.scope` units.
const SHIM_PREFIX: &str = "scute-shim";

/// The cgroups path of a pod member (pause or a container) with ID `id` under the kubelet's
/// `cgroup_parent` (empty: the driver's default), in the driver's form. The parent must be the
/// driver's kind: an absolute cgroupfs path, or a systemd slice name.
pub fn member_path(driver: CgroupDriver, parent: &str, id: &str) -> Result<String, String> {
    match driver {
        CgroupDriver::Cgroupfs => {
            let parent = if parent.is_empty() {
                DEFAULT_CGROUPFS_PARENT
            } else {
                parent.trim_end_matches('/')
            };
            if !parent.starts_with('/') || parent.split('/').any(|c| c == "..") {
                return Err(format!(
                    "cgroup_parent {parent:?} must be an absolute cgroupfs path (the cgroupfs driver is configured)"
                ));
            }
            Ok(format!("{parent}/{PREFIX}-{id}"))
        }
        CgroupDriver::Systemd => {
            // The slice's name; a slice's cgroupfs path (critest's "/test.slice") names its last
            // slice, as containerd and CRI-O read it.
            let slice = match parent.trim_end_matches('/').rsplit('/').next() {
                Some(name) if !name.is_empty() => name,
                _ => DEFAULT_SLICE,
            };
            if expand_slice(slice).is_none() {
                return Err(format!(
                    "cgroup_parent {parent:?} must be a systemd slice name such as \
                     kubepods-burstable-pod<uid>.slice (the systemd cgroup driver is configured)"
                ));
            }
            Ok(format!("{slice}:{PREFIX}:{id}"))
        }
    }
}

/// Whose a cgroup is, by its directory's name as this module makes them (`scute-<id>`,
/// `scute-shim-<32 hex>`, either with `.scope` under systemd).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Owner {
    /// A pod member (pause or a container), by its ID (64 hex digits).
    Member(String),
    /// A pod's shim, by the first 32 hex digits of the pod's ID.
    Shim(String),
}

impl Owner {
    /// The owner a cgroup directory's name says, if it is one of scute's.
    pub fn of(name: &str) -> Option<Owner> {
        let name = name.strip_suffix(".scope").unwrap_or(name);
        let id = |prefix: &str, len: usize| {
            let id = name.strip_prefix(prefix)?.strip_prefix('-')?;
            (id.len() == len && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
        };
        if name.starts_with(&format!("{SHIM_PREFIX}-")) {
            return id(SHIM_PREFIX, 32).map(Owner::Shim);
        }
        id(PREFIX, 64).map(Owner::Member)
    }
}

/// The cgroups path of container `id`, beside the pod's pause (same parent, same form).
pub fn sibling(pod_member: &str, id: &str) -> String {
    beside(pod_member, PREFIX, id)
}

/// The cgroups path of the shim of sandbox `sandbox_id`, beside the pod's pause: its memory is
/// the pod's (`scute-shim-<id>`, with 32 hex digits of the ID: a unit name holds at most 255
/// bytes, and 128 random bits suffice).
pub fn shim_path(pod_member: &str, sandbox_id: &str) -> String {
    beside(pod_member, SHIM_PREFIX, &sandbox_id[..sandbox_id.len().min(32)])
}

fn beside(pod_member: &str, prefix: &str, id: &str) -> String {
    match pod_member.split_once(':') {
        Some((slice, _)) if !pod_member.starts_with('/') => format!("{slice}:{prefix}:{id}"),
        _ => match pod_member.rsplit_once('/') {
            Some((parent, _)) => format!("{parent}/{prefix}-{id}"),
            None => format!("{DEFAULT_CGROUPFS_PARENT}/{prefix}-{id}"),
        },
    }
}

/// The cgroupfs path (below the hierarchy's root) of a cgroups path in either form.
pub fn dir(cgroups_path: &str) -> String {
    match systemd_parts(cgroups_path) {
        Some((slice, prefix, name)) => {
            let parent = expand_slice(slice).unwrap_or_default();
            let unit = if name.ends_with(".slice") {
                name.to_string()
            } else {
                format!("{prefix}-{name}.scope")
            };
            format!("{}/{unit}", parent.trim_end_matches('/'))
        }
        None => cgroups_path.to_string(),
    }
}

/// The directories of the cgroup at cgroupfs path `dir` (from [`dir`]): on cgroup v2 the one
/// under /sys/fs/cgroup; otherwise one per hierarchy mounted there (each v1 controller, and the
/// unified one of a hybrid host). Most do not exist for a given cgroup; nothing for the root or
/// a path that climbs.
fn hierarchy_dirs(dir: &str) -> Vec<PathBuf> {
    let relative = dir.trim_start_matches('/');
    if relative.is_empty() || relative.split('/').any(|c| c == "..") {
        return Vec::new();
    }
    let root = Path::new("/sys/fs/cgroup");
    if unified_only() {
        // Its entries are cgroups, not hierarchies.
        return vec![root.join(relative)];
    }
    std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .map(|hierarchy| hierarchy.path())
        .filter(|hierarchy| scute_sys::mountinfo::is_mountpoint(hierarchy))
        .map(|hierarchy| hierarchy.join(relative))
        .collect()
}

pub(crate) use scute_sys::cgroupfs::{procs_below, subtree};

/// SIGKILLs every process left in the cgroup of a pod member (pause or a container) whose shim
/// died, and below it: libcontainer's delete, which would do it, runs in the shim. Returns how
/// many it signalled. By hand: libcgroups is the shim's, and this is a read and a kill.
pub fn kill_all(cgroups_path: &str) -> usize {
    let cgroup = dir(cgroups_path);
    let dirs = hierarchy_dirs(&cgroup);
    let killed = procs_below(&dirs)
        .into_iter()
        .filter(|&pid| kill_member(pid, &cgroup))
        .count();
    // cgroup v2 (Linux 5.14+) kills the whole subtree at once, forks included.
    for dir in dirs {
        let _ = std::fs::write(dir.join("cgroup.kill"), "1");
    }
    killed
}

/// SIGKILLs `pid` if it is in the cgroup at `cgroup` or below. Through a pidfd opened before
/// that check, so a pid reused meanwhile is never hit; before Linux 5.3 (no pidfds), with
/// kill(2) right after the check, which leaves that race open for a moment (runc freezes the
/// cgroup to close it).
fn kill_member(pid: i32, cgroup: &str) -> bool {
    match scute_sys::pidfd::open(pid) {
        Ok(pidfd) => in_cgroup(pid, cgroup) && scute_sys::pidfd::send_signal(pidfd.as_fd(), libc::SIGKILL).is_ok(),
        Err(e) if e.raw_os_error() == Some(libc::ENOSYS) => {
            use nix::sys::signal::{kill, Signal};
            in_cgroup(pid, cgroup) && kill(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL).is_ok()
        }
        Err(_) => false, // exited meanwhile
    }
}

/// Whether process `pid` is in the cgroup at `dir`, or below it, in some hierarchy
/// (/proc/<pid>/cgroup).
fn in_cgroup(pid: i32, dir: &str) -> bool {
    let within = |path: &str| {
        path.strip_prefix(dir)
            .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
    };
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
        .is_ok_and(|lines| lines.lines().any(|l| l.splitn(3, ':').nth(2).is_some_and(within)))
}

/// Waits until no process is left in the cgroup at `cgroups_path` or below it (after
/// [`kill_all`]: the killed exit and are reaped by init), up to `timeout`. True if it emptied.
pub async fn until_empty(cgroups_path: &str, timeout: std::time::Duration) -> bool {
    let cgroup = dir(cgroups_path);
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if procs_below(&hierarchy_dirs(&cgroup)).is_empty() {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// Removes the cgroup of a pod member whose shim died and the cgroups it made below it, in
/// every hierarchy, where empty.
pub fn remove_tree(cgroups_path: &str) {
    for dir in hierarchy_dirs(&dir(cgroups_path)).iter().flat_map(|d| subtree(d)) {
        rmdir(&dir);
    }
}

/// Removes the cgroup at cgroupfs path `dir` in every hierarchy, where it is empty (a pod's own
/// `/parent/scute-<id>`, a container's whose shim died, or the shared default parent).
pub fn remove_dirs(dir: &str) {
    for dir in hierarchy_dirs(dir) {
        rmdir(&dir);
    }
}

/// rmdir of a cgroup, retried while the kernel answers EBUSY: a process killed a moment ago
/// keeps its cgroup populated until it is reaped and its css goes offline, which on a busy node
/// outlasts the kill (a pod's pause cgroup was left behind so). runc retries the same way (5
/// tries, 10 ms doubling: 310 ms at most). Any other error (ENOENT: gone already) is left to the
/// callers, and so is a cgroup with a child cgroup: the kernel answers EBUSY for it too, and no
/// wait makes the child go (the shared default parent while other pods are in it: waiting there
/// cost every RemovePodSandbox 310 ms per hierarchy, 3.7 s on a v1 host).
///
/// A systemd scope's cgroup is left to systemd, which removes it with the unit once it has read
/// `populated 0` from the scope's cgroup.events on the kernel's notice. A rmdir before that read
/// makes the read fail, and systemd then keeps the unit active, with no cgroup, for good (a
/// shim's scope was left so in the VM node when systemd lagged the shim's exit).
fn rmdir(dir: &Path) {
    if is_scope(dir) {
        return;
    }
    let mut delay = std::time::Duration::from_millis(10);
    for _ in 0..5 {
        match std::fs::remove_dir(dir) {
            Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                if has_child(dir) {
                    return;
                }
                std::thread::sleep(delay);
                delay *= 2;
            }
            _ => return,
        }
    }
    if let Err(e) = std::fs::remove_dir(dir) {
        tracing::warn!(cgroup = %dir.display(), error = %e, "cgroup still busy; left for the doctor");
    }
}

/// Whether cgroup `dir` has a child cgroup (a directory: a cgroup's files are regular files).
fn has_child(dir: &Path) -> bool {
    std::fs::read_dir(dir)
        .map(|entries| entries.flatten().any(|e| e.file_type().is_ok_and(|t| t.is_dir())))
        .unwrap_or(false)
}

/// Whether `dir` is the cgroup of a systemd scope (`<name>.scope`), in any hierarchy.
pub(crate) fn is_scope(dir: &Path) -> bool {
    dir.extension().is_some_and(|e| e == "scope")
}

/// The cgroupfs path of the parent a pod member is in (the pod's own cgroup when the kubelet
/// gave one), or None under the driver's default parent, which every pod shares.
pub fn pod_dir(pod_member: &str) -> Option<String> {
    let (parent, _) = dir(pod_member)
        .rsplit_once('/')
        .map(|(p, n)| (p.to_string(), n.to_string()))?;
    let shared = [
        DEFAULT_CGROUPFS_PARENT.to_string(),
        expand_slice(DEFAULT_SLICE).unwrap_or_default(),
    ];
    (!parent.is_empty() && !shared.contains(&parent)).then_some(parent)
}

fn systemd_parts(cgroups_path: &str) -> Option<(&str, &str, &str)> {
    if cgroups_path.starts_with('/') {
        return None;
    }
    let mut parts = cgroups_path.splitn(3, ':');
    Some((parts.next()?, parts.next()?, parts.next()?))
}

/// systemd's slice naming: `a-b-c.slice` is the cgroup `/a.slice/a-b.slice/a-b-c.slice`, and
/// `-.slice` the root. None for a name that is not a slice (systemd would refuse it too).
pub fn expand_slice(slice: &str) -> Option<String> {
    let name = slice.strip_suffix(".slice")?;
    if name == "-" {
        return Some("/".into());
    }
    if name.is_empty() || slice.contains('/') || slice.contains(':') {
        return None;
    }
    let mut path = String::new();
    let mut prefix = String::new();
    for part in name.split('-') {
        if part.is_empty() {
            return None;
        }
        path.push_str(&format!("/{prefix}{part}.slice"));
        prefix.push_str(&format!("{part}-"));
    }
    Some(path)
}

/// Whether systemd is this host's init (sd_booted(3): /run/systemd/system is a directory).
pub fn systemd_booted() -> bool {
    std::fs::symlink_metadata("/run/systemd/system").is_ok_and(|m| m.is_dir())
}

/// Whether /sys/fs/cgroup is the unified (cgroup v2 only) hierarchy.
pub fn unified_only() -> bool {
    scute_sys::cgroupfs::is_cgroup2(std::path::Path::new("/sys/fs/cgroup"))
}

/// Refuses a driver this host cannot serve, with what to do instead.
pub fn check_driver(driver: CgroupDriver) -> Result<(), String> {
    match driver {
        CgroupDriver::Cgroupfs => Ok(()),
        CgroupDriver::Systemd if !systemd_booted() => Err(
            "runtime.cgroup_driver = \"systemd\" needs systemd as PID 1, and this host was not booted \
             with systemd (no /run/systemd/system); use cgroup_driver = \"cgroupfs\""
                .into(),
        ),
        CgroupDriver::Systemd if !unified_only() => Err(
            "runtime.cgroup_driver = \"systemd\" needs the unified cgroup v2 hierarchy at /sys/fs/cgroup \
             (boot with systemd.unified_cgroup_hierarchy=1), or use cgroup_driver = \"cgroupfs\""
                .into(),
        ),
        CgroupDriver::Systemd => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scopes_cgroup_is_left_to_systemd() {
        let root = tempfile::tempdir().unwrap();
        let (scope, plain) = (root.path().join("scute-x.scope"), root.path().join("scute-x"));
        for dir in [&scope, &plain] {
            std::fs::create_dir(dir).unwrap();
            rmdir(dir);
        }
        assert!(scope.is_dir(), "systemd removes a scope's cgroup, never scute");
        assert!(!plain.exists());
    }

    #[test]
    fn only_the_names_scute_makes_have_an_owner() {
        let id = "ab".repeat(32);
        let member = Some(Owner::Member(id.clone()));
        let shim = Some(Owner::Shim(id[..32].to_string()));
        assert_eq!(Owner::of(&format!("scute-{id}")), member);
        assert_eq!(Owner::of(&format!("scute-{id}.scope")), member);
        assert_eq!(Owner::of(&format!("scute-shim-{}", &id[..32])), shim);
        assert_eq!(Owner::of(&format!("scute-shim-{}.scope", &id[..32])), shim);
        // The names this module makes for them, too.
        assert_eq!(
            Owner::of(dir(&sibling("/kubepods/pod1/scute-x", &id)).rsplit('/').next().unwrap()),
            member
        );
        let slice = format!("kubepods-pod1.slice:scute:{id}");
        assert_eq!(
            Owner::of(dir(&shim_path(&slice, &id)).rsplit('/').next().unwrap()),
            shim
        );
        for other in [
            "scute".to_string(),
            "scute-abc".to_string(),
            "kubepods".to_string(),
            format!("scute-shim-{id}"),
            format!("scute-{}", &id[..32]),
            format!("cri-containerd-{id}.scope"),
        ] {
            assert_eq!(Owner::of(&other), None, "{other}");
        }
    }

    #[test]
    fn kills_and_removals_never_reach_the_root_or_climb_out() {
        for dir in ["", "/", "/scute/../..", "../x"] {
            assert_eq!(hierarchy_dirs(dir), Vec::<PathBuf>::new(), "{dir:?}");
        }
        let dirs = hierarchy_dirs("/scute/scute-abc");
        assert!(!dirs.is_empty());
        assert!(
            dirs.iter().all(|d| d.ends_with("scute/scute-abc")
                && scute_sys::mountinfo::is_mountpoint(d.parent().unwrap().parent().unwrap())),
            "{dirs:?}"
        );
        // Nothing there: nothing killed.
        assert_eq!(kill_all("/scute/scute-no-such-cgroup"), 0);
    }

    #[test]
    fn slices_expand_as_systemd_names_them() {
        assert_eq!(expand_slice("system.slice").unwrap(), "/system.slice");
        assert_eq!(
            expand_slice("kubepods-burstable-pod1a.slice").unwrap(),
            "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1a.slice"
        );
        assert_eq!(expand_slice("-.slice").unwrap(), "/");
        for bad in [
            "kubepods",
            "a--b.slice",
            "-a.slice",
            ".slice",
            "/kubepods.slice",
            "a:b.slice",
        ] {
            assert_eq!(expand_slice(bad), None, "{bad}");
        }
    }

    #[test]
    fn member_paths_take_the_drivers_form() {
        let id = "abc";
        assert_eq!(member_path(CgroupDriver::Cgroupfs, "", id).unwrap(), "/scute/scute-abc");
        assert_eq!(
            member_path(CgroupDriver::Cgroupfs, "/kubepods/pod1/", id).unwrap(),
            "/kubepods/pod1/scute-abc"
        );
        assert!(member_path(CgroupDriver::Cgroupfs, "kubepods-pod1.slice", id)
            .unwrap_err()
            .contains("absolute cgroupfs path"));
        assert!(member_path(CgroupDriver::Cgroupfs, "/a/../b", id).is_err());

        let pod = member_path(CgroupDriver::Systemd, "kubepods-burstable-pod1.slice", id).unwrap();
        assert_eq!(pod, "kubepods-burstable-pod1.slice:scute:abc");
        assert_eq!(
            member_path(CgroupDriver::Systemd, "", id).unwrap(),
            "system.slice:scute:abc"
        );
        assert_eq!(
            member_path(CgroupDriver::Systemd, "/test.slice", id).unwrap(),
            "test.slice:scute:abc"
        );
        assert_eq!(
            member_path(CgroupDriver::Systemd, "/kubepods.slice/kubepods-pod1.slice/", id).unwrap(),
            "kubepods-pod1.slice:scute:abc"
        );
        let err = member_path(CgroupDriver::Systemd, "/kubepods/burstable/pod1", id).unwrap_err();
        assert!(err.contains("systemd slice name"), "{err}");
    }

    #[test]
    fn containers_sit_beside_their_pause() {
        assert_eq!(sibling("/kubepods/pod1/scute-p", "c"), "/kubepods/pod1/scute-c");
        assert_eq!(
            sibling("kubepods-pod1.slice:scute:p", "c"),
            "kubepods-pod1.slice:scute:c"
        );
        assert_eq!(sibling("", "c"), "/scute/scute-c");
    }

    #[test]
    fn shims_sit_beside_their_pause_under_a_short_name() {
        let id = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
        let pause = format!("kubepods-besteffort-pod1.slice:scute:{id}");
        assert_eq!(
            shim_path(&pause, id),
            "kubepods-besteffort-pod1.slice:scute-shim:0123456789abcdef0123456789abcdef"
        );
        assert_eq!(
            dir(&shim_path(&pause, id)),
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/\
             scute-shim-0123456789abcdef0123456789abcdef.scope"
        );
        assert_eq!(
            shim_path(&format!("/kubepods/pod1/scute-{id}"), id),
            "/kubepods/pod1/scute-shim-0123456789abcdef0123456789abcdef"
        );
    }

    #[test]
    fn dirs_are_where_the_files_are() {
        assert_eq!(dir("/kubepods/pod1/scute-c"), "/kubepods/pod1/scute-c");
        assert_eq!(
            dir("kubepods-besteffort-pod1.slice:scute:c"),
            "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod1.slice/scute-c.scope"
        );
        assert_eq!(dir("system.slice:scute:c"), "/system.slice/scute-c.scope");
        assert!(systemd_parts("system.slice:scute:c").is_some());
        assert!(systemd_parts("/scute/scute-c").is_none());
    }

    #[test]
    fn the_pods_own_cgroup_is_the_kubelets_parent_not_the_shared_default() {
        assert_eq!(pod_dir("/kubepods/pod1/scute-c").as_deref(), Some("/kubepods/pod1"));
        assert_eq!(pod_dir("/scute/scute-c"), None);
        assert_eq!(
            pod_dir("kubepods-pod1.slice:scute:c").as_deref(),
            Some("/kubepods.slice/kubepods-pod1.slice")
        );
        assert_eq!(pod_dir("system.slice:scute:c"), None);
    }
}
