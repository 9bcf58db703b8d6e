//! Reproducible gzip layer from a root filesystem directory.
//!
//! The same tree always gives the same bytes: entries are written depth-first
//! with each directory's children sorted by name, every mtime is a fixed
//! value, user and group names are left out (only numeric ids are kept) and
//! the gzip header carries no name or timestamp. Files sharing an inode are
//! written once and then as tar hard links to the first path, which keeps
//! busybox's applets one binary, as in the upstream image.

use std::collections::HashMap;
use std::fs::{self, File};
use std::io::{self, Read, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use flate2::write::GzEncoder;
use flate2::Compression;
use sha2::{Digest, Sha256};

/// mtime of every entry. Zero, like most reproducible-build tools.
pub const FIXED_MTIME: u64 = 0;

/// What a written layer is known by.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerInfo {
    /// `sha256:<hex>` of the compressed blob (manifest layer digest).
    pub digest: String,
    /// Size of the compressed blob in bytes.
    pub size: u64,
    /// `sha256:<hex>` of the uncompressed tar (config rootfs.diff_ids).
    pub diff_id: String,
}

/// Passes writes through while hashing them and counting bytes.
struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    fn finish(self) -> (W, String, u64) {
        let digest = format!("sha256:{}", hex::encode(self.hasher.finalize()));
        (self.inner, digest, self.written)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
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
        let want = buf
            .len()
            .min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
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

/// Writes the gzip layer for `rootfs` to `out` and returns its digests.
pub fn write_layer<W: Write>(rootfs: &Path, out: W) -> Result<LayerInfo> {
    let meta = fs::symlink_metadata(rootfs)
        .with_context(|| format!("reading rootfs {}", rootfs.display()))?;
    if !meta.is_dir() {
        bail!("rootfs {} is not a directory", rootfs.display());
    }

    // Writer chain: tar -> hash(diff_id) -> gzip -> hash(digest) -> out.
    let compressed = HashingWriter::new(out);
    let gzip = flate2::GzBuilder::new()
        .mtime(0)
        .write(compressed, Compression::default());
    let uncompressed = HashingWriter::new(gzip);
    let mut archive = tar::Builder::new(uncompressed);
    archive.mode(tar::HeaderMode::Complete);

    let mut state = WalkState {
        rootfs,
        first_path_of_inode: HashMap::new(),
    };
    append_children(&mut archive, &mut state, Path::new(""))?;

    let uncompressed = archive.into_inner().context("finishing tar stream")?;
    let (gzip, diff_id, _) = uncompressed.finish();
    let compressed: HashingWriter<W> = finish_gzip(gzip)?;
    let (mut out, digest, size) = compressed.finish();
    out.flush().context("flushing layer")?;
    Ok(LayerInfo {
        digest,
        size,
        diff_id,
    })
}

fn finish_gzip<W: Write>(gzip: GzEncoder<W>) -> Result<W> {
    gzip.finish().context("finishing gzip stream")
}

struct WalkState<'a> {
    rootfs: &'a Path,
    /// (device, inode) -> archive path of its first entry, for hard links.
    first_path_of_inode: HashMap<(u64, u64), PathBuf>,
}

/// Appends the entries under `rel` (relative to the rootfs), sorted by name.
fn append_children<W: Write>(
    archive: &mut tar::Builder<W>,
    state: &mut WalkState<'_>,
    rel: &Path,
) -> Result<()> {
    let dir = state.rootfs.join(rel);
    let mut names = Vec::new();
    for entry in fs::read_dir(&dir).with_context(|| format!("listing {}", dir.display()))? {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        names.push(entry.file_name());
    }
    // OsString orders by bytes on unix: locale-independent.
    names.sort();

    for name in names {
        let rel_path = rel.join(&name);
        let is_dir = append_entry(archive, state, &rel_path)?;
        if is_dir {
            append_children(archive, state, &rel_path)?;
        }
    }
    Ok(())
}

/// Appends one entry; returns whether it was a directory to descend into.
fn append_entry<W: Write>(
    archive: &mut tar::Builder<W>,
    state: &mut WalkState<'_>,
    rel_path: &Path,
) -> Result<bool> {
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
        state
            .first_path_of_inode
            .insert(key, rel_path.to_path_buf());
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
        let target =
            fs::read_link(&full).with_context(|| format!("reading link {}", full.display()))?;
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

    fn layer_bytes(rootfs: &Path) -> (Vec<u8>, LayerInfo) {
        let mut buf = Vec::new();
        let info = write_layer(rootfs, &mut buf).unwrap();
        (buf, info)
    }

    /// (path, entry type, link name, mode) of every entry, in archive order.
    fn entries(gz: &[u8]) -> Vec<(String, tar::EntryType, Option<String>, u32, u64)> {
        let mut archive = tar::Archive::new(GzDecoder::new(gz));
        archive
            .entries()
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                let h = e.header();
                (
                    e.path().unwrap().to_string_lossy().into_owned(),
                    h.entry_type(),
                    e.link_name()
                        .unwrap()
                        .map(|l| l.to_string_lossy().into_owned()),
                    h.mode().unwrap(),
                    h.mtime().unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn layer_is_deterministic() {
        let rootfs = sample_rootfs();
        let (first, first_info) = layer_bytes(rootfs.path());

        // Touching mtimes must not change the layer.
        let later = SystemTime::now() + Duration::from_secs(3600);
        File::options()
            .write(true)
            .open(rootfs.path().join("etc/passwd"))
            .unwrap()
            .set_modified(later)
            .unwrap();
        let (second, second_info) = layer_bytes(rootfs.path());

        assert_eq!(first, second);
        assert_eq!(first_info, second_info);
        assert_eq!(first_info.size, first.len() as u64);
        let expected = format!("sha256:{}", hex::encode(Sha256::digest(&first)));
        assert_eq!(first_info.digest, expected);

        let mut tar_bytes = Vec::new();
        GzDecoder::new(&first[..])
            .read_to_end(&mut tar_bytes)
            .unwrap();
        let expected = format!("sha256:{}", hex::encode(Sha256::digest(&tar_bytes)));
        assert_eq!(first_info.diff_id, expected);
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
        assert!(write_layer(&file, Vec::new()).is_err());
        assert!(write_layer(&root.path().join("missing"), Vec::new()).is_err());
    }
}
