use std::io::{Read, Write};

use super::*;
use crate::pb::session_input;

#[test]
fn ids() {
    for ok in ["a", "pause", "0123abcdef", "a.b-c_d+e", &"x".repeat(255)] {
        validate_id(ok).unwrap();
    }
    for bad in ["", ".", "..", "a/b", "../x", "a b", "é", &"x".repeat(256)] {
        assert_eq!(
            validate_id(bad).unwrap_err().code,
            ErrorCode::InvalidArgument,
            "{bad:?}"
        );
    }
}

#[test]
fn unknown_ids() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Containers::new(dir.path().join("containers"), dir.path().join("exits"), -1);
    assert_eq!(c.state("nope").unwrap_err().code, ErrorCode::NotFound);
    assert_eq!(c.kill("nope", 9, false).unwrap_err().code, ErrorCode::NotFound);
    assert_eq!(c.start("nope").unwrap_err().code, ErrorCode::NotFound);
    assert_eq!(c.update_resources("nope", "{}").unwrap_err().code, ErrorCode::NotFound);
    c.delete("nope").unwrap();
    c.delete("nope").unwrap();
    c.delete_all().unwrap();
}

#[test]
fn update_resources_needs_a_live_container_and_resources_json() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Containers::new(dir.path().join("containers"), dir.path().join("exits"), -1);
    let entry = |status| Entry {
        pid: 1,
        status,
        created_at_ns: 0,
        started_at_ns: 0,
        log: None,
        oom: None,
        sigkill_sent: false,
        stdin: None,
        stdin_once: false,
        tty: None,
        attached: Vec::new(),
        restore: None,
    };
    let exit = ExitRecord {
        exit_code: 0,
        finished_at_ns: 1,
        oom_killed: false,
    };
    c.table.insert("gone".into(), entry(Status::Stopped(exit)));
    c.table.insert("live".into(), entry(Status::Running));
    let e = c.update_resources("gone", r#"{"memory":{"limit":1}}"#).unwrap_err();
    assert_eq!(e.code, ErrorCode::FailedPrecondition, "{}", e.message);
    for bad in ["", "[1]", r#"{"memory":{"limit":"lots"}}"#, r#"{"cpu":{"shares":-1}}"#] {
        let e = c.update_resources("live", bad).unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument, "{bad}: {}", e.message);
    }
}

/// A running entry whose stdin and stdout are pipes this test holds the other ends of.
fn piped_entry(stdin_once: bool) -> (Entry, File, File) {
    let (in_r, in_w) = stdio::input_pipe().unwrap();
    stdio::set_nonblocking(in_r.as_fd()).unwrap();
    let (out_r, out_w) = output_pipe().unwrap();
    let (err_r, _) = output_pipe().unwrap();
    let entry = Entry {
        pid: i32::MAX,
        status: Status::Running,
        created_at_ns: 0,
        started_at_ns: 0,
        log: Some(ContainerLog {
            file: None,
            streams: vec![LogStream::new("stdout", out_r), LogStream::new("stderr", err_r)],
            terminal: false,
        }),
        oom: None,
        sigkill_sent: false,
        stdin: Some(Input::new(in_w, false)),
        stdin_once,
        tty: None,
        attached: Vec::new(),
        restore: None,
    };
    (entry, File::from(in_r), File::from(out_w))
}

fn read_now(f: &mut File) -> std::io::Result<Vec<u8>> {
    crate::test_support::wait_readable(f.as_fd());
    let mut buf = [0u8; 1024];
    let n = f.read(&mut buf)?;
    Ok(buf[..n].to_vec())
}

#[test]
fn attach_sessions_share_output_and_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let exits = dir.path().join("exits");
    std::fs::create_dir(&exits).unwrap();
    let mut c = Containers::new(dir.path().join("containers"), exits, -1);
    let (entry, mut stdin, mut stdout) = piped_entry(true);
    c.table.insert("c".into(), entry);
    let attach = |stdin, stdout, stderr| pb::AttachRequest {
        container_id: "c".into(),
        stdin,
        stdout,
        stderr,
    };
    assert!(!c.attach(1, attach(true, true, false)).unwrap().tty);
    c.attach(2, attach(false, false, true)).unwrap();
    c.attach(3, attach(true, true, true)).unwrap();

    // Output goes to the sessions that want it, as it is read.
    stdout.write_all(b"hello").unwrap();
    c.on_ready(&Source::Log("c".into(), 0), libc::POLLIN, &|_| usize::MAX);
    let frames = c.take_session_output();
    let hello = session_output::Kind::Stdout(b"hello".to_vec());
    assert_eq!(frames, vec![(1, hello.clone()), (3, hello)]);

    // Input from any session with stdin; none from one without.
    c.session_input(2, session_input::Kind::Stdin(b"ignored".to_vec()));
    c.session_input(1, session_input::Kind::Stdin(b"a".to_vec()));
    c.session_input(3, session_input::Kind::Stdin(b"b".to_vec()));
    assert_eq!(read_now(&mut stdin).unwrap(), b"ab");
    assert!(c.session_input_room(1));
    // Resizing without a terminal does nothing.
    c.session_input(1, session_input::Kind::Resize(pb::Resize { width: 1, height: 1 }));

    // stdin_once: the first session to end its input closes stdin (EOF), for good.
    c.session_closed(1);
    assert_eq!(read_now(&mut stdin).unwrap(), b"");
    c.session_input(3, session_input::Kind::Stdin(b"late".to_vec()));
    let e = c.attach(4, attach(true, true, true)).unwrap_err();
    assert_eq!(e.code, ErrorCode::FailedPrecondition);
    assert!(e.message.contains("stdin_once"), "{}", e.message);

    // The exit ends the remaining sessions, after the output.
    stdout.write_all(b"bye").unwrap();
    c.on_exit(i32::MAX, 3);
    let frames = c.take_session_output();
    let exit = session_output::Kind::Exit(pb::SessionExit { exit_code: 3 });
    assert_eq!(
        frames,
        vec![
            (3, session_output::Kind::Stdout(b"bye".to_vec())),
            (2, exit.clone()),
            (3, exit)
        ]
    );
    let e = c.attach(5, attach(false, true, true)).unwrap_err();
    assert_eq!(e.code, ErrorCode::FailedPrecondition);
}

#[test]
fn attach_without_stdin_once_keeps_stdin_open() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = Containers::new(dir.path().join("containers"), dir.path().join("exits"), -1);
    let (entry, mut stdin, _stdout) = piped_entry(false);
    c.table.insert("c".into(), entry);
    let with_stdin = pb::AttachRequest {
        container_id: "c".into(),
        stdin: true,
        ..Default::default()
    };
    c.attach(1, with_stdin.clone()).unwrap();
    c.session_input(1, session_input::Kind::CloseStdin(pb::CloseStdin {}));
    c.session_closed(1);
    c.attach(2, with_stdin).unwrap();
    c.session_input(2, session_input::Kind::Stdin(b"still open".to_vec()));
    assert_eq!(read_now(&mut stdin).unwrap(), b"still open");
    // A container created without stdin takes none.
    c.table.get_mut("c").unwrap().stdin = None;
    let e = c
        .attach(
            3,
            pb::AttachRequest {
                container_id: "c".into(),
                stdin: true,
                ..Default::default()
            },
        )
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::FailedPrecondition);
    assert!(e.message.contains("without stdin"), "{}", e.message);
}

#[test]
fn create_checks_arguments_before_libcontainer() {
    if !crate::test_support::alone("containers::tests::create_checks_arguments_before_libcontainer") {
        return;
    }
    let none = CreateOptions::default();
    let dir = tempfile::tempdir().unwrap();
    let mut c = Containers::new(dir.path().join("containers"), dir.path().join("exits"), -1);
    assert_eq!(
        c.create("a/b", "/x", &none).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    assert_eq!(
        c.create("a", "rel/bundle", &none).unwrap_err().code,
        ErrorCode::InvalidArgument
    );
    let e = c.create("a", dir.path().to_str().unwrap(), &none).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument);
    assert!(e.message.contains("config.json"), "{}", e.message);
    std::fs::write(dir.path().join("config.json"), "{}").unwrap();
    let bundle = dir.path().to_str().unwrap();
    let e = c
        .create(
            "a",
            bundle,
            &CreateOptions {
                log_path: "rel/0.log".into(),
                ..none.clone()
            },
        )
        .unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument, "{}", e.message);
    // A terminal must be what the bundle's process.terminal says (checked in the helper,
    // before libcontainer runs).
    let tty = CreateOptions {
        tty: true,
        ..none.clone()
    };
    let e = c.create("a", bundle, &tty).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument, "{}", e.message);
    assert!(e.message.contains("process.terminal false"), "{}", e.message);
    std::fs::write(
        dir.path().join("config.json"),
        r#"{"ociVersion": "1.2.0", "process": {"terminal": true, "cwd": "/", "user": {"uid": 0, "gid": 0}}}"#,
    )
    .unwrap();
    let e = c.create("a", bundle, &none).unwrap_err();
    assert_eq!(e.code, ErrorCode::InvalidArgument, "{}", e.message);
    assert!(e.message.contains("process.terminal true"), "{}", e.message);
    assert_eq!(c.len(), 0);
    // The console socket is gone with the failed create.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".sock"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert_eq!(c.reopen_log("a").unwrap_err().code, ErrorCode::NotFound);
    let exec = pb::ExecRequest {
        container_id: "a".into(),
        args: vec!["true".into()],
        ..Default::default()
    };
    assert_eq!(c.exec(1, exec).unwrap_err().code, ErrorCode::NotFound);
    assert_eq!(c.pending_execs(), 0);
    let stream = pb::ExecStreamRequest {
        container_id: "a".into(),
        args: vec!["sh".into()],
        tty: true,
        ..Default::default()
    };
    assert_eq!(c.exec_stream(1, stream).unwrap_err().code, ErrorCode::NotFound);
    let attach = pb::AttachRequest {
        container_id: "a".into(),
        stdout: true,
        ..Default::default()
    };
    assert_eq!(c.attach(1, attach).unwrap_err().code, ErrorCode::NotFound);
}
