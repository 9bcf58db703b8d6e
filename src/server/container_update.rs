//! UpdateContainerResources: new cgroup limits for a container, applied by its pod's shim and
//! reported by ContainerStatus (containerd's semantics: see `ContainerManager::update_resources`).

use super::{Cri, RpcError};
use crate::api::{UpdateContainerResourcesRequest, UpdateContainerResourcesResponse};

impl Cri {
    pub(super) async fn update_container_resources(
        &self,
        request: UpdateContainerResourcesRequest,
    ) -> Result<UpdateContainerResourcesResponse, RpcError> {
        if request.container_id.is_empty() {
            return Err(RpcError::InvalidArgument(
                "UpdateContainerResources: container_id is required".into(),
            ));
        }
        tracing::Span::current().record("id", request.container_id.as_str());
        self.containers
            .update_resources(&request.container_id, request.linux)
            .await?;
        Ok(UpdateContainerResourcesResponse {})
    }
}
