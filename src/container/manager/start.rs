//! StartContainer. A create leaves the container's process to here, as containerd's CRI makes
//! its task here: the rootfs and the volumes' views are mounted again, the bind sources pinned,
//! the shim makes the process (libcontainer's create), each bind it got is checked to be the
//! inode pinned, and the shim starts it. A created container so holds no mount and no process,
//! and a create reads no mount table: a node with many created containers pays nothing for them.

use std::path::PathBuf;
use std::sync::Arc;

use super::bind_sources::BindSources;
use super::{release, shim_failed, ContainerError, ContainerManager};
use crate::api;
use crate::container::record::ContainerRecord;
use crate::sandbox::record::SandboxState;
use crate::shim_client::CreateOptions;

impl ContainerManager {
    /// StartContainer, in a task of its own: a caller that stops waiting (the kubelet's
    /// deadline) drops only its wait, never a start half-way (views mounted, a process made and
    /// not started, a Running container not yet recorded).
    pub async fn start(self: &Arc<Self>, id_or_prefix: &str) -> Result<(), ContainerError> {
        let (manager, id) = (self.clone(), id_or_prefix.to_string());
        tokio::spawn(async move { manager.start_whole(&id).await })
            .await
            .map_err(|e| ContainerError::Failed(format!("the start's task died: {e}")))?
    }

    async fn start_whole(&self, id_or_prefix: &str) -> Result<(), ContainerError> {
        let id = self.resolve(id_or_prefix)?;
        // Until its process is in the shim and started: the pod's stop waits for it (and then
        // stops it). Taken before the container's lock, as the stop takes them.
        let sandbox_id = self.get(&id)?.sandbox_id;
        let _admitted = self.sandboxes.admit_containers(&sandbox_id).await;
        let _lock = self.id_locks.lock(&id).await;
        let mut record = self.get(&id)?;
        if !record.state.can_start() {
            return Err(ContainerError::FailedPrecondition(format!(
                "container {id} is {:?}, only a created container can be started",
                record.state
            )));
        }
        // (A record from before deferred creates has its process made already.)
        let made = match record.deferred {
            true => self.make_process(&mut record).await,
            false => Ok(()),
        };
        let started = match made {
            Ok(()) => match self.shim(&record.sandbox_id).await {
                Ok(shim) => shim
                    .start_container(&id)
                    .await
                    .map(|()| shim)
                    .map_err(shim_failed("starting the container")),
                Err(e) => Err(e),
            },
            Err(e) => Err(e),
        };
        // Stored and sent before the exit watcher may see it Running: STARTED before STOPPED.
        let order = self.transitions.lock().await;
        let shim = match started {
            Ok(shim) => shim,
            Err(e) => {
                record.exited(128, scute_sys::clock::now_nanos(), false);
                record.reason = "StartError".into();
                record.message = match &e {
                    ContainerError::Shim { source, .. } => source.to_string(),
                    e => e.to_string(),
                };
                self.store.put(&record)?;
                self.emit(&id, &record.sandbox_id, api::ContainerEventType::ContainerStoppedEvent)
                    .await;
                drop(order);
                self.release_exited(&record).await;
                return Err(e);
            }
        };
        if record.restored_from.is_some() {
            // Its processes exist from now on.
            match shim.state(&id).await {
                Ok(state) => record.pid = state.pid,
                Err(e) => tracing::warn!(container = %id, error = %e, "the restored container's pid"),
            }
        }
        record
            .started(scute_sys::clock::now_nanos())
            .map_err(ContainerError::FailedPrecondition)?;
        self.store.put(&record)?;
        tracing::info!(container = %id, "container started");
        self.emit(&id, &record.sandbox_id, api::ContainerEventType::ContainerStartedEvent)
            .await;
        drop(order);
        // An exit the shim reported before Running was stored was not recorded: ask once.
        let sandbox_id = record.sandbox_id.clone();
        if let Err(e) = self.refresh(record).await {
            tracing::warn!(container = %id, error = %e, "checking a started container");
            // It may have exited unrecorded: lists ask the shim again from now on.
            self.sandboxes.exit_notices.set_pushing(&sandbox_id, false);
        }
        Ok(())
    }

    /// After a restart: a start cut short once the shim had started the process (the daemon
    /// stopped before storing it) is Running, from the shim's state. Left Created, it would hide
    /// a running process from the kubelet, whose retried start would find it in the way. A
    /// process not made or not started yet is left to the next StartContainer, which releases it.
    pub(super) async fn adopt_cut_start(&self, mut record: ContainerRecord) {
        let Ok(shim) = self.shim(&record.sandbox_id).await else {
            return;
        };
        let state = match shim.state(&record.id).await {
            Ok(state) if state.started_at_ns != 0 => state,
            _ => return,
        };
        record.pid = state.pid;
        if record.started(state.started_at_ns).is_err() {
            return;
        }
        {
            let _order = self.transitions.lock().await;
            if let Err(e) = self.store.put(&record) {
                tracing::warn!(container = %record.id, error = %e, "recording a cut start's running process");
                return;
            }
            self.emit(
                &record.id,
                &record.sandbox_id,
                api::ContainerEventType::ContainerStartedEvent,
            )
            .await;
        }
        tracing::warn!(container = %record.id, pid = record.pid, "a start cut short by the daemon's stop had started the process: running");
        // It may have exited since.
        let id = record.id.clone();
        if let Err(e) = self.refresh(record).await {
            tracing::warn!(container = %id, error = %e, "checking a cut start's process");
        }
    }

    /// Has the pod's shim make the created container's process from its bundle, its rootfs and
    /// views mounted first and its bind sources held from before the process is made until each
    /// is checked in it (see `bind_sources`). What was made before a failure is released with the
    /// container's exit (its rootfs mounted says the shim may hold a part).
    async fn make_process(&self, record: &mut ContainerRecord) -> Result<(), ContainerError> {
        let sandbox = self.sandboxes.get(&record.sandbox_id)?;
        if self.sandboxes.live_state(&sandbox).await != SandboxState::Ready {
            return Err(ContainerError::FailedPrecondition(format!(
                "pod sandbox {} is not ready: its containers cannot start",
                sandbox.id
            )));
        }
        let shim = self.shim(&sandbox.id).await?;
        // A start cut short (the daemon stopped half-way) made some of it: that goes first. The
        // shim may hold a part only once the rootfs is mounted (the last view mounted).
        match self.rootfs_mounted(record) {
            true => self.release(Some(&shim), record).await?,
            false => crate::blocking::run(|| release::unmount_views(&self.dir(&record.id)))?,
        }
        let config = record.config();
        let userns = sandbox.user_namespace();
        let dir = self.dir(&record.id);
        let bundle = dir.join("bundle");
        let bind_sources = crate::blocking::run(|| -> Result<BindSources, ContainerError> {
            self.mount_views(record, &config, userns.as_ref(), sandbox.pause_pid)?;
            let spec = oci_spec::runtime::Spec::load(bundle.join("config.json"))
                .map_err(|e| ContainerError::Failed(format!("reading the container's bundle: {e}")))?;
            let cri_destinations: Vec<String> = config
                .mounts
                .iter()
                .map(|m| crate::oci::clean_absolute(&m.container_path))
                .collect();
            BindSources::pin(&spec, &cri_destinations).map_err(ContainerError::FailedPrecondition)
        })?;
        record.pid = shim
            .create_container_with(
                &record.id,
                &bundle,
                &CreateOptions {
                    log_path: (!record.log_path.is_empty()).then(|| PathBuf::from(&record.log_path)),
                    stdin: config.stdin,
                    tty: config.tty,
                    max_log_line_bytes: None,
                    stdin_once: config.stdin_once,
                    restore: record
                        .restored_from
                        .is_some()
                        .then(|| (dir.join("checkpoint"), dir.join("criu"))),
                },
            )
            .await
            .map_err(shim_failed("creating the container"))?;
        // (A restore has no process until the shim's start: CRIU mounts what the bundle names.)
        if record.restored_from.is_none() {
            bind_sources
                .verify(record.pid)
                .map_err(ContainerError::FailedPrecondition)?;
        }
        Ok(())
    }
}
