//! The writer task of a SPDY session: queued frames (replies, data within the write budget,
//! resets, pings, GOAWAY) encoded onto the socket, and the WINDOW_UPDATEs for consumed data.

use std::io;
use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::{AsyncWrite, AsyncWriteExt, BufWriter};
use tokio::sync::mpsc;

use super::frame::Frame;
use super::headers::Compressor;
use super::{lock, Inner, Outgoing, StreamShared, FLUSH_TIMEOUT};

pub(super) async fn run_writer<W: AsyncWrite + Unpin>(inner: Arc<Inner>, rx: mpsc::UnboundedReceiver<Outgoing>, w: W) {
    let mut closing = inner.closing.subscribe();
    let result = tokio::select! {
        r = write_loop(&inner, rx, w) => r,
        _ = async {
            let _ = closing.wait_for(|c| *c).await;
            tokio::time::sleep(FLUSH_TIMEOUT).await;
        } => Err(io::Error::new(io::ErrorKind::TimedOut, "peer did not take our last frames")),
    };
    if let Err(e) = result {
        tracing::debug!(error = %e, "SPDY writer stopped");
        inner.shutdown(None);
    }
    inner.writer_done.send_replace(true);
    inner.task_finished();
}

pub(super) async fn write_loop<W: AsyncWrite + Unpin>(
    inner: &Inner,
    mut rx: mpsc::UnboundedReceiver<Outgoing>,
    w: W,
) -> io::Result<()> {
    let mut w = BufWriter::with_capacity(64 * 1024, w);
    let mut compressor = Compressor::new();
    let mut buf = BytesMut::with_capacity(1024);
    while let Some(first) = rx.recv().await {
        let mut item = Some(first);
        while let Some(next) = item {
            buf.clear();
            let permits = match next {
                Outgoing::Close => {
                    w.flush().await?;
                    return w.shutdown().await;
                }
                Outgoing::Raw { bytes, permits } => {
                    w.write_all(&bytes).await?;
                    permits
                }
                Outgoing::Frame { frame, permits } => {
                    frame.encode(&mut buf);
                    permits
                }
                Outgoing::SynStream {
                    stream_id,
                    headers,
                    fin,
                } => {
                    let block = compressor.compress(&headers).map_err(io::Error::other)?;
                    let frame = Frame::SynStream {
                        stream_id,
                        associated_id: 0,
                        priority: 0,
                        slot: 0,
                        fin,
                        unidirectional: false,
                        block: block.into(),
                    };
                    frame.encode(&mut buf);
                    0
                }
                Outgoing::SynReply {
                    stream_id,
                    headers,
                    fin,
                } => {
                    let block = compressor.compress(&headers).map_err(io::Error::other)?;
                    Frame::SynReply {
                        stream_id,
                        fin,
                        block: block.into(),
                    }
                    .encode(&mut buf);
                    0
                }
                Outgoing::WindowUpdate(stream) => {
                    if let Some(frame) = window_update(inner, stream) {
                        frame.encode(&mut buf);
                    }
                    0
                }
            };
            if !buf.is_empty() {
                w.write_all(&buf).await?;
            }
            if permits > 0 {
                inner.budget.add_permits(permits);
            }
            item = rx.try_recv().ok();
        }
        w.flush().await?;
    }
    Ok(())
}

pub(super) fn window_update(inner: &Inner, stream: Option<Arc<StreamShared>>) -> Option<Frame> {
    let (stream_id, delta) = match stream {
        None => {
            let mut conn = lock(&inner.state);
            conn.session_update_queued = false;
            (0, std::mem::take(&mut conn.session_unacked))
        }
        Some(s) => {
            let mut st = lock(&s.state);
            st.update_queued = false;
            let delta = std::mem::take(&mut st.unacked);
            if st.remote_closed || st.finished() {
                return None;
            }
            (s.id, delta)
        }
    };
    (delta > 0).then_some(Frame::WindowUpdate {
        stream_id,
        delta: delta.min(0x7fff_ffff),
    })
}
