//! SPDY/3.1 sessions as the Kubernetes streaming protocols speak them (exec, attach, port-forward).
//!
//! The peer is always Go's `github.com/moby/spdystream` (client-go's `httpstream/spdy`, used by crictl,
//! kubectl, the kubelet and the API server), so interoperating with it decides every open question:
//!
//! - Frames are SPDY version 3 even though the HTTP upgrade says "SPDY/3.1". Header blocks use one zlib
//!   stream per direction with the SPDY/3 dictionary, sync-flushed per block. spdystream rejects a block
//!   with upper-case or repeated names (fatal to its connection), so names are lower-cased and repeated
//!   names NUL-joined on the way out.
//! - Flow control: spdystream implements none. It never sends WINDOW_UPDATE and ignores the ones it
//!   receives (they fall into the "unhandled frame type" branch of `Connection.frameHandler`), and it
//!   writes one DATA frame per `Write` of any size up to 2^24-1 bytes. A sender that honoured the SPDY/3.1
//!   64 KiB default windows would stall forever after 64 KiB, so sending here ignores windows entirely;
//!   back-pressure comes from the socket, as in spdystream, whose reader blocks once a stream's consumer
//!   stops reading (unbuffered per-stream channels behind bounded frame queues). The receiving side does
//!   the same: bounded per-stream and per-connection buffers, and the socket is not read while they are
//!   full. We still send WINDOW_UPDATE for data consumed, which costs spdystream nothing and keeps a
//!   strict SPDY/3.1 sender from stalling.
//! - A stream opened by the peer is answered with SYN_REPLY before any DATA (spdystream drops DATA on a
//!   stream it has not seen replied). A half-close is an empty DATA frame with FLAG_FIN, as spdystream's
//!   `Stream.Close` sends; FLAG_FIN on SYN_STREAM/SYN_REPLY/HEADERS is honoured too.
//! - client-go closes a connection by resetting every stream, then sending GOAWAY and closing the socket,
//!   so a GOAWAY from the peer ends the connection here (no new streams either way), and PINGs from the
//!   peer (client-go pings periodically) are echoed.

pub(crate) mod frame;
pub(crate) mod headers;
mod reader;
mod writer;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::sync::{mpsc, watch, Notify, Semaphore};

use frame::Frame;
use reader::run_reader;
use writer::run_writer;

/// Header name/value pairs; names are lower-case.
pub type Headers = Vec<(String, String)>;

/// Which end of the session we are: the server opens even stream ids, the client odd ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Server,
    Client,
}

/// RST_STREAM status codes (SPDY/3 section 2.6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RstStatus {
    ProtocolError,
    InvalidStream,
    RefusedStream,
    UnsupportedVersion,
    Cancel,
    InternalError,
    FlowControlError,
    StreamInUse,
    StreamAlreadyClosed,
    FrameTooLarge,
}

impl RstStatus {
    /// The status code on the wire.
    pub fn code(self) -> u32 {
        match self {
            RstStatus::ProtocolError => 1,
            RstStatus::InvalidStream => 2,
            RstStatus::RefusedStream => 3,
            RstStatus::UnsupportedVersion => 4,
            RstStatus::Cancel => 5,
            RstStatus::InternalError => 6,
            RstStatus::FlowControlError => 7,
            RstStatus::StreamInUse => 8,
            RstStatus::StreamAlreadyClosed => 9,
            // 10 is INVALID_CREDENTIALS, which needs the CREDENTIAL frame nobody implements.
            RstStatus::FrameTooLarge => 11,
        }
    }
}

/// Largest DATA frame we send; spdystream reads any size, and 16 KiB keeps streams interleaved fairly.
const MAX_DATA_CHUNK: usize = 16 * 1024;
/// Bytes of frames queued for the socket before `send` waits: back-pressure from a slow peer.
const WRITE_BUDGET: usize = 256 * 1024;
/// Bytes buffered for one stream before the socket stops being read (a frame is always admitted into an
/// empty buffer, so single frames up to the 16 MiB protocol maximum still pass).
const STREAM_RECV_BUFFER: usize = 512 * 1024;
/// Bytes buffered for the whole connection: room for one maximal frame plus ordinary traffic.
const CONN_RECV_BUFFER: usize = 20 * 1024 * 1024;
/// Bookkeeping charged per buffered frame, so a flood of tiny frames is bounded too.
const FRAME_OVERHEAD: usize = 64;
/// Consumed bytes that trigger a WINDOW_UPDATE (half the SPDY/3.1 default window of 64 KiB).
const WINDOW_UPDATE_THRESHOLD: u32 = 32 * 1024;
/// Peer-opened streams waiting for `accept` before the socket stops being read.
const ACCEPT_BACKLOG: usize = 64;
/// Live streams per connection; more SYN_STREAMs are refused. Port-forward uses two per connection.
const MAX_STREAMS: usize = 1024;
/// How long a closing connection may take to flush what was queued before it.
const FLUSH_TIMEOUT: Duration = Duration::from_secs(10);
/// After our last frame is out, how long to keep draining the peer's bytes before closing the socket;
/// closing with unread input would make the kernel send RST and could destroy our final frames.
const LINGER: Duration = Duration::from_secs(2);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // State stays consistent across a panicking holder (no multi-step invariants), so ignore poison.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn closed_error() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "SPDY connection closed")
}

fn charge(len: usize) -> usize {
    len + FRAME_OVERHEAD
}

/// Work for the writer task, in wire order. Header blocks are compressed by the writer itself because
/// the shared zlib context must see them in exactly the order the frames are written.
enum Outgoing {
    /// Pre-encoded frames; `permits` go back to the write budget once written.
    Raw {
        bytes: Bytes,
        permits: usize,
    },
    Frame {
        frame: Frame,
        permits: usize,
    },
    SynStream {
        stream_id: u32,
        headers: Headers,
        fin: bool,
    },
    SynReply {
        stream_id: u32,
        headers: Headers,
        fin: bool,
    },
    /// Coalesced WINDOW_UPDATE: the writer sends whatever is unacknowledged when it gets here.
    WindowUpdate(Option<Arc<StreamShared>>),
    /// Flush, shut the socket's write side and stop.
    Close,
}

struct Inner {
    role: Role,
    state: Mutex<ConnState>,
    out: mpsc::UnboundedSender<Outgoing>,
    budget: Semaphore,
    /// Bytes charged to receive buffers across all streams (only the reader adds).
    buffered: AtomicUsize,
    /// A receive buffer drained or went away: the reader may be able to admit the frame it holds.
    space: Notify,
    closing_flag: AtomicBool,
    closing: watch::Sender<bool>,
    writer_done: watch::Sender<bool>,
    done: watch::Sender<bool>,
    tasks_left: AtomicUsize,
}

struct ConnState {
    streams: HashMap<u32, Arc<StreamShared>>,
    next_id: u32,
    last_peer_id: u32,
    closing: bool,
    session_unacked: u32,
    session_update_queued: bool,
}

struct StreamShared {
    id: u32,
    /// Opened by us (SYN_STREAM sent) rather than accepted.
    local: bool,
    state: Mutex<StreamState>,
    /// Wakes the RecvStream: data, FIN, reply, reset or connection end.
    notify: Notify,
}

#[derive(Default)]
struct StreamState {
    queue: VecDeque<Bytes>,
    buffered: usize,
    remote_closed: bool,
    reply: Option<Headers>,
    unacked: u32,
    update_queued: bool,
    needs_reply: bool,
    local_closed: bool,
    /// RST_STREAM status, sent or received; the stream is dead both ways.
    reset: Option<u32>,
    conn_ended: bool,
    recv_dropped: bool,
    send_dropped: bool,
}

impl StreamState {
    fn finished(&self) -> bool {
        self.reset.is_some() || self.conn_ended || (self.local_closed && self.remote_closed)
    }

    fn writable(&self) -> io::Result<()> {
        if let Some(status) = self.reset {
            return Err(io::Error::new(
                io::ErrorKind::ConnectionReset,
                format!("stream reset (status {status})"),
            ));
        }
        if self.conn_ended {
            return Err(closed_error());
        }
        if self.local_closed {
            return Err(io::Error::new(io::ErrorKind::BrokenPipe, "stream already finished"));
        }
        if self.needs_reply {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "reply() must come before data",
            ));
        }
        Ok(())
    }
}

impl StreamShared {
    fn new(id: u32, local: bool, state: StreamState) -> Arc<Self> {
        Arc::new(StreamShared {
            id,
            local,
            state: Mutex::new(state),
            notify: Notify::new(),
        })
    }
}

impl Inner {
    fn is_closing(&self) -> bool {
        self.closing_flag.load(Ordering::Acquire)
    }

    fn enqueue(&self, item: Outgoing) {
        // Fails only once the writer has stopped, when nothing can be sent anyway.
        let _ = self.out.send(item);
    }

    fn enqueue_frame(&self, frame: Frame) {
        self.enqueue(Outgoing::Frame { frame, permits: 0 });
    }

    fn remove(&self, id: u32) {
        lock(&self.state).streams.remove(&id);
    }

    /// Ends the session: optionally GOAWAY, then flush and close after everything already queued. Every
    /// stream learns the connection is gone; the tasks wind down on their own.
    fn shutdown(&self, goaway: Option<u32>) {
        let streams = {
            let mut conn = lock(&self.state);
            if conn.closing {
                return;
            }
            conn.closing = true;
            self.closing_flag.store(true, Ordering::Release);
            if let Some(status) = goaway {
                self.enqueue_frame(Frame::GoAway {
                    last_good_stream_id: conn.last_peer_id,
                    status,
                });
            }
            self.enqueue(Outgoing::Close);
            std::mem::take(&mut conn.streams)
        };
        for s in streams.values() {
            lock(&s.state).conn_ended = true;
            s.notify.notify_one();
        }
        self.budget.close();
        self.closing.send_replace(true);
        self.space.notify_one();
    }

    fn task_finished(&self) {
        if self.tasks_left.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.done.send_replace(true);
        }
    }

    /// Records `n` bytes taken off the stream (consumed or discarded) for WINDOW_UPDATE.
    fn ack(&self, stream: &Arc<StreamShared>, n: usize) {
        let n = n as u32;
        let session = {
            let mut conn = lock(&self.state);
            conn.session_unacked = conn.session_unacked.saturating_add(n);
            let due = conn.session_unacked >= WINDOW_UPDATE_THRESHOLD && !conn.session_update_queued;
            conn.session_update_queued |= due;
            due
        };
        if session {
            self.enqueue(Outgoing::WindowUpdate(None));
        }
        let mut st = lock(&stream.state);
        st.unacked = st.unacked.saturating_add(n);
        if st.unacked >= WINDOW_UPDATE_THRESHOLD && !st.update_queued && !st.remote_closed && !st.finished() {
            st.update_queued = true;
            drop(st);
            self.enqueue(Outgoing::WindowUpdate(Some(stream.clone())));
        }
    }
}

/// Keeps the session alive; the last one dropped (all `Connection`s, the `Incoming` and every stream
/// half) closes it with GOAWAY.
struct KeepAlive {
    inner: Arc<Inner>,
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.inner.shutdown(Some(frame::GOAWAY_OK));
    }
}

/// A SPDY session. Cheap to clone; the session itself runs in tokio tasks. It ends on `close()`, when
/// the peer ends it, or once every `Connection`, the `Incoming` and every stream half are dropped (a live
/// stream keeps its session, so a task still using one is not cut off).
#[derive(Clone)]
pub struct Connection {
    keep: Arc<KeepAlive>,
}

/// Streams the peer opens.
pub struct Incoming {
    rx: mpsc::Receiver<Stream>,
    keep: Arc<KeepAlive>,
}

/// One SPDY stream, before being split into its receiving and sending halves.
pub struct Stream {
    headers: Headers,
    recv: RecvStream,
    send: SendStream,
}

/// The receiving half of a stream.
pub struct RecvStream {
    shared: Arc<StreamShared>,
    keep: Arc<KeepAlive>,
}

/// The sending half of a stream.
pub struct SendStream {
    shared: Arc<StreamShared>,
    keep: Arc<KeepAlive>,
}

impl Connection {
    /// Starts a SPDY/3.1 session over `io` (already upgraded), spawning its driver tasks (so it must be
    /// called inside a tokio runtime).
    pub fn new<T>(io: T, role: Role) -> (Connection, Incoming)
    where
        T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let (out, out_rx) = mpsc::unbounded_channel();
        let (accept_tx, accept_rx) = mpsc::channel(ACCEPT_BACKLOG);
        let inner = Arc::new(Inner {
            role,
            state: Mutex::new(ConnState {
                streams: HashMap::new(),
                next_id: if role == Role::Server { 2 } else { 1 },
                last_peer_id: 0,
                closing: false,
                session_unacked: 0,
                session_update_queued: false,
            }),
            out,
            budget: Semaphore::new(WRITE_BUDGET),
            buffered: AtomicUsize::new(0),
            space: Notify::new(),
            closing_flag: AtomicBool::new(false),
            closing: watch::Sender::new(false),
            writer_done: watch::Sender::new(false),
            done: watch::Sender::new(false),
            tasks_left: AtomicUsize::new(2),
        });
        let keep = Arc::new(KeepAlive { inner: inner.clone() });
        let (r, w) = tokio::io::split(io);
        tokio::spawn(run_reader(inner.clone(), Arc::downgrade(&keep), accept_tx, r));
        tokio::spawn(run_writer(inner, out_rx, w));
        (Connection { keep: keep.clone() }, Incoming { rx: accept_rx, keep })
    }

    /// Opens a stream (SYN_STREAM with these headers; fin = no data will follow from us).
    pub async fn open(&self, headers: Headers, fin: bool) -> io::Result<Stream> {
        let inner = &self.keep.inner;
        let shared = {
            let mut conn = lock(&inner.state);
            if conn.closing {
                return Err(closed_error());
            }
            let id = conn.next_id;
            if id > 0x7fff_ffff {
                return Err(io::Error::other("SPDY stream ids exhausted"));
            }
            conn.next_id += 2;
            let shared = StreamShared::new(
                id,
                true,
                StreamState {
                    local_closed: fin,
                    ..StreamState::default()
                },
            );
            conn.streams.insert(id, shared.clone());
            // Queued under the lock so SYN_STREAMs go out in increasing id order, as the peer requires.
            inner.enqueue(Outgoing::SynStream {
                stream_id: id,
                headers: headers.clone(),
                fin,
            });
            shared
        };
        Ok(Stream::new(shared, headers, self.keep.clone()))
    }

    /// Sends GOAWAY and closes the connection after pending frames are written.
    pub fn close(&self) {
        self.keep.inner.shutdown(Some(frame::GOAWAY_OK));
    }

    /// Resolves when the connection has ended (peer closed, GOAWAY, error, or close()) and its tasks
    /// have let go of the transport.
    pub async fn closed(&self) {
        let mut done = self.keep.inner.done.subscribe();
        let _ = done.wait_for(|d| *d).await;
    }
}

impl Incoming {
    /// Streams the peer opened (SYN_STREAM), in order; None once the connection ended. Cancel-safe.
    pub async fn accept(&mut self) -> Option<Stream> {
        let mut closing = self.keep.inner.closing.subscribe();
        tokio::select! {
            biased;
            _ = closing.wait_for(|c| *c) => None,
            stream = self.rx.recv() => stream,
        }
    }
}

impl Stream {
    fn new(shared: Arc<StreamShared>, headers: Headers, keep: Arc<KeepAlive>) -> Stream {
        Stream {
            headers,
            recv: RecvStream {
                shared: shared.clone(),
                keep: keep.clone(),
            },
            send: SendStream { shared, keep },
        }
    }

    pub fn id(&self) -> u32 {
        self.recv.shared.id
    }

    /// The SYN_STREAM's headers (the peer's for accepted streams, ours for opened ones).
    pub fn headers(&self) -> &Headers {
        &self.headers
    }

    /// The first value of a header; `name` is matched case-insensitively.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn split(self) -> (RecvStream, SendStream) {
        (self.recv, self.send)
    }
}

impl RecvStream {
    pub fn id(&self) -> u32 {
        self.shared.id
    }

    /// Next DATA payload; None after the peer's FIN, a RST_STREAM, or the connection's end. Data that
    /// arrived before any of those is delivered first, as spdystream does (it hands each DATA frame to
    /// the reader before it looks at the next frame); only our own `reset` discards it. Cancel-safe.
    pub async fn recv(&mut self) -> Option<Bytes> {
        let inner = &self.keep.inner;
        loop {
            {
                let mut st = lock(&self.shared.state);
                if let Some(data) = st.queue.pop_front() {
                    st.buffered -= charge(data.len());
                    drop(st);
                    inner.buffered.fetch_sub(charge(data.len()), Ordering::AcqRel);
                    inner.space.notify_one();
                    inner.ack(&self.shared, data.len());
                    return Some(data);
                }
                if st.remote_closed || st.conn_ended || st.reset.is_some() {
                    return None;
                }
            }
            self.shared.notify.notified().await;
        }
    }

    /// For streams we opened: waits for the peer's SYN_REPLY and returns its headers.
    pub async fn reply_headers(&mut self) -> io::Result<Headers> {
        if !self.shared.local {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the peer opened this stream",
            ));
        }
        loop {
            {
                let st = lock(&self.shared.state);
                if let Some(headers) = &st.reply {
                    return Ok(headers.clone());
                }
                match st.reset {
                    Some(status) if status == RstStatus::RefusedStream.code() => {
                        return Err(io::Error::new(io::ErrorKind::ConnectionRefused, "stream refused"))
                    }
                    Some(status) => {
                        let msg = format!("stream reset (status {status})");
                        return Err(io::Error::new(io::ErrorKind::ConnectionReset, msg));
                    }
                    None if st.conn_ended => return Err(closed_error()),
                    None if st.remote_closed => {
                        return Err(io::Error::new(
                            io::ErrorKind::UnexpectedEof,
                            "stream closed without SYN_REPLY",
                        ))
                    }
                    None => {}
                }
            }
            self.shared.notify.notified().await;
        }
    }
}

impl Drop for RecvStream {
    fn drop(&mut self) {
        let inner = &self.keep.inner;
        let (freed, raw, both) = {
            let mut st = lock(&self.shared.state);
            st.recv_dropped = true;
            let raw: usize = st.queue.drain(..).map(|b| b.len()).sum();
            (std::mem::take(&mut st.buffered), raw, st.send_dropped)
        };
        if freed > 0 {
            inner.buffered.fetch_sub(freed, Ordering::AcqRel);
            inner.space.notify_one();
            inner.ack(&self.shared, raw);
        }
        if both {
            release_stream(inner, &self.shared);
        }
    }
}

impl SendStream {
    pub fn id(&self) -> u32 {
        self.shared.id
    }

    /// For accepted streams: SYN_REPLY (must come before any data on it). On a stream the peer opened
    /// unidirectional there is nothing to answer, and this does nothing.
    pub async fn reply(&mut self, headers: Headers, fin: bool) -> io::Result<()> {
        let inner = &self.keep.inner;
        if self.shared.local {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot reply on a stream we opened",
            ));
        }
        let finished = {
            let mut st = lock(&self.shared.state);
            if !st.needs_reply {
                if st.local_closed && st.reset.is_none() && !st.conn_ended {
                    return Ok(()); // unidirectional
                }
                st.writable()?;
                return Err(io::Error::new(io::ErrorKind::InvalidInput, "stream already replied"));
            }
            st.needs_reply = false;
            st.writable()?;
            st.local_closed = fin;
            inner.enqueue(Outgoing::SynReply {
                stream_id: self.shared.id,
                headers,
                fin,
            });
            st.finished()
        };
        if finished {
            inner.remove(self.shared.id);
        }
        Ok(())
    }

    /// Sends `data` as DATA frames of at most 16 KiB, waiting while too much is queued for the socket.
    /// Returns once the data is queued (not yet written). Cancelling it may leave a prefix sent.
    pub async fn send(&mut self, data: &[u8]) -> io::Result<()> {
        let inner = &self.keep.inner;
        for chunk in data.chunks(MAX_DATA_CHUNK) {
            lock(&self.shared.state).writable()?;
            let len = frame::HEADER_LEN + chunk.len();
            let permit = inner
                .budget
                .acquire_many(len as u32)
                .await
                .map_err(|_| closed_error())?;
            // Checked again under the lock that orders us against reset/finish from elsewhere.
            let st = lock(&self.shared.state);
            st.writable()?;
            let mut buf = BytesMut::with_capacity(len);
            frame::put_data_header(&mut buf, self.shared.id, false, chunk.len());
            buf.extend_from_slice(chunk);
            permit.forget();
            inner.enqueue(Outgoing::Raw {
                bytes: buf.freeze(),
                permits: len,
            });
            drop(st);
        }
        Ok(())
    }

    /// Half-closes our side (an empty DATA frame with FLAG_FIN, as spdystream does). Finishing twice is
    /// fine.
    pub async fn finish(&mut self) -> io::Result<()> {
        let inner = &self.keep.inner;
        let finished = {
            let mut st = lock(&self.shared.state);
            if st.local_closed && st.reset.is_none() && !st.conn_ended {
                return Ok(());
            }
            st.writable()?;
            st.local_closed = true;
            inner.enqueue(Outgoing::Frame {
                frame: Frame::Data {
                    stream_id: self.shared.id,
                    fin: true,
                    data: Bytes::new(),
                },
                permits: 0,
            });
            st.finished()
        };
        if finished {
            inner.remove(self.shared.id);
        }
        Ok(())
    }

    /// RST_STREAM with `status`: the stream ends both ways, and buffered incoming data is discarded.
    pub fn reset(&self, status: RstStatus) {
        reset_stream(&self.keep.inner, &self.shared, status);
    }
}

impl Drop for SendStream {
    fn drop(&mut self) {
        let inner = &self.keep.inner;
        let (refuse, both) = {
            let mut st = lock(&self.shared.state);
            st.send_dropped = true;
            let mut refuse = false;
            if st.reset.is_none() && !st.conn_ended && !st.local_closed {
                if st.needs_reply {
                    refuse = true;
                } else {
                    // Dropping the writer is the end of our data, like closing a pipe.
                    st.local_closed = true;
                    inner.enqueue(Outgoing::Frame {
                        frame: Frame::Data {
                            stream_id: self.shared.id,
                            fin: true,
                            data: Bytes::new(),
                        },
                        permits: 0,
                    });
                }
            }
            (refuse, st.recv_dropped)
        };
        if refuse {
            // An accepted stream dropped unanswered was refused (spdystream's Stream.Refuse does the same).
            reset_stream(inner, &self.shared, RstStatus::RefusedStream);
        }
        if both || lock(&self.shared.state).finished() {
            release_stream(inner, &self.shared);
        }
    }
}

fn reset_stream(inner: &Inner, shared: &Arc<StreamShared>, status: RstStatus) {
    {
        let mut st = lock(&shared.state);
        if st.reset.is_some() || st.conn_ended || (st.local_closed && st.remote_closed) {
            return;
        }
        st.reset = Some(status.code());
        inner
            .buffered
            .fetch_sub(std::mem::take(&mut st.buffered), Ordering::AcqRel);
        st.queue.clear();
        inner.enqueue_frame(Frame::RstStream {
            stream_id: shared.id,
            status: status.code(),
        });
    }
    shared.notify.notify_one();
    inner.space.notify_one();
    inner.remove(shared.id);
}

/// Both halves are gone (or the stream is over): a peer still sending is told to stop, and the entry
/// goes so the connection does not accumulate dead streams.
fn release_stream(inner: &Inner, shared: &Arc<StreamShared>) {
    let cancel = {
        let st = lock(&shared.state);
        st.recv_dropped && st.send_dropped && !st.remote_closed && st.reset.is_none() && !st.conn_ended
    };
    if cancel {
        reset_stream(inner, shared, RstStatus::Cancel);
    }
    inner.remove(shared.id);
}

#[cfg(test)]
mod tests;
