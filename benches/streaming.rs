//! Streaming benchmark: exec round-trip latency and port-forward throughput over SPDY/3.1, printed
//! side by side with containerd's CRI plugin (runc) when `containerd` and `runc` are on PATH.
//!
//!   cargo bench --bench streaming     (SCUTE_BENCH_STREAMING=N exec sessions, default 50; 3 without --bench)
//!
//! Exec: N sequential sessions of `echo hi` (stdout and stderr, no stdin, no tty) in a running busybox
//! container, each timed from the Exec RPC to the v4 status on the error stream: the RPC, the HTTP
//! upgrade to SPDY/3.1 (v4.channel.k8s.io), the error, stdout and stderr streams opened one after the
//! other as client-go opens them (each waiting for its SYN_REPLY), then the three streams read to their
//! end. Every session must print "hi\n", nothing on stderr, and end with status Success.
//!
//! Port-forward: busybox `httpd` in a second container serves a 100 MB file (written with `head -c` in
//! the container); one port-forward connection (portforward.k8s.io: an error and a data stream paired
//! by requestid) carries `GET /big HTTP/1.0`, and the body's bytes after the HTTP head are counted
//! (they must be 100000000 zeros). MB/s is from sending the request to the body's last byte; setup
//! (RPC, upgrade, streams) is printed apart, and so is how long after the last byte the server ended
//! the data stream. 3 downloads (1 without --bench), each on its own session: the median is printed.
//!
//! The client is scute's own SPDY implementation (`scute::streaming::spdy`, client role) with the HTTP
//! upgrade written by hand, the same code for both runtimes (containerd's streaming server is the
//! kubelet's Go one, on http://127.0.0.1 with a random port). Pods use the host network, as in the
//! containers benchmark, so httpd listens on a free host port. Both runtimes pull busybox from one local
//! registry filled by images/build.sh. Figures are printed, never asserted. Everything started is
//! stopped and removed on drop, also on a panic: daemons, leftover shims and container processes,
//! mounts, netns, cgroups, the registry, temp dirs.

use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use scute::api;
use scute::api::image_service_client::ImageServiceClient;
use scute::api::runtime_service_client::RuntimeServiceClient;
use scute::streaming::spdy::{Connection, Incoming, RecvStream, Role, RstStatus, SendStream};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::transport::Channel;

/// Size of the file served by httpd.
const FILE_BYTES: u64 = 100_000_000;
/// Longest wait for one step of a session (a stream reply, the next chunk of data).
const STEP_TIMEOUT: Duration = Duration::from_secs(30);
// Daemon, registry and host-state helpers shared with the other CRI benchmarks.
include!("common/harness.rs");

fn pod_config(name: &str, logs: &Path) -> api::PodSandboxConfig {
    api::PodSandboxConfig {
        metadata: Some(api::PodSandboxMetadata {
            name: name.into(),
            uid: format!("uid-{name}-{}", std::process::id()),
            namespace: "bench".into(),
            attempt: 0,
        }),
        // No hostname: runc refuses to set one without a private UTS namespace (host network).
        log_directory: logs.display().to_string(),
        labels: [("app".to_string(), name.to_string())].into(),
        // Host network: CNI stays out of the figures.
        linux: Some(api::LinuxPodSandboxConfig {
            security_context: Some(api::LinuxSandboxSecurityContext {
                namespace_options: Some(api::NamespaceOption {
                    network: api::NamespaceMode::Node as i32,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn container_config(name: &str, image: &str, command: &[&str]) -> api::ContainerConfig {
    api::ContainerConfig {
        metadata: Some(api::ContainerMetadata {
            name: name.into(),
            attempt: 0,
        }),
        image: Some(api::ImageSpec {
            image: image.into(),
            ..Default::default()
        }),
        command: command.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}.log"),
        ..Default::default()
    }
}

// ---------------------------------------------------------------------------------------------
// The SPDY client: HTTP upgrade by hand, then scute's SPDY in the client role.

/// Host:port and path of a streaming URL (both runtimes hand out plain http on loopback).
fn split_url(url: &str) -> Result<(String, String), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("not a plain http URL: {url}"))?;
    let slash = rest.find('/').ok_or_else(|| format!("no path in {url}"))?;
    Ok((rest[..slash].to_string(), rest[slash..].to_string()))
}

/// POST with the SPDY upgrade headers offering `protocol`; the connection once the server has switched
/// to SPDY/3.1 with that protocol.
async fn upgrade(url: &str, protocol: &str) -> Result<TcpStream, String> {
    let (host, path) = split_url(url)?;
    let mut tcp = TcpStream::connect(&host)
        .await
        .map_err(|e| format!("connect {host}: {e}"))?;
    // As Go's net package does by default (client-go's side of the session).
    tcp.set_nodelay(true).map_err(|e| format!("TCP_NODELAY: {e}"))?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {host}\r\nConnection: Upgrade\r\nUpgrade: SPDY/3.1\r\n\
         X-Stream-Protocol-Version: {protocol}\r\nContent-Length: 0\r\n\r\n"
    );
    tcp.write_all(request.as_bytes())
        .await
        .map_err(|e| format!("send the upgrade request: {e}"))?;
    // Byte by byte up to the blank line: what follows is SPDY and must not be consumed here.
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        let mut byte = [0u8; 1];
        match tokio::time::timeout(STEP_TIMEOUT, tcp.read(&mut byte)).await {
            Ok(Ok(1)) => head.push(byte[0]),
            Ok(Ok(_)) => break,
            Ok(Err(e)) => return Err(format!("read the upgrade answer: {e}")),
            Err(_) => return Err(format!("no upgrade answer in {STEP_TIMEOUT:?}")),
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let status: u16 = head.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
    let negotiated = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("x-stream-protocol-version")
            .then(|| value.trim().to_string())
    });
    if status != 101 || negotiated.as_deref() != Some(protocol) {
        return Err(format!("upgrade of {url} to {protocol} refused: {head:?}"));
    }
    Ok(tcp)
}

/// Opens a stream with these headers and waits for the server's SYN_REPLY, as client-go does.
async fn open(conn: &Connection, headers: &[(&str, &str)]) -> Result<(RecvStream, SendStream), String> {
    let headers = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    let what = format!("{headers:?}");
    let stream = tokio::time::timeout(STEP_TIMEOUT, conn.open(headers, false))
        .await
        .map_err(|_| format!("opening stream {what} stalled"))?
        .map_err(|e| format!("open stream {what}: {e}"))?;
    let (mut recv, send) = stream.split();
    tokio::time::timeout(STEP_TIMEOUT, recv.reply_headers())
        .await
        .map_err(|_| format!("no SYN_REPLY for stream {what} in {STEP_TIMEOUT:?}"))?
        .map_err(|e| format!("stream {what}: {e}"))?;
    Ok((recv, send))
}

/// Everything a stream carries until its end (FIN, reset, or the session's end).
async fn read_all(recv: &mut RecvStream, what: &str) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    loop {
        match tokio::time::timeout(STEP_TIMEOUT, recv.recv()).await {
            Ok(Some(chunk)) => out.extend_from_slice(&chunk),
            Ok(None) => return Ok(out),
            Err(_) => {
                return Err(format!(
                    "{what} stream stalled for {STEP_TIMEOUT:?} after {:?}",
                    String::from_utf8_lossy(&out)
                ))
            }
        }
    }
}

/// Closes a session and waits (untimed, a few seconds at most) until its socket is let go.
async fn end_session(conn: Connection, incoming: Incoming) {
    conn.close();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.closed()).await;
    drop(incoming);
}

// ---------------------------------------------------------------------------------------------
// One exec session and one download

/// Points in one exec session, from the Exec RPC's start.
struct ExecTimes {
    url: Duration,
    upgraded: Duration,
    streams: Duration,
    status: Duration,
}

async fn exec_echo(rt: &mut RuntimeServiceClient<Channel>, container_id: &str) -> Result<ExecTimes, String> {
    let started = Instant::now();
    let request = api::ExecRequest {
        container_id: container_id.into(),
        cmd: vec!["echo".into(), "hi".into()],
        tty: false,
        stdin: false,
        stdout: true,
        stderr: true,
    };
    let url = tokio::time::timeout(RPC_TIMEOUT, rt.exec(request))
        .await
        .map_err(|_| format!("Exec: no answer in {RPC_TIMEOUT:?}"))?
        .map_err(|e| format!("Exec: {e}"))?
        .into_inner()
        .url;
    let url_at = started.elapsed();
    let tcp = upgrade(&url, "v4.channel.k8s.io").await?;
    let (conn, incoming) = Connection::new(tcp, Role::Client);
    let upgraded = started.elapsed();
    // The send halves are kept open until the end, as client-go keeps them.
    let (mut error, _error_send) = open(&conn, &[("streamtype", "error")]).await?;
    let (mut stdout, _stdout_send) = open(&conn, &[("streamtype", "stdout")]).await?;
    let (mut stderr, _stderr_send) = open(&conn, &[("streamtype", "stderr")]).await?;
    let streams = started.elapsed();
    let (out, err, status) = tokio::join!(
        read_all(&mut stdout, "stdout"),
        read_all(&mut stderr, "stderr"),
        async { read_all(&mut error, "error").await.map(|s| (s, started.elapsed())) },
    );
    let (out, err, (status, status_at)) = (out?, err?, status?);
    end_session(conn, incoming).await;
    let v: serde_json::Value = serde_json::from_slice(&status)
        .map_err(|e| format!("status is not JSON ({e}): {:?}", String::from_utf8_lossy(&status)))?;
    if v["status"] != "Success" {
        return Err(format!("status is not Success: {v}"));
    }
    if out != b"hi\n" || !err.is_empty() {
        return Err(format!(
            "stdout {:?}, stderr {:?} (expected \"hi\\n\" and nothing)",
            String::from_utf8_lossy(&out),
            String::from_utf8_lossy(&err)
        ));
    }
    Ok(ExecTimes {
        url: url_at,
        upgraded,
        streams,
        status: status_at,
    })
}

struct Download {
    /// PortForward RPC, upgrade, error + data streams replied.
    setup: Duration,
    /// From sending the request to the first body byte.
    first_byte: Duration,
    /// From sending the request to the body's last byte.
    body: Duration,
    /// From the body's last byte to the data stream's end.
    fin_after: Duration,
}

async fn download(rt: &mut RuntimeServiceClient<Channel>, sandbox_id: &str, port: u16) -> Result<Download, String> {
    let started = Instant::now();
    let request = api::PortForwardRequest {
        pod_sandbox_id: sandbox_id.into(),
        port: vec![port.into()],
    };
    let url = tokio::time::timeout(RPC_TIMEOUT, rt.port_forward(request))
        .await
        .map_err(|_| format!("PortForward: no answer in {RPC_TIMEOUT:?}"))?
        .map_err(|e| format!("PortForward: {e}"))?
        .into_inner()
        .url;
    let tcp = upgrade(&url, "portforward.k8s.io").await?;
    let (conn, incoming) = Connection::new(tcp, Role::Client);
    let port = port.to_string();
    let (mut error, mut error_send) =
        open(&conn, &[("streamtype", "error"), ("port", &port), ("requestid", "0")]).await?;
    // client-go never writes to the error stream and half-closes it at once.
    error_send
        .finish()
        .await
        .map_err(|e| format!("finish the error stream: {e}"))?;
    let (mut data, mut data_send) = open(&conn, &[("streamtype", "data"), ("port", &port), ("requestid", "0")]).await?;
    let setup = started.elapsed();

    let sent = Instant::now();
    // Our side of the data stream stays open until the answer is in, as the local HTTP client's socket
    // does (containerd stops copying 1 s after either direction ends: an early FIN cuts the download).
    data_send
        .send(b"GET /big HTTP/1.0\r\n\r\n")
        .await
        .map_err(|e| format!("send the request: {e}"))?;
    let mut head = Vec::new();
    let mut body = 0u64;
    let mut non_zero = 0u64;
    let (mut first_byte, mut last_byte) = (None, None);
    loop {
        let chunk = match tokio::time::timeout(STEP_TIMEOUT, data.recv()).await {
            Ok(Some(chunk)) => chunk,
            Ok(None) => break,
            Err(_) => {
                return Err(format!(
                    "data stream stalled for {STEP_TIMEOUT:?} after {body} body bytes"
                ))
            }
        };
        let tail;
        let part: &[u8] = if first_byte.is_some() {
            &chunk
        } else {
            head.extend_from_slice(&chunk);
            let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            first_byte = Some(sent.elapsed());
            tail = head.split_off(end + 4);
            &tail
        };
        body += part.len() as u64;
        non_zero += part.iter().filter(|&&b| b != 0).count() as u64;
        if body >= FILE_BYTES && last_byte.is_none() {
            last_byte = Some(sent.elapsed());
        }
    }
    let ended = sent.elapsed();
    // As client-go does once the remote side is done: reset the data stream, then read the error
    // stream to its end (scute ends it only once the data stream has ended both ways).
    data_send.reset(RstStatus::Cancel);
    let errors = read_all(&mut error, "error").await?;
    end_session(conn, incoming).await;

    let head = String::from_utf8_lossy(&head).into_owned();
    if !errors.is_empty() {
        return Err(format!("error stream: {}", String::from_utf8_lossy(&errors)));
    }
    let (Some(first_byte), Some(last_byte)) = (first_byte, last_byte) else {
        return Err(format!("data stream ended after {body} body bytes; head {head:?}"));
    };
    if !head.starts_with("HTTP/1.") || !head.contains(" 200 ") {
        return Err(format!("not a 200 answer: {head:?}"));
    }
    if body != FILE_BYTES || non_zero != 0 {
        return Err(format!(
            "{body} body bytes ({non_zero} not zero), expected {FILE_BYTES} zeros"
        ));
    }
    Ok(Download {
        setup,
        first_byte,
        body: last_byte,
        fin_after: ended - last_byte,
    })
}

// ---------------------------------------------------------------------------------------------
// One runtime

struct Client<'a> {
    daemon: &'a Daemon,
    rt: RuntimeServiceClient<Channel>,
    image: String,
    logs: PathBuf,
}

/// A pod with the config it was created from (CreateContainer sends it along).
struct Pod {
    id: String,
    config: api::PodSandboxConfig,
}

impl Client<'_> {
    async fn run_pod(&self, name: &str) -> Pod {
        let mut rt = self.rt.clone();
        let config = pod_config(name, &self.logs);
        let (r, _) = self
            .daemon
            .timed(
                "RunPodSandbox",
                rt.run_pod_sandbox(api::RunPodSandboxRequest {
                    config: Some(config.clone()),
                    runtime_handler: String::new(),
                }),
            )
            .await;
        let id = r.into_inner().pod_sandbox_id;
        self.daemon.created.borrow_mut().push(id.clone());
        Pod { id, config }
    }

    async fn remove_pod(&self, pod: &Pod) {
        let mut rt = self.rt.clone();
        let stop = api::StopPodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        };
        self.daemon.timed("StopPodSandbox", rt.stop_pod_sandbox(stop)).await;
        let remove = api::RemovePodSandboxRequest {
            pod_sandbox_id: pod.id.clone(),
        };
        self.daemon
            .timed("RemovePodSandbox", rt.remove_pod_sandbox(remove))
            .await;
    }

    /// Creates and starts a container running `command`.
    async fn run(&self, pod: &Pod, name: &str, command: &[&str]) -> String {
        let mut rt = self.rt.clone();
        let (r, _) = self
            .daemon
            .timed(
                "CreateContainer",
                rt.create_container(api::CreateContainerRequest {
                    pod_sandbox_id: pod.id.clone(),
                    config: Some(container_config(name, &self.image, command)),
                    sandbox_config: Some(pod.config.clone()),
                }),
            )
            .await;
        let id = r.into_inner().container_id;
        self.daemon.created.borrow_mut().push(id.clone());
        let req = api::StartContainerRequest {
            container_id: id.clone(),
        };
        self.daemon.timed("StartContainer", rt.start_container(req)).await;
        id
    }

    async fn remove(&self, id: &str) {
        let mut rt = self.rt.clone();
        let req = api::StopContainerRequest {
            container_id: id.into(),
            timeout: 0,
        };
        self.daemon.timed("StopContainer", rt.stop_container(req)).await;
        let req = api::RemoveContainerRequest {
            container_id: id.into(),
        };
        self.daemon.timed("RemoveContainer", rt.remove_container(req)).await;
    }

    /// The container's log so far (for failures).
    fn container_log(&self, name: &str) -> String {
        std::fs::read_to_string(self.logs.join(format!("{name}.log"))).unwrap_or_default()
    }

    /// Until httpd on the host port answers HEAD /big with the whole file's length (it starts once
    /// the file is written).
    async fn wait_httpd(&self, port: u16) {
        let deadline = Instant::now() + Duration::from_secs(60);
        let expected = format!("content-length: {FILE_BYTES}");
        loop {
            let answer = async {
                let mut tcp = TcpStream::connect(("127.0.0.1", port)).await.ok()?;
                tcp.write_all(b"HEAD /big HTTP/1.0\r\n\r\n").await.ok()?;
                let mut answer = String::new();
                tcp.read_to_string(&mut answer).await.ok()?;
                Some(answer)
            };
            let answer = tokio::time::timeout(Duration::from_secs(5), answer)
                .await
                .ok()
                .flatten();
            if answer.is_some_and(|a| a.to_ascii_lowercase().contains(&expected)) {
                return;
            }
            if Instant::now() > deadline {
                self.daemon.fail(
                    "httpd",
                    format!(
                        "no answer on 127.0.0.1:{port} in 60 s; container log:\n{}",
                        self.container_log("web")
                    ),
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

struct Figures {
    exec: Vec<ExecTimes>,
    downloads: Vec<Download>,
    /// Daemon VmRSS before the exec sessions, after them, and after the downloads.
    daemon_rss_kib: [u64; 3],
    /// The pod's shim processes' VmRSS after the exec sessions.
    shim_rss_kib: u64,
}

async fn measure(daemon: &Daemon, sessions: usize, downloads: usize, image: &str) -> Figures {
    let channel = scute::client::connect(&daemon.socket).await.expect("connect");
    let logs = daemon.dir.path().join("logs");
    std::fs::create_dir_all(&logs).unwrap();
    let mut client = Client {
        daemon,
        rt: RuntimeServiceClient::new(channel.clone()),
        image: image.into(),
        logs,
    };
    client.daemon.wait_ready(&mut client.rt).await;
    let mut images = ImageServiceClient::new(channel.clone());
    let (_, took) = client
        .daemon
        .timed(
            "PullImage",
            images.pull_image(api::PullImageRequest {
                image: Some(api::ImageSpec {
                    image: image.into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        )
        .await;
    println!(
        "  {:<10} pulled {image} in {:.0} ms",
        daemon.name(),
        took.as_secs_f64() * 1e3
    );

    let pod = client.run_pod("bench-stream").await;
    let idle = client.run(&pod, "idle", &["sleep", "3600"]).await;
    // Host network: a port free on the host. The file is written before httpd starts listening.
    let port = free_port();
    let script =
        format!("mkdir -p /www && head -c {FILE_BYTES} /dev/zero > /www/big && exec httpd -f -p {port} -h /www");
    let web = client.run(&pod, "web", &["sh", "-c", &script]).await;

    let mut rt = client.rt.clone();
    // One untimed session: first-use work (the container's first exec, connection pools).
    match exec_echo(&mut rt, &idle).await {
        Ok(t) => println!(
            "  {:<10} warm-up exec session (untimed): {:.1} ms",
            daemon.name(),
            t.status.as_secs_f64() * 1e3
        ),
        Err(e) => client.daemon.fail("warm-up exec session", e),
    }
    let rss_before = proc_kib(daemon.pid(), "status", "VmRSS");
    let mut exec = Vec::with_capacity(sessions);
    let started = Instant::now();
    for i in 0..sessions {
        match exec_echo(&mut rt, &idle).await {
            Ok(t) => exec.push(t),
            Err(e) => client.daemon.fail(&format!("exec session {}/{sessions}", i + 1), e),
        }
    }
    println!(
        "  {:<10} {sessions} exec sessions in {:.2} s",
        daemon.name(),
        started.elapsed().as_secs_f64()
    );
    let rss_after_exec = proc_kib(daemon.pid(), "status", "VmRSS");
    let shim_rss_kib = shim_pids(daemon, &pod.id)
        .iter()
        .map(|&pid| proc_kib(pid, "status", "VmRSS"))
        .sum();

    client.wait_httpd(port).await;
    let mut done = Vec::with_capacity(downloads);
    for i in 0..downloads {
        match download(&mut rt, &pod.id, port).await {
            Ok(d) => {
                println!(
                    "  {:<10} download {}/{downloads}: {:.0} MB/s ({:.2} s), setup {:.1} ms, first byte {:.1} ms, \
                     data stream ended {:.1} ms after the last byte",
                    daemon.name(),
                    i + 1,
                    FILE_BYTES as f64 / 1e6 / d.body.as_secs_f64(),
                    d.body.as_secs_f64(),
                    d.setup.as_secs_f64() * 1e3,
                    d.first_byte.as_secs_f64() * 1e3,
                    d.fin_after.as_secs_f64() * 1e3,
                );
                done.push(d);
            }
            Err(e) => client.daemon.fail(&format!("download {}/{downloads}", i + 1), e),
        }
    }
    let rss_after_downloads = proc_kib(daemon.pid(), "status", "VmRSS");

    client.remove(&web).await;
    client.remove(&idle).await;
    client.remove_pod(&pod).await;
    Figures {
        exec,
        downloads: done,
        daemon_rss_kib: [rss_before, rss_after_exec, rss_after_downloads],
        shim_rss_kib,
    }
}

/// Measures a daemon on a client runtime of its own, dropped (closing the connections) before the
/// daemon is shut down.
fn bench(daemon: &mut Daemon, sessions: usize, downloads: usize, image: &str) -> (Figures, Vec<String>) {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let figures = runtime.block_on(measure(daemon, sessions, downloads, image));
    drop(runtime);
    let notes = daemon.shutdown();
    (figures, notes)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The median in ms (nearest rank).
fn p50_ms(mut samples: Vec<Duration>) -> f64 {
    samples.sort();
    ms(samples[(samples.len() - 1) / 2])
}

fn mean_ms(samples: impl Iterator<Item = Duration>) -> f64 {
    let samples: Vec<Duration> = samples.collect();
    ms(samples.iter().sum::<Duration>() / samples.len() as u32)
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing: run quickly then.
    let bench_mode = std::env::args().any(|a| a == "--bench");
    let sessions: usize = std::env::var("SCUTE_BENCH_STREAMING")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(if bench_mode { 50 } else { 3 })
        .max(1);
    let downloads = if bench_mode { 3 } else { 1 };
    ensure_shim_built();
    println!(
        "streaming benchmark over SPDY/3.1: {sessions} sequential exec sessions of busybox `echo hi` (stdout + \
         stderr, no tty, v4.channel.k8s.io), then {downloads} x {} MB downloaded from busybox httpd through one \
         port-forward connection (portforward.k8s.io), in one host-network pod",
        FILE_BYTES / 1_000_000
    );

    // Dropped last: after every daemon.
    let registry = Registry::start();
    registry.push_test_images();
    let image = format!("{}/e2e-test-images/busybox:1.29-2", registry.addr);

    let (results, notes) = each_runtime(&registry.addr, |daemon| bench(daemon, sessions, downloads, &image));
    drop(registry);

    println!();
    println!(
        "{:<14} | {:>27} | {:>6} | {:>8} | {:>10} | {:>10} | {:>12}",
        "exec", "RPC -> status mean/p99 ms", "p50 ms", "RPC ms", "upgrade ms", "streams ms", "to status ms"
    );
    for (name, f) in &results {
        println!(
            "{:<14} | {:>27} | {:>6.1} | {:>8.2} | {:>10.2} | {:>10.2} | {:>12.2}",
            name,
            mean_p99(f.exec.iter().map(|t| t.status).collect()),
            p50_ms(f.exec.iter().map(|t| t.status).collect()),
            mean_ms(f.exec.iter().map(|t| t.url)),
            mean_ms(f.exec.iter().map(|t| t.upgraded - t.url)),
            mean_ms(f.exec.iter().map(|t| t.streams - t.upgraded)),
            mean_ms(f.exec.iter().map(|t| t.status - t.streams)),
        );
    }
    println!("(the four last columns are means of the session's phases; p99 of {sessions} samples is their maximum when fewer than 100)");
    println!();
    println!(
        "{:<14} | {:>16} | {:>8} | {:>13} | {:>15} | {:>22} | {:>13}",
        "port-fwd",
        format!("{} MB median", FILE_BYTES / 1_000_000),
        "MB/s",
        "setup ms",
        "first byte ms",
        "stream end after last",
        "daemon RSS"
    );
    for (name, f) in &results {
        let mut by_time: Vec<&Download> = f.downloads.iter().collect();
        by_time.sort_by_key(|d| d.body);
        let median = by_time[by_time.len() / 2];
        println!(
            "{:<14} | {:>14.2} s | {:>8.0} | {:>13.1} | {:>15.1} | {:>19.1} ms | {:>9.1} MiB",
            name,
            median.body.as_secs_f64(),
            FILE_BYTES as f64 / 1e6 / median.body.as_secs_f64(),
            mean_ms(f.downloads.iter().map(|d| d.setup)),
            mean_ms(f.downloads.iter().map(|d| d.first_byte)),
            mean_ms(f.downloads.iter().map(|d| d.fin_after)),
            f.daemon_rss_kib[2] as f64 / 1024.0,
        );
    }
    println!(
        "(MB = 10^6 bytes, from sending the request to the body's last byte; setup = PortForward RPC, upgrade and \
         both streams; daemon RSS after the downloads)"
    );
    println!();
    for (name, f) in &results {
        println!(
            "{name}: daemon RSS {:.1} MiB before the exec sessions, {:.1} MiB after; the pod's shim(s) {:.1} MiB after",
            f.daemon_rss_kib[0] as f64 / 1024.0,
            f.daemon_rss_kib[1] as f64 / 1024.0,
            f.shim_rss_kib as f64 / 1024.0,
        );
    }
    for note in &notes {
        println!("note: {note}");
    }
}
