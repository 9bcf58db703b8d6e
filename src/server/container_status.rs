//! ContainerStatus and the CRI views of a container record.

use std::collections::HashMap;

use super::{Cri, RpcError};
use crate::api;
use crate::container::record::{ContainerRecord, ContainerState};

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
            status: Some(to_cri_status(&record)),
            info,
        })
    }
}

pub(super) fn to_cri_status(record: &ContainerRecord) -> api::ContainerStatus {
    let config = record.config();
    api::ContainerStatus {
        id: record.id.clone(),
        metadata: config.metadata.clone(),
        state: record.state.to_cri() as i32,
        created_at: record.created_at,
        started_at: record.started_at,
        finished_at: if record.state == ContainerState::Exited {
            record.finished_at
        } else {
            0
        },
        exit_code: record.exit_code,
        image: config.image.clone(),
        image_ref: record.image_id.to_string(),
        image_id: record.image_id.to_string(),
        reason: record.reason.clone(),
        message: record.message.clone(),
        labels: config.labels.clone(),
        annotations: config.annotations.clone(),
        mounts: config.mounts.clone(),
        log_path: record.log_path.clone(),
        resources: config
            .linux
            .as_ref()
            .and_then(|l| l.resources.clone())
            .map(|linux| api::ContainerResources {
                linux: Some(linux),
                ..Default::default()
            }),
        user: record.user.as_ref().map(|(uid, gid, groups)| api::ContainerUser {
            linux: Some(api::LinuxContainerUser {
                uid: *uid as i64,
                gid: *gid as i64,
                supplemental_groups: groups.iter().map(|g| *g as i64).collect(),
            }),
        }),
        stop_signal: config.stop_signal,
    }
}

pub(super) fn to_cri_container(record: &ContainerRecord) -> api::Container {
    let config = record.config();
    api::Container {
        id: record.id.clone(),
        pod_sandbox_id: record.sandbox_id.clone(),
        metadata: config.metadata.clone(),
        image: config.image.clone(),
        image_ref: record.image_id.to_string(),
        state: record.state.to_cri() as i32,
        created_at: record.created_at,
        labels: config.labels.clone(),
        annotations: config.annotations.clone(),
        image_id: record.image_id.to_string(),
    }
}
