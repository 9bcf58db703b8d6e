//! ListPodSandboxStats: filters by ID (or prefix) and label selector. Only ready pods are listed
//! (as containerd does): a stopped pod has no network and no running processes to account.

use super::{Cri, RpcError};
use crate::api;
use crate::sandbox::record::SandboxState;

impl Cri {
    pub(super) async fn list_pod_sandbox_stats(
        &self,
        request: api::ListPodSandboxStatsRequest,
    ) -> Result<api::ListPodSandboxStatsResponse, RpcError> {
        let filter = request.filter.unwrap_or_default();
        let sandboxes = self.sandboxes.list()?;
        // Samples of removed pods are dropped here, where every live ID is at hand.
        self.stats.keep_pods(sandboxes.iter().map(|s| s.id.as_str()));
        let containers = self.containers.list_records()?;
        let mut pods = Vec::new();
        for sandbox in sandboxes {
            if !filter.id.is_empty() && !sandbox.id.starts_with(&filter.id) {
                continue;
            }
            let labels = sandbox.config().labels;
            if !filter.label_selector.iter().all(|(k, v)| labels.get(k) == Some(v)) {
                continue;
            }
            if self.sandboxes.live_state(&sandbox).await != SandboxState::Ready {
                continue;
            }
            let members = containers
                .iter()
                .filter(|c| c.sandbox_id == sandbox.id)
                .cloned()
                .collect();
            pods.push((sandbox, members));
        }
        let mut stats = Vec::with_capacity(pods.len());
        for s in self.sandboxes_stats(pods).await? {
            let id = s.attributes.as_ref().map(|a| a.id.as_str()).unwrap_or_default();
            if self.sandboxes.get(id).is_ok() {
                stats.push(s);
            }
        }
        Ok(api::ListPodSandboxStatsResponse { stats })
    }
}
