//! What other host users can reach under scute's root and state (issue 13): nothing they can
//! list or read. A forked prober takes an unprivileged identity (nobody, or another pod's mapped
//! root) and tries every path the daemon made; the pod with its own user namespace still reaches
//! its own rootfs and pod files, and a restart tightens what an older scute left open.

mod common;

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use common::pod::{container, pod_edited, Pod};
use scute::api;

/// The pod user namespace: 0 → HOST_ID (LENGTH ids).
const HOST_ID: u32 = 300_000;
const LENGTH: u32 = 65_536;
/// The host id of another pod's root: no more rights than nobody.
const OTHER_POD_ROOT: u32 = HOST_ID + LENGTH;
const NOBODY: u32 = 65_534;

fn mapping() -> Vec<api::IdMapping> {
    vec![api::IdMapping {
        container_id: 0,
        host_id: HOST_ID,
        length: LENGTH,
    }]
}

/// A daemon with two pods, each running containers as root and as uid 1000 that read the pod's
/// files: one with its own user namespace (on a CNI network), one on the host's.
struct Rig {
    pod: Pod,
    plain_id: String,
    plain_config: api::PodSandboxConfig,
    userns_container: String,
    plain_container: String,
}

fn namespace_options(config: &api::PodSandboxConfig) -> Option<api::NamespaceOption> {
    config
        .linux
        .as_ref()?
        .security_context
        .as_ref()?
        .namespace_options
        .clone()
}

/// A container of `sandbox` that proves the pod's files and `/` are readable inside, as its user.
fn reader(name: &str, sandbox: &api::PodSandboxConfig, uid: i64) -> api::ContainerConfig {
    let mut config = container(
        name,
        "cat /etc/hosts /etc/resolv.conf /etc/hostname >/dev/null && ls / >/dev/null && echo ready; sleep 3600",
    );
    config.linux = Some(api::LinuxContainerConfig {
        security_context: Some(api::LinuxContainerSecurityContext {
            // The kubelet repeats the pod's namespaces on each container.
            namespace_options: namespace_options(sandbox),
            run_as_user: Some(api::Int64Value { value: uid }),
            ..Default::default()
        }),
        ..Default::default()
    });
    config
}

impl Rig {
    async fn start(name: &str) -> Rig {
        let pod = pod_edited(name, Some(vec![]), "", "", |config| {
            let security = config
                .linux
                .get_or_insert_with(Default::default)
                .security_context
                .get_or_insert_with(Default::default);
            security
                .namespace_options
                .get_or_insert_with(Default::default)
                .userns_options = Some(api::UserNamespace {
                mode: api::NamespaceMode::Pod as i32,
                uids: mapping(),
                gids: mapping(),
            });
        })
        .await;
        let mut plain_config = pod.sibling(&format!("{name}-plain"));
        plain_config.linux.as_mut().unwrap().security_context = Some(api::LinuxSandboxSecurityContext {
            namespace_options: Some(api::NamespaceOption {
                network: api::NamespaceMode::Node as i32,
                ..Default::default()
            }),
            ..Default::default()
        });
        let plain_id = pod.run_sandbox(plain_config.clone()).await;
        let mut runtime = pod.daemon.runtime().await;

        let userns_container = pod.run(reader("userns-root", &pod.config, 0)).await;
        pod.run(reader("userns-user", &pod.config, 1000)).await;
        let mut plain_container = String::new();
        for (name, uid) in [("plain-root", 0), ("plain-user", 1000)] {
            let id = runtime
                .create_container(api::CreateContainerRequest {
                    pod_sandbox_id: plain_id.clone(),
                    config: Some(reader(name, &plain_config, uid)),
                    sandbox_config: Some(plain_config.clone()),
                })
                .await
                .unwrap()
                .into_inner()
                .container_id;
            runtime
                .start_container(api::StartContainerRequest {
                    container_id: id.clone(),
                })
                .await
                .unwrap();
            if plain_container.is_empty() {
                plain_container = id;
            }
        }
        for name in ["userns-root", "userns-user", "plain-root", "plain-user"] {
            pod.wait_log(name, "ready").await;
        }
        Rig {
            pod,
            plain_id,
            plain_config,
            userns_container,
            plain_container,
        }
    }

    fn root(&self) -> &Path {
        &self.pod.daemon.root
    }

    async fn remove(self) {
        let mut runtime = self.pod.daemon.runtime().await;
        runtime
            .stop_pod_sandbox(api::StopPodSandboxRequest {
                pod_sandbox_id: self.plain_id.clone(),
            })
            .await
            .unwrap();
        runtime
            .remove_pod_sandbox(api::RemovePodSandboxRequest {
                pod_sandbox_id: self.plain_id.clone(),
            })
            .await
            .unwrap();
        self.pod.remove_all().await;
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Dir,
    File,
    Socket,
    /// Symlinks, devices, FIFOs: only whether they can be reached is probed.
    Other,
}

/// Every path under `top` (itself included), walked as root without following symlinks.
fn walk(top: &Path) -> Vec<(PathBuf, Kind)> {
    let mut out = Vec::new();
    let mut pending = vec![top.to_path_buf()];
    while let Some(path) = pending.pop() {
        // Something may go away meanwhile (an exit file replaced): skip it.
        let Ok(meta) = std::fs::symlink_metadata(&path) else {
            continue;
        };
        let ft = meta.file_type();
        let kind = if ft.is_dir() {
            Kind::Dir
        } else if ft.is_file() {
            Kind::File
        } else if ft.is_socket() {
            Kind::Socket
        } else {
            Kind::Other
        };
        if kind == Kind::Dir {
            for entry in std::fs::read_dir(&path).into_iter().flatten().flatten() {
                pending.push(entry.path());
            }
        }
        out.push((path, kind));
    }
    out
}

const REACHABLE: u8 = 1;
const READABLE: u8 = 2;

/// What `uid`/`gid` (no supplementary groups) can do with each path: REACHABLE (every directory
/// above it is searchable) and READABLE (a directory listed, a file opened for reading, a socket
/// connected). The child of the fork makes raw syscalls only (the test process has threads).
fn probe_as(uid: u32, gid: u32, paths: &[(PathBuf, Kind)]) -> Vec<u8> {
    let prepared: Vec<(CString, Kind, libc::sockaddr_un)> = paths
        .iter()
        .map(|(path, kind)| {
            // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
            let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            let bytes = path.as_os_str().as_bytes();
            for (dst, src) in addr.sun_path.iter_mut().zip(bytes.iter().take(107)) {
                *dst = *src as libc::c_char;
            }
            (CString::new(bytes).unwrap(), *kind, addr)
        })
        .collect();
    let mut results = vec![0u8; paths.len()];
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: the child only makes async-signal-safe calls into memory prepared before the fork.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork: {}", std::io::Error::last_os_error());
    if pid == 0 {
        unsafe {
            libc::close(fds[0]);
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setresgid, gid, gid, gid) != 0
                || libc::syscall(libc::SYS_setresuid, uid, uid, uid) != 0
            {
                libc::_exit(3);
            }
            for (i, (path, kind, addr)) in prepared.iter().enumerate() {
                let mut r = 0u8;
                let fd = libc::open(path.as_ptr(), libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC);
                if fd >= 0 {
                    r |= REACHABLE;
                    libc::close(fd);
                }
                let flags = libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK | libc::O_NOCTTY;
                match kind {
                    Kind::Dir | Kind::File => {
                        let fd = libc::open(
                            path.as_ptr(),
                            flags | if *kind == Kind::Dir { libc::O_DIRECTORY } else { 0 },
                        );
                        if fd >= 0 {
                            r |= READABLE;
                            libc::close(fd);
                        }
                    }
                    Kind::Socket => {
                        let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
                        if s >= 0 {
                            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                            if libc::connect(s, addr as *const _ as *const libc::sockaddr, len) == 0 {
                                r |= READABLE;
                            }
                            libc::close(s);
                        }
                    }
                    Kind::Other => {}
                }
                results[i] = r;
            }
            let mut written = 0;
            while written < results.len() {
                let n = libc::write(fds[1], results[written..].as_ptr().cast(), results.len() - written);
                if n <= 0 {
                    libc::_exit(4);
                }
                written += n as usize;
            }
            libc::_exit(0);
        }
    }
    // SAFETY: our own descriptors; the read end becomes a File that closes it.
    unsafe { libc::close(fds[1]) };
    let mut reader = unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fds[0]) };
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut reader, &mut out).unwrap();
    let mut status = 0;
    // SAFETY: waits for the child forked above.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0,
        "prober as {uid} failed: {status:#x}"
    );
    assert_eq!(out.len(), paths.len());
    out
}

/// The paths `uid` may reach (stat, never list or open) under root and state, and why:
/// root, sandboxes/ and containers/ are 0711 so that a pod user namespace's root can pass to
/// its own directory (their names also show in /proc/self/mountinfo anyway).
fn may_reach(root: &Path, state: &Path, path: &Path) -> bool {
    let parent = path.parent().unwrap_or(path);
    path == root
        || path == state
        || parent == root
        || parent == root.join("sandboxes")
        || parent == root.join("containers")
}

/// Walks root and state as `uid`: nothing listable or readable, nothing reachable past the
/// pods' and containers' own directories.
fn assert_closed_to(uid: u32, root: &Path, state: &Path) {
    let mut paths = walk(root);
    paths.extend(walk(state));
    assert!(paths.len() > 100, "too little to walk: {}", paths.len());
    let results = probe_as(uid, uid, &paths);
    let mut readable = Vec::new();
    let mut reached = Vec::new();
    for ((path, _), r) in paths.iter().zip(&results) {
        if r & READABLE != 0 {
            readable.push(path.display().to_string());
        }
        if r & REACHABLE != 0 && !may_reach(root, state, path) {
            reached.push(path.display().to_string());
        }
    }
    let first = |v: &[String]| v.iter().take(20).cloned().collect::<Vec<_>>();
    assert!(
        readable.is_empty(),
        "uid {uid} can list or read {} paths, among them: {:#?}",
        readable.len(),
        first(&readable)
    );
    assert!(
        reached.is_empty(),
        "uid {uid} can reach {} paths, among them: {:#?}",
        reached.len(),
        first(&reached)
    );
    // The probe is not vacuous: the dirs above root are walkable, root itself is reached.
    let at = |p: &Path| results[paths.iter().position(|(q, _)| q == p).unwrap()];
    assert_eq!(
        at(root),
        REACHABLE,
        "uid {uid} should reach (not list) {}",
        root.display()
    );
}

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().permissions().mode() & 0o7777
}

fn gid(path: &Path) -> u32 {
    std::fs::symlink_metadata(path).unwrap().gid()
}

/// The mode table (docs/design.md, "On-disk layout").
fn assert_modes(rig: &Rig) {
    let root = rig.root();
    let state = &rig.pod.daemon.state;
    for (path, want) in [
        (root.to_path_buf(), 0o711),
        (root.join("meta.redb"), 0o600),
        (root.join("content"), 0o700),
        (root.join("snapshots"), 0o700),
        (root.join("sandboxes"), 0o711),
        (root.join("containers"), 0o711),
        (state.clone(), 0o700),
    ] {
        assert_eq!(mode(&path), want, "{}", path.display());
    }
    let userns_pod = root.join("sandboxes").join(&rig.pod.id);
    let userns_ctr = root.join("containers").join(&rig.userns_container);
    let plain_pod = root.join("sandboxes").join(&rig.plain_id);
    let plain_ctr = root.join("containers").join(&rig.plain_container);
    for dir in [&userns_pod, &userns_ctr] {
        assert_eq!((mode(dir), gid(dir)), (0o710, HOST_ID), "{}", dir.display());
    }
    for dir in [&plain_pod, &plain_ctr] {
        assert_eq!((mode(dir), gid(dir)), (0o700, 0), "{}", dir.display());
    }
    for dir in [&userns_pod, &userns_ctr, &plain_pod, &plain_ctr] {
        assert_eq!(mode(&dir.join("bundle")), 0o700, "{}", dir.display());
        assert_eq!(mode(&dir.join("bundle/config.json")), 0o600, "{}", dir.display());
    }
    for pod in [&userns_pod, &plain_pod] {
        for file in ["hosts", "resolv.conf", "hostname"] {
            assert_eq!(mode(&pod.join(file)), 0o644, "{}", pod.join(file).display());
        }
    }
}

#[tokio::test]
async fn other_host_users_can_neither_list_nor_read_anything_under_root_or_state() {
    let rig = Rig::start("modes-walk").await;
    let root = rig.root().to_path_buf();
    let state = rig.pod.daemon.state.clone();
    // The listing the on-disk layout in docs/design.md describes: every socket, and every directory
    // scute makes down to a pod's or container's own (what is below is image content).
    for top in [&root, &state] {
        let mut listed: Vec<(PathBuf, Kind)> = walk(top)
            .into_iter()
            .filter(|(p, k)| {
                *k == Kind::Socket || (*k == Kind::Dir && p.strip_prefix(top).unwrap().components().count() <= 2)
            })
            .collect();
        listed.sort();
        for (path, kind) in listed {
            eprintln!("figure: {:04o} {:?} {}", mode(&path), kind, path.display());
        }
    }
    assert_closed_to(NOBODY, &root, &state);
    assert_closed_to(OTHER_POD_ROOT, &root, &state);
    assert_modes(&rig);

    // The pod's own root passes to what its containers are made of, and no further.
    let userns_ctr = root.join("containers").join(&rig.userns_container);
    let userns_pod = root.join("sandboxes").join(&rig.pod.id);
    let plain_ctr = root.join("containers").join(&rig.plain_container);
    let plain_pod = root.join("sandboxes").join(&rig.plain_id);
    let checks = [
        (userns_ctr.join("rootfs"), Kind::Dir, REACHABLE | READABLE),
        (userns_pod.join("hosts"), Kind::File, REACHABLE | READABLE),
        (userns_pod.join("resolv.conf"), Kind::File, REACHABLE | READABLE),
        (userns_pod.join("bundle/config.json"), Kind::File, 0),
        (userns_ctr.join("bundle/config.json"), Kind::File, 0),
        (plain_ctr.join("rootfs"), Kind::Dir, 0),
        (plain_pod.join("hosts"), Kind::File, 0),
        (root.join("meta.redb"), Kind::File, REACHABLE),
    ];
    let paths: Vec<(PathBuf, Kind)> = checks.iter().map(|(p, k, _)| (p.clone(), *k)).collect();
    let results = probe_as(HOST_ID, HOST_ID, &paths);
    for ((path, _, want), got) in checks.iter().zip(results) {
        assert_eq!(got, *want, "the pod's root on {}", path.display());
    }
    rig.remove().await;
}

#[tokio::test]
async fn a_restart_tightens_what_an_older_scute_left_open() {
    let mut rig = Rig::start("modes-upgrade").await;
    rig.pod.daemon.stop();
    // As an older scute left them: 0755 dirs of root's group, world-readable store and specs.
    let root = rig.root().to_path_buf();
    let loose = |path: &Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        std::os::unix::fs::chown(path, Some(0), Some(0)).unwrap();
    };
    for dir in [&root, &root.join("content"), &root.join("snapshots")] {
        loose(dir, 0o755);
    }
    loose(&root.join("meta.redb"), 0o644);
    for kind in ["sandboxes", "containers"] {
        loose(&root.join(kind), 0o755);
        for entry in std::fs::read_dir(root.join(kind)).unwrap() {
            let dir = entry.unwrap().path();
            loose(&dir, 0o755);
            loose(&dir.join("bundle"), 0o755);
            loose(&dir.join("bundle/config.json"), 0o644);
        }
    }
    rig.pod.daemon.start_again();
    assert_modes(&rig);
    assert_closed_to(NOBODY, &root, &rig.pod.daemon.state);

    // Both pods still take new containers (the pod with its own user namespace passes its
    // tightened directory).
    rig.pod.run(reader("userns-after", &rig.pod.config, 1000)).await;
    rig.pod.wait_log("userns-after", "ready").await;
    let mut runtime = rig.pod.daemon.runtime().await;
    let id = runtime
        .create_container(api::CreateContainerRequest {
            pod_sandbox_id: rig.plain_id.clone(),
            config: Some(reader("plain-after", &rig.plain_config, 1000)),
            sandbox_config: Some(rig.plain_config.clone()),
        })
        .await
        .unwrap()
        .into_inner()
        .container_id;
    runtime
        .start_container(api::StartContainerRequest { container_id: id })
        .await
        .unwrap();
    rig.pod.wait_log("plain-after", "ready").await;
    rig.remove().await;
}
