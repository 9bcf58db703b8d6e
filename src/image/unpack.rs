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
    // The data goes to the disk while the rest of the layer unpacks: the snapshot's syncfs at
    // commit then waits for little.
    scute_sys::files::start_writeback(&file);
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
mod tests;
