//! Pinned network namespaces: one per pod sandbox, at `<state>/netns/<sandbox-id>`.
//!
//! A namespace lives as long as something refers to it. The pin is a bind mount of the nsfs file
//! onto an empty regular file, as `ip netns add` and containerd's `pkg/netns` do it, so the pod's
//! network outlives any process (the CNI plugins enter it by path, the shim hands it to the pause
//! container) and survives a daemon restart.
//!
//! ```text
//!   create(path) ──▶ pinned (nsfs bind mount at path) ──remove(path)──▶ gone
//!                        ▲
//!   open(path) ──────────┤ (after a daemon restart; refuses anything but a network nsfs file)
//!   pin_from_process ────┘ (a pod with its own user namespace: pause made the namespace)
//! ```
//!
//! The namespace is made in a short-lived dedicated thread: `unshare(CLONE_NEWNET)` changes the
//! calling *thread's* namespace, so doing it on a tokio worker would leave that worker (and every
//! task it runs later) inside the pod's network. The thread brings `lo` up and exits right after
//! the bind mount.
//! The pin lives in the daemon's mount namespace.

use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// `statfs.f_type` of nsfs files.
const NSFS_MAGIC: libc::c_long = 0x6e73_6673;

/// A network namespace pinned by a bind mount at `path`. Dropping it does not remove the pin;
/// call [`NetNs::remove`] for that.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetNs {
    path: PathBuf,
}

impl NetNs {
    /// Creates a new network namespace pinned at `path` (parent directories are created). Fails
    /// with `AlreadyExists` when a namespace is already pinned there; an empty file left by an
    /// interrupted create is reused. On failure nothing is left at `path`.
    pub fn create(path: &Path) -> io::Result<NetNs> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if is_nsfs(path)? {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("a namespace is already pinned at {}", path.display()),
            ));
        }
        // The mount point: an empty, read-only regular file.
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o444)
            .open(path)?;

        let target = path.to_path_buf();
        let pinned = std::thread::Builder::new()
            .name("scute-netns".into())
            .spawn(move || -> io::Result<()> {
                // SAFETY: unshare takes no pointers; it only affects this thread, which exits
                // right after and never runs anything else.
                if unsafe { libc::unshare(libc::CLONE_NEWNET) } != 0 {
                    return Err(io::Error::last_os_error());
                }
                loopback_up()?;
                // SAFETY: gettid has no preconditions.
                let tid = unsafe { libc::gettid() };
                let source = PathBuf::from(format!("/proc/self/task/{tid}/ns/net"));
                mount(Some(&source), &target, None::<&str>, MsFlags::MS_BIND, None::<&str>).map_err(io::Error::from)
            })?
            .join()
            .map_err(|_| io::Error::other("the netns thread panicked"))?;
        if let Err(e) = pinned {
            let _ = std::fs::remove_file(path);
            return Err(io::Error::new(
                e.kind(),
                format!("pinning a new network namespace at {}: {e}", path.display()),
            ));
        }
        Ok(NetNs {
            path: path.to_path_buf(),
        })
    }

    /// Pins the network namespace process `pid` is in at `path`: the namespace of a pod whose
    /// pause made it inside the pod's user namespace (which must own it for sysfs to mount).
    pub fn pin_from_process(path: &Path, pid: u32) -> io::Result<NetNs> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        if is_nsfs(path)? {
            return Err(io::Error::new(
                io::ErrorKind::AlreadyExists,
                format!("a namespace is already pinned at {}", path.display()),
            ));
        }
        std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o444)
            .open(path)?;
        let source = PathBuf::from(format!("/proc/{pid}/ns/net"));
        if let Err(e) = mount(Some(&source), path, None::<&str>, MsFlags::MS_BIND, None::<&str>) {
            let _ = std::fs::remove_file(path);
            return Err(io::Error::new(
                io::Error::from(e).kind(),
                format!(
                    "pinning the network namespace of process {pid} at {}: {e}",
                    path.display()
                ),
            ));
        }
        let pinned = NetNs {
            path: path.to_path_buf(),
        };
        if let Err(e) = pinned.in_namespace("scute-netns-lo", loopback_up) {
            let _ = NetNs::remove(path);
            return Err(io::Error::new(
                e.kind(),
                format!("bringing lo up in the network namespace of process {pid}: {e}"),
            ));
        }
        Ok(pinned)
    }

    /// Opens a namespace pinned earlier (e.g. by a previous daemon run). Fails with `NotFound`
    /// when nothing is at `path` and `InvalidData` when `path` is not a pinned network namespace.
    pub fn open(path: &Path) -> io::Result<NetNs> {
        if !is_nsfs(path)? {
            let kind = if path.exists() {
                io::ErrorKind::InvalidData
            } else {
                io::ErrorKind::NotFound
            };
            return Err(io::Error::new(
                kind,
                format!("{} is not a pinned namespace", path.display()),
            ));
        }
        let file = std::fs::File::open(path)?;
        // SAFETY: NS_GET_NSTYPE takes no argument and only reads the fd.
        let kind = unsafe { libc::ioctl(file.as_raw_fd(), libc::NS_GET_NSTYPE) };
        if kind < 0 {
            return Err(io::Error::last_os_error());
        }
        if kind != libc::CLONE_NEWNET {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("{} is a namespace but not a network namespace", path.display()),
            ));
        }
        Ok(NetNs {
            path: path.to_path_buf(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The namespace's inode number (what `/proc/<pid>/ns/net` links to as `net:[<inode>]`).
    pub fn inode(&self) -> io::Result<u64> {
        Ok(std::fs::metadata(&self.path)?.ino())
    }

    /// Connects to `port` on the namespace's loopback (127.0.0.1, then ::1), for port-forward: a
    /// socket keeps the namespace it was made in, so it is made by a short-lived thread that
    /// joined the namespace (never a pooled worker) and then used from anywhere. No socat, no
    /// nsenter.
    pub fn connect_loopback(&self, port: u16) -> io::Result<std::net::TcpStream> {
        self.in_namespace("scute-netns-connect", move || connect_loopback(port))
    }

    /// Runs `f` in a short-lived thread that joined the namespace (never a pooled worker).
    fn in_namespace<T: Send + 'static>(
        &self,
        thread: &str,
        f: impl FnOnce() -> io::Result<T> + Send + 'static,
    ) -> io::Result<T> {
        let ns = std::fs::File::open(&self.path)?;
        std::thread::Builder::new()
            .name(thread.into())
            .spawn(move || {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)?;
                f()
            })?
            .join()
            .map_err(|_| io::Error::other("the netns thread panicked"))?
    }

    /// Unmounts the pin (lazily, so a plugin still inside does not make this fail) and removes
    /// the file. Idempotent: a missing path, or a file that is no longer a mount, is fine.
    pub fn remove(path: &Path) -> io::Result<()> {
        // A pin may have been stacked (a retried create after a crash): unmount until none is left.
        for _ in 0..16 {
            match umount2(path, MntFlags::MNT_DETACH) {
                Ok(()) => continue,
                Err(nix::errno::Errno::ENOENT) => return Ok(()),
                // Not a mount point (any more).
                Err(nix::errno::Errno::EINVAL) => break,
                Err(e) => {
                    return Err(io::Error::new(
                        io::Error::from(e).kind(),
                        format!("unmounting network namespace {}: {e}", path.display()),
                    ))
                }
            }
        }
        match std::fs::remove_file(path) {
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
            other => other,
        }
    }
}

/// Brings `lo` up in the calling thread's network namespace (a new one has it down); the
/// kernel gives it 127.0.0.1 and ::1. What the CNI `loopback` plugin does on ADD, without its
/// exec. SIOCSIFFLAGS by hand: nix has no wrapper for the interface ioctls.
fn loopback_up() -> io::Result<()> {
    use std::os::fd::FromRawFd;
    // SAFETY: socket takes no pointers; the fd is owned below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh fd nothing else owns.
    let socket = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain data; all zeroes is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: SIOCGIFFLAGS and SIOCSIFFLAGS read and write an ifreq, which outlives the calls.
    unsafe {
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) != 0 {
            return Err(io::Error::last_os_error());
        }
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        if libc::ioctl(socket.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// Connects to `port` on the loopback of the calling thread's network namespace.
pub fn connect_loopback(port: u16) -> io::Result<std::net::TcpStream> {
    let timeout = std::time::Duration::from_secs(10);
    let v4 = std::net::SocketAddr::from(([127, 0, 0, 1], port));
    std::net::TcpStream::connect_timeout(&v4, timeout).or_else(|e4| {
        let v6 = std::net::SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, port));
        std::net::TcpStream::connect_timeout(&v6, timeout).map_err(|_| e4)
    })
}

/// Whether `path` is an nsfs file (i.e. a pinned or /proc namespace). A missing path is not.
pub(crate) fn is_nsfs(path: &Path) -> io::Result<bool> {
    match nix::sys::statfs::statfs(path) {
        Ok(fs) => Ok(fs.filesystem_type().0 as libc::c_long == NSFS_MAGIC),
        Err(nix::errno::Errno::ENOENT) => Ok(false),
        Err(e) => Err(io::Error::from(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    fn mounted(path: &Path) -> bool {
        scute_sys::mountinfo::is_mountpoint(path)
    }

    fn net_inode_of_self() -> u64 {
        std::fs::metadata("/proc/self/ns/net").unwrap().ino()
    }

    #[test]
    fn open_refuses_missing_and_plain_files() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope");
        assert_eq!(NetNs::open(&missing).unwrap_err().kind(), io::ErrorKind::NotFound);
        let plain = dir.path().join("plain");
        std::fs::write(&plain, "").unwrap();
        assert_eq!(NetNs::open(&plain).unwrap_err().kind(), io::ErrorKind::InvalidData);
        // Removing something that is not a pin just removes the file; twice is fine.
        NetNs::remove(&plain).unwrap();
        assert!(!plain.exists());
        NetNs::remove(&plain).unwrap();
    }

    #[test]
    fn open_refuses_other_namespace_kinds() {
        if !is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        // /proc/self/ns/uts is an nsfs file of another kind.
        let err = NetNs::open(Path::new("/proc/self/ns/uts")).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "{err}");
        NetNs::open(Path::new("/proc/self/ns/net")).unwrap();
    }

    #[test]
    fn create_open_remove() {
        if !is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("netns/sandbox-1");
        let ns = NetNs::create(&path).unwrap();
        assert_eq!(ns.path(), path);
        assert!(mounted(&path));
        let inode = ns.inode().unwrap();
        assert_ne!(inode, net_inode_of_self(), "the new namespace is not ours");
        // This thread (a test thread) was not moved into it.
        assert_ne!(std::fs::metadata("/proc/thread-self/ns/net").unwrap().ino(), inode);
        // Its lo is up, with 127.0.0.1, as ip(8) sees it; and a listener there is reachable.
        let ip = std::process::Command::new("nsenter")
            .arg(format!("--net={}", path.display()))
            .args(["ip", "-o", "addr", "show", "dev", "lo", "up"])
            .output()
            .unwrap();
        let ip = String::from_utf8_lossy(&ip.stdout);
        assert!(ip.contains("inet 127.0.0.1/8"), "{ip}");
        let listener = ns
            .in_namespace("test-listen", || std::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        ns.connect_loopback(port).unwrap();

        // Reopened (as after a restart): the same namespace.
        let again = NetNs::open(&path).unwrap();
        assert_eq!(again.inode().unwrap(), inode);
        // A second create on a live pin refuses instead of stacking.
        assert_eq!(NetNs::create(&path).unwrap_err().kind(), io::ErrorKind::AlreadyExists);

        // Two namespaces are distinct.
        let other = NetNs::create(&dir.path().join("netns/sandbox-2")).unwrap();
        assert_ne!(other.inode().unwrap(), inode);

        NetNs::remove(&path).unwrap();
        assert!(!path.exists());
        assert!(!mounted(&path));
        NetNs::remove(&path).unwrap();
        NetNs::remove(other.path()).unwrap();
        assert!(!mounted(other.path()));
    }

    #[test]
    fn create_reuses_an_empty_leftover_file_and_remove_unstacks() {
        if !is_root() {
            eprintln!("skipped: needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("leftover");
        std::fs::write(&path, "").unwrap();
        let ns = NetNs::create(&path).unwrap();
        // Stack a second pin by hand, as a crash between mount and bookkeeping could.
        mount(
            Some(Path::new("/proc/self/ns/net")),
            &path,
            None::<&str>,
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .unwrap();
        assert_eq!(ns.inode().unwrap(), net_inode_of_self());
        NetNs::remove(&path).unwrap();
        assert!(!mounted(&path));
        assert!(!path.exists());
    }
}
