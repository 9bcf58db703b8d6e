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

/// `oci::check_resources`, its message naming the RPC and the field.
fn validate(what: &str, r: &api::LinuxContainerResources) -> Result<(), RpcError> {
    crate::oci::check_resources(r)
        .map_err(|e| RpcError::InvalidArgument(format!("UpdatePodSandboxResources: {what}.{e}")))
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
