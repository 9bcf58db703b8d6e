//! PodSandboxStatus: state (live: a sandbox whose pause died is NotReady), IPs, namespaces,
//! labels, annotations; verbose info as JSON.

use std::collections::HashMap;
use std::sync::Arc;

use super::{Cri, RpcError};
use crate::api;
use crate::sandbox::record::SandboxRecord;

impl Cri {
    pub(super) async fn pod_sandbox_status(
        &self,
        request: api::PodSandboxStatusRequest,
    ) -> Result<api::PodSandboxStatusResponse, RpcError> {
        let id = self.sandboxes.resolve(&request.pod_sandbox_id)?;
        tracing::Span::current().record("id", id.as_str());
        let record = self.sandboxes.get(&id)?;
        let state = self.sandboxes.live_state(&record).await;
        let status = record.to_cri_status(state);
        let mut info = HashMap::new();
        if request.verbose {
            info.insert("info".to_string(), verbose_info(&record).to_string());
        }
        // The kubelet's Evented PLEG reads the pod's containers from here.
        let mut containers_statuses = Vec::new();
        for container in self
            .containers
            .list_records()?
            .into_iter()
            .filter(|c| c.sandbox_id == record.id)
        {
            let container = self.containers.refresh(Arc::unwrap_or_clone(container)).await?;
            containers_statuses.push(container.to_cri_status());
        }
        Ok(api::PodSandboxStatusResponse {
            status: Some(status),
            info,
            containers_statuses,
            timestamp: scute_sys::clock::now_nanos(),
        })
    }
}

fn verbose_info(record: &SandboxRecord) -> serde_json::Value {
    serde_json::json!({
        "pid": record.pause_pid,
        "netNamespacePath": record.netns,
        "cgroupsPath": record.cgroups_path,
        "cniResult": record.cni_result,
        "runtimeHandler": record.runtime_handler,
        "name": record.name,
    })
}
