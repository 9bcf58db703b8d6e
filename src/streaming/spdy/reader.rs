//! The reader task of a SPDY session: frames from the socket, decoded and dispatched to their
//! streams (SYN_STREAM, SYN_REPLY, DATA with the receive buffers' limits, RST_STREAM, PING,
//! GOAWAY, WINDOW_UPDATE); the socket is not read while a stream's or the connection's buffer is
//! full.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::mpsc;

use super::frame::{self, Frame};
use super::headers::{self, Decompressor};
use super::{
    charge, lock, reset_stream, Headers, Inner, KeepAlive, Outgoing, Role, RstStatus, Stream, StreamShared,
    StreamState, CONN_RECV_BUFFER, LINGER, MAX_STREAMS, STREAM_RECV_BUFFER,
};

/// Why the read loop stopped.
pub(super) enum ReadEnd {
    /// EOF or an I/O error: the peer is gone.
    Gone,
    /// The peer broke the protocol: GOAWAY(PROTOCOL_ERROR).
    Protocol(String),
    /// The peer sent GOAWAY.
    GoAway,
    /// We are shutting down (noticed by a wait inside the loop).
    Closing,
}

pub(super) async fn run_reader<R: AsyncRead + Unpin>(
    inner: Arc<Inner>,
    keep: Weak<KeepAlive>,
    accept_tx: mpsc::Sender<Stream>,
    mut r: R,
) {
    let mut buf = BytesMut::with_capacity(64 * 1024);
    let mut closing = inner.closing.subscribe();
    let end = tokio::select! {
        end = read_loop(&inner, &keep, &accept_tx, &mut r, &mut buf) => Some(end),
        _ = closing.wait_for(|c| *c) => None,
    };
    drop(accept_tx);
    match end {
        Some(ReadEnd::Protocol(why)) => {
            tracing::debug!(error = %why, "SPDY protocol error from peer");
            inner.shutdown(Some(frame::GOAWAY_PROTOCOL_ERROR));
        }
        Some(ReadEnd::GoAway) => inner.shutdown(None),
        Some(ReadEnd::Gone) => {
            inner.shutdown(None);
            inner.task_finished();
            return;
        }
        Some(ReadEnd::Closing) | None => {}
    }
    // Drain (and ignore) what the peer still sends until it closes, or until our last frames have had
    // time to arrive after the writer finished.
    let mut writer_done = inner.writer_done.subscribe();
    let drain = async {
        loop {
            buf.clear();
            buf.reserve(16 * 1024);
            match r.read_buf(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            }
        }
    };
    tokio::select! {
        _ = drain => {}
        _ = async {
            let _ = writer_done.wait_for(|d| *d).await;
            tokio::time::sleep(LINGER).await;
        } => {}
    }
    inner.task_finished();
}

pub(super) async fn read_loop<R: AsyncRead + Unpin>(
    inner: &Arc<Inner>,
    keep: &Weak<KeepAlive>,
    accept_tx: &mpsc::Sender<Stream>,
    r: &mut R,
    buf: &mut BytesMut,
) -> ReadEnd {
    let mut decompressor = Decompressor::new();
    loop {
        let frame = match frame::decode(buf) {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                let want = frame::frame_len(buf).unwrap_or(frame::HEADER_LEN).max(buf.len() + 1);
                buf.reserve((want - buf.len()).max(16 * 1024));
                match r.read_buf(buf).await {
                    Ok(0) | Err(_) => return ReadEnd::Gone,
                    Ok(_) => continue,
                }
            }
            Err(e) => return ReadEnd::Protocol(e.to_string()),
        };
        if let Err(end) = handle_frame(inner, keep, accept_tx, &mut decompressor, frame).await {
            return end;
        }
    }
}

pub(super) async fn handle_frame(
    inner: &Arc<Inner>,
    keep: &Weak<KeepAlive>,
    accept_tx: &mpsc::Sender<Stream>,
    decompressor: &mut Decompressor,
    frame: Frame,
) -> Result<(), ReadEnd> {
    // Every header block must go through the decompressor, whatever happens to its frame, or the
    // shared zlib context falls out of step with the peer's.
    let mut decode = |block: &[u8]| match decompressor.decode(block) {
        Ok(headers) => Ok(Ok(headers)),
        Err(e) if e.is_stream_error() => Ok(Err(e)),
        Err(e) => Err(ReadEnd::Protocol(e.to_string())),
    };
    match frame {
        Frame::Data { stream_id, fin, data } => on_data(inner, stream_id, fin, data).await,
        Frame::SynStream {
            stream_id,
            fin,
            unidirectional,
            block,
            ..
        } => {
            let headers = decode(&block)?;
            on_syn_stream(inner, keep, accept_tx, stream_id, fin, unidirectional, headers).await
        }
        Frame::SynReply { stream_id, fin, block } => {
            let headers = decode(&block)?;
            let Some(s) = lookup(inner, stream_id) else {
                return Ok(());
            };
            let headers = match headers {
                Ok(h) => h,
                Err(e) => {
                    tracing::debug!(stream = stream_id, error = %e, "bad SYN_REPLY headers");
                    reset_stream(inner, &s, RstStatus::ProtocolError);
                    return Ok(());
                }
            };
            let finished = {
                let mut st = lock(&s.state);
                // spdystream ignores a second SYN_REPLY, and so do we.
                if !s.local || st.reply.is_some() {
                    return Ok(());
                }
                st.reply = Some(headers);
                st.remote_closed |= fin;
                st.finished()
            };
            s.notify.notify_one();
            if finished {
                inner.remove(stream_id);
            }
            Ok(())
        }
        Frame::Headers { stream_id, fin, block } => {
            // Additional headers have no use in these protocols; only their FIN matters.
            let _ = decode(&block)?;
            if fin {
                if let Some(s) = lookup(inner, stream_id) {
                    remote_finished(inner, &s);
                }
            }
            Ok(())
        }
        Frame::RstStream { stream_id, status } => {
            if let Some(s) = lookup(inner, stream_id) {
                // What was buffered stays readable; nothing more will be added.
                lock(&s.state).reset = Some(status);
                s.notify.notify_one();
                inner.remove(stream_id);
            }
            Ok(())
        }
        Frame::Ping { id } => {
            // Pings we originate have our parity; the others are the peer's and are echoed.
            let ours = if inner.role == Role::Server { 0 } else { 1 };
            // Id 0 is invalid, and spdystream fails the whole connection on reading one.
            if id & 1 != ours && id != 0 {
                send_control(inner, Frame::Ping { id }).await?;
            }
            Ok(())
        }
        Frame::GoAway {
            last_good_stream_id,
            status,
        } => {
            tracing::debug!(last_good_stream_id, status, "SPDY GOAWAY from peer");
            Err(ReadEnd::GoAway)
        }
        // Windows are not enforced on what we send (see the module comment), so SETTINGS (including
        // INITIAL_WINDOW_SIZE) and WINDOW_UPDATE need no action.
        Frame::Settings { .. } | Frame::WindowUpdate { .. } | Frame::Unknown { .. } => Ok(()),
    }
}

pub(super) fn lookup(inner: &Inner, id: u32) -> Option<Arc<StreamShared>> {
    lock(&inner.state).streams.get(&id).cloned()
}

pub(super) fn remote_finished(inner: &Inner, s: &Arc<StreamShared>) {
    let finished = {
        let mut st = lock(&s.state);
        st.remote_closed = true;
        st.finished()
    };
    s.notify.notify_one();
    if finished {
        inner.remove(s.id);
    }
}

/// Queues a control frame from the reader, within the write budget so a peer that floods PINGs but
/// never reads cannot grow our queue.
pub(super) async fn send_control(inner: &Inner, frame: Frame) -> Result<(), ReadEnd> {
    const PERMITS: usize = 16;
    match inner.budget.acquire_many(PERMITS as u32).await {
        Ok(permit) => {
            permit.forget();
            inner.enqueue(Outgoing::Frame {
                frame,
                permits: PERMITS,
            });
            Ok(())
        }
        Err(_) => Err(ReadEnd::Closing),
    }
}

pub(super) async fn on_data(inner: &Inner, stream_id: u32, fin: bool, data: Bytes) -> Result<(), ReadEnd> {
    // DATA for a stream we do not know is dropped, as spdystream does: typically it raced our reset.
    let Some(s) = lookup(inner, stream_id) else {
        return Ok(());
    };
    if !data.is_empty() {
        let cost = charge(data.len());
        loop {
            // Registered before checking, so a consumer freeing space in between is not missed.
            let space = inner.space.notified();
            {
                let mut st = lock(&s.state);
                if st.recv_dropped || st.remote_closed || st.finished() {
                    // Nobody will read it (or the peer kept writing after its FIN): discard.
                    drop(st);
                    inner.ack(&s, data.len());
                    break;
                }
                let stream_ok = st.buffered == 0 || st.buffered + cost <= STREAM_RECV_BUFFER;
                let conn_ok = inner.buffered.load(Ordering::Acquire) + cost <= CONN_RECV_BUFFER;
                if stream_ok && conn_ok {
                    st.buffered += cost;
                    inner.buffered.fetch_add(cost, Ordering::AcqRel);
                    st.queue.push_back(data);
                    drop(st);
                    s.notify.notify_one();
                    break;
                }
            }
            // Back-pressure: stop reading the socket until the application catches up.
            space.await;
            if inner.is_closing() {
                return Err(ReadEnd::Closing);
            }
        }
    }
    if fin {
        remote_finished(inner, &s);
    }
    Ok(())
}

pub(super) async fn on_syn_stream(
    inner: &Arc<Inner>,
    keep: &Weak<KeepAlive>,
    accept_tx: &mpsc::Sender<Stream>,
    stream_id: u32,
    fin: bool,
    unidirectional: bool,
    headers: Result<Headers, headers::HeaderError>,
) -> Result<(), ReadEnd> {
    let peer_parity = if inner.role == Role::Server { 1 } else { 0 };
    let shared = {
        let mut conn = lock(&inner.state);
        if conn.closing {
            return Ok(());
        }
        if stream_id & 1 != peer_parity || stream_id <= conn.last_peer_id {
            // What spdystream does with an id out of sequence: refuse that stream, keep the session.
            tracing::debug!(stream = stream_id, "SYN_STREAM with an invalid stream id");
            Err(RstStatus::ProtocolError)
        } else if headers.is_err() {
            conn.last_peer_id = stream_id;
            Err(RstStatus::ProtocolError)
        } else if conn.streams.len() >= MAX_STREAMS {
            conn.last_peer_id = stream_id;
            Err(RstStatus::RefusedStream)
        } else {
            conn.last_peer_id = stream_id;
            let state = StreamState {
                remote_closed: fin,
                local_closed: unidirectional,
                needs_reply: !unidirectional,
                ..StreamState::default()
            };
            let shared = StreamShared::new(stream_id, false, state);
            if !(fin && unidirectional) {
                conn.streams.insert(stream_id, shared.clone());
            }
            Ok(shared)
        }
    };
    let (shared, headers) = match (shared, headers) {
        (Ok(shared), Ok(headers)) => (shared, headers),
        (shared, headers) => {
            let status = shared.err().unwrap_or(RstStatus::ProtocolError);
            if let Err(e) = headers {
                tracing::debug!(stream = stream_id, error = %e, "bad SYN_STREAM headers");
            }
            return send_control(
                inner,
                Frame::RstStream {
                    stream_id,
                    status: status.code(),
                },
            )
            .await;
        }
    };
    // Every handle gone means the session is shutting down; the stream dies with it.
    let Some(keep) = keep.upgrade() else {
        return Err(ReadEnd::Closing);
    };
    let stream = Stream::new(shared, headers, keep);
    // A full backlog stops the reader: back-pressure on a peer opening streams faster than we accept.
    // If `Incoming` is gone the stream is dropped here, which refuses it.
    let _ = accept_tx.send(stream).await;
    Ok(())
}
