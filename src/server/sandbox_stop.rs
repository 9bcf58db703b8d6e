//! StopPodSandbox: idempotent; unknown IDs succeed (the kubelet retries).

use super::{Cri, RpcError};
use crate::api::{StopPodSandboxRequest, StopPodSandboxResponse};

impl Cri {
    pub(super) async fn stop_pod_sandbox(
        &self,
        request: StopPodSandboxRequest,
    ) -> Result<StopPodSandboxResponse, RpcError> {
        if request.pod_sandbox_id.is_empty() {
            return Err(RpcError::InvalidArgument(
                "StopPodSandbox: pod_sandbox_id is required".into(),
            ));
        }
        tracing::Span::current().record("id", request.pod_sandbox_id.as_str());
        let Some(id) = self.sandboxes.resolve_known(&request.pod_sandbox_id)? else {
            return Ok(StopPodSandboxResponse {});
        };
        let _closed = self.sandboxes.close_to_containers(&id).await;
        // Every container first, forcibly (the CRI's words; containerd kills them at once too):
        // the kubelet has stopped each with its grace period already, and a caller without one
        // (kubeadm reset, crictl stopp) must not wait out a grace per container, which under
        // load outlasted kubeadm reset's retries. Then pause and the network.
        self.containers.kill_all_in(&id).await?;
        // A shim left with nothing but pause ends with the stop; one that holds a container
        // never started stays for RemovePodSandbox (as containerd's does for its task).
        let end_shim = !self.containers.shim_holds_any_in(&id)?;
        self.sandboxes.stop(&id, end_shim).await?;
        Ok(StopPodSandboxResponse {})
    }
}
