//! Reproducible layer tar, gzip- or zstd-compressed or plain, from a root
//! filesystem directory, optionally with OCI whiteout entries.
//!
//! The same tree always gives the same bytes: entries are written depth-first
//! with each directory's children sorted by name, every mtime is a fixed
//! value, user and group names are left out (only numeric ids are kept) and
//! the gzip header carries no name or timestamp. Files sharing an inode are
//! written once and then as tar hard links to the first path, which keeps
//! busybox's applets one binary, as in the upstream image.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ffi::OsString;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Component, Path, PathBuf};

use anyhow::{bail, Context, Result};
use flate2::write::GzEncoder;

use crate::digest::HashingWriter;
use crate::media::Compression;

/// mtime of every entry. Zero, like most reproducible-build tools.
pub const FIXED_MTIME: u64 = 0;

/// Name prefix that deletes the lower layers' file of the rest of the name.
const WHITEOUT_PREFIX: &str = ".wh.";
/// Entry that hides everything the lower layers have in its directory.
const OPAQUE_WHITEOUT: &str = ".wh..wh..opq";

/// Whiteout entries to add to a layer, by directory (relative to the root).
#[derive(Debug, Clone, Default)]
pub struct Whiteouts {
    by_dir: BTreeMap<PathBuf, BTreeSet<OsString>>,
}

impl Whiteouts {
    /// Deletes `path` (as seen in the image, e.g. `/etc/motd`) of lower layers.
    pub fn remove(&mut self, path: &str) -> Result<()> {
        let rel = image_path(path)?;
        let (Some(dir), Some(name)) = (rel.parent(), rel.file_name()) else {
            bail!("--whiteout {path:?}: want the path of a file or directory, not /");
        };
        if name.to_string_lossy().starts_with(WHITEOUT_PREFIX) {
            bail!("--whiteout {path:?}: name the path to delete, without {WHITEOUT_PREFIX}");
        }
        let mut entry = OsString::from(WHITEOUT_PREFIX);
        entry.push(name);
        self.add(dir.to_path_buf(), entry);
        Ok(())
    }

    /// Hides everything lower layers have in directory `dir`.
    pub fn opaque(&mut self, dir: &str) -> Result<()> {
        let rel = image_path(dir)?;
        self.add(rel, OsString::from(OPAQUE_WHITEOUT));
        Ok(())
    }

    fn add(&mut self, dir: PathBuf, entry: OsString) {
        self.by_dir.entry(dir).or_default().insert(entry);
    }
}

/// `/a/./b/` -> `a/b`; refuses `..`, which could point outside the image.
fn image_path(path: &str) -> Result<PathBuf> {
    let mut rel = PathBuf::new();
    for component in Path::new(path).components() {
        match component {
            Component::Normal(part) => rel.push(part),
            Component::RootDir | Component::CurDir => {}
            Component::ParentDir | Component::Prefix(_) => {
                bail!("{path:?}: \"..\" is not allowed in an image path")
            }
        }
    }
    Ok(rel)
}

/// The compression stage of the layer writer chain.
enum Compressor<W: Write> {
    Gzip(GzEncoder<W>),
    Zstd(zstd::Encoder<'static, W>),
    None(W),
}

impl<W: Write> Compressor<W> {
    fn new(compression: Compression, out: W) -> Result<Self> {
        Ok(match compression {
            // No name and mtime 0 in the header: the bytes depend on content only.
            Compression::Gzip => Compressor::Gzip(
                flate2::GzBuilder::new()
                    .mtime(0)
                    .write(out, flate2::Compression::default()),
            ),
            // Single-threaded at a fixed level, zstd output is deterministic too.
            Compression::Zstd => Compressor::Zstd(
                zstd::Encoder::new(out, zstd::DEFAULT_COMPRESSION_LEVEL).context("starting zstd stream")?,
            ),
            Compression::None => Compressor::None(out),
        })
    }

    fn finish(self) -> Result<W> {
        match self {
            Compressor::Gzip(gzip) => gzip.finish().context("finishing gzip stream"),
            Compressor::Zstd(zstd) => zstd.finish().context("finishing zstd stream"),
            Compressor::None(out) => Ok(out),
        }
    }
}

impl<W: Write> Write for Compressor<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Compressor::Gzip(w) => w.write(buf),
            Compressor::Zstd(w) => w.write(buf),
            Compressor::None(w) => w.write(buf),
        }
    }

    fn flush(&mut self) -> io::Result<()> {
        match self {
            Compressor::Gzip(w) => w.flush(),
            Compressor::Zstd(w) => w.flush(),
            Compressor::None(w) => w.flush(),
        }
    }
}

/// Yields exactly `remaining` bytes, failing if the file got shorter since its
/// header was written: a short entry would corrupt every entry after it.
struct ExactReader<R> {
    inner: R,
    remaining: u64,
    path: PathBuf,
}

impl<R: Read> Read for ExactReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.remaining == 0 {
            return Ok(0);
        }
        let want = buf.len().min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
        let n = self.inner.read(&mut buf[..want])?;
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                format!("{} shrank while it was being archived", self.path.display()),
            ));
        }
        self.remaining -= n as u64;
        Ok(n)
    }
}

/// Writes the layer for `rootfs` plus `whiteouts` to `out`, compressed as
/// asked, and returns its diff ID (sha256 of the uncompressed tar). Each
/// whiteout's directory must be in `rootfs`, so that, as in layers docker
/// builds, the layer carries that directory's entry.
pub fn write_layer<W: Write>(rootfs: &Path, whiteouts: &Whiteouts, compression: Compression, out: W) -> Result<String> {
    let meta = fs::symlink_metadata(rootfs).with_context(|| format!("reading rootfs {}", rootfs.display()))?;
    if !meta.is_dir() {
        bail!("rootfs {} is not a directory", rootfs.display());
    }

    // Writer chain: tar -> hash(diff_id) -> compression -> out.
    let uncompressed = HashingWriter::new(Compressor::new(compression, out)?);
    let mut archive = tar::Builder::new(uncompressed);
    archive.mode(tar::HeaderMode::Complete);

    let mut state = WalkState {
        rootfs,
        first_path_of_inode: HashMap::new(),
        pending_whiteouts: whiteouts.by_dir.clone(),
    };
    append_children(&mut archive, &mut state, Path::new(""))?;
    if let Some(dir) = state.pending_whiteouts.keys().next() {
        bail!(
            "whiteout in /{}: not a directory in {}; create it there so the layer has its entry",
            dir.display(),
            rootfs.display()
        );
    }

    let uncompressed = archive.into_inner().context("finishing tar stream")?;
    let (compressor, diff_id, _) = uncompressed.finish();
    let mut out = compressor.finish()?;
    out.flush().context("flushing layer")?;
    Ok(diff_id)
}

struct WalkState<'a> {
    rootfs: &'a Path,
    /// (device, inode) -> archive path of its first entry, for hard links.
    first_path_of_inode: HashMap<(u64, u64), PathBuf>,
    /// Whiteouts of directories not reached yet; empty once the walk is done.
    pending_whiteouts: BTreeMap<PathBuf, BTreeSet<OsString>>,
}

/// Appends the entries under `rel` (relative to the rootfs), whiteouts
/// included, sorted by name.
fn append_children<W: Write>(archive: &mut tar::Builder<W>, state: &mut WalkState<'_>, rel: &Path) -> Result<()> {
    let dir = state.rootfs.join(rel);
    // (name, is a whiteout to add rather than a file to archive)
    let mut names: Vec<(OsString, bool)> = Vec::new();
    for entry in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        names.push((entry.file_name(), false));
    }
    let whiteouts = state.pending_whiteouts.remove(rel).unwrap_or_default();
    names.extend(whiteouts.into_iter().map(|name| (name, true)));
    // OsString orders by bytes on unix: locale-independent.
    names.sort();
    if let Some(pair) = names.windows(2).find(|pair| pair[0].0 == pair[1].0) {
        bail!(
            "{} already has {:?}; it cannot be a whiteout too",
            dir.display(),
            pair[0].0
        );
    }

    for (name, is_whiteout) in names {
        let rel_path = rel.join(&name);
        if is_whiteout {
            append_whiteout(archive, &rel_path)?;
        } else if append_entry(archive, state, &rel_path)? {
            append_children(archive, state, &rel_path)?;
        }
    }
    Ok(())
}

/// An empty regular file, written as containerd writes whiteouts.
fn append_whiteout<W: Write>(archive: &mut tar::Builder<W>, rel_path: &Path) -> Result<()> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Regular);
    header.set_mode(0);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(FIXED_MTIME);
    header.set_size(0);
    archive
        .append_data(&mut header, rel_path, io::empty())
        .with_context(|| format!("archiving whiteout {}", rel_path.display()))
}

/// Appends one entry; returns whether it was a directory to descend into.
fn append_entry<W: Write>(archive: &mut tar::Builder<W>, state: &mut WalkState<'_>, rel_path: &Path) -> Result<bool> {
    let full = state.rootfs.join(rel_path);
    let meta = fs::symlink_metadata(&full).with_context(|| format!("stat {}", full.display()))?;
    let file_type = meta.file_type();

    let mut header = tar::Header::new_gnu();
    header.set_mode(meta.mode() & 0o7777);
    header.set_uid(u64::from(meta.uid()));
    header.set_gid(u64::from(meta.gid()));
    header.set_mtime(FIXED_MTIME);
    header.set_size(0);

    if file_type.is_dir() {
        header.set_entry_type(tar::EntryType::Directory);
        // A trailing slash marks directories for tools that ignore the type flag.
        let mut name = rel_path.as_os_str().to_owned();
        name.push("/");
        archive
            .append_data(&mut header, Path::new(&name), io::empty())
            .with_context(|| format!("archiving {}", full.display()))?;
        return Ok(true);
    }

    // Second and later paths of a multiply linked inode become hard links.
    if meta.nlink() > 1 {
        let key = (meta.dev(), meta.ino());
        if let Some(first) = state.first_path_of_inode.get(&key) {
            header.set_entry_type(tar::EntryType::Link);
            archive
                .append_link(&mut header, rel_path, first)
                .with_context(|| format!("archiving hard link {}", full.display()))?;
            return Ok(false);
        }
        state.first_path_of_inode.insert(key, rel_path.to_path_buf());
    }

    if file_type.is_file() {
        header.set_entry_type(tar::EntryType::Regular);
        header.set_size(meta.len());
        let file = File::open(&full).with_context(|| format!("opening {}", full.display()))?;
        let reader = ExactReader {
            inner: file,
            remaining: meta.len(),
            path: full.clone(),
        };
        archive
            .append_data(&mut header, rel_path, reader)
            .with_context(|| format!("archiving {}", full.display()))?;
    } else if file_type.is_symlink() {
        header.set_entry_type(tar::EntryType::Symlink);
        let target = fs::read_link(&full).with_context(|| format!("reading link {}", full.display()))?;
        archive
            .append_link(&mut header, rel_path, &target)
            .with_context(|| format!("archiving symlink {}", full.display()))?;
    } else if file_type.is_fifo() || file_type.is_char_device() || file_type.is_block_device() {
        let entry_type = if file_type.is_fifo() {
            tar::EntryType::Fifo
        } else if file_type.is_char_device() {
            tar::EntryType::Char
        } else {
            tar::EntryType::Block
        };
        header.set_entry_type(entry_type);
        if !file_type.is_fifo() {
            let rdev = meta.rdev();
            header.set_device_major(libc_major(rdev))?;
            header.set_device_minor(libc_minor(rdev))?;
        }
        archive
            .append_data(&mut header, rel_path, io::empty())
            .with_context(|| format!("archiving {}", full.display()))?;
    } else {
        // Sockets cannot be carried in a tar; no image needs one.
        eprintln!("scute-imagekit: skipping socket {}", full.display());
    }
    Ok(false)
}

// glibc's gnu_dev_major / gnu_dev_minor encoding of dev_t.
fn libc_major(dev: u64) -> u32 {
    (((dev >> 32) & 0xffff_f000) | ((dev >> 8) & 0x0000_0fff)) as u32
}

fn libc_minor(dev: u64) -> u32 {
    (((dev >> 12) & 0xffff_ff00) | (dev & 0x0000_00ff)) as u32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::sha256_digest;
    use flate2::read::GzDecoder;
    use std::os::unix::fs::{symlink, PermissionsExt};
    use std::time::{Duration, SystemTime};

    fn sample_rootfs() -> tempfile::TempDir {
        let root = tempfile::tempdir().unwrap();
        let p = root.path();
        fs::create_dir_all(p.join("bin")).unwrap();
        fs::create_dir_all(p.join("etc")).unwrap();
        fs::create_dir_all(p.join("tmp")).unwrap();
        fs::set_permissions(p.join("tmp"), fs::Permissions::from_mode(0o1777)).unwrap();
        fs::write(p.join("bin/busybox"), b"#!not really busybox\n").unwrap();
        fs::set_permissions(p.join("bin/busybox"), fs::Permissions::from_mode(0o4755)).unwrap();
        for applet in ["sh", "ls", "[", "zcat"] {
            fs::hard_link(p.join("bin/busybox"), p.join("bin").join(applet)).unwrap();
        }
        fs::write(p.join("etc/passwd"), b"root:x:0:0:root:/root:/bin/sh\n").unwrap();
        symlink("/bin/busybox", p.join("bin/vi")).unwrap();
        root
    }

    /// The gzip layer and its diff ID.
    fn layer_bytes(rootfs: &Path) -> (Vec<u8>, String) {
        layer_with(rootfs, &Whiteouts::default(), Compression::Gzip)
    }

    fn layer_with(rootfs: &Path, whiteouts: &Whiteouts, compression: Compression) -> (Vec<u8>, String) {
        let mut buf = Vec::new();
        let diff_id = write_layer(rootfs, whiteouts, compression, &mut buf).unwrap();
        (buf, diff_id)
    }

    fn gunzip(gz: &[u8]) -> Vec<u8> {
        let mut tar_bytes = Vec::new();
        GzDecoder::new(gz).read_to_end(&mut tar_bytes).unwrap();
        tar_bytes
    }

    /// (path, entry type, link name, mode, mtime) of every entry, in archive order.
    fn entries(gz: &[u8]) -> Vec<(String, tar::EntryType, Option<String>, u32, u64)> {
        tar_entries(&gunzip(gz))
    }

    fn tar_entries(tar_bytes: &[u8]) -> Vec<(String, tar::EntryType, Option<String>, u32, u64)> {
        let mut archive = tar::Archive::new(tar_bytes);
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.entry_type(),
                    e.link_name().unwrap().map(|l| l.to_string_lossy().into_owned()),
                    h.mode().unwrap(),
                    h.mtime().unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn layer_is_deterministic() {
        let rootfs = sample_rootfs();
        let (first, first_diff_id) = layer_bytes(rootfs.path());

        // Touching mtimes must not change the layer.
        let later = SystemTime::now() + Duration::from_secs(3600);
        File::options()
            .write(true)
            .open(rootfs.path().join("etc/passwd"))
            .unwrap()
            .set_modified(later)
            .unwrap();
        let (second, second_diff_id) = layer_bytes(rootfs.path());

        assert_eq!(first, second);
        assert_eq!(first_diff_id, second_diff_id);
        assert_eq!(first_diff_id, sha256_digest(&gunzip(&first)));
    }

    #[test]
    fn compressions_carry_the_same_tar() {
        let rootfs = sample_rootfs();
        let none = Whiteouts::default();
        let (gz, gz_id) = layer_with(rootfs.path(), &none, Compression::Gzip);
        let (zst, zst_id) = layer_with(rootfs.path(), &none, Compression::Zstd);
        let (tar, tar_id) = layer_with(rootfs.path(), &none, Compression::None);
        assert_eq!(gz_id, zst_id);
        assert_eq!(gz_id, tar_id);
        assert_eq!(tar_id, sha256_digest(&tar));
        assert_eq!(zstd::decode_all(&zst[..]).unwrap(), tar);
        assert_eq!(gunzip(&gz), tar);
        assert_eq!(&zst[..4], b"\x28\xb5\x2f\xfd", "zstd frame magic");
        // zstd is reproducible too.
        assert_eq!(layer_with(rootfs.path(), &none, Compression::Zstd).0, zst);
    }

    #[test]
    fn whiteouts_sit_in_their_directories() {
        let rootfs = sample_rootfs();
        let mut whiteouts = Whiteouts::default();
        whiteouts.remove("/etc/shadow").unwrap();
        whiteouts.remove("gone").unwrap();
        whiteouts.opaque("/tmp/").unwrap();
        let (tar, _) = layer_with(rootfs.path(), &whiteouts, Compression::None);
        let entries = tar_entries(&tar);
        let paths: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        // Sorted among the real entries; ".wh." sorts before letters.
        assert_eq!(paths[0], ".wh.gone");
        let etc = paths.iter().position(|p| *p == "etc/").unwrap();
        assert_eq!(paths[etc + 1], "etc/.wh.shadow");
        assert_eq!(paths[etc + 2], "etc/passwd");
        assert_eq!(*paths.last().unwrap(), "tmp/.wh..wh..opq");
        let whiteout = entries.iter().find(|e| e.0 == "etc/.wh.shadow").unwrap();
        assert_eq!(whiteout.1, tar::EntryType::Regular);
        assert_eq!(whiteout.4, FIXED_MTIME);
    }

    #[test]
    fn bad_whiteouts_are_rejected() {
        let mut whiteouts = Whiteouts::default();
        assert!(whiteouts.remove("/").is_err());
        assert!(whiteouts.remove("/etc/../x").is_err());
        assert!(whiteouts.remove("/etc/.wh.x").is_err());
        assert!(whiteouts.by_dir.is_empty());

        // The directory must be in the rootfs, and not clash with a real file.
        let rootfs = sample_rootfs();
        whiteouts.remove("/usr/lib/x").unwrap();
        let err = write_layer(rootfs.path(), &whiteouts, Compression::None, Vec::new());
        assert!(err.unwrap_err().to_string().contains("/usr/lib"));
        fs::write(rootfs.path().join("etc/.wh.motd"), b"").unwrap();
        let mut clash = Whiteouts::default();
        clash.remove("/etc/motd").unwrap();
        assert!(write_layer(rootfs.path(), &clash, Compression::None, Vec::new()).is_err());
    }

    #[test]
    fn entries_are_sorted_with_fixed_mtime_and_kept_modes() {
        let rootfs = sample_rootfs();
        let (gz, _) = layer_bytes(rootfs.path());
        let entries = entries(&gz);
        let paths: Vec<&str> = entries.iter().map(|e| e.0.as_str()).collect();
        assert_eq!(
            paths,
            [
                "bin/",
                "bin/[",
                "bin/busybox",
                "bin/ls",
                "bin/sh",
                "bin/vi",
                "bin/zcat",
                "etc/",
                "etc/passwd",
                "tmp/"
            ]
        );
        assert!(entries.iter().all(|e| e.4 == FIXED_MTIME));
        let mode_of = |p: &str| entries.iter().find(|e| e.0 == p).unwrap().3;
        assert_eq!(mode_of("tmp/"), 0o1777);
        assert_eq!(mode_of("bin/["), 0o4755);
    }

    #[test]
    fn hard_links_are_stored_as_links() {
        let rootfs = sample_rootfs();
        let (gz, _) = layer_bytes(rootfs.path());
        let entries = entries(&gz);

        // "[" sorts first, so it carries the data and the others link to it.
        let regular: Vec<_> = entries
            .iter()
            .filter(|e| e.0.starts_with("bin/") && e.1 == tar::EntryType::Regular)
            .collect();
        assert_eq!(regular.len(), 1);
        assert_eq!(regular[0].0, "bin/[");
        for name in ["bin/busybox", "bin/ls", "bin/sh", "bin/zcat"] {
            let e = entries.iter().find(|e| e.0 == name).unwrap();
            assert_eq!(e.1, tar::EntryType::Link, "{name}");
            assert_eq!(e.2.as_deref(), Some("bin/["), "{name}");
        }
        let vi = entries.iter().find(|e| e.0 == "bin/vi").unwrap();
        assert_eq!(vi.1, tar::EntryType::Symlink);
        assert_eq!(vi.2.as_deref(), Some("/bin/busybox"));
    }

    #[test]
    fn long_names_round_trip() {
        let root = tempfile::tempdir().unwrap();
        let deep = root.path().join("a".repeat(60)).join("b".repeat(60));
        fs::create_dir_all(&deep).unwrap();
        fs::write(deep.join("c".repeat(60)), b"x").unwrap();
        symlink("t".repeat(150), deep.join("link")).unwrap();
        let (gz, _) = layer_bytes(root.path());
        let entries = entries(&gz);
        assert!(entries.iter().any(|e| e.0.ends_with(&"c".repeat(60))));
        let link = entries.iter().find(|e| e.0.ends_with("/link")).unwrap();
        assert_eq!(link.2.as_deref(), Some("t".repeat(150).as_str()));
    }

    #[test]
    fn rootfs_must_be_a_directory() {
        let root = tempfile::tempdir().unwrap();
        let file = root.path().join("f");
        fs::write(&file, b"").unwrap();
        let none = Whiteouts::default();
        assert!(write_layer(&file, &none, Compression::Gzip, Vec::new()).is_err());
        let missing = root.path().join("missing");
        assert!(write_layer(&missing, &none, Compression::Gzip, Vec::new()).is_err());
    }
}
