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
