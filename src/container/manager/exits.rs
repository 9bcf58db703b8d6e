//! Exits nobody asked about: each pod's shim pushes its containers' exits, which are stored and
//! reported (CONTAINER_STOPPED) at once; a shim that cannot push is polled every second.

use std::sync::{Arc, Weak};
use std::time::Duration;

use super::{ContainerError, ContainerManager};
use crate::api;
use crate::container::record::{ContainerRecord, ContainerState};
use crate::sandbox::manager::PAUSE_ID;
use crate::shim_client::pb::ErrorCode as ShimCode;
use crate::shim_client::ShimError;

impl ContainerManager {
    /// Follows the exits the shim of `sandbox_id` reaps, so that exits nobody asks about are
    /// stored and reported (STOPPED) at once. Subscribes again when the connection drops (also
    /// catching up, through `refresh`, on exits from before the subscription, e.g. while the
    /// daemon was down); ends when the sandbox or its shim is gone, or the manager is dropped.
    pub fn watch_shim(self: &Arc<Self>, sandbox_id: String) {
        let weak: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                let Some(this) = weak.upgrade() else { return };
                if this.sandboxes.get(&sandbox_id).is_err() {
                    return;
                }
                let Some(shim) = this.sandboxes.shim_for(&sandbox_id).await else {
                    if this.sandboxes.shim_gone(&sandbox_id).await {
                        this.shim_died(&sandbox_id).await;
                    }
                    return;
                };
                let mut exits = match shim.subscribe_exits().await {
                    Ok(exits) => exits,
                    Err(ShimError::Gone(_)) if this.sandboxes.shim_gone(&sandbox_id).await => {
                        drop(shim);
                        this.shim_died(&sandbox_id).await;
                        return;
                    }
                    Err(ShimError::Remote {
                        code: ShimCode::Unimplemented,
                        ..
                    }) => {
                        // A shim older than the daemon: its running containers are asked instead.
                        tracing::info!(sandbox = %sandbox_id, "shim without exit subscriptions: polling it");
                        drop((this, shim));
                        poll_exits(weak, sandbox_id).await;
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(sandbox = %sandbox_id, error = %e, "subscribing to the shim's exits");
                        drop(this);
                        tokio::time::sleep(Duration::from_secs(1)).await;
                        continue;
                    }
                };
                drop(shim);
                this.refresh_running_in(&sandbox_id).await;
                this.sandboxes.exit_notices.set_pushing(&sandbox_id, true);
                drop(this);
                loop {
                    let exit = match exits.next().await {
                        Ok(exit) => exit,
                        Err(e) => {
                            tracing::debug!(sandbox = %sandbox_id, error = %e, "exit subscription ended");
                            if let Some(this) = weak.upgrade() {
                                this.sandboxes.exit_notices.set_pushing(&sandbox_id, false);
                            }
                            break;
                        }
                    };
                    let Some(this) = weak.upgrade() else { return };
                    this.sandboxes.exit_notices.seen(&sandbox_id, &exit.container_id);
                    if exit.container_id == PAUSE_ID {
                        this.pod_stopped_by_itself(&sandbox_id).await;
                        continue;
                    }
                    let stored = this.commit_exit(&exit.container_id, |r| {
                        r.exited(exit.exit_code, exit.finished_at_ns, exit.oom_killed)
                    });
                    match stored.await {
                        // Removed meanwhile: its exit needs no record.
                        Ok(_) | Err(ContainerError::NotFound(_)) => {}
                        Err(e) => {
                            // The record stays Running: lists ask the shim again from now on.
                            tracing::warn!(container = %exit.container_id, error = %e, "recording an exit");
                            this.sandboxes.exit_notices.set_pushing(&sandbox_id, false);
                        }
                    }
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        });
    }

    /// The pod's pause exited with no StopPodSandbox: the pod is NotReady and its STOPPED event
    /// goes out, once (the sandbox manager sends it).
    pub(super) async fn pod_stopped_by_itself(&self, sandbox_id: &str) {
        if let Err(e) = self.sandboxes.pause_exited(sandbox_id).await {
            tracing::warn!(sandbox = %sandbox_id, error = %e, "recording that pause exited");
        }
    }

    /// The pod's shim is gone: its running containers are recorded exited (255, "the pod's shim
    /// is gone") and released, which kills what is left of them; then, if the pod was Ready
    /// (its shim died under it, not shut down by its removal), pause goes and the pod is
    /// NotReady, as containerd does with a dead shim's tasks.
    async fn shim_died(&self, sandbox_id: &str) {
        self.refresh_running_in(sandbox_id).await;
        if let Err(e) = self.sandboxes.shim_died(sandbox_id).await {
            tracing::warn!(sandbox = %sandbox_id, error = %e, "recording that the shim died");
        }
    }

    pub(super) async fn refresh_running_in(&self, sandbox_id: &str) {
        let Ok(records) = self.in_sandbox(sandbox_id) else {
            return;
        };
        for record in records.into_iter().filter(|c| c.state == ContainerState::Running) {
            let id = record.id.clone();
            if let Err(e) = self.refresh(record).await {
                tracing::warn!(container = %id, error = %e, "refreshing after subscribing to exits");
            }
        }
    }

    /// Stores an exit of a container the store still has Running and sends its STOPPED event;
    /// if someone else stored it first, answers the stored record and sends nothing.
    pub(super) async fn commit_exit(
        &self,
        id: &str,
        apply: impl FnOnce(&mut ContainerRecord),
    ) -> Result<ContainerRecord, ContainerError> {
        let _order = self.transitions.lock().await;
        let mut record = self.get(id)?;
        if record.state != ContainerState::Running {
            return Ok(record);
        }
        apply(&mut record);
        self.store.put(&record)?;
        tracing::info!(container = %id, exit_code = record.exit_code, "container exited");
        self.emit(id, &record.sandbox_id, api::ContainerEventType::ContainerStoppedEvent)
            .await;
        // Whoever noticed the exit (the shim's push, a poll, a status, a stop).
        self.release_later(id);
        Ok(record)
    }
}

/// Every second, refreshes the running containers of a sandbox whose shim cannot push exits,
/// until the sandbox or the manager is gone.
pub(super) async fn poll_exits(weak: Weak<ContainerManager>, sandbox_id: String) {
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let Some(this) = weak.upgrade() else { return };
        if this.sandboxes.get(&sandbox_id).is_err() {
            return;
        }
        this.refresh_running_in(&sandbox_id).await;
    }
}
