//! Resources: the CRI's LinuxContainerResources as the OCI spec's linux.resources, for creation
//! and for UpdateContainerResources.

use std::collections::BTreeMap;

use serde_json::{json, Map, Value};

use super::{HostFacts, SpecError};
use crate::api;

/// linux.resources: the device rules, CPU, memory (swap = limit unless asked otherwise, when
/// the host has a swap controller), hugepages (when the host has hugetlb), unified.
pub(super) fn linux_resources(
    r: Option<&api::LinuxContainerResources>,
    device_rules: Vec<Value>,
    host: &HostFacts,
) -> Value {
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
        if r.memory_swap_limit_in_bytes == 0 && host.swap {
            memory.insert("swap".into(), json!(r.memory_limit_in_bytes));
        }
    }
    if r.memory_swap_limit_in_bytes != 0 && host.swap {
        memory.insert("swap".into(), json!(r.memory_swap_limit_in_bytes));
    }
    if !memory.is_empty() {
        out["memory"] = Value::Object(memory);
    }
    if !r.hugepage_limits.is_empty() && host.hugetlb {
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
pub fn update_resources(
    r: &api::LinuxContainerResources,
    host: &HostFacts,
) -> Result<oci_spec::runtime::LinuxResources, SpecError> {
    let mut v = linux_resources(Some(r), Vec::new(), host);
    if let Some(fields) = v.as_object_mut() {
        fields.remove("devices");
    }
    serde_json::from_value(v).map_err(|e| SpecError::Invalid(format!("container resources: {e}")))
}

/// The checks every RPC that carries LinuxContainerResources makes (RunPodSandbox's resources
/// and overhead, CreateContainer, UpdateContainerResources, UpdatePodSandboxResources): no
/// negative limit but OCI's -1 ("unlimited") for the CPU quota and the swap limit, and a page
/// size for every hugepage limit. The message names the field; callers say where it was.
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
    Ok(())
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
