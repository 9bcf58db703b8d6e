//! `scute serve`: prepares the directories, opens the store, binds the CRI socket(s) and serves
//! until SIGTERM/SIGINT. Shutdown stops accepting, lets in-flight RPCs finish (bounded), closes
//! the store and removes the sockets. It never touches containers: they belong to their shims.

use std::collections::HashMap;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use tokio::net::UnixListener;
use tokio::signal::unix::{signal, SignalKind};
use tokio::sync::watch;
use tokio_stream::wrappers::UnixListenerStream;

use crate::config::Config;
use crate::container::manager::ContainerManager;
use crate::container::record::ContainerState;
use crate::distribution::reference::ImageRef;
use crate::events::{Events, PodContainers};
use crate::image::{ImageManager, ImageManagerConfig};
use crate::sandbox::manager::SandboxManager;
use crate::sandbox::record::SandboxState;
use crate::server::{admin_server, image_service_server, runtime_service_server, Cri, CriService};
use crate::store::Store;
use crate::streaming::StreamingServer;

/// How long in-flight RPCs may run after a shutdown signal before scute exits anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
const SOCKET_MODE: u32 = 0o660;
const STATE_DIR_MODE: u32 = 0o700;
const ROOT_DIR_MODE: u32 = 0o711;

pub async fn serve(config: Config) -> Result<()> {
    let config = Arc::new(config);
    crate::memory::spawn_trimmer();
    crate::cgroups::check_driver(config.runtime.cgroup_driver).map_err(anyhow::Error::msg)?;
    prepare_dir(&config.root, ROOT_DIR_MODE)?;
    prepare_dir(&config.state, STATE_DIR_MODE)?;

    crate::image::registry::preload_system_roots();
    let store_path = config.root.join("meta.redb");
    let store = tokio::task::spawn_blocking(move || Store::open(&store_path)).await??;
    let store = Arc::new(store);
    tracing::info!(path = %store.path().display(), schema = crate::store::SCHEMA_VERSION, "store open");
    secure_root(&config.root, &store).context("closing scute's root to other users")?;

    let images = ImageManager::open(
        store.clone(),
        ImageManagerConfig {
            root: &config.root,
            hosts_dir: &config.registry.config_path,
            max_concurrent_downloads: config.image.max_concurrent_downloads,
            discard_unpacked_layers: config.image.discard_unpacked_layers,
            min_free_disk_percent: config.image.min_free_disk_percent,
            pull_progress_timeout: std::time::Duration::from_secs(config.image.pull_progress_timeout_seconds),
            pinned: vec![ImageRef::parse(&config.image.sandbox_image)?.to_string()],
            held_snapshots: containers_snapshots(store.clone()),
        },
    )?;
    let images = Arc::new(images);
    // A check that fails must not keep the node from running pods: logged, and the start goes on.
    if let Err(e) = check_after_unclean_stop(&config, &store, &images).await {
        tracing::warn!(error = format!("{e:#}"), "checking the store after an unclean stop");
    }
    images
        .import_embedded_pause()
        .await
        .context("importing the embedded pause image")?;

    let shim_binary = std::env::current_exe()
        .context("locating the scute binary")?
        .with_file_name("scute-shim");
    let events = Arc::new(Events::default());
    let sandboxes = Arc::new(SandboxManager::new(
        config.clone(),
        store.clone(),
        images.clone(),
        shim_binary,
        events.clone(),
        pod_containers(store.clone()),
    ));
    sandboxes.recover().await.context("recovering pod sandboxes")?;

    let containers = ContainerManager::new(
        config.clone(),
        store.clone(),
        images.clone(),
        sandboxes.clone(),
        events.clone(),
    );
    containers.recover().await.context("recovering containers")?;
    for sandbox in sandboxes.list().context("listing pod sandboxes")? {
        containers.watch_shim(sandbox.id.clone());
    }

    let (shutdown_tx, shutdown_rx) = watch::channel(false);
    let streaming = StreamingServer::start(
        &config.streaming,
        containers.clone(),
        sandboxes.clone(),
        shutdown_rx.clone(),
    )
    .await?;

    if !config.metrics.address.is_empty() {
        let (sandboxes, containers, images) = (sandboxes.clone(), containers.clone(), images.clone());
        let live = move || crate::metrics::Live {
            sandboxes_ready: sandboxes
                .list()
                .map(|all| all.iter().filter(|s| s.state == SandboxState::Ready).count())
                .unwrap_or(0),
            containers_running: containers
                .list_records()
                .map(|all| all.iter().filter(|c| c.state == ContainerState::Running).count())
                .unwrap_or(0),
            pulls: images
                .pulls()
                .into_iter()
                .map(|p| crate::metrics::PullProgress {
                    image: p.image,
                    phase: p.phase.as_str(),
                    bytes_done: p.bytes_done,
                    bytes_total: p.bytes_total,
                    layers_done: p.layers_done,
                    layers_total: p.layers_total,
                })
                .collect(),
        };
        crate::metrics::serve(&config.metrics.address, live, shutdown_rx.clone()).await?;
    }

    let cri = Arc::new(Cri {
        config: config.clone(),
        store: store.clone(),
        images,
        sandboxes,
        containers,
        events: events.clone(),
        streaming,
        started_at: SystemTime::now(),
        runtime_readiness: Default::default(),
        stats: Default::default(),
    });
    let service = CriService::new(cri);
    let (recv_max, send_max) = (config.grpc.max_recv_message_size, config.grpc.max_send_message_size);

    let mut servers = tokio::task::JoinSet::new();

    // The image socket first: the main socket appearing is what callers (the kubelet, tests)
    // take as "scute serves", so by then every socket does.
    let image_address = &config.grpc.image_address;
    if !image_address.as_os_str().is_empty() {
        let image_listener = bind_socket(image_address, &config.state)?;
        let router = tonic::transport::Server::builder().add_service(
            image_service_server(service.clone())
                .max_decoding_message_size(recv_max)
                .max_encoding_message_size(send_max),
        );
        let mut rx = shutdown_rx.clone();
        servers.spawn(
            router.serve_with_incoming_shutdown(UnixListenerStream::new(image_listener), async move {
                let _ = rx.wait_for(|stop| *stop).await;
            }),
        );
        tracing::info!(address = %image_address.display(), "serving CRI ImageService");
    }

    let main_listener = bind_socket(&config.grpc.address, &config.state)?;
    let router = tonic::transport::Server::builder()
        .add_service(
            runtime_service_server(service.clone())
                .max_decoding_message_size(recv_max)
                .max_encoding_message_size(send_max),
        )
        .add_service(
            image_service_server(service.clone())
                .max_decoding_message_size(recv_max)
                .max_encoding_message_size(send_max),
        )
        .add_service(admin_server(service.clone()));
    let mut rx = shutdown_rx.clone();
    servers.spawn(
        router.serve_with_incoming_shutdown(UnixListenerStream::new(main_listener), async move {
            let _ = rx.wait_for(|stop| *stop).await;
        }),
    );
    tracing::info!(address = %config.grpc.address.display(), "serving CRI RuntimeService and ImageService");

    // Under systemd (Type=notify): the kubelet's unit, ordered after ours, starts now. A no-op
    // without NOTIFY_SOCKET.
    if let Err(e) = sd_notify::notify(true, &[sd_notify::NotifyState::Ready]) {
        tracing::warn!(error = %e, "telling systemd scute is ready");
    }
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sigint = signal(SignalKind::interrupt())?;
    let reason = tokio::select! {
        _ = sigterm.recv() => "SIGTERM",
        _ = sigint.recv() => "SIGINT",
        Some(result) = servers.join_next() => {
            // A server ended on its own: that is a failure, not a shutdown.
            let _ = shutdown_tx.send(true);
            cleanup_sockets(&config);
            match result {
                Ok(Ok(())) => bail!("gRPC server stopped unexpectedly"),
                Ok(Err(e)) => return Err(e).context("gRPC server failed"),
                Err(e) => return Err(e).context("gRPC server task failed"),
            }
        }
    };
    tracing::info!(signal = reason, "shutting down: no new RPCs; containers keep running");
    let _ = shutdown_tx.send(true);
    // Event subscriptions never end by themselves.
    events.close();
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while let Some(result) = servers.join_next().await {
            if let Ok(Err(e)) = result {
                tracing::warn!(error = %e, "gRPC server ended with an error during shutdown");
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::warn!(
            timeout_s = DRAIN_TIMEOUT.as_secs(),
            "in-flight RPCs did not finish; exiting anyway"
        );
        servers.abort_all();
    }
    cleanup_sockets(&config);
    // Every store write is already committed durably; dropping the last handle closes the file.
    drop(store);
    let _ = std::fs::remove_file(config.root.join(RUNNING_MARKER));
    tracing::info!("stopped");
    Ok(())
}

/// In `root` while the daemon runs, holding the boot's ID: still there at start means the last
/// run ended unclean; with another boot's ID, the machine went down under it (a power cut, a
/// kernel crash), and what the page cache held then may never have reached the disk.
const RUNNING_MARKER: &str = "running";

/// After an unclean stop, the cheap form of `scute doctor --repair`: records against what is
/// on disk, nothing hashed (snapshots whose directories a power cut lost, images using them,
/// directories and netns pins nothing records), and after the machine went down each snapshot's
/// files against the tally taken at commit. Partial downloads stay, to resume.
async fn check_after_unclean_stop(config: &Config, store: &Arc<Store>, images: &Arc<ImageManager>) -> Result<()> {
    let marker = config.root.join(RUNNING_MARKER);
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let last_boot = match std::fs::read_to_string(&marker) {
        Ok(id) => Some(id),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(e).context("reading the running marker"),
    };
    scute_sys::files::write_atomic_mode(&marker, boot.as_bytes(), 0o600).context("writing the running marker")?;
    let Some(last_boot) = last_boot else { return Ok(()) };
    // (An older scute's marker is empty: taken as the machine having gone down.)
    let machine_went_down = last_boot.trim().is_empty() || last_boot != boot;
    let depth = match machine_went_down {
        true => crate::doctor::Depth::Cheap,
        false => crate::doctor::Depth::Records,
    };
    tracing::info!(machine_went_down, "the last run ended unclean: checking the store");
    let (store, images, root, state) = (store.clone(), images.clone(), config.root.clone(), config.state.clone());
    let findings = tokio::task::spawn_blocking(move || -> Result<Vec<crate::doctor::Finding>> {
        let mut found = images.doctor(depth, true)?;
        found.extend(crate::doctor::runtime::examine(
            &store,
            &root,
            &state,
            true,
            Duration::ZERO,
        )?);
        Ok(found)
    })
    .await??;
    let findings: Vec<_> = findings
        .into_iter()
        .filter(|f| f.kind != crate::doctor::Kind::PartialDownload)
        .collect();
    for f in &findings {
        tracing::warn!(kind = f.kind.as_str(), subject = %f.subject, bytes = f.bytes, detail = %f.detail, repaired = f.repaired, "after an unclean stop");
    }
    tracing::info!(problems = findings.len(), "checked the store after an unclean stop");
    Ok(())
}

/// What other host users may reach under root (docs/design.md, "On-disk layout"), set at every start so an
/// upgrade closes what an older scute left open. Cheap: the top-level dirs and each pod's and
/// container's own dir and bundle, never the files in a rootfs. `meta.redb` is made 0600 by the
/// store, `content/` and `snapshots/` 0700 by theirs.
fn secure_root(root: &Path, store: &Store) -> Result<()> {
    use crate::container::record::ContainerRecord;
    use crate::sandbox::{files, record::SandboxRecord};

    // A pod with its own user namespace: its root's host gid, which may pass its dirs.
    let mut pod_gids: HashMap<String, Option<u32>> = HashMap::new();
    for sandbox in store.list::<SandboxRecord>().context("listing pod sandboxes")? {
        let gid = sandbox.user_namespace().map(|pod| pod.gids.host_id);
        pod_gids.insert(sandbox.id, gid);
    }
    let mut container_gids = HashMap::new();
    for container in store.list::<ContainerRecord>().context("listing containers")? {
        let gid = pod_gids.get(&container.sandbox_id).copied().flatten();
        container_gids.insert(container.id, gid);
    }
    for (kind, gids) in [("sandboxes", &pod_gids), ("containers", &container_gids)] {
        let parent = root.join(kind);
        prepare_dir(&parent, files::SHARED_DIR_MODE)?;
        let entries = std::fs::read_dir(&parent).with_context(|| format!("cannot list {}", parent.display()))?;
        for entry in entries {
            let dir = entry
                .with_context(|| format!("cannot list {}", parent.display()))?
                .path();
            if !is_dir(&dir) {
                continue;
            }
            // Leftovers with no record are closed to everyone.
            let name = dir
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let gid = gids.get(&name).copied().flatten();
            files::restrict_dir(&dir, gid)?;
            let bundle = dir.join("bundle");
            if is_dir(&bundle) {
                files::restrict_dir(&bundle, None)?;
                let spec = bundle.join("config.json");
                if std::fs::symlink_metadata(&spec).is_ok_and(|m| m.is_file()) {
                    std::fs::set_permissions(&spec, std::fs::Permissions::from_mode(files::PRIVATE_FILE_MODE))
                        .with_context(|| format!("cannot set mode 600 on {}", spec.display()))?;
                }
            }
        }
    }
    Ok(())
}

/// A directory itself, not a symlink to one.
fn is_dir(path: &Path) -> bool {
    std::fs::symlink_metadata(path).is_ok_and(|m| m.is_dir())
}

fn prepare_dir(dir: &Path, mode: u32) -> Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(dir)
        .with_context(|| format!("cannot create {}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot set mode {mode:o} on {}", dir.display()))?;
    Ok(())
}

/// Binds a unix socket with mode 0660. The parent dir is created 0700 when scute creates it
/// (or is the state dir); an existing foreign dir is left as it is. A stale socket file left by
/// a crash is replaced, but a live one (another daemon answers) is an error.
fn bind_socket(path: &Path, state_dir: &Path) -> Result<UnixListener> {
    let parent = path.parent().context("socket path has no parent directory")?;
    if !parent.exists() || parent == state_dir {
        prepare_dir(parent, STATE_DIR_MODE)?;
    }
    if path.exists() || std::fs::symlink_metadata(path).is_ok() {
        if std::os::unix::net::UnixStream::connect(path).is_ok() {
            bail!(
                "{} is in use: another process is serving on it (another scute?)",
                path.display()
            );
        }
        std::fs::remove_file(path).with_context(|| format!("cannot remove stale socket {}", path.display()))?;
    }
    let listener = UnixListener::bind(path).with_context(|| format!("cannot bind {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(SOCKET_MODE))
        .with_context(|| format!("cannot chmod {}", path.display()))?;
    Ok(listener)
}

fn cleanup_sockets(config: &Config) {
    let mut sockets: Vec<&PathBuf> = vec![&config.grpc.address];
    if !config.grpc.image_address.as_os_str().is_empty() {
        sockets.push(&config.grpc.image_address);
    }
    for socket in sockets {
        if let Err(e) = std::fs::remove_file(socket) {
            if e.kind() != std::io::ErrorKind::NotFound {
                tracing::warn!(socket = %socket.display(), error = %e, "cannot remove socket");
            }
        }
    }
}

/// The stored statuses of a pod's containers, for the pod's own events.
fn pod_containers(store: Arc<Store>) -> PodContainers {
    Box::new(move |sandbox_id| crate::container::record::pod_statuses(&store, sandbox_id))
}

/// The snapshot chains of every container record: a container keeps its rootfs layers when
/// its image is removed.
pub(crate) fn containers_snapshots(store: Arc<Store>) -> crate::image::HeldSnapshots {
    Box::new(move || {
        let containers = store.list::<crate::container::record::ContainerRecord>()?;
        Ok(containers.iter().flat_map(|c| c.held_chains().cloned()).collect())
    })
}
