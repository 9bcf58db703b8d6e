//! Capability sets: the kubelet's add/drop over containerd's defaults, limited to what scute
//! itself holds (a set the runtime lacks cannot be granted).

use std::collections::BTreeSet;
use std::str::FromStr;

use oci_spec::runtime::{Capabilities, Capability, LinuxCapabilities, LinuxCapabilitiesBuilder};

use super::{HostFacts, SpecError};
use crate::api;

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

/// `NET_ADMIN`, `net_admin` or `CAP_NET_ADMIN` → its number.
pub(super) fn cap_index(name: &str) -> Result<usize, SpecError> {
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

/// The capabilities in the `CapEff:` mask of /proc/<pid>/status text, up to `last`; every one
/// up to `last` without a readable mask.
pub(super) fn held_from_status(status: &str, last: usize) -> BTreeSet<usize> {
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
pub(super) fn capabilities(
    sc: &api::LinuxContainerSecurityContext,
    privileged: bool,
    host: &HostFacts,
) -> Result<(BTreeSet<usize>, BTreeSet<usize>), SpecError> {
    let supported = host.supported_caps();
    let held = &host.held_caps;
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

/// process.capabilities: `set` bounding, effective and permitted, `ambient` ambient and
/// inheritable (capability numbers, as `capabilities` returns them).
pub(crate) fn capability_sets(
    set: &BTreeSet<usize>,
    ambient: &BTreeSet<usize>,
) -> Result<LinuxCapabilities, SpecError> {
    let typed = |numbers: &BTreeSet<usize>| -> Result<Capabilities, SpecError> {
        numbers.iter().map(|&c| capability(c)).collect()
    };
    let (set, ambient) = (typed(set)?, typed(ambient)?);
    Ok(LinuxCapabilitiesBuilder::default()
        .bounding(set.clone())
        .effective(set.clone())
        .permitted(set)
        .inheritable(ambient.clone())
        .ambient(ambient)
        .build()?)
}

/// oci-spec's name for capability number `c` (its strings lack the `CAP_` prefix).
pub(super) fn capability(c: usize) -> Result<Capability, SpecError> {
    let name = ALL_CAPABILITIES
        .get(c)
        .ok_or_else(|| SpecError::Invalid(format!("unknown capability number {c}")))?;
    Capability::from_str(name.trim_start_matches("CAP_"))
        .map_err(|_| SpecError::Invalid(format!("oci-spec does not know capability {name}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_capability_has_its_oci_spec_name() {
        for (c, name) in ALL_CAPABILITIES.iter().enumerate() {
            let typed = capability(c).unwrap();
            assert_eq!(serde_json::to_value(typed).unwrap(), *name);
        }
        assert!(capability(ALL_CAPABILITIES.len()).is_err());
    }
}
