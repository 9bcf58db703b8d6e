//! RunPodSandbox: network, files, shim and pause; answers the new sandbox's ID.

use super::{Cri, RpcError};
use crate::api::{ContainerEventType, RunPodSandboxRequest, RunPodSandboxResponse};

impl Cri {
    pub(super) async fn run_pod_sandbox(
        &self,
        request: RunPodSandboxRequest,
    ) -> Result<RunPodSandboxResponse, RpcError> {
        let config = request
            .config
            .ok_or_else(|| RpcError::InvalidArgument("RunPodSandbox: config is required".into()))?;
        let id = self.sandboxes.run(config, request.runtime_handler).await?;
        tracing::Span::current().record("id", id.as_str());
        self.containers.watch_shim(id.clone());
        // The sandbox's own events carry its ID as the container's, as containerd sends them.
        self.containers
            .emit(&id, &id, ContainerEventType::ContainerCreatedEvent)
            .await;
        self.containers
            .emit(&id, &id, ContainerEventType::ContainerStartedEvent)
            .await;
        Ok(RunPodSandboxResponse { pod_sandbox_id: id })
    }
}
