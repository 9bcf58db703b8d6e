//! ContainerStatus and the CRI views of a container record.

use std::collections::HashMap;

use super::{Cri, RpcError};
use crate::api;
use crate::container::record::ContainerRecord;

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

pub(super) fn to_cri_container(record: &ContainerRecord) -> api::Container {
    let config = record.config();
    api::Container {
        id: record.id.clone(),
        pod_sandbox_id: record.sandbox_id.clone(),
        metadata: config.metadata.clone(),
        image: record.image_spec(&config),
        image_ref: record.image_id.to_string(),
        state: record.state.to_cri() as i32,
        created_at: record.created_at,
        labels: config.labels.clone(),
        annotations: config.annotations.clone(),
        image_id: record.image_id.to_string(),
    }
}
