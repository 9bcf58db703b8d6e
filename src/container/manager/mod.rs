//! The container manager owns containers: their records, rootfs overlays, bundles and the
//! requests to their pod's shim.
//!
//! On disk, per container: `<root>/containers/<id>/` holds `rootfs/` (overlay of the image's layer
//! snapshots with `upper/` + `work/`, the container's writable layer; mounted from its start to
//! its exit) and `bundle/config.json`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::record::{container_name, ContainerRecord, ContainerState};
use crate::api;
use crate::cdi::{CdiError, CdiRegistry};
use crate::config::{Config, DefaultSeccomp};
use crate::events::Events;
use crate::handover::Unclaimed;
use crate::image::{ImageError, ImageManager};
use crate::keyed_lock::{KeyedGuard, KeyedLocks};
use crate::oci::{container_spec, ContainerSpec, HostFacts, SpecError};
use crate::sandbox::files;
use crate::sandbox::manager::{clamp_oom_score_adj, SandboxError, SandboxManager};
use crate::sandbox::record::SandboxState;
use crate::shim_client::{ContainerStatus as ShimStatus, ExecResult, ShimClient, ShimError};
use crate::store::{self, Kind, Store};

/// ExecSync output beyond this is dropped (the kubelet keeps probe output small anyway).
mod bind_sources;
mod checkpoint;
mod exits;
mod image_volumes;
mod release;
mod restore;
mod start;
mod stop;
mod update;
mod validate;

use validate::validate_config;

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
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Cdi(#[from] CdiError),
    /// A host operation failed (Internal); the I/O error stays as the source.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    /// The pod's shim failed a request (Internal); its error stays as the source.
    #[error("{what}: {source}")]
    Shim {
        what: String,
        #[source]
        source: ShimError,
    },
}

/// Ids a CDI spec brought (additional groups, device node owners) pass the checks the
/// request's own ids pass (never (uid_t)-1, mapped in a user-namespaced pod).
fn check_cdi_ids(
    spec: &oci_spec::runtime::Spec,
    userns: Option<&crate::oci::userns::PodUserNs>,
) -> Result<(), SpecError> {
    use crate::oci::user::{check_id, Kind};
    let gids = spec.process().as_ref().and_then(|p| p.user().additional_gids().clone());
    for gid in gids.unwrap_or_default() {
        check_id(gid, Kind::Gid, "CDI additional group", userns)?;
    }
    let devices = spec.linux().as_ref().and_then(|l| l.devices().clone());
    for device in devices.unwrap_or_default() {
        let what = format!("CDI device node {}", device.path().display());
        if let Some(uid) = device.uid() {
            check_id(uid, Kind::Uid, &what, userns)?;
        }
        if let Some(gid) = device.gid() {
            check_id(gid, Kind::Gid, &what, userns)?;
        }
    }
    Ok(())
}

fn failed(what: &str) -> impl FnOnce(std::io::Error) -> ContainerError + '_ {
    move |source| ContainerError::Io {
        what: what.to_string(),
        source,
    }
}

pub(super) fn shim_failed(what: &str) -> impl FnOnce(ShimError) -> ContainerError + '_ {
    move |source| ContainerError::Shim {
        what: what.to_string(),
        source,
    }
}

pub struct ContainerManager {
    config: Arc<Config>,
    store: Arc<Store>,
    images: Arc<ImageManager>,
    sandboxes: Arc<SandboxManager>,
    name_locks: KeyedLocks,
    id_locks: KeyedLocks,
    events: Arc<Events>,
    /// The host's cgroup layout and scute's capabilities, for every container's spec.
    host: HostFacts,
    /// The node's CDI devices (`[cdi] spec_dirs`), for containers that ask for some.
    cdi: CdiRegistry,
    /// Held while a state change that sends an event is stored and sent, so a container's events
    /// go out in order and its exit is reported once, whoever notices it first.
    transitions: tokio::sync::Mutex<()>,
    /// Containers made but not yet handed to a caller (see `create`).
    unclaimed: Arc<Unclaimed>,
    /// This manager, for the releases an exit starts in the background (see `release`).
    me: std::sync::Weak<ContainerManager>,
}

impl ContainerManager {
    pub fn new(
        config: Arc<Config>,
        store: Arc<Store>,
        images: Arc<ImageManager>,
        sandboxes: Arc<SandboxManager>,
        events: Arc<Events>,
    ) -> Arc<ContainerManager> {
        Arc::new_cyclic(|me| ContainerManager {
            me: me.clone(),
            cdi: CdiRegistry::new(&config.cdi),
            config,
            store,
            images,
            sandboxes,
            name_locks: KeyedLocks::default(),
            id_locks: KeyedLocks::default(),
            events,
            host: HostFacts::gather(),
            transitions: tokio::sync::Mutex::new(()),
            unclaimed: Default::default(),
        })
    }

    /// Sends an event about a container with its pod's status and its containers' statuses as
    /// stored.
    pub(super) async fn emit(&self, container_id: &str, sandbox_id: &str, kind: api::ContainerEventType) {
        if let Some(event) = self.event(container_id, sandbox_id, kind).await {
            self.events.send(event);
        }
    }

    /// The event `emit` sends (None: nobody subscribes).
    async fn event(
        &self,
        container_id: &str,
        sandbox_id: &str,
        kind: api::ContainerEventType,
    ) -> Option<api::ContainerEventResponse> {
        if !self.events.has_subscribers() {
            return None;
        }
        let pod_sandbox_status = self.sandboxes.status_now(sandbox_id).await;
        let containers_statuses = crate::container::record::pod_statuses(&self.store, sandbox_id);
        Some(crate::events::event(
            container_id,
            kind,
            pod_sandbox_status,
            containers_statuses,
        ))
    }

    fn dir(&self, id: &str) -> PathBuf {
        self.config.root.join("containers").join(id)
    }

    /// The container's writable layer (its overlay's upper dir), for its stats.
    pub fn writable_layer_dir(&self, id: &str) -> PathBuf {
        self.dir(id).join("upper")
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

    /// Every container's record, shared with the store's cache (clone what is kept or changed).
    pub fn list_records(&self) -> Result<Vec<Arc<ContainerRecord>>, ContainerError> {
        Ok(self.store.list_shared::<ContainerRecord>()?)
    }

    pub(super) async fn shim(&self, sandbox_id: &str) -> Result<Arc<ShimClient>, ContainerError> {
        self.sandboxes
            .shim_for(sandbox_id)
            .await
            .ok_or_else(|| ContainerError::FailedPrecondition(format!("the shim of pod sandbox {sandbox_id} is gone")))
    }

    /// CreateContainer: a writable layer on the image, a spec, and the shim creating (not
    /// starting) the process. The work runs in a task of its own and a container made after the
    /// kubelet stopped waiting is kept for its retry (see `handover`).
    pub async fn create(
        self: &Arc<Self>,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<String, ContainerError> {
        validate_config(&config)?;
        let manager = self.clone();
        let sandbox_id = sandbox_id.to_string();
        self.unclaimed
            .run(
                |answer| async move {
                    let (result, _name_lock) = match manager.create_named(&sandbox_id, config, sandbox_config).await {
                        Ok((id, name_lock)) => (Ok(id), Some(name_lock)),
                        Err(e) => (Err(e), None),
                    };
                    if let Some(id) = answer.send(result) {
                        let _lock = manager.id_locks.lock(&id).await;
                        match manager.unclaimed.keep::<ContainerRecord>(&manager.store, &id) {
                            Ok(()) => tracing::info!(container = %id, "container created after the caller gave up; kept for its retry"),
                            Err(e) => tracing::warn!(container = %id, error = %e, "keeping a container for its retry"),
                        }
                    }
                },
                || ContainerError::Failed("container creation task died".into()),
            )
            .await
    }

    /// Makes the container (or finds the unclaimed one of the same name); answers its ID with
    /// the name lock, still held.
    async fn create_named(
        &self,
        sandbox_id: &str,
        config: api::ContainerConfig,
        sandbox_config: Option<api::PodSandboxConfig>,
    ) -> Result<(String, KeyedGuard<'_>), ContainerError> {
        let sandbox_id = self.sandboxes.resolve(sandbox_id)?;
        // Until the container is in the shim: the pod's stop waits for it (and sees it).
        let _admitted = self.sandboxes.admit_containers(&sandbox_id).await;
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
        // CRI's restore: the image is a checkpoint (an archive's path, or a checkpoint image).
        let mut checkpoint = match restore::archive_of(&image_name) {
            Some(archive) => Some(restore::read_checkpoint(restore::Source::Archive(archive))?),
            None => None,
        };
        let image = match &checkpoint {
            Some(checkpoint) => self.checkpoint_image(checkpoint)?,
            None => match self.images.resolve(&image_name) {
                Ok(image) => image,
                Err(ImageError::NotFound(_)) => {
                    return Err(ContainerError::NotFound(format!(
                        "image {image_name:?} not found: pull it first"
                    )))
                }
                Err(e) => return Err(e.into()),
            },
        };
        let image = match self.checkpoint_in_image(&image_name, &image) {
            Some(source) => {
                let found = restore::read_checkpoint(source)?;
                let base = self.checkpoint_image(&found)?;
                checkpoint = Some(found);
                base
            }
            None => image,
        };
        if let Some(artifact) = &image.artifact {
            return Err(ContainerError::InvalidArgument(format!(
                "image {image_name:?} is an OCI artifact ({}), not a runnable image: mount it as an image volume",
                artifact.artifact_type
            )));
        }
        let name = container_name(&metadata, &sandbox_config.metadata.clone().unwrap_or_default());
        let name_lock = self.name_locks.lock(&name).await;
        if let Some(holder) = self.store.name_holder(Kind::Container, &name)? {
            if self.unclaimed.claim::<ContainerRecord>(&self.store, &holder)? {
                tracing::info!(container = %holder, "handing a container made for a timed-out request to its retry");
                return Ok((holder, name_lock));
            }
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
            image_name: match &checkpoint {
                Some(c) if !c.config.rootfs_image_name.is_empty() => c.config.rootfs_image_name.clone(),
                _ => display_image_name(&config, &image_name, &image),
            },
            image_ref: match &checkpoint {
                Some(c) if !c.config.rootfs_image.is_empty() => c.config.rootfs_image.clone(),
                _ => image_name,
            },
            image_id: image.id.clone(),
            chain_ids: image.layers.iter().map(|l| l.chain_id.clone()).collect(),
            image_volumes: Vec::new(),
            state: ContainerState::Created,
            pid: 0,
            created_at: scute_sys::clock::now_nanos(),
            started_at: 0,
            finished_at: 0,
            exit_code: 0,
            reason: String::new(),
            message: String::new(),
            log_path,
            cgroups_path: crate::cgroups::sibling(&sandbox.cgroups_path, &id),
            user: None,
            unclaimed: false,
            restored_from: checkpoint.as_ref().map(|c| c.source.to_string()),
            deferred: false,
        };
        self.store.create(&name, &record)?;
        let effective = self.with_handler_defaults(config.clone(), &sandbox.runtime_handler);
        match self
            .create_steps(
                &effective,
                &sandbox_config,
                &sandbox,
                &image,
                checkpoint.as_ref().map(|c| &c.source),
                &mut record,
            )
            .await
        {
            Ok(()) => {
                self.store.put(&record)?;
                tracing::info!(container = %id, sandbox = %sandbox_id, name = %name, "container created");
                self.emit(&id, &sandbox_id, api::ContainerEventType::ContainerCreatedEvent)
                    .await;
                Ok((id, name_lock))
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

    /// Applies the pod's runtime handler defaults: a container that asks for no seccomp profile
    /// gets RuntimeDefault under a handler configured with `default_seccomp = "runtime/default"`.
    fn with_handler_defaults(&self, mut config: api::ContainerConfig, handler: &str) -> api::ContainerConfig {
        let Some(handler) = self.config.handler(handler) else {
            return config;
        };
        if handler.default_seccomp == DefaultSeccomp::RuntimeDefault {
            let linux = config.linux.get_or_insert_with(Default::default);
            let security = linux.security_context.get_or_insert_with(Default::default);
            #[allow(deprecated)]
            let unset = security.seccomp.is_none() && security.seccomp_profile_path.is_empty();
            if unset {
                security.seccomp = Some(api::SecurityProfile {
                    profile_type: api::security_profile::ProfileType::RuntimeDefault as i32,
                    localhost_ref: String::new(),
                });
            }
        }
        config
    }

    async fn create_steps(
        &self,
        config: &api::ContainerConfig,
        sandbox_config: &api::PodSandboxConfig,
        sandbox: &crate::sandbox::record::SandboxRecord,
        image: &crate::image::record::ImageRecord,
        checkpoint: Option<&restore::Source>,
        record: &mut ContainerRecord,
    ) -> Result<(), ContainerError> {
        let dir = self.dir(&record.id);
        let rootfs = dir.join("rootfs");
        let ns = sandbox_config
            .linux
            .as_ref()
            .and_then(|l| l.security_context.as_ref())
            .and_then(|s| s.namespace_options.clone())
            .unwrap_or_default();
        let userns = sandbox.user_namespace();
        files::create_private_dir(&dir, userns.map(|pod| pod.gids.host_id))
            .map_err(failed("creating the container directory"))?;
        let volumes = self.resolve_image_volumes(config)?;
        if !volumes.is_empty() {
            // Held before they are mounted: garbage collection keeps the images' layers.
            record.image_volumes = volumes;
            self.store.put(&*record)?;
        }
        if let Some(source) = checkpoint {
            if userns.is_some() {
                return Err(ContainerError::FailedPrecondition(
                    "restoring a checkpoint into a pod with a user namespace is not supported".into(),
                ));
            }
            // Into the writable layer before the overlay is mounted on it.
            let (source, images, upper) = (source.clone(), dir.join("checkpoint"), dir.join("upper"));
            let log = (!record.log_path.is_empty()).then(|| PathBuf::from(&record.log_path));
            tokio::task::spawn_blocking(move || restore::unpack_checkpoint(&source, &images, &upper, log.as_deref()))
                .await
                .map_err(|e| ContainerError::Failed(format!("unpacking the checkpoint: {e}")))??;
        }
        // Mounted for what the spec reads from the image (its users, where its symlinks lead),
        // unmounted again at the end: StartContainer mounts them for the process.
        crate::blocking::run(|| -> Result<(), ContainerError> {
            let staged = self.mount_views(record, config, userns.as_ref(), sandbox.pause_pid)?;
            let config = staged.as_ref().unwrap_or(config);
            let replaced = crate::snapshot::rootfs::settle_mount_points(&rootfs)
                .map_err(failed("settling the image's /dev, /proc and /sys"))?;
            for what in replaced {
                tracing::warn!(container = %record.id, image = %image.id, "in the image, {what}: replaced by a directory in the container's layer");
            }
            let cdi_devices = CdiRegistry::requested(&config.cdi_devices, &config.annotations)?;
            let mut spec = container_spec(&ContainerSpec {
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
                userns,
                cgroups_path: record.cgroups_path.clone(),
                oom_score_adj_floor: clamp_oom_score_adj(-1000),
                host: &self.host,
            })?;
            // Last, as containerd's WithCDI: a vendor's edits win over what the request built.
            if !cdi_devices.is_empty() {
                self.cdi.inject(&mut spec, &cdi_devices, userns.is_some())?;
                check_cdi_ids(&spec, userns.as_ref())?;
                tracing::info!(container = %record.id, devices = %cdi_devices.join(","), "CDI devices injected");
            }
            if let Some(user) = spec.process().as_ref().map(|p| p.user()) {
                let mut groups = vec![user.gid()];
                groups.extend(user.additional_gids().iter().flatten().filter(|g| **g != user.gid()));
                record.user = Some((user.uid(), user.gid(), groups));
            }
            bind_sources::refuse_binds_into_procfs(&spec, &rootfs).map_err(ContainerError::FailedPrecondition)?;
            files::write_bundle(&dir, &spec).map_err(failed("writing the bundle"))?;
            if !record.log_path.is_empty() {
                if let Some(parent) = std::path::Path::new(&record.log_path).parent() {
                    std::fs::create_dir_all(parent).map_err(failed("creating the log directory"))?;
                }
            }
            release::unmount_views(&dir)
        })?;
        record.deferred = true;
        Ok(())
    }

    /// Mounts what the container's spec binds that scute makes: its rootfs (the image's layers
    /// under its writable layer, idmapped in a pod with a user namespace), its image volumes'
    /// views and, in such a pod, its idmapped volumes' views. Answers the config with those
    /// mounts bound from their views (None: no volume is). Made the same way at CreateContainer
    /// and at StartContainer: the views' paths depend only on the container. What was mounted
    /// before a failure stays for the caller's rollback (`release`).
    fn mount_views(
        &self,
        record: &ContainerRecord,
        config: &api::ContainerConfig,
        userns: Option<&crate::oci::userns::PodUserNs>,
        pause_pid: u32,
    ) -> Result<Option<api::ContainerConfig>, ContainerError> {
        let dir = self.dir(&record.id);
        let lowers: Vec<PathBuf> = record
            .chain_ids
            .iter()
            .rev()
            .map(|chain_id| self.images.snapshots().fs_path(chain_id))
            .collect();
        // In a pod user namespace the image's files must appear as the pod's: idmapped layers.
        let ns_file = match userns {
            Some(_) => Some(
                std::fs::File::open(format!("/proc/{pause_pid}/ns/user"))
                    .map_err(failed("opening the pod's user namespace"))?,
            ),
            None => None,
        };
        let with_volumes = self.stage_image_volumes(config, &record.image_volumes, &dir, ns_file.as_ref())?;
        let config = with_volumes.as_ref().unwrap_or(config);
        let rootfs = dir.join("rootfs");
        match (userns, &ns_file) {
            (Some(pod), Some(ns_file)) => {
                let root_ids = (pod.uids.host_id, pod.gids.host_id);
                crate::snapshot::idmap::mount_overlay_idmapped(
                    &lowers,
                    &dir,
                    &dir.join("upper"),
                    &dir.join("work"),
                    &rootfs,
                    ns_file,
                    root_ids,
                )
                .map_err(failed("mounting the container's idmapped rootfs"))?;
                let staged = stage_idmapped_volumes(config, pod, &dir, ns_file)?;
                Ok(staged.or(with_volumes))
            }
            _ => {
                crate::snapshot::mount_overlay(&lowers, &dir.join("upper"), &dir.join("work"), &rootfs)
                    .map_err(failed("mounting the container's rootfs"))?;
                Ok(with_volumes)
            }
        }
    }

    pub fn get(&self, id: &str) -> Result<ContainerRecord, ContainerError> {
        self.store
            .get::<ContainerRecord>(id)?
            .ok_or_else(|| ContainerError::NotFound(format!("container {id:?} not found")))
    }

    /// The record brought up to date with its shim: a Running container that exited (also while
    /// the daemon was down) becomes Exited with the code and time the shim recorded.
    /// An exit is stored (and its STOPPED event sent) once, by whichever caller sees it first.
    pub async fn refresh(&self, record: ContainerRecord) -> Result<ContainerRecord, ContainerError> {
        if record.state != ContainerState::Running {
            return Ok(record);
        }
        let Ok(shim) = self.shim(&record.sandbox_id).await else {
            if !self.sandboxes.shim_gone(&record.sandbox_id).await {
                // Alive but not answering (a loaded node): no exit is made up.
                return Err(ContainerError::FailedPrecondition(format!(
                    "the shim of pod sandbox {} does not answer",
                    record.sandbox_id
                )));
            }
            // The shim writes each exit it reaps to disk before reporting it: one from before
            // it died is the container's own (a Job's 0 stays a success).
            let shim_dir = crate::sandbox::manager::shim_dir(&self.config.state, &record.sandbox_id);
            let reaped = crate::shim_client::read_exit_file(&shim_dir, &record.id).ok().flatten();
            return self
                .commit_exit(&record.id, |r| match reaped {
                    Some(exit) => r.exited(exit.exit_code, exit.finished_at_ns, exit.oom_killed),
                    None => {
                        r.exited(255, scute_sys::clock::now_nanos(), false);
                        r.reason = "Unknown".into();
                        r.message = "the pod's shim is gone".into();
                    }
                })
                .await;
        };
        match shim.state(&record.id).await {
            Ok(state) if state.status == ShimStatus::Stopped => {
                self.commit_exit(&record.id, |r| {
                    r.exited(
                        state.exit_code.unwrap_or(255),
                        state.finished_at_ns.unwrap_or_else(scute_sys::clock::now_nanos),
                        state.oom_killed,
                    )
                })
                .await
            }
            Ok(_) => Ok(record),
            Err(ShimError::NotFound(_)) => {
                self.commit_exit(&record.id, |r| {
                    r.exited(255, scute_sys::clock::now_nanos(), false);
                    r.reason = "Unknown".into();
                })
                .await
            }
            Err(e) => Err(shim_failed("asking the shim")(e)),
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
        self.unclaimed.forget(&id);
        {
            let _order = self.transitions.lock().await;
            self.store.delete::<ContainerRecord>(&id, Some(&record.name))?;
            self.emit(&id, &record.sandbox_id, api::ContainerEventType::ContainerDeletedEvent)
                .await;
        }
        tracing::info!(container = %id, "container removed");
        Ok(())
    }

    /// After a daemon restart: a container whose creation was cut short (its process was never
    /// created) is removed entirely, so its name is free for the kubelet's retry.
    pub async fn recover(&self) -> Result<(), ContainerError> {
        for record in self.list_records()? {
            // Exited while the daemon was down, or stored before a crash cut its release short.
            if record.state == ContainerState::Exited {
                self.release_later(&record.id);
            }
            // (Records from before deferred creates: a restore has no process until it starts.)
            let finished = record.deferred || record.pid != 0 || record.restored_from.is_some();
            if record.state == ContainerState::Created && !finished {
                tracing::warn!(container = %record.id, "creation was interrupted: removing what it left");
                if let Err(e) = self.cleanup(&record).await {
                    tracing::warn!(container = %record.id, error = %e, "cleaning up an interrupted creation");
                }
                self.store.delete::<ContainerRecord>(&record.id, Some(&record.name))?;
            }
            // A start the daemon stopped in, after its rootfs was mounted: the shim may have
            // started the process before Running was stored.
            if record.state == ContainerState::Created && record.deferred && self.rootfs_mounted(&record) {
                self.adopt_cut_start(Arc::unwrap_or_clone(record)).await;
            }
        }
        Ok(())
    }

    /// Kills every container of a pod (StopPodSandbox). No grace period: the CRI has the kubelet
    /// stop them gracefully first, and containerd kills them here too.
    pub async fn kill_all_in(&self, sandbox_id: &str) -> Result<(), ContainerError> {
        for record in self.in_sandbox(sandbox_id)? {
            self.stop(&record.id, Duration::ZERO).await?;
        }
        Ok(())
    }

    /// Whether the pod's shim may still hold one of its containers: one running, or one whose
    /// rootfs is mounted (an exit not yet released, a start cut short, a created container from
    /// before deferred creates, whose init waits in the shim). A created container is not in the
    /// shim until it starts. StopPodSandbox ends a shim that holds none of them.
    pub fn shim_holds_any_in(&self, sandbox_id: &str) -> Result<bool, ContainerError> {
        Ok(self
            .in_sandbox(sandbox_id)?
            .iter()
            .any(|c| c.state == ContainerState::Running || self.rootfs_mounted(c)))
    }

    /// Removes every container of a pod (RemovePodSandbox).
    pub async fn remove_all_in(&self, sandbox_id: &str) -> Result<(), ContainerError> {
        for record in self.in_sandbox(sandbox_id)? {
            self.remove(&record.id).await?;
        }
        Ok(())
    }

    fn in_sandbox(&self, sandbox_id: &str) -> Result<Vec<ContainerRecord>, ContainerError> {
        let Some(id) = self.sandboxes.resolve_known(sandbox_id)? else {
            return Ok(Vec::new());
        };
        Ok(self
            .list_records()?
            .into_iter()
            .filter(|c| c.sandbox_id == id)
            .map(Arc::unwrap_or_clone)
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

/// Volumes the kubelet asks to be idmapped (CRI mounts with uid/gid mappings, in a pod with its
/// own user namespace) get an idmapped view each, which the spec binds instead of the host path.
/// None when no mount asks. The mappings must be the pod's: the view is made through the pod's
/// user namespace.
fn stage_idmapped_volumes(
    config: &api::ContainerConfig,
    pod: &crate::oci::userns::PodUserNs,
    dir: &std::path::Path,
    userns: &std::fs::File,
) -> Result<Option<api::ContainerConfig>, ContainerError> {
    if config
        .mounts
        .iter()
        .all(|m| m.uid_mappings.is_empty() && m.gid_mappings.is_empty())
    {
        return Ok(None);
    }
    let same = |maps: &[api::IdMapping], range: &crate::oci::userns::IdRange| matches!(maps, [m] if m.container_id == range.container_id && m.host_id == range.host_id && m.length == range.length);
    let mut staged = config.clone();
    for (i, mount) in staged.mounts.iter_mut().enumerate() {
        if mount.uid_mappings.is_empty() && mount.gid_mappings.is_empty() {
            continue;
        }
        if !same(&mount.uid_mappings, &pod.uids) || !same(&mount.gid_mappings, &pod.gids) {
            return Err(ContainerError::InvalidArgument(format!(
                "mount at {}: idmapped mounts must use the pod's user namespace mappings",
                mount.container_path
            )));
        }
        let view =
            crate::snapshot::idmap::stage_idmapped_volume(std::path::Path::new(&mount.host_path), dir, i, userns)
                .map_err(failed(&format!("idmapping the volume {}", mount.host_path)))?;
        mount.host_path = view.display().to_string();
        mount.uid_mappings.clear();
        mount.gid_mappings.clear();
    }
    Ok(Some(staged))
}

/// The image name a container reports (containerd's behaviour): the kubelet's
/// `user_specified_image` when it sent one (it sends the ID in `image`); else the name the
/// request used, unless that was the image's ID or an ID prefix, then the image's first repo
/// tag (or digest). The kubelet copies this verbatim into `containerStatuses[].image`.
fn display_image_name(
    config: &api::ContainerConfig,
    requested: &str,
    image: &crate::image::record::ImageRecord,
) -> String {
    if let Some(user) = config
        .image
        .as_ref()
        .map(|i| i.user_specified_image.as_str())
        .filter(|u| !u.is_empty())
    {
        return user.to_string();
    }
    let id = image.id.to_string();
    let hex = id.strip_prefix("sha256:").unwrap_or(&id);
    let by_id =
        id.starts_with(requested) || (requested.chars().all(|c| c.is_ascii_hexdigit()) && hex.starts_with(requested));
    if !by_id {
        return requested.to_string();
    }
    image
        .repo_tags
        .first()
        .or(image.repo_digests.first())
        .cloned()
        .unwrap_or_else(|| requested.to_string())
}

#[cfg(test)]
mod tests {}
