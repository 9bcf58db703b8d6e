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
        self.containers.remove_all_in(&request.pod_sandbox_id).await?;
        self.sandboxes.remove(&request.pod_sandbox_id).await?;
        Ok(RemovePodSandboxResponse {})
    }
}
