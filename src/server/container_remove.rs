//! RemoveContainer: running containers are killed first. Unknown IDs succeed.

use super::{Cri, RpcError};
use crate::api::{RemoveContainerRequest, RemoveContainerResponse};

impl Cri {
    pub(super) async fn remove_container(
        &self,
        request: RemoveContainerRequest,
    ) -> Result<RemoveContainerResponse, RpcError> {
        if request.container_id.is_empty() {
            return Err(RpcError::InvalidArgument(
                "RemoveContainer: container_id is required".into(),
            ));
        }
        tracing::Span::current().record("id", request.container_id.as_str());
        self.containers.remove(&request.container_id).await?;
        Ok(RemoveContainerResponse {})
    }
}
