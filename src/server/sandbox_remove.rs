//! RemovePodSandbox: idempotent; unknown IDs succeed (the kubelet retries).

use super::{Cri, RpcError};
use crate::api::{RemovePodSandboxRequest, RemovePodSandboxResponse};

impl Cri {
    pub(super) async fn remove_pod_sandbox(
        &self,
        request: RemovePodSandboxRequest,
    ) -> Result<RemovePodSandboxResponse, RpcError> {
        if request.pod_sandbox_id.is_empty() {
            return Err(RpcError::InvalidArgument(
                "RemovePodSandbox: pod_sandbox_id is required".into(),
            ));
        }
        tracing::Span::current().record("id", request.pod_sandbox_id.as_str());
        let Some(id) = self.sandboxes.resolve_known(&request.pod_sandbox_id)? else {
            return Ok(RemovePodSandboxResponse {});
        };
        // No container is made in the pod while its containers are removed.
        let _closed = self.sandboxes.close_to_containers(&id).await;
        self.containers.remove_all_in(&id).await?;
        self.sandboxes.remove(&id).await?;
        Ok(RemovePodSandboxResponse {})
    }
}
