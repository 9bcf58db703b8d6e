//! WebSocket pieces shared by exec/attach and port-forward: the handshake answer, the kubelet's
//! channel framing (binary, or base64 text), and SPDY tunnelled through binary messages (what
//! client-go's port-forward over WebSocket speaks: "SPDY/3.1+portforward.k8s.io").

use base64::Engine;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use hyper::upgrade::Upgraded;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

pub type WsSocket = WebSocketStream<TokioIo<Upgraded>>;

/// Channel number of v5's "the client closed this stream" message (its data: the channel).
pub const CLOSE_CHANNEL: u8 = 255;

/// Prefix of the subprotocols that tunnel SPDY through WebSocket binary messages.
pub const SPDY_TUNNEL_PREFIX: &str = "SPDY/3.1+";

/// A close frame with status 1000: Go's clients (gorilla) take a close without a status (1005)
/// for an error, and report the session as failed.
pub fn normal_close() -> Message {
    use tokio_tungstenite::tungstenite::protocol::frame::{coding::CloseCode, CloseFrame};
    Message::Close(Some(CloseFrame {
        code: CloseCode::Normal,
        reason: "".into(),
    }))
}

/// The Sec-WebSocket-Accept value for a client's Sec-WebSocket-Key (RFC 6455 section 4.2.2).
pub fn accept_key(key: &[u8]) -> String {
    tokio_tungstenite::tungstenite::handshake::derive_accept_key(key)
}

/// The first of the client's offered subprotocols (Sec-WebSocket-Protocol, comma separated, maybe
/// over several header lines) that the server supports; "" when the client offered none.
pub fn negotiate<'a>(offered: impl Iterator<Item = &'a str>, supported: &[&str]) -> Option<String> {
    let offered: Vec<&str> = offered
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .collect();
    if offered.is_empty() {
        return Some(String::new());
    }
    offered.into_iter().find(|p| supported.contains(p)).map(str::to_owned)
}

/// Channel framing of one negotiated protocol.
#[derive(Debug, Clone, Copy)]
pub struct WsChannels {
    base64: bool,
}

impl WsChannels {
    pub fn for_protocol(protocol: &str) -> Self {
        WsChannels {
            base64: protocol.contains("base64."),
        }
    }

    pub fn encode(&self, channel: u8, data: &[u8]) -> Message {
        if self.base64 {
            let mut text = String::with_capacity(1 + data.len() * 4 / 3 + 4);
            text.push(char::from(b'0' + channel));
            base64::engine::general_purpose::STANDARD.encode_string(data, &mut text);
            Message::Text(text.into())
        } else {
            let mut bytes = Vec::with_capacity(1 + data.len());
            bytes.push(channel);
            bytes.extend_from_slice(data);
            Message::Binary(bytes.into())
        }
    }

    /// The channel and data of a client message; None for control frames and malformed ones.
    pub fn decode(&self, message: &Message) -> Option<(u8, Bytes)> {
        match message {
            Message::Binary(bytes) if !self.base64 => {
                let (&channel, data) = bytes.split_first()?;
                Some((channel, Bytes::copy_from_slice(data)))
            }
            Message::Text(text) if self.base64 => {
                // The channel is one ASCII digit. Sliced as bytes: a first character of several
                // bytes made `&text[1..]` panic (found by the websocket_channels fuzz target).
                let (&first, rest) = text.as_bytes().split_first()?;
                let channel = first.checked_sub(b'0').filter(|c| *c <= 9)?;
                let data = base64::engine::general_purpose::STANDARD.decode(rest).ok()?;
                Some((channel, data.into()))
            }
            _ => None,
        }
    }
}

/// A byte stream over a WebSocket whose binary messages carry consecutive pieces of it, for the
/// SPDY tunnel. The socket is pumped by a task; the returned end behaves like a TCP stream.
pub fn tunnel(socket: WsSocket) -> DuplexStream {
    let (ours, theirs) = tokio::io::duplex(256 << 10);
    let (mut sink, mut source) = socket.split();
    let (mut read_half, mut write_half) = tokio::io::split(theirs);
    tokio::spawn(async move {
        let inbound = async {
            while let Some(Ok(message)) = source.next().await {
                match message {
                    Message::Binary(data) if write_half.write_all(&data).await.is_err() => break,
                    Message::Close(_) => break,
                    _ => {}
                }
            }
            let _ = write_half.shutdown().await;
        };
        let outbound = async {
            let mut buf = vec![0u8; 32 << 10];
            loop {
                match read_half.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        if sink
                            .send(Message::Binary(Bytes::copy_from_slice(&buf[..n])))
                            .await
                            .is_err()
                        {
                            break;
                        }
                    }
                }
            }
            let _ = sink.send(normal_close()).await;
            let _ = sink.close().await;
        };
        // Either direction ending ends the tunnel (SPDY has its own close handshake inside).
        tokio::select! {
            _ = inbound => {}
            _ = outbound => {}
        }
    });
    ours
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn negotiation_takes_the_clients_first_supported() {
        let supported = ["v5.channel.k8s.io", "v4.channel.k8s.io"];
        let pick = |offers: &[&str]| negotiate(offers.iter().copied(), &supported);
        assert_eq!(
            pick(&["v4.channel.k8s.io, v5.channel.k8s.io"]).as_deref(),
            Some("v4.channel.k8s.io")
        );
        assert_eq!(pick(&["x", "v5.channel.k8s.io"]).as_deref(), Some("v5.channel.k8s.io"));
        assert_eq!(pick(&[]).as_deref(), Some(""));
        assert_eq!(pick(&["nope"]), None);
    }

    #[test]
    fn channel_framing_round_trips() {
        for protocol in ["v4.channel.k8s.io", "v4.base64.channel.k8s.io"] {
            let channels = WsChannels::for_protocol(protocol);
            let message = channels.encode(2, b"hello\x00\xff");
            assert_eq!(
                channels.decode(&message),
                Some((2, Bytes::from_static(b"hello\x00\xff")))
            );
        }
        let binary = WsChannels::for_protocol("v5.channel.k8s.io");
        assert_eq!(binary.encode(1, b"x"), Message::Binary(Bytes::from_static(b"\x01x")));
        let text = WsChannels::for_protocol("base64.channel.k8s.io");
        assert_eq!(text.encode(1, b"x"), Message::Text("1eA==".into()));
        assert_eq!(binary.decode(&Message::Binary(Bytes::new())), None);
        assert_eq!(text.decode(&Message::Text("9!!!".into())), None);
    }

    #[test]
    fn malformed_base64_messages_are_no_channel_messages() {
        let channels = WsChannels::for_protocol("v4.base64.channel.k8s.io");
        for text in ["é aGk=", "", "x aGk=", ":aGk=", "1!!!"] {
            assert_eq!(channels.decode(&Message::Text(text.into())), None, "{text:?}");
        }
        assert_eq!(
            channels.decode(&Message::Text("1aGk=".into())),
            Some((1, Bytes::from_static(b"hi")))
        );
    }

    #[test]
    fn accept_key_matches_rfc_6455() {
        assert_eq!(accept_key(b"dGhlIHNhbXBsZSBub25jZQ=="), "s3pPLMBiTxaQ9kYGzzhZRbK+xOo=");
    }
}
