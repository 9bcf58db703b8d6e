//! Restore: a container whose processes CRIU brings back from a checkpoint's images instead of
//! starting them from the bundle's process. CreateContainer only records it (no process, pid 0);
//! StartContainer restores, as containerd's and CRI-O's restores do.
//!
//! CRIU runs in a fork helper (its own process group, killed whole at the time limit) that first
//! joins the container's cgroup, so that `criu swrk` and every process it restores start there;
//! `rst_sibling` makes the restored init the helper's child, and the shim's when the helper ends
//! (the shim is a subreaper), exactly as a created container's init. What libcontainer keeps for
//! a container it made (its state and config) is then written for this one, so that kill, exec
//! and delete treat both alike.
//!
//! The mounts are the new bundle's: CRIU maps each bind mount it dumped as external (by its
//! destination, libcontainer's dump marks them) to the new source, so a restore in another pod
//! gets that pod's /etc/hosts, volumes and /dev/shm. The network namespace is the new pod's (the
//! dump marked it external): listening sockets are restored there, established connections were
//! never dumped. The container's stdout and stderr pipes become new pipes the shim reads.

use std::fs::{self, File};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use libcgroups::common::{create_cgroup_manager, AnyCgroupManager, CgroupConfig, CgroupManager, ControllerOpt};
use libcontainer::config::YoukiConfig;
use libcontainer::container::{Container, ContainerStatus};
use libcontainer::oci_spec::runtime::{LinuxNamespaceType, LinuxResources, Spec};
use rust_criu::rust_criu_protobuf::rpc::Criu_notify;
use rust_criu::{criu_ns_to_key, CgMode, Criu};

use super::{output_pipe, Containers, CreateOptions, Entry, Status};
use crate::api_error::{chain, ApiError};
use crate::helper::{in_helper, in_helper_group};
use crate::logs::{ContainerLog, LogFile, LogStream};
use crate::oom;
use crate::stdio::{self, Input};
use scute_sys::clock::now_nanos;

/// How long CRIU may take to restore.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(120);
/// CRIU's log of the restore, in its work dir.
const RESTORE_LOG: &str = "restore.log";
/// The original stdio of the dumped init, as libcontainer's dump recorded it.
const DESCRIPTORS: &str = "descriptors.json";

/// Where the checkpoint's CRIU images are (CreateContainer's `restore_images_dir`).
#[derive(Debug, Clone)]
pub struct RestoreFrom {
    pub images_dir: PathBuf,
    pub work_dir: PathBuf,
}

/// A restore waiting for StartContainer.
pub(super) struct Pending {
    bundle: PathBuf,
    from: RestoreFrom,
    file: Option<LogFile>,
    stdin: bool,
}

impl Containers {
    pub(super) fn create_restorable(
        &mut self,
        id: &str,
        bundle: &Path,
        opts: &CreateOptions,
        from: &RestoreFrom,
    ) -> Result<(), ApiError> {
        if opts.tty {
            return Err(ApiError::invalid(
                "restoring a container with a terminal is not supported (its terminal cannot be handed over)",
            ));
        }
        for dir in [&from.images_dir, &from.work_dir] {
            if !dir.is_absolute() {
                return Err(ApiError::invalid(format!("restore directory {dir:?} is not absolute")));
            }
        }
        if !from.images_dir.join("inventory.img").is_file() {
            return Err(ApiError::invalid(format!(
                "{:?} holds no CRIU images (no inventory.img)",
                from.images_dir
            )));
        }
        let file = opts.open_log_file()?;
        tracing::info!(id, ?bundle, images = ?from.images_dir, "container to restore created");
        self.table.insert(
            id.to_owned(),
            Entry {
                pid: 0,
                status: Status::Created,
                created_at_ns: now_nanos(),
                started_at_ns: 0,
                log: None,
                oom: None,
                sigkill_sent: false,
                stdin: None,
                stdin_once: opts.stdin && opts.stdin_once,
                tty: None,
                attached: Vec::new(),
                restore: Some(Pending {
                    bundle: bundle.to_path_buf(),
                    from: from.clone(),
                    file,
                    stdin: opts.stdin,
                }),
            },
        );
        Ok(())
    }

    /// StartContainer of a container to restore: CRIU brings its processes back, running.
    pub(super) fn restore(&mut self, id: &str) -> Result<(), ApiError> {
        let entry = self.table.get_mut(id).ok_or_else(|| ApiError::not_found(id))?;
        let pending = entry.restore.take().expect("restore() is called for a pending restore");
        match self.restore_pending(id, &pending) {
            Ok((pid, log, stdin)) => {
                let entry = self.table.get_mut(id).ok_or_else(|| ApiError::not_found(id))?;
                entry.pid = pid;
                entry.status = Status::Running;
                entry.started_at_ns = now_nanos();
                entry.oom = oom::OomWatch::new(pid);
                entry.stdin = stdin;
                entry.log = Some(ContainerLog {
                    file: pending.file,
                    streams: log,
                    terminal: false,
                });
                tracing::info!(id, pid, "container restored");
                Ok(())
            }
            Err(e) => {
                // The helper made the container's cgroup before CRIU failed: nothing is in it now
                // (CRIU ends what it restored when it fails), so it goes.
                let (bundle, systemd) = (pending.bundle.clone(), self.systemd);
                let removed = in_helper(&format!("removing the cgroup of {id}"), &[self.log_fd], || {
                    remove_cgroup(id, &bundle, systemd)
                });
                if let Err(e) = removed {
                    tracing::warn!(id, error = %e.message, "removing the cgroup of a failed restore");
                }
                // Still a restore that can be tried again, or deleted.
                if let Some(entry) = self.table.get_mut(id) {
                    entry.restore = Some(pending);
                }
                tracing::warn!(id, error = %e.message, "restore failed");
                Err(ApiError::new(
                    e.code,
                    format!("restoring container {id}: {}", e.message),
                ))
            }
        }
    }

    fn restore_pending(
        &mut self,
        id: &str,
        pending: &Pending,
    ) -> Result<(i32, Vec<LogStream>, Option<Input>), ApiError> {
        let descriptors = read_descriptors(&pending.from.images_dir)?;
        // New pipes for the dumped init's pipes: CRIU puts their other ends where the old ones
        // were (inherit_fd, keyed by the old pipe's name). Anything else (/dev/null) it reopens.
        let mut streams = Vec::new();
        let mut inherit: Vec<(OwnedFd, String)> = Vec::new();
        for (i, name) in [(1, "stdout"), (2, "stderr")] {
            if descriptors[i].starts_with("pipe:") && pending.file.is_some() {
                let (r, w) = output_pipe()?;
                streams.push(LogStream::new(name, r));
                inherit.push((w, descriptors[i].clone()));
            }
        }
        let mut stdin = None;
        if pending.stdin && descriptors[0].starts_with("pipe:") {
            let (r, w) = stdio::input_pipe().map_err(|e| ApiError::internal(format!("stdin pipe: {e}")))?;
            stdin = Some(Input::new(w, false));
            inherit.push((r, descriptors[0].clone()));
        }
        let keep: Vec<RawFd> = std::iter::once(self.log_fd)
            .chain(inherit.iter().map(|(fd, _)| fd.as_raw_fd()))
            .collect();
        let container_dir = self.root.join(id);
        let (bundle, from, systemd) = (&pending.bundle, &pending.from, self.systemd);
        let pid = in_helper_group(
            &format!("restoring container {id}"),
            &keep,
            RESTORE_TIMEOUT,
            true,
            || {
                let inherit: Vec<(RawFd, &str)> =
                    inherit.iter().map(|(fd, key)| (fd.as_raw_fd(), key.as_str())).collect();
                restore_in_helper(id, &container_dir, bundle, from, &inherit, systemd)
            },
        )?;
        // The child's ends close here (the restored processes hold their own).
        drop(inherit);
        Ok((pid, streams, stdin))
    }
}

/// descriptors.json: the dumped init's fds 0, 1 and 2 as /proc/PID/fd showed them. It comes
/// from the archive (anyone's input): three short strings, or the restore is refused.
fn read_descriptors(images_dir: &Path) -> Result<Vec<String>, ApiError> {
    let path = images_dir.join(DESCRIPTORS);
    let bytes = fs::read(&path).map_err(|e| ApiError::invalid(format!("reading {path:?}: {e}")))?;
    let list: Vec<String> = serde_json::from_slice(&bytes)
        .ok()
        .filter(|l: &Vec<String>| l.len() == 3 && l.iter().all(|s| s.len() < 4096))
        .ok_or_else(|| ApiError::invalid(format!("{path:?} is not a list of the three stdio descriptors")))?;
    Ok(list)
}

/// The restored init's pid, as CRIU's post-restore notification gives it (a plain `fn` is what
/// rust-criu calls back; the helper is a process of its own, so a static is its alone).
static RESTORED_PID: AtomicI32 = AtomicI32::new(0);

fn on_notify(script: &str, notify: &Criu_notify, _fd: Option<RawFd>) -> i32 {
    if script == "post-restore" {
        RESTORED_PID.store(notify.pid(), Ordering::SeqCst);
    }
    0
}

/// In the fork helper: join the container's cgroup, have CRIU restore, record libcontainer's
/// state. The restored init's pid.
fn restore_in_helper(
    id: &str,
    container_dir: &Path,
    bundle: &Path,
    from: &RestoreFrom,
    inherit: &[(RawFd, &str)],
    systemd: bool,
) -> Result<i32, ApiError> {
    let internal = |what: &str, e: &dyn std::error::Error| ApiError::internal(format!("{what}: {}", chain(e)));
    let (spec, config, manager) = spec_and_cgroup(id, bundle, systemd)?;
    manager
        .add_task(nix::unistd::Pid::this())
        .map_err(|e| internal("joining the container's cgroup", &e))?;
    let resources = spec
        .linux()
        .as_ref()
        .and_then(|l| l.resources().clone())
        .unwrap_or_else(LinuxResources::default);
    manager
        .apply(&ControllerOpt {
            resources: &resources,
            disable_oom_killer: false,
            oom_score_adj: None,
            freezer_state: None,
        })
        .map_err(|e| internal("applying the container's resources", &e))?;

    let rootfs = spec
        .root()
        .as_ref()
        .map(|r| r.path().clone())
        .ok_or_else(|| ApiError::invalid("the spec has no root"))?;
    fs::DirBuilder::new()
        .recursive(true)
        .create(&from.work_dir)
        .map_err(|e| ApiError::internal(format!("creating {:?}: {e}", from.work_dir)))?;
    let images =
        File::open(&from.images_dir).map_err(|e| ApiError::internal(format!("opening {:?}: {e}", from.images_dir)))?;
    let work =
        File::open(&from.work_dir).map_err(|e| ApiError::internal(format!("opening {:?}: {e}", from.work_dir)))?;

    let mut criu = Criu::new().map_err(|e| internal("starting CRIU", &e))?;
    criu.set_images_dir_fd(images.as_raw_fd());
    criu.set_work_dir_fd(work.as_raw_fd());
    criu.set_log_file(RESTORE_LOG.to_string());
    criu.set_log_level(4);
    criu.set_root(rootfs.display().to_string());
    criu.set_rst_sibling(true);
    // CRIU stays out of cgroups: it and its restored tasks are in the container's already.
    criu.set_manage_cgroups(true);
    criu.cgroups_mode(CgMode::IGNORE);
    criu.set_file_locks(true);
    criu.set_notify_scripts(true);
    criu.set_notify_cb(on_notify);
    // The dump's external bind mounts (keyed by destination) from this bundle's sources.
    for m in spec.mounts().iter().flatten() {
        if libcontainer::rootfs::utils::is_bind(m) {
            if let Some(source) = m.source() {
                criu.set_external_mount(m.destination().display().to_string(), source.display().to_string());
            }
        } else if m.typ().as_deref() == Some("cgroup") {
            // On a v1 or hybrid host the dump listed every controller's mount as external.
            if let Ok(points) = libcgroups::v1::util::list_subsystem_mount_points() {
                for p in points.iter().filter(|p| p.starts_with("/sys/fs/cgroup")) {
                    criu.set_external_mount(p.display().to_string(), p.display().to_string());
                }
            }
        }
    }
    // The new pod's network (and, when shared, pid) namespace in place of the dumped one's.
    let mut ns_files = Vec::new();
    for (kind, name) in [(LinuxNamespaceType::Network, "net"), (LinuxNamespaceType::Pid, "pid")] {
        let path = spec
            .linux()
            .as_ref()
            .and_then(|l| l.namespaces().as_ref())
            .and_then(|nss| nss.iter().find(|ns| ns.typ() == kind))
            .and_then(|ns| ns.path().clone());
        if let Some(path) = path {
            let file = File::open(&path).map_err(|e| ApiError::internal(format!("opening namespace {path:?}: {e}")))?;
            clear_cloexec(file.as_raw_fd())?;
            criu.add_inherit_fd(file.as_raw_fd(), criu_ns_to_key(name))
                .map_err(|e| internal("namespace for CRIU", &e))?;
            ns_files.push(file);
        }
    }
    for (fd, key) in inherit {
        clear_cloexec(*fd)?;
        criu.add_inherit_fd(*fd, key.to_string())
            .map_err(|e| internal("stdio for CRIU", &e))?;
    }
    criu.restore().map_err(|e| {
        ApiError::internal(format!(
            "CRIU: {}{}",
            chain(&e),
            super::checkpoint::criu_errors(&from.work_dir.join(RESTORE_LOG))
        ))
    })?;
    let pid = RESTORED_PID.load(Ordering::SeqCst);
    if pid <= 0 {
        return Err(ApiError::internal("CRIU restored without naming the restored process"));
    }
    if systemd {
        crate::systemd_scope::complete(id, pid, bundle)
            .map_err(|e| ApiError::internal(format!("the restored container's scope: {e}")))?;
    }
    // What libcontainer records for a container it made.
    fs::DirBuilder::new()
        .recursive(true)
        .create(container_dir)
        .map_err(|e| ApiError::internal(format!("creating {container_dir:?}: {e}")))?;
    config
        .save(container_dir)
        .map_err(|e| internal("saving libcontainer's config", &e))?;
    let mut container = Container::new(id, ContainerStatus::Running, Some(pid), bundle, container_dir)
        .map_err(|e| internal("libcontainer's state", &e))?;
    container
        .set_systemd(systemd)
        .set_annotations(spec.annotations().clone())
        .save()
        .map_err(|e| internal("saving libcontainer's state", &e))?;
    Ok(pid)
}

/// The bundle's spec, libcontainer's config of it, and the container's cgroup manager.
fn spec_and_cgroup(id: &str, bundle: &Path, systemd: bool) -> Result<(Spec, YoukiConfig, AnyCgroupManager), ApiError> {
    let internal = |what: &str, e: &dyn std::error::Error| ApiError::internal(format!("{what}: {}", chain(e)));
    let spec = Spec::load(bundle.join("config.json")).map_err(|e| internal("reading the spec", &e))?;
    let config = YoukiConfig::from_spec(&spec, id).map_err(|e| internal("the spec's cgroup", &e))?;
    let manager = create_cgroup_manager(CgroupConfig {
        cgroup_path: config.cgroup_path.clone(),
        systemd_cgroup: systemd,
        container_name: id.to_owned(),
    })
    .map_err(|e| internal("the container's cgroup", &e))?;
    Ok((spec, config, manager))
}

/// Removes the container's cgroup (its systemd scope, with that driver), as libcontainer's delete
/// would.
fn remove_cgroup(id: &str, bundle: &Path, systemd: bool) -> Result<(), ApiError> {
    let (_, _, manager) = spec_and_cgroup(id, bundle, systemd)?;
    manager
        .remove()
        .map_err(|e| ApiError::internal(format!("removing the container's cgroup: {}", chain(&e))))
}

fn clear_cloexec(fd: RawFd) -> Result<(), ApiError> {
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::empty()))
        .map(|_| ())
        .map_err(|e| ApiError::internal(format!("fcntl: {e}")))
}
