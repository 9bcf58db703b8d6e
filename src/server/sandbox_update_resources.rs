//! UpdatePodSandboxResources (KEP-1287, in-place pod resize): the kubelet tells the runtime the
//! pod's new pod-level resources and overhead after it resized the pod.
//!
//! Accept and record; the kubelet applies. The kubelet itself owns pod-level cgroups (its
//! PodContainerManager with cgroupfs writes `<cgroup_parent>`'s limits) and calls this RPC *after*
//! it has resized that cgroup, only to inform the runtime; it treats Unimplemented as "nothing to
//! do". containerd and CRI-O write no cgroup either: they pass the update to NRI plugins. scute has
//! no NRI, so it validates the request and records the new values in the pod's stored config
//! (`linux.overhead`, `linux.resources`), where later readers of the config see them. Writing
//! the pod cgroup here would race with the kubelet's own writes to the same files.

use super::{Cri, RpcError};
use crate::api;

impl Cri {
    pub(super) async fn update_pod_sandbox_resources(
        &self,
        request: api::UpdatePodSandboxResourcesRequest,
    ) -> Result<api::UpdatePodSandboxResourcesResponse, RpcError> {
        if request.pod_sandbox_id.is_empty() {
            return Err(RpcError::InvalidArgument(
                "UpdatePodSandboxResources: pod_sandbox_id is required".into(),
            ));
        }
        for (what, r) in [("overhead", &request.overhead), ("resources", &request.resources)] {
            if let Some(r) = r {
                validate(what, r)?;
            }
        }
        let id = self
            .sandboxes
            .update_resources(&request.pod_sandbox_id, request.overhead, request.resources)
            .await?;
        tracing::Span::current().record("id", id.as_str());
        Ok(api::UpdatePodSandboxResourcesResponse {})
    }
}

/// Negative limits are refused, but OCI's -1 ("unlimited") for the CPU quota and the swap limit.
fn validate(what: &str, r: &api::LinuxContainerResources) -> Result<(), RpcError> {
    let checks = [
        ("cpu_period", r.cpu_period, 0),
        ("cpu_quota", r.cpu_quota, -1),
        ("cpu_shares", r.cpu_shares, 0),
        ("memory_limit_in_bytes", r.memory_limit_in_bytes, 0),
        ("memory_swap_limit_in_bytes", r.memory_swap_limit_in_bytes, -1),
    ];
    for (name, value, min) in checks {
        if value < min {
            return Err(RpcError::InvalidArgument(format!(
                "UpdatePodSandboxResources: {what}.{name} {value} is negative"
            )));
        }
    }
    if r.hugepage_limits.iter().any(|h| h.page_size.is_empty()) {
        return Err(RpcError::InvalidArgument(format!(
            "UpdatePodSandboxResources: {what}.hugepage_limits has an entry without page_size"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negative_limits_are_invalid() {
        let ok = api::LinuxContainerResources {
            cpu_quota: -1,
            memory_swap_limit_in_bytes: -1,
            memory_limit_in_bytes: 1 << 20,
            ..Default::default()
        };
        assert!(validate("resources", &ok).is_ok());
        let bad = api::LinuxContainerResources {
            cpu_shares: -2,
            ..Default::default()
        };
        let err = validate("overhead", &bad).unwrap_err();
        assert!(matches!(err, RpcError::InvalidArgument(ref m) if m.contains("overhead.cpu_shares")));
    }
}
