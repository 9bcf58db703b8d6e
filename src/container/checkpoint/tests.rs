use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::fs::symlink;

use super::*;

/// Every entry of a tar: path → (kind, content).
fn entries(bytes: &[u8]) -> BTreeMap<String, (tar::EntryType, Vec<u8>)> {
    let mut archive = tar::Archive::new(bytes);
    let mut out = BTreeMap::new();
    for entry in archive.entries().unwrap() {
        let mut entry = entry.unwrap();
        let path = entry.path().unwrap().display().to_string();
        let kind = entry.header().entry_type();
        let mut content = Vec::new();
        entry.read_to_end(&mut content).unwrap();
        out.insert(path.trim_end_matches('/').to_string(), (kind, content));
    }
    out
}

fn whiteout(path: &Path) {
    let c = CString::new(path.as_os_str().as_bytes()).unwrap();
    assert_eq!(
        unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o600, 0) },
        0,
        "mknod {path:?}"
    );
}

fn set_opaque(dir: &Path) {
    let c = CString::new(dir.as_os_str().as_bytes()).unwrap();
    let rc = unsafe {
        libc::setxattr(
            c.as_ptr(),
            c"trusted.overlay.opaque".as_ptr(),
            b"y".as_ptr().cast(),
            1,
            0,
        )
    };
    assert_eq!(rc, 0, "setxattr on {dir:?}: {}", io::Error::last_os_error());
}

#[test]
fn writable_layer_diff_holds_changes_and_lists_deletions() {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("SKIPPED: whiteouts and trusted xattrs need root");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let (upper, lower) = (tmp.path().join("upper"), tmp.path().join("lower"));
    for d in ["etc", "var/cache/app", "data"] {
        fs::create_dir_all(lower.join(d)).unwrap();
    }
    fs::write(lower.join("etc/motd"), "image").unwrap();
    fs::write(lower.join("var/cache/app/a"), "old").unwrap();
    fs::write(lower.join("var/cache/app/b"), "old").unwrap();
    fs::write(lower.join("data/kept"), "image").unwrap();

    fs::create_dir_all(upper.join("etc")).unwrap();
    fs::create_dir_all(upper.join("var/cache/app")).unwrap();
    fs::create_dir_all(upper.join("tmp")).unwrap();
    fs::write(upper.join("tmp/counter"), "41").unwrap();
    fs::write(upper.join("etc/hostname-changed"), "new").unwrap();
    whiteout(&upper.join("etc/motd"));
    set_opaque(&upper.join("var/cache/app"));
    fs::write(upper.join("var/cache/app/b"), "rewritten").unwrap();
    symlink("/tmp/counter", upper.join("tmp/link")).unwrap();
    let _socket = std::os::unix::net::UnixListener::bind(upper.join("tmp/app.sock")).unwrap();

    let mut out = Vec::new();
    let deleted = write_rootfs_diff(&upper, std::slice::from_ref(&lower), &mut out).unwrap();
    assert_eq!(deleted, vec!["/etc/motd".to_string(), "/var/cache/app/a".to_string()]);
    let tar = entries(&out);
    assert_eq!(tar["tmp/counter"], (tar::EntryType::Regular, b"41".to_vec()));
    assert_eq!(tar["var/cache/app/b"].1, b"rewritten");
    assert_eq!(tar["etc/hostname-changed"].1, b"new");
    assert_eq!(tar["tmp/link"].0, tar::EntryType::Symlink);
    assert_eq!(tar["var/cache/app"].0, tar::EntryType::Directory);
    for absent in ["etc/motd", "tmp/app.sock", "data/kept", "var/cache/app/a"] {
        assert!(!tar.contains_key(absent), "{absent} in the diff: {:?}", tar.keys());
    }
}

#[test]
fn archive_has_the_anchors_layout() {
    let tmp = tempfile::tempdir().unwrap();
    let (upper, images, work) = (
        tmp.path().join("upper"),
        tmp.path().join("images"),
        tmp.path().join("work"),
    );
    for d in [&upper, &images, &work] {
        fs::create_dir_all(d).unwrap();
    }
    fs::write(upper.join("written"), "x").unwrap();
    fs::write(images.join("pages-1.img"), vec![7u8; 4096]).unwrap();
    fs::write(images.join("inventory.img"), "i").unwrap();
    fs::write(work.join(DUMP_LOG), "dump log").unwrap();
    fs::write(work.join(STATS_DUMP), "stats").unwrap();
    let log = tmp.path().join("0.log");
    fs::write(&log, "2026-11-28T00:00:00.000000000Z stdout F 41\n").unwrap();
    let config = ConfigDump {
        id: "abc".into(),
        name: "counter_pod_default_uid_0".into(),
        rootfs_image: "busybox:1.36".into(),
        rootfs_image_ref: "registry/busybox@sha256:00".into(),
        rootfs_image_name: "registry/busybox:1.36".into(),
        runtime: "scute".into(),
        created_time: rfc3339(1_764_288_000_123_456_789),
        checkpointed_time: rfc3339(1_764_288_001_000_000_000),
        restored_time: ZERO_TIME.into(),
        restored: false,
    };
    let status = serde_json::json!({"id": "abc", "state": 1});
    let location = tmp.path().join("out/checkpoint.tar");
    fs::create_dir_all(location.parent().unwrap()).unwrap();
    let size = write_archive(
        &Contents {
            config: &config,
            spec_json: br#"{"ociVersion":"1.2.0"}"#,
            status_json: &status,
            upper: &upper,
            lowers: &[],
            images_dir: &images,
            work_dir: &work,
            log: Some((&log, 20)),
        },
        &location,
    )
    .unwrap();
    let bytes = fs::read(&location).unwrap();
    assert_eq!(size, bytes.len() as u64);
    assert_eq!(fs::metadata(&location).unwrap().permissions().mode() & 0o777, 0o600);
    let tar = entries(&bytes);
    let names: Vec<&str> = tar.keys().map(String::as_str).collect();
    for name in [
        CONFIG_DUMP,
        SPEC_DUMP,
        STATUS_DUMP,
        "checkpoint/pages-1.img",
        "checkpoint/inventory.img",
        ROOTFS_DIFF,
        DUMP_LOG,
        STATS_DUMP,
        CONTAINER_LOG,
    ] {
        assert!(names.contains(&name), "{name} missing from {names:?}");
    }
    assert!(!names.contains(&DELETED_FILES), "nothing was deleted: {names:?}");
    // Field names and time format as checkpointctl's Go reads them.
    let dumped: serde_json::Value = serde_json::from_slice(&tar[CONFIG_DUMP].1).unwrap();
    assert_eq!(dumped["rootfsImageName"], "registry/busybox:1.36");
    assert_eq!(dumped["rootfsImageRef"], "registry/busybox@sha256:00");
    assert_eq!(dumped["runtime"], "scute");
    assert_eq!(dumped["createdTime"], "2025-11-28T00:00:00.123456789Z");
    assert_eq!(dumped["restoredTime"], ZERO_TIME);
    assert_eq!(serde_json::from_value::<ConfigDump>(dumped).unwrap(), config);
    // The log as it stood at the dump, not what the container wrote after.
    assert_eq!(tar[CONTAINER_LOG].1, b"2026-11-28T00:00:00.".to_vec());
    let diff = entries(&tar[ROOTFS_DIFF].1);
    assert_eq!(diff["written"].1, b"x");
    // Nothing staged is left beside the archive or in the work dir.
    assert_eq!(fs::read_dir(location.parent().unwrap()).unwrap().count(), 1);
    assert!(!work.join(ROOTFS_DIFF).exists());
}
