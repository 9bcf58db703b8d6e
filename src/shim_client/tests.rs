use super::spawn::{parse_stat, until_readable};
use super::*;
use bytes::{Bytes, BytesMut};
use tokio::net::UnixListener;

/// A fake shim: answers each request with `answer(request)` on every connection.
fn fake_shim(
    dir: &Path,
    answer: impl Fn(pb::Request) -> Option<pb::Response> + Send + Sync + 'static,
) -> tokio::task::JoinHandle<()> {
    let listener = UnixListener::bind(dir.join(SOCKET_FILE)).unwrap();
    let answer = std::sync::Arc::new(answer);
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let answer = answer.clone();
            tokio::spawn(async move {
                loop {
                    let mut h = [0u8; 4];
                    if s.read_exact(&mut h).await.is_err() {
                        return;
                    }
                    let mut p = vec![0u8; u32::from_be_bytes(h) as usize];
                    s.read_exact(&mut p).await.unwrap();
                    let req = pb::Request::decode(p.as_slice()).unwrap();
                    match answer(req) {
                        Some(resp) => s.write_all(&encode(&resp)).await.unwrap(),
                        None => return, // hang up
                    }
                }
            });
        }
    })
}

fn resp(kind: response::Kind) -> Option<pb::Response> {
    Some(pb::Response { kind: Some(kind) })
}

fn ping() -> response::Kind {
    response::Kind::Ping(pb::PingResponse {
        pid: std::process::id(),
        version: "9.9.9".into(),
        sandbox_id: "sb".into(),
    })
}

#[tokio::test]
async fn connect_without_a_shim_is_gone() {
    let dir = tempfile::tempdir().unwrap();
    assert!(matches!(ShimClient::connect(dir.path()).await, Err(ShimError::Gone(_))));
    // A stale socket file nobody listens on.
    drop(std::os::unix::net::UnixListener::bind(dir.path().join(SOCKET_FILE)).unwrap());
    assert!(matches!(ShimClient::connect(dir.path()).await, Err(ShimError::Gone(_))));
}

#[tokio::test]
async fn requests_and_error_mapping() {
    let dir = tempfile::tempdir().unwrap();
    fake_shim(dir.path(), |req| match req.kind? {
        request::Kind::Ping(_) => resp(ping()),
        request::Kind::State(r) if r.container_id == "c" => resp(response::Kind::State(pb::StateResponse {
            pid: 42,
            status: pb::ContainerStatus::Stopped as i32,
            exit_code: Some(137),
            finished_at_ns: Some(5),
            created_at_ns: 1,
            started_at_ns: 2,
            oom_killed: true,
            log_bytes_dropped: 0,
        })),
        request::Kind::State(r) => resp(response::Kind::Error(pb::Error {
            code: pb::ErrorCode::NotFound as i32,
            message: format!("no container {}", r.container_id),
        })),
        request::Kind::Kill(r) if r.signal == 9 && r.all => resp(response::Kind::Kill(pb::KillResponse {})),
        request::Kind::Kill(_) => resp(response::Kind::Error(pb::Error {
            code: pb::ErrorCode::InvalidArgument as i32,
            message: "bad signal".into(),
        })),
        // Answers a request with the wrong kind of response.
        request::Kind::DeleteContainer(_) => resp(response::Kind::Kill(pb::KillResponse {})),
        request::Kind::CreateContainer(r) => {
            assert_eq!(r.bundle, "/b");
            assert!(!r.create_only);
            resp(response::Kind::CreateContainer(pb::CreateContainerResponse { pid: 7 }))
        }
        _ => None,
    });
    let c = ShimClient::connect(dir.path()).await.unwrap();
    assert_eq!(c.shim_pid(), Some(std::process::id()));
    assert_eq!(c.sandbox_id(), "sb");
    assert_eq!(c.version(), "9.9.9");

    let s = c.state("c").await.unwrap();
    assert_eq!(
        (s.pid, s.status, s.exit_code, s.finished_at_ns, s.oom_killed),
        (42, ContainerStatus::Stopped, Some(137), Some(5), true)
    );
    assert!(matches!(c.state("x").await, Err(ShimError::NotFound(m)) if m == "no container x"));
    c.kill("c", 9, true).await.unwrap();
    match c.kill("c", 15, false).await {
        Err(ShimError::Remote {
            code: pb::ErrorCode::InvalidArgument,
            message,
        }) => assert_eq!(message, "bad signal"),
        other => panic!("{other:?}"),
    }
    assert!(matches!(c.kill("c", -1, false).await, Err(ShimError::Protocol(_))));
    assert!(matches!(c.delete_container("c").await, Err(ShimError::Protocol(_))));
    assert_eq!(c.create_container("c", Path::new("/b")).await.unwrap(), 7);
    // The fake hangs up on StartContainer: Gone, and the next call reconnects.
    assert!(matches!(c.start_container("c").await, Err(ShimError::Gone(_))));
    assert_eq!(c.state("c").await.unwrap().pid, 42);
}

#[tokio::test]
async fn exec_uses_its_own_connection_and_create_options_reach_the_shim() {
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(dir.path().join(SOCKET_FILE)).unwrap();
    // Exec answers wait for this; everything else answers at once.
    let release = std::sync::Arc::new(tokio::sync::Notify::new());
    let release2 = release.clone();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            let release = release2.clone();
            tokio::spawn(async move {
                loop {
                    let mut h = [0u8; 4];
                    if s.read_exact(&mut h).await.is_err() {
                        return;
                    }
                    let mut p = vec![0u8; u32::from_be_bytes(h) as usize];
                    s.read_exact(&mut p).await.unwrap();
                    let kind = match pb::Request::decode(p.as_slice()).unwrap().kind.unwrap() {
                        request::Kind::Ping(_) => ping(),
                        request::Kind::State(_) => response::Kind::State(pb::StateResponse {
                            status: pb::ContainerStatus::Running as i32,
                            ..Default::default()
                        }),
                        request::Kind::CreateContainer(r) => {
                            assert!(r.create_only);
                            assert_eq!(r.log_path, "/var/log/pods/x/c/0.log");
                            assert_eq!(r.max_log_line_bytes, 1024);
                            assert!(!r.stdin && !r.tty);
                            response::Kind::CreateContainer(pb::CreateContainerResponse { pid: 9 })
                        }
                        request::Kind::ReopenContainerLog(_) => {
                            response::Kind::ReopenContainerLog(pb::ReopenContainerLogResponse {})
                        }
                        request::Kind::Exec(r) => {
                            assert_eq!(r.args, ["sh", "-c", "exit 3"]);
                            assert_eq!(r.timeout_ms, 1500);
                            assert_eq!(r.max_output_bytes, MAX_EXEC_OUTPUT as u64);
                            release.notified().await;
                            response::Kind::Exec(pb::ExecResponse {
                                exit_code: 3,
                                stdout: b"hi\n".to_vec(),
                                stderr: vec![0; 6 << 20],
                                ..Default::default()
                            })
                        }
                        _ => return,
                    };
                    let resp = pb::Response { kind: Some(kind) };
                    s.write_all(&encode(&resp)).await.unwrap();
                }
            });
        }
    });
    let c = std::sync::Arc::new(ShimClient::connect(dir.path()).await.unwrap());
    let opts = CreateOptions {
        log_path: Some("/var/log/pods/x/c/0.log".into()),
        max_log_line_bytes: Some(1024),
        ..Default::default()
    };
    assert_eq!(c.create_container_with("c", Path::new("/b"), &opts).await.unwrap(), 9);
    c.reopen_log("c").await.unwrap();
    let c2 = c.clone();
    let exec = tokio::spawn(async move {
        let args: Vec<String> = ["sh", "-c", "exit 3"].map(String::from).to_vec();
        c2.exec("c", &args, Duration::from_millis(1500), usize::MAX).await
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    // The exec is pending; State still answers.
    assert_eq!(c.state("c").await.unwrap().status, ContainerStatus::Running);
    release.notify_one();
    // An answer bigger than the 4 MiB request limit is fine.
    let r = exec.await.unwrap().unwrap();
    assert_eq!(
        (r.exit_code, r.stdout.as_slice(), r.stderr.len()),
        (3, &b"hi\n"[..], 6 << 20)
    );
}

#[tokio::test]
async fn update_resources_sends_oci_json() {
    let dir = tempfile::tempdir().unwrap();
    fake_shim(dir.path(), |req| match req.kind? {
        request::Kind::Ping(_) => resp(ping()),
        request::Kind::UpdateResources(r) if r.container_id == "c" => {
            let v: serde_json::Value = serde_json::from_str(&r.resources_json).unwrap();
            assert_eq!(v["memory"]["limit"], 128 << 20);
            assert_eq!(v["cpu"]["shares"], 1024);
            assert_eq!(v["cpu"]["quota"], 50000);
            resp(response::Kind::UpdateResources(pb::UpdateResourcesResponse {}))
        }
        request::Kind::UpdateResources(r) if r.container_id == "stopped" => resp(response::Kind::Error(pb::Error {
            code: pb::ErrorCode::FailedPrecondition as i32,
            message: "stopped".into(),
        })),
        request::Kind::UpdateResources(_) => resp(response::Kind::Error(pb::Error {
            code: pb::ErrorCode::NotFound as i32,
            message: "no such container".into(),
        })),
        _ => None,
    });
    let c = ShimClient::connect(dir.path()).await.unwrap();
    let r: oci_spec::runtime::LinuxResources = serde_json::from_value(serde_json::json!({
        "memory": {"limit": 128 << 20},
        "cpu": {"shares": 1024, "quota": 50000, "period": 100000},
    }))
    .unwrap();
    c.update_resources("c", &r).await.unwrap();
    assert!(matches!(c.update_resources("x", &r).await, Err(ShimError::NotFound(_))));
    assert!(matches!(
        c.update_resources("stopped", &r).await,
        Err(ShimError::Remote {
            code: pb::ErrorCode::FailedPrecondition,
            ..
        })
    ));
}

#[tokio::test]
async fn shutdown_of_a_gone_shim_is_ok() {
    let dir = tempfile::tempdir().unwrap();
    let server = fake_shim(dir.path(), |req| match req.kind? {
        request::Kind::Ping(_) => resp(response::Kind::Ping(pb::PingResponse {
            pid: u32::MAX, // no such process: nothing to wait for
            version: "1".into(),
            sandbox_id: "sb".into(),
        })),
        _ => None,
    });
    let c = ShimClient::connect(dir.path()).await.unwrap();
    server.abort();
    std::fs::remove_file(dir.path().join(SOCKET_FILE)).unwrap();
    c.shutdown().await.unwrap();
    c.shutdown().await.unwrap();
}

#[tokio::test]
async fn oversized_frames_are_a_protocol_error() {
    let dir = tempfile::tempdir().unwrap();
    let listener = UnixListener::bind(dir.path().join(SOCKET_FILE)).unwrap();
    tokio::spawn(async move {
        let (mut s, _) = listener.accept().await.unwrap();
        let mut h = [0u8; 4];
        s.read_exact(&mut h).await.unwrap();
        s.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
        tokio::time::sleep(Duration::from_secs(5)).await;
    });
    assert!(matches!(
        ShimClient::connect(dir.path()).await,
        Err(ShimError::Protocol(_))
    ));
}

#[tokio::test]
async fn spawn_reports_why_the_shim_did_not_start() {
    let dir = tempfile::tempdir().unwrap();
    let script = dir.path().join("fake-shim");
    std::fs::write(&script, "#!/bin/sh\necho 'cannot do it' >&2\nexit 1\n").unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let opts = SpawnOptions {
        sandbox_id: "sb".into(),
        state_dir: dir.path().join("state"),
        shim_binary: script,
        log_level: "scute=debug".into(),
        cgroup_driver: crate::config::CgroupDriver::Cgroupfs,
        cgroup: "/scute/scute-shim-sb".into(),
    };
    match ShimClient::spawn(&opts).await {
        Err(ShimError::Start(m)) => assert_eq!(m, "cannot do it"),
        other => panic!("{:?}", other.map(|_| ())),
    }
    let opts = SpawnOptions {
        shim_binary: dir.path().join("missing"),
        ..opts
    };
    assert!(matches!(ShimClient::spawn(&opts).await, Err(ShimError::Start(_))));
}

#[test]
fn client_is_shareable_between_tasks() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<ShimClient>();
    fn assert_send<T: Send>() {}
    assert_send::<ShimSession>();
    assert_send::<SessionInput>();
    assert_send::<SessionOutputs>();
}

/// A fake shim whose ExecStream session echoes stdin as stdout, answers a resize with its
/// size on stderr and CloseStdin with exit 3; Attach is refused by container id.
fn fake_session_shim(dir: &Path) {
    let listener = UnixListener::bind(dir.join(SOCKET_FILE)).unwrap();
    tokio::spawn(async move {
        loop {
            let (mut s, _) = listener.accept().await.unwrap();
            tokio::spawn(async move {
                let mut h = [0u8; 4];
                let mut session = false;
                loop {
                    if s.read_exact(&mut h).await.is_err() {
                        return;
                    }
                    let mut p = vec![0u8; u32::from_be_bytes(h) as usize];
                    s.read_exact(&mut p).await.unwrap();
                    if !session {
                        let kind = match pb::Request::decode(p.as_slice()).unwrap().kind.unwrap() {
                            request::Kind::Ping(_) => ping(),
                            request::Kind::ExecStream(r) => {
                                assert_eq!(r.args, ["sh"]);
                                assert!(r.tty && r.stdin);
                                assert_eq!((r.width, r.height), (100, 30));
                                session = true;
                                response::Kind::ExecStream(pb::ExecStreamResponse { pid: 42 })
                            }
                            request::Kind::Attach(r) => response::Kind::Error(pb::Error {
                                code: if r.container_id == "gone" {
                                    pb::ErrorCode::NotFound
                                } else {
                                    pb::ErrorCode::FailedPrecondition
                                } as i32,
                                message: format!("cannot attach to {}", r.container_id),
                            }),
                            _ => return,
                        };
                        s.write_all(&encode(&pb::Response { kind: Some(kind) })).await.unwrap();
                        continue;
                    }
                    let out = match pb::SessionInput::decode(p.as_slice()).unwrap().kind.unwrap() {
                        pb::session_input::Kind::Stdin(b) => {
                            assert!(b.len() <= STDIN_FRAME);
                            pb::session_output::Kind::Stdout(b)
                        }
                        pb::session_input::Kind::Resize(r) => {
                            pb::session_output::Kind::Stderr(format!("{}x{}", r.width, r.height).into_bytes())
                        }
                        pb::session_input::Kind::CloseStdin(_) => {
                            pb::session_output::Kind::Exit(pb::SessionExit { exit_code: 3 })
                        }
                    };
                    let exit = matches!(out, pb::session_output::Kind::Exit(_));
                    // Byte by byte: the client reassembles frames from any reads.
                    for b in encode(&pb::SessionOutput { kind: Some(out) }) {
                        s.write_all(&[b]).await.unwrap();
                    }
                    if exit {
                        return;
                    }
                }
            });
        }
    });
}

#[tokio::test]
async fn exec_stream_and_attach_sessions() {
    let dir = tempfile::tempdir().unwrap();
    fake_session_shim(dir.path());
    let c = ShimClient::connect(dir.path()).await.unwrap();
    let opts = ExecStreamOptions {
        args: vec!["sh".into()],
        tty: true,
        stdin: true,
        width: 100,
        height: 30,
        ..Default::default()
    };
    let ShimSession {
        pid,
        tty,
        mut input,
        mut output,
    } = c.exec_stream("c", &opts).await.unwrap();
    assert_eq!((pid, tty), (42, true));
    // More than one frame's worth of stdin comes back whole.
    let data: Vec<u8> = (0..100_000u32).map(|i| i as u8).collect();
    input.stdin(&data).await.unwrap();
    let mut echoed = Vec::new();
    while echoed.len() < data.len() {
        // Cancelled reads lose nothing.
        match tokio::time::timeout(Duration::from_micros(50), output.next()).await {
            Err(_) => continue,
            Ok(Some(Ok(SessionOutput::Stdout(b)))) => echoed.extend_from_slice(&b),
            Ok(other) => panic!("{other:?}"),
        }
    }
    assert_eq!(echoed, data);
    input.resize(80, 24).await.unwrap();
    assert_eq!(
        output.next().await.unwrap().unwrap(),
        SessionOutput::Stderr(Bytes::from_static(b"80x24"))
    );
    input.close_stdin().await.unwrap();
    assert_eq!(output.next().await.unwrap().unwrap(), SessionOutput::Exit(3));
    assert!(output.next().await.is_none());
    assert!(output.next().await.is_none());

    let opts = AttachOptions {
        stdin: true,
        stdout: true,
        stderr: false,
    };
    assert!(matches!(c.attach("gone", &opts).await, Err(ShimError::NotFound(_))));
    assert!(matches!(
        c.attach("stopped", &opts).await,
        Err(ShimError::Remote {
            code: pb::ErrorCode::FailedPrecondition,
            ..
        })
    ));
}

#[test]
fn session_frames_are_parsed_from_any_split() {
    let mut wire = Vec::new();
    for kind in [
        pb::session_output::Kind::Stdout(b"a".to_vec()),
        pb::session_output::Kind::Stderr(Vec::new()),
        pb::session_output::Kind::Exit(pb::SessionExit { exit_code: 137 }),
    ] {
        wire.extend(encode(&pb::SessionOutput { kind: Some(kind) }));
    }
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    for b in wire {
        buf.extend_from_slice(&[b]);
        while let Some(out) = parse_session_frame(&mut buf).unwrap() {
            got.push(out);
        }
    }
    assert_eq!(
        got,
        [
            SessionOutput::Stdout(Bytes::from_static(b"a")),
            SessionOutput::Stderr(Bytes::new()),
            SessionOutput::Exit(137)
        ]
    );
    let mut buf = BytesMut::from(&u32::MAX.to_be_bytes()[..]);
    assert!(matches!(parse_session_frame(&mut buf), Err(ShimError::Protocol(_))));
    // An empty message has no kind: not something this client understands.
    let mut buf = BytesMut::from(&[0u8, 0, 0, 0][..]);
    assert!(matches!(parse_session_frame(&mut buf), Err(ShimError::Protocol(_))));
}

#[test]
fn exit_files() {
    let dir = tempfile::tempdir().unwrap();
    assert_eq!(read_exit_file(dir.path(), "c").unwrap(), None);
    std::fs::create_dir(dir.path().join(EXITS_DIR)).unwrap();
    std::fs::write(
        dir.path().join("exits/c.json"),
        r#"{"exit_code":137,"finished_at_ns":12}"#,
    )
    .unwrap();
    assert_eq!(
        read_exit_file(dir.path(), "c").unwrap(),
        Some(ExitRecord {
            exit_code: 137,
            finished_at_ns: 12,
            oom_killed: false,
        })
    );
    std::fs::write(
        dir.path().join("exits/c.json"),
        r#"{"exit_code":137,"finished_at_ns":12,"oom_killed":true}"#,
    )
    .unwrap();
    assert!(read_exit_file(dir.path(), "c").unwrap().unwrap().oom_killed);
}

#[test]
fn proc_stat_parsing() {
    let stat = "1234 (we ird) name)) S 1 1234 1234 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 987654 1000 10";
    assert_eq!(parse_stat(stat), Some(('S', 987654)));
    assert_eq!(parse_stat("garbage"), None);
    let me = ProcId::of(std::process::id()).unwrap();
    assert!(me.alive());
    assert!(!ProcId {
        start_time: me.start_time + 1,
        ..me
    }
    .alive());
}

#[tokio::test]
async fn exited_within_waits_for_the_exit() {
    let mut child = std::process::Command::new("sleep").arg("0.3").spawn().unwrap();
    let proc_id = ProcId::of(child.id()).unwrap();
    assert!(!proc_id.exited_within(Duration::from_millis(20)).await);
    // Unreaped, it stays a zombie: that counts as exited.
    assert!(proc_id.exited_within(Duration::from_secs(10)).await);
    assert!(!proc_id.alive());
    child.wait().unwrap();
    // Another process's start time: not this one, so it has exited.
    let me = ProcId::of(std::process::id()).unwrap();
    let other = ProcId {
        start_time: me.start_time + 1,
        ..me
    };
    assert!(other.exited_within(Duration::from_secs(10)).await);
}

/// The pidfd path itself (`exited_within` falls back to polling /proc, which gives the same
/// answers 10 ms later): it wakes at the exit, and only then.
#[tokio::test]
async fn the_exit_wakes_the_pidfd() {
    let mut child = std::process::Command::new("sleep").arg("0.3").spawn().unwrap();
    let proc_id = ProcId::of(child.id()).unwrap();
    let soon = || tokio::time::Instant::now() + Duration::from_millis(20);
    assert_eq!(until_readable(proc_id.pidfd(), soon()).await, Some(false));
    let later = tokio::time::Instant::now() + Duration::from_secs(10);
    assert_eq!(until_readable(proc_id.pidfd(), later).await, Some(true));
    assert!(!proc_id.alive(), "woken before the exit");
    child.wait().unwrap();
    assert_eq!(until_readable(None, soon()).await, None);
}
