//! Secure unpacking of one image layer into an overlay layer directory.
//!
//! Like Docker's overlay2 driver and containers-storage, every layer is extracted on its own into
//! an empty directory that later serves as an overlay lower (or upper) dir. OCI whiteouts are
//! converted to overlayfs form on the way: `.wh.NAME` becomes a 0:0 character device `NAME`, and
//! `DIR/.wh..wh..opq` becomes `trusted.overlay.opaque=y` on `DIR`.
//!
//! The archive is hostile input. Everything goes through file descriptors: an entry's parent
//! directory is opened with `openat2(RESOLVE_BENEATH)` from the destination, so no symlink
//! (absolute, or climbing with `..`) can lead outside it, and the entry's own name is only touched
//! with `*at` calls that never follow it.
//!
//! Deliberate differences from Docker's `archive.Unpack`:
//! - a path that crosses a symlink pointing outside the destination is an error; Docker runs the
//!   unpack chrooted, so there an absolute symlink resolves inside the layer instead;
//! - a hard link entry only adds a name: the inode keeps the metadata of the entry that created
//!   it, where Docker re-applies the link header's owner, mode and times to the shared inode;
//! - xattrs in the `trusted.overlay.` and `user.overlay.` namespaces are dropped (a layer must not
//!   forge overlay metadata), and xattrs of device nodes and FIFOs are dropped;
//! - aufs metadata (any path component starting with `.wh..wh.` other than the opaque marker) is
//!   skipped, including hard links into `.wh..wh.plnk`, which then fail as missing targets.

use std::cmp::Reverse;
use std::collections::HashMap;
use std::ffi::{CStr, CString};
use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

use nix::dir::{Dir, Type};
use nix::errno::Errno;
use nix::fcntl::{open, openat, openat2, AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{
    fchmod, fchmodat, fstat, fstatat, futimens, makedev, mkdirat, mknodat, utimensat, FchmodatFlags, FileStat, Mode,
    SFlag, UtimensatFlags,
};
use nix::sys::time::TimeSpec;
use nix::unistd::{fchown, fchownat, linkat, symlinkat, unlinkat, Gid, Uid, UnlinkatFlags};

const WHITEOUT_PREFIX: &[u8] = b".wh.";
/// `.wh..wh..opq` with the whiteout prefix already removed.
const OPAQUE_SUFFIX: &[u8] = b".wh..opq";
const OPAQUE_MARKER: &[u8] = b".wh..wh..opq";
const AUFS_META_PREFIX: &[u8] = b".wh..wh.";
const OPAQUE_XATTR: &CStr = c"trusted.overlay.opaque";
const PAX_XATTR_PREFIX: &[u8] = b"SCHILY.xattr.";
const PAX_MTIME: &[u8] = b"mtime";
/// Overlay keeps its own metadata in these namespaces (`user.` when mounted with `userxattr`).
const OVERLAY_XATTR_PREFIXES: [&[u8]; 2] = [b"trusted.overlay.", b"user.overlay."];
const COPY_BUFFER_SIZE: usize = 128 * 1024;
/// openat2 returns EAGAIN under RESOLVE_BENEATH when a rename raced the lookup; it is safe to retry.
const OPENAT2_ATTEMPTS: usize = 16;

/// What one layer unpack wrote.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct UnpackStats {
    /// Archive entries processed (including skipped ones and whiteouts).
    pub entries: u64,
    /// Regular file bytes written.
    pub bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    /// An entry that would create, write, link or change something outside the destination, or
    /// is otherwise malicious or invalid.
    #[error("refusing layer entry {entry:?}: {reason}")]
    Hostile { entry: String, reason: String },
    #[error("unpacking {entry:?}: {source}")]
    Io { entry: String, source: io::Error },
    /// The archive itself is malformed or truncated.
    #[error("malformed layer archive: {0}")]
    Tar(#[source] io::Error),
}

/// Extracts `layer` (an uncompressed tar stream) into `dest`, an empty directory, converting
/// whiteouts to overlayfs form. On error `dest` is left partially written; the caller deletes it.
pub fn unpack_layer<R: Read>(layer: R, dest: &Path) -> Result<UnpackStats, UnpackError> {
    let mut unpacker = Unpacker::open(dest)?;
    let mut archive = tar::Archive::new(layer);
    for entry in archive.entries().map_err(UnpackError::Tar)? {
        let mut entry = entry.map_err(UnpackError::Tar)?;
        unpacker.unpack_entry(&mut entry)?;
    }
    unpacker.apply_dir_times()?;
    Ok(unpacker.stats)
}

/// The kinds of entries that end up in the layer directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Dir,
    File,
    Symlink,
    HardLink,
    Node(SFlag),
}

impl Kind {
    fn of(header: &tar::Header, raw_path: &[u8]) -> Option<Kind> {
        use tar::EntryType as T;
        // Pre-POSIX archives mark a directory only by the trailing slash of a "regular" entry.
        if header.as_old().linkflag[0] == 0 && raw_path.ends_with(b"/") {
            return Some(Kind::Dir);
        }
        Some(match header.entry_type() {
            T::Regular | T::Continuous | T::GNUSparse => Kind::File,
            T::Directory => Kind::Dir,
            T::Symlink => Kind::Symlink,
            T::Link => Kind::HardLink,
            T::Char => Kind::Node(SFlag::S_IFCHR),
            T::Block => Kind::Node(SFlag::S_IFBLK),
            T::Fifo => Kind::Node(SFlag::S_IFIFO),
            _ => return None,
        })
    }
}

/// Ownership, permissions, time and xattrs of an entry, from its header and PAX records.
struct Meta {
    uid: Uid,
    gid: Gid,
    mode: Mode,
    mtime: TimeSpec,
    xattrs: Vec<(CString, Vec<u8>)>,
}

impl Meta {
    fn read<R: Read>(entry: &mut tar::Entry<'_, R>, shown: &str) -> Result<Meta, UnpackError> {
        let header = entry.header();
        // The tar crate already folds PAX uid/gid into the header; uname/gname are ignored.
        let uid = Uid::from_raw(id_from_header(header.uid(), shown)?);
        let gid = Gid::from_raw(id_from_header(header.gid(), shown)?);
        let mode = Mode::from_bits_truncate(header.mode().map_err(UnpackError::Tar)? & 0o7777);
        let seconds = header.mtime().map_err(UnpackError::Tar)?;
        let mut mtime = TimeSpec::new(i64::try_from(seconds).unwrap_or(i64::MAX), 0);
        let mut xattrs = Vec::new();
        if let Some(records) = entry.pax_extensions().map_err(UnpackError::Tar)? {
            for record in records {
                let record = record.map_err(UnpackError::Tar)?;
                let (key, value) = (record.key_bytes(), record.value_bytes());
                if key == PAX_MTIME {
                    mtime = parse_pax_time(value).unwrap_or(mtime);
                } else if let Some(name) = key.strip_prefix(PAX_XATTR_PREFIX) {
                    xattrs.extend(allowed_xattr(name, value, shown));
                }
            }
        }
        Ok(Meta {
            uid,
            gid,
            mode,
            mtime,
            xattrs,
        })
    }
}

fn id_from_header(id: io::Result<u64>, shown: &str) -> Result<u32, UnpackError> {
    let id = id.map_err(UnpackError::Tar)?;
    u32::try_from(id).map_err(|_| hostile(shown, format!("owner id {id} is out of range")))
}

/// Parses a PAX time, `[-]SECONDS[.FRACTION]`.
fn parse_pax_time(value: &[u8]) -> Option<TimeSpec> {
    let text = std::str::from_utf8(value).ok()?;
    let (negative, text) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text),
    };
    let (seconds, fraction) = text.split_once('.').unwrap_or((text, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if seconds.is_empty() || !all_digits(seconds) || !all_digits(fraction) {
        return None;
    }
    let seconds: i64 = seconds.parse().ok()?;
    let nanos: i64 = format!("{:0<9}", &fraction[..fraction.len().min(9)]).parse().ok()?;
    Some(match (negative, nanos) {
        (false, _) => TimeSpec::new(seconds, nanos),
        (true, 0) => TimeSpec::new(-seconds, 0),
        (true, _) => TimeSpec::new(-seconds - 1, 1_000_000_000 - nanos),
    })
}

/// Keeps an xattr unless it would forge overlay metadata or cannot be named.
fn allowed_xattr(name: &[u8], value: &[u8], shown: &str) -> Option<(CString, Vec<u8>)> {
    if OVERLAY_XATTR_PREFIXES.iter().any(|prefix| name.starts_with(prefix)) {
        tracing::debug!(entry = shown, xattr = %String::from_utf8_lossy(name), "dropping overlay xattr from layer");
        return None;
    }
    let name = CString::new(name).ok().filter(|name| !name.is_empty())?;
    Some((name, value.to_vec()))
}

/// Splits an archive path into its components beneath the destination, dropping `.` and empty
/// components (`./a//b/` is `a/b`). An empty result names the destination itself.
fn clean_path(raw: &[u8]) -> Result<Vec<&[u8]>, &'static str> {
    if raw.is_empty() {
        return Err("empty path");
    }
    if raw.contains(&0) {
        return Err("NUL byte in path");
    }
    if raw.starts_with(b"/") {
        return Err("absolute path");
    }
    let mut parts = Vec::new();
    for part in raw.split(|&byte| byte == b'/') {
        match part {
            b"" | b"." => {}
            b".." => return Err("path contains a `..` component"),
            _ => parts.push(part),
        }
    }
    Ok(parts)
}

fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.join(&b'/')
}

/// A path component or cleaned path as a C string; callers have already rejected NUL bytes.
fn c_string(bytes: &[u8]) -> CString {
    CString::new(bytes).unwrap_or_default()
}

fn is_aufs_metadata(parts: &[&[u8]]) -> bool {
    parts
        .iter()
        .any(|part| part.starts_with(AUFS_META_PREFIX) && *part != OPAQUE_MARKER)
}

fn hostile(entry: &str, reason: impl Into<String>) -> UnpackError {
    UnpackError::Hostile {
        entry: entry.to_owned(),
        reason: reason.into(),
    }
}

fn io_error(entry: &str, err: impl Into<io::Error>) -> UnpackError {
    UnpackError::Io {
        entry: entry.to_owned(),
        source: err.into(),
    }
}

/// EXDEV from a RESOLVE_BENEATH lookup means a symlink on the path leads outside the destination.
fn resolve_error(entry: &str, err: Errno) -> UnpackError {
    match err {
        Errno::EXDEV => hostile(entry, "path leads outside the destination through a symlink"),
        _ => io_error(entry, err),
    }
}

fn owned(fd: RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful open and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// Opens `path` (relative, already cleaned) beneath `root` without ever leaving it.
fn open_beneath(root: BorrowedFd<'_>, path: &[u8], flags: OFlag) -> Result<OwnedFd, Errno> {
    let path = if path.is_empty() {
        c".".to_owned()
    } else {
        c_string(path)
    };
    let how = OpenHow::new()
        .flags(flags | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
    let mut attempts = 0;
    loop {
        match openat2(root.as_raw_fd(), path.as_c_str(), how) {
            Err(Errno::EAGAIN) if attempts < OPENAT2_ATTEMPTS => attempts += 1,
            result => return result.map(owned),
        }
    }
}

fn dir_path_flags() -> OFlag {
    OFlag::O_PATH | OFlag::O_DIRECTORY
}

/// Opens the directory `parts` beneath `dest`, creating missing directories (0755) one
/// component at a time and re-resolving each one beneath `dest`.
fn open_parent(dest: BorrowedFd<'_>, parts: &[&[u8]]) -> Result<OwnedFd, Errno> {
    match open_beneath(dest, &join(parts), dir_path_flags()) {
        Err(Errno::ENOENT) => {}
        found => return found,
    }
    let mut dir = open_beneath(dest, b"", dir_path_flags())?;
    for depth in 1..=parts.len() {
        let prefix = join(&parts[..depth]);
        dir = match open_beneath(dest, &prefix, dir_path_flags()) {
            Err(Errno::ENOENT) => {
                make_implicit_dir(dir.as_fd(), &c_string(parts[depth - 1]))?;
                open_beneath(dest, &prefix, dir_path_flags())?
            }
            found => found?,
        };
    }
    Ok(dir)
}

/// Creates a directory the archive implies but does not list, with a umask-independent 0755.
fn make_implicit_dir(parent: BorrowedFd<'_>, name: &CStr) -> Result<(), Errno> {
    let mode = Mode::from_bits_truncate(0o755);
    match mkdirat(Some(parent.as_raw_fd()), name, mode) {
        // A dangling symlink: the re-open beneath dest reports it.
        Err(Errno::EEXIST) => Ok(()),
        Err(err) => Err(err),
        Ok(()) => fchmodat(Some(parent.as_raw_fd()), name, mode, FchmodatFlags::NoFollowSymlink),
    }
}

/// The most recently used parent directory: layers list entries in directory order, so
/// consecutive entries mostly share a parent.
#[derive(Default)]
struct ParentCache {
    path: Vec<u8>,
    fd: Option<OwnedFd>,
}

impl ParentCache {
    fn open(&mut self, dest: BorrowedFd<'_>, parts: &[&[u8]]) -> Result<BorrowedFd<'_>, Errno> {
        let path = join(parts);
        let fd = match self.fd.take() {
            Some(fd) if self.path == path => fd,
            _ => open_parent(dest, parts)?,
        };
        self.path = path;
        let fd: &OwnedFd = self.fd.insert(fd);
        Ok(fd.as_fd())
    }

    /// Called after anything was removed: the cached path may no longer name the cached dir.
    fn forget(&mut self) {
        self.fd = None;
    }
}

/// An entry's final component: a name inside its already resolved parent directory.
#[derive(Clone, Copy)]
struct Target<'a> {
    dir: BorrowedFd<'a>,
    name: &'a CStr,
}

impl Target<'_> {
    fn dirfd(&self) -> Option<RawFd> {
        Some(self.dir.as_raw_fd())
    }
}

fn is_dir(stat: &FileStat) -> bool {
    stat.st_mode & libc::S_IFMT == libc::S_IFDIR
}

/// What currently exists at `at`, without following a symlink there.
fn lstat(at: Target<'_>) -> Result<Option<FileStat>, Errno> {
    match fstatat(at.dirfd(), at.name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(stat) => Ok(Some(stat)),
        Err(Errno::ENOENT) => Ok(None),
        Err(err) => Err(err),
    }
}

/// Removes what exists at `at`; a directory with everything below it.
fn remove(at: Target<'_>, existing: &FileStat) -> Result<(), Errno> {
    if !is_dir(existing) {
        return unlinkat(at.dirfd(), at.name, UnlinkatFlags::NoRemoveDir);
    }
    // Walk down with one open directory at a time and climb back with `..` (the tree is ours
    // and nothing else renames in it), so a hostile depth exhausts neither fds nor the stack.
    let mut path_below: Vec<CString> = Vec::new();
    let mut current = open_dir(at.dir, at.name)?;
    loop {
        if let Some(subdir) = unlink_files_until_subdir(current.as_fd())? {
            current = open_dir(current.as_fd(), &subdir)?;
            path_below.push(subdir);
            continue;
        }
        let Some(emptied) = path_below.pop() else {
            break;
        };
        let parent = open_dir(current.as_fd(), c"..")?;
        unlinkat(Some(parent.as_raw_fd()), emptied.as_c_str(), UnlinkatFlags::RemoveDir)?;
        current = parent;
    }
    unlinkat(at.dirfd(), at.name, UnlinkatFlags::RemoveDir)
}

fn open_dir(parent: BorrowedFd<'_>, name: &CStr) -> Result<OwnedFd, Errno> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    openat(Some(parent.as_raw_fd()), name, flags, Mode::empty()).map(owned)
}

/// Unlinks the non-directories of `dir` until it meets a subdirectory, whose name it returns.
fn unlink_files_until_subdir(dir: BorrowedFd<'_>) -> Result<Option<CString>, Errno> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut listing = Dir::openat(Some(dir.as_raw_fd()), c".", flags, Mode::empty())?;
    for entry in listing.iter() {
        let entry = entry?;
        let name = entry.file_name();
        if name == c"." || name == c".." {
            continue;
        }
        let at = Target { dir, name };
        let subdir = match entry.file_type() {
            Some(kind) => kind == Type::Directory,
            None => lstat(at)?.is_some_and(|stat| is_dir(&stat)),
        };
        if subdir {
            return Ok(Some(name.to_owned()));
        }
        unlinkat(at.dirfd(), name, UnlinkatFlags::NoRemoveDir)?;
    }
    Ok(None)
}

/// Owner, then mode (chown clears setuid), then xattrs (chown clears `security.capability`).
fn apply_meta(fd: BorrowedFd<'_>, meta: &Meta, shown: &str) -> Result<(), Errno> {
    fchown(fd.as_raw_fd(), Some(meta.uid), Some(meta.gid))?;
    fchmod(fd.as_raw_fd(), meta.mode)?;
    for (name, value) in &meta.xattrs {
        match set_xattr(fd, name, value) {
            // Like Docker: some filesystems refuse some namespaces; the layer is still usable.
            Err(err @ (Errno::ENOTSUP | Errno::EPERM)) => {
                tracing::debug!(entry = shown, xattr = ?name, %err, "xattr not applied");
            }
            result => result?,
        }
    }
    Ok(())
}

fn set_xattr(fd: BorrowedFd<'_>, name: &CStr, value: &[u8]) -> Result<(), Errno> {
    // SAFETY: fd is open, name is NUL-terminated and value is valid for value.len() bytes.
    let rc = unsafe { libc::fsetxattr(fd.as_raw_fd(), name.as_ptr(), value.as_ptr().cast(), value.len(), 0) };
    Errno::result(rc).map(drop)
}

/// Ownership and time of a node that must not be opened (symlink, device, FIFO).
fn apply_meta_at(at: Target<'_>, meta: &Meta, chmod: bool) -> Result<(), Errno> {
    fchownat(
        at.dirfd(),
        at.name,
        Some(meta.uid),
        Some(meta.gid),
        AtFlags::AT_SYMLINK_NOFOLLOW,
    )?;
    if chmod {
        fchmodat(at.dirfd(), at.name, meta.mode, FchmodatFlags::NoFollowSymlink)?;
    }
    utimensat(
        at.dirfd(),
        at.name,
        &meta.mtime,
        &meta.mtime,
        UtimensatFlags::NoFollowSymlink,
    )
}

fn make_dir(at: Target<'_>, existing: Option<&FileStat>, meta: &Meta, shown: &str) -> Result<(), Errno> {
    match existing {
        Some(stat) if is_dir(stat) => {}
        _ => {
            if let Some(stat) = existing {
                remove(at, stat)?;
            }
            mkdirat(at.dirfd(), at.name, Mode::from_bits_truncate(0o700))?;
        }
    }
    let dir = open_dir(at.dir, at.name)?;
    apply_meta(dir.as_fd(), meta, shown)
}

/// Creates a regular file and streams the entry's data into it; returns the bytes written.
fn write_file<R: Read>(
    at: Target<'_>,
    entry: &mut tar::Entry<'_, R>,
    meta: &Meta,
    buffer: &mut [u8],
    shown: &str,
) -> Result<u64, UnpackError> {
    // O_EXCL: never open something that appeared in the meantime, least of all through a symlink.
    let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let fd = openat(at.dirfd(), at.name, flags, Mode::from_bits_truncate(0o600)).map_err(|err| io_error(shown, err))?;
    let mut file = File::from(owned(fd));
    let written = copy_data(entry, &mut file, buffer, shown)?;
    // After the data: writing would clear setuid bits and `security.capability`.
    apply_meta(file.as_fd(), meta, shown).map_err(|err| io_error(shown, err))?;
    futimens(file.as_raw_fd(), &meta.mtime, &meta.mtime).map_err(|err| io_error(shown, err))?;
    Ok(written)
}

fn copy_data<R: Read>(
    entry: &mut tar::Entry<'_, R>,
    file: &mut File,
    buffer: &mut [u8],
    shown: &str,
) -> Result<u64, UnpackError> {
    let expected = entry.size();
    let mut written = 0u64;
    loop {
        let read = match entry.read(buffer) {
            Ok(0) => break,
            Ok(read) => read,
            Err(err) if err.kind() == io::ErrorKind::Interrupted => continue,
            Err(err) => return Err(UnpackError::Tar(err)),
        };
        file.write_all(&buffer[..read]).map_err(|err| io_error(shown, err))?;
        written += read as u64;
    }
    if written != expected {
        let message = format!("archive ends inside {shown:?} ({written} of {expected} bytes)");
        return Err(UnpackError::Tar(io::Error::new(io::ErrorKind::UnexpectedEof, message)));
    }
    Ok(written)
}

fn make_symlink(at: Target<'_>, link_target: &CStr, meta: &Meta) -> Result<(), Errno> {
    symlinkat(link_target, at.dirfd(), at.name)?;
    apply_meta_at(at, meta, false)
}

fn make_node(at: Target<'_>, kind: SFlag, device: libc::dev_t, meta: &Meta) -> Result<(), Errno> {
    mknodat(at.dirfd(), at.name, kind, Mode::empty(), device)?;
    apply_meta_at(at, meta, true)
}

/// Links the file behind `source` (an O_PATH fd, possibly of a symlink) at `at`.
fn link_fd(source: BorrowedFd<'_>, at: Target<'_>) -> Result<(), Errno> {
    let flags = AtFlags::AT_EMPTY_PATH;
    match linkat(Some(source.as_raw_fd()), c"", at.dirfd(), at.name, flags) {
        // Without CAP_DAC_READ_SEARCH the kernel refuses AT_EMPTY_PATH with ENOENT.
        Err(Errno::ENOENT) => link_via_proc(source, at),
        other => other,
    }
}

/// Links through the procfs magic link of `source`, which names the very inode the fd holds (a
/// symlink itself, not what it points to).
fn link_via_proc(source: BorrowedFd<'_>, at: Target<'_>) -> Result<(), Errno> {
    let magic_link = c_string(format!("/proc/self/fd/{}", source.as_raw_fd()).as_bytes());
    let flags = AtFlags::AT_SYMLINK_FOLLOW;
    linkat(None, magic_link.as_c_str(), at.dirfd(), at.name, flags)
}

struct Unpacker {
    dest: OwnedFd,
    parents: ParentCache,
    /// Directory mtimes, applied last because creating children changes them.
    dir_times: HashMap<Vec<u8>, TimeSpec>,
    buffer: Vec<u8>,
    stats: UnpackStats,
}

impl Unpacker {
    fn open(dest: &Path) -> Result<Unpacker, UnpackError> {
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
        let dest_fd = open(dest, flags, Mode::empty()).map_err(|err| io_error(&dest.display().to_string(), err))?;
        Ok(Unpacker {
            dest: owned(dest_fd),
            parents: ParentCache::default(),
            dir_times: HashMap::new(),
            buffer: vec![0; COPY_BUFFER_SIZE],
            stats: UnpackStats::default(),
        })
    }

    fn unpack_entry<R: Read>(&mut self, entry: &mut tar::Entry<'_, R>) -> Result<(), UnpackError> {
        self.stats.entries += 1;
        let raw_path = entry.path_bytes().into_owned();
        let shown = String::from_utf8_lossy(&raw_path).into_owned();
        let Some(kind) = Kind::of(entry.header(), &raw_path) else {
            let kind = entry.header().entry_type();
            tracing::debug!(entry = shown, ?kind, "skipping unsupported layer entry type");
            return Ok(());
        };
        let parts = clean_path(&raw_path).map_err(|reason| hostile(&shown, reason))?;
        if is_aufs_metadata(&parts) {
            tracing::debug!(entry = shown, "skipping aufs metadata");
            return Ok(());
        }
        let Some((&name, parent)) = parts.split_last() else {
            return self.unpack_root(entry, kind, &shown);
        };
        if let Some(hidden) = name.strip_prefix(WHITEOUT_PREFIX) {
            return self.whiteout(parent, hidden, &shown);
        }
        // Read before creating anything, so a bad link target leaves no trace.
        let link_target = match kind {
            Kind::Symlink | Kind::HardLink => Some(link_target(entry, &shown)?),
            _ => None,
        };
        let meta = Meta::read(entry, &shown)?;
        let name = c_string(name);
        let dest = self.dest.as_fd();
        let dir = self
            .parents
            .open(dest, parent)
            .map_err(|err| resolve_error(&shown, err))?;
        let at = Target { dir, name: &name };
        let existing = lstat(at).map_err(|err| io_error(&shown, err))?;
        let existing = existing.as_ref();
        let io = |err: Errno| io_error(&shown, err);
        match kind {
            Kind::Dir => {
                make_dir(at, existing, &meta, &shown).map_err(io)?;
                self.dir_times.insert(join(&parts), meta.mtime);
            }
            Kind::HardLink => {
                let source = link_target.unwrap_or_default();
                hard_link(dest, at, existing, &source, &shown)?;
            }
            _ => {
                if let Some(stat) = existing {
                    remove(at, stat).map_err(io)?;
                }
                match kind {
                    Kind::File => {
                        let written = write_file(at, entry, &meta, &mut self.buffer, &shown)?;
                        self.stats.bytes += written;
                    }
                    Kind::Symlink => {
                        let target = c_string(&link_target.unwrap_or_default());
                        make_symlink(at, &target, &meta).map_err(io)?;
                    }
                    Kind::Node(node) => {
                        if !meta.xattrs.is_empty() {
                            tracing::debug!(entry = shown, "dropping xattrs of a device or FIFO");
                        }
                        let device = device_number(entry.header(), node)?;
                        make_node(at, node, device, &meta).map_err(io)?;
                    }
                    Kind::Dir | Kind::HardLink => {}
                }
            }
        }
        let kept_dir = kind == Kind::Dir && existing.is_some_and(is_dir);
        if existing.is_some() && !kept_dir {
            self.parents.forget();
        }
        Ok(())
    }

    /// `./` describes the layer root: only a directory may, and it gets the entry's metadata.
    fn unpack_root<R: Read>(
        &mut self,
        entry: &mut tar::Entry<'_, R>,
        kind: Kind,
        shown: &str,
    ) -> Result<(), UnpackError> {
        if kind != Kind::Dir {
            return Err(hostile(shown, "only a directory may name the layer root"));
        }
        let meta = Meta::read(entry, shown)?;
        let root = open_dir(self.dest.as_fd(), c".").map_err(|err| io_error(shown, err))?;
        apply_meta(root.as_fd(), &meta, shown).map_err(|err| io_error(shown, err))?;
        self.dir_times.insert(Vec::new(), meta.mtime);
        Ok(())
    }

    /// `.wh.NAME` hides NAME of lower layers: a 0:0 char device in overlay terms.
    /// `.wh..wh..opq` hides all of the lower directory: the opaque xattr.
    fn whiteout(&mut self, parent: &[&[u8]], hidden: &[u8], shown: &str) -> Result<(), UnpackError> {
        if hidden == OPAQUE_SUFFIX {
            return self.make_opaque(parent, shown);
        }
        if matches!(hidden, b"" | b"." | b"..") {
            return Err(hostile(shown, "whiteout of an empty, `.` or `..` name"));
        }
        let name = c_string(hidden);
        let dest = self.dest.as_fd();
        let dir = self
            .parents
            .open(dest, parent)
            .map_err(|err| resolve_error(shown, err))?;
        let at = Target { dir, name: &name };
        let io = |err: Errno| io_error(shown, err);
        // Something of this same layer may stand there: the whiteout replaces it.
        let existing = lstat(at).map_err(io)?;
        if let Some(stat) = &existing {
            remove(at, stat).map_err(io)?;
        }
        mknodat(at.dirfd(), at.name, SFlag::S_IFCHR, Mode::empty(), makedev(0, 0)).map_err(io)?;
        if existing.is_some() {
            self.parents.forget();
        }
        Ok(())
    }

    fn make_opaque(&mut self, parent: &[&[u8]], shown: &str) -> Result<(), UnpackError> {
        let dest = self.dest.as_fd();
        let dir = self
            .parents
            .open(dest, parent)
            .map_err(|err| resolve_error(shown, err))?;
        // The cached fd is O_PATH, which fsetxattr refuses: open the same directory for real.
        let readable = open_dir(dir, c".").map_err(|err| io_error(shown, err))?;
        set_xattr(readable.as_fd(), OPAQUE_XATTR, b"y").map_err(|err| io_error(shown, err))
    }

    /// Sets directory mtimes deepest first, re-resolving each beneath the destination.
    fn apply_dir_times(&self) -> Result<(), UnpackError> {
        let mut dirs: Vec<_> = self.dir_times.iter().collect();
        dirs.sort_by_key(|(path, _)| Reverse(depth(path)));
        let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW;
        for (path, mtime) in dirs {
            let shown = || String::from_utf8_lossy(path).into_owned();
            let dir = match open_beneath(self.dest.as_fd(), path, flags) {
                Ok(dir) => dir,
                // Replaced or whited out by a later entry: the time no longer belongs to it.
                Err(Errno::ENOENT | Errno::ENOTDIR | Errno::ELOOP | Errno::EXDEV) => continue,
                Err(err) => return Err(io_error(&shown(), err)),
            };
            futimens(dir.as_raw_fd(), mtime, mtime).map_err(|err| io_error(&shown(), err))?;
        }
        Ok(())
    }
}

/// Number of components of a cleaned path; the destination itself has none.
fn depth(path: &[u8]) -> usize {
    match path {
        b"" => 0,
        _ => path.iter().filter(|&&byte| byte == b'/').count() + 1,
    }
}

fn link_target<R: Read>(entry: &tar::Entry<'_, R>, shown: &str) -> Result<Vec<u8>, UnpackError> {
    let target = entry
        .link_name_bytes()
        .map(|target| target.into_owned())
        .unwrap_or_default();
    if target.is_empty() {
        return Err(hostile(shown, "link without a target"));
    }
    if target.contains(&0) {
        return Err(hostile(shown, "NUL byte in link target"));
    }
    Ok(target)
}

fn device_number(header: &tar::Header, kind: SFlag) -> Result<libc::dev_t, UnpackError> {
    if kind == SFlag::S_IFIFO {
        return Ok(0);
    }
    let major = header.device_major().map_err(UnpackError::Tar)?.unwrap_or(0);
    let minor = header.device_minor().map_err(UnpackError::Tar)?.unwrap_or(0);
    Ok(makedev(major.into(), minor.into()))
}

/// Adds a name for an inode this layer already created. The source path is validated like an
/// entry path and resolved beneath `dest` without following a final symlink, so the new name
/// can share the symlink's inode but never the inode of what it points to.
fn hard_link(
    dest: BorrowedFd<'_>,
    at: Target<'_>,
    existing: Option<&FileStat>,
    source_path: &[u8],
    shown: &str,
) -> Result<(), UnpackError> {
    let parts = clean_path(source_path).map_err(|reason| hostile(shown, format!("hard link target: {reason}")))?;
    let source = open_beneath(dest, &join(&parts), OFlag::O_PATH | OFlag::O_NOFOLLOW).map_err(|err| match err {
        Errno::ENOENT => hostile(shown, "hard link target does not exist in this layer"),
        _ => resolve_error(shown, err),
    })?;
    let io = |err: Errno| io_error(shown, err);
    let source_stat = fstat(source.as_raw_fd()).map_err(io)?;
    if is_dir(&source_stat) {
        return Err(hostile(shown, "hard link to a directory"));
    }
    if let Some(stat) = existing {
        if (stat.st_dev, stat.st_ino) == (source_stat.st_dev, source_stat.st_ino) {
            return Ok(());
        }
        remove(at, stat).map_err(io)?;
    }
    link_fd(source.as_fd(), at).map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;
    use std::fs;
    use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
    use std::path::PathBuf;
    use tar::{EntryType, Header};

    const MTIME: u64 = 1_600_000_000;
    const DOTDOT: &str = "`..` component";
    const OUTSIDE: &str = "outside the destination";
    const SENTINEL: &[u8] = b"do not touch";

    /// A layer archive built entry by entry, with raw names so hostile paths go in unchanged.
    struct Layer {
        builder: tar::Builder<Vec<u8>>,
    }

    struct Spec<'a> {
        kind: EntryType,
        mode: u32,
        link: &'a [u8],
        data: &'a [u8],
        owner: (u64, u64),
        device: (u32, u32),
    }

    impl Default for Spec<'_> {
        fn default() -> Self {
            Spec {
                kind: EntryType::Regular,
                mode: 0o644,
                link: b"",
                data: b"",
                owner: (0, 0),
                device: (0, 0),
            }
        }
    }

    impl Layer {
        fn new() -> Layer {
            Layer {
                builder: tar::Builder::new(Vec::new()),
            }
        }

        fn entry(&mut self, name: &[u8], spec: Spec<'_>) -> &mut Layer {
            let mut header = Header::new_gnu();
            header.as_old_mut().name[..name.len()].copy_from_slice(name);
            header.as_old_mut().linkname[..spec.link.len()].copy_from_slice(spec.link);
            header.set_entry_type(spec.kind);
            header.set_mode(spec.mode);
            header.set_uid(spec.owner.0);
            header.set_gid(spec.owner.1);
            header.set_mtime(MTIME);
            header.set_size(spec.data.len() as u64);
            header.set_device_major(spec.device.0).unwrap();
            header.set_device_minor(spec.device.1).unwrap();
            header.set_cksum();
            self.builder.append(&header, spec.data).unwrap();
            self
        }

        fn dir(&mut self, name: &str, mode: u32) -> &mut Layer {
            self.entry(
                name.as_bytes(),
                Spec {
                    kind: EntryType::Directory,
                    mode,
                    ..Spec::default()
                },
            )
        }

        fn file(&mut self, name: &str, mode: u32, data: &[u8]) -> &mut Layer {
            self.entry(
                name.as_bytes(),
                Spec {
                    mode,
                    data,
                    ..Spec::default()
                },
            )
        }

        fn symlink(&mut self, name: &str, target: &str) -> &mut Layer {
            let spec = Spec {
                kind: EntryType::Symlink,
                link: target.as_bytes(),
                ..Spec::default()
            };
            self.entry(name.as_bytes(), spec)
        }

        fn hardlink(&mut self, name: &str, target: &str) -> &mut Layer {
            let spec = Spec {
                kind: EntryType::Link,
                link: target.as_bytes(),
                ..Spec::default()
            };
            self.entry(name.as_bytes(), spec)
        }

        /// A PAX extended header describing the next entry.
        fn pax(&mut self, records: &[(&str, &[u8])]) -> &mut Layer {
            let mut data = Vec::new();
            for (key, value) in records {
                let body_len = key.len() + value.len() + 3; // ' ', '=', '\n'
                let mut total = body_len + 1;
                while total != body_len + total.to_string().len() {
                    total = body_len + total.to_string().len();
                }
                data.extend_from_slice(format!("{total} {key}=").as_bytes());
                data.extend_from_slice(value);
                data.push(b'\n');
            }
            let spec = Spec {
                kind: EntryType::XHeader,
                data: &data,
                ..Spec::default()
            };
            self.entry(b"././@PaxHeader", spec)
        }

        fn bytes(&mut self) -> Vec<u8> {
            let builder = std::mem::replace(&mut self.builder, tar::Builder::new(Vec::new()));
            builder.into_inner().unwrap()
        }
    }

    /// `dest` inside a private `outer` dir next to a sentinel file, to prove nothing escaped.
    struct Fixture {
        outer: tempfile::TempDir,
        dest: PathBuf,
        sentinel: PathBuf,
    }

    impl Fixture {
        fn new() -> Fixture {
            let outer = tempfile::tempdir().unwrap();
            let dest = outer.path().join("dest");
            fs::create_dir(&dest).unwrap();
            let sentinel = outer.path().join("sentinel");
            fs::write(&sentinel, SENTINEL).unwrap();
            fs::set_permissions(&sentinel, fs::Permissions::from_mode(0o600)).unwrap();
            Fixture { outer, dest, sentinel }
        }

        fn unpack(&self, layer: &mut Layer) -> Result<UnpackStats, UnpackError> {
            unpack_layer(&layer.bytes()[..], &self.dest)
        }

        fn path(&self, relative: &str) -> PathBuf {
            self.dest.join(relative)
        }

        fn assert_contained(&self) {
            let names: BTreeSet<_> = fs::read_dir(self.outer.path())
                .unwrap()
                .map(|entry| entry.unwrap().file_name().into_string().unwrap())
                .collect();
            assert_eq!(names, BTreeSet::from(["dest".to_owned(), "sentinel".to_owned()]));
            let meta = fs::symlink_metadata(&self.sentinel).unwrap();
            assert!(meta.is_file());
            assert_eq!(meta.nlink(), 1, "sentinel gained a hard link");
            assert_eq!((meta.uid(), meta.gid(), meta.mode() & 0o7777), (0, 0, 0o600));
            assert_eq!(fs::read(&self.sentinel).unwrap(), SENTINEL);
            assert!(self.outer_xattrs_unchanged());
        }

        fn outer_xattrs_unchanged(&self) -> bool {
            xattr(&self.sentinel, "user.foo").is_none() && xattr(self.outer.path(), "trusted.overlay.opaque").is_none()
        }
    }

    fn xattr(path: &Path, name: &str) -> Option<Vec<u8>> {
        let path = CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        let name = CString::new(name).unwrap();
        let mut value = vec![0u8; 256];
        // SAFETY: valid C strings and a buffer of the given length.
        let len = unsafe { libc::lgetxattr(path.as_ptr(), name.as_ptr(), value.as_mut_ptr().cast(), value.len()) };
        let len = usize::try_from(len).ok()?;
        value.truncate(len);
        Some(value)
    }

    fn assert_hostile(result: Result<UnpackStats, UnpackError>, entry: &str, why: &str) {
        match result {
            Err(UnpackError::Hostile { entry: found, reason }) => {
                assert_eq!(found, entry, "reason: {reason}");
                assert!(reason.contains(why), "{entry:?}: {reason:?} does not say {why:?}");
            }
            other => panic!("expected Hostile for {entry:?}, got {other:?}"),
        }
    }

    fn mode(path: &Path) -> u32 {
        fs::symlink_metadata(path).unwrap().mode() & 0o7777
    }

    #[test]
    fn unpacks_a_normal_tree_with_metadata() {
        let fx = Fixture::new();
        let mut layer = Layer::new();
        layer
            .dir("./", 0o755)
            .dir("./etc/", 0o755)
            .pax(&[
                ("SCHILY.xattr.user.foo", b"bar"),
                ("SCHILY.xattr.trusted.overlay.opaque", b"y"),
            ])
            .file("./etc/passwd", 0o644, b"root:x:0:0\n")
            .dir("usr/bin/", 0o755)
            .file("usr/bin/tool", 0o755, b"#!/bin/sh\n")
            .file("usr/bin/su", 0o4755, b"suid")
            .symlink("usr/bin/sh", "/bin/busybox")
            .hardlink("usr/bin/tool2", "usr/bin/tool")
            .entry(
                b"run/fifo",
                Spec {
                    kind: EntryType::Fifo,
                    mode: 0o600,
                    ..Spec::default()
                },
            )
            .entry(
                b"dev/null",
                Spec {
                    kind: EntryType::Char,
                    mode: 0o666,
                    device: (1, 3),
                    ..Spec::default()
                },
            )
            .entry(
                b"home/user/",
                Spec {
                    kind: EntryType::Directory,
                    mode: 0o700,
                    owner: (1000, 1000),
                    ..Spec::default()
                },
            )
            .entry(
                b"home/user/notes",
                Spec {
                    mode: 0o640,
                    owner: (1000, 1000),
                    data: b"hi",
                    ..Spec::default()
                },
            );
        let stats = fx.unpack(&mut layer).unwrap();
        assert_eq!(
            stats,
            UnpackStats {
                entries: 12,
                bytes: 11 + 10 + 4 + 2
            }
        );

        assert_eq!(fs::read(fx.path("etc/passwd")).unwrap(), b"root:x:0:0\n");
        assert_eq!(mode(&fx.path("etc/passwd")), 0o644);
        assert_eq!(mode(&fx.path("usr/bin/tool")), 0o755);
        assert_eq!(mode(&fx.path("usr/bin/su")), 0o4755);
        assert_eq!(fs::read_link(fx.path("usr/bin/sh")).unwrap(), Path::new("/bin/busybox"));
        let tool = fs::metadata(fx.path("usr/bin/tool")).unwrap();
        let tool2 = fs::metadata(fx.path("usr/bin/tool2")).unwrap();
        assert_eq!((tool.ino(), tool.nlink()), (tool2.ino(), 2));
        assert!(fs::symlink_metadata(fx.path("run/fifo")).unwrap().file_type().is_fifo());
        assert_eq!(mode(&fx.path("run/fifo")), 0o600);
        // Implied directories get 0755.
        assert_eq!(mode(&fx.path("run")), 0o755);
        let null = fs::symlink_metadata(fx.path("dev/null")).unwrap();
        assert!(null.file_type().is_char_device());
        assert_eq!((null.rdev(), null.mode() & 0o7777), (makedev(1, 3), 0o666));
        for path in ["home/user", "home/user/notes"] {
            let meta = fs::symlink_metadata(fx.path(path)).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (1000, 1000), "{path}");
        }
        for path in ["etc/passwd", "etc", "usr/bin", "usr/bin/sh", "home/user", ""] {
            let meta = fs::symlink_metadata(fx.path(path)).unwrap();
            assert_eq!(meta.mtime(), MTIME as i64, "mtime of {path:?}");
        }
        assert_eq!(xattr(&fx.path("etc/passwd"), "user.foo").unwrap(), b"bar");
        assert_eq!(xattr(&fx.path("etc/passwd"), "trusted.overlay.opaque"), None);
        fx.assert_contained();
    }

    #[test]
    fn pax_mtime_and_long_names_are_honoured() {
        let fx = Fixture::new();
        let long = format!("{}/file", "d".repeat(150));
        let mut layer = Layer::new();
        layer
            .pax(&[("path", long.as_bytes()), ("mtime", b"1700000000.5")])
            .file("short", 0o644, b"x");
        fx.unpack(&mut layer).unwrap();
        let meta = fs::metadata(fx.path(&long)).unwrap();
        assert_eq!((meta.mtime(), meta.mtime_nsec()), (1_700_000_000, 500_000_000));
        assert!(!fx.path("short").exists());
        fx.assert_contained();
    }

    #[test]
    fn parses_pax_times() {
        assert_eq!(parse_pax_time(b"12"), Some(TimeSpec::new(12, 0)));
        assert_eq!(parse_pax_time(b"12.25"), Some(TimeSpec::new(12, 250_000_000)));
        assert_eq!(parse_pax_time(b"-1.5"), Some(TimeSpec::new(-2, 500_000_000)));
        assert_eq!(parse_pax_time(b"1.1234567891"), Some(TimeSpec::new(1, 123_456_789)));
        for bad in [&b""[..], b".5", b"1e3", b"1.-2", b"99999999999999999999"] {
            assert_eq!(parse_pax_time(bad), None);
        }
    }

    #[test]
    fn rejects_climbing_and_absolute_paths() {
        for (name, why) in [
            ("../evil", DOTDOT),
            ("/abs", "absolute"),
            ("a/../../evil", DOTDOT),
            ("./../evil", DOTDOT),
            ("a/..", DOTDOT),
        ] {
            let fx = Fixture::new();
            let mut layer = Layer::new();
            layer.file(name, 0o644, b"evil");
            assert_hostile(fx.unpack(&mut layer), name, why);
            fx.assert_contained();
        }
    }

    #[test]
    fn rejects_empty_names() {
        let fx = Fixture::new();
        let mut layer = Layer::new();
        layer.file("", 0o644, b"");
        assert_hostile(fx.unpack(&mut layer), "", "empty path");
        fx.assert_contained();
    }

    /// Symlink targets that leave the destination, absolute or climbing.
    const ESCAPES: [fn(&Fixture) -> String; 5] = [
        |_| "/".to_owned(),
        |_| "..".to_owned(),
        |_| "../..".to_owned(),
        |fx| fx.outer.path().display().to_string(),
        |fx| fx.sentinel.display().to_string(),
    ];

    #[test]
    fn rejects_writing_through_a_symlink_that_leads_outside() {
        for escape in &ESCAPES[..4] {
            let fx = Fixture::new();
            let mut layer = Layer::new();
            layer.symlink("s", &escape(&fx)).file("s/evil", 0o644, b"evil");
            assert_hostile(fx.unpack(&mut layer), "s/evil", OUTSIDE);
            fx.assert_contained();
            assert!(!Path::new("/evil").exists());
        }
    }

    #[test]
    fn rejects_directories_implied_through_an_escaping_symlink() {
        let fx = Fixture::new();
        let mut layer = Layer::new();
        layer.symlink("s", "..").dir("s/newdir/", 0o755);
        assert_hostile(fx.unpack(&mut layer), "s/newdir/", OUTSIDE);
        fx.assert_contained();
    }

    #[test]
    fn follows_symlinks_that_stay_inside() {
        let fx = Fixture::new();
        let mut layer = Layer::new();
        layer
            .dir("real/", 0o755)
            .symlink("alias", "real")
            .file("alias/f", 0o644, b"in");
        fx.unpack(&mut layer).unwrap();
        assert_eq!(fs::read(fx.path("real/f")).unwrap(), b"in");
        fx.assert_contained();
    }

    #[test]
    fn rejects_hard_links_to_outside_or_missing_targets() {
        for (target, why) in [
            ("../sentinel", DOTDOT),
            ("/etc/passwd", "absolute"),
            ("nope", "does not exist"),
        ] {
            let fx = Fixture::new();
            let mut layer = Layer::new();
            layer.hardlink("h", target);
            assert_hostile(fx.unpack(&mut layer), "h", why);
            assert!(fs::symlink_metadata(fx.path("h")).is_err());
            fx.assert_contained();
        }
    }

    #[test]
    fn rejects_hard_links_through_an_escaping_symlink() {
        let fx = Fixture::new();
        let mut layer = Layer::new();
        layer.symlink("up", "..").hardlink("h", "up/sentinel");
        assert_hostile(fx.unpack(&mut layer), "h", OUTSIDE);
        fx.assert_contained();
    }

    #[test]
    fn hard_link_to_an_escaping_symlink_links_the_symlink_itself() {
        let fx = Fixture::new();
        let absolute = fx.sentinel.display().to_string();
        let mut layer = Layer::new();
        layer
            .symlink("rel", "../sentinel")
            .symlink("abs", &absolute)
            .hardlink("h1", "rel")
            .hardlink("h2", "abs");
        fx.unpack(&mut layer).unwrap();
        for (link, symlink) in [("h1", "rel"), ("h2", "abs")] {
            let link = fs::symlink_metadata(fx.path(link)).unwrap();
            let symlink = fs::symlink_metadata(fx.path(symlink)).unwrap();
            assert!(link.file_type().is_symlink());
            assert_eq!(link.ino(), symlink.ino());
        }
        fx.assert_contained();
    }

    #[test]
    fn procfs_link_fallback_links_a_symlink_not_its_target() {
        let fx = Fixture::new();
        std::os::unix::fs::symlink(&fx.sentinel, fx.path("s")).unwrap();
        let dest = open(&fx.dest, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).unwrap();
        let dest = owned(dest);
        let source = open_beneath(dest.as_fd(), b"s", OFlag::O_PATH | OFlag::O_NOFOLLOW).unwrap();
        let at = Target {
            dir: dest.as_fd(),
            name: c"h",
        };
        link_via_proc(source.as_fd(), at).unwrap();
        let link = fs::symlink_metadata(fx.path("h")).unwrap();
        assert!(link.file_type().is_symlink());
        assert_eq!(link.ino(), fs::symlink_metadata(fx.path("s")).unwrap().ino());
        fx.assert_contained();
    }

    #[test]
    fn rejects_hard_links_to_directories() {
        let fx = Fixture::new();
        let mut layer = Layer::new();
        layer.dir("d/", 0o755).hardlink("h", "d");
        assert_hostile(fx.unpack(&mut layer), "h", "directory");
        fx.assert_contained();
    }

    #[test]
    fn rejects_whiteouts_of_dot_names() {
        for name in [".wh..", ".wh...", "a/.wh..", "a/.wh...", ".wh."] {
            let fx = Fixture::new();
            let mut layer = Layer::new();
            layer.dir("a/", 0o755).file(name, 0o644, b"");
            assert_hostile(fx.unpack(&mut layer), name, "whiteout");
            fx.assert_contained();
        }
    }

    #[test]
    fn whiteout_becomes_a_char_device_and_replaces_this_layers_file() {
        let fx = Fixture::new();
        let mut layer = Layer::new();
        layer
            .dir("a/", 0o755)
            .file("a/mine", 0o644, b"short-lived")
            .dir("a/tree/", 0o755)
            .file("a/tree/f", 0o644, b"")
            .file("a/.wh.gone", 0o644, b"")
            .file("a/.wh.mine", 0o644, b"")
            .file("a/.wh.tree", 0o644, b"");
        fx.unpack(&mut layer).unwrap();
        for name in ["a/gone", "a/mine", "a/tree"] {
            let meta = fs::symlink_metadata(fx.path(name)).unwrap();
            assert!(meta.file_type().is_char_device(), "{name}");
            assert_eq!(meta.rdev(), 0, "{name}");
        }
        assert!(!fx.path("a/.wh.gone").exists());
        assert_eq!(fs::symlink_metadata(fx.path("a")).unwrap().mtime(), MTIME as i64);
        fx.assert_contained();
    }

    #[test]
    fn opaque_marker_sets_the_overlay_xattr() {
        let fx = Fixture::new();
        let mut layer = Layer::new();
        layer
            .dir("d/", 0o755)
            .file("d/.wh..wh..opq", 0o644, b"")
            .file("d/kept", 0o644, b"k")
            .file("implied/.wh..wh..opq", 0o644, b"");
        fx.unpack(&mut layer).unwrap();
        for dir in ["d", "implied"] {
            assert_eq!(xattr(&fx.path(dir), "trusted.overlay.opaque").unwrap(), b"y");
        }
        assert!(!fx.path("d/.wh..wh..opq").exists());
        assert_eq!(fs::read(fx.path("d/kept")).unwrap(), b"k");
        fx.assert_contained();
    }

    #[test]
    fn skips_aufs_metadata() {
        let fx = Fixture::new();
        let mut layer = Layer::new();
        layer
            .dir(".wh..wh.plnk/", 0o700)
            .file(".wh..wh.plnk/1.2", 0o644, b"x")
            .file("f", 0o644, b"");
        fx.unpack(&mut layer).unwrap();
        let names: Vec<_> = fs::read_dir(&fx.dest)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["f"]);
    }

    #[test]
    fn file_replacing_a_symlink_does_not_write_through_it() {
        for escape in ESCAPES {
            let fx = Fixture::new();
            let mut layer = Layer::new();
            layer.symlink("f", &escape(&fx)).file("f", 0o644, b"replaced");
            fx.unpack(&mut layer).unwrap();
            assert!(fs::symlink_metadata(fx.path("f")).unwrap().is_file());
            assert_eq!(fs::read(fx.path("f")).unwrap(), b"replaced");
            fx.assert_contained();
        }
    }

    #[test]
    fn other_nodes_replacing_a_symlink_do_not_touch_its_target() {
        let fx = Fixture::new();
        let mut layer = Layer::new();
        layer
            .symlink("d", "../sentinel")
            .dir("d/", 0o777)
            .symlink("n", "../sentinel")
            .entry(
                b"n",
                Spec {
                    kind: EntryType::Fifo,
                    mode: 0o777,
                    ..Spec::default()
                },
            )
            .symlink("w", "../sentinel")
            .file(".wh.w", 0o644, b"");
        fx.unpack(&mut layer).unwrap();
        assert!(fs::symlink_metadata(fx.path("d")).unwrap().is_dir());
        assert!(fs::symlink_metadata(fx.path("n")).unwrap().file_type().is_fifo());
        assert!(fs::symlink_metadata(fx.path("w")).unwrap().file_type().is_char_device());
        fx.assert_contained();
    }

    #[test]
    fn directory_replaces_a_file_and_a_file_replaces_a_tree() {
        let fx = Fixture::new();
        let mut layer = Layer::new();
        layer
            .file("d", 0o644, b"was a file")
            .dir("d/", 0o750)
            .file("d/x", 0o644, b"x")
            .dir("t/", 0o755)
            .dir("t/a/b/", 0o755)
            .file("t/a/b/f", 0o644, b"")
            .symlink("t/a/link", "/")
            .file("t/g", 0o644, b"")
            .file("t", 0o600, b"now a file")
            .dir("t2/sub/", 0o755)
            .file("t2/sub/f", 0o644, b"");
        fx.unpack(&mut layer).unwrap();
        assert!(fs::symlink_metadata(fx.path("d")).unwrap().is_dir());
        assert_eq!(mode(&fx.path("d")), 0o750);
        assert_eq!(fs::read(fx.path("d/x")).unwrap(), b"x");
        assert_eq!(fs::read(fx.path("t")).unwrap(), b"now a file");
        assert!(fx.path("t2/sub/f").exists());
        fx.assert_contained();
    }

    #[test]
    fn existing_directory_is_kept_and_updated() {
        let fx = Fixture::new();
        let mut layer = Layer::new();
        layer.dir("d/", 0o755).file("d/f", 0o644, b"f").dir("d/", 0o1777);
        fx.unpack(&mut layer).unwrap();
        assert_eq!(mode(&fx.path("d")), 0o1777);
        assert!(fx.path("d/f").exists());
    }

    #[test]
    fn removes_deep_trees_without_recursion() {
        let fx = Fixture::new();
        let deep: String = "d/".repeat(1000);
        let mut layer = Layer::new();
        layer
            .pax(&[("path", format!("{deep}f").as_bytes())])
            .file("ignored", 0o644, b"deep");
        layer.file("d", 0o644, b"flat");
        fx.unpack(&mut layer).unwrap();
        assert_eq!(fs::read(fx.path("d")).unwrap(), b"flat");
        fx.assert_contained();
    }

    #[test]
    fn rejects_a_non_directory_root() {
        let fx = Fixture::new();
        let mut layer = Layer::new();
        layer.symlink("./", "/");
        assert_hostile(fx.unpack(&mut layer), "./", "root");
        fx.assert_contained();
    }

    #[test]
    fn truncated_archives_are_tar_errors() {
        let mut layer = Layer::new();
        layer.file("big", 0o644, &[7u8; 4000]);
        let bytes = layer.bytes();
        for cut in [512 + 100, 300] {
            let fx = Fixture::new();
            let result = unpack_layer(&bytes[..cut], &fx.dest);
            assert!(matches!(result, Err(UnpackError::Tar(_))), "cut at {cut}: {result:?}");
            fx.assert_contained();
        }
    }

    #[test]
    fn corrupted_archives_never_escape_or_panic() {
        let mut layer = Layer::new();
        layer
            .dir("a/", 0o755)
            .symlink("a/up", "../..")
            .file("a/f", 0o644, b"data")
            .hardlink("a/h", "a/f")
            .file("a/.wh.x", 0o644, b"");
        let original = layer.bytes();
        // A small deterministic xorshift: no extra dependency, reproducible failures.
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..200 {
            let mut bytes = original.clone();
            for _ in 0..4 {
                let at = (next() % bytes.len() as u64) as usize;
                bytes[at] = next() as u8;
            }
            let fx = Fixture::new();
            let _ = unpack_layer(&bytes[..], &fx.dest);
            fx.assert_contained();
        }
    }
}
