//! The registry against spec files written into temporary directories, applying edits to a
//! default OCI spec: device nodes resolved from the host's /dev/null and /dev/zero.

use std::collections::HashMap;
use std::path::Path;

use oci_spec::runtime::{LinuxDeviceType, Spec};

use super::*;
use crate::config::CdiConfig;

fn registry(dirs: &[&Path]) -> CdiRegistry {
    CdiRegistry::new(&CdiConfig {
        enabled: true,
        spec_dirs: dirs.iter().map(|d| d.to_path_buf()).collect(),
    })
}

/// A vendor spec: spec-wide env, device `null0` (the host's /dev/null at /dev/fake-null, with
/// env, a mount and a hook) and device `zero0`.
fn vendor_spec(kind: &str, marker: &str, mount_src: &Path) -> String {
    format!(
        r#"cdiVersion: "0.6.0"
kind: "{kind}"
containerEdits:
  env: ["FAKE_VENDOR={marker}"]
devices:
  - name: null0
    containerEdits:
      deviceNodes:
        - path: /dev/fake-null
          hostPath: /dev/null
          permissions: rw
      env: ["FAKE_DEVICE=null0"]
      mounts:
        - hostPath: {mount}
          containerPath: /fake
          options: [ro, bind]
      hooks:
        - hookName: createRuntime
          path: /bin/true
          args: ["true", "{marker}"]
  - name: zero0
    containerEdits:
      deviceNodes:
        - path: /dev/fake-zero
          hostPath: /dev/zero
"#,
        mount = mount_src.display()
    )
}

fn env_of(spec: &Spec) -> Vec<String> {
    spec.process().as_ref().unwrap().env().clone().unwrap_or_default()
}

#[test]
fn devices_get_exactly_their_edits() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("fake.yaml"),
        vendor_spec("scute.test/fake", "a", dir.path()),
    )
    .unwrap();
    let reg = registry(&[dir.path()]);
    let mut spec = Spec::default();
    reg.inject(&mut spec, &["scute.test/fake=null0".into()], false).unwrap();

    let env = env_of(&spec);
    assert!(env.contains(&"FAKE_VENDOR=a".to_string()), "{env:?}");
    assert!(env.contains(&"FAKE_DEVICE=null0".to_string()), "{env:?}");
    let linux = spec.linux().as_ref().unwrap();
    let devices = linux.devices().clone().unwrap_or_default();
    let node = devices
        .iter()
        .find(|d| d.path() == Path::new("/dev/fake-null"))
        .expect("the device node");
    assert_eq!((node.typ(), node.major(), node.minor()), (LinuxDeviceType::C, 1, 3));
    assert!(
        !devices.iter().any(|d| d.path() == Path::new("/dev/fake-zero")),
        "zero0 was not asked for"
    );
    let rules = linux
        .resources()
        .as_ref()
        .unwrap()
        .devices()
        .clone()
        .unwrap_or_default();
    let allowed: Vec<_> = rules
        .iter()
        .filter(|r| r.allow())
        .map(|r| (r.major(), r.minor(), r.access().clone()))
        .collect();
    assert_eq!(allowed, vec![(Some(1), Some(3), Some("rw".to_string()))]);
    let mounts = spec.mounts().clone().unwrap_or_default();
    let fake = mounts.iter().find(|m| m.destination() == Path::new("/fake")).unwrap();
    assert_eq!(fake.source().as_deref(), Some(dir.path()));
    let hooks = spec.hooks().as_ref().unwrap().create_runtime().clone().unwrap();
    assert_eq!(hooks.len(), 1);
    assert_eq!(hooks[0].path(), Path::new("/bin/true"));
}

#[test]
fn two_devices_of_one_spec_get_its_spec_wide_edits_once() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("fake.yaml"),
        vendor_spec("scute.test/fake", "a", dir.path()),
    )
    .unwrap();
    let reg = registry(&[dir.path()]);
    let mut spec = Spec::default();
    reg.inject(
        &mut spec,
        &["scute.test/fake=null0".into(), "scute.test/fake=zero0".into()],
        false,
    )
    .unwrap();
    let env = env_of(&spec);
    assert_eq!(
        env.iter().filter(|e| e.starts_with("FAKE_VENDOR=")).count(),
        1,
        "{env:?}"
    );
    let devices = spec.linux().as_ref().unwrap().devices().clone().unwrap_or_default();
    let zero = devices
        .iter()
        .find(|d| d.path() == Path::new("/dev/fake-zero"))
        .unwrap();
    assert_eq!((zero.major(), zero.minor()), (1, 5));
}

#[test]
fn unknown_devices_are_named_and_nothing_is_applied() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("fake.yaml"),
        vendor_spec("scute.test/fake", "a", dir.path()),
    )
    .unwrap();
    let reg = registry(&[dir.path()]);
    let mut spec = Spec::default();
    let before = spec.clone();
    let err = reg
        .inject(
            &mut spec,
            &[
                "scute.test/fake=null0".into(),
                "scute.test/fake=gpu9".into(),
                "nonsense".into(),
            ],
            false,
        )
        .unwrap_err();
    assert!(matches!(err, CdiError::Unresolvable { .. }), "{err}");
    let message = err.to_string();
    assert!(
        message.contains("\"scute.test/fake=gpu9\"") && message.contains("\"nonsense\""),
        "{message}"
    );
    assert!(!message.contains("null0"), "{message}");
    assert_eq!(spec, before);
}

#[test]
fn a_broken_file_is_reported_and_the_others_still_count() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("a-broken.yaml"),
        "cdiVersion: \"0.6.0\"\nkind: [not a kind\n",
    )
    .unwrap();
    std::fs::write(
        dir.path().join("b-fake.yaml"),
        vendor_spec("scute.test/fake", "a", dir.path()),
    )
    .unwrap();
    std::fs::write(dir.path().join("c-notes.txt"), "not a spec").unwrap();
    let reg = registry(&[dir.path()]);
    let files = reg.files();
    assert_eq!(files.len(), 2, "{files:?}");
    assert!(files[0].error.is_some() && files[0].path.ends_with("a-broken.yaml"));
    assert_eq!(files[1].kind.as_deref(), Some("scute.test/fake"));
    assert_eq!(files[1].devices, vec!["scute.test/fake=null0", "scute.test/fake=zero0"]);
    reg.inject(&mut Spec::default(), &["scute.test/fake=zero0".into()], false)
        .unwrap();
}

#[test]
fn a_later_directory_overrides_and_one_directory_twice_is_ambiguous() {
    let low = tempfile::tempdir().unwrap();
    let high = tempfile::tempdir().unwrap();
    std::fs::write(
        low.path().join("fake.yaml"),
        vendor_spec("scute.test/fake", "low", low.path()),
    )
    .unwrap();
    std::fs::write(
        high.path().join("fake.yaml"),
        vendor_spec("scute.test/fake", "high", high.path()),
    )
    .unwrap();
    let reg = registry(&[low.path(), high.path()]);
    let mut spec = Spec::default();
    reg.inject(&mut spec, &["scute.test/fake=null0".into()], false).unwrap();
    assert!(env_of(&spec).contains(&"FAKE_VENDOR=high".to_string()));

    // The same device twice in the higher directory: neither definition is used.
    std::fs::write(
        high.path().join("fake2.yaml"),
        vendor_spec("scute.test/fake", "other", high.path()),
    )
    .unwrap();
    let err = reg
        .inject(&mut Spec::default(), &["scute.test/fake=null0".into()], false)
        .unwrap_err();
    assert!(matches!(err, CdiError::Ambiguous(_)), "{err}");
    assert!(err.to_string().contains("fake2.yaml"), "{err}");
    assert_eq!(reg.ambiguous().len(), 2, "null0 and zero0");
}

#[test]
fn specs_are_re_read_when_they_change() {
    let dir = tempfile::tempdir().unwrap();
    let reg = registry(&[dir.path()]);
    assert!(reg
        .inject(&mut Spec::default(), &["scute.test/fake=null0".into()], false)
        .is_err());
    let file = dir.path().join("fake.yaml");
    std::fs::write(&file, vendor_spec("scute.test/fake", "first", dir.path())).unwrap();
    let mut spec = Spec::default();
    reg.inject(&mut spec, &["scute.test/fake=null0".into()], false).unwrap();
    assert!(env_of(&spec).contains(&"FAKE_VENDOR=first".to_string()));
    std::fs::write(&file, vendor_spec("scute.test/fake", "second", dir.path())).unwrap();
    let mut spec = Spec::default();
    reg.inject(&mut spec, &["scute.test/fake=null0".into()], false).unwrap();
    assert!(env_of(&spec).contains(&"FAKE_VENDOR=second".to_string()));
    std::fs::remove_file(&file).unwrap();
    assert!(reg
        .inject(&mut Spec::default(), &["scute.test/fake=null0".into()], false)
        .is_err());
}

#[test]
fn a_device_node_whose_host_path_is_missing_fails_the_apply() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("gone.yaml"),
        "cdiVersion: \"0.6.0\"\nkind: scute.test/gone\ndevices:\n  - name: g\n    containerEdits:\n      deviceNodes:\n        - path: /dev/scute-no-such-device\n",
    )
    .unwrap();
    let err = registry(&[dir.path()])
        .inject(&mut Spec::default(), &["scute.test/gone=g".into()], false)
        .unwrap_err();
    assert!(matches!(err, CdiError::Apply { .. }), "{err}");
}

#[test]
fn disabled_refuses_rather_than_drops() {
    let reg = CdiRegistry::new(&CdiConfig {
        enabled: false,
        spec_dirs: Vec::new(),
    });
    reg.inject(&mut Spec::default(), &[], false).unwrap();
    let err = reg
        .inject(&mut Spec::default(), &["a.com/b=c".into()], false)
        .unwrap_err();
    assert!(matches!(err, CdiError::Disabled(_)), "{err}");
}

#[test]
fn requests_come_from_the_field_then_the_annotations() {
    let annotations = HashMap::from([
        ("cdi.k8s.io/z-plugin".to_string(), "b.com/x=2,a.com/x=1".to_string()),
        ("cdi.k8s.io/a-plugin".to_string(), "c.com/x=3".to_string()),
        ("other/key".to_string(), "not=cdi".to_string()),
    ]);
    let field = [crate::api::CdiDevice {
        name: "a.com/x=1".into(),
    }];
    assert_eq!(
        CdiRegistry::requested(&field, &annotations).unwrap(),
        vec!["a.com/x=1", "c.com/x=3", "b.com/x=2"]
    );
    let bad = HashMap::from([("cdi.k8s.io/p".to_string(), "gpu0".to_string())]);
    assert!(matches!(
        CdiRegistry::requested(&[], &bad),
        Err(CdiError::Annotation { .. })
    ));
}

#[test]
fn a_same_size_rewrite_is_seen() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fake.yaml");
    std::fs::write(&file, vendor_spec("scute.test/fake", "aaaa", dir.path())).unwrap();
    let reg = registry(&[dir.path()]);
    let mut spec = Spec::default();
    reg.inject(&mut spec, &["scute.test/fake=null0".into()], false).unwrap();
    assert!(env_of(&spec).contains(&"FAKE_VENDOR=aaaa".to_string()));
    // Same size, at once (within the file system's timestamp tick).
    std::fs::write(&file, vendor_spec("scute.test/fake", "bbbb", dir.path())).unwrap();
    let mut spec = Spec::default();
    reg.inject(&mut spec, &["scute.test/fake=null0".into()], false).unwrap();
    assert!(env_of(&spec).contains(&"FAKE_VENDOR=bbbb".to_string()));
}

#[test]
fn a_variable_the_spec_has_is_replaced_in_place() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("path.yaml"),
        "cdiVersion: \"0.6.0\"\nkind: scute.test/path\ndevices:\n  - name: p\n    containerEdits:\n      env: [PATH=/vendor/bin:/usr/bin]\n",
    )
    .unwrap();
    let mut spec = Spec::default();
    let mut process = spec.process().clone().unwrap();
    process.set_env(Some(vec!["PATH=/usr/bin".into(), "HOSTNAME=x".into()]));
    spec.set_process(Some(process));
    registry(&[dir.path()])
        .inject(&mut spec, &["scute.test/path=p".into()], false)
        .unwrap();
    assert_eq!(env_of(&spec), vec!["PATH=/vendor/bin:/usr/bin", "HOSTNAME=x"]);
}

#[test]
fn renamed_nodes_are_refused_in_a_user_namespace() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("fake.yaml"),
        vendor_spec("scute.test/fake", "a", dir.path()),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("same.yaml"),
        "cdiVersion: \"0.6.0\"\nkind: scute.test/same\ndevices:\n  - name: n\n    containerEdits:\n      deviceNodes: [{path: /dev/null, hostPath: /dev/null}]\n",
    )
    .unwrap();
    let reg = registry(&[dir.path()]);
    let err = reg
        .inject(&mut Spec::default(), &["scute.test/fake=null0".into()], true)
        .unwrap_err();
    assert!(matches!(err, CdiError::UserNamespace { .. }), "{err}");
    assert!(err.to_string().contains("/dev/fake-null"), "{err}");
    reg.inject(&mut Spec::default(), &["scute.test/same=n".into()], true)
        .unwrap();
    reg.inject(&mut Spec::default(), &["scute.test/fake=null0".into()], false)
        .unwrap();
}

#[test]
fn files_too_big_to_load_and_fifos_are_skipped_not_read() {
    let dir = tempfile::tempdir().unwrap();
    // 5000 devices in ~400 KB: 2 GB of copies in the crate; refused before it.
    let mut many = String::from("cdiVersion: \"0.6.0\"\nkind: scute.test/many\ndevices:\n");
    for i in 0..5000 {
        many.push_str(&format!("  - name: d{i}\n    containerEdits:\n      env: [N={i}]\n"));
    }
    std::fs::write(dir.path().join("many.yaml"), many).unwrap();
    nix::unistd::mkfifo(
        &dir.path().join("fifo.json"),
        nix::sys::stat::Mode::from_bits_truncate(0o600),
    )
    .unwrap();
    std::fs::write(
        dir.path().join("fake.yaml"),
        vendor_spec("scute.test/fake", "a", dir.path()),
    )
    .unwrap();
    let reg = registry(&[dir.path()]);
    let files = reg.files();
    let many = files.iter().find(|f| f.path.ends_with("many.yaml")).unwrap();
    assert!(
        many.error.as_deref().unwrap_or_default().contains("too large"),
        "{many:?}"
    );
    assert!(!files.iter().any(|f| f.path.ends_with("fifo.json")), "{files:?}");
    reg.inject(&mut Spec::default(), &["scute.test/fake=null0".into()], false)
        .unwrap();
}
