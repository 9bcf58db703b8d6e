//! Seccomp for a container: which profile the security context asks for, scute's RuntimeDefault
//! profile, and Localhost profiles read from the node.
//!
//! RuntimeDefault is a deny list on an allow-by-default filter, written for scute: the syscalls
//! Docker's and containerd's default profiles keep from an unprivileged container, each group
//! lifted when the container holds the capability those profiles tie it to (CAP_SYS_ADMIN for
//! mount/unshare/setns/namespace flags of clone, CAP_SYS_MODULE for module loading, …), errno
//! EPERM (clone3 without CAP_SYS_ADMIN: ENOSYS, so libcs fall back to clone, which is filtered by
//! flag). Syscalls a later kernel adds are allowed, unlike the upstream allow lists, and
//! `personality` is not filtered by argument (a deny list cannot express "none of these values"
//! with one comparison per argument).

use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Arch, LinuxSeccomp, LinuxSeccompAction, LinuxSeccompArgBuilder, LinuxSeccompBuilder, LinuxSeccompOperator,
    LinuxSyscall, LinuxSyscallBuilder,
};

use super::SpecError;
use crate::api;
use crate::api::security_profile::ProfileType;

const EPERM: u32 = 1;
const ENOSYS: u32 = 38;
const AF_VSOCK: u64 = 40;
/// CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET.
const CLONE_NAMESPACE_FLAGS: [u64; 7] = [
    0x0002_0000,
    0x0200_0000,
    0x0400_0000,
    0x0800_0000,
    0x1000_0000,
    0x2000_0000,
    0x4000_0000,
];
/// A localhost profile bigger than this is not a seccomp profile.
const MAX_PROFILE_SIZE: u64 = 4 << 20;

/// Denied to every container under RuntimeDefault: kernel keyring, module/kexec and obsolete
/// syscalls, swap, pivot_root (no reason to leave the rootfs), userfaultfd, NUMA page moves.
const ALWAYS_DENIED: &[&str] = &[
    "add_key",
    "create_module",
    "get_kernel_syms",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "move_pages",
    "nfsservctl",
    "pivot_root",
    "query_module",
    "request_key",
    "swapoff",
    "swapon",
    "_sysctl",
    "sysfs",
    "uselib",
    "userfaultfd",
    "ustat",
    "vm86",
    "vm86old",
];

/// Denied unless the container holds one of the capabilities.
const DENIED_WITHOUT: &[(&[&str], &[&str])] = &[
    (
        &["CAP_SYS_ADMIN"],
        &[
            "fanotify_init",
            "fsconfig",
            "fsmount",
            "fsopen",
            "fspick",
            "lookup_dcookie",
            "mount",
            "mount_setattr",
            "move_mount",
            "open_tree",
            "quotactl",
            "quotactl_fd",
            "setdomainname",
            "sethostname",
            "setns",
            "umount",
            "umount2",
            "unshare",
        ],
    ),
    (&["CAP_SYS_ADMIN", "CAP_BPF"], &["bpf"]),
    (&["CAP_SYS_ADMIN", "CAP_PERFMON"], &["perf_event_open"]),
    (&["CAP_SYS_ADMIN", "CAP_SYSLOG"], &["syslog"]),
    (&["CAP_SYS_BOOT"], &["reboot"]),
    (&["CAP_SYS_CHROOT"], &["chroot"]),
    (&["CAP_SYS_MODULE"], &["delete_module", "finit_module", "init_module"]),
    (&["CAP_SYS_PACCT"], &["acct"]),
    (&["CAP_SYS_PTRACE"], &["kcmp", "pidfd_getfd", "process_madvise"]),
    (&["CAP_SYS_RAWIO"], &["ioperm", "iopl"]),
    (
        &["CAP_SYS_TIME"],
        &["clock_settime", "clock_settime64", "settimeofday", "stime"],
    ),
    (&["CAP_SYS_TTY_CONFIG"], &["vhangup"]),
    (
        &["CAP_SYS_NICE"],
        &["get_mempolicy", "mbind", "set_mempolicy", "set_mempolicy_home_node"],
    ),
    (&["CAP_DAC_READ_SEARCH"], &["open_by_handle_at"]),
];

/// The seccomp profile a container asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Profile {
    Unconfined,
    RuntimeDefault,
    /// An absolute path on the node.
    Localhost(PathBuf),
}

/// The profile of the security context: `seccomp` when set, else the deprecated
/// `seccomp_profile_path`; neither → Unconfined (the CRI default, as in containerd).
#[allow(deprecated)]
pub fn requested(sc: &api::LinuxContainerSecurityContext) -> Result<Profile, SpecError> {
    match &sc.seccomp {
        Some(sp) => from_security_profile(sp),
        None => from_profile_path(&sc.seccomp_profile_path),
    }
}

fn from_security_profile(sp: &api::SecurityProfile) -> Result<Profile, SpecError> {
    let ty = ProfileType::try_from(sp.profile_type)
        .map_err(|_| SpecError::Invalid(format!("unknown seccomp profile type {}", sp.profile_type)))?;
    if ty != ProfileType::Localhost && !sp.localhost_ref.is_empty() {
        return Err(SpecError::Invalid(
            "seccomp localhost_ref must only be set when profile_type is Localhost".into(),
        ));
    }
    match ty {
        ProfileType::Unconfined => Ok(Profile::Unconfined),
        ProfileType::RuntimeDefault => Ok(Profile::RuntimeDefault),
        ProfileType::Localhost => localhost(sp.localhost_ref.strip_prefix("localhost/").unwrap_or(&sp.localhost_ref)),
    }
}

/// `""`/`unconfined`, `runtime/default`, `docker/default`, `localhost/<absolute path>`.
fn from_profile_path(path: &str) -> Result<Profile, SpecError> {
    match path {
        "" | "unconfined" => Ok(Profile::Unconfined),
        "runtime/default" | "docker/default" => Ok(Profile::RuntimeDefault),
        _ => match path.strip_prefix("localhost/") {
            Some(p) => localhost(p),
            None => Err(SpecError::Invalid(format!("unknown seccomp profile {path:?}"))),
        },
    }
}

fn localhost(path: &str) -> Result<Profile, SpecError> {
    if !path.starts_with('/') {
        return Err(SpecError::Invalid(format!(
            "seccomp localhost profile {path:?} must be an absolute path on the node"
        )));
    }
    Ok(Profile::Localhost(PathBuf::from(path)))
}

/// `linux.seccomp` of a container's spec: None for a privileged or unconfined container.
/// `caps` is the container's bounding set (`CAP_…` names).
pub fn for_container(
    sc: &api::LinuxContainerSecurityContext,
    privileged: bool,
    caps: &[&str],
) -> Result<Option<LinuxSeccomp>, SpecError> {
    let profile = requested(sc)?;
    if privileged {
        return Ok(None);
    }
    match profile {
        Profile::Unconfined => Ok(None),
        Profile::RuntimeDefault => default_profile(caps).map(Some),
        Profile::Localhost(path) => load_localhost(&path).map(Some),
    }
}

/// scute's RuntimeDefault profile for a container holding `caps`.
pub fn default_profile(caps: &[&str]) -> Result<LinuxSeccomp, SpecError> {
    let has = |wanted: &[&str]| wanted.iter().any(|c| caps.contains(c));
    let mut denied: Vec<&str> = ALWAYS_DENIED.to_vec();
    for (unless, names) in DENIED_WITHOUT {
        if !has(unless) {
            denied.extend_from_slice(names);
        }
    }
    denied.sort_unstable();
    denied.dedup();

    let mut syscalls = vec![denial(&denied, EPERM, None)?];
    if !has(&["CAP_SYS_ADMIN"]) {
        // One rule per flag: a deny list needs "any of these bits", MASKED_EQ tests one.
        let flags_arg: usize = if cfg!(target_arch = "s390x") { 1 } else { 0 };
        for flag in CLONE_NAMESPACE_FLAGS {
            let arg = LinuxSeccompArgBuilder::default()
                .index(flags_arg)
                .value(flag)
                .value_two(flag)
                .op(LinuxSeccompOperator::ScmpCmpMaskedEq)
                .build()?;
            syscalls.push(denial(&["clone"], EPERM, Some(arg))?);
        }
        // clone3 passes its flags in memory, out of seccomp's reach.
        syscalls.push(denial(&["clone3"], ENOSYS, None)?);
    }
    let vsock = LinuxSeccompArgBuilder::default()
        .index(0usize)
        .value(AF_VSOCK)
        .op(LinuxSeccompOperator::ScmpCmpEq)
        .build()?;
    syscalls.push(denial(&["socket"], EPERM, Some(vsock))?);
    Ok(LinuxSeccompBuilder::default()
        .default_action(LinuxSeccompAction::ScmpActAllow)
        .architectures(architectures())
        .syscalls(syscalls)
        .build()?)
}

/// A rule failing `names` with `errno` (when their `arg` matches, if given).
fn denial(
    names: &[&str],
    errno: u32,
    arg: Option<oci_spec::runtime::LinuxSeccompArg>,
) -> Result<LinuxSyscall, SpecError> {
    let mut b = LinuxSyscallBuilder::default()
        .names(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
        .action(LinuxSeccompAction::ScmpActErrno)
        .errno_ret(errno);
    if let Some(arg) = arg {
        b = b.args(vec![arg]);
    }
    Ok(b.build()?)
}

/// The native architecture with the ones its kernel also runs (32-bit and x32 on x86_64),
/// so a 32-bit binary meets the same filter instead of a bad-architecture kill.
fn architectures() -> Vec<Arch> {
    if cfg!(target_arch = "x86_64") {
        vec![Arch::ScmpArchX86_64, Arch::ScmpArchX86, Arch::ScmpArchX32]
    } else if cfg!(target_arch = "aarch64") {
        vec![Arch::ScmpArchAarch64, Arch::ScmpArchArm]
    } else if cfg!(target_arch = "s390x") {
        vec![Arch::ScmpArchS390x, Arch::ScmpArchS390]
    } else if cfg!(target_arch = "riscv64") {
        vec![Arch::ScmpArchRiscv64]
    } else if cfg!(all(target_arch = "powerpc64", target_endian = "little")) {
        vec![Arch::ScmpArchPpc64le]
    } else {
        Vec::new()
    }
}

/// A Localhost profile: the JSON file (an OCI `LinuxSeccomp`; Docker-format extras such as
/// `archMap` are ignored, as containerd ignores them).
pub fn load_localhost(path: &Path) -> Result<LinuxSeccomp, SpecError> {
    let invalid = |what: String| SpecError::Invalid(format!("seccomp profile {}: {what}", path.display()));
    let meta = std::fs::metadata(path).map_err(|e| invalid(e.to_string()))?;
    if !meta.is_file() {
        return Err(invalid("not a regular file".into()));
    }
    if meta.len() > MAX_PROFILE_SIZE {
        return Err(invalid("too large".into()));
    }
    let bytes = std::fs::read(path).map_err(|e| invalid(e.to_string()))?;
    serde_json::from_slice(&bytes).map_err(|e| invalid(format!("not a seccomp profile: {e}")))
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    #[allow(deprecated)]
    fn sc_with(sp: Option<api::SecurityProfile>, path: &str) -> api::LinuxContainerSecurityContext {
        api::LinuxContainerSecurityContext {
            seccomp: sp,
            seccomp_profile_path: path.into(),
            ..Default::default()
        }
    }

    fn profile(ty: ProfileType, r: &str) -> Option<api::SecurityProfile> {
        Some(api::SecurityProfile {
            profile_type: ty as i32,
            localhost_ref: r.into(),
        })
    }

    #[test]
    fn requested_profiles() {
        assert_eq!(requested(&sc_with(None, "")).unwrap(), Profile::Unconfined);
        assert_eq!(requested(&sc_with(None, "unconfined")).unwrap(), Profile::Unconfined);
        assert_eq!(
            requested(&sc_with(None, "runtime/default")).unwrap(),
            Profile::RuntimeDefault
        );
        assert_eq!(
            requested(&sc_with(None, "docker/default")).unwrap(),
            Profile::RuntimeDefault
        );
        assert_eq!(
            requested(&sc_with(None, "localhost//var/lib/kubelet/seccomp/a.json")).unwrap(),
            Profile::Localhost("/var/lib/kubelet/seccomp/a.json".into())
        );
        assert!(requested(&sc_with(None, "localhost/relative.json")).is_err());
        assert!(requested(&sc_with(None, "bogus")).is_err());
        // The structured field wins over the deprecated path.
        assert_eq!(
            requested(&sc_with(profile(ProfileType::RuntimeDefault, ""), "unconfined")).unwrap(),
            Profile::RuntimeDefault
        );
        assert_eq!(
            requested(&sc_with(profile(ProfileType::Unconfined, ""), "runtime/default")).unwrap(),
            Profile::Unconfined
        );
        assert_eq!(
            requested(&sc_with(profile(ProfileType::Localhost, "/p.json"), "")).unwrap(),
            Profile::Localhost("/p.json".into())
        );
        assert!(requested(&sc_with(profile(ProfileType::RuntimeDefault, "/p.json"), "")).is_err());
        assert!(requested(&sc_with(profile(ProfileType::Localhost, ""), "")).is_err());
    }

    fn denied(v: &Value) -> Vec<String> {
        v["syscalls"][0]["names"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_str().unwrap().to_string())
            .collect()
    }

    #[test]
    fn default_profile_lifts_groups_by_capability() {
        let plain = serde_json::to_value(default_profile(&["CAP_CHOWN", "CAP_KILL"]).unwrap()).unwrap();
        assert_eq!(plain["defaultAction"], "SCMP_ACT_ALLOW");
        let names = denied(&plain);
        for n in [
            "mount",
            "umount2",
            "unshare",
            "setns",
            "kexec_load",
            "init_module",
            "bpf",
            "ptrace",
            "keyctl",
            "reboot",
        ] {
            assert_eq!(names.contains(&n.to_string()), n != "ptrace", "{n}");
        }
        let rules = plain["syscalls"].as_array().unwrap();
        assert!(rules
            .iter()
            .any(|r| r["names"][0] == "clone3" && r["errnoRet"] == ENOSYS));
        let clone_masks: u64 = rules
            .iter()
            .filter(|r| r["names"][0] == "clone")
            .map(|r| r["args"][0]["value"].as_u64().unwrap())
            .sum();
        assert_eq!(clone_masks, 0x7E02_0000);

        let admin = serde_json::to_value(default_profile(&["CAP_SYS_ADMIN", "CAP_SYS_MODULE"]).unwrap()).unwrap();
        let names = denied(&admin);
        for n in ["mount", "unshare", "setns", "bpf", "init_module", "syslog"] {
            assert!(!names.contains(&n.to_string()), "{n}");
        }
        assert!(names.contains(&"kexec_load".to_string()));
        assert!(!admin["syscalls"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r["names"][0] == "clone"));
    }

    #[test]
    fn localhost_profiles() {
        let dir = tempfile::tempdir().unwrap();
        let good = dir.path().join("good.json");
        std::fs::write(
            &good,
            r#"{"defaultAction":"SCMP_ACT_ERRNO","archMap":[],"syscalls":[{"names":["read","write"],"action":"SCMP_ACT_ALLOW"}]}"#,
        )
        .unwrap();
        let v = serde_json::to_value(load_localhost(&good).unwrap()).unwrap();
        assert_eq!(v["defaultAction"], "SCMP_ACT_ERRNO");
        assert_eq!(v["syscalls"][0]["names"][1], "write");

        let bad = dir.path().join("bad.json");
        std::fs::write(&bad, "{not json").unwrap();
        assert!(matches!(load_localhost(&bad), Err(SpecError::Invalid(_))));
        assert!(matches!(
            load_localhost(&dir.path().join("missing.json")),
            Err(SpecError::Invalid(_))
        ));
        assert!(load_localhost(dir.path()).is_err());

        let sc = sc_with(profile(ProfileType::Localhost, good.to_str().unwrap()), "");
        assert!(for_container(&sc, false, &[]).unwrap().is_some());
        assert!(
            for_container(&sc, true, &[]).unwrap().is_none(),
            "privileged: no seccomp"
        );
        let sc = sc_with(profile(ProfileType::Localhost, "/nonexistent/p.json"), "");
        assert!(for_container(&sc, false, &[]).is_err());
    }
}
