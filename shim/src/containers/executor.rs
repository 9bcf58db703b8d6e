//! What runs inside the fork helper for libcontainer: an exec's tenant build and run, a resource
//! update through the container's cgroup manager, and the executor that readies each process
//! (signals, stdio, the container's seccomp filter and user namespace for execs) before exec.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use libcgroups::common::{create_cgroup_manager, AnyCgroupManager, CgroupConfig, CgroupManager, ControllerOpt};
use libcontainer::container::builder::ContainerBuilder;
use libcontainer::container::Container;
use libcontainer::oci_spec::runtime::{
    Capabilities, Capability as SpecCapability, LinuxCapabilities, LinuxNamespaceType, LinuxResources, LinuxSeccomp,
    Process, Spec,
};
use libcontainer::syscall::syscall::SyscallType;
use libcontainer::workload::default::DefaultExecutor;
use libcontainer::workload::{Executor, ExecutorError, ExecutorValidationError};

use crate::stdio::{self};

use super::{chain, or_dev_null, ApiError};

/// An exec'd process's stdio: descriptors for its stdin, stdout and stderr (/dev/null when None),
/// or a terminal (its master sent over the console socket at `console`).
#[derive(Default)]
pub(super) struct ExecIo {
    pub(super) stdin: Option<OwnedFd>,
    pub(super) stdout: Option<OwnedFd>,
    pub(super) stderr: Option<OwnedFd>,
    pub(super) console: Option<PathBuf>,
    /// The terminal's initial size (columns, rows).
    pub(super) winsize: Option<(u16, u16)>,
}

/// The helper's part of an exec: the container's process (from its bundle) with other args and
/// env, written to `process_file` for libcontainer's tenant builder, run with `io`.
pub(super) fn exec_in_helper(
    id: &str,
    root: &Path,
    process_file: &Path,
    args: Vec<String>,
    env: Vec<String>,
    io: ExecIo,
) -> Result<i32, ApiError> {
    let container = Container::load(root.join(id)).map_err(|e| ApiError::internal(chain(&e)))?;
    let spec = Spec::load(container.bundle().join("config.json")).map_err(|e| ApiError::internal(chain(&e)))?;
    let mut process = spec
        .process()
        .clone()
        .ok_or_else(|| ApiError::internal("the container's spec has no process"))?;
    let mut merged: Vec<String> = process
        .env()
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|e| {
            let key = e.split('=').next().unwrap_or("");
            !env.iter().any(|o| o.split('=').next() == Some(key))
        })
        .collect();
    merged.extend(env);
    process
        .set_args(Some(args))
        .set_env(Some(merged))
        .set_terminal(Some(io.console.is_some()))
        .set_console_size(None);
    let seccomp = spec.linux().as_ref().and_then(|l| l.seccomp().clone());
    let userns = spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .and_then(|nss| nss.iter().find(|ns| ns.typ() == LinuxNamespaceType::User))
        .and_then(|ns| ns.path().clone());
    let (exec_seccomp, exec_userns) = match userns {
        Some(path) => {
            let entry = ExecUserns::prepare(path, &mut process)?;
            let seccomp = seccomp.map(|profile| ExecSeccomp {
                profile,
                drop_sys_admin: !entry.keeps_sys_admin(),
            });
            (seccomp, Some(entry))
        }
        None => (seccomp.map(|profile| ExecSeccomp::prepare(profile, &mut process)), None),
    };
    let body = serde_json::to_vec(&process).map_err(|e| ApiError::internal(e.to_string()))?;
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(process_file)
        .and_then(|mut f| f.write_all(&body))
        .map_err(|e| ApiError::internal(format!("writing {process_file:?}: {e}")))?;
    let builder = ContainerBuilder::new(id.to_owned(), SyscallType::Linux)
        .with_executor(ShimExecutor {
            exec_seccomp,
            exec_userns,
            winsize: io.winsize,
        })
        .with_root_path(root)
        .map_err(|e| ApiError::internal(chain(&e)))?;
    let tty = io.console.is_some();
    let builder = match io.console {
        Some(path) => builder.with_console_socket(Some(path)),
        None => builder
            .with_stdin(or_dev_null(io.stdin)?)
            .with_stdout(or_dev_null(io.stdout)?)
            .with_stderr(or_dev_null(io.stderr)?),
    };
    let result = builder
        .as_tenant()
        .with_process(Some(process_file))
        .with_detach(true)
        .build()
        .map_err(|e| ApiError::internal(chain(&e)));
    if tty {
        // libcontainer links the console socket into the container's directory for each exec
        // and leaves the link there.
        if let Ok(dir) = fs::read_dir(root.join(id)) {
            for e in dir.flatten() {
                if e.file_name().to_string_lossy().starts_with("tenant-tty-") {
                    let _ = fs::remove_file(e.path());
                }
            }
        }
    }
    Ok(result?.as_raw())
}

/// The bundle's process.terminal must say what the request says: libcontainer decides by it
/// whether the process gets a terminal (sent over the console socket) or the given stdio.
pub(super) fn check_terminal(bundle: &Path, tty: bool) -> Result<(), ApiError> {
    let spec = Spec::load(bundle.join("config.json"))
        .map_err(|e| ApiError::invalid(format!("bundle {bundle:?}: {}", chain(&e))))?;
    let terminal = spec.process().as_ref().and_then(|p| p.terminal()).unwrap_or(false);
    if terminal != tty {
        return Err(ApiError::invalid(format!(
            "bundle {bundle:?} has process.terminal {terminal} but the request asks for tty {tty}: they must agree"
        )));
    }
    Ok(())
}

/// The helper's part of UpdateResources: the container's cgroup manager, as libcontainer made it
/// at creation (libcgroups: v1, or v2 on a unified host), applies `resources` (whose devices were
/// cleared); under systemd, the shim writes what the manager has no unit property for. Device
/// rules: on v2 they are one eBPF program that every apply replaces, built from
/// the given rules plus libcgroups' defaults, so the container's own rules (its bundle's, exactly
/// what creation applied) go along and the new program allows what the old one did. On v1 they
/// are left out: re-writing them would start with the spec's deny-all and refuse every device for
/// a moment; without them libcgroups only re-allows its defaults, which the container has already.
pub(super) fn update_cgroup(id: &str, dir: &Path, mut resources: LinuxResources) -> Result<(), ApiError> {
    let container = Container::load(dir.to_path_buf()).map_err(|e| ApiError::internal(chain(&e)))?;
    let cgroup_path = container.spec().map_err(|e| ApiError::internal(chain(&e)))?.cgroup_path;
    let manager = create_cgroup_manager(CgroupConfig {
        cgroup_path: cgroup_path.clone(),
        systemd_cgroup: container.systemd(),
        container_name: id.to_owned(),
    })
    .map_err(|e| ApiError::internal(chain(&e)))?;
    if !matches!(manager, AnyCgroupManager::V1(_)) {
        let spec = Spec::load(container.bundle().join("config.json")).map_err(|e| ApiError::internal(chain(&e)))?;
        let devices = spec
            .linux()
            .as_ref()
            .and_then(|l| l.resources().as_ref())
            .and_then(|r| r.devices().clone());
        resources.set_devices(devices);
    }
    manager
        .apply(&ControllerOpt {
            resources: &resources,
            disable_oom_killer: false,
            oom_score_adj: None,
            freezer_state: None,
        })
        .map_err(|e| ApiError::internal(chain(&e)))?;
    if container.systemd() {
        let pid = container
            .pid()
            .ok_or_else(|| ApiError::internal(format!("container {id} has no process")))?;
        crate::systemd_scope::update(id, pid.as_raw(), &cgroup_path, &resources)
            .map_err(|e| ApiError::internal(format!("container {id}: {e}")))?;
    }
    Ok(())
}

/// libcontainer's default executor, after restoring the signal state a fresh process expects:
/// the shim blocks SIGCHLD (for its signalfd) and Rust ignores SIGPIPE, and both would otherwise be
/// inherited through exec by every container process.
#[derive(Clone, Default)]
pub(super) struct ShimExecutor {
    /// For exec'd processes: the container's filter, which libcontainer's tenant builder leaves out.
    exec_seccomp: Option<ExecSeccomp>,
    /// For exec'd processes of a container in a pod user namespace: entering it.
    exec_userns: Option<ExecUserns>,
    /// For exec'd processes on a terminal: its initial size (libcontainer 0.7 ignores the OCI
    /// consoleSize), set here so that the process sees it from its first instruction.
    winsize: Option<(u16, u16)>,
}

/// The container's seccomp filter for an exec'd process, loaded by the executor as the last step
/// before exec. libcontainer 0.7's tenant builder rebuilds `linux` without `seccomp`, so without
/// this an exec (a probe, `kubectl exec`) would run unfiltered; runc's exec applies the filter.
#[derive(Clone)]
pub(super) struct ExecSeccomp {
    profile: LinuxSeccomp,
    /// Without no_new_privs, loading a filter needs CAP_SYS_ADMIN: the process was given it in
    /// its effective and permitted sets only (not the bounding set, so exec could not keep it
    /// anyway) and drops it right after loading.
    drop_sys_admin: bool,
}

impl ExecSeccomp {
    /// Prepares `process` (the exec'd one) for `profile`.
    fn prepare(profile: LinuxSeccomp, process: &mut Process) -> Self {
        let nnp = process.no_new_privileges() == Some(true);
        let mut drop_sys_admin = false;
        if let Some(mut caps) = process.capabilities().clone() {
            let effective = caps.effective().clone().unwrap_or_default();
            if !nnp && !effective.contains(&SpecCapability::SysAdmin) {
                let add = |set: Option<Capabilities>| {
                    let mut set = set.unwrap_or_default();
                    set.insert(SpecCapability::SysAdmin);
                    Some(set)
                };
                let (e, p) = (add(caps.effective().clone()), add(caps.permitted().clone()));
                caps.set_effective(e).set_permitted(p);
                process.set_capabilities(Some(caps));
                drop_sys_admin = true;
            }
        }
        ExecSeccomp {
            profile,
            drop_sys_admin,
        }
    }

    fn load(&self) -> Result<(), ExecutorError> {
        let fail = |what: String| ExecutorError::Other(format!("exec: container seccomp filter: {what}"));
        match libcontainer::seccomp::initialize_seccomp(&self.profile) {
            Ok(None) => {}
            Ok(Some(_)) => return Err(fail("notify actions are not supported".into())),
            Err(e) => return Err(fail(e.to_string())),
        }
        if self.drop_sys_admin {
            for set in [caps::CapSet::Effective, caps::CapSet::Permitted] {
                caps::drop(None, set, caps::Capability::CAP_SYS_ADMIN)
                    .map_err(|e| fail(format!("dropping CAP_SYS_ADMIN after loading: {e}")))?;
            }
        }
        Ok(())
    }
}

/// An exec'd process of a container in a pod user namespace. libcontainer 0.7's tenant
/// builder joins every namespace of the container except the user namespace (its list leaves
/// "user" out), so its exec would run as the host's root. Instead the tenant is built as root
/// holding CAP_SYS_ADMIN only, and the executor, last before exec: enters the user namespace
/// (which grants a full capability set inside it), takes the container's user and groups, then
/// its capability sets and no_new_privs, as libcontainer does for the container's init.
#[derive(Clone)]
pub(super) struct ExecUserns {
    /// Inode of the pod's user namespace, as the host sees it at the spec's path.
    ns_inode: u64,
    uid: u32,
    gid: u32,
    groups: Vec<u32>,
    capabilities: LinuxCapabilities,
    no_new_privs: bool,
}

impl ExecUserns {
    /// Takes the container's identity out of `process`, leaving what the tenant needs to get here.
    fn prepare(path: PathBuf, process: &mut Process) -> Result<Self, ApiError> {
        let ns_inode = fs::metadata(&path)
            .map_err(|e| ApiError::internal(format!("the pod's user namespace {path:?}: {e}")))?
            .ino();
        let user = process.user().clone();
        let entry = ExecUserns {
            ns_inode,
            uid: user.uid(),
            gid: user.gid(),
            groups: user.additional_gids().clone().unwrap_or_default(),
            capabilities: process.capabilities().clone().unwrap_or_default(),
            no_new_privs: process.no_new_privileges() == Some(true),
        };
        let mut root = user;
        root.set_uid(0).set_gid(0).set_additional_gids(None);
        let sys_admin: Capabilities = [SpecCapability::SysAdmin].into_iter().collect();
        let mut caps = LinuxCapabilities::default();
        caps.set_bounding(Some(sys_admin.clone()))
            .set_effective(Some(sys_admin.clone()))
            .set_permitted(Some(sys_admin))
            .set_inheritable(None)
            .set_ambient(None);
        process
            .set_user(root)
            .set_capabilities(Some(caps))
            .set_no_new_privileges(Some(false));
        Ok(entry)
    }

    /// Whether the container's own effective set has CAP_SYS_ADMIN (else it is held only until
    /// the seccomp filter is loaded).
    fn keeps_sys_admin(&self) -> bool {
        self.no_new_privs
            || self
                .capabilities
                .effective()
                .as_ref()
                .is_some_and(|e| e.contains(&SpecCapability::SysAdmin))
    }

    fn enter(&self) -> Result<(), ExecutorError> {
        let fail = |what: &str, e: std::io::Error| ExecutorError::Other(format!("exec: {what}: {e}"));
        // By now the process is in the container's mount and PID namespaces, where the host's
        // path to the namespace means nothing; PID 1 there (pause, or the container's init)
        // is in the pod's user namespace. The inode check makes sure of it.
        let ns = File::open("/proc/1/ns/user").map_err(|e| fail("opening the pod's user namespace", e))?;
        let inode = ns
            .metadata()
            .map_err(|e| fail("reading the pod's user namespace", e))?
            .ino();
        if inode != self.ns_inode {
            return Err(ExecutorError::Other(format!(
                "exec: PID 1 of the container is not in the pod's user namespace ({inode} != {})",
                self.ns_inode
            )));
        }
        // SAFETY: plain syscalls on a valid fd and on this (single-threaded) process's credentials.
        unsafe {
            if libc::setns(ns.as_raw_fd(), libc::CLONE_NEWUSER) != 0 {
                return Err(fail(
                    "entering the pod's user namespace",
                    std::io::Error::last_os_error(),
                ));
            }
            let groups: Vec<libc::gid_t> = self.groups.clone();
            if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
                return Err(fail("setgroups", std::io::Error::last_os_error()));
            }
            if libc::setresgid(self.gid, self.gid, self.gid) != 0 {
                return Err(fail("setresgid", std::io::Error::last_os_error()));
            }
            // Keep the permitted set across the uid change; the sets are set right after.
            if libc::prctl(libc::PR_SET_KEEPCAPS, 1, 0, 0, 0) != 0 {
                return Err(fail("PR_SET_KEEPCAPS", std::io::Error::last_os_error()));
            }
            if libc::setresuid(self.uid, self.uid, self.uid) != 0 {
                return Err(fail("setresuid", std::io::Error::last_os_error()));
            }
        }
        let mut caps = self.capabilities.clone();
        if !self.keeps_sys_admin() {
            // Held in effective and permitted (never bounding) until the filter is loaded.
            let add = |set: &Option<Capabilities>| {
                let mut set = set.clone().unwrap_or_default();
                set.insert(SpecCapability::SysAdmin);
                Some(set)
            };
            let (e, p) = (add(caps.effective()), add(caps.permitted()));
            caps.set_effective(e).set_permitted(p);
        }
        let syscall = libcontainer::syscall::syscall::create_syscall();
        libcontainer::capabilities::drop_privileges(&caps, &*syscall)
            .map_err(|e| ExecutorError::Other(format!("exec: setting capabilities: {e}")))?;
        if self.no_new_privs {
            // SAFETY: no pointers.
            if unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) } != 0 {
                return Err(fail("PR_SET_NO_NEW_PRIVS", std::io::Error::last_os_error()));
            }
        }
        Ok(())
    }
}

impl Executor for ShimExecutor {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        reset_signals();
        writable_null_stdio();
        if let Some(ws) = self.winsize {
            // fd 0 is the terminal's slave (libcontainer's console setup made it so).
            if let Err(e) = stdio::set_winsize(0, ws) {
                tracing::warn!(error = %e, "setting the exec's terminal size");
            }
        }
        if let Some(userns) = &self.exec_userns {
            userns.enter()?;
        }
        if let Some(seccomp) = &self.exec_seccomp {
            seccomp.load()?;
        }
        DefaultExecutor {}.exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        DefaultExecutor {}.validate(spec)
    }
}

/// libcontainer 0.7 replaces stdio that is the host's /dev/null by the container's, opened
/// read-only (`reopen_dev_null`): a container whose output goes to /dev/null would fail every
/// write (EBADF; `echo` exits 1). Runs in the container's init, just before exec: stdout and stderr
/// on a read-only /dev/null get a writable one.
pub(super) fn writable_null_stdio() {
    for fd in [1, 2] {
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        if unsafe { libc::fstat(fd, &mut st) } != 0
            || st.st_mode & libc::S_IFMT != libc::S_IFCHR
            || st.st_rdev != libc::makedev(1, 3)
        {
            continue;
        }
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 || flags & libc::O_ACCMODE != libc::O_RDONLY {
            continue;
        }
        let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        if null >= 0 {
            unsafe {
                libc::dup2(null, fd);
                libc::close(null);
            }
        }
    }
}

/// Default dispositions for every catchable signal and an empty signal mask. The raw syscall:
/// glibc refuses to touch its internal signals (32, 33), which a spawner may have left ignored.
pub(super) fn reset_signals() {
    #[repr(C)]
    struct KernelSigaction {
        handler: usize,
        flags: u64,
        restorer: usize,
        mask: u64,
    }
    let default = KernelSigaction {
        handler: libc::SIG_DFL,
        flags: 0,
        restorer: 0,
        mask: 0,
    };
    for sig in 1..=64 {
        if sig != libc::SIGKILL && sig != libc::SIGSTOP {
            unsafe {
                libc::syscall(
                    libc::SYS_rt_sigaction,
                    sig,
                    &default as *const KernelSigaction,
                    0usize,
                    8usize,
                );
            }
        }
    }
    let empty = 0u64;
    unsafe {
        libc::syscall(
            libc::SYS_rt_sigprocmask,
            libc::SIG_SETMASK,
            &empty as *const u64,
            0usize,
            8usize,
        );
    }
}
