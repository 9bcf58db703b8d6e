use std::future::Future;

use tokio::io::DuplexStream;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::headers::{Compressor, Decompressor};
use super::reader::lookup;

use super::*;

const PATIENCE: Duration = Duration::from_secs(10);

fn h(pairs: &[(&str, &str)]) -> Headers {
    pairs.iter().map(|(n, v)| (n.to_string(), v.to_string())).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    let s: String = s.split_whitespace().collect();
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

async fn within<F: Future>(f: F) -> F::Output {
    tokio::time::timeout(PATIENCE, f).await.expect("timed out")
}

async fn eventually(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while !cond() {
        assert!(tokio::time::Instant::now() < deadline, "never happened: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn live_streams(c: &Connection) -> usize {
    lock(&c.keep.inner.state).streams.len()
}

fn pair() -> ((Connection, Incoming), (Connection, Incoming)) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    (Connection::new(a, Role::Client), Connection::new(b, Role::Server))
}

async fn read_all(r: &mut RecvStream) -> Vec<u8> {
    let mut all = Vec::new();
    while let Some(chunk) = within(r.recv()).await {
        all.extend_from_slice(&chunk);
    }
    all
}

fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u8)
                .wrapping_mul(31)
                .wrapping_add((i >> 10) as u8)
                .wrapping_add(seed)
        })
        .collect()
}

/// The peer side written by hand: raw frames, its own compression contexts.
struct RawPeer {
    io: DuplexStream,
    buf: BytesMut,
    compressor: Compressor,
    decompressor: Decompressor,
}

impl RawPeer {
    async fn write(&mut self, bytes: &[u8]) {
        self.io.write_all(bytes).await.unwrap();
    }

    async fn send(&mut self, frame: Frame) {
        let mut buf = BytesMut::new();
        frame.encode(&mut buf);
        self.write(&buf).await;
    }

    fn block(&mut self, headers: &[(&str, &str)]) -> Bytes {
        self.compressor.compress(&h(headers)).unwrap().into()
    }

    async fn syn_stream(&mut self, stream_id: u32, headers: &[(&str, &str)], fin: bool) {
        let block = self.block(headers);
        self.send(Frame::SynStream {
            stream_id,
            associated_id: 0,
            priority: 0,
            slot: 0,
            fin,
            unidirectional: false,
            block,
        })
        .await;
    }

    /// The next frame from the server; None at EOF.
    async fn frame(&mut self) -> Option<Frame> {
        within(async {
            loop {
                if let Some(frame) = frame::decode(&mut self.buf).unwrap() {
                    return Some(frame);
                }
                if self.io.read_buf(&mut self.buf).await.unwrap() == 0 {
                    return None;
                }
            }
        })
        .await
    }

    /// The next frame that is not a WINDOW_UPDATE.
    async fn frame_skipping_updates(&mut self) -> Option<Frame> {
        loop {
            match self.frame().await {
                Some(Frame::WindowUpdate { .. }) => continue,
                other => return other,
            }
        }
    }

    fn headers(&mut self, block: &[u8]) -> Headers {
        self.decompressor.decode(block).unwrap()
    }
}

fn server_with_raw_peer() -> (Connection, Incoming, RawPeer) {
    let (a, b) = tokio::io::duplex(64 * 1024);
    let (server, incoming) = Connection::new(b, Role::Server);
    let peer = RawPeer {
        io: a,
        buf: BytesMut::new(),
        compressor: Compressor::new(),
        decompressor: Decompressor::new(),
    };
    (server, incoming, peer)
}

/// Accepts one stream and answers it with empty headers, as the kubelet's server does.
async fn accept_and_reply(incoming: &mut Incoming) -> (Headers, RecvStream, SendStream) {
    let stream = within(incoming.accept()).await.expect("a stream");
    let headers = stream.headers().clone();
    let (recv, mut send) = stream.split();
    send.reply(Headers::new(), false).await.unwrap();
    (headers, recv, send)
}

#[tokio::test]
async fn open_reply_data_and_half_close() {
    let ((client, _ci), (server, mut si)) = pair();
    let stream = client
        .open(h(&[("streamtype", "data"), ("port", "80"), ("requestid", "0")]), false)
        .await
        .unwrap();
    assert_eq!(stream.id(), 1);
    assert_eq!(stream.header("port"), Some("80"));
    let (mut crecv, mut csend) = stream.split();

    let accepted = within(si.accept()).await.unwrap();
    assert_eq!(accepted.id(), 1);
    assert_eq!(accepted.header("StreamType"), Some("data"));
    assert_eq!(
        accepted.headers(),
        &h(&[("streamtype", "data"), ("port", "80"), ("requestid", "0")])
    );
    let (mut srecv, mut ssend) = accepted.split();
    assert_eq!(
        ssend.send(b"too early").await.unwrap_err().kind(),
        io::ErrorKind::InvalidInput,
        "data before SYN_REPLY"
    );
    ssend.reply(h(&[("X-Reply", "yes")]), false).await.unwrap();
    assert_eq!(
        ssend.reply(Headers::new(), false).await.unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    assert_eq!(within(crecv.reply_headers()).await.unwrap(), h(&[("x-reply", "yes")]));

    csend.send(b"ping").await.unwrap();
    assert_eq!(within(srecv.recv()).await.unwrap(), &b"ping"[..]);
    ssend.send(b"pong").await.unwrap();
    assert_eq!(within(crecv.recv()).await.unwrap(), &b"pong"[..]);

    // Half-close from the client: the server reads EOF but can still write.
    csend.finish().await.unwrap();
    csend.finish().await.unwrap();
    assert_eq!(csend.send(b"x").await.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
    assert_eq!(within(srecv.recv()).await, None);
    assert_eq!(within(srecv.recv()).await, None);
    ssend.send(b"after your fin").await.unwrap();
    assert_eq!(within(crecv.recv()).await.unwrap(), &b"after your fin"[..]);
    ssend.finish().await.unwrap();
    assert_eq!(within(crecv.recv()).await, None);

    // Closed both ways: neither side keeps the stream.
    eventually("streams forgotten", || {
        live_streams(&client) == 0 && live_streams(&server) == 0
    })
    .await;
}

#[tokio::test]
async fn server_opens_even_streams() {
    let ((client, mut ci), (server, _si)) = pair();
    let first = server.open(h(&[("a", "1")]), false).await.unwrap();
    let second = server.open(h(&[("a", "2")]), true).await.unwrap();
    assert_eq!((first.id(), second.id()), (2, 4));
    let (_ca, mut ca_recv, mut ca_send) = accept_and_reply(&mut ci).await;
    let b = within(ci.accept()).await.unwrap();
    assert_eq!((b.id(), b.header("a")), (4, Some("2")));
    let (mut first_recv, mut first_send) = first.split();
    assert_eq!(within(first_recv.reply_headers()).await.unwrap(), Headers::new());
    assert_eq!(
        first_send.reply(Headers::new(), false).await.unwrap_err().kind(),
        io::ErrorKind::InvalidInput
    );
    first_send.send(b"from server").await.unwrap();
    assert_eq!(within(ca_recv.recv()).await.unwrap(), &b"from server"[..]);
    ca_send.send(b"from client").await.unwrap();
    assert_eq!(within(first_recv.recv()).await.unwrap(), &b"from client"[..]);
    // The second stream was opened with FIN: the client reads EOF at once.
    let (mut b_recv, _b_send) = b.split();
    assert_eq!(within(b_recv.recv()).await, None);
    drop(client);
}

#[tokio::test]
async fn reset_by_client_ends_the_stream_on_both_sides() {
    let ((client, _ci), (_server, mut si)) = pair();
    let (mut crecv, mut csend) = client.open(Headers::new(), false).await.unwrap().split();
    let (_, mut srecv, mut ssend) = accept_and_reply(&mut si).await;
    within(crecv.reply_headers()).await.unwrap();
    csend.send(b"doomed").await.unwrap();
    csend.reset(RstStatus::Cancel);
    // Locally everything stops at once.
    assert_eq!(within(crecv.recv()).await, None);
    assert_eq!(
        csend.send(b"x").await.unwrap_err().kind(),
        io::ErrorKind::ConnectionReset
    );
    // The server may see the data before the reset, then nothing more.
    while let Some(data) = within(srecv.recv()).await {
        assert_eq!(data, &b"doomed"[..]);
    }
    let deadline = tokio::time::Instant::now() + PATIENCE;
    loop {
        match ssend.send(b"anyone?").await {
            Err(e) => break assert_eq!(e.kind(), io::ErrorKind::ConnectionReset),
            Ok(()) => assert!(tokio::time::Instant::now() < deadline),
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test]
async fn reset_by_server_fails_the_clients_wait_for_a_reply() {
    let ((client, _ci), (_server, mut si)) = pair();
    let (mut crecv, _csend) = client.open(Headers::new(), false).await.unwrap().split();
    let stream = within(si.accept()).await.unwrap();
    let (_srecv, ssend) = stream.split();
    ssend.reset(RstStatus::InternalError);
    assert_eq!(
        within(crecv.reply_headers()).await.unwrap_err().kind(),
        io::ErrorKind::ConnectionReset
    );
    assert_eq!(within(crecv.recv()).await, None);
}

#[tokio::test]
async fn data_before_a_peer_reset_is_still_delivered() {
    // client-go closes a connection by resetting every stream: what arrived first must survive it.
    let (_server, mut incoming, mut peer) = server_with_raw_peer();
    peer.syn_stream(1, &[], false).await;
    peer.send(Frame::Data {
        stream_id: 1,
        fin: false,
        data: Bytes::from_static(b"abc"),
    })
    .await;
    peer.send(Frame::Data {
        stream_id: 1,
        fin: true,
        data: Bytes::from_static(b"def"),
    })
    .await;
    peer.send(Frame::RstStream {
        stream_id: 1,
        status: RstStatus::Cancel.code(),
    })
    .await;
    peer.syn_stream(3, &[], false).await;
    let (mut recv, mut send) = within(incoming.accept()).await.unwrap().split();
    within(incoming.accept()).await.unwrap(); // stream 3: the reset has been processed
    assert_eq!(read_all(&mut recv).await, b"abcdef");
    let err = send.reply(Headers::new(), false).await.unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionReset);
}

#[tokio::test]
async fn a_maximal_data_frame_is_accepted_whole() {
    let (_server, mut incoming, mut peer) = server_with_raw_peer();
    peer.syn_stream(1, &[], false).await;
    let (_, mut recv, _send) = accept_and_reply(&mut incoming).await;
    let big = pattern(frame::MAX_PAYLOAD, 5);
    let writer = tokio::spawn(async move {
        peer.send(Frame::Data {
            stream_id: 1,
            fin: true,
            data: big.into(),
        })
        .await;
        peer
    });
    assert!(read_all(&mut recv).await == pattern(frame::MAX_PAYLOAD, 5));
    within(writer).await.unwrap();
}

#[tokio::test]
async fn headers_fin_and_unidirectional_streams() {
    let (_server, mut incoming, mut peer) = server_with_raw_peer();
    peer.syn_stream(1, &[], false).await;
    let block = peer.block(&[("ignored", "yes")]);
    peer.send(Frame::Headers {
        stream_id: 1,
        fin: true,
        block,
    })
    .await;
    let (_, mut recv, _send) = accept_and_reply(&mut incoming).await;
    assert_eq!(within(recv.recv()).await, None);
    // FLAG_UNIDIRECTIONAL: the peer expects neither a reply nor data from us.
    let block = peer.block(&[("streamtype", "stdin")]);
    peer.send(Frame::SynStream {
        stream_id: 3,
        associated_id: 0,
        priority: 0,
        slot: 0,
        fin: false,
        unidirectional: true,
        block,
    })
    .await;
    let (mut recv, mut send) = within(incoming.accept()).await.unwrap().split();
    send.reply(Headers::new(), false).await.unwrap();
    assert_eq!(send.send(b"x").await.unwrap_err().kind(), io::ErrorKind::BrokenPipe);
    peer.send(Frame::Data {
        stream_id: 3,
        fin: true,
        data: Bytes::from_static(b"in"),
    })
    .await;
    assert_eq!(read_all(&mut recv).await, b"in");
    // Only the SYN_REPLY for stream 1 went out.
    assert!(matches!(peer.frame().await, Some(Frame::SynReply { stream_id: 1, .. })));
    drop((recv, send));
    peer.send(Frame::Ping { id: 5 }).await;
    assert_eq!(peer.frame_skipping_updates().await, Some(Frame::Ping { id: 5 }));
}

#[tokio::test]
async fn a_stream_dropped_unanswered_is_refused() {
    let ((client, _ci), (_server, mut si)) = pair();
    let (mut crecv, _csend) = client.open(Headers::new(), false).await.unwrap().split();
    drop(within(si.accept()).await.unwrap());
    assert_eq!(
        within(crecv.reply_headers()).await.unwrap_err().kind(),
        io::ErrorKind::ConnectionRefused
    );
}

#[tokio::test]
async fn dropping_the_halves_finishes_then_cancels() {
    let ((client, _ci), (server, mut si)) = pair();
    let (mut crecv, mut csend) = client.open(Headers::new(), false).await.unwrap().split();
    let (_, srecv, mut ssend) = accept_and_reply(&mut si).await;
    ssend.send(b"last words").await.unwrap();
    // Dropping the send half is a FIN: the client gets the data, then EOF, and can still write.
    drop(ssend);
    assert_eq!(within(crecv.recv()).await.unwrap(), &b"last words"[..]);
    assert_eq!(within(crecv.recv()).await, None);
    csend.send(b"still listening?").await.unwrap();
    // Dropping the receive half too: the server resets (CANCEL) what the client still has open.
    drop(srecv);
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while csend.send(b"x").await.is_ok() {
        assert!(tokio::time::Instant::now() < deadline, "client never saw the reset");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eventually("streams forgotten", || {
        live_streams(&client) == 0 && live_streams(&server) == 0
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_concurrent_port_forward_pairs() {
    let ((client, _ci), (server, mut si)) = pair();
    // An echo server in the shape of port-forward: a data stream echoed, an error stream left empty.
    let echo = tokio::spawn(async move {
        let mut tasks = Vec::new();
        while let Some(stream) = si.accept().await {
            tasks.push(tokio::spawn(async move {
                let kind = stream.header("streamtype").unwrap().to_owned();
                let (mut recv, mut send) = stream.split();
                send.reply(Headers::new(), false).await.unwrap();
                while let Some(chunk) = recv.recv().await {
                    send.send(&chunk).await.unwrap();
                    assert_eq!(kind, "data");
                }
                // Finished only after the client's FIN: dropping both halves of a stream the peer
                // still has open would reset it (CANCEL).
                send.finish().await.unwrap();
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
    });
    let mut clients = Vec::new();
    for n in 0..64u32 {
        let client = client.clone();
        clients.push(tokio::spawn(async move {
            let id = n.to_string();
            let error = client
                .open(h(&[("streamtype", "error"), ("requestid", &id)]), false)
                .await
                .unwrap();
            let data = client
                .open(h(&[("streamtype", "data"), ("requestid", &id)]), false)
                .await
                .unwrap();
            let (mut erecv, mut esend) = error.split();
            let (mut drecv, mut dsend) = data.split();
            within(erecv.reply_headers()).await.unwrap();
            within(drecv.reply_headers()).await.unwrap();
            esend.finish().await.unwrap();
            let payload = pattern(40_000 + n as usize * 1000, n as u8);
            let writer = {
                let payload = payload.clone();
                tokio::spawn(async move {
                    for chunk in payload.chunks(7000) {
                        dsend.send(chunk).await.unwrap();
                    }
                    dsend.finish().await.unwrap();
                })
            };
            assert_eq!(read_all(&mut drecv).await, payload);
            assert!(read_all(&mut erecv).await.is_empty());
            writer.await.unwrap();
        }));
    }
    for c in clients {
        within(c).await.unwrap();
    }
    eventually("streams forgotten", || {
        live_streams(&client) == 0 && live_streams(&server) == 0
    })
    .await;
    client.close();
    within(echo).await.unwrap();
    within(server.closed()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eight_mib_each_way_through_one_stream() {
    const SIZE: usize = 8 << 20;
    let ((client, _ci), (_server, mut si)) = pair();
    let (mut crecv, mut csend) = client.open(Headers::new(), false).await.unwrap().split();
    let (_, mut srecv, mut ssend) = accept_and_reply(&mut si).await;
    let up = tokio::spawn(async move {
        for chunk in pattern(SIZE, 1).chunks(100_000) {
            csend.send(chunk).await.unwrap();
        }
        csend.finish().await.unwrap();
    });
    let down = tokio::spawn(async move {
        ssend.send(&pattern(SIZE, 2)).await.unwrap();
        ssend.finish().await.unwrap();
    });
    let (got_up, got_down) = tokio::join!(read_all(&mut srecv), read_all(&mut crecv));
    assert!(got_up == pattern(SIZE, 1), "client to server bytes differ");
    assert!(got_down == pattern(SIZE, 2), "server to client bytes differ");
    up.await.unwrap();
    down.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unread_stream_stops_the_socket_instead_of_buffering() {
    const SIZE: usize = 16 << 20;
    let ((client, _ci), (server, mut si)) = pair();
    let (mut crecv, mut csend) = client.open(Headers::new(), false).await.unwrap().split();
    let (_, mut srecv, _ssend) = accept_and_reply(&mut si).await;
    within(crecv.reply_headers()).await.unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let writer = {
        let sent = sent.clone();
        tokio::spawn(async move {
            for chunk in pattern(SIZE, 3).chunks(MAX_DATA_CHUNK) {
                csend.send(chunk).await.unwrap();
                sent.fetch_add(chunk.len(), Ordering::Relaxed);
            }
            csend.finish().await.unwrap();
        })
    };
    // Wait until the sender stalls.
    let mut last = usize::MAX;
    loop {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = sent.load(Ordering::Relaxed);
        if now == last {
            break;
        }
        last = now;
    }
    let buffered = server.keep.inner.buffered.load(Ordering::Relaxed);
    assert!(buffered <= STREAM_RECV_BUFFER, "server buffered {buffered} bytes");
    // Stalled well short of the total: what is in flight is bounded by buffers, not by the data.
    assert!(
        last < STREAM_RECV_BUFFER + WRITE_BUDGET + 2 * 64 * 1024 + 64 * 1024,
        "sent {last} before stalling"
    );
    assert!(read_all(&mut srecv).await == pattern(SIZE, 3));
    within(writer).await.unwrap();
}

#[tokio::test]
async fn close_sends_goaway_and_ends_both_sides() {
    let ((client, mut ci), (server, mut si)) = pair();
    let (mut crecv, mut csend) = client.open(Headers::new(), false).await.unwrap().split();
    let (_, mut srecv, _ssend) = accept_and_reply(&mut si).await;
    csend.send(b"before goodbye").await.unwrap();
    client.close();
    within(client.closed()).await;
    within(server.closed()).await;
    // Data sent before close() was flushed first.
    assert_eq!(within(srecv.recv()).await.unwrap(), &b"before goodbye"[..]);
    assert_eq!(within(srecv.recv()).await, None);
    assert_eq!(within(si.accept()).await.map(|s| s.id()), None);
    assert_eq!(within(ci.accept()).await.map(|s| s.id()), None);
    assert_eq!(
        server.open(Headers::new(), false).await.err().map(|e| e.kind()),
        Some(io::ErrorKind::NotConnected)
    );
    assert_eq!(
        client.open(Headers::new(), false).await.err().map(|e| e.kind()),
        Some(io::ErrorKind::NotConnected)
    );
    assert_eq!(csend.send(b"x").await.unwrap_err().kind(), io::ErrorKind::NotConnected);
    assert_eq!(within(crecv.recv()).await, None);
}

#[tokio::test]
async fn dropping_every_handle_ends_the_connection() {
    let ((client, mut ci), (server, si)) = pair();
    let (_, srecv, ssend) = {
        let c = client.clone();
        let opened = tokio::spawn(async move { c.open(Headers::new(), false).await.unwrap() });
        let mut si = si;
        let accepted = accept_and_reply(&mut si).await;
        let _ = opened.await.unwrap();
        drop(si);
        accepted
    };
    drop(server);
    // The stream halves still hold the session open.
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!*client.keep.inner.closing.borrow());
    drop((srecv, ssend));
    within(client.closed()).await;
    assert!(within(ci.accept()).await.is_none());
}

#[tokio::test]
async fn goaway_from_the_peer_ends_the_connection() {
    let (server, mut incoming, mut peer) = server_with_raw_peer();
    peer.syn_stream(1, &[("streamtype", "error")], false).await;
    let (_, mut recv, _send) = accept_and_reply(&mut incoming).await;
    peer.send(Frame::GoAway {
        last_good_stream_id: 0,
        status: frame::GOAWAY_OK,
    })
    .await;
    assert_eq!(within(recv.recv()).await, None);
    assert!(within(incoming.accept()).await.is_none());
    // The peer got the SYN_REPLY, and then the socket closed; no GOAWAY answers a GOAWAY.
    assert!(matches!(
        peer.frame().await,
        Some(Frame::SynReply {
            stream_id: 1,
            fin: false,
            ..
        })
    ));
    assert_eq!(peer.frame().await, None);
    drop(peer);
    within(server.closed()).await;
}

#[tokio::test]
async fn close_tells_the_peer_the_last_stream_it_accepted() {
    let (server, mut incoming, mut peer) = server_with_raw_peer();
    peer.syn_stream(1, &[], false).await;
    peer.syn_stream(3, &[], false).await;
    within(incoming.accept()).await.unwrap();
    within(incoming.accept()).await.unwrap();
    server.close();
    assert_eq!(
        peer.frame_skipping_updates().await,
        Some(Frame::RstStream {
            stream_id: 1,
            status: 3
        })
    );
    assert_eq!(
        peer.frame_skipping_updates().await,
        Some(Frame::RstStream {
            stream_id: 3,
            status: 3
        })
    );
    assert_eq!(
        peer.frame().await,
        Some(Frame::GoAway {
            last_good_stream_id: 3,
            status: frame::GOAWAY_OK
        })
    );
    assert_eq!(peer.frame().await, None);
    drop(peer);
    within(server.closed()).await;
}

#[tokio::test]
async fn pings_from_the_peer_are_echoed() {
    let (_server, _incoming, mut peer) = server_with_raw_peer();
    peer.send(Frame::Ping { id: 1 }).await;
    assert_eq!(peer.frame().await, Some(Frame::Ping { id: 1 }));
    // An even id would be the answer to a ping of ours (the server's parity): not echoed.
    peer.send(Frame::Ping { id: 2 }).await;
    peer.send(Frame::Ping { id: 0x7fff_ffff }).await;
    assert_eq!(peer.frame().await, Some(Frame::Ping { id: 0x7fff_ffff }));
}

#[tokio::test]
async fn a_client_echoes_the_servers_even_pings() {
    let (a, b) = tokio::io::duplex(4096);
    let (_client, _incoming) = Connection::new(a, Role::Client);
    let mut peer = RawPeer {
        io: b,
        buf: BytesMut::new(),
        compressor: Compressor::new(),
        decompressor: Decompressor::new(),
    };
    peer.send(Frame::Ping { id: 1 }).await;
    peer.send(Frame::Ping { id: 2 }).await;
    assert_eq!(peer.frame().await, Some(Frame::Ping { id: 2 }));
}

#[tokio::test]
async fn accepts_syn_streams_compressed_by_c_zlib_and_chromium() {
    let (_server, mut incoming, mut peer) = server_with_raw_peer();
    // Two port-forward SYN_STREAMs as spdystream frames them, the header blocks compressed by C zlib
    // at level 9 in one stream (see headers.rs for the blocks alone).
    peer.write(&unhex(
        "800300010000003c0000000100000000000078f9e3c6a7c202253a703a2b294a4dcc851625aca9a0808614cb45a024cc
         64610024398b209198094adc8c0600000000ffff
         800300010000001800000003000000000000c2aa15540a2512d209000000ffff",
    ))
    .await;
    let (error, _erecv, _esend) = accept_and_reply(&mut incoming).await;
    assert_eq!(error, h(&[("streamtype", "error"), ("port", "80"), ("requestid", "0")]));
    let (data, mut drecv, mut dsend) = accept_and_reply(&mut incoming).await;
    assert_eq!(data, h(&[("streamtype", "data"), ("port", "80"), ("requestid", "0")]));
    // Our replies decode with an independent context (as spdystream's would).
    for id in [1, 3] {
        let Some(Frame::SynReply {
            stream_id,
            fin: false,
            block,
        }) = peer.frame().await
        else {
            panic!()
        };
        assert_eq!(stream_id, id);
        assert_eq!(peer.headers(&block), Headers::new());
    }
    peer.send(Frame::Data {
        stream_id: 3,
        fin: true,
        data: Bytes::from_static(b"GET / HTTP/1.0\r\n\r\n"),
    })
    .await;
    assert_eq!(read_all(&mut drecv).await, b"GET / HTTP/1.0\r\n\r\n");
    dsend.send(b"HTTP/1.0 200 OK\r\n\r\n").await.unwrap();
    dsend.finish().await.unwrap();
    assert_eq!(
        peer.frame_skipping_updates().await,
        Some(Frame::Data {
            stream_id: 3,
            fin: false,
            data: Bytes::from_static(b"HTTP/1.0 200 OK\r\n\r\n")
        })
    );
    assert_eq!(
        peer.frame_skipping_updates().await,
        Some(Frame::Data {
            stream_id: 3,
            fin: true,
            data: Bytes::new()
        })
    );

    // A fresh session: Chromium's SPDY/3 SYN_STREAM (stream 1, priority 4, bar: foo, foo: bar).
    let (_server, mut incoming, mut peer) = server_with_raw_peer();
    peer.write(&unhex(
        "800300010000003700000001000000008000
         38eae3c6a7c202e50e50c24b4a04e50b6680004acbcf0708201095969f0fa200022829b108208000000000ffff",
    ))
    .await;
    let stream = within(incoming.accept()).await.unwrap();
    assert_eq!(stream.headers(), &h(&[("bar", "foo"), ("foo", "bar")]));
}

#[tokio::test]
async fn windows_are_not_enforced_on_what_we_send() {
    // spdystream never sends WINDOW_UPDATE: a peer that shrinks the window to 1 byte and never opens
    // it must still receive everything.
    let (_server, mut incoming, mut peer) = server_with_raw_peer();
    peer.send(Frame::Settings {
        clear: false,
        entries: vec![
            frame::Setting {
                flags: 0,
                id: 7,
                value: 1,
            },
            frame::Setting {
                flags: 1,
                id: 4,
                value: 9,
            },
        ],
    })
    .await;
    peer.send(Frame::WindowUpdate { stream_id: 0, delta: 5 }).await;
    peer.send(Frame::Unknown {
        kind: 10,
        flags: 0,
        len: 12,
    })
    .await;
    peer.send(Frame::Unknown {
        kind: 0xffff,
        flags: 0xff,
        len: 0,
    })
    .await;
    peer.syn_stream(1, &[("streamtype", "stdout")], false).await;
    let (_, _recv, mut send) = accept_and_reply(&mut incoming).await;
    let payload = pattern(300_000, 9);
    let sender = tokio::spawn(async move {
        send.send(&payload).await.unwrap();
        send.finish().await.unwrap();
    });
    assert!(matches!(peer.frame().await, Some(Frame::SynReply { stream_id: 1, .. })));
    let mut got = Vec::new();
    loop {
        match peer.frame().await {
            Some(Frame::Data {
                stream_id: 1,
                fin,
                data,
            }) => {
                assert!(data.len() <= MAX_DATA_CHUNK);
                got.extend_from_slice(&data);
                if fin {
                    break;
                }
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(got == pattern(300_000, 9));
    within(sender).await.unwrap();
}

#[tokio::test]
async fn consumed_data_is_acknowledged_with_window_updates() {
    let (server, mut incoming, mut peer) = server_with_raw_peer();
    peer.syn_stream(1, &[], false).await;
    let (_, mut recv, _send) = accept_and_reply(&mut incoming).await;
    for _ in 0..4 {
        peer.send(Frame::Data {
            stream_id: 1,
            fin: false,
            data: Bytes::from(vec![7; 16 * 1024]),
        })
        .await;
    }
    let mut total = 0;
    while total < 64 * 1024 {
        total += within(recv.recv()).await.unwrap().len();
    }
    // Updates go out per 32 KiB consumed (coalesced when the writer lags), so once the server is
    // quiet, what it acknowledged plus what it still holds back is exactly what was consumed.
    let (mut stream_acked, mut session_acked) = (0, 0);
    loop {
        let frame = tokio::select! {
            f = peer.frame() => f,
            _ = tokio::time::sleep(Duration::from_millis(300)) => break,
        };
        match frame {
            Some(Frame::WindowUpdate { stream_id: 1, delta }) => stream_acked += delta,
            Some(Frame::WindowUpdate { stream_id: 0, delta }) => session_acked += delta,
            Some(Frame::SynReply { .. }) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    let stream_held = lock(&lookup(&server.keep.inner, 1).unwrap().state).unacked;
    let session_held = lock(&server.keep.inner.state).session_unacked;
    assert!(stream_acked >= 32 * 1024 && stream_held < WINDOW_UPDATE_THRESHOLD);
    assert_eq!(
        (stream_acked + stream_held, session_acked + session_held),
        (64 * 1024, 64 * 1024)
    );
}

#[tokio::test]
async fn bad_stream_ids_and_header_blocks_are_stream_errors() {
    let (_server, mut incoming, mut peer) = server_with_raw_peer();
    // A block that inflates fine but says it holds 5 pairs and holds none: RST, session survives.
    let block = peer.compressor.compress_raw(b"\x00\x00\x00\x05").unwrap();
    let syn = |stream_id, block: Vec<u8>| Frame::SynStream {
        stream_id,
        associated_id: 0,
        priority: 0,
        slot: 0,
        fin: false,
        unidirectional: false,
        block: block.into(),
    };
    peer.send(syn(1, block)).await;
    assert_eq!(
        peer.frame().await,
        Some(Frame::RstStream {
            stream_id: 1,
            status: 1
        })
    );
    // Server-parity id, then an id that goes backwards.
    peer.syn_stream(2, &[], false).await;
    assert_eq!(
        peer.frame().await,
        Some(Frame::RstStream {
            stream_id: 2,
            status: 1
        })
    );
    peer.syn_stream(7, &[("n", "7")], false).await;
    peer.syn_stream(5, &[("n", "5")], false).await;
    assert_eq!(
        peer.frame().await,
        Some(Frame::RstStream {
            stream_id: 5,
            status: 1
        })
    );
    // The compression context stayed in step through all of that.
    let stream = within(incoming.accept()).await.unwrap();
    assert_eq!((stream.id(), stream.header("n")), (7, Some("7")));
    // Frames for streams that do not exist are ignored.
    peer.send(Frame::Data {
        stream_id: 99,
        fin: true,
        data: Bytes::from_static(b"?"),
    })
    .await;
    peer.send(Frame::RstStream {
        stream_id: 99,
        status: 5,
    })
    .await;
    let block = peer.block(&[("late", "1")]);
    peer.send(Frame::SynReply {
        stream_id: 99,
        fin: false,
        block,
    })
    .await;
    peer.syn_stream(9, &[("n", "9")], false).await;
    assert_eq!(within(incoming.accept()).await.unwrap().header("n"), Some("9"));
}

async fn expect_protocol_error(wire: &[u8]) {
    let (server, mut incoming, mut peer) = server_with_raw_peer();
    peer.write(wire).await;
    let mut goaway = None;
    while let Some(frame) = peer.frame().await {
        if let Frame::GoAway { status, .. } = frame {
            goaway = Some(status);
        }
    }
    assert_eq!(goaway, Some(frame::GOAWAY_PROTOCOL_ERROR), "{wire:02x?}");
    assert!(within(incoming.accept()).await.is_none());
    drop(peer);
    within(server.closed()).await;
}

#[tokio::test]
async fn malformed_input_is_a_session_error() {
    // Garbage with the control bit set (version 0x7fff).
    expect_protocol_error(&[0xff; 64]).await;
    // A SPDY/2 frame.
    expect_protocol_error(&unhex("80020006 00000004 00000001")).await;
    // A control frame claiming 16 MiB.
    expect_protocol_error(&unhex("80030001 00ffffff 00000001")).await;
    // A SYN_STREAM whose header block is not zlib.
    expect_protocol_error(&unhex("80030001 00000012 00000001 00000000 0000 6e6f74207a6c6962")).await;
    // A PING of the wrong length, after a good frame.
    expect_protocol_error(&unhex("80030006 00000004 00000001 80030006 00000005 0000000100")).await;
}

#[tokio::test]
async fn random_input_never_wedges_or_panics() {
    // A panic in a driver task would skip the bookkeeping that resolves `closed()`, failing this.
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    for round in 0..200 {
        let (server, mut incoming, mut peer) = server_with_raw_peer();
        let mut wire: Vec<u8> = (0..next() % 300).map(|_| next() as u8).collect();
        if round % 2 == 0 && wire.len() > 8 {
            // Mostly-valid control frames reach deeper into the parsers.
            wire[0] = 0x80;
            wire[1] = 0x03;
            wire[2] = 0;
            wire[3] = (next() % 11) as u8;
            wire[4] = 0;
            wire[5] = 0;
            wire[6] = 0;
            wire[7] = (wire.len() - 8).min(255) as u8;
        }
        peer.write(&wire).await;
        let mut io = peer.io;
        io.shutdown().await.unwrap();
        // Keep reading what the server sends so it is never blocked on us.
        let drain = tokio::spawn(async move {
            let mut sink = Vec::new();
            let _ = io.read_to_end(&mut sink).await;
        });
        tokio::select! {
            _ = server.closed() => {}
            s = incoming.accept() => drop(s),
        }
        drop(incoming);
        server.close();
        within(server.closed()).await;
        within(drain).await.unwrap();
    }
}

#[tokio::test]
async fn stream_futures_are_send() {
    fn is_send<T: Send>(_: &T) {}
    let ((client, _ci), (_server, _si)) = pair();
    let stream = client.open(Headers::new(), false).await.unwrap();
    let (mut recv, mut send) = stream.split();
    is_send(&send);
    is_send(&recv);
    is_send(&recv.recv());
    is_send(&recv.reply_headers());
    is_send(&send.send(b""));
    is_send(&send.finish());
    is_send(&send.reply(Headers::new(), false));
    is_send(&client.open(Headers::new(), false));
    is_send(&client.closed());
}
