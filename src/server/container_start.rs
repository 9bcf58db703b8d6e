//! StartContainer: only a created container starts; its process is made here (see
//! `container::manager::start`).

use super::{Cri, RpcError};
use crate::api::{StartContainerRequest, StartContainerResponse};

impl Cri {
    pub(super) async fn start_container(
        &self,
        request: StartContainerRequest,
    ) -> Result<StartContainerResponse, RpcError> {
        super::required("StartContainer", "container_id", &request.container_id)?;
        tracing::Span::current().record("id", request.container_id.as_str());
        self.containers.start(&request.container_id).await?;
        Ok(StartContainerResponse {})
    }
}
