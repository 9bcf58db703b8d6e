//! The pod sandbox's own events (CREATED and STARTED at RunPodSandbox, STOPPED once when it
//! leaves Ready, DELETED at removal), sent by the sandbox manager under the sandbox's lock. As
//! containerd sends them, they carry the sandbox's ID as the container's, the pod's status and
//! its containers' statuses.

use super::manager::SandboxManager;
use crate::api;

impl SandboxManager {
    /// The pod's status now, for an event (None once it is removed).
    pub async fn status_now(&self, id: &str) -> Option<api::PodSandboxStatus> {
        let record = self.get(id).ok()?;
        let state = self.live_state(&record).await;
        Some(record.to_cri_status(state))
    }

    pub(super) async fn send_event(&self, id: &str, kind: api::ContainerEventType) {
        if let Some(event) = self.event(id, kind).await {
            self.events.send(event);
        }
    }

    /// The event `send_event` sends (None: nobody subscribes, so nothing is built).
    pub(super) async fn event(&self, id: &str, kind: api::ContainerEventType) -> Option<api::ContainerEventResponse> {
        if !self.events.has_subscribers() {
            return None;
        }
        let pod = self.status_now(id).await;
        Some(crate::events::event(id, kind, pod, (self.pod_containers)(id)))
    }
}
