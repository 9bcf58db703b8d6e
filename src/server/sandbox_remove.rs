//! RemovePodSandbox: idempotent; unknown IDs succeed (the kubelet retries).

use super::{Cri, RpcError};
use crate::api::{ContainerEventType, RemovePodSandboxRequest, RemovePodSandboxResponse};

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
        // Built before the removal so it carries the pod's status: the kubelet finds the pod's UID
        // there (containerd 2 does the same).
        let deleted = match self.sandboxes.resolve(&request.pod_sandbox_id) {
            Ok(id) => {
                self.containers
                    .event(&id, &id, ContainerEventType::ContainerDeletedEvent)
                    .await
            }
            Err(_) => None,
        };
        self.sandboxes.remove(&request.pod_sandbox_id).await?;
        if let Some(event) = deleted {
            self.containers.events().send(event);
        }
        Ok(RemovePodSandboxResponse {})
    }
}
