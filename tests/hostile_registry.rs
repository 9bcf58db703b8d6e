//! Pulls from a hostile registry: a tiny OCI distribution server written here (plain tokio, on
//! 127.0.0.1, which the daemon talks to over plain HTTP) that announces or streams documents of
//! any size, serves blobs longer or shorter than their descriptors say or whose bytes lie about
//! their digest, malformed digests, redirect loops, and a basic-auth challenge with a redirect to
//! another host. The daemon must refuse each with a clear code naming the problem, without
//! reading what it refuses, its memory must not follow what the registry sends, and credentials
//! must not leave the registry they are for.

mod common;

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::Daemon;
use scute::api;
use sha2::{Digest as _, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tonic::Code;

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const CONFIG: &str = "application/vnd.oci.image.config.v1+json";
const LAYER: &str = "application/vnd.oci.image.layer.v1.tar";

/// What the hostile documents weigh: far above any cap, far below what the machine can spare.
const HUGE: u64 = 200 << 20;
/// Daemon peak RSS growth allowed during a refused pull: its buffers, not the registry's bytes.
const MAX_GROWTH_KIB: u64 = 64 << 10;
/// Body bytes the registry may get into socket buffers before a refusing daemon hangs up.
const MAX_SENT: u64 = 32 << 20;

/// How a document goes out.
#[derive(Clone)]
enum Body {
    /// With its Content-Length.
    Sized(Vec<u8>),
    /// The same, and a `Range: bytes=N-` request is answered 206 with bytes N onwards (as
    /// distribution does).
    Ranged(Vec<u8>),
    /// Chunked, no Content-Length.
    Chunked(Vec<u8>),
    /// `head`, then spaces up to `len` bytes (JSON allows trailing whitespace), announced with
    /// Content-Length or chunked.
    Padded { head: Vec<u8>, len: u64, chunked: bool },
    /// No body: a 307 to this location.
    Redirect(String),
    /// These bytes, announced with their Content-Length, one per `every`.
    Drip { data: Vec<u8>, every: Duration },
    /// These bytes with their Content-Length and `Content-Encoding: coding` (what they inflate
    /// to is the document).
    Encoded { coding: &'static str, data: Vec<u8> },
    /// These bytes announced with their Content-Length, but only the first `sent` go out; then
    /// the connection hangs, open, for a minute.
    Stall { data: Vec<u8>, sent: usize },
    /// These bytes announced with their Content-Length, but only the first `sent` go out; then
    /// the connection closes (a download cut off).
    Cut { data: Vec<u8>, sent: usize },
    /// Cut as `Cut` when asked from the start; a `Range: bytes=N-` request from N > 0 is
    /// answered 206 with the rest, whole (the network cut one connection, not the registry).
    CutRanged { data: Vec<u8>, sent: usize },
}

impl Body {
    /// The digest of the whole body, as a registry that stored it would have it.
    fn digest(&self) -> String {
        let mut hasher = Sha256::new();
        match self {
            Body::Sized(b)
            | Body::Ranged(b)
            | Body::Chunked(b)
            | Body::Drip { data: b, .. }
            | Body::Encoded { data: b, .. }
            | Body::Stall { data: b, .. }
            | Body::Cut { data: b, .. }
            | Body::CutRanged { data: b, .. } => hasher.update(b),
            Body::Redirect(_) => {}
            Body::Padded { head, len, .. } => {
                hasher.update(head);
                let block = vec![b' '; 1 << 20];
                let mut left = len - head.len() as u64;
                while left > 0 {
                    let n = left.min(block.len() as u64) as usize;
                    hasher.update(&block[..n]);
                    left -= n as u64;
                }
            }
        }
        format!("sha256:{}", hex::encode(hasher.finalize()))
    }
}

/// What the hostile registry's connections share: documents by path, the body bytes it managed
/// to write, the Authorization it demands (None: none), and each request's path and
/// Authorization header as received.
#[derive(Default)]
struct Shared {
    routes: std::sync::Mutex<HashMap<String, (String, Body)>>,
    sent: AtomicU64,
    auth: std::sync::Mutex<Option<String>>,
    seen: std::sync::Mutex<Vec<(String, Option<String>)>>,
    /// Bodies whose writing failed: the client hung up.
    hung_up: AtomicU64,
    /// Requests answered 206 (a `Body::Ranged` asked for a range).
    ranged: AtomicU64,
}

/// The hostile registry.
struct Hostile {
    addr: String,
    shared: Arc<Shared>,
    server: tokio::task::JoinHandle<()>,
}

impl Hostile {
    async fn start() -> Hostile {
        Hostile::start_on("127.0.0.1").await
    }

    /// On loopback address `ip` (127.0.0.2 is another host to an HTTP client).
    async fn start_on(ip: &str) -> Hostile {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let shared: Arc<Shared> = Arc::default();
        let s = shared.clone();
        let server = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                tokio::spawn(serve(conn, s.clone()));
            }
        });
        Hostile { addr, shared, server }
    }

    fn route(&self, path: String, media_type: &str, body: Body) {
        self.shared
            .routes
            .lock()
            .unwrap()
            .insert(path, (media_type.to_string(), body));
    }

    fn manifest(&self, repo: &str, reference: &str, media_type: &str, body: Body) {
        self.route(format!("/v2/{repo}/manifests/{reference}"), media_type, body);
    }

    fn blob(&self, repo: &str, digest: &str, media_type: &str, body: Body) {
        self.route(format!("/v2/{repo}/blobs/{digest}"), media_type, body);
    }

    fn image(&self, repo: &str) -> String {
        format!("{}/{repo}:v1", self.addr)
    }

    /// Body bytes written since the last call, once the writers have settled (a refused body's
    /// writer fails as soon as the daemon hangs up).
    async fn sent(&self) -> u64 {
        let sent = &self.shared.sent;
        let mut last = sent.load(Ordering::SeqCst);
        loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let now = sent.load(Ordering::SeqCst);
            if now == last {
                sent.fetch_sub(now, Ordering::SeqCst);
                eprintln!("the registry wrote {now} body bytes");
                return now;
            }
            last = now;
        }
    }

    /// The requests received: path and Authorization header.
    fn seen(&self) -> Vec<(String, Option<String>)> {
        self.shared.seen.lock().unwrap().clone()
    }
}

impl Drop for Hostile {
    fn drop(&mut self) {
        self.server.abort();
    }
}

/// One request per connection (`Connection: close`): GET or HEAD of /v2/ or a route.
async fn serve(mut conn: TcpStream, shared: Arc<Shared>) {
    let mut head = Vec::new();
    let mut buf = [0u8; 4096];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 64 << 10 {
            return;
        }
    }
    let head = String::from_utf8_lossy(&head).into_owned();
    let mut first = head.lines().next().unwrap_or("").split(' ');
    let method = first.next().unwrap_or("").to_string();
    let path = first.next().unwrap_or("").split('?').next().unwrap_or("").to_string();
    let authorization = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("authorization")
            .then(|| value.trim().to_string())
    });
    let range_from = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        let value = value.trim().strip_prefix("bytes=")?.strip_suffix('-')?;
        name.eq_ignore_ascii_case("range")
            .then(|| value.parse::<usize>().ok())?
    });
    shared.seen.lock().unwrap().push((path.clone(), authorization.clone()));
    let demanded = shared.auth.lock().unwrap().clone();
    if demanded.is_some() && authorization != demanded {
        let _ = conn
            .write_all(
                b"HTTP/1.1 401 Unauthorized\r\nWWW-Authenticate: Basic realm=\"hostile\"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            )
            .await;
        return;
    }
    let route = if path == "/v2/" {
        Some(("application/json".to_string(), Body::Sized(b"{}".to_vec())))
    } else {
        shared.routes.lock().unwrap().get(&path).cloned()
    };
    let Some((media_type, body)) = route else {
        let body = br#"{"errors":[{"code":"MANIFEST_UNKNOWN","message":"unknown"}]}"#;
        let _ = conn
            .write_all(
                format!(
                    "HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                    body.len()
                )
                .as_bytes(),
            )
            .await;
        let _ = conn.write_all(body).await;
        return;
    };
    if let Body::Redirect(location) = &body {
        let _ = conn
            .write_all(
                format!("HTTP/1.1 307 Temporary Redirect\r\nLocation: {location}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await;
        return;
    }
    let digest = body.digest_if_small();
    let (status, body) = match (body, range_from) {
        (Body::Ranged(data), Some(from)) if from < data.len() => partial(&data, from, &shared),
        // What distribution (Go's http.ServeContent) answers, also for `bytes=0-` of nothing.
        (Body::Ranged(data), Some(_)) => (
            format!("416 Range Not Satisfiable\r\nContent-Range: bytes */{}", data.len()),
            Body::Sized(Vec::new()),
        ),
        (Body::Ranged(data), _) => ("200 OK".to_string(), Body::Sized(data)),
        (Body::CutRanged { data, .. }, Some(from)) if from > 0 && from < data.len() => partial(&data, from, &shared),
        (Body::CutRanged { data, sent }, _) => ("200 OK".to_string(), Body::Cut { data, sent }),
        (body, _) => ("200 OK".to_string(), body),
    };
    let (length, chunked) = match &body {
        Body::Redirect(_) | Body::Ranged(_) | Body::CutRanged { .. } => unreachable!("answered above"),
        Body::Sized(b)
        | Body::Drip { data: b, .. }
        | Body::Encoded { data: b, .. }
        | Body::Stall { data: b, .. }
        | Body::Cut { data: b, .. } => (Some(b.len() as u64), false),
        Body::Chunked(_) => (None, true),
        Body::Padded { len, chunked, .. } => ((!chunked).then_some(*len), *chunked),
    };
    let framing = match length {
        Some(len) => format!("Content-Length: {len}\r\n"),
        None => "Transfer-Encoding: chunked\r\n".to_string(),
    };
    let coding = match &body {
        Body::Encoded { coding, .. } => format!("Content-Encoding: {coding}\r\n"),
        _ => String::new(),
    };
    let header = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {media_type}\r\n{framing}{coding}{digest}Connection: close\r\n\r\n"
    );
    if conn.write_all(header.as_bytes()).await.is_err() || method == "HEAD" {
        return;
    }
    if write_body(&mut conn, &body, chunked, &shared.sent).await.is_err() {
        shared.hung_up.fetch_add(1, Ordering::SeqCst);
    }
    let _ = conn.shutdown().await;
}

/// A 206 answer with `data` from byte `from` on, counted in `ranged`.
fn partial(data: &[u8], from: usize, shared: &Shared) -> (String, Body) {
    shared.ranged.fetch_add(1, Ordering::SeqCst);
    let status = format!(
        "206 Partial Content\r\nContent-Range: bytes {from}-{}/{}",
        data.len() - 1,
        data.len()
    );
    (status, Body::Sized(data[from..].to_vec()))
}

impl Body {
    /// Docker-Content-Digest for the bodies cheap to hash (the huge ones go without, as a
    /// registry may send them).
    fn digest_if_small(&self) -> String {
        match self {
            Body::Sized(_) | Body::Ranged(_) | Body::Chunked(_) => {
                format!("Docker-Content-Digest: {}\r\n", self.digest())
            }
            Body::Padded { .. }
            | Body::Redirect(_)
            | Body::Drip { .. }
            | Body::Encoded { .. }
            | Body::Stall { .. }
            | Body::Cut { .. }
            | Body::CutRanged { .. } => String::new(),
        }
    }
}

/// Writes the body in 64 KiB pieces, counting what the socket took. A daemon that stopped
/// reading without hanging up stalls the write: give up after a while.
async fn write_body(conn: &mut TcpStream, body: &Body, chunked: bool, sent: &AtomicU64) -> std::io::Result<()> {
    let (head, len) = match body {
        Body::Sized(b) | Body::Chunked(b) | Body::Encoded { data: b, .. } => (b.as_slice(), b.len() as u64),
        Body::Padded { head, len, .. } => (head.as_slice(), *len),
        Body::Redirect(_) | Body::Ranged(_) | Body::CutRanged { .. } => return Ok(()), // answered as Sized
        Body::Drip { data, every } => {
            for byte in data {
                conn.write_all(std::slice::from_ref(byte)).await?;
                conn.flush().await?;
                sent.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(*every).await;
            }
            return Ok(());
        }
        Body::Stall { data, sent: n } => {
            conn.write_all(&data[..*n]).await?;
            conn.flush().await?;
            sent.fetch_add(*n as u64, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_secs(60)).await;
            return Ok(());
        }
        Body::Cut { data, sent: n } => {
            conn.write_all(&data[..*n]).await?;
            conn.flush().await?;
            sent.fetch_add(*n as u64, Ordering::SeqCst);
            return Ok(()); // and the caller closes the connection
        }
    };
    let spaces = vec![b' '; 64 << 10];
    let mut offset = 0u64;
    while offset < len {
        let piece: &[u8] = if offset < head.len() as u64 {
            &head[offset as usize..head.len().min(offset as usize + spaces.len())]
        } else {
            &spaces[..(len - offset).min(spaces.len() as u64) as usize]
        };
        let write = async {
            if chunked {
                conn.write_all(format!("{:x}\r\n", piece.len()).as_bytes()).await?;
                conn.write_all(piece).await?;
                conn.write_all(b"\r\n").await
            } else {
                conn.write_all(piece).await
            }
        };
        match tokio::time::timeout(Duration::from_secs(10), write).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Err(e),
            Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
        }
        offset += piece.len() as u64;
        sent.fetch_add(piece.len() as u64, Ordering::SeqCst);
    }
    if chunked {
        conn.write_all(b"0\r\n\r\n").await?;
    }
    Ok(())
}

fn arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

fn sha256(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A one-file uncompressed layer (its digest is its diff ID).
fn layer_tar() -> Vec<u8> {
    one_file_tar("etc/marker", b"hostile registry test\n")
}

/// An uncompressed tar holding `data` at `path`, root-owned, mode 0644, mtime 0.
fn one_file_tar(path: &str, data: &[u8]) -> Vec<u8> {
    let mut builder = tar::Builder::new(Vec::new());
    let mut header = file_header(data.len() as u64);
    builder.append_data(&mut header, path, data).unwrap();
    builder.into_inner().unwrap()
}

/// A regular file's tar header: `size` bytes, root-owned, mode 0644, mtime 0 (the builder, or
/// the caller after set_path, writes the checksum again).
fn file_header(size: u64) -> tar::Header {
    let mut header = tar::Header::new_gnu();
    header.set_size(size);
    header.set_mode(0o644);
    header.set_uid(0);
    header.set_gid(0);
    header.set_mtime(0);
    header.set_entry_type(tar::EntryType::Regular);
    header.set_cksum();
    header
}

fn config_json(diff_ids: &[String]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "architecture": arch(),
        "os": "linux",
        "config": {"Cmd": ["/bin/sh"]},
        "rootfs": {"type": "layers", "diff_ids": diff_ids},
    }))
    .unwrap()
}

fn descriptor(media_type: &str, digest: &str, size: u64) -> serde_json::Value {
    serde_json::json!({"mediaType": media_type, "digest": digest, "size": size})
}

fn manifest_json(config: serde_json::Value, layers: Vec<serde_json::Value>) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "schemaVersion": 2,
        "mediaType": MANIFEST,
        "config": config,
        "layers": layers,
    }))
    .unwrap()
}

/// Serves a well-formed one-layer image under `repo:v1`; answers the manifest bytes.
fn serve_good_image(registry: &Hostile, repo: &str) -> Vec<u8> {
    let layer = layer_tar();
    let config = config_json(&[sha256(&layer)]);
    registry.blob(repo, &sha256(&layer), LAYER, Body::Sized(layer.clone()));
    registry.blob(repo, &sha256(&config), CONFIG, Body::Sized(config.clone()));
    let manifest = manifest_json(
        descriptor(CONFIG, &sha256(&config), config.len() as u64),
        vec![descriptor(LAYER, &sha256(&layer), layer.len() as u64)],
    );
    registry.manifest(repo, "v1", MANIFEST, Body::Sized(manifest.clone()));
    manifest
}

/// Serves `repo:v1` with a good config and one layer whose descriptor says `declared` bytes
/// and `digest`, served as `body`. The config's diff ID is `diff_id`.
fn serve_image_with_layer(registry: &Hostile, repo: &str, declared: u64, digest: &str, diff_id: &str, body: Body) {
    serve_image_with_typed_layer(registry, repo, LAYER, declared, digest, diff_id, body);
}

/// The same with a layer of `media_type` (compressed).
fn serve_image_with_typed_layer(
    registry: &Hostile,
    repo: &str,
    media_type: &str,
    declared: u64,
    digest: &str,
    diff_id: &str,
    body: Body,
) {
    let config = config_json(&[diff_id.to_string()]);
    registry.blob(repo, &sha256(&config), CONFIG, Body::Sized(config.clone()));
    registry.blob(repo, digest, media_type, body);
    let manifest = manifest_json(
        descriptor(CONFIG, &sha256(&config), config.len() as u64),
        vec![descriptor(media_type, digest, declared)],
    );
    registry.manifest(repo, "v1", MANIFEST, Body::Sized(manifest));
}

async fn pull(daemon: &Daemon, image: &str) -> Result<String, tonic::Status> {
    daemon
        .images()
        .await
        .pull_image(api::PullImageRequest {
            image: Some(api::ImageSpec {
                image: image.to_string(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .map(|r| r.into_inner().image_ref)
}

/// Starts pulling `image` in the background: its image ID or error when the pull ends.
async fn spawn_pull(daemon: &Daemon, image: &str) -> tokio::task::JoinHandle<Result<String, tonic::Status>> {
    let mut images = daemon.images().await;
    let request = api::PullImageRequest {
        image: Some(api::ImageSpec {
            image: image.to_string(),
            ..Default::default()
        }),
        ..Default::default()
    };
    tokio::spawn(async move { images.pull_image(request).await.map(|r| r.into_inner().image_ref) })
}

/// Pulls `image`, which must be refused with FailedPrecondition and a message containing every
/// one of `names`.
async fn refused(daemon: &Daemon, image: &str, names: &[&str]) {
    assert_refused(pull(daemon, image).await, image, names);
}

fn assert_refused(result: Result<String, tonic::Status>, image: &str, names: &[&str]) {
    let status = match result {
        Ok(id) => panic!("pulling {image} must fail, but it gave {id}"),
        Err(status) => status,
    };
    assert_eq!(status.code(), Code::FailedPrecondition, "{image}: {status:?}");
    for name in names {
        assert!(
            status.message().contains(name),
            "{image}: the error must say {name:?}: {}",
            status.message()
        );
    }
}

/// Pulls `image` from `registry`, checks that the daemon's peak memory did not follow what the
/// registry sent and that the registry got little of its body out, then that the pull was
/// refused naming `names`.
async fn refused_bounded(daemon: &Daemon, registry: &Hostile, image: &str, names: &[&str]) {
    let before = daemon.peak_rss_kib();
    let result = pull(daemon, image).await;
    let sent = registry.sent().await;
    assert_bounded(daemon, before, image);
    assert!(
        sent < MAX_SENT,
        "{image}: the registry got {} MiB of its body out",
        sent >> 20
    );
    assert_refused(result, image, names);
}

/// Only the built-in (pinned) pause image is listed: a refused pull recorded nothing.
async fn assert_no_image_kept(daemon: &Daemon) {
    let images = daemon
        .images()
        .await
        .list_images(api::ListImagesRequest::default())
        .await
        .unwrap()
        .into_inner()
        .images;
    assert!(
        images.iter().all(|i| i.pinned),
        "only the built-in pause image: {images:?}"
    );
}

/// The daemon still pulls a good image (served as `repo`) after what a test threw at it.
async fn assert_pulls_on(daemon: &Daemon, registry: &Hostile, repo: &str) {
    serve_good_image(registry, repo);
    pull(daemon, &registry.image(repo))
        .await
        .unwrap_or_else(|e| panic!("a good image after all that: {e:?}"));
}

fn assert_bounded(daemon: &Daemon, before_kib: u64, what: &str) {
    let growth = daemon.peak_rss_kib().saturating_sub(before_kib);
    eprintln!("{what}: daemon peak RSS {} -> +{} KiB", before_kib, growth);
    assert!(
        growth < MAX_GROWTH_KIB,
        "{what}: the daemon's peak RSS grew by {} MiB",
        growth >> 10
    );
}

/// The rig: a hostile registry serves a well-formed image too, so the refusals below are about
/// sizes, not about the little server. An index whose entry understates its manifest's size is
/// refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_well_formed_image_pulls_and_an_index_entry_must_match_its_manifest() {
    let registry = Hostile::start().await;
    let daemon = Daemon::start("");
    serve_good_image(&registry, "hostile/good");
    pull(&daemon, &registry.image("hostile/good"))
        .await
        .expect("a well-formed image pulls");

    let manifest = serve_good_image(&registry, "hostile/indexed");
    let index = |size: usize| {
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": INDEX,
            "manifests": [{
                "mediaType": MANIFEST, "digest": sha256(&manifest), "size": size,
                "platform": {"os": "linux", "architecture": arch()},
            }],
        }))
        .unwrap()
    };
    registry.manifest(
        "hostile/indexed",
        &sha256(&manifest),
        MANIFEST,
        Body::Sized(manifest.clone()),
    );
    registry.manifest("hostile/indexed", "v1", INDEX, Body::Sized(index(manifest.len())));
    pull(&daemon, &registry.image("hostile/indexed"))
        .await
        .expect("an index pulls");

    // Same manifest, but the index says it is 10 bytes shorter: announced, then streamed.
    let short = manifest.len() - 10;
    for (tag, body, problem) in [
        (
            "announced",
            Body::Sized(manifest.clone()),
            format!(
                "registry announces {} bytes, but the index declares {short}",
                manifest.len()
            ),
        ),
        (
            "chunked",
            Body::Chunked(manifest.clone()),
            format!("registry sent more than the {short} bytes its descriptor declares"),
        ),
    ] {
        let repo = format!("hostile/understated-{tag}");
        serve_good_image(&registry, &repo);
        registry.manifest(&repo, &sha256(&manifest), MANIFEST, body);
        registry.manifest(&repo, "v1", INDEX, Body::Sized(index(short)));
        refused(&daemon, &registry.image(&repo), &[&sha256(&manifest), &problem]).await;
    }
}

/// (a) A manifest announced with a 200 MiB Content-Length is refused from the header: the
/// daemon hangs up before the registry gets the body out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_announced_over_the_cap_is_refused_unread() {
    let registry = Hostile::start().await;
    let daemon = Daemon::start("");
    let head = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}"#.to_vec();
    registry.manifest(
        "hostile/huge",
        "v1",
        MANIFEST,
        Body::Padded {
            head,
            len: HUGE,
            chunked: false,
        },
    );
    refused_bounded(
        &daemon,
        &registry,
        &registry.image("hostile/huge"),
        &["manifest v1 is 209715200 bytes", "over the 4 MiB limit"],
    )
    .await;
}

/// (b) A manifest without a length that streams 200 MiB is cut off at the 4 MiB cap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_streamed_without_a_length_is_cut_at_the_cap() {
    let registry = Hostile::start().await;
    let daemon = Daemon::start("");
    let head = br#"{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json"}"#.to_vec();
    registry.manifest(
        "hostile/endless",
        "v1",
        MANIFEST,
        Body::Padded {
            head,
            len: HUGE,
            chunked: true,
        },
    );
    refused_bounded(
        &daemon,
        &registry,
        &registry.image("hostile/endless"),
        &["manifest v1 exceeds the 4 MiB limit"],
    )
    .await;
}

/// (c) A config whose descriptor says 1234 bytes, served as 200 MiB whose digest is the one in
/// the descriptor: refused from its Content-Length, and cut off after 1234 bytes when it comes
/// without one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_config_larger_than_its_descriptor_is_refused() {
    let registry = Hostile::start().await;
    let daemon = Daemon::start("");
    let layer = layer_tar();
    for chunked in [false, true] {
        let repo = format!("hostile/config-{}", if chunked { "chunked" } else { "announced" });
        let body = Body::Padded {
            head: config_json(&[sha256(&layer)]),
            len: HUGE,
            chunked,
        };
        let digest = tokio::task::spawn_blocking({
            let body = body.clone();
            move || body.digest()
        })
        .await
        .unwrap();
        registry.blob(&repo, &digest, CONFIG, body);
        registry.blob(&repo, &sha256(&layer), LAYER, Body::Sized(layer.clone()));
        let manifest = manifest_json(
            descriptor(CONFIG, &digest, 1234),
            vec![descriptor(LAYER, &sha256(&layer), layer.len() as u64)],
        );
        registry.manifest(&repo, "v1", MANIFEST, Body::Sized(manifest));

        let problem = if chunked {
            "registry sent more than the 1234 bytes its descriptor declares"
        } else {
            "registry announces 209715200 bytes, but its descriptor declares 1234"
        };
        let config = format!("config {digest}");
        refused_bounded(&daemon, &registry, &registry.image(&repo), &[&config, problem]).await;
    }
    // Over the config cap in the descriptor itself: refused before any request.
    let repo = "hostile/config-over-cap";
    let manifest = manifest_json(
        descriptor(CONFIG, &sha256(b"x"), 9 << 20),
        vec![descriptor(LAYER, &sha256(&layer), layer.len() as u64)],
    );
    registry.manifest(repo, "v1", MANIFEST, Body::Sized(manifest));
    refused(
        &daemon,
        &registry.image(repo),
        &["is 9437184 bytes, over the 8 MiB limit"],
    )
    .await;
}

/// (d) A layer served longer than its descriptor says, though digest and diff ID match what is
/// served (a tar followed by zeros is still a valid tar): refused, announced or streamed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_longer_than_its_descriptor_is_refused() {
    let registry = Hostile::start().await;
    let daemon = Daemon::start("");
    let tar = layer_tar();
    let mut served = tar.clone();
    served.resize(tar.len() + (8 << 20), 0);
    let digest = sha256(&served);
    for chunked in [false, true] {
        let repo = format!("hostile/layer-long-{}", if chunked { "chunked" } else { "announced" });
        let body = if chunked {
            Body::Chunked(served.clone())
        } else {
            Body::Sized(served.clone())
        };
        serve_image_with_layer(&registry, &repo, tar.len() as u64, &digest, &digest, body);
        let problem = if chunked {
            format!("more than the {} bytes its descriptor declares", tar.len())
        } else {
            format!(
                "announces {} bytes, but its descriptor declares {}",
                served.len(),
                tar.len()
            )
        };
        refused(&daemon, &registry.image(&repo), &[&format!("layer {digest}"), &problem]).await;
    }
}

/// (e) Blobs shorter than declared, whose digests match what is served: refused, announced or
/// streamed, layer or config.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn blobs_shorter_than_declared_are_refused() {
    let registry = Hostile::start().await;
    let daemon = Daemon::start("");
    let tar = layer_tar();
    let digest = sha256(&tar);
    let declared = tar.len() as u64 + 512;
    for chunked in [false, true] {
        let repo = format!("hostile/layer-short-{}", if chunked { "chunked" } else { "announced" });
        let body = if chunked {
            Body::Chunked(tar.clone())
        } else {
            Body::Sized(tar.clone())
        };
        serve_image_with_layer(&registry, &repo, declared, &digest, &digest, body);
        let problem = if chunked {
            format!("sent {} bytes, but its descriptor declares {declared}", tar.len())
        } else {
            format!("announces {} bytes, but its descriptor declares {declared}", tar.len())
        };
        refused(&daemon, &registry.image(&repo), &[&format!("layer {digest}"), &problem]).await;
    }

    // A config of its own: the ones above are in the content store already.
    let repo = "hostile/config-short";
    let mut config = config_json(std::slice::from_ref(&digest));
    config.extend_from_slice(b"\n");
    registry.blob(repo, &sha256(&config), CONFIG, Body::Chunked(config.clone()));
    registry.blob(repo, &digest, LAYER, Body::Sized(tar.clone()));
    let manifest = manifest_json(
        descriptor(CONFIG, &sha256(&config), config.len() as u64 + 10),
        vec![descriptor(LAYER, &digest, tar.len() as u64)],
    );
    registry.manifest(repo, "v1", MANIFEST, Body::Sized(manifest));
    let problem = format!(
        "sent {} bytes, but its descriptor declares {}",
        config.len(),
        config.len() + 10
    );
    refused(
        &daemon,
        &registry.image(repo),
        &[&format!("config {}", sha256(&config)), &problem],
    )
    .await;
}

/// A layer whose bytes are no readable archive, sent whole and matching its digest (a tar header
/// with a wrong checksum, a gzip stream that stops halfway, bytes that are no gzip at all), is
/// refused for good: FailedPrecondition naming the layer, which the kubelet does not retry in a
/// hot loop as it would Unavailable, and the same again on the next pull; nothing is kept. A
/// download cut off mid-layer, whose archive then looks just as truncated, stays retryable
/// (Unavailable), and the next pull, with the registry well again, completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_layer_archives_are_final_and_cut_downloads_retryable() {
    const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    let registry = Hostile::start().await;
    let daemon = Daemon::start("");

    let mut bad_checksum = layer_tar();
    bad_checksum[148..156].copy_from_slice(b"0000000\0");
    // Incompressible file data, so that half of the gzip stream is half of the archive.
    let noise: Vec<u8> = (0..256u32 << 10)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let whole_tar = one_file_tar("etc/noise", &noise);
    let whole_gzip = gzip(&whole_tar);
    let half_gzip = whole_gzip[..whole_gzip.len() / 2].to_vec();
    let not_gzip = b"these bytes are no gzip stream\n".repeat(64);
    let cases = [
        ("tar-checksum", LAYER, bad_checksum.clone(), sha256(&bad_checksum)),
        ("gzip-truncated", GZIP, half_gzip, sha256(&whole_tar)),
        ("not-gzip", GZIP, not_gzip, sha256(&whole_tar)),
    ];
    for (name, media_type, bytes, diff_id) in cases {
        let repo = format!("hostile/malformed-{name}");
        let digest = sha256(&bytes);
        let declared = bytes.len() as u64;
        serve_image_with_typed_layer(
            &registry,
            &repo,
            media_type,
            declared,
            &digest,
            &diff_id,
            Body::Sized(bytes),
        );
        for _ in 0..2 {
            refused(
                &daemon,
                &registry.image(&repo),
                &[&format!("layer {digest}"), "malformed layer archive"],
            )
            .await;
        }
    }
    assert_no_image_kept(&daemon).await;

    // The good gzip layer, cut off by the network a third of the way in.
    let repo = "hostile/cut-download";
    let digest = sha256(&whole_gzip);
    let cut = Body::Cut {
        data: whole_gzip.clone(),
        sent: whole_gzip.len() / 3,
    };
    let declared = whole_gzip.len() as u64;
    serve_image_with_typed_layer(&registry, repo, GZIP, declared, &digest, &sha256(&whole_tar), cut);
    let err = pull(&daemon, &registry.image(repo)).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "a cut download is retryable: {err:?}");
    assert!(
        err.message().contains(&format!("layer {digest}")) && !err.message().contains("malformed"),
        "{}",
        err.message()
    );
    let good = Body::Sized(whole_gzip.clone());
    serve_image_with_typed_layer(&registry, repo, GZIP, declared, &digest, &sha256(&whole_tar), good);
    pull(&daemon, &registry.image(repo))
        .await
        .unwrap_or_else(|e| panic!("the pull after the cut: {e:?}"));
}

/// A download the network cuts mid-layer, from a registry that answers ranges: the same pull
/// asks for the rest from the byte it reached (one 206) and completes, with the layer checked
/// whole, and says so in its log. (Against one that does not, the pull fails retryable: above.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_the_network_cuts_is_picked_up_where_it_broke_off() {
    const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    let registry = Hostile::start().await;
    let daemon = Daemon::start("");
    let noise: Vec<u8> = (0..1024u32 << 10)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let tar = one_file_tar("etc/noise", &noise);
    let gzipped = gzip(&tar);
    let (declared, digest) = (gzipped.len() as u64, sha256(&gzipped));
    let cut = Body::CutRanged {
        data: gzipped.clone(),
        sent: gzipped.len() / 3,
    };
    let repo = "hostile/cut-then-ranged";
    serve_image_with_typed_layer(&registry, repo, GZIP, declared, &digest, &sha256(&tar), cut);
    let ranges_before = registry.shared.ranged.load(Ordering::SeqCst);
    let id = pull(&daemon, &registry.image(repo))
        .await
        .unwrap_or_else(|e| panic!("the cut download was not picked up: {e:?}\n{}", daemon.log()));
    assert!(id.starts_with("sha256:"), "{id}");
    assert_eq!(
        registry.shared.ranged.load(Ordering::SeqCst) - ranges_before,
        1,
        "one range asked for the rest"
    );
    assert!(daemon.log().contains("broke off"), "{}", daemon.log());
}

/// (f) What crashed other runtimes' daemons (containerd CVE-2026-95839: a malformed digest in a
/// manifest's child descriptor panicked it): malformed and unsupported digests, a blob whose
/// bytes are not its digest, a blob redirecting to itself. Each pull fails with a clear code
/// within its deadline, nothing of it is kept, and the daemon serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_digests_lying_blobs_and_redirect_loops_fail_cleanly() {
    let registry = Hostile::start().await;
    let daemon = Daemon::start("");
    let layer = layer_tar();
    let layer_digest = sha256(&layer);
    let config = config_json(std::slice::from_ref(&layer_digest));
    let config_digest = sha256(&config);
    registry.blob("hostile/parts", &config_digest, CONFIG, Body::Sized(config.clone()));
    let good_layer = descriptor(LAYER, &layer_digest, layer.len() as u64);
    let good_config = descriptor(CONFIG, &config_digest, config.len() as u64);
    let malformed = [
        "sha256:zz".to_string(),
        format!("sha256:{}", "a".repeat(63)),
        format!("sha256:{}", "A".repeat(64)),
        "md5:d41d8cd98f00b204e9800998ecf8427e".to_string(),
        "sha256:../../../../etc/passwd".to_string(),
        String::new(),
        ":".to_string(),
        "sha512:abc".to_string(),
    ];
    for (i, digest) in malformed.iter().enumerate() {
        for (what, manifest) in [
            (
                "config",
                manifest_json(
                    descriptor(CONFIG, digest, config.len() as u64),
                    vec![good_layer.clone()],
                ),
            ),
            (
                "layer",
                manifest_json(good_config.clone(), vec![descriptor(LAYER, digest, layer.len() as u64)]),
            ),
        ] {
            let repo = format!("hostile/digest-{what}-{i}");
            registry.blob(&repo, &config_digest, CONFIG, Body::Sized(config.clone()));
            registry.blob(&repo, &layer_digest, LAYER, Body::Sized(layer.clone()));
            registry.manifest(&repo, "v1", MANIFEST, Body::Sized(manifest));
            let err = pull(&daemon, &registry.image(&repo)).await.expect_err(&repo);
            assert!(
                matches!(err.code(), Code::InvalidArgument | Code::FailedPrecondition),
                "{repo} ({digest:?}): {err:?}"
            );
            assert!(err.message().contains("digest"), "{repo}: {}", err.message());
        }
    }

    // A layer whose bytes are not its digest (right size): refused, naming it.
    let mut lie = layer.clone();
    let last = lie.len() - 1;
    lie[last] ^= 1;
    serve_image_with_layer(
        &registry,
        "hostile/lie",
        layer.len() as u64,
        &layer_digest,
        &layer_digest,
        Body::Sized(lie),
    );
    let err = pull(&daemon, &registry.image("hostile/lie")).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains(&layer_digest), "{}", err.message());

    // The same lie answered as a range (206, which oci-client does not hash): the content
    // store's own check refuses it (the truth served that way pulls, below).
    let mut lie = layer.clone();
    lie[last] ^= 1;
    serve_image_with_layer(
        &registry,
        "hostile/lie-ranged",
        layer.len() as u64,
        &layer_digest,
        &layer_digest,
        Body::Ranged(lie),
    );
    let err = pull(&daemon, &registry.image("hostile/lie-ranged")).await.unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition, "{err:?}");
    assert!(err.message().contains(&layer_digest), "{}", err.message());

    // A blob that redirects to itself: the redirect limit ends it, in seconds.
    let path = format!("/v2/hostile/loop/blobs/{layer_digest}");
    serve_image_with_layer(
        &registry,
        "hostile/loop",
        layer.len() as u64,
        &layer_digest,
        &layer_digest,
        Body::Redirect(format!("http://{}{path}", registry.addr)),
    );
    let started = std::time::Instant::now();
    let err = pull(&daemon, &registry.image("hostile/loop")).await.unwrap_err();
    eprintln!("redirect loop: {:?} after {:?}", err, started.elapsed());
    assert!(started.elapsed() < Duration::from_secs(30), "{:?}", started.elapsed());
    assert_ne!(err.code(), Code::Internal, "{err:?}");

    // None of it was kept, and the daemon still pulls a good image, also served as ranges.
    assert_no_image_kept(&daemon).await;
    assert_pulls_on(&daemon, &registry, "hostile/after").await;
    let ranged = one_file_tar("ranged.txt", b"served as ranges");
    let ranged_digest = sha256(&ranged);
    serve_image_with_layer(
        &registry,
        "hostile/ranged",
        ranged.len() as u64,
        &ranged_digest,
        &ranged_digest,
        Body::Ranged(ranged),
    );
    let ranges_before = registry.shared.ranged.load(Ordering::SeqCst);
    pull(&daemon, &registry.image("hostile/ranged")).await.unwrap();
    assert!(
        registry.shared.ranged.load(Ordering::SeqCst) > ranges_before,
        "the layer was not asked for as a range (its 206 path is what the lie above tests)"
    );
    // An empty blob asked as `bytes=0-` is a 416: it is asked whole.
    let empty_digest = sha256(b"");
    serve_image_with_layer(
        &registry,
        "hostile/empty-ranged",
        0,
        &empty_digest,
        &empty_digest,
        Body::Ranged(Vec::new()),
    );
    pull(&daemon, &registry.image("hostile/empty-ranged")).await.unwrap();
}

/// (g) Credentials go to the registry they were given for and nowhere else: a blob redirected
/// to another host (as registries send blobs to a CDN) and a foreign layer's URL on another
/// host get no Authorization header (reqwest drops it on a cross-host redirect; oci-client
/// never authenticates on a descriptor's URLs, CVE-2020-15157).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_never_follow_a_redirect_or_a_foreign_url_to_another_host() {
    let registry = Hostile::start().await;
    let cdn = Hostile::start_on("127.0.0.2").await;
    let daemon = Daemon::start("");
    use base64::Engine as _;
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("scute:s3cret")
    );
    *registry.shared.auth.lock().unwrap() = Some(basic.clone());

    // The layer is on the CDN; the registry redirects to it. A second, foreign layer's
    // descriptor lists a URL on the CDN and the registry does not have it.
    let layer = layer_tar();
    let digest = sha256(&layer);
    let foreign = one_file_tar("etc/foreign", b"cdn\n");
    let foreign_digest = sha256(&foreign);
    let repo = "hostile/private";
    let config = config_json(&[digest.clone(), foreign_digest.clone()]);
    registry.blob(repo, &sha256(&config), CONFIG, Body::Sized(config.clone()));
    let cdn_path = format!("/cdn/{digest}");
    cdn.route(cdn_path.clone(), LAYER, Body::Sized(layer.clone()));
    registry.blob(
        repo,
        &digest,
        LAYER,
        Body::Redirect(format!("http://{}{cdn_path}", cdn.addr)),
    );
    let foreign_path = format!("/foreign/{foreign_digest}");
    cdn.route(foreign_path.clone(), LAYER, Body::Sized(foreign.clone()));
    let mut foreign_descriptor = descriptor(
        "application/vnd.oci.image.layer.nondistributable.v1.tar",
        &foreign_digest,
        foreign.len() as u64,
    );
    foreign_descriptor["urls"] = serde_json::json!([format!("http://{}{foreign_path}", cdn.addr)]);
    let manifest = manifest_json(
        descriptor(CONFIG, &sha256(&config), config.len() as u64),
        vec![descriptor(LAYER, &digest, layer.len() as u64), foreign_descriptor],
    );
    registry.manifest(repo, "v1", MANIFEST, Body::Sized(manifest));

    daemon
        .images()
        .await
        .pull_image(api::PullImageRequest {
            image: Some(api::ImageSpec {
                image: registry.image(repo),
                ..Default::default()
            }),
            auth: Some(api::AuthConfig {
                username: "scute".into(),
                password: "s3cret".into(),
                ..Default::default()
            }),
            ..Default::default()
        })
        .await
        .expect("the image pulls with its credentials");

    let at_registry = registry.seen();
    assert!(
        at_registry
            .iter()
            .any(|(p, a)| p.contains("/manifests/") && a.as_deref() == Some(basic.as_str())),
        "the registry got the credentials: {at_registry:?}"
    );
    let at_cdn = cdn.seen();
    let paths: Vec<&str> = at_cdn.iter().map(|(p, _)| p.as_str()).collect();
    assert!(
        paths.contains(&cdn_path.as_str()) && paths.contains(&foreign_path.as_str()),
        "{at_cdn:?}"
    );
    assert!(
        at_cdn.iter().all(|(_, a)| a.is_none()),
        "credentials reached another host: {at_cdn:?}"
    );
}

/// (h) A registry that drips a layer at 10 bytes a second: the pull ends at the caller's
/// deadline (as the kubelet's runtime-request-timeout would cut it), the daemon hangs up on the
/// registry, and no image is recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dripping_registry_is_cut_at_the_callers_deadline() {
    let registry = Hostile::start().await;
    let daemon = Daemon::start("");
    let layer = layer_tar();
    let digest = sha256(&layer);
    let drip = Body::Drip {
        data: layer.clone(),
        every: Duration::from_millis(100),
    };
    serve_image_with_layer(&registry, "hostile/drip", layer.len() as u64, &digest, &digest, drip);
    let mut request = tonic::Request::new(api::PullImageRequest {
        image: Some(api::ImageSpec {
            image: registry.image("hostile/drip"),
            ..Default::default()
        }),
        ..Default::default()
    });
    request.set_timeout(Duration::from_secs(3));
    let started = std::time::Instant::now();
    let err = daemon.images().await.pull_image(request).await.unwrap_err();
    let took = started.elapsed();
    // The daemon answers DeadlineExceeded at the deadline it was sent; tonic's client may cut
    // the call itself at the same instant (Cancelled, "Timeout expired").
    assert!(
        matches!(err.code(), Code::DeadlineExceeded | Code::Cancelled),
        "{err:?}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while registry.shared.hung_up.load(Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "the daemon still reads the drip");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sent = registry.shared.sent.load(Ordering::SeqCst);
    assert!(sent < layer.len() as u64, "{sent} bytes dripped: the whole layer");
    assert_no_image_kept(&daemon).await;
}

/// A tar stream compressed as it is written ("gzip" or "zstd"), its uncompressed digest (the
/// diff ID) kept alongside.
struct CompressedTar {
    encoder: Encoder,
    hasher: Sha256,
}

enum Encoder {
    Gzip(flate2::write::GzEncoder<Vec<u8>>),
    Zstd(zstd::stream::write::Encoder<'static, Vec<u8>>),
}

impl CompressedTar {
    fn new(coding: &str) -> CompressedTar {
        let encoder = match coding {
            "gzip" => Encoder::Gzip(flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best())),
            "zstd" => Encoder::Zstd(zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap()),
            other => panic!("no encoder for {other}"),
        };
        CompressedTar {
            encoder,
            hasher: Sha256::new(),
        }
    }

    /// The compressed bytes and the diff ID.
    fn finish(self) -> (Vec<u8>, String) {
        let bytes = match self.encoder {
            Encoder::Gzip(e) => e.finish().unwrap(),
            Encoder::Zstd(e) => e.finish().unwrap(),
        };
        (bytes, format!("sha256:{}", hex::encode(self.hasher.finalize())))
    }
}

impl std::io::Write for CompressedTar {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.hasher.update(buf);
        match &mut self.encoder {
            Encoder::Gzip(e) => e.write_all(buf)?,
            Encoder::Zstd(e) => e.write_all(buf)?,
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// A layer of one file of `size` zero bytes (a multiple of 512), compressed with `coding`.
fn zero_bomb(coding: &str, size: u64) -> (Vec<u8>, String) {
    use std::io::Write;
    let mut out = CompressedTar::new(coding);
    let mut header = file_header(size);
    header.set_path("zeros").unwrap();
    header.set_cksum();
    out.write_all(header.as_bytes()).unwrap();
    let zeros = vec![0u8; 1 << 20];
    let mut left = size;
    while left > 0 {
        let n = left.min(zeros.len() as u64) as usize;
        out.write_all(&zeros[..n]).unwrap();
        left -= n as u64;
    }
    out.write_all(&[0u8; 1024]).unwrap(); // the end-of-archive blocks
    out.finish()
}

/// A gzip layer of `count` empty files.
fn inode_bomb(count: usize) -> (Vec<u8>, String) {
    let mut builder = tar::Builder::new(CompressedTar::new("gzip"));
    for i in 0..count {
        let mut header = file_header(0);
        builder
            .append_data(&mut header, format!("f/{i:06}"), std::io::empty())
            .unwrap();
    }
    builder.into_inner().unwrap().finish()
}

/// Free blocks and free inodes of the filesystem at `path`, with its block size.
fn free_on(path: &std::path::Path) -> (u64, u64, u64) {
    let stat = nix::sys::statvfs::statvfs(path).unwrap();
    (stat.blocks_available(), stat.files_available(), stat.fragment_size())
}

/// (i) Decompression bombs onto a disk the test can fill: layers that inflate to 256 MiB of
/// zeros (about 256 KiB of gzip, a few KiB of zstd) and a layer of 100 000 empty files, pulled
/// onto a root on a 128 MiB tmpfs with 60 000 inodes. Each pull stops with ResourceExhausted
/// naming the reserve (`[image] min_free_disk_percent`, 5%) before the filesystem is full (it
/// is watched throughout), what it unpacked is gone, the daemon's memory did not follow, and a
/// good image pulls after. Without the reserve the disk fills (ENOSPC), and the pods on it with
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn decompression_bombs_stop_at_the_disk_reserve() {
    let registry = Hostile::start().await;
    let daemon = Daemon::start_on_tmpfs("", "size=128m,nr_inodes=60000,mode=0700");
    let root = daemon.root.clone();
    let bombs = [
        (
            "zeros-gzip",
            "application/vnd.oci.image.layer.v1.tar+gzip",
            zero_bomb("gzip", 256 << 20),
            "MiB",
        ),
        (
            "zeros-zstd",
            "application/vnd.oci.image.layer.v1.tar+zstd",
            zero_bomb("zstd", 256 << 20),
            "MiB",
        ),
        (
            "files",
            "application/vnd.oci.image.layer.v1.tar+gzip",
            inode_bomb(100_000),
            "inodes",
        ),
    ];
    for (name, media_type, (layer, diff_id), what_ran_out) in bombs {
        let repo = format!("hostile/bomb-{name}");
        let digest = sha256(&layer);
        eprintln!("{repo}: {} bytes compressed", layer.len());
        let layer_len = layer.len() as u64;
        serve_image_with_typed_layer(
            &registry,
            &repo,
            media_type,
            layer_len,
            &digest,
            &diff_id,
            Body::Sized(layer),
        );
        let (blocks_before, inodes_before, block) = free_on(&root);

        // Watched every 2 ms while the pull runs: the lowest free space and inodes seen.
        let watching = Arc::new(std::sync::atomic::AtomicBool::new(true));
        let watcher = {
            let (root, watching) = (root.clone(), watching.clone());
            std::thread::spawn(move || {
                let mut lowest = (u64::MAX, u64::MAX);
                while watching.load(Ordering::SeqCst) {
                    let (blocks, inodes, _) = free_on(&root);
                    lowest = (lowest.0.min(blocks), lowest.1.min(inodes));
                    std::thread::sleep(Duration::from_millis(2));
                }
                lowest
            })
        };
        let before_rss = daemon.peak_rss_kib();
        let started = std::time::Instant::now();
        let result = pull(&daemon, &registry.image(&repo)).await;
        watching.store(false, Ordering::SeqCst);
        let (lowest_blocks, lowest_inodes) = watcher.join().unwrap();
        eprintln!(
            "{repo}: {result:?} after {:?}; lowest free seen {} MiB, {lowest_inodes} inodes",
            started.elapsed(),
            (lowest_blocks * block) >> 20
        );
        let err = result.expect_err("a bomb must not pull");
        assert_eq!(err.code(), Code::ResourceExhausted, "{repo}: {err:?}");
        for needle in ["min_free_disk_percent", &digest, what_ran_out] {
            assert!(
                err.message().contains(needle),
                "{repo}: must say {needle:?}: {}",
                err.message()
            );
        }
        assert!(lowest_blocks > 0 && lowest_inodes > 0, "{repo}: the disk filled up");
        assert_bounded(&daemon, before_rss, &repo);

        // What the pull unpacked is gone; at most its compressed download stays (to resume).
        let (blocks_after, inodes_after, _) = free_on(&root);
        let kept = blocks_before.saturating_sub(blocks_after) * block;
        assert!(kept <= layer_len + (1 << 20), "{repo}: {kept} bytes stay on the disk");
        assert!(
            inodes_before - inodes_after.min(inodes_before) <= 4,
            "{repo}: inodes stay used"
        );
    }
    assert_no_image_kept(&daemon).await;
    assert_pulls_on(&daemon, &registry, "hostile/after-bombs").await;
}

/// (j) Documents sent compressed (`Content-Encoding`), which scute asks registries not to do
/// (Accept-Encoding: identity): a manifest that inflates to 256 MiB, as gzip and as zstd, is
/// refused unread naming the coding, and a config sent gzip-encoded is refused from its length,
/// never inflated. The daemon's memory does not follow what they inflate to.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn documents_sent_compressed_are_never_inflated() {
    let registry = Hostile::start().await;
    let daemon = Daemon::start("");
    let manifest = serve_good_image(&registry, "hostile/encoded");
    let mut padded = manifest.clone();
    padded.resize(256 << 20, b' ');
    for coding in ["gzip", "zstd"] {
        let data = match coding {
            "gzip" => gzip(&padded),
            _ => zstd::bulk::compress(&padded, 1).unwrap(),
        };
        let repo = format!("hostile/encoded-{coding}");
        serve_good_image(&registry, &repo);
        registry.manifest(&repo, "v1", MANIFEST, Body::Encoded { coding, data });
        let image = registry.image(&repo);
        let before = daemon.peak_rss_kib();
        refused(&daemon, &image, &["Content-Encoding", coding]).await;
        assert_bounded(&daemon, before, &image);
    }
    drop(padded);

    // A config whose 4 MiB (under the 8 MiB cap) go out as a few KiB of gzip.
    let layer = layer_tar();
    let mut config = config_json(&[sha256(&layer)]);
    config.resize(4 << 20, b' ');
    let gzipped = gzip(&config);
    let repo = "hostile/encoded-config";
    registry.blob(repo, &sha256(&layer), LAYER, Body::Sized(layer.clone()));
    registry.blob(
        repo,
        &sha256(&config),
        CONFIG,
        Body::Encoded {
            coding: "gzip",
            data: gzipped,
        },
    );
    let manifest = manifest_json(
        descriptor(CONFIG, &sha256(&config), config.len() as u64),
        vec![descriptor(LAYER, &sha256(&layer), layer.len() as u64)],
    );
    registry.manifest(repo, "v1", MANIFEST, Body::Sized(manifest));
    refused(
        &daemon,
        &registry.image(repo),
        &[&format!("config {}", sha256(&config))],
    )
    .await;
    assert_no_image_kept(&daemon).await;
}

/// (k) Pull progress and the stall watchdog (`pull_progress_timeout_seconds` = 2 here): a layer
/// dripped a byte every 100 ms (about 10 s in all, never 2 s without a byte) pulls, and while it
/// runs `scute pulls`, the metrics and the log show it downloading with its bytes counted; a
/// layer whose registry stops sending half way is aborted with DeadlineExceeded naming the
/// setting soon after 2 s, and the daemon pulls on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_pull_is_aborted_and_a_slow_one_is_watched_to_its_end() {
    let registry = Hostile::start().await;
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let daemon = Daemon::start(&format!(
        "[image]\npull_progress_timeout_seconds = 2\n[metrics]\naddress = \"{metrics}\"\n"
    ));
    const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    let tar = layer_tar();
    let gzipped = gzip(&tar);
    let (len, digest, diff_id) = (gzipped.len() as u64, sha256(&gzipped), sha256(&tar));
    let every = Duration::from_millis(100);
    let body = Body::Drip {
        data: gzipped.clone(),
        every,
    };
    serve_image_with_typed_layer(&registry, "hostile/slow", GZIP, len, &digest, &diff_id, body);
    let image = registry.image("hostile/slow");
    eprintln!("{len} bytes at one per {every:?}");

    let started = std::time::Instant::now();
    let slow = spawn_pull(&daemon, &image).await;
    // Past the 5 s log interval, mid-layer.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let listed = scute_pulls(&daemon);
    let line = listed
        .lines()
        .find(|l| l.starts_with(&image))
        .unwrap_or_else(|| panic!("{image} not listed:\n{listed}"));
    let fields: Vec<&str> = line.split('\t').collect();
    assert_eq!(fields[1], "downloading", "{line}");
    let (done, total) = fields[2].split(' ').next().unwrap().split_once('/').unwrap();
    let done: u64 = done.parse().unwrap();
    assert_eq!(total, len.to_string(), "{line}");
    assert!(done > 0 && done < len, "{line}");
    assert_eq!(fields[3], "0/1", "{line}");
    let scraped = scrape(&metrics).await;
    let series = format!("scute_image_pull_progress_bytes{{image=\"{image}\",phase=\"downloading\"}}");
    assert!(scraped.contains(&series), "{series} not in the metrics:\n{scraped}");
    assert!(
        daemon.log().contains("pull progress"),
        "no progress line logged:\n{}",
        daemon.log()
    );

    slow.await.unwrap().expect("a slow pull that keeps moving completes");
    eprintln!("the slow pull took {:?}", started.elapsed());
    assert!(started.elapsed() > Duration::from_secs(4), "the drip was not slow");

    // Half of the layer, then silence with the connection open.
    let body = Body::Stall {
        data: gzipped.clone(),
        sent: gzipped.len() / 2,
    };
    // Its own diff ID: with the slow image's, its layer would be the snapshot already unpacked
    // (same content, whatever the compressed digest) and nothing would be downloaded.
    let (stalled, stalled_diff_id) = (
        format!("sha256:{}", "5".repeat(64)),
        format!("sha256:{}", "6".repeat(64)),
    );
    serve_image_with_typed_layer(
        &registry,
        "hostile/stalled",
        GZIP,
        len,
        &stalled,
        &stalled_diff_id,
        body,
    );
    let started = std::time::Instant::now();
    let err = pull(&daemon, &registry.image("hostile/stalled")).await.unwrap_err();
    eprintln!("stalled: {err:?} after {:?}", started.elapsed());
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    assert!(
        err.message().contains("pull_progress_timeout_seconds"),
        "{}",
        err.message()
    );
    assert!(started.elapsed() < Duration::from_secs(10), "{:?}", started.elapsed());
    let listed = scute_pulls(&daemon);
    assert!(listed.contains("(no pull in flight)"), "{listed}");
}

/// A pull aborted while one layer stalls keeps the layers it finished: their snapshots are put
/// in place and recorded (a pull's layers are committed together, after one sync, so the
/// cancelled pull's are committed as it goes), and the retry downloads only the stalled layer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_aborted_pull_keeps_the_layers_it_finished() {
    let registry = Hostile::start().await;
    let daemon = Daemon::start("[image]\npull_progress_timeout_seconds = 2\n");
    let repo = "hostile/halfway";
    let (done, stalls) = (layer_tar(), one_file_tar("second", &[7u8; 64 << 10]));
    let (done_digest, stalls_digest) = (sha256(&done), sha256(&stalls));
    let config = config_json(&[done_digest.clone(), stalls_digest.clone()]);
    registry.blob(repo, &sha256(&config), CONFIG, Body::Sized(config.clone()));
    registry.blob(repo, &done_digest, LAYER, Body::Sized(done.clone()));
    let half = stalls.len() / 2;
    registry.blob(
        repo,
        &stalls_digest,
        LAYER,
        Body::Stall {
            data: stalls.clone(),
            sent: half,
        },
    );
    let manifest = manifest_json(
        descriptor(CONFIG, &sha256(&config), config.len() as u64),
        vec![
            descriptor(LAYER, &done_digest, done.len() as u64),
            descriptor(LAYER, &stalls_digest, stalls.len() as u64),
        ],
    );
    registry.manifest(repo, "v1", MANIFEST, Body::Sized(manifest));

    let err = pull(&daemon, &registry.image(repo)).await.unwrap_err();
    assert_eq!(err.code(), Code::DeadlineExceeded, "{err:?}");
    // The first layer's chain ID is its diff ID (an uncompressed layer: its digest).
    let snapshot = daemon
        .root
        .join("snapshots")
        .join(done_digest.trim_start_matches("sha256:"));
    // Committed off the cancelled pull's task: in place, then recorded, then this line.
    let kept = "kept the layers a cancelled pull finished";
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !daemon.log().contains(kept) && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(daemon.log().contains(kept), "{}", daemon.log());
    assert!(
        snapshot.join("fs").is_dir(),
        "the finished layer's snapshot is not in place"
    );

    registry.blob(repo, &stalls_digest, LAYER, Body::Sized(stalls.clone()));
    pull(&daemon, &registry.image(repo)).await.unwrap();
    let fetched = |digest: &str| {
        let path = format!("/v2/{repo}/blobs/{digest}");
        registry.seen().iter().filter(|(p, _)| *p == path).count()
    };
    assert_eq!(fetched(&done_digest), 1, "the finished layer was downloaded again");
    assert_eq!(
        fetched(&stalls_digest),
        2,
        "the stalled layer: once stalled, once whole"
    );
}

/// What `scute pulls` prints for `daemon`.
fn scute_pulls(daemon: &Daemon) -> String {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_scute"))
        .args(["pulls", "--address"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    let listed = String::from_utf8_lossy(&out.stdout).into_owned();
    eprintln!("scute pulls:\n{listed}");
    listed
}

/// `bytes` gzipped at the best ratio.
fn gzip(bytes: &[u8]) -> Vec<u8> {
    use std::io::Write;
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    e.write_all(bytes).unwrap();
    e.finish().unwrap()
}

/// GET /metrics from `address`: the body.
async fn scrape(address: &str) -> String {
    let mut tcp = TcpStream::connect(address).await.unwrap();
    tcp.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {address}\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    tcp.read_to_string(&mut response).await.unwrap();
    response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default()
}

/// (l) A power cut in the middle of a pull (the daemon SIGKILLed with half a layer on disk, its
/// blobs kept, so its downloads are written as they arrive): the next start runs its check after
/// an unclean stop, keeps the partial download to resume, records no image, and the same pull
/// then completes and leaves a store doctor finds clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_cut_by_a_power_cut_completes_after_the_restart() {
    let registry = Hostile::start().await;
    let mut daemon = Daemon::start("[image]\ndiscard_unpacked_layers = false\n");
    const GZIP: &str = "application/vnd.oci.image.layer.v1.tar+gzip";
    // Random bytes do not compress: half the layer is 2 MiB, past any write buffer.
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<u8> = (0..4 << 20)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 32) as u8
        })
        .collect();
    let tar = one_file_tar("big", &data);
    let gzipped = gzip(&tar);
    let (len, digest, diff_id) = (gzipped.len() as u64, sha256(&gzipped), sha256(&tar));
    let half = Body::Stall {
        data: gzipped.clone(),
        sent: gzipped.len() / 2,
    };
    serve_image_with_typed_layer(&registry, "hostile/cut", GZIP, len, &digest, &diff_id, half);
    let image = registry.image("hostile/cut");
    let cut = spawn_pull(&daemon, &image).await;
    let ingest = daemon.root.join("content/ingest");
    let on_disk = || -> u64 {
        std::fs::read_dir(&ingest)
            .map(|d| d.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum())
            .unwrap_or(0)
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while on_disk() < (1 << 20) {
        assert!(
            std::time::Instant::now() < deadline,
            "the first half never reached the disk"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    daemon.kill();
    assert!(cut.await.unwrap().is_err(), "a pull cut by the kill fails");
    let partial = on_disk();
    eprintln!("{partial} of {len} bytes on disk at the cut");

    serve_image_with_typed_layer(
        &registry,
        "hostile/cut",
        GZIP,
        len,
        &digest,
        &diff_id,
        Body::Sized(gzipped),
    );
    daemon.start_again();
    assert!(
        daemon.log().contains("after an unclean stop"),
        "the start checks the store:\n{}",
        daemon.log()
    );
    assert_eq!(on_disk(), partial, "the partial download is kept to resume");
    assert_no_image_kept(&daemon).await;
    let id = pull(&daemon, &image)
        .await
        .expect("the pull completes after the restart");
    assert!(id.starts_with("sha256:"), "{id}");
    assert_eq!(on_disk(), 0, "the finished download left the ingest");
    let doctor = std::process::Command::new(env!("CARGO_BIN_EXE_scute"))
        .args(["doctor", "--address"])
        .arg(&daemon.socket)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&doctor.stdout);
    assert!(
        doctor.status.success() && report.contains("no problem found"),
        "{report}{}",
        String::from_utf8_lossy(&doctor.stderr)
    );
}
