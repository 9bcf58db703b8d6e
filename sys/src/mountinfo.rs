//! /proc/<pid>/mountinfo: one line per mount,
//! `id parent major:minor root mount_point options [optional fields...] - fstype source super_options`
//! (proc(5)); paths carry the kernel's octal escapes for space, tab, newline and backslash.

use std::io;
use std::path::{Path, PathBuf};

/// One mount of the table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The mounted sub-tree of its filesystem (`/` for all of it).
    pub root: String,
    pub mount_point: PathBuf,
    /// Per-mount options (`rw,nosuid,...`).
    pub options: String,
    /// Optional fields: `shared:N`, `master:N`, `propagate_from:N`, `unbindable`.
    pub optional: Vec<String>,
    pub fstype: String,
    pub source: String,
    /// Per-superblock options (for a v1 cgroup mount, its controllers).
    pub super_options: String,
}

impl Mount {
    /// Whether the per-superblock options include `option`.
    pub fn has_super_option(&self, option: &str) -> bool {
        self.super_options.split(',').any(|o| o == option)
    }
}

/// This process's mount table.
pub fn read() -> io::Result<Vec<Mount>> {
    Ok(parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
}

/// The mounts of mountinfo text, in its order; malformed lines are skipped.
pub fn parse(text: &str) -> Vec<Mount> {
    text.lines().filter_map(parse_line).collect()
}

fn parse_line(line: &str) -> Option<Mount> {
    let (left, right) = line.split_once(" - ")?;
    let left: Vec<&str> = left.split(' ').collect();
    let mut right = right.split(' ');
    if left.len() < 6 {
        return None;
    }
    Some(Mount {
        root: unescape(left[3]),
        mount_point: PathBuf::from(unescape(left[4])),
        options: left[5].to_string(),
        optional: left[6..].iter().map(|f| f.to_string()).collect(),
        fstype: right.next()?.to_string(),
        source: unescape(right.next().unwrap_or_default()),
        super_options: right.next().unwrap_or_default().to_string(),
    })
}

/// Whether `path` is exactly a mount point of this process's mount table. statx says so in one
/// call (STATX_ATTR_MOUNT_ROOT, Linux 5.8); reading the table costs O(mounts), and the kernel's
/// escaping of every overlay's options made that most of a RemoveContainer on a node with many
/// containers (issue 21). The table answers where statx cannot.
pub fn is_mountpoint(path: &Path) -> bool {
    statx_mount_root(path).unwrap_or_else(|| read().is_ok_and(|mounts| mounts.iter().any(|m| m.mount_point == path)))
}

/// statx's verdict on `path` being a mount's root; None when this kernel does not say. By hand:
/// nix has no statx.
fn statx_mount_root(path: &Path) -> Option<bool> {
    use nix::libc;
    use std::os::unix::ffi::OsStrExt;
    if !path.is_absolute() {
        return None; // the table holds absolute paths only: it decides, as before
    }
    let c_path = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut stx = std::mem::MaybeUninit::<libc::statx>::zeroed();
    // SAFETY: a NUL-terminated path and a buffer of the size statx writes.
    let r = unsafe {
        libc::statx(
            libc::AT_FDCWD,
            c_path.as_ptr(),
            libc::AT_SYMLINK_NOFOLLOW | libc::AT_NO_AUTOMOUNT,
            0,
            stx.as_mut_ptr(),
        )
    };
    if r != 0 {
        return match io::Error::last_os_error().raw_os_error() {
            Some(libc::ENOENT) | Some(libc::ENOTDIR) => Some(false),
            _ => None,
        };
    }
    // SAFETY: statx succeeded, so it filled the buffer.
    let stx = unsafe { stx.assume_init() };
    let bit = libc::STATX_ATTR_MOUNT_ROOT as u64;
    (stx.stx_attributes_mask & bit != 0).then_some(stx.stx_attributes & bit != 0)
}

/// Undoes the kernel's octal escapes (`\040` for a space, `\134` for a backslash, …).
pub fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let octal = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal.map(|d| d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'))) {
            Some(v) if v <= 0xff => {
                out.push(v as u8);
                i += 4;
            }
            _ => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
22 1 0:21 / /sys rw,nosuid shared:7 - sysfs sysfs rw
35 31 0:32 /sub /sys/fs/cgroup/memory rw,relatime shared:12 master:3 - cgroup cgroup rw,memory
40 23 8:1 /a\\040b /mnt/with\\040space\\134x rw - ext4 /dev/sda1 rw,errors=remount-ro
garbage
";

    #[test]
    fn fields_and_escapes() {
        let m = parse(SAMPLE);
        assert_eq!(m.len(), 3);
        assert_eq!(m[0].mount_point, Path::new("/sys"));
        assert_eq!(m[0].optional, ["shared:7"]);
        assert_eq!((m[0].fstype.as_str(), m[0].source.as_str()), ("sysfs", "sysfs"));
        assert_eq!(m[1].root, "/sub");
        assert_eq!(m[1].optional, ["shared:12", "master:3"]);
        assert!(m[1].has_super_option("memory") && !m[1].has_super_option("mem"));
        assert_eq!(m[2].root, "/a b");
        assert_eq!(m[2].mount_point, Path::new("/mnt/with space\\x"));
        assert!(m[2].optional.is_empty());
        assert_eq!(m[2].super_options, "rw,errors=remount-ro");
    }

    #[test]
    fn unescape_only_octal_triplets() {
        assert_eq!(unescape("a\\040b"), "a b");
        assert_eq!(unescape("\\011\\012\\134"), "\t\n\\");
        assert_eq!(unescape("x\\04"), "x\\04", "too short");
        assert_eq!(unescape("x\\089"), "x\\089", "not octal");
        assert_eq!(unescape("end\\"), "end\\");
        assert_eq!(unescape("\\777"), "\\777", "beyond a byte");
    }

    #[test]
    fn this_process_has_a_root_mount() {
        assert!(is_mountpoint(Path::new("/")));
        assert!(!is_mountpoint(Path::new("/surely/not/a/mount")));
    }

    /// statx's answer and the table's agree: a bind mount is one until it is unmounted, the
    /// directory under it is not one, and neither is a path under a mount.
    #[test]
    fn statx_agrees_with_the_table() {
        use nix::libc;
        use std::os::unix::ffi::OsStrExt;
        let in_table = |p: &Path| read().unwrap().iter().any(|m| m.mount_point == p);
        if statx_mount_root(Path::new("/proc")).is_none() {
            return; // a kernel before 5.8 (or a sandbox) whose statx does not say: the table decides
        }
        let dir = std::env::temp_dir().join(format!("scute-sys-statx-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("sub")).unwrap();
        assert!(!is_mountpoint(&dir) && !in_table(&dir));
        let c_dir = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated paths; a bind mount of a directory onto itself.
        let bound = unsafe {
            libc::mount(
                c_dir.as_ptr(),
                c_dir.as_ptr(),
                std::ptr::null(),
                libc::MS_BIND,
                std::ptr::null(),
            )
        };
        if bound != 0 {
            // Not root (`cargo test` as a user): only the negative cases are checked.
            std::fs::remove_dir_all(&dir).unwrap();
            return;
        }
        let mounted = (is_mountpoint(&dir), in_table(&dir), is_mountpoint(&dir.join("sub")));
        // statx itself answers (not the table behind it): the fast path is the one tested.
        let by_statx = (statx_mount_root(&dir), statx_mount_root(&dir.join("sub")));
        // SAFETY: as above.
        assert_eq!(unsafe { libc::umount2(c_dir.as_ptr(), libc::MNT_DETACH) }, 0);
        assert_eq!(mounted, (true, true, false));
        assert_eq!(by_statx, (Some(true), Some(false)));
        assert!(!is_mountpoint(&dir) && !in_table(&dir));
        assert_eq!(statx_mount_root(&dir), Some(false));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
