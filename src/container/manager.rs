//! The container manager owns containers: their records, rootfs overlays, bundles and the
//! requests to their pod's shim.
//!
//! On disk, per container: `<root>/containers/<id>/` holds `rootfs/` (overlay of the image's layer
//! snapshots with `upper/` + `work/`, the container's writable layer) and `bundle/config.json`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::record::{container_name, ContainerRecord, ContainerState};
use super::spec::{container_spec, ContainerSpec};
use crate::api;
use crate::config::Config;
use crate::image::{ImageError, ImageManager};
use crate::keyed_lock::KeyedLocks;
use crate::sandbox::files;
use crate::sandbox::manager::{clamp_oom_score_adj, SandboxError, SandboxManager};
use crate::sandbox::record::SandboxState;
use crate::shim_client::{ContainerStatus as ShimStatus, CreateOptions, ExecResult, ShimClient, ShimError};
use crate::store::{self, Kind, Store};

/// ExecSync output beyond this is dropped (the kubelet keeps probe output small anyway).
const EXEC_MAX_OUTPUT: usize = 16 << 20;

#[derive(Debug, thiserror::Error)]
pub enum ContainerError {
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    AlreadyExists(String),
    #[error("{0}")]
    FailedPrecondition(String),
    #[error("{0}")]
    Failed(String),
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Sandbox(#[from] SandboxError),
}

fn failed(what: &str) -> impl FnOnce(std::io::Error) -> ContainerError + '_ {
    move |e| ContainerError::Failed(format!("{what}: {e}"))
}

fn shim_failed(what: &str) -> impl FnOnce(ShimError) -> ContainerError + '_ {
    move |e| ContainerError::Failed(format!("{what}: {e}"))
}

pub struct ContainerManager {
    config: Arc<Config>,
    store: Arc<Store>,
    images: Arc<ImageManager>,
    sandboxes: Arc<SandboxManager>,
    name_locks: KeyedLocks,
    id_locks: KeyedLocks,
}

impl ContainerManager {
    pub fn new(
        config: Arc<Config>,
        store: Arc<Store>,
        images: Arc<ImageManager>,
        sandboxes: Arc<SandboxManager>,
    ) -> ContainerManager {
        ContainerManager {
            config,
            store,
            images,
            sandboxes,
            name_locks: KeyedLocks::default(),
            id_locks: KeyedLocks::default(),
        }
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.config.root.join("containers").join(id)
    }

    pub fn resolve(&self, id_or_prefix: &str) -> Result<String, ContainerError> {
        match self.store.resolve_id(Kind::Container, id_or_prefix) {
            Ok(id) => Ok(id),
            Err(store::Error::NotFound { .. }) => Err(ContainerError::NotFound(format!(
                "container {id_or_prefix:?} not found"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    pub fn list_records(&self) -> Result<Vec<ContainerRecord>, ContainerError> {
        Ok(self.store.list::<ContainerRecord>()?)
    }

    async fn shim(&self, sandbox_id: &str) -> Result<Arc<ShimClient>, ContainerError> {
        self.sandboxes
            .shim_for(sandbox_id)
            .await
            .ok_or_else(|| ContainerError::FailedPrecondition(format!("the shim of pod sandbox {sandbox_id} is gone")))
    }

    /// CreateContainer: a writable layer on the image, a spec, and the shim creating (not
    /// starting) the process.
    pub async fn create(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String, ContainerError> {
        let sandbox_id = self.sandboxes.resolve(sandbox_id)?;
        let sandbox = self.sandboxes.get(&sandbox_id)?;
        if self.sandboxes.live_state(&sandbox).await != SandboxState::Ready {
            return Err(ContainerError::FailedPrecondition(format!(
                "pod sandbox {sandbox_id} is not ready"
            )));
        }
        // The stored config is the truth; the request's copy is only a fallback.
        let stored = sandbox.config();
        let sandbox_config = if stored.metadata.is_some() {
            stored
        } else {
            sandbox_config.unwrap_or_default()
        };
        let metadata = config
            .metadata
            .clone()
            .filter(|m| !m.name.is_empty())
            .ok_or_else(|| ContainerError::InvalidArgument("ContainerConfig.metadata.name is required".into()))?;
        let image_name = config.image.as_ref().map(|i| i.image.clone()).unwrap_or_default();
        if image_name.is_empty() {
            return Err(ContainerError::InvalidArgument(
                "ContainerConfig.image.image is required".into(),
            ));
        }
        let image = match self.images.resolve(&image_name) {
            Ok(image) => image,
            Err(ImageError::NotFound(_)) => {
                return Err(ContainerError::NotFound(format!(
                    "image {image_name:?} not found: pull it first"
                )))
            }
            Err(e) => return Err(e.into()),
        };
        let name = container_name(&metadata, &sandbox_config.metadata.clone().unwrap_or_default());
        let _name_lock = self.name_locks.lock(&name).await;
        if let Some(holder) = self.store.name_holder(Kind::Container, &name)? {
            return Err(ContainerError::AlreadyExists(format!(
                "container name {name:?} is reserved for container {holder}"
            )));
        }
        let id = crate::ids::random_id();
        tracing::Span::current().record("id", id.as_str());
        let log_path = match (&sandbox_config.log_directory, &config.log_path) {
            (dir, path) if !dir.is_empty() && !path.is_empty() => PathBuf::from(dir).join(path).display().to_string(),
            _ => String::new(),
        };
        let mut record = ContainerRecord {
            id: id.clone(),
            name: name.clone(),
            sandbox_id: sandbox_id.clone(),
            config: ContainerRecord::encode_config(&config),
            image_ref: image_name,
            image_id: image.id.clone(),
            chain_ids: image.layers.iter().map(|l| l.chain_id.clone()).collect(),
            state: ContainerState::Created,
            pid: 0,
            created_at: crate::image::now_nanos(),
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            log_path,
            cgroups_path: sibling_cgroup(&sandbox.cgroups_path, &id),
        };
        self.store.create(&name, &record)?;
        match self
            .create_steps(&config, &sandbox_config, &sandbox, &image, &mut record)
            .await
        {
            Ok(()) => {
                self.store.put(&record)?;
                tracing::info!(container = %id, sandbox = %sandbox_id, name = %name, "container created");
                Ok(id)
            }
            Err(e) => {
                tracing::warn!(container = %id, error = %e, "container creation failed; rolling back");
                if let Err(cleanup) = self.cleanup(&record).await {
                    tracing::error!(container = %id, error = %cleanup, "rollback left something behind");
                }
                self.store.delete::<ContainerRecord>(&id, Some(&name))?;
                Err(e)
            }
        }
    }

    async fn create_steps(
        &self,
        config: &api::ContainerConfig,
        sandbox_config: &api::PodSandboxConfig,
        sandbox: &crate::sandbox::record::SandboxRecord,
        image: &crate::image::record::ImageRecord,
        record: &mut ContainerRecord,
    ) -> Result<(), ContainerError> {
        let dir = self.dir(&record.id);
        let lowers: Vec<PathBuf> = image
            .layers
            .iter()
            .rev()
            .map(|l| self.images.snapshots().fs_path(&l.chain_id))
            .collect();
        let rootfs = dir.join("rootfs");
        crate::snapshot::mount_overlay(&lowers, &dir.join("upper"), &dir.join("work"), &rootfs)
            .map_err(failed("mounting the container's rootfs"))?;
        let ns = sandbox_config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.clone())
            .unwrap_or_default();
        let spec = container_spec(&ContainerSpec {
            id: &record.id,
            config,
            sandbox: sandbox_config,
            image: &image.config,
            rootfs: rootfs.clone(),
            pause_pid: sandbox.pause_pid,
            sandbox_dir: self.sandboxes.sandbox_dir(&sandbox.id),
            host_network: ns.network() == api::NamespaceMode::Node,
            host_ipc: ns.ipc() == api::NamespaceMode::Node,
            host_pid: ns.pid() == api::NamespaceMode::Node,
            cgroups_path: record.cgroups_path.clone(),
            oom_score_adj_floor: clamp_oom_score_adj(-1000),
        })
        .map_err(|e| ContainerError::InvalidArgument(e.to_string()))?;
        let bundle = dir.join("bundle");
        std::fs::create_dir_all(&bundle).map_err(failed("creating the bundle"))?;
        let spec_json = serde_json::to_string_pretty(&spec).map_err(|e| ContainerError::Failed(e.to_string()))?;
        files::write_atomic(&bundle.join("config.json"), &spec_json).map_err(failed("writing config.json"))?;
        if !record.log_path.is_empty() {
            if let Some(parent) = std::path::Path::new(&record.log_path).parent() {
                std::fs::create_dir_all(parent).map_err(failed("creating the log directory"))?;
            }
        }
        let shim = self.shim(&sandbox.id).await?;
        record.pid = shim
            .create_container_with(
                &record.id,
                &bundle,
                &CreateOptions {
                    log_path: (!record.log_path.is_empty()).then(|| PathBuf::from(&record.log_path)),
                    stdin: config.stdin,
                    tty: config.tty,
                    max_log_line_bytes: None,
                },
            )
            .await
            .map_err(shim_failed("creating the container"))?;
        Ok(())
    }

    pub async fn start(&self, id_or_prefix: &str) -> Result<(), ContainerError> {
        let id = self.resolve(id_or_prefix)?;
        let _lock = self.id_locks.lock(&id).await;
        let mut record = self.get(&id)?;
        if !record.state.can_start() {
            return Err(ContainerError::FailedPrecondition(format!(
                "container {id} is {:?}, only a created container can be started",
                record.state
            )));
        }
        let shim = self.shim(&record.sandbox_id).await?;
        if let Err(e) = shim.start_container(&id).await {
            record.exited(128, crate::image::now_nanos(), false);
            record.reason = "StartError".into();
            record.message = e.to_string();
            self.store.put(&record)?;
            return Err(shim_failed("starting the container")(e));
        }
        record.state = ContainerState::Running;
        record.started_at = crate::image::now_nanos();
        self.store.put(&record)?;
        tracing::info!(container = %id, "container started");
        Ok(())
    }

    pub fn get(&self, id: &str) -> Result<ContainerRecord, ContainerError> {
        self.store
            .get::<ContainerRecord>(id)?
            .ok_or_else(|| ContainerError::NotFound(format!("container {id:?} not found")))
    }

    /// The record brought up to date with its shim: a Running container that exited (also while
    /// the daemon was down) becomes Exited with the code and time the shim recorded.
    pub async fn refresh(&self, mut record: ContainerRecord) -> Result<ContainerRecord, ContainerError> {
        if record.state != ContainerState::Running {
            return Ok(record);
        }
        let Ok(shim) = self.shim(&record.sandbox_id).await else {
            record.exited(255, crate::image::now_nanos(), false);
            record.reason = "Unknown".into();
            record.message = "the pod's shim is gone".into();
            self.store.put(&record)?;
            return Ok(record);
        };
        match shim.state(&record.id).await {
            Ok(state) if state.status == ShimStatus::Stopped => {
                record.exited(
                    state.exit_code.unwrap_or(255),
                    state.finished_at_ns.unwrap_or_else(crate::image::now_nanos),
                    state.oom_killed,
                );
                self.store.put(&record)?;
            }
            Ok(_) => {}
            Err(ShimError::NotFound(_)) => {
                record.exited(255, crate::image::now_nanos(), false);
                record.reason = "Unknown".into();
                self.store.put(&record)?;
            }
            Err(e) => return Err(shim_failed("asking the shim")(e)),
        }
        Ok(record)
    }

    /// StopContainer: the stop signal (config, else image, else SIGTERM), then SIGKILL after
    /// `timeout` (0: at once). Idempotent; unknown IDs succeed.
    pub async fn stop(&self, id_or_prefix: &str, timeout: Duration) -> Result<(), ContainerError> {
        let id = match self.resolve(id_or_prefix) {
            Ok(id) => id,
            Err(ContainerError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let _lock = self.id_locks.lock(&id).await;
        let record = self.refresh(self.get(&id)?).await?;
        if record.state != ContainerState::Running {
            return Ok(());
        }
        let shim = self.shim(&record.sandbox_id).await?;
        let signal = stop_signal(&record.config(), &self.image_stop_signal(&record));
        if !timeout.is_zero() && signal != libc::SIGKILL {
            match shim.kill(&id, signal, false).await {
                Ok(()) | Err(ShimError::NotFound(_)) => {}
                Err(e) => return Err(shim_failed("signalling the container")(e)),
            }
            if self.wait_exit(&shim, &id, timeout).await {
                self.refresh(record).await?;
                return Ok(());
            }
            tracing::info!(container = %id, ?timeout, "grace period over: killing");
        }
        match shim.kill(&id, libc::SIGKILL, true).await {
            Ok(()) | Err(ShimError::NotFound(_)) => {}
            Err(e) => return Err(shim_failed("killing the container")(e)),
        }
        self.wait_exit(&shim, &id, Duration::from_secs(10)).await;
        self.refresh(record).await?;
        Ok(())
    }

    fn image_stop_signal(&self, record: &ContainerRecord) -> String {
        self.store
            .get::<crate::image::record::ImageRecord>(record.image_id.as_str())
            .ok()
            .flatten()
            .map(|i| i.config.stop_signal)
            .unwrap_or_default()
    }

    async fn wait_exit(&self, shim: &ShimClient, id: &str, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            match shim.state(id).await {
                Ok(s) if s.status == ShimStatus::Running => {}
                _ => return true,
            }
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// RemoveContainer: kills it if running, then removes process state, rootfs and record.
    /// Idempotent; unknown IDs succeed.
    pub async fn remove(&self, id_or_prefix: &str) -> Result<(), ContainerError> {
        let id = match self.resolve(id_or_prefix) {
            Ok(id) => id,
            Err(ContainerError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        self.stop(&id, Duration::ZERO).await?;
        let _lock = self.id_locks.lock(&id).await;
        let Some(record) = self.store.get::<ContainerRecord>(&id)? else {
            return Ok(());
        };
        self.cleanup(&record).await?;
        self.store.delete::<ContainerRecord>(&id, Some(&record.name))?;
        tracing::info!(container = %id, "container removed");
        Ok(())
    }

    async fn cleanup(&self, record: &ContainerRecord) -> Result<(), ContainerError> {
        if let Ok(shim) = self.shim(&record.sandbox_id).await {
            match shim.delete_container(&record.id).await {
                Ok(()) | Err(ShimError::NotFound(_)) => {}
                Err(e) => return Err(shim_failed("deleting the container")(e)),
            }
        }
        let dir = self.dir(&record.id);
        crate::snapshot::unmount_view(&dir.join("rootfs")).map_err(failed("unmounting the rootfs"))?;
        match std::fs::remove_dir_all(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(failed("removing the container directory")(e)),
            _ => Ok(()),
        }
    }

    /// Stops every container of a pod (StopPodSandbox), each with the same grace period.
    pub async fn stop_all_in(&self, sandbox_id: &str, timeout: Duration) -> Result<(), ContainerError> {
        for record in self.in_sandbox(sandbox_id)? {
            self.stop(&record.id, timeout).await?;
        }
        Ok(())
    }

    /// Removes every container of a pod (RemovePodSandbox).
    pub async fn remove_all_in(&self, sandbox_id: &str) -> Result<(), ContainerError> {
        for record in self.in_sandbox(sandbox_id)? {
            self.remove(&record.id).await?;
        }
        Ok(())
    }

    fn in_sandbox(&self, sandbox_id: &str) -> Result<Vec<ContainerRecord>, ContainerError> {
        let id = match self.sandboxes.resolve(sandbox_id) {
            Ok(id) => id,
            Err(SandboxError::NotFound(_)) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        Ok(self
            .list_records()?
            .into_iter()
            .filter(|c| c.sandbox_id == id)
            .collect())
    }

    pub async fn exec_sync(
        &self,
        id_or_prefix: &str,
        cmd: Vec<String>,
        timeout: Option<Duration>,
    ) -> Result<ExecResult, ContainerError> {
        let id = self.resolve(id_or_prefix)?;
        if cmd.is_empty() {
            return Err(ContainerError::InvalidArgument(
                "ExecSync: cmd must not be empty".into(),
            ));
        }
        let record = self.refresh(self.get(&id)?).await?;
        if record.state != ContainerState::Running {
            return Err(ContainerError::FailedPrecondition(format!(
                "container {id} is not running"
            )));
        }
        let shim = self.shim(&record.sandbox_id).await?;
        shim.exec(&id, &cmd, timeout.unwrap_or(Duration::ZERO), EXEC_MAX_OUTPUT)
            .await
            .map_err(shim_failed("exec"))
    }

    pub async fn reopen_log(&self, id_or_prefix: &str) -> Result<(), ContainerError> {
        let id = self.resolve(id_or_prefix)?;
        let record = self.refresh(self.get(&id)?).await?;
        if record.state != ContainerState::Running {
            return Err(ContainerError::FailedPrecondition(format!(
                "container {id} is not running"
            )));
        }
        let shim = self.shim(&record.sandbox_id).await?;
        shim.reopen_log(&id).await.map_err(shim_failed("reopening the log"))
    }
}

/// A container's cgroup sits next to its pod's pause cgroup, under the kubelet's pod cgroup.
fn sibling_cgroup(sandbox_cgroup: &str, id: &str) -> String {
    match sandbox_cgroup.rsplit_once('/') {
        Some((parent, _)) => format!("{parent}/scute-{id}"),
        None => format!("/scute/scute-{id}"),
    }
}

/// The signal StopContainer sends first: the config's (CRI 1.33+), else the image's STOPSIGNAL,
/// else SIGTERM.
fn stop_signal(config: &api::ContainerConfig, image_signal: &str) -> i32 {
    let from_config = api::Signal::try_from(config.stop_signal)
        .ok()
        .filter(|s| *s != api::Signal::RuntimeDefault)
        .and_then(|s| signal_number(s.as_str_name()));
    from_config
        .or_else(|| signal_number(image_signal))
        .unwrap_or(libc::SIGTERM)
}

/// `SIGTERM`, `TERM`, `15` → 15.
fn signal_number(name: &str) -> Option<i32> {
    if let Ok(n) = name.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let name = name.strip_prefix("SIG").unwrap_or(name);
    let n = match name {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "TERM" => libc::SIGTERM,
        "STOP" => libc::SIGSTOP,
        "WINCH" => libc::SIGWINCH,
        "PWR" => libc::SIGPWR,
        "ABRT" => libc::SIGABRT,
        "ALRM" => libc::SIGALRM,
        _ => return None,
    };
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_signals() {
        let mut config = api::ContainerConfig::default();
        assert_eq!(stop_signal(&config, ""), libc::SIGTERM);
        assert_eq!(stop_signal(&config, "SIGQUIT"), libc::SIGQUIT);
        assert_eq!(stop_signal(&config, "9"), libc::SIGKILL);
        config.stop_signal = api::Signal::Sigusr1 as i32;
        assert_eq!(stop_signal(&config, "SIGQUIT"), libc::SIGUSR1);
    }

    #[test]
    fn containers_sit_beside_pause() {
        assert_eq!(
            sibling_cgroup("/kubepods/podu/scute-abc", "def"),
            "/kubepods/podu/scute-def"
        );
        assert_eq!(sibling_cgroup("", "def"), "/scute/scute-def");
    }
}
