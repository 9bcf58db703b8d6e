//! Resources: the CRI's LinuxContainerResources as the OCI spec's linux.resources, for creation
//! and for UpdateContainerResources.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::OnceLock;

use serde_json::{json, Map, Value};

use super::{cgroup2, SpecError};
use crate::api;

/// linux.resources: the device rules, CPU, memory (swap = limit unless asked otherwise, when
/// the host has a swap controller), hugepages (when the host has hugetlb), unified.
pub(super) fn linux_resources(r: Option<&api::LinuxContainerResources>, device_rules: Vec<Value>) -> Value {
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
pub(super) fn swap_controller() -> bool {
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

pub(super) fn hugetlb_controller() -> bool {
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
