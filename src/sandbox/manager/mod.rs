//! The sandbox manager owns pod sandboxes: their records, directories, pinned network
//! namespaces, CNI attachments, /dev/shm mounts, pause rootfs views and shims.
//!
//! On disk, per sandbox:
//! - `<root>/sandboxes/<id>/`: `hostname`, `hosts`, `resolv.conf`, `shm/` (tmpfs), `rootfs/`
//!   (overlay of the sandbox image, `upper/` + `work/`), `bundle/config.json` (pause's spec).
//!   The dir is 0700, or 0710 group-owned by the pod root's host gid for a pod with its own user
//!   namespace (see `files::create_private_dir`): no other host user passes it;
//! - `<state>/netns/<id>`: the pinned network namespace;
//! - `<state>/shims/<id>/`: the shim's socket, pid, log and exit files.
//!
//! Every create step has its undo; a failed RunPodSandbox leaves nothing behind. The manager
//! sequences the steps; the pause container's are in `pause`, the network's in `network`.

mod network;
mod pause;

use std::collections::HashMap;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{Mutex, Semaphore};

pub use pause::clamp_oom_score_adj;

use super::cni::CniManager;
use super::exit_notices::ExitNotices;
use super::files;
use super::netns::NetNs;
use super::record::{sandbox_name, SandboxRecord, SandboxState};
use crate::api;
use crate::cgroups::DEFAULT_CGROUPFS_PARENT;
use crate::config::Config;
use crate::events::{Events, PodContainers};
use crate::handover::Unclaimed;
use crate::image::{Credentials, ImageError, ImageManager};
use crate::keyed_lock::{KeyedGuard, KeyedLocks};
use crate::oci::userns;
use crate::oci::SpecError;
use crate::shim_client::{ContainerStatus as ShimStatus, ShimClient, ShimError};
use crate::store::{self, Kind, Store};

/// The pause container's ID inside its shim.
pub const PAUSE_ID: &str = "pause";

#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
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
    Spec(#[from] SpecError),
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

fn failed(what: &str) -> impl FnOnce(std::io::Error) -> SandboxError + '_ {
    move |source| SandboxError::Io {
        what: what.to_string(),
        source,
    }
}

fn shim_failed(what: &str) -> impl FnOnce(ShimError) -> SandboxError + '_ {
    move |source| SandboxError::Shim {
        what: what.to_string(),
        source,
    }
}

pub struct SandboxManager {
    config: Arc<Config>,
    store: Arc<Store>,
    images: Arc<ImageManager>,
    cni: CniManager,
    shim_binary: PathBuf,
    shims: Mutex<HashMap<String, Arc<ShimClient>>>,
    name_locks: KeyedLocks,
    id_locks: KeyedLocks,
    /// Per pod: held shared by each CreateContainer, alone by StopPodSandbox and
    /// RemovePodSandbox (see `admit_containers`).
    container_gates: KeyedLocks,
    /// Sandboxes made but not yet handed to a caller (see `run`).
    unclaimed: Arc<Unclaimed>,
    /// Where the pod's own events go (`sandbox/events.rs`), with its containers' statuses.
    pub(super) events: Arc<Events>,
    pub(super) pod_containers: PodContainers,
    /// The exits the shims push, for stops waiting on one.
    pub exit_notices: ExitNotices,
    /// Turns for RunPodSandbox (`runtime.max_parallel_sandbox_starts`), handed out in arrival
    /// order (tokio's semaphore is fair).
    starts: Arc<Semaphore>,
}

/// How long a start holds its turn: a pod start on a busy node takes a tenth of that; one
/// still going waits on something (a CNI plugin's IPAM, the sandbox image's pull), not for the
/// CPUs, and must not hold up the pods behind it.
const START_TURN: Duration = Duration::from_secs(1);

impl SandboxManager {
    pub fn new(
        config: Arc<Config>,
        store: Arc<Store>,
        images: Arc<ImageManager>,
        shim_binary: PathBuf,
        events: Arc<Events>,
        pod_containers: PodContainers,
    ) -> SandboxManager {
        let cni = CniManager::new(&config.cni, &config.state);
        SandboxManager {
            store,
            images,
            cni,
            shim_binary,
            shims: Mutex::new(HashMap::new()),
            name_locks: KeyedLocks::default(),
            id_locks: KeyedLocks::default(),
            container_gates: KeyedLocks::default(),
            unclaimed: Default::default(),
            events,
            pod_containers,
            exit_notices: ExitNotices::default(),
            starts: Arc::new(Semaphore::new(config.runtime.sandbox_starts())),
            config,
        }
    }

    pub fn cni(&self) -> &CniManager {
        &self.cni
    }

    pub fn sandbox_dir(&self, id: &str) -> PathBuf {
        self.config.root.join("sandboxes").join(id)
    }

    /// The pod's own cgroup: the cgroup parent the kubelet gave, which holds pause and the pod's
    /// containers and nothing else. None under scute's default parent, which every pod shares.
    pub fn pod_cgroup(&self, record: &SandboxRecord) -> Option<String> {
        crate::cgroups::pod_dir(&record.cgroups_path)
    }

    /// The shim's state dir. Named by the first 32 hex digits of the ID (128 random bits): the
    /// socket inside must fit sun_path's 108 bytes even under a long state dir.
    fn shim_dir(&self, id: &str) -> PathBuf {
        shim_dir(&self.config.state, id)
    }

    fn netns_path(&self, id: &str) -> PathBuf {
        self.config.state.join("netns").join(id)
    }

    /// Resolves a full ID or unique prefix.
    pub fn resolve(&self, id_or_prefix: &str) -> Result<String, SandboxError> {
        match self.store.resolve_id(Kind::Sandbox, id_or_prefix) {
            Ok(id) => Ok(id),
            Err(store::Error::NotFound { .. }) => Err(SandboxError::NotFound(format!(
                "pod sandbox {id_or_prefix:?} not found"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// `resolve` for the idempotent calls (stop, remove): an unknown sandbox is `None`.
    pub fn resolve_known(&self, id_or_prefix: &str) -> Result<Option<String>, SandboxError> {
        match self.resolve(id_or_prefix) {
            Ok(id) => Ok(Some(id)),
            Err(SandboxError::NotFound(_)) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn get(&self, id: &str) -> Result<SandboxRecord, SandboxError> {
        self.store
            .get::<SandboxRecord>(id)?
            .ok_or_else(|| SandboxError::NotFound(format!("pod sandbox {id:?} not found")))
    }

    /// Every sandbox's record, shared with the store's cache (clone what is kept or changed:
    /// a record holds its CNI result, a JSON tree).
    pub fn list(&self) -> Result<Vec<Arc<SandboxRecord>>, SandboxError> {
        Ok(self.store.list_shared::<SandboxRecord>()?)
    }

    /// RunPodSandbox. The work runs in a task of its own and a sandbox made after the kubelet
    /// stopped waiting is kept for its retry (see `handover`).
    pub async fn run(self: &Arc<Self>, config: api::PodSandboxConfig, handler: String) -> Result<String, SandboxError> {
        super::validate::validate(&config, &handler, &self.config).map_err(SandboxError::InvalidArgument)?;
        let manager = self.clone();
        self.unclaimed
            .run(
                |answer| async move {
                    let metadata = config.metadata.clone().unwrap_or_default();
                    let name = sandbox_name(&metadata);
                    let _name_lock = manager.name_locks.lock(&name).await;
                    let result = manager.in_turn(&name, manager.run_named(&name, config, handler)).await;
                    if let Some(id) = answer.send(result) {
                        match manager.unclaimed.keep::<SandboxRecord>(&manager.store, &id) {
                            Ok(()) => tracing::info!(sandbox = %id, "sandbox created after the caller gave up; kept for its retry"),
                            Err(e) => tracing::warn!(sandbox = %id, error = %e, "keeping a sandbox for its retry"),
                        }
                    }
                },
                || SandboxError::Failed("sandbox creation task died".into()),
            )
            .await
    }

    /// Runs a pod start in its turn: with every pod of a scale-up started at once, the CPUs are
    /// shared by all of them and all are ready late (each start then took seconds, against
    /// tens of milliseconds alone); in turns, one per CPU, the first are ready soonest and the
    /// last no later, and the kubelet's status calls meanwhile find the CPUs less busy.
    async fn in_turn<T>(&self, name: &str, start: impl std::future::Future<Output = T>) -> T {
        let turn = self.starts.acquire().await;
        tokio::pin!(start);
        tokio::select! {
            done = &mut start => done,
            _ = tokio::time::sleep(START_TURN) => {
                drop(turn);
                tracing::info!(
                    sandbox_name = %name,
                    "pod start still going after {START_TURN:?}: the next start goes ahead (runtime.max_parallel_sandbox_starts)"
                );
                start.await
            }
        }
    }

    /// Creates the sandbox `name` (its name lock held), or hands over an unclaimed one.
    async fn run_named(
        &self,
        name: &str,
        config: api::PodSandboxConfig,
        handler: String,
    ) -> Result<String, SandboxError> {
        let name = name.to_string();
        if let Some(holder) = self.store.name_holder(Kind::Sandbox, &name)? {
            if self.unclaimed.claim::<SandboxRecord>(&self.store, &holder)? {
                tracing::info!(sandbox = %holder, "handing a sandbox made for a timed-out request to its retry");
                return Ok(holder);
            }
            return Err(SandboxError::AlreadyExists(format!(
                "pod sandbox name {name:?} is reserved for sandbox {holder}"
            )));
        }
        let id = crate::ids::random_id();
        tracing::Span::current().record("id", id.as_str());
        let linux = config.linux.clone().unwrap_or_default();
        let security = linux.security_context.clone().unwrap_or_default();
        let ns = security.namespace_options.clone().unwrap_or_default();
        let host_network = ns.network() == api::NamespaceMode::Node;
        let cgroups_path = self.cgroups_path(&linux.cgroup_parent, &id)?;
        let mut record = SandboxRecord {
            id: id.clone(),
            name: name.clone(),
            config: SandboxRecord::encode_config(&config),
            runtime_handler: handler,
            created_at: scute_sys::clock::now_nanos(),
            state: SandboxState::NotReady,
            ips: Vec::new(),
            netns: (!host_network).then(|| self.netns_path(&id)),
            pause_pid: 0,
            cni_result: None,
            cgroups_path,
            unclaimed: false,
            network_released: false,
        };
        self.store.create(&name, &record)?;
        match self.create_steps(&config, &mut record).await {
            Ok(()) => {
                record.made_ready();
                self.store.put(&record)?;
                tracing::info!(sandbox = %id, name = %name, ip = ?record.ips, "pod sandbox ready");
                self.send_event(&id, api::ContainerEventType::ContainerCreatedEvent)
                    .await;
                self.send_event(&id, api::ContainerEventType::ContainerStartedEvent)
                    .await;
                Ok(id)
            }
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "pod sandbox creation failed; rolling back");
                if let Err(cleanup) = self.teardown(&record, Teardown::Remove).await {
                    tracing::error!(sandbox = %id, error = %cleanup, "rollback left something behind");
                }
                self.store.delete::<SandboxRecord>(&id, Some(&name))?;
                Err(e)
            }
        }
    }

    async fn create_steps(
        &self,
        config: &api::PodSandboxConfig,
        record: &mut SandboxRecord,
    ) -> Result<(), SandboxError> {
        let id = record.id.clone();
        let dir = self.sandbox_dir(&id);
        let linux = config.linux.clone().unwrap_or_default();
        let security = linux.security_context.clone().unwrap_or_default();
        let ns = security.namespace_options.clone().unwrap_or_default();
        let userns = userns::pod_user_namespace(&ns).map_err(SandboxError::InvalidArgument)?;
        files::create_private_dir(&dir, userns.map(|pod| pod.gids.host_id))
            .map_err(failed("creating the sandbox directory"))?;

        // The sandbox image: the embedded pause unless configured otherwise; pulled if missing.
        let image = match self.images.resolve(&self.config.image.sandbox_image) {
            Ok(image) => image,
            Err(ImageError::NotFound(_)) => {
                self.images
                    .pull(
                        &self.config.image.sandbox_image,
                        &Credentials::default(),
                        &record.runtime_handler,
                    )
                    .await?
            }
            Err(e) => return Err(e.into()),
        };

        // Network: pinned netns (lo up) + CNI (the pod network), attached while pause is
        // made: neither needs the other (pause joins the pinned netns, the plugins configure it)
        // and the plugins' execs were a third of RunPodSandbox. A pod with its own user
        // namespace gets its network namespace from pause, so its network comes after pause.
        let network_first = match (&record.netns, &userns) {
            (Some(netns), None) => {
                network::create_netns(netns).await?;
                Some(netns.clone())
            }
            _ => None,
        };
        let network = async {
            match &network_first {
                Some(netns) => Some(self.cni_attach(config, &id, netns).await),
                None => None,
            }
        };
        let (attached, pause) = if network::needs_network_before_pause(&linux.sysctls) {
            match network.await {
                Some(Err(e)) => return Err(e),
                attached => (attached, self.start_pause(config, record, &image, userns).await),
            }
        } else {
            tokio::join!(network, self.start_pause(config, record, &image, userns))
        };
        // What either made is on record before an error is answered: the rollback undoes both.
        if let Ok((pid, _)) = &pause {
            record.pause_pid = *pid;
        }
        if let Some(attached) = attached {
            self.record_network(record, attached?)?;
        }
        let (_, hostname) = pause?;
        if let (Some(netns), Some(_)) = (&record.netns, &userns) {
            NetNs::pin_from_process(netns, record.pause_pid).map_err(failed("pinning the pod's network namespace"))?;
            let netns = netns.clone();
            let attached = self.cni_attach(config, &id, &netns).await?;
            self.record_network(record, attached)?;
        }

        // /etc/hosts names the pod's addresses, known once the network is up.
        let ips: Vec<std::net::IpAddr> = record.ips.iter().filter_map(|ip| ip.parse().ok()).collect();
        files::write_atomic(&dir.join("hosts"), &files::hosts_file(&hostname, &ips))
            .map_err(failed("writing hosts"))?;
        Ok(())
    }

    fn cgroups_path(&self, parent: &str, id: &str) -> Result<String, SandboxError> {
        crate::cgroups::member_path(self.config.runtime.cgroup_driver, parent, id)
            .map_err(SandboxError::InvalidArgument)
    }

    /// The shim of a sandbox (connecting to it after a daemon restart), if it is alive.
    pub async fn shim_for(&self, id: &str) -> Option<Arc<ShimClient>> {
        self.shim(id).await
    }

    async fn shim(&self, id: &str) -> Option<Arc<ShimClient>> {
        let mut shims = self.shims.lock().await;
        if let Some(shim) = shims.get(id) {
            if !shim.exited() {
                return Some(shim.clone());
            }
            // Killed or crashed: its connection is dead for good, and the connect below finds
            // nobody (or a shim started since, which is whom to ask).
            shims.remove(id);
        }
        let shim = Arc::new(ShimClient::connect(&self.shim_dir(id)).await.ok()?);
        shims.insert(id.to_string(), shim.clone());
        Some(shim)
    }

    /// PortForward's connection: to `port` on the pod's loopback, in its network namespace (the
    /// host's for host-network pods). NotFound for an unknown sandbox, FailedPrecondition for one
    /// that is not ready; a refused connection is an error the caller reports on the stream.
    pub async fn connect_port(&self, id: &str, port: u16) -> Result<io::Result<tokio::net::TcpStream>, SandboxError> {
        let record = self.get(id)?;
        if self.live_state(&record).await != SandboxState::Ready {
            return Err(SandboxError::FailedPrecondition(format!(
                "pod sandbox {id} is not ready: port-forward needs its network"
            )));
        }
        let netns = record.netns.clone();
        let connected = tokio::task::spawn_blocking(move || match netns {
            Some(path) => NetNs::open(&path)?.connect_loopback(port),
            None => super::netns::connect_loopback(port),
        })
        .await
        .map_err(|e| SandboxError::Failed(format!("port-forward connect task: {e}")))?;
        Ok(connected.and_then(|stream| {
            stream.set_nonblocking(true)?;
            tokio::net::TcpStream::from_std(stream)
        }))
    }

    /// The sandbox's state as it is now: a Ready sandbox whose pause has exited is NotReady.
    pub async fn live_state(&self, record: &SandboxRecord) -> SandboxState {
        if record.state != SandboxState::Ready {
            return record.state;
        }
        match self.shim(&record.id).await {
            Some(shim) => match shim.state(PAUSE_ID).await {
                Ok(state) if state.status == ShimStatus::Running => SandboxState::Ready,
                Ok(_) => SandboxState::NotReady,
                Err(_) => SandboxState::Unknown,
            },
            None => SandboxState::NotReady,
        }
    }

    /// Whether the shim of `id` is gone for good: its socket is missing or refuses connections,
    /// which a live shim's never does (a busy one queues them). Not a timeout's guess: this is
    /// what the daemon kills a pod's leftover processes on.
    pub async fn shim_gone(&self, id: &str) -> bool {
        let socket = self.shim_dir(id).join(crate::shim_client::SOCKET_FILE);
        // Non-blocking: a shim whose backlog is full answers EAGAIN (alive), never a wait.
        match tokio::net::UnixStream::connect(&socket).await {
            Ok(_) => false,
            Err(e) => matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::ConnectionRefused),
        }
    }

    /// The shim of `id` died (SIGKILLed, crashed) while its pod was Ready: pause and whatever
    /// else is left in its cgroup are killed (libcontainer's delete, which would do it, ran in
    /// the shim; containerd kills a dead shim's tasks too), and the pod becomes NotReady as when
    /// pause exits. Nothing for a pod already stopped or removed, whose shim its removal shut
    /// down. Its containers are the container manager's.
    pub async fn shim_died(&self, id: &str) -> Result<(), SandboxError> {
        self.stopped_by_itself(id, true).await
    }

    /// For `scute doctor`: whether the shim of `id` is gone (its socket refuses, or the cached
    /// connection finds nobody), its pause exited, or it did not answer (a loaded node: not a
    /// verdict).
    pub async fn shim_health(&self, id: &str) -> ShimHealth {
        if self.shim_gone(id).await {
            return ShimHealth::Gone;
        }
        let Some(shim) = self.shim(id).await else {
            return ShimHealth::Silent;
        };
        match shim.state(PAUSE_ID).await {
            Ok(state) if state.status == ShimStatus::Running => ShimHealth::Running,
            Ok(_) | Err(ShimError::NotFound(_)) => ShimHealth::PauseExited,
            Err(ShimError::Gone(_)) => ShimHealth::Gone,
            Err(_) => ShimHealth::Silent,
        }
    }

    /// Held by a CreateContainer from its check that the pod is ready until its container is
    /// stored and in the shim; many creates of one pod go on at once.
    pub async fn admit_containers(&self, id: &str) -> KeyedGuard<'_> {
        self.container_gates.share(id).await
    }

    /// Held by StopPodSandbox and RemovePodSandbox (`id` resolved) around the whole of their
    /// work: a create that checked the pod was ready before the stop has its container stored
    /// before the stop decides whether the shim holds any (and may end it), and none starts
    /// after; the create then finds the pod not ready.
    pub async fn close_to_containers(&self, id: &str) -> KeyedGuard<'_> {
        self.container_gates.lock(id).await
    }

    /// StopPodSandbox: stops pause (its containers are stopped first, by the caller), detaches
    /// the network and releases the netns, /dev/shm and pause's image view. With `end_shim` (the
    /// caller found no container the shim still holds) the shim ends too, as containerd's does
    /// once its tasks are deleted: a stopped pod the kubelet keeps (a finished Job's) costs no
    /// process.
    /// Idempotent; `id` is whole (the caller resolved it to key the pod's gate), and a sandbox
    /// removed meanwhile is fine.
    pub async fn stop(&self, id: &str, end_shim: bool) -> Result<(), SandboxError> {
        let _lock = self.id_locks.lock(id).await;
        let Some(mut record) = self.store.get::<SandboxRecord>(id)? else {
            return Ok(());
        };
        let teardown = if end_shim {
            Teardown::EndShim
        } else {
            Teardown::KeepShim
        };
        let released = self.teardown_steps(&record, teardown).await?;
        // Pause is stopped: the pod is NotReady even when releasing its network or /dev/shm
        // failed, which a retry does again (its shim may have ended: nobody else would mark it).
        if released.is_ok() {
            record.network_released = true;
        }
        let was_ready = record.stopped();
        self.store.put(&record)?;
        match &released {
            Ok(()) => tracing::info!(sandbox = %id, "pod sandbox stopped"),
            Err(e) => {
                tracing::warn!(sandbox = %id, error = %e, "pod sandbox stopped, but not released; a retry releases it")
            }
        }
        // Decided and sent under the sandbox's lock, as `pause_exited` does: whichever of the
        // two moves it from Ready reports STOPPED, so the event goes out exactly once (not on
        // retries, nor after pause exited first and that was reported).
        if was_ready {
            self.send_event(id, api::ContainerEventType::ContainerStoppedEvent)
                .await;
        }
        released
    }

    /// The pause of `id` exited without a StopPodSandbox: a Ready sandbox
    /// becomes NotReady (its network stays until the kubelet stops it, as with containerd) and
    /// its STOPPED event goes out, the Evented PLEG's only news of it. Once: a StopPodSandbox
    /// that comes first stores NotReady itself (and sends the event).
    pub async fn pause_exited(&self, id: &str) -> Result<(), SandboxError> {
        self.stopped_by_itself(id, false).await
    }

    async fn stopped_by_itself(&self, id: &str, shim_died: bool) -> Result<(), SandboxError> {
        let _lock = self.id_locks.lock(id).await;
        let Some(mut record) = self.store.get::<SandboxRecord>(id)? else {
            return Ok(());
        };
        if !record.stopped() {
            return Ok(());
        }
        if shim_died {
            let killed = crate::cgroups::kill_all(&record.cgroups_path);
            tracing::warn!(sandbox = %id, killed, "the pod's shim died: pod sandbox NotReady, its pause killed");
        } else {
            tracing::warn!(sandbox = %id, "pause exited by itself: pod sandbox NotReady");
        }
        self.store.put(&record)?;
        self.send_event(id, api::ContainerEventType::ContainerStoppedEvent)
            .await;
        Ok(())
    }

    /// UpdatePodSandboxResources: records the pod's new overhead and resources in its stored
    /// config (`linux.overhead`, `linux.resources`), replacing the old ones (the kubelet sends the
    /// whole pod-level set). Nothing is written to cgroups: see `server/sandbox_update_resources.rs`.
    pub async fn update_resources(
        &self,
        id_or_prefix: &str,
        overhead: Option<api::LinuxContainerResources>,
        resources: Option<api::LinuxContainerResources>,
    ) -> Result<String, SandboxError> {
        let id = self.resolve(id_or_prefix)?;
        let _lock = self.id_locks.lock(&id).await;
        let mut record = self.get(&id)?;
        let mut config = record.config();
        let linux = config.linux.get_or_insert_with(Default::default);
        if overhead.is_some() {
            linux.overhead = overhead;
        }
        if resources.is_some() {
            linux.resources = resources;
        }
        record.config = SandboxRecord::encode_config(&config);
        self.store.put(&record)?;
        tracing::info!(sandbox = %id, "pod sandbox resources recorded");
        Ok(id)
    }

    /// RemovePodSandbox: stops it if needed, then removes the shim, mounts, directories and
    /// record. `id` is whole, as for `stop`; a sandbox removed meanwhile is fine.
    pub async fn remove(&self, id: &str) -> Result<(), SandboxError> {
        let _lock = self.id_locks.lock(id).await;
        let Some(record) = self.store.get::<SandboxRecord>(id)? else {
            return Ok(());
        };
        // Built before the removal so it carries the pod's status: the kubelet finds the pod's
        // UID there (containerd 2 does the same).
        let deleted = self.event(id, api::ContainerEventType::ContainerDeletedEvent).await;
        self.teardown(&record, Teardown::Remove).await?;
        self.store.delete::<SandboxRecord>(id, Some(&record.name))?;
        self.unclaimed.forget(id);
        tracing::info!(sandbox = %id, "pod sandbox removed");
        if let Some(event) = deleted {
            self.events.send(event);
        }
        Ok(())
    }

    /// Undoes what create did, as far as `how` says.
    async fn teardown(&self, record: &SandboxRecord, how: Teardown) -> Result<(), SandboxError> {
        self.teardown_steps(record, how).await?
    }

    /// `teardown`, telling a failure to stop pause (the outer error: the pod may still run)
    /// from one after pause stopped (the inner: the network, /dev/shm or a removal step).
    async fn teardown_steps(
        &self,
        record: &SandboxRecord,
        how: Teardown,
    ) -> Result<Result<(), SandboxError>, SandboxError> {
        // Pause and the network go side by side: the netns is pinned, so the plugins' DEL does
        // not need pause, and it was most of StopPodSandbox.
        let end_shim = how != Teardown::KeepShim;
        let (pause, network) = tokio::join!(self.stop_pause(record, end_shim), self.detach_network(record));
        if let (Err(_), Err(e)) = (&pause, &network) {
            tracing::warn!(sandbox = %record.id, error = %e, "detaching the pod network also failed");
        }
        pause?;
        Ok(crate::blocking::run(|| self.release_after_pause(record, how, network)))
    }

    /// What a teardown releases once pause is stopped, given how the network's detach went.
    fn release_after_pause(
        &self,
        record: &SandboxRecord,
        how: Teardown,
        network: Result<(), SandboxError>,
    ) -> Result<(), SandboxError> {
        let id = &record.id;
        let remove = how == Teardown::Remove;
        network?;
        let dir = self.sandbox_dir(id);
        files::unmount_shm(&dir.join("shm")).map_err(failed("unmounting /dev/shm"))?;
        // Pause never runs again (a stopped pod is not restarted: the kubelet makes a new one),
        // so its image view goes with it, as containerd's does with its task: a node keeping many
        // stopped pods (finished Jobs) keeps no overlay for each, and every reader of the mount
        // table (libcontainer's, several times per container create) reads a line less.
        crate::snapshot::unmount_view(&dir.join("rootfs")).map_err(failed("unmounting the sandbox rootfs"))?;
        if remove {
            // Gone with pause already when the shim deleted it; not when the shim had died.
            remove_pod_cgroups(record);
            remove_dir_if_exists(&dir).map_err(failed("removing the sandbox directory"))?;
            remove_dir_if_exists(&self.shim_dir(id)).map_err(failed("removing the shim directory"))?;
        }
        Ok(())
    }

    /// After a daemon restart: reconnect every shim. A sandbox whose shim or pause is gone is
    /// NotReady with its network released; one whose creation was cut short (its pause never
    /// started) is removed entirely, so a crash leaves every pod either fully there or fully gone.
    ///
    /// A creation was cut short when its record never became Ready: its pause was never
    /// recorded, or (a pod whose network comes after pause) it is NotReady with pause still
    /// running, which a stopped sandbox never is.
    pub async fn recover(&self) -> Result<(), SandboxError> {
        for mut record in self.store.list::<SandboxRecord>()? {
            let interrupted = record.pause_pid == 0
                || (record.state == SandboxState::NotReady && self.pause_running(&record.id).await);
            if interrupted {
                tracing::warn!(sandbox = %record.id, "creation was interrupted: removing what it left");
                self.remove_interrupted(&record).await;
                self.store.delete::<SandboxRecord>(&record.id, Some(&record.name))?;
                continue;
            }
            let state = self.live_state(&record).await;
            if record.state == SandboxState::Ready && state != SandboxState::Ready {
                tracing::warn!(sandbox = %record.id, "pause or shim gone while scute was down: sandbox NotReady");
                // The shim (if alive) stays: what it holds of the containers is not known here.
                match self.teardown(&record, Teardown::KeepShim).await {
                    Ok(()) => record.network_released = true,
                    Err(e) => tracing::warn!(sandbox = %record.id, error = %e, "cleaning up after a lost sandbox"),
                }
                record.stopped();
                self.store.put(&record)?;
            }
        }
        Ok(())
    }

    /// Removes whatever an interrupted RunPodSandbox made, going on past failures (a crash can
    /// stop a creation between any two steps): the shim (also one still starting, found by its
    /// command line), the network, the mounts, the pause cgroup, the directories.
    async fn remove_interrupted(&self, record: &SandboxRecord) {
        let id = &record.id;
        let warn = |step: &str, error: &dyn std::fmt::Display| {
            tracing::warn!(sandbox = %id, step, error = %error, "cleaning up an interrupted creation");
        };
        if let Err(e) = self.teardown(record, Teardown::Remove).await {
            warn("teardown", &e);
        }
        // What teardown could not do, step by step; each step is a no-op when already done.
        kill_stray_shims(&self.shim_dir(id));
        self.shims.lock().await.remove(id);
        // A killed shim leaves its cgroup (removed below) only once it has exited.
        let shim_cgroup = crate::cgroups::shim_path(&record.cgroups_path, id);
        if !crate::cgroups::until_empty(&shim_cgroup, SHIM_EXIT_WAIT).await {
            warn("waiting for the shim to exit", &"it is still in its cgroup");
        }
        if let Some(netns) = &record.netns {
            if let Err(e) = self.cni_detach(&record.config(), id, netns).await {
                warn("CNI DEL", &e);
            }
            if let Err(e) = NetNs::remove(netns) {
                warn("removing the network namespace", &e);
            }
        }
        let dir = self.sandbox_dir(id);
        if let Err(e) = files::unmount_shm(&dir.join("shm")) {
            warn("unmounting /dev/shm", &e);
        }
        if let Err(e) = crate::snapshot::unmount_view(&dir.join("rootfs")) {
            warn("unmounting the sandbox rootfs", &e);
        }
        remove_pod_cgroups(record);
        for dir in [dir, self.shim_dir(id)] {
            if let Err(e) = remove_dir_if_exists(&dir) {
                warn("removing a directory", &e);
            }
        }
    }
}

/// Removes what is left of the pod's cgroups once pause and the shim are gone: pause's, the
/// shim's (cgroupfs: nobody else removes them; systemd removes scopes itself, and they are left
/// to it) and the shared default parent if it is empty now.
fn remove_pod_cgroups(record: &SandboxRecord) {
    crate::cgroups::remove_dirs(&crate::cgroups::dir(&record.cgroups_path));
    crate::cgroups::remove_dirs(&crate::cgroups::dir(&crate::cgroups::shim_path(
        &record.cgroups_path,
        &record.id,
    )));
    if record.cgroups_path.starts_with(&format!("{DEFAULT_CGROUPFS_PARENT}/")) {
        crate::cgroups::remove_dirs(DEFAULT_CGROUPFS_PARENT);
    }
}

/// How far a teardown goes beyond pause, the network and /dev/shm.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Teardown {
    /// A stop whose shim still holds a container (or may: a restart that found pause gone).
    KeepShim,
    /// A stop whose shim holds nothing but pause: pause is deleted and the shim ends.
    EndShim,
    /// RemovePodSandbox, or a failed or interrupted creation: the shim ends, the rootfs view,
    /// the pause cgroup and the directories go.
    Remove,
}

/// What [`SandboxManager::shim_health`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShimHealth {
    Running,
    PauseExited,
    Gone,
    /// It accepted a connection but did not answer in time.
    Silent,
}

/// The state dir of pod `id`'s shim (its socket is there), under the daemon's `state`.
pub fn shim_dir(state: &Path, id: &str) -> PathBuf {
    state.join("shims").join(&id[..id.len().min(32)])
}

/// How long an interrupted creation's cleanup waits for a killed shim to leave its cgroup.
const SHIM_EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// SIGKILLs every scute-shim serving `shim_dir` (its `--state-dir`): after a crash, a shim the
/// daemon was starting may not answer on its socket yet. Such a shim has created no container.
fn kill_stray_shims(shim_dir: &Path) {
    for (pid, dir) in running_shims() {
        if dir == shim_dir {
            tracing::warn!(pid, dir = %shim_dir.display(), "killing a shim left by an interrupted creation");
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// Every running scute-shim (any daemon's), with the state dir it serves (`--state-dir`).
pub fn running_shims() -> Vec<(i32, PathBuf)> {
    let Ok(procs) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    procs
        .flatten()
        .filter_map(|entry| {
            let pid = entry.file_name().to_string_lossy().parse::<i32>().ok()?;
            let cmdline = std::fs::read(entry.path().join("cmdline")).ok()?;
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            if !Path::new(std::ffi::OsStr::from_bytes(args.first()?)).ends_with("scute-shim") {
                return None;
            }
            let dir = args
                .windows(2)
                .find(|w| w[0] == b"--state-dir")
                .map(|w| w[1])
                .or_else(|| args.iter().find_map(|a| a.strip_prefix(b"--state-dir=")))?;
            Some((pid, PathBuf::from(std::ffi::OsStr::from_bytes(dir))))
        })
        .collect()
}

fn remove_dir_if_exists(dir: &Path) -> std::io::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}
