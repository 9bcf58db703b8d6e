//! CreateContainer: a container in a ready pod, from a pulled image: its record, writable layer
//! and bundle; its process is made at StartContainer.

use super::{Cri, RpcError};
use crate::api::{CreateContainerRequest, CreateContainerResponse};

impl Cri {
    pub(super) async fn create_container(
        &self,
        request: CreateContainerRequest,
    ) -> Result<CreateContainerResponse, RpcError> {
        if request.pod_sandbox_id.is_empty() {
            return Err(RpcError::InvalidArgument(
                "CreateContainer: pod_sandbox_id is required".into(),
            ));
        }
        let config = request
            .config
            .ok_or_else(|| RpcError::InvalidArgument("CreateContainer: config is required".into()))?;
        let id = self
            .containers
            .create(&request.pod_sandbox_id, config, request.sandbox_config)
            .await?;
        Ok(CreateContainerResponse { container_id: id })
    }
}
