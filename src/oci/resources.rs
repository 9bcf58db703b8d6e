//! Resources: the CRI's LinuxContainerResources as the OCI spec's linux.resources, for creation
//! and for UpdateContainerResources.

use oci_spec::runtime::{
    LinuxCpuBuilder, LinuxDeviceCgroup, LinuxHugepageLimitBuilder, LinuxMemoryBuilder, LinuxResources,
    LinuxResourcesBuilder,
};

use super::{HostFacts, SpecError};
use crate::api;

/// linux.resources: the device rules, CPU, memory (swap = limit unless asked otherwise, when
/// the host has a swap controller), hugepages (when the host has hugetlb), unified.
pub(super) fn linux_resources(
    r: Option<&api::LinuxContainerResources>,
    device_rules: Vec<LinuxDeviceCgroup>,
    host: &HostFacts,
) -> Result<LinuxResources, SpecError> {
    let mut out = LinuxResourcesBuilder::default();
    if !device_rules.is_empty() {
        out = out.devices(device_rules);
    }
    let Some(r) = r else {
        return Ok(out.build()?);
    };
    let mut cpu = LinuxCpuBuilder::default();
    let mut any_cpu = false;
    if r.cpu_shares > 0 {
        cpu = cpu.shares(r.cpu_shares as u64);
        any_cpu = true;
    }
    if r.cpu_quota != 0 {
        cpu = cpu.quota(r.cpu_quota);
        any_cpu = true;
    }
    if r.cpu_period > 0 {
        cpu = cpu.period(r.cpu_period as u64);
        any_cpu = true;
    }
    if !r.cpuset_cpus.is_empty() {
        cpu = cpu.cpus(r.cpuset_cpus.clone());
        any_cpu = true;
    }
    if !r.cpuset_mems.is_empty() {
        cpu = cpu.mems(r.cpuset_mems.clone());
        any_cpu = true;
    }
    if any_cpu {
        out = out.cpu(cpu.build()?);
    }
    let limit = (r.memory_limit_in_bytes != 0).then_some(r.memory_limit_in_bytes);
    let swap = match (r.memory_swap_limit_in_bytes, limit) {
        _ if !host.swap => None,
        (0, limit) => limit,
        (swap, _) => Some(swap),
    };
    if limit.is_some() || swap.is_some() {
        let mut memory = LinuxMemoryBuilder::default();
        if let Some(limit) = limit {
            memory = memory.limit(limit);
        }
        if let Some(swap) = swap {
            memory = memory.swap(swap);
        }
        out = out.memory(memory.build()?);
    }
    if !r.hugepage_limits.is_empty() && host.hugetlb {
        let limits = r
            .hugepage_limits
            .iter()
            .map(|h| {
                LinuxHugepageLimitBuilder::default()
                    .page_size(h.page_size.clone())
                    .limit(i64::try_from(h.limit).unwrap_or(i64::MAX))
                    .build()
            })
            .collect::<Result<Vec<_>, _>>()?;
        out = out.hugepage_limits(limits);
    }
    if !r.unified.is_empty() {
        out = out.unified(r.unified.clone());
    }
    Ok(out.build()?)
}

/// linux.resources as `container_spec` builds it from `r`, without device rules: what
/// UpdateContainerResources applies to a created or running container.
pub fn update_resources(r: &api::LinuxContainerResources, host: &HostFacts) -> Result<LinuxResources, SpecError> {
    linux_resources(Some(r), Vec::new(), host)
}

/// The checks every RPC that carries LinuxContainerResources makes (RunPodSandbox's resources
/// and overhead, CreateContainer, UpdateContainerResources, UpdatePodSandboxResources): no
/// negative limit but OCI's -1 ("unlimited") for the CPU quota and the swap limit, a page
/// size for every hugepage limit, and page sizes and unified keys that are plain file names. The message names the field; callers say where it was.
pub fn check_resources(r: &api::LinuxContainerResources) -> Result<(), SpecError> {
    let checks = [
        ("cpu_period", r.cpu_period, 0),
        ("cpu_quota", r.cpu_quota, -1),
        ("cpu_shares", r.cpu_shares, 0),
        ("memory_limit_in_bytes", r.memory_limit_in_bytes, 0),
        ("memory_swap_limit_in_bytes", r.memory_swap_limit_in_bytes, -1),
    ];
    if let Some((name, value, _)) = checks.into_iter().find(|(_, value, min)| value < min) {
        return Err(SpecError::Invalid(format!("{name} {value} is negative")));
    }
    if r.hugepage_limits.iter().any(|h| h.page_size.is_empty()) {
        return Err(SpecError::Invalid(
            "hugepage_limits has an entry without page_size".into(),
        ));
    }
    // Both become file names in the container's cgroup: `hugetlb.<page_size>.max`, and each
    // unified key as it is (runc refuses a key with a slash too).
    if let Some(h) = r
        .hugepage_limits
        .iter()
        .find(|h| !h.page_size.chars().all(|c| c.is_ascii_alphanumeric()))
    {
        return Err(SpecError::Invalid(format!(
            "hugepage_limits: page_size {:?} is not a size such as 2MB or 1GB",
            h.page_size
        )));
    }
    if let Some(key) = r.unified.keys().find(|k| !is_cgroup_file_name(k)) {
        return Err(SpecError::Invalid(format!(
            "unified: {key:?} is not a cgroup v2 file name such as memory.high or io.weight"
        )));
    }
    Ok(())
}

/// `controller.file`: lowercase letters, digits, `_` and `.`, not starting with a dot.
fn is_cgroup_file_name(key: &str) -> bool {
    key.contains('.')
        && !key.starts_with('.')
        && key
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_are_checked_the_same_everywhere() {
        let ok = api::LinuxContainerResources {
            cpu_quota: -1,
            memory_swap_limit_in_bytes: -1,
            memory_limit_in_bytes: 1 << 20,
            hugepage_limits: vec![api::HugepageLimit {
                page_size: "2MB".into(),
                limit: 1 << 21,
            }],
            unified: [
                ("io.weight".to_string(), "default 300".to_string()),
                ("memory.swap.max".to_string(), "0".to_string()),
            ]
            .into(),
            ..Default::default()
        };
        check_resources(&ok).unwrap();
        let refused = |r: api::LinuxContainerResources, field: &str| match check_resources(&r) {
            Err(SpecError::Invalid(m)) => assert!(m.contains(field), "{m}"),
            other => panic!("{r:?}: {other:?}"),
        };
        for (r, field) in [
            (
                api::LinuxContainerResources {
                    unified: [("../../cgroup.procs".to_string(), "1".to_string())].into(),
                    ..Default::default()
                },
                "unified: \"../../cgroup.procs\"",
            ),
            (
                api::LinuxContainerResources {
                    hugepage_limits: vec![api::HugepageLimit {
                        page_size: "2MB/../x".into(),
                        limit: 1,
                    }],
                    ..Default::default()
                },
                "page_size \"2MB/../x\"",
            ),
            (
                api::LinuxContainerResources {
                    cpu_shares: -2,
                    ..Default::default()
                },
                "cpu_shares -2",
            ),
            (
                api::LinuxContainerResources {
                    cpu_quota: -2,
                    ..Default::default()
                },
                "cpu_quota",
            ),
            (
                api::LinuxContainerResources {
                    cpu_period: -1,
                    ..Default::default()
                },
                "cpu_period",
            ),
            (
                api::LinuxContainerResources {
                    memory_limit_in_bytes: -1,
                    ..Default::default()
                },
                "memory_limit",
            ),
            (
                api::LinuxContainerResources {
                    memory_swap_limit_in_bytes: -2,
                    ..Default::default()
                },
                "memory_swap",
            ),
            (
                api::LinuxContainerResources {
                    hugepage_limits: vec![api::HugepageLimit::default()],
                    ..Default::default()
                },
                "page_size",
            ),
        ] {
            refused(r, field);
        }
    }
}
