//! Streaming as a client sees it: Exec, Attach and PortForward URLs used over SPDY/3.1 and
//! WebSocket by a Rust client speaking the kubelet's protocols (stdout/stderr separation, exit
//! codes in the v4 status, terminals and resize, stdin EOF, attach, port-forward inside a pod's
//! network namespace and on the host network, one-time tokens), and sessions against daemon
//! restarts and vanishing clients.

mod common;

use std::time::Duration;

use bytes::Bytes;
use common::pod::{container, pod, pod_with, Pod};
use futures_util::{SinkExt, StreamExt};
use scute::api;
use scute::streaming::spdy::{Connection, Incoming, RecvStream, Role, SendStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::Message;

const WAIT: Duration = Duration::from_secs(20);

/// Host:port and path of a session URL.
fn split_url(url: &str) -> (String, String) {
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"))
        .expect("an http(s) URL");
    let slash = rest.find('/').unwrap();
    (rest[..slash].to_string(), rest[slash..].to_string())
}

/// The HTTP part of a SPDY session: POST with the upgrade headers; returns the status code, the
/// negotiated protocol and the connection.
async fn spdy_upgrade(url: &str, protocols: &[&str]) -> (u16, String, TcpStream) {
    let (host, path) = split_url(url);
    let tcp = TcpStream::connect(&host).await.unwrap();
    upgrade_on(tcp, &host, &path, protocols).await
}

async fn upgrade_on<IO>(mut io: IO, host: &str, path: &str, protocols: &[&str]) -> (u16, String, IO)
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    let mut request = format!("POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n");
    for p in protocols {
        request.push_str(&format!("X-Stream-Protocol-Version: {p}\r\n"));
    }
    request.push_str("Content-Length: 0\r\n\r\n");
    io.write_all(request.as_bytes()).await.unwrap();
    // Byte by byte up to the blank line: nothing after it may be consumed here.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        if io.read(&mut byte).await.unwrap() == 0 {
            break;
        }
        head.push(byte[0]);
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let protocol = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("x-stream-protocol-version:")
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default();
    (status, protocol, io)
}

async fn spdy_session(url: &str, protocols: &[&str]) -> (Connection, Incoming, String) {
    let (status, protocol, tcp) = spdy_upgrade(url, protocols).await;
    assert_eq!(status, 101, "upgrade of {url} refused");
    let (conn, incoming) = Connection::new(tcp, Role::Client);
    (conn, incoming, protocol)
}

/// Opens a stream of `kind` with extra headers and waits for the server's reply.
async fn open(conn: &Connection, kind: &str, extra: &[(&str, &str)]) -> (RecvStream, SendStream) {
    let mut headers = vec![("streamtype".to_string(), kind.to_string())];
    headers.extend(extra.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let stream = tokio::time::timeout(WAIT, conn.open(headers, false))
        .await
        .unwrap()
        .unwrap();
    let (mut recv, send) = stream.split();
    tokio::time::timeout(WAIT, recv.reply_headers()).await.unwrap().unwrap();
    (recv, send)
}

/// Everything a stream carries until its end.
async fn read_all(recv: &mut RecvStream) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(chunk) = tokio::time::timeout(WAIT, recv.recv()).await.expect("stream stalled") {
        out.extend_from_slice(&chunk);
    }
    out
}

/// Reads until `needle` has appeared; returns all read.
async fn read_until(recv: &mut RecvStream, needle: &str) -> String {
    let mut out = Vec::new();
    while !String::from_utf8_lossy(&out).contains(needle) {
        match tokio::time::timeout(WAIT, recv.recv()).await {
            Ok(Some(chunk)) => out.extend_from_slice(&chunk),
            _ => panic!("{needle:?} never came; got {:?}", String::from_utf8_lossy(&out)),
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Asks the terminal's size with `stty size` until it answers `want` ("rows cols"). A resize
/// travels on its own stream, so a command typed just after it may run before it lands (as with
/// every runtime: kubectl's first resize races the shell's start too); what a user sees is that
/// it lands.
async fn wait_for_size(stdin: &mut SendStream, stdout: &mut RecvStream, want: &str) -> String {
    let mut seen = Vec::new();
    let deadline = tokio::time::Instant::now() + WAIT;
    while tokio::time::Instant::now() < deadline {
        stdin.send(b"stty size\n").await.unwrap();
        let asked = tokio::time::Instant::now();
        while let Ok(Some(chunk)) = tokio::time::timeout_at(asked + Duration::from_millis(300), stdout.recv()).await {
            seen.extend_from_slice(&chunk);
            if String::from_utf8_lossy(&seen).contains(want) {
                return String::from_utf8_lossy(&seen).into_owned();
            }
        }
    }
    panic!(
        "the terminal never reported {want:?}; got {:?}",
        String::from_utf8_lossy(&seen)
    );
}

/// The exit code in a v4 status (0 for Success).
fn exit_code_of(status: &[u8]) -> i32 {
    let v: serde_json::Value = serde_json::from_slice(status)
        .unwrap_or_else(|e| panic!("status is not JSON ({e}): {:?}", String::from_utf8_lossy(status)));
    if v["status"] == "Success" {
        return 0;
    }
    assert_eq!(v["reason"], "NonZeroExitCode", "{v}");
    v["details"]["causes"][0]["message"].as_str().unwrap().parse().unwrap()
}

async fn exec_url(pod: &Pod, id: &str, cmd: &[&str], tty: bool, stdin: bool) -> String {
    pod.daemon
        .runtime()
        .await
        .exec(api::ExecRequest {
            container_id: id.into(),
            cmd: cmd.iter().map(|s| s.to_string()).collect(),
            tty,
            stdin,
            stdout: true,
            stderr: !tty,
        })
        .await
        .unwrap()
        .into_inner()
        .url
}

async fn attach_url(pod: &Pod, id: &str) -> String {
    pod.daemon
        .runtime()
        .await
        .attach(api::AttachRequest {
            container_id: id.into(),
            stdin: true,
            stdout: true,
            stderr: true,
            tty: false,
        })
        .await
        .unwrap()
        .into_inner()
        .url
}

async fn port_forward_url(pod: &Pod, sandbox_id: &str, ports: &[i32]) -> String {
    pod.daemon
        .runtime()
        .await
        .port_forward(api::PortForwardRequest {
            pod_sandbox_id: sandbox_id.into(),
            port: ports.to_vec(),
        })
        .await
        .unwrap()
        .into_inner()
        .url
}

/// A running container idling, for exec.
async fn idle_container(pod: &Pod, name: &str) -> String {
    pod.run(container(name, "exec sleep 3600")).await
}

async fn websocket(url: &str, protocols: &str) -> (tokio_tungstenite::WebSocketStream<TcpStream>, String) {
    let (host, _) = split_url(url);
    let mut request = url.replace("http://", "ws://").into_client_request().unwrap();
    request
        .headers_mut()
        .insert("Sec-WebSocket-Protocol", protocols.parse().unwrap());
    let tcp = TcpStream::connect(&host).await.unwrap();
    let (socket, response) = tokio_tungstenite::client_async(request, tcp).await.unwrap();
    let protocol = response
        .headers()
        .get("Sec-WebSocket-Protocol")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (socket, protocol)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_over_spdy_separates_streams_and_reports_the_exit_code() {
    let pod = pod("spdyexec").await;
    let id = idle_container(&pod, "idle").await;
    let url = exec_url(&pod, &id, &["sh", "-c", "echo out; echo err >&2; exit 3"], false, false).await;
    let protocols = ["v5.channel.k8s.io", "v4.channel.k8s.io", "v3.channel.k8s.io"];
    let (conn, _incoming, protocol) = spdy_session(&url, &protocols).await;
    assert_eq!(protocol, "v5.channel.k8s.io");
    let (mut error, _e) = open(&conn, "error", &[]).await;
    let (mut stdout, _o) = open(&conn, "stdout", &[]).await;
    let (mut stderr, _r) = open(&conn, "stderr", &[]).await;
    assert_eq!(read_all(&mut stdout).await, b"out\n");
    assert_eq!(read_all(&mut stderr).await, b"err\n");
    assert_eq!(exit_code_of(&read_all(&mut error).await), 3);
    tokio::time::timeout(WAIT, conn.closed())
        .await
        .expect("the server closes the session");

    // The URL was single use; an unknown token is no better.
    let (status, _, _) = spdy_upgrade(&url, &protocols).await;
    assert_eq!(status, 404);
    let (host, _) = split_url(&url);
    let (status, _, _) = spdy_upgrade(&format!("http://{host}/exec/nonsense"), &protocols).await;
    assert_eq!(status, 404);
    // A protocol the server does not speak is refused with the list of those it does.
    let url = exec_url(&pod, &id, &["true"], false, false).await;
    let (status, _, _) = spdy_upgrade(&url, &["v9.channel.k8s.io"]).await;
    assert_eq!(status, 403);

    // Bad requests are refused at the RPC.
    let mut runtime = pod.daemon.runtime().await;
    let refused = |request: api::ExecRequest| {
        let mut runtime = runtime.clone();
        async move { runtime.exec(request).await.unwrap_err().code() }
    };
    let base = api::ExecRequest {
        container_id: id.clone(),
        cmd: vec!["true".into()],
        stdout: true,
        ..Default::default()
    };
    assert_eq!(
        refused(api::ExecRequest {
            tty: true,
            stderr: true,
            ..base.clone()
        })
        .await,
        tonic::Code::InvalidArgument
    );
    assert_eq!(
        refused(api::ExecRequest {
            cmd: vec![],
            ..base.clone()
        })
        .await,
        tonic::Code::InvalidArgument
    );
    assert_eq!(
        refused(api::ExecRequest {
            container_id: "nope".into(),
            ..base.clone()
        })
        .await,
        tonic::Code::NotFound
    );
    let status = runtime
        .port_forward(api::PortForwardRequest {
            pod_sandbox_id: "nope".into(),
            port: vec![80],
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), tonic::Code::NotFound);
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_with_a_terminal_over_spdy_echoes_and_resizes() {
    let pod = pod("spdytty").await;
    let id = idle_container(&pod, "idle").await;
    let url = exec_url(&pod, &id, &["sh"], true, true).await;
    let (conn, _incoming, _) = spdy_session(&url, &["v4.channel.k8s.io"]).await;
    let (mut error, _e) = open(&conn, "error", &[]).await;
    let (_si, mut stdin) = open(&conn, "stdin", &[]).await;
    let (mut stdout, _o) = open(&conn, "stdout", &[]).await;
    let (_rz, mut resize) = open(&conn, "resize", &[]).await;
    resize.send(br#"{"Width":100,"Height":40}"#).await.unwrap();
    stdin.send(b"tty\n").await.unwrap();
    read_until(&mut stdout, "/dev/pts/").await;
    wait_for_size(&mut stdin, &mut stdout, "40 100").await;
    resize.send(br#"{"Width":81,"Height":27}"#).await.unwrap();
    wait_for_size(&mut stdin, &mut stdout, "27 81").await;
    stdin.send(b"exit 7\n").await.unwrap();
    read_all(&mut stdout).await;
    assert_eq!(exit_code_of(&read_all(&mut error).await), 7);
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_over_websocket_with_stdin_eof() {
    let pod = pod("wsexec").await;
    let id = idle_container(&pod, "idle").await;

    // v5, binary channels: stdout and stderr apart, exit code in the status on channel 3.
    let url = exec_url(&pod, &id, &["sh", "-c", "echo out; echo err >&2; exit 3"], false, false).await;
    let (mut socket, protocol) = websocket(&url, "v5.channel.k8s.io, v4.channel.k8s.io").await;
    assert_eq!(protocol, "v5.channel.k8s.io");
    let (mut out, mut err, mut status) = (Vec::new(), Vec::new(), Vec::new());
    while let Some(Ok(message)) = tokio::time::timeout(WAIT, socket.next()).await.unwrap() {
        let Message::Binary(data) = message else { continue };
        match data.first() {
            Some(1) => out.extend_from_slice(&data[1..]),
            Some(2) => err.extend_from_slice(&data[1..]),
            Some(3) => status.extend_from_slice(&data[1..]),
            _ => {}
        }
    }
    assert_eq!((out.as_slice(), err.as_slice()), (&b"out\n"[..], &b"err\n"[..]));
    assert_eq!(exit_code_of(&status), 3);

    // Stdin, then v5's close of stdin: cat sees EOF and ends.
    let url = exec_url(&pod, &id, &["cat"], false, true).await;
    let (mut socket, _) = websocket(&url, "v5.channel.k8s.io").await;
    socket
        .send(Message::Binary(Bytes::from_static(b"\x00hello cat\n")))
        .await
        .unwrap();
    socket
        .send(Message::Binary(Bytes::from_static(b"\xff\x00")))
        .await
        .unwrap();
    let (mut out, mut status) = (Vec::new(), Vec::new());
    while let Some(Ok(message)) = tokio::time::timeout(WAIT, socket.next())
        .await
        .expect("cat never ended")
    {
        let Message::Binary(data) = message else { continue };
        match data.first() {
            Some(1) => out.extend_from_slice(&data[1..]),
            Some(3) => status.extend_from_slice(&data[1..]),
            _ => {}
        }
    }
    assert_eq!(out, b"hello cat\n");
    assert_eq!(exit_code_of(&status), 0);

    // The base64 variant: text frames, channel as a digit.
    let url = exec_url(&pod, &id, &["echo", "b64"], false, false).await;
    let (mut socket, protocol) = websocket(&url, "v4.base64.channel.k8s.io").await;
    assert_eq!(protocol, "v4.base64.channel.k8s.io");
    let mut out = String::new();
    while let Some(Ok(message)) = tokio::time::timeout(WAIT, socket.next()).await.unwrap() {
        if let Message::Text(text) = message {
            if let Some(b64) = text.strip_prefix('1') {
                use base64::Engine;
                let bytes = base64::engine::general_purpose::STANDARD.decode(b64).unwrap();
                out.push_str(&String::from_utf8_lossy(&bytes));
            }
        }
    }
    assert_eq!(out, "b64\n");
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_over_spdy_and_websocket_and_across_a_daemon_restart() {
    let mut pod = pod("attach").await;
    let mut config = container("echoer", "while read line; do echo got $line; done; echo stdin-closed");
    config.stdin = true;
    let id = pod.run(config).await;

    let url = attach_url(&pod, &id).await;
    let (conn, _incoming, _) = spdy_session(&url, &["v4.channel.k8s.io"]).await;
    let (_e, _es) = open(&conn, "error", &[]).await;
    let (mut stdin_back, mut stdin) = open(&conn, "stdin", &[]).await;
    let (mut stdout, _o) = open(&conn, "stdout", &[]).await;
    let (_r, _rs) = open(&conn, "stderr", &[]).await;
    // client-go reads the server's side of stdin and stops sending when it ends.
    let early_end = tokio::time::timeout(Duration::from_millis(500), stdin_back.recv()).await;
    assert!(early_end.is_err(), "the server ended its side of stdin: {early_end:?}");
    stdin.send(b"one\n").await.unwrap();
    read_until(&mut stdout, "got one").await;
    // Detaching leaves the container running, its stdin open.
    drop((conn, stdin, stdout));

    let url = attach_url(&pod, &id).await;
    let (mut socket, _) = websocket(&url, "v4.channel.k8s.io").await;
    socket
        .send(Message::Binary(Bytes::from_static(b"\x00two\n")))
        .await
        .unwrap();
    let mut out = Vec::new();
    while !String::from_utf8_lossy(&out).contains("got two") {
        match tokio::time::timeout(WAIT, socket.next()).await.unwrap() {
            Some(Ok(Message::Binary(data))) if data.first() == Some(&1) => out.extend_from_slice(&data[1..]),
            Some(Ok(_)) => {}
            other => panic!("attach ended early: {other:?}"),
        }
    }

    // The daemon goes away mid-session: the container keeps running and can be attached again.
    pod.daemon.kill();
    drop(socket);
    pod.daemon.start_again();
    assert_eq!(pod.status(&id).await.state(), api::ContainerState::ContainerRunning);
    let url = attach_url(&pod, &id).await;
    let (conn, _incoming, _) = spdy_session(&url, &["v4.channel.k8s.io"]).await;
    let (_e, _es) = open(&conn, "error", &[]).await;
    let (_si, mut stdin) = open(&conn, "stdin", &[]).await;
    let (mut stdout, _o) = open(&conn, "stdout", &[]).await;
    let (_r, _rs) = open(&conn, "stderr", &[]).await;
    stdin.send(b"three\n").await.unwrap();
    read_until(&mut stdout, "got three").await;
    let log = pod.wait_log("echoer", "got three").await;
    assert!(log.contains("got one") && log.contains("got two"), "{log}");
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_goes_away_frees_its_process() {
    let pod = pod("vanish").await;
    let id = idle_container(&pod, "idle").await;
    let url = exec_url(&pod, &id, &["sh", "-c", "echo started; exec sleep 4242"], false, false).await;
    let client = {
        let (conn, incoming, _) = spdy_session(&url, &["v4.channel.k8s.io"]).await;
        let error = open(&conn, "error", &[]).await;
        let mut stdout = open(&conn, "stdout", &[]).await;
        let stderr = open(&conn, "stderr", &[]).await;
        read_until(&mut stdout.0, "started").await;
        (conn, incoming, error, stdout, stderr)
    };
    async fn running(pod: &Pod, id: &str) -> bool {
        let out = pod.exec(id, &["ps", "-o", "args"], 10).await.unwrap();
        String::from_utf8_lossy(&out.stdout).contains("sleep 4242")
    }
    assert!(running(&pod, &id).await);
    // The client vanishes: every handle, and so the connection, goes.
    drop(client);
    let mut gone = false;
    for _ in 0..100 {
        if !running(&pod, &id).await {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the exec'd process outlived its client");
    pod.remove_all().await;
}

/// A web server in the pod (busybox httpd on `port`) answering `body`.
async fn web_server(pod: &Pod, name: &str, port: u16, body: &str) {
    let script = format!("mkdir -p /www && echo {body} > /www/index.html && exec httpd -f -p {port} -h /www");
    pod.run(container(name, &script)).await;
    // Ready when it answers from inside.
    for _ in 0..100 {
        let probe = pod
            .exec(
                &pod.daemon
                    .runtime()
                    .await
                    .list_containers(api::ListContainersRequest::default())
                    .await
                    .unwrap()
                    .into_inner()
                    .containers
                    .into_iter()
                    .find(|c| c.metadata.as_ref().unwrap().name == name)
                    .unwrap()
                    .id,
                &["wget", "-qO-", &format!("http://127.0.0.1:{port}/")],
                5,
            )
            .await
            .unwrap();
        if String::from_utf8_lossy(&probe.stdout).contains(body) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("httpd on port {port} never answered");
}

/// One HTTP GET through a SPDY port-forward connection (data + error stream pair).
async fn get_over_spdy(conn: &Connection, port: u16, request_id: &str) -> String {
    let port = port.to_string();
    let headers = [("port", port.as_str()), ("requestid", request_id)];
    let (mut error, _es) = open(conn, "error", &headers).await;
    let (mut data, mut data_send) = open(conn, "data", &headers).await;
    data_send.send(b"GET / HTTP/1.0\r\n\r\n").await.unwrap();
    data_send.finish().await.unwrap();
    let answer = String::from_utf8_lossy(&read_all(&mut data).await).into_owned();
    let error = read_all(&mut error).await;
    assert!(error.is_empty(), "error stream: {}", String::from_utf8_lossy(&error));
    answer
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_into_the_pod_network_over_every_transport() {
    let pod = pod_with("pf", Some(vec![])).await;
    web_server(&pod, "web", 8080, "hello-from-the-pod").await;

    // SPDY, several connections over one session.
    let url = port_forward_url(&pod, &pod.id, &[]).await;
    let (conn, _incoming, protocol) = spdy_session(&url, &["portforward.k8s.io"]).await;
    assert_eq!(protocol, "portforward.k8s.io");
    for request in ["0", "1", "2"] {
        let answer = get_over_spdy(&conn, 8080, request).await;
        assert!(answer.contains("hello-from-the-pod"), "{answer}");
    }
    // A port nobody listens on: the error stream says so, the session lives on.
    let headers = [("port", "8081"), ("requestid", "9")];
    let (mut error, _es) = open(&conn, "error", &headers).await;
    let (_d, _ds) = open(&conn, "data", &headers).await;
    let message = String::from_utf8_lossy(&read_all(&mut error).await).into_owned();
    assert!(message.contains("8081"), "{message}");
    assert!(get_over_spdy(&conn, 8080, "10").await.contains("hello-from-the-pod"));
    drop(conn);

    // SPDY tunnelled through WebSocket (client-go's port-forward over WebSocket).
    let url = port_forward_url(&pod, &pod.id, &[]).await;
    let (socket, protocol) = websocket(&url, "SPDY/3.1+portforward.k8s.io").await;
    assert_eq!(protocol, "SPDY/3.1+portforward.k8s.io");
    let (ours, theirs) = tokio::io::duplex(64 << 10);
    tokio::spawn(pump_tunnel(socket, theirs));
    let (conn, _incoming) = Connection::new(ours, Role::Client);
    assert!(get_over_spdy(&conn, 8080, "0").await.contains("hello-from-the-pod"));
    drop(conn);

    // The kubelet's channel protocol: data channel 0 and error channel 1, each opened by the port.
    let url = port_forward_url(&pod, &pod.id, &[8080]).await;
    let (mut socket, protocol) = websocket(&url, "v4.channel.k8s.io").await;
    assert_eq!(protocol, "v4.channel.k8s.io");
    socket
        .send(Message::Binary(Bytes::from_static(b"\x00GET / HTTP/1.0\r\n\r\n")))
        .await
        .unwrap();
    let mut prefixes = 0;
    let mut answer = Vec::new();
    while !String::from_utf8_lossy(&answer).contains("hello-from-the-pod") {
        match tokio::time::timeout(WAIT, socket.next()).await.unwrap() {
            Some(Ok(Message::Binary(data))) => match data.first() {
                Some(0) | Some(1) if data.len() == 3 && data[1..] == 8080u16.to_le_bytes() && prefixes < 2 => {
                    prefixes += 1
                }
                Some(0) => answer.extend_from_slice(&data[1..]),
                Some(1) => panic!("error channel: {}", String::from_utf8_lossy(&data[1..])),
                _ => {}
            },
            Some(Ok(_)) => {}
            other => panic!("port-forward ended early: {other:?}"),
        }
    }
    assert_eq!(prefixes, 2);
    pod.remove_all().await;
}

/// Carries bytes between a WebSocket (binary messages) and a byte stream, as client-go's
/// tunnelling connection does.
async fn pump_tunnel(socket: tokio_tungstenite::WebSocketStream<TcpStream>, stream: tokio::io::DuplexStream) {
    let (mut sink, mut source) = socket.split();
    let (mut read, mut write) = tokio::io::split(stream);
    let inbound = async {
        while let Some(Ok(message)) = source.next().await {
            if let Message::Binary(data) = message {
                if write.write_all(&data).await.is_err() {
                    break;
                }
            }
        }
    };
    let outbound = async {
        let mut buf = vec![0u8; 16 << 10];
        while let Ok(n) = read.read(&mut buf).await {
            if n == 0
                || sink
                    .send(Message::Binary(Bytes::copy_from_slice(&buf[..n])))
                    .await
                    .is_err()
            {
                break;
            }
        }
    };
    tokio::select! {
        _ = inbound => {}
        _ = outbound => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_to_a_host_network_pod() {
    let pod = pod("pfhost").await;
    let port = common::free_port();
    web_server(&pod, "web", port, "hello-from-the-host-network").await;
    let url = port_forward_url(&pod, &pod.id, &[]).await;
    let (conn, _incoming, _) = spdy_session(&url, &["portforward.k8s.io"]).await;
    let answer = get_over_spdy(&conn, port, "0").await;
    assert!(answer.contains("hello-from-the-host-network"), "{answer}");
    drop(conn);
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_over_tls() {
    let certs = tempfile::tempdir().unwrap();
    let (cert, key) = common::self_signed_cert(certs.path());
    let extra = format!("[streaming]\ntls_cert = {cert:?}\ntls_key = {key:?}\n");
    let pod = common::pod::pod_full("tlsexec", None, &extra, "").await;
    let id = idle_container(&pod, "idle").await;
    let url = exec_url(&pod, &id, &["sh", "-c", "echo over-tls; exit 2"], false, false).await;
    assert!(url.starts_with("https://127.0.0.1:"), "{url}");

    let mut roots = rustls::RootCertStore::empty();
    use rustls_pki_types::pem::PemObject;
    for c in rustls_pki_types::CertificateDer::pem_file_iter(&cert).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let config = rustls::ClientConfig::builder()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let connector = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    let (host, path) = split_url(&url);
    let tcp = TcpStream::connect(&host).await.unwrap();
    let server_name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = connector
        .connect(server_name, tcp)
        .await
        .expect("TLS handshake with the streaming server");
    let (status, _, tls) = upgrade_on(tls, &host, &path, &["v4.channel.k8s.io"]).await;
    assert_eq!(status, 101);
    let (conn, _incoming) = Connection::new(tls, Role::Client);
    let (mut error, _e) = open(&conn, "error", &[]).await;
    let (mut stdout, _o) = open(&conn, "stdout", &[]).await;
    let (_r, _rs) = open(&conn, "stderr", &[]).await;
    assert_eq!(read_all(&mut stdout).await, b"over-tls\n");
    assert_eq!(exit_code_of(&read_all(&mut error).await), 2);
    pod.remove_all().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sessions_are_bounded_in_number_and_idle_time() {
    let extra = "[streaming]\nmax_sessions = 1\nidle_timeout_seconds = 2\n";
    let pod = common::pod::pod_full("bounded", None, extra, "").await;
    let id = idle_container(&pod, "idle").await;
    let url = exec_url(&pod, &id, &["sh", "-c", "echo started; exec sleep 4243"], false, false).await;
    let (conn, _incoming, _) = spdy_session(&url, &["v4.channel.k8s.io"]).await;
    let (_e, _es) = open(&conn, "error", &[]).await;
    let (mut stdout, _o) = open(&conn, "stdout", &[]).await;
    let (_r, _rs) = open(&conn, "stderr", &[]).await;
    read_until(&mut stdout, "started").await;

    // The one session allowed is taken.
    let second = exec_url(&pod, &id, &["true"], false, false).await;
    let (status, _, _) = spdy_upgrade(&second, &["v4.channel.k8s.io"]).await;
    assert_eq!(status, 503);

    // Nothing moves for the idle timeout: the server closes the session and its process goes.
    tokio::time::timeout(Duration::from_secs(10), conn.closed())
        .await
        .expect("the idle session was not closed");
    let mut gone = false;
    for _ in 0..50 {
        let out = pod.exec(&id, &["ps", "-o", "args"], 10).await.unwrap();
        if !String::from_utf8_lossy(&out.stdout).contains("sleep 4243") {
            gone = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(gone, "the idle session's process outlived it");
    let url = exec_url(&pod, &id, &["echo", "again"], false, false).await;
    let (conn, _incoming, _) = spdy_session(&url, &["v4.channel.k8s.io"]).await;
    let (mut error, _e) = open(&conn, "error", &[]).await;
    let (mut stdout, _o) = open(&conn, "stdout", &[]).await;
    let (_r, _rs) = open(&conn, "stderr", &[]).await;
    assert_eq!(read_all(&mut stdout).await, b"again\n");
    assert_eq!(exit_code_of(&read_all(&mut error).await), 0);
    pod.remove_all().await;
}

/// Descriptors a process holds.
fn fd_count(pid: i32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.count())
        .unwrap_or(0)
}

/// Thousands of streaming requests (containerd CVE-2022-31030 and CVE-2025-64329 grew the
/// daemon's memory through streaming): 2000 Exec RPCs at once park at most 1000 URLs (the
/// kubelet's cache size), the others are ResourceExhausted naming the limit; 64 clients then
/// connect at once for `max_sessions` = 16: 16 sessions run their process in the container,
/// the rest are answered 503; the daemon's and the shim's memory stay within the bounds below,
/// ExecSync on the same container answers meanwhile, and once the clients go their processes
/// go and the shim's descriptors are back where they were.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn thousands_of_streaming_requests_stay_bounded() {
    const REQUESTS: usize = 2000;
    const PARKED: usize = 1000;
    const SESSIONS: usize = 16;
    const CLIENTS: usize = 64;
    let pod = common::pod::pod_full("crowd", None, "[streaming]\nmax_sessions = 16\n", "").await;
    let id = idle_container(&pod, "idle").await;
    let daemon_pid = pod.daemon.pid().as_raw();
    let shims = common::shims_of(pod.daemon.dir());
    assert_eq!(shims.len(), 1, "{shims:?}");
    let shim = shims[0].0;
    let daemon_before = common::status_kib(daemon_pid, "VmHWM").unwrap();
    let (shim_rss_before, shim_fds_before) = (common::status_kib(shim, "VmRSS").unwrap(), fd_count(shim));

    let client = pod.daemon.runtime().await;
    let cmd: Vec<String> = ["sh", "-c", "echo started; exec sleep 4244"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let requests = (0..REQUESTS).map(|_| {
        let mut client = client.clone();
        let request = api::ExecRequest {
            container_id: id.clone(),
            cmd: cmd.clone(),
            stdout: true,
            stderr: true,
            ..Default::default()
        };
        async move { client.exec(request).await.map(|r| r.into_inner().url) }
    });
    let results = futures_util::stream::iter(requests)
        .buffer_unordered(200)
        .collect::<Vec<_>>()
        .await;
    let (urls, refused): (Vec<_>, Vec<_>) = results.into_iter().partition(|r| r.is_ok());
    let urls: Vec<String> = urls.into_iter().map(Result::unwrap).collect();
    assert_eq!(urls.len(), PARKED, "URLs parked");
    for status in refused.into_iter().map(Result::unwrap_err) {
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status:?}");
        assert!(status.message().contains(&PARKED.to_string()), "{}", status.message());
    }

    // The crowd connects at once: as many sessions as allowed, each with its process running.
    let upgrades = urls[..CLIENTS]
        .iter()
        .map(|url| spdy_upgrade(url, &["v4.channel.k8s.io"]));
    let answers = futures_util::future::join_all(upgrades).await;
    let mut sessions = Vec::new();
    let mut turned_away = 0;
    for (status, _, tcp) in answers {
        match status {
            101 => {
                let (conn, incoming) = Connection::new(tcp, Role::Client);
                let error = open(&conn, "error", &[]).await;
                let mut stdout = open(&conn, "stdout", &[]).await;
                let stderr = open(&conn, "stderr", &[]).await;
                read_until(&mut stdout.0, "started").await;
                sessions.push((conn, incoming, error, stdout, stderr));
            }
            503 => turned_away += 1,
            other => panic!("an upgrade answered {other}"),
        }
    }
    assert_eq!(sessions.len(), SESSIONS, "sessions running");
    assert_eq!(turned_away, CLIENTS - SESSIONS, "clients turned away");
    async fn sleepers(pod: &Pod, id: &str) -> usize {
        let out = pod
            .exec(id, &["ps", "-o", "args"], 10)
            .await
            .expect("ExecSync meanwhile");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter(|l| l.contains("sleep 4244"))
            .count()
    }
    assert_eq!(sleepers(&pod, &id).await, SESSIONS);

    let daemon_growth = common::status_kib(daemon_pid, "VmHWM")
        .unwrap()
        .saturating_sub(daemon_before);
    let shim_growth = common::status_kib(shim, "VmRSS")
        .unwrap()
        .saturating_sub(shim_rss_before);
    eprintln!(
        "{REQUESTS} Exec requests, {SESSIONS} sessions: daemon peak RSS +{daemon_growth} KiB, \
         shim RSS +{shim_growth} KiB ({} fds, {shim_fds_before} before)",
        fd_count(shim)
    );
    assert!(daemon_growth < 32 << 10, "the daemon grew by {daemon_growth} KiB");
    assert!(shim_growth < 4 << 10, "the shim grew by {shim_growth} KiB");

    // The clients go: their processes, and the shim's descriptors for them, go too.
    drop(sessions);
    let mut settled = false;
    for _ in 0..100 {
        if sleepers(&pod, &id).await == 0 && fd_count(shim) <= shim_fds_before {
            settled = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        settled,
        "after the clients left: {} sessions' processes, {} shim fds ({shim_fds_before} before)",
        sleepers(&pod, &id).await,
        fd_count(shim)
    );
    pod.remove_all().await;
}
