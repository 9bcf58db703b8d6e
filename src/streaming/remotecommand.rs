//! Exec and attach sessions over the kubelet's remotecommand protocols: SPDY/3.1 streams
//! (v1–v5.channel.k8s.io: the client opens one stream per stdio, plus error and resize) and
//! WebSocket channels (channel.k8s.io, v4/v5, and the base64 variants: one byte of channel
//! number per message; v5 adds the client's "close stdin" message).

use std::time::Duration;

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::sync::mpsc;

use super::session::{self, bridge, parse_resizes, Activity, ClientStreams, Out, Outcome};
use super::spdy::{self, Connection, Incoming};
use super::ws::{self, WsChannels, WsSocket};
use crate::shim_client::ShimSession;

/// SPDY remotecommand protocols, preferred first.
pub const SPDY_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v3.channel.k8s.io",
    "v2.channel.k8s.io",
    "channel.k8s.io",
];

/// What the client asked for (from the Exec/Attach request).
#[derive(Debug, Clone, Copy)]
pub struct StdioOptions {
    pub stdin: bool,
    pub stdout: bool,
    pub stderr: bool,
    pub tty: bool,
}

/// Output buffered between the shim and a slow client, in messages.
const OUTPUT_QUEUE: usize = 64;

/// The session proper, given a way to start the shim side once the client's streams are there.
pub type Starter = std::pin::Pin<Box<dyn std::future::Future<Output = Result<ShimSession, String>> + Send>>;

/// An exec or attach waiting for its client's streams.
pub struct RemoteCommand {
    pub opts: StdioOptions,
    /// The exec'd command (None for attach), for the status message.
    pub command: Option<Vec<String>>,
    /// Starts the shim side once the client's streams are there.
    pub start: Starter,
}

/// Serves one exec/attach over an upgraded SPDY connection with the negotiated `protocol` ("" for
/// a client that did not negotiate: v1). `command` is the exec'd command (None for attach).
pub async fn serve_spdy(
    conn: Connection,
    mut incoming: Incoming,
    protocol: String,
    remote: RemoteCommand,
    creation_timeout: Duration,
    activity: Activity,
) {
    let RemoteCommand { opts, command, start } = remote;
    let version = protocol_version(&protocol);
    let tty = opts.tty;
    let resize_supported = version >= 3;
    let expected = 1
        + usize::from(opts.stdin)
        + usize::from(opts.stdout)
        + usize::from(opts.stderr && !tty)
        + usize::from(tty && resize_supported);

    let (mut error, mut stdin, mut stdout, mut stderr, mut resize) = (None, None, None, None, None);
    let collect = async {
        let mut received = 0;
        while received < expected {
            let Some(stream) = incoming.accept().await else {
                return Err("the client closed the connection before opening its streams".to_string());
            };
            let kind = stream.header("streamtype").unwrap_or("").to_string();
            let (recv, mut send) = stream.split();
            if send.reply(Vec::new(), false).await.is_err() {
                return Err("the connection broke while opening streams".into());
            }
            let slot = match kind.as_str() {
                "error" => &mut error,
                "stdin" => &mut stdin,
                "stdout" => &mut stdout,
                "stderr" => &mut stderr,
                "resize" => &mut resize,
                other => {
                    tracing::debug!(stream_type = other, "unexpected stream type, reset");
                    send.reset(spdy::RstStatus::ProtocolError);
                    continue;
                }
            };
            *slot = Some((recv, send));
            received += 1;
        }
        Ok(())
    };
    match tokio::time::timeout(creation_timeout, collect).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::info!(error = %e, "streaming session ended before it started");
            conn.close();
            return;
        }
        Err(_) => {
            tracing::info!(?creation_timeout, "client did not open its streams in time");
            conn.close();
            return;
        }
    }
    let Some((_, mut error)) = error else {
        tracing::info!("client opened no error stream; closing");
        conn.close();
        return;
    };

    // v1 clients get their stdin closed at once (the kubelet's v1 behaviour).
    if version == 1 {
        if let Some((_, send)) = stdin.as_mut() {
            let _ = send.finish().await;
        }
    }
    // Our halves of stdin and resize stay open (held by their tasks) until the client ends them:
    // client-go takes the server's end of stdin for "stop sending", and would send nothing.
    let stdin_rx = stdin.map(|(mut recv, send)| {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(async move {
            let _open = send;
            while let Some(data) = recv.recv().await {
                if tx.send(data).await.is_err() {
                    return;
                }
            }
        });
        rx
    });
    let resize_rx = resize.map(|(mut recv, send)| {
        let (tx, rx) = mpsc::channel(4);
        tokio::spawn(async move {
            let _open = send;
            let mut pending = Vec::new();
            while let Some(data) = recv.recv().await {
                let Ok(sizes) = parse_resizes(&mut pending, &data) else {
                    return;
                };
                for size in sizes {
                    if tx.send(size).await.is_err() {
                        return;
                    }
                }
            }
        });
        rx
    });
    let (out_tx, mut out_rx) = mpsc::channel::<Out>(OUTPUT_QUEUE);
    let mut stdout_send = stdout.map(|(_, s)| s);
    let mut stderr_send = stderr.map(|(_, s)| s);
    let writer = async move {
        while let Some(out) = out_rx.recv().await {
            let target = match out {
                Out::Stdout(data) => stdout_send.as_mut().map(|s| (s, data)),
                Out::Stderr(data) => stderr_send.as_mut().map(|s| (s, data)),
            };
            if let Some((send, data)) = target {
                if send.send(&data).await.is_err() {
                    // The client is gone; the connection's end stops the session.
                    return (stdout_send, stderr_send);
                }
            }
        }
        (stdout_send, stderr_send)
    };
    let writer = tokio::spawn(writer);

    let outcome = match start.await {
        Ok(shim) => {
            let client = ClientStreams {
                stdin: stdin_rx,
                resize: resize_rx,
                output: out_tx,
            };
            tokio::select! {
                outcome = bridge(shim, client, activity) => outcome,
                _ = conn.closed() => {
                    tracing::info!("client closed the connection; session ended");
                    writer.abort();
                    return;
                }
            }
        }
        Err(e) => {
            drop(out_tx);
            Outcome::Failed(e)
        }
    };
    // All output is queued; let the writer drain it, then end every stream and the connection.
    // The stream halves live until the GOAWAY is queued: dropping one the client has not closed
    // would reset it.
    let mut finished = Vec::new();
    if let Ok((stdout_send, stderr_send)) = writer.await {
        for mut send in [stdout_send, stderr_send].into_iter().flatten() {
            let _ = send.finish().await;
            finished.push(send);
        }
    }
    if let Some(message) = session::status_message(&outcome, version >= 4, command.as_deref()) {
        let _ = error.send(&message).await;
    }
    let _ = error.finish().await;
    conn.close();
    drop(finished);
}

/// 1 to 5 from a protocol name ("" and "channel.k8s.io" are 1).
fn protocol_version(protocol: &str) -> u32 {
    protocol
        .strip_prefix('v')
        .and_then(|rest| rest.split('.').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(1)
}

/// WebSocket remotecommand protocols, preferred first.
pub const WS_PROTOCOLS: &[&str] = &[
    "v5.channel.k8s.io",
    "v4.channel.k8s.io",
    "v4.base64.channel.k8s.io",
    "channel.k8s.io",
    "base64.channel.k8s.io",
];

const STDIN: u8 = 0;
const STDOUT: u8 = 1;
const STDERR: u8 = 2;
const ERROR: u8 = 3;
const RESIZE: u8 = 4;

/// Serves one exec/attach over a WebSocket with the negotiated `protocol` ("" = binary, v1).
pub async fn serve_websocket(socket: WsSocket, protocol: String, remote: RemoteCommand, activity: Activity) {
    let RemoteCommand { opts, command, start } = remote;
    let channels = WsChannels::for_protocol(&protocol);
    let version = protocol_version(&protocol.replace(".base64", ""));
    let (mut sink, mut source) = socket.split();
    // The kubelet tells the client the session is open with an empty message on the lowest
    // channel it writes; clients wait for it.
    let first = if opts.stdout {
        STDOUT
    } else if opts.stderr {
        STDERR
    } else {
        ERROR
    };
    if sink.send(channels.encode(first, &[])).await.is_err() {
        return;
    }

    let (stdin_tx, stdin_rx) = mpsc::channel::<Bytes>(16);
    let (resize_tx, resize_rx) = mpsc::channel(4);
    let reader_activity = activity.clone();
    let reader = tokio::spawn(async move {
        let mut stdin_tx = opts.stdin.then_some(stdin_tx);
        let mut pending = Vec::new();
        while let Some(message) = source.next().await {
            let Ok(message) = message else { break };
            if message.is_close() {
                break;
            }
            let Some((channel, data)) = channels.decode(&message) else {
                continue;
            };
            reader_activity.touch();
            match channel {
                STDIN => {
                    if let Some(tx) = &stdin_tx {
                        if tx.send(data).await.is_err() {
                            stdin_tx = None;
                        }
                    }
                }
                RESIZE if opts.tty => {
                    let Ok(sizes) = parse_resizes(&mut pending, &data) else {
                        continue;
                    };
                    for size in sizes {
                        let _ = resize_tx.send(size).await;
                    }
                }
                // v5: the client closes one of its streams; for stdin, that is EOF.
                ws::CLOSE_CHANNEL if version >= 5 && data.first() == Some(&STDIN) => stdin_tx = None,
                _ => {}
            }
        }
    });

    let (out_tx, mut out_rx) = mpsc::channel::<Out>(OUTPUT_QUEUE);
    let outcome = match start.await {
        Ok(shim) => {
            let client = ClientStreams {
                stdin: opts.stdin.then_some(stdin_rx),
                resize: opts.tty.then_some(resize_rx),
                output: out_tx,
            };
            let session = bridge(shim, client, activity);
            tokio::pin!(session);
            let mut reader = reader;
            loop {
                tokio::select! {
                    outcome = &mut session => break outcome,
                    Some(out) = out_rx.recv() => {
                        let message = match out {
                            Out::Stdout(data) if opts.stdout => channels.encode(STDOUT, &data),
                            Out::Stderr(data) if opts.stderr => channels.encode(STDERR, &data),
                            _ => continue,
                        };
                        if sink.send(message).await.is_err() {
                            tracing::info!("client went away; session ended");
                            return;
                        }
                    }
                    _ = &mut reader => {
                        tracing::info!("client closed the WebSocket; session ended");
                        return;
                    }
                }
            }
        }
        Err(e) => Outcome::Failed(e),
    };
    // The session ended: what it wrote last is still queued.
    while let Ok(out) = out_rx.try_recv() {
        let message = match out {
            Out::Stdout(data) if opts.stdout => channels.encode(STDOUT, &data),
            Out::Stderr(data) if opts.stderr => channels.encode(STDERR, &data),
            _ => continue,
        };
        if sink.send(message).await.is_err() {
            return;
        }
    }
    if let Some(status) = session::status_message(&outcome, version >= 4, command.as_deref()) {
        let _ = sink.send(channels.encode(ERROR, &status)).await;
    }
    let _ = sink.send(ws::normal_close()).await;
    let _ = sink.close().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn protocol_versions() {
        assert_eq!(protocol_version(""), 1);
        assert_eq!(protocol_version("channel.k8s.io"), 1);
        assert_eq!(protocol_version("v2.channel.k8s.io"), 2);
        assert_eq!(protocol_version("v4.channel.k8s.io"), 4);
        assert_eq!(protocol_version("v5.channel.k8s.io"), 5);
    }
}
