//! Port-forward sessions: TCP connections to a port on the pod's loopback (made inside its network
//! namespace, see `SandboxManager::connect_port`), carried over SPDY (portforward.k8s.io: the
//! client opens a data and an error stream per forwarded connection, paired by their requestid
//! header) or over the kubelet's WebSocket channels (a data and an error channel per requested
//! port, each first carrying the port number). SPDY tunnelled through WebSocket (client-go's
//! newer transport) is SPDY here once `ws::tunnel` has unwrapped it.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use super::session::Activity;
use super::spdy::{Connection, Incoming, RecvStream, RstStatus, SendStream};
use super::ws::{self, WsChannels, WsSocket};

/// The SPDY port-forward protocol.
pub const SPDY_PROTOCOLS: &[&str] = &["portforward.k8s.io"];
/// WebSocket port-forward: the kubelet's channel protocols, and SPDY tunnelled.
pub const WS_PROTOCOLS: &[&str] = &[
    "SPDY/3.1+portforward.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];

/// Opens a connection to a port of the pod; Err is the message for the client.
pub type Connector = Arc<dyn Fn(u16) -> Pin<Box<dyn Future<Output = Result<TcpStream, String>> + Send>> + Send + Sync>;

const COPY_CHUNK: usize = 32 << 10;
/// After the pod closed a forwarded connection, how long the client may still send.
const UPSTREAM_GRACE: Duration = Duration::from_secs(1);

/// Serves one port-forward SPDY connection until the client closes it.
pub async fn serve_spdy(
    conn: Connection,
    mut incoming: Incoming,
    connect: Connector,
    creation_timeout: Duration,
    activity: Activity,
) {
    struct Half {
        data: Option<(RecvStream, SendStream)>,
        error: Option<(RecvStream, SendStream)>,
        since: Instant,
        port: u16,
    }
    let mut pairs: HashMap<String, Half> = HashMap::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            stream = incoming.accept() => {
                let Some(stream) = stream else { break };
                let port = stream.header("port").and_then(|p| p.parse::<u16>().ok()).filter(|p| *p > 0);
                let kind = stream.header("streamtype").unwrap_or("").to_string();
                let (Some(port), "data" | "error") = (port, kind.as_str()) else {
                    tracing::info!(
                        port = stream.header("port"),
                        stream_type = %kind,
                        "port-forward stream without a valid port and stream type, refused"
                    );
                    let (_, send) = stream.split();
                    send.reset(RstStatus::RefusedStream);
                    continue;
                };
                let request_id = match stream.header("requestid") {
                    Some(id) if !id.is_empty() => id.to_string(),
                    // Old clients send no request id: their data stream follows its error stream.
                    _ if kind == "error" => stream.id().to_string(),
                    _ => stream.id().saturating_sub(2).to_string(),
                };
                let half = pairs.entry(request_id.clone()).or_insert_with(|| Half {
                    data: None,
                    error: None,
                    since: Instant::now(),
                    port,
                });
                let slot = if kind == "data" { &mut half.data } else { &mut half.error };
                let (recv, mut send) = stream.split();
                if slot.is_some() {
                    tracing::info!(request_id, kind, "duplicate port-forward stream, refused");
                    send.reset(RstStatus::ProtocolError);
                    continue;
                }
                // Clients wait for each stream's reply before opening the next.
                if send.reply(Vec::new(), false).await.is_err() {
                    break;
                }
                *slot = Some((recv, send));
                if half.data.is_some() && half.error.is_some() {
                    let half = pairs.remove(&request_id).expect("just seen");
                    let (data, error) = (half.data.expect("complete"), half.error.expect("complete"));
                    tokio::spawn(forward_pair(half.port, data, error, connect.clone(), activity.clone()));
                }
            }
            _ = tick.tick() => {
                let now = Instant::now();
                let expired: Vec<String> = pairs
                    .iter()
                    .filter(|(_, h)| now.duration_since(h.since) > creation_timeout)
                    .map(|(id, _)| id.clone())
                    .collect();
                for id in expired {
                    let half = pairs.remove(&id).expect("listed");
                    tracing::info!(request_id = id, "port-forward stream pair incomplete in time");
                    for (_, mut send) in [half.data, half.error].into_iter().flatten() {
                        let _ = send.send(b"timed out waiting for streams").await;
                        let _ = send.finish().await;
                    }
                }
            }
        }
    }
    conn.close();
}

/// One forwarded connection: data both ways between the data stream and the pod's port; a
/// failure is reported as JSON on the error stream (the kubelet's format).
async fn forward_pair(
    port: u16,
    (data_recv, mut data_send): (RecvStream, SendStream),
    (_error_recv, mut error_send): (RecvStream, SendStream),
    connect: Connector,
    activity: Activity,
) {
    match connect(port).await {
        Ok(tcp) => {
            if let Err(e) = copy_both(tcp, data_recv, &mut data_send, &activity).await {
                tracing::debug!(port, error = %e, "port-forward connection ended with an error");
            }
        }
        Err(message) => {
            tracing::info!(port, error = %message, "port-forward connect failed");
            let body = json!({
                "closeConnection": false,
                "message": format!("error forwarding port {port} to pod: {message}"),
            });
            let _ = error_send.send(format!("{body}\n").as_bytes()).await;
            let _ = data_send.finish().await;
        }
    }
    let _ = error_send.finish().await;
}

/// Copies until both directions ended: the client's FIN shuts down the TCP write side; the pod's
/// EOF finishes the data stream.
async fn copy_both(
    tcp: TcpStream,
    mut from_client: RecvStream,
    to_client: &mut SendStream,
    activity: &Activity,
) -> std::io::Result<()> {
    let (mut tcp_read, mut tcp_write) = tcp.into_split();
    let upstream = async {
        while let Some(chunk) = from_client.recv().await {
            activity.touch();
            tcp_write.write_all(&chunk).await?;
        }
        tcp_write.shutdown().await
    };
    let downstream = async {
        let mut buf = vec![0u8; COPY_CHUNK];
        loop {
            let n = tcp_read.read(&mut buf).await?;
            if n == 0 {
                break;
            }
            activity.touch();
            to_client.send(&buf[..n]).await?;
        }
        to_client.finish().await
    };
    // The client's end of input does not end the answer (an HTTP request is sent, then the
    // reply read); the pod's end of output gives the client a moment (containerd: 1 s) to finish
    // sending, so a client that keeps its side open until the stream ends is not stuck.
    tokio::pin!(upstream);
    tokio::pin!(downstream);
    tokio::select! {
        up = &mut upstream => {
            up?;
            downstream.await
        }
        down = &mut downstream => {
            down?;
            let _ = tokio::time::timeout(UPSTREAM_GRACE, upstream).await;
            Ok(())
        }
    }
}

/// Serves the kubelet's channel-based WebSocket port-forward for `ports` (from the request).
pub async fn serve_websocket(
    socket: WsSocket,
    protocol: String,
    ports: Vec<u16>,
    connect: Connector,
    activity: Activity,
) {
    let channels = WsChannels::for_protocol(&protocol);
    let (mut sink, mut source) = socket.split();
    for (i, port) in ports.iter().enumerate() {
        for channel in [2 * i, 2 * i + 1] {
            if sink
                .send(channels.encode(channel as u8, &port.to_le_bytes()))
                .await
                .is_err()
            {
                return;
            }
        }
    }
    let (out_tx, mut out_rx) = mpsc::channel::<Message>(64);
    let mut to_pod = Vec::new();
    let mut forwards = tokio::task::JoinSet::new();
    for (i, &port) in ports.iter().enumerate() {
        let (tx, mut rx) = mpsc::channel::<Bytes>(16);
        to_pod.push(tx);
        let (connect, out_tx, activity) = (connect.clone(), out_tx.clone(), activity.clone());
        let (data_channel, error_channel) = ((2 * i) as u8, (2 * i + 1) as u8);
        forwards.spawn(async move {
            let tcp = match connect(port).await {
                Ok(tcp) => tcp,
                Err(message) => {
                    let text = format!("error forwarding port {port} to pod: {message}");
                    let _ = out_tx.send(channels.encode(error_channel, text.as_bytes())).await;
                    return;
                }
            };
            let (mut tcp_read, mut tcp_write) = tcp.into_split();
            let upstream = async {
                while let Some(chunk) = rx.recv().await {
                    if tcp_write.write_all(&chunk).await.is_err() {
                        break;
                    }
                }
                let _ = tcp_write.shutdown().await;
            };
            let downstream = async {
                let mut buf = vec![0u8; COPY_CHUNK];
                while let Ok(n) = tcp_read.read(&mut buf).await {
                    if n == 0 {
                        break;
                    }
                    activity.touch();
                    if out_tx.send(channels.encode(data_channel, &buf[..n])).await.is_err() {
                        break;
                    }
                }
            };
            tokio::join!(upstream, downstream);
        });
    }
    drop(out_tx);
    loop {
        tokio::select! {
            message = source.next() => {
                let Some(Ok(message)) = message else { break };
                if message.is_close() {
                    break;
                }
                let Some((channel, data)) = channels.decode(&message) else { continue };
                activity.touch();
                // Only data channels (even) carry client bytes.
                if let Some(tx) = (channel % 2 == 0).then(|| to_pod.get(channel as usize / 2)).flatten() {
                    let _ = tx.send(data).await;
                }
            }
            out = out_rx.recv() => {
                let Some(message) = out else { break };
                if sink.send(message).await.is_err() {
                    break;
                }
            }
        }
    }
    forwards.abort_all();
    let _ = sink.send(ws::normal_close()).await;
}
