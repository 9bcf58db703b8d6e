//! ContainerStatus.

use std::collections::HashMap;

use super::{Cri, RpcError};
use crate::api;

impl Cri {
    pub(super) async fn container_status(
        &self,
        request: api::ContainerStatusRequest,
    ) -> Result<api::ContainerStatusResponse, RpcError> {
        let id = self.containers.resolve(&request.container_id)?;
        tracing::Span::current().record("id", id.as_str());
        let record = self.containers.refresh(self.containers.get(&id)?).await?;
        let mut info = HashMap::new();
        if request.verbose {
            let detail = serde_json::json!({
                "sandboxID": record.sandbox_id,
                "pid": record.pid,
                "cgroupsPath": record.cgroups_path,
                "name": record.name,
            });
            info.insert("info".to_string(), detail.to_string());
        }
        Ok(api::ContainerStatusResponse {
            status: Some(record.to_cri_status()),
            info,
        })
    }
}
