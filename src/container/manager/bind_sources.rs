//! Bind mounts get what was checked (issue 19: a hostPath with a symlink swapped in between check
//! and mount). The spec names each CRI bind's source by the canonical path the spec builder
//! resolved; libcontainer resolves that path again when it mounts, in the container's init, tens
//! of milliseconds later. A directory on it replaced by a symlink meanwhile (by anyone who can
//! write its parent: another pod with a hostPath above it) would make it bind whatever the link
//! names — the host's root, say. runc and containerd have the same window.
//!
//! So at StartContainer each bind source is opened (O_PATH) before the shim makes the process,
//! and held until it is made; a CRI source, canonical by construction (CreateContainer's spec
//! builder resolved it), must still be there with no symlink on its path (one there now was
//! swapped in). Once made, each visible bind's destination, resolved in the container's root,
//! must be the very inode held, or the start fails (a StartError, the process released) naming
//! the mount. A destination not there at all is covered (by a
//! later mount reached through an image symlink, or a masked path): a swap leaves the mount
//! point in place, resolving to something else.
//!
//! Before any of that, a bind the image's symlinks lead into /proc (`/data` -> `/proc/sys`) is
//! refused as a CRI mount spelt into /proc is: libcontainer 0.7's own check misses a link that
//! dangles in the image and makes the bind. Links inside volumes (another container's writes)
//! are not looked at: only the image's.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{open, openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, Mode};
use oci_spec::runtime::{Mount, Spec};

/// openat2 answers EAGAIN when a rename raced the lookup; retrying is safe.
const OPENAT2_ATTEMPTS: usize = 16;

/// A bind source held open, with the inode it is.
struct Pinned {
    destination: PathBuf,
    source: PathBuf,
    dev: u64,
    ino: u64,
    /// False for a bind a later mount covers (checked when pinned, not visible after).
    visible: bool,
    _fd: OwnedFd,
}

/// The bind sources of one container's spec, held from before its process is made until checked.
pub(super) struct BindSources(Vec<Pinned>);

impl BindSources {
    /// Opens the source of every bind of `spec`. `strict`: the destinations whose source must
    /// be there with no symlink on its path (the CRI's: the spec builder just resolved, or
    /// made, each). Err is the FailedPrecondition message.
    pub(super) fn pin(spec: &Spec, strict: &[String]) -> Result<BindSources, String> {
        let mounts = spec.mounts().as_deref().unwrap_or_default();
        let mut pinned = Vec::new();
        for (i, m) in mounts.iter().enumerate() {
            let Some(source) = bind_source(m) else { continue };
            let strict = strict.iter().any(|d| Path::new(d) == m.destination());
            let fd = match open_source(source, strict) {
                Ok(fd) => fd,
                Err(Errno::ENOENT) if strict => {
                    return Err(format!(
                        "mount source {} for {} is gone since it was resolved: refused",
                        source.display(),
                        m.destination().display()
                    ))
                }
                // libcontainer reports (or makes, for cgroup dirs) a source not there yet.
                Err(Errno::ENOENT) => continue,
                Err(Errno::ELOOP) if strict => {
                    return Err(format!(
                        "mount source {} for {} has a symlink on its path now that was not there when it was resolved: refused",
                        source.display(),
                        m.destination().display()
                    ))
                }
                Err(e) => return Err(format!("opening mount source {}: {e}", source.display())),
            };
            let st = fstat(fd.as_raw_fd()).map_err(|e| format!("stat of mount source {}: {e}", source.display()))?;
            pinned.push(Pinned {
                destination: m.destination().clone(),
                source: source.to_path_buf(),
                dev: st.st_dev,
                ino: st.st_ino,
                visible: !hidden(m.destination(), &mounts[i + 1..]),
                _fd: fd,
            });
        }
        Ok(BindSources(pinned))
    }

    /// Checks that every pinned bind's destination in the root of process `pid` (the created
    /// container's init) is the inode that was held. Err is the FailedPrecondition message.
    pub(super) fn verify(&self, pid: u32) -> Result<(), String> {
        if self.0.is_empty() {
            return Ok(());
        }
        let root = open(
            Path::new(&format!("/proc/{pid}/root")),
            OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map(owned)
        .map_err(|e| format!("opening the root of the container's process {pid}: {e}"))?;
        self.verify_in(&root)
    }

    fn verify_in(&self, root: &OwnedFd) -> Result<(), String> {
        for p in self.0.iter().filter(|p| p.visible) {
            let mounted = open_in(root, &p.destination).and_then(|fd| fstat(fd.as_raw_fd()));
            match mounted {
                Ok(st) if (st.st_dev, st.st_ino) == (p.dev, p.ino) => {}
                // Not there at all: covered by a later mount reached through a symlink in the
                // image (/var/run -> /run) or by a masked path, so not what the container sees. A
                // swapped source leaves the mount point there, resolving to something else.
                Err(Errno::ENOENT) => {}
                Ok(_) => {
                    return Err(format!(
                        "the mount at {} is not {} as it was when checked (its path changed while the container was created): refused",
                        p.destination.display(),
                        p.source.display()
                    ))
                }
                Err(e) => {
                    return Err(format!(
                        "the mount at {} cannot be looked up in the container: {e}",
                        p.destination.display()
                    ))
                }
            }
        }
        Ok(())
    }
}

/// Refuses a bind whose destination the image's symlinks lead into procfs (the runc
/// CVE-2025-52565 class: a bind there would receive what the runtime writes to procfs). Err is
/// the FailedPrecondition message: the request is fine, the image is not.
pub(super) fn refuse_binds_into_procfs(spec: &Spec, rootfs: &Path) -> Result<(), String> {
    let root = crate::snapshot::rootfs::open_root(rootfs).map_err(|e| format!("opening the container's root: {e}"))?;
    for m in spec.mounts().iter().flatten().filter(|m| bind_source(m).is_some()) {
        let spelt = m.destination().to_string_lossy();
        if spelt == "/proc" || spelt.starts_with("/proc/") {
            continue; // spelt there: the spec builder let only lxcfs files through
        }
        let lands = crate::snapshot::rootfs::resolve_in_root(&root, &spelt)
            .map_err(|e| format!("resolving mount {spelt} in the image: {e}"))?;
        let lands = lands.to_string_lossy();
        if crate::oci::covers_procfs(&lands) {
            return Err(format!(
                "mount at {spelt} leads to {lands} through the image's symlinks: refused (a mount in /proc would receive what the runtime writes to procfs)"
            ));
        }
    }
    Ok(())
}

/// The host source of a bind mount, if `m` is one.
fn bind_source(m: &Mount) -> Option<&Path> {
    let bind = m.typ().as_deref() == Some("bind") || m.options().iter().flatten().any(|o| o == "bind" || o == "rbind");
    bind.then(|| m.source().as_deref())
        .flatten()
        .filter(|s| s.is_absolute())
}

/// Whether a later mount goes on `destination` or one of its parents (then it is not seen).
fn hidden(destination: &Path, later: &[Mount]) -> bool {
    later.iter().any(|l| destination.starts_with(l.destination()))
}

/// Opens `source` as libcontainer will reach it. O_DIRECTORY first: an O_PATH open of an
/// automount point does not mount it unless a directory is asked for (libcontainer's open_tree
/// mounts it), and the inodes would differ.
fn open_source(source: &Path, strict: bool) -> Result<OwnedFd, Errno> {
    let slash = open(
        Path::new("/"),
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map(owned)?;
    let resolve = if strict {
        ResolveFlag::RESOLVE_NO_SYMLINKS
    } else {
        ResolveFlag::empty()
    };
    let rel = source.strip_prefix("/").unwrap_or(source);
    let open_as = |flags: OFlag| {
        let how = OpenHow::new()
            .flags(OFlag::O_PATH | OFlag::O_CLOEXEC | flags)
            .resolve(resolve);
        retry(|| openat2(slash.as_raw_fd(), rel, how))
    };
    match open_as(OFlag::O_DIRECTORY) {
        Err(Errno::ENOTDIR) => open_as(OFlag::empty()),
        other => other,
    }
}

/// `path` in the container's root, as libcontainer resolved the destination: symlinks followed
/// inside the root.
fn open_in(root: &OwnedFd, path: &Path) -> Result<OwnedFd, Errno> {
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    retry(|| openat2(root.as_raw_fd(), path.strip_prefix("/").unwrap_or(path), how))
}

fn retry(mut f: impl FnMut() -> Result<RawFd, Errno>) -> Result<OwnedFd, Errno> {
    let mut attempts = 0;
    loop {
        match f() {
            Err(Errno::EAGAIN) if attempts < OPENAT2_ATTEMPTS => attempts += 1,
            other => return other.map(owned),
        }
    }
}

fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: a descriptor the kernel just returned, owned by nothing else.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::symlink;

    use oci_spec::runtime::{MountBuilder, SpecBuilder};

    use super::*;

    fn bind(destination: &Path, source: &Path) -> Mount {
        MountBuilder::default()
            .destination(destination)
            .typ("bind")
            .source(source)
            .options(vec!["rbind".to_string()])
            .build()
            .unwrap()
    }

    fn spec(mounts: Vec<Mount>) -> Spec {
        SpecBuilder::default().mounts(mounts).build().unwrap()
    }

    fn root() -> OwnedFd {
        open(Path::new("/"), OFlag::O_PATH | OFlag::O_DIRECTORY, Mode::empty())
            .map(owned)
            .unwrap()
    }

    /// With this process's root as the "container's": a destination that still is the held
    /// source passes; one whose path now leads elsewhere (a directory swapped for a symlink) is
    /// refused naming it.
    #[test]
    fn a_source_swapped_after_the_check_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        // Canonical, as the spec builder makes a CRI source (TMPDIR may be under a link).
        let top = std::fs::canonicalize(dir.path()).unwrap();
        let (real, decoy) = (top.join("real"), top.join("decoy"));
        std::fs::create_dir_all(real.join("data")).unwrap();
        std::fs::create_dir_all(decoy.join("data")).unwrap();
        let source = real.join("data");
        let dest = source.to_string_lossy().into_owned();
        let pins = BindSources::pin(&spec(vec![bind(&source, &source)]), std::slice::from_ref(&dest)).unwrap();
        pins.verify_in(&root()).unwrap();

        std::fs::rename(&real, top.join("moved")).unwrap();
        symlink(&decoy, &real).unwrap();
        let err = pins.verify_in(&root()).unwrap_err();
        assert!(err.contains(&dest) && err.contains("is not"), "{err}");
        // Pinning now: the canonical path has a symlink on it.
        let err = BindSources::pin(&spec(vec![bind(&source, &source)]), std::slice::from_ref(&dest))
            .err()
            .unwrap();
        assert!(err.contains("has a symlink on its path"), "{err}");
        // A source that is not the CRI's may be reached through a link.
        BindSources::pin(&spec(vec![bind(&source, &source)]), &[]).unwrap();
        // A CRI source gone since it was resolved is refused; another is left to libcontainer.
        let gone = top.join("gone");
        let gone_dest = gone.to_string_lossy().into_owned();
        let err = BindSources::pin(&spec(vec![bind(&gone, &gone)]), std::slice::from_ref(&gone_dest))
            .err()
            .unwrap();
        assert!(err.contains("is gone"), "{err}");
        assert!(BindSources::pin(&spec(vec![bind(&gone, &gone)]), &[])
            .unwrap()
            .0
            .is_empty());
    }

    /// A destination that is not there in the container (covered through an image symlink, or
    /// masked) is not what the container sees: no refusal. A file bind passes too.
    #[test]
    fn covered_destinations_and_file_binds_pass() {
        let dir = tempfile::tempdir().unwrap();
        let top = std::fs::canonicalize(dir.path()).unwrap();
        let file = top.join("file");
        std::fs::write(&file, "x").unwrap();
        let dest = file.to_string_lossy().into_owned();
        let pins = BindSources::pin(&spec(vec![bind(&file, &file)]), std::slice::from_ref(&dest)).unwrap();
        pins.verify_in(&root()).unwrap();
        std::fs::remove_file(&file).unwrap();
        pins.verify_in(&root()).unwrap();
    }

    #[test]
    fn hidden_binds_are_held_not_checked_and_non_binds_neither() {
        let dir = tempfile::tempdir().unwrap();
        let tmpfs = MountBuilder::default()
            .destination("/dev")
            .typ("tmpfs")
            .source("tmpfs")
            .build()
            .unwrap();
        let mounts = vec![
            bind(Path::new("/data/sub"), dir.path()),
            bind(Path::new("/data"), dir.path()),
            tmpfs,
            bind(Path::new("/dev/termination-log"), dir.path()),
        ];
        let pins = BindSources::pin(&spec(mounts), &[]).unwrap();
        let held: Vec<(&Path, bool)> = pins.0.iter().map(|p| (p.destination.as_path(), p.visible)).collect();
        assert_eq!(
            held,
            [
                (Path::new("/data/sub"), false),
                (Path::new("/data"), true),
                (Path::new("/dev/termination-log"), true)
            ]
        );
    }
}
