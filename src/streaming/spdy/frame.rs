//! SPDY/3 frame codec (draft 3, section 2.2 and 2.6): 8-byte frame headers, big-endian fields.
//!
//! ```text
//! control: |1| version (15) | type (16) | flags (8) | length (24) | payload
//! data:    |0| stream id (31)           | flags (8) | length (24) | payload
//! ```
//!
//! Header blocks stay compressed here; `headers.rs` owns the per-direction zlib contexts because
//! blocks must be (de)compressed in exactly the order frames cross the wire.

use bytes::{Buf, BufMut, Bytes, BytesMut};

/// The only version spoken: spdystream (and so every Kubernetes client) sends version 3 frames even
/// though the HTTP upgrade names the protocol "SPDY/3.1".
pub(super) const VERSION: u16 = 3;
pub(super) const HEADER_LEN: usize = 8;
/// The 24-bit length field's maximum; spdystream refuses to write longer DATA frames too.
pub(super) const MAX_PAYLOAD: usize = (1 << 24) - 1;
/// Control frames carry at most a compressed header block; real ones are tiny, so anything this big
/// is hostile and is refused before it is buffered.
pub(super) const MAX_CONTROL_PAYLOAD: usize = 1 << 20;

pub(super) const FLAG_FIN: u8 = 0x01;
pub(super) const FLAG_UNIDIRECTIONAL: u8 = 0x02;
pub(super) const FLAG_SETTINGS_CLEAR: u8 = 0x01;

const TYPE_SYN_STREAM: u16 = 1;
const TYPE_SYN_REPLY: u16 = 2;
const TYPE_RST_STREAM: u16 = 3;
const TYPE_SETTINGS: u16 = 4;
const TYPE_PING: u16 = 6;
const TYPE_GOAWAY: u16 = 7;
const TYPE_HEADERS: u16 = 8;
const TYPE_WINDOW_UPDATE: u16 = 9;

/// GOAWAY status codes (section 2.6.6).
pub(super) const GOAWAY_OK: u32 = 0;
pub(super) const GOAWAY_PROTOCOL_ERROR: u32 = 1;

const STREAM_ID_MASK: u32 = 0x7fff_ffff;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Setting {
    pub(super) flags: u8,
    pub(super) id: u32,
    pub(super) value: u32,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Frame {
    Data {
        stream_id: u32,
        fin: bool,
        data: Bytes,
    },
    SynStream {
        stream_id: u32,
        associated_id: u32,
        priority: u8,
        slot: u8,
        fin: bool,
        unidirectional: bool,
        block: Bytes,
    },
    SynReply {
        stream_id: u32,
        fin: bool,
        block: Bytes,
    },
    RstStream {
        stream_id: u32,
        status: u32,
    },
    Settings {
        clear: bool,
        entries: Vec<Setting>,
    },
    Ping {
        id: u32,
    },
    GoAway {
        last_good_stream_id: u32,
        status: u32,
    },
    Headers {
        stream_id: u32,
        fin: bool,
        block: Bytes,
    },
    WindowUpdate {
        stream_id: u32,
        delta: u32,
    },
    /// A version-3 control frame of a type we do not know (the draft says: ignore it). Its payload is
    /// dropped; encoding one writes zeros, which only tests need.
    Unknown {
        kind: u16,
        flags: u8,
        len: usize,
    },
}

/// A frame that cannot be parsed. All of these are session errors: after one, the byte stream cannot be
/// trusted to be in sync, so the connection answers GOAWAY(PROTOCOL_ERROR) and ends.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    #[error("unsupported SPDY version {0}")]
    Version(u16),
    #[error("control frame payload of {0} bytes exceeds the {MAX_CONTROL_PAYLOAD}-byte limit")]
    TooLarge(usize),
    #[error("invalid {kind} frame: {reason}")]
    Invalid { kind: &'static str, reason: &'static str },
}

fn invalid(kind: &'static str, reason: &'static str) -> FrameError {
    FrameError::Invalid { kind, reason }
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

/// Bytes the frame at the front of `buf` occupies, once its header is in; lets the reader size reads.
pub(super) fn frame_len(buf: &[u8]) -> Option<usize> {
    (buf.len() >= HEADER_LEN).then(|| HEADER_LEN + (be32(&buf[4..8]) & 0x00ff_ffff) as usize)
}

/// Takes one whole frame off the front of `buf`; `Ok(None)` means more bytes are needed. Limits are
/// checked as soon as the header is in, so an oversized control frame is refused before it is buffered.
pub(crate) fn decode(buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let word = be32(&buf[0..4]);
    let flags = buf[4];
    let len = (be32(&buf[4..8]) & 0x00ff_ffff) as usize;
    let control = word & 0x8000_0000 != 0;
    if control {
        let version = ((word >> 16) & 0x7fff) as u16;
        if version != VERSION {
            return Err(FrameError::Version(version));
        }
        if len > MAX_CONTROL_PAYLOAD {
            return Err(FrameError::TooLarge(len));
        }
    }
    if buf.len() < HEADER_LEN + len {
        return Ok(None);
    }
    if control {
        let frame = decode_control((word & 0xffff) as u16, flags, &buf[HEADER_LEN..HEADER_LEN + len]);
        buf.advance(HEADER_LEN + len);
        return frame.map(Some);
    }
    buf.advance(HEADER_LEN);
    // Small payloads are copied out so they never pin the larger read buffer; big ones take it over.
    let data = if len >= 64 * 1024 {
        buf.split_to(len).freeze()
    } else {
        let data = Bytes::copy_from_slice(&buf[..len]);
        buf.advance(len);
        data
    };
    if word == 0 {
        return Err(invalid("DATA", "stream id 0"));
    }
    Ok(Some(Frame::Data {
        stream_id: word,
        fin: flags & FLAG_FIN != 0,
        data,
    }))
}

fn decode_control(kind: u16, flags: u8, p: &[u8]) -> Result<Frame, FrameError> {
    let fin = flags & FLAG_FIN != 0;
    let frame = match kind {
        TYPE_SYN_STREAM => {
            if p.len() < 10 {
                return Err(invalid("SYN_STREAM", "shorter than 10 bytes"));
            }
            Frame::SynStream {
                stream_id: nonzero_stream(be32(p), "SYN_STREAM")?,
                associated_id: be32(&p[4..]) & STREAM_ID_MASK,
                priority: p[8] >> 5,
                slot: p[9],
                fin,
                unidirectional: flags & FLAG_UNIDIRECTIONAL != 0,
                block: Bytes::copy_from_slice(&p[10..]),
            }
        }
        TYPE_SYN_REPLY | TYPE_HEADERS => {
            let name = if kind == TYPE_SYN_REPLY { "SYN_REPLY" } else { "HEADERS" };
            if p.len() < 4 {
                return Err(invalid(name, "shorter than 4 bytes"));
            }
            let stream_id = nonzero_stream(be32(p), name)?;
            let block = Bytes::copy_from_slice(&p[4..]);
            if kind == TYPE_SYN_REPLY {
                Frame::SynReply { stream_id, fin, block }
            } else {
                Frame::Headers { stream_id, fin, block }
            }
        }
        TYPE_RST_STREAM => {
            exact_len(p, 8, "RST_STREAM")?;
            Frame::RstStream {
                stream_id: nonzero_stream(be32(p), "RST_STREAM")?,
                status: be32(&p[4..]),
            }
        }
        TYPE_SETTINGS => {
            if p.len() < 4 {
                return Err(invalid("SETTINGS", "shorter than 4 bytes"));
            }
            let count = be32(p) as usize;
            if count > (p.len() - 4) / 8 || p.len() != 4 + count * 8 {
                return Err(invalid("SETTINGS", "entry count does not match length"));
            }
            let entries = p[4..]
                .chunks_exact(8)
                .map(|e| Setting {
                    flags: e[0],
                    id: be32(e) & 0x00ff_ffff,
                    value: be32(&e[4..]),
                })
                .collect();
            Frame::Settings {
                clear: flags & FLAG_SETTINGS_CLEAR != 0,
                entries,
            }
        }
        TYPE_PING => {
            exact_len(p, 4, "PING")?;
            Frame::Ping { id: be32(p) }
        }
        TYPE_GOAWAY => {
            exact_len(p, 8, "GOAWAY")?;
            Frame::GoAway {
                last_good_stream_id: be32(p) & STREAM_ID_MASK,
                status: be32(&p[4..]),
            }
        }
        TYPE_WINDOW_UPDATE => {
            exact_len(p, 8, "WINDOW_UPDATE")?;
            Frame::WindowUpdate {
                stream_id: be32(p) & STREAM_ID_MASK,
                delta: be32(&p[4..]) & STREAM_ID_MASK,
            }
        }
        _ => Frame::Unknown {
            kind,
            flags,
            len: p.len(),
        },
    };
    Ok(frame)
}

fn exact_len(p: &[u8], want: usize, kind: &'static str) -> Result<(), FrameError> {
    if p.len() == want {
        Ok(())
    } else {
        Err(invalid(kind, "wrong length"))
    }
}

fn nonzero_stream(word: u32, kind: &'static str) -> Result<u32, FrameError> {
    match word & STREAM_ID_MASK {
        0 => Err(invalid(kind, "stream id 0")),
        id => Ok(id),
    }
}

fn put_control_header(dst: &mut BytesMut, kind: u16, flags: u8, len: usize) {
    debug_assert!(len <= MAX_PAYLOAD);
    dst.put_u16(0x8000 | VERSION);
    dst.put_u16(kind);
    dst.put_u32((flags as u32) << 24 | len as u32);
}

/// The 8-byte header of a DATA frame, for callers that append the payload themselves.
pub(super) fn put_data_header(dst: &mut BytesMut, stream_id: u32, fin: bool, len: usize) {
    debug_assert!(len <= MAX_PAYLOAD);
    dst.put_u32(stream_id & STREAM_ID_MASK);
    dst.put_u32((if fin { FLAG_FIN as u32 } else { 0 }) << 24 | len as u32);
}

fn fin_flag(fin: bool) -> u8 {
    if fin {
        FLAG_FIN
    } else {
        0
    }
}

impl Frame {
    pub(crate) fn encode(&self, dst: &mut BytesMut) {
        match self {
            Frame::Data { stream_id, fin, data } => {
                dst.reserve(HEADER_LEN + data.len());
                put_data_header(dst, *stream_id, *fin, data.len());
                dst.put_slice(data);
            }
            Frame::SynStream {
                stream_id,
                associated_id,
                priority,
                slot,
                fin,
                unidirectional,
                block,
            } => {
                let flags = fin_flag(*fin) | if *unidirectional { FLAG_UNIDIRECTIONAL } else { 0 };
                put_control_header(dst, TYPE_SYN_STREAM, flags, 10 + block.len());
                dst.put_u32(stream_id & STREAM_ID_MASK);
                dst.put_u32(associated_id & STREAM_ID_MASK);
                dst.put_u8(priority << 5);
                dst.put_u8(*slot);
                dst.put_slice(block);
            }
            Frame::SynReply { stream_id, fin, block } | Frame::Headers { stream_id, fin, block } => {
                let kind = if matches!(self, Frame::SynReply { .. }) {
                    TYPE_SYN_REPLY
                } else {
                    TYPE_HEADERS
                };
                put_control_header(dst, kind, fin_flag(*fin), 4 + block.len());
                dst.put_u32(stream_id & STREAM_ID_MASK);
                dst.put_slice(block);
            }
            Frame::RstStream { stream_id, status } => {
                put_control_header(dst, TYPE_RST_STREAM, 0, 8);
                dst.put_u32(stream_id & STREAM_ID_MASK);
                dst.put_u32(*status);
            }
            Frame::Settings { clear, entries } => {
                let flags = if *clear { FLAG_SETTINGS_CLEAR } else { 0 };
                put_control_header(dst, TYPE_SETTINGS, flags, 4 + 8 * entries.len());
                dst.put_u32(entries.len() as u32);
                for e in entries {
                    dst.put_u32((e.flags as u32) << 24 | (e.id & 0x00ff_ffff));
                    dst.put_u32(e.value);
                }
            }
            Frame::Ping { id } => {
                put_control_header(dst, TYPE_PING, 0, 4);
                dst.put_u32(*id);
            }
            Frame::GoAway {
                last_good_stream_id,
                status,
            } => {
                put_control_header(dst, TYPE_GOAWAY, 0, 8);
                dst.put_u32(last_good_stream_id & STREAM_ID_MASK);
                dst.put_u32(*status);
            }
            Frame::WindowUpdate { stream_id, delta } => {
                put_control_header(dst, TYPE_WINDOW_UPDATE, 0, 8);
                dst.put_u32(stream_id & STREAM_ID_MASK);
                dst.put_u32(delta & STREAM_ID_MASK);
            }
            Frame::Unknown { kind, flags, len } => {
                put_control_header(dst, *kind, *flags, *len);
                dst.put_bytes(0, *len);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SETTINGS id for the initial stream window (section 2.6.4).
    const SETTINGS_INITIAL_WINDOW_SIZE: u32 = 7;

    fn unhex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    fn encoded(frame: &Frame) -> Vec<u8> {
        let mut buf = BytesMut::new();
        frame.encode(&mut buf);
        buf.to_vec()
    }

    /// Encodes to exactly `wire`, and `wire` decodes back to the frame, in one piece and byte by byte.
    fn check(frame: Frame, wire: &str) {
        let wire = unhex(wire);
        assert_eq!(encoded(&frame), wire, "{frame:?}");
        let mut buf = BytesMut::from(&wire[..]);
        assert_eq!(decode(&mut buf).unwrap(), Some(frame.clone()));
        assert!(buf.is_empty());
        let mut buf = BytesMut::new();
        for (i, b) in wire.iter().enumerate() {
            assert_eq!(
                decode(&mut buf).unwrap(),
                None,
                "complete after {i} of {} bytes",
                wire.len()
            );
            buf.put_u8(*b);
        }
        assert_eq!(frame_len(&buf), Some(wire.len()));
        assert_eq!(decode(&mut buf).unwrap(), Some(frame));
    }

    #[test]
    fn data_frame_layout() {
        check(
            Frame::Data {
                stream_id: 1,
                fin: false,
                data: Bytes::from_static(b"hello"),
            },
            "00000001 00000005 68656c6c6f",
        );
        // An empty DATA frame with FLAG_FIN is how spdystream half-closes (Stream.Close).
        check(
            Frame::Data {
                stream_id: 0x7fff_fffd,
                fin: true,
                data: Bytes::new(),
            },
            "7ffffffd 01000000",
        );
    }

    #[test]
    fn syn_stream_layout() {
        // Chromium spdy_framer_test CreateSynStreamCompressed, SPDY/3: stream 1, priority 4, headers
        // bar: foo / foo: bar compressed with the SPDY dictionary.
        let block = "38eae3c6a7c202e50e50c24b4a04e50b6680004acbcf0708201095969f0fa200022829b108208000000000ffff";
        check(
            Frame::SynStream {
                stream_id: 1,
                associated_id: 0,
                priority: 4,
                slot: 0,
                fin: false,
                unidirectional: false,
                block: Bytes::from(unhex(block)),
            },
            &format!("80030001 00000037 00000001 00000000 8000 {block}"),
        );
        check(
            Frame::SynStream {
                stream_id: 3,
                associated_id: 1,
                priority: 7,
                slot: 9,
                fin: true,
                unidirectional: true,
                block: Bytes::from_static(b"\x00\x00\x00\x00"),
            },
            "80030001 0300000e 00000003 00000001 e009 00000000",
        );
    }

    #[test]
    fn syn_reply_and_headers_layout() {
        check(
            Frame::SynReply {
                stream_id: 1,
                fin: false,
                block: Bytes::from_static(b"\xab\xcd"),
            },
            "80030002 00000006 00000001 abcd",
        );
        check(
            Frame::SynReply {
                stream_id: 2,
                fin: true,
                block: Bytes::new(),
            },
            "80030002 01000004 00000002",
        );
        check(
            Frame::Headers {
                stream_id: 5,
                fin: true,
                block: Bytes::from_static(b"\x01"),
            },
            "80030008 01000005 00000005 01",
        );
    }

    #[test]
    fn rst_stream_layout() {
        // Chromium CreateRstStream: stream 1, PROTOCOL_ERROR.
        check(
            Frame::RstStream {
                stream_id: 1,
                status: 1,
            },
            "80030003 00000008 00000001 00000001",
        );
        check(
            Frame::RstStream {
                stream_id: 0x7fff_ffff,
                status: 5,
            },
            "80030003 00000008 7fffffff 00000005",
        );
    }

    #[test]
    fn settings_layout() {
        // SPDY/3 puts the flags in the id's top byte and the 24-bit id after it, big-endian.
        check(
            Frame::Settings {
                clear: false,
                entries: vec![
                    Setting {
                        flags: 1,
                        id: SETTINGS_INITIAL_WINDOW_SIZE,
                        value: 0x1_0000,
                    },
                    Setting {
                        flags: 0,
                        id: 0x0a_0b0c,
                        value: 0x0102_0304,
                    },
                ],
            },
            "80030004 00000014 00000002 01000007 00010000 000a0b0c 01020304",
        );
        check(
            Frame::Settings {
                clear: true,
                entries: vec![],
            },
            "80030004 01000004 00000000",
        );
    }

    #[test]
    fn ping_goaway_window_update_layout() {
        check(Frame::Ping { id: 0x1234_5678 }, "80030006 00000004 12345678");
        check(
            Frame::GoAway {
                last_good_stream_id: 7,
                status: GOAWAY_OK,
            },
            "80030007 00000008 00000007 00000000",
        );
        check(
            Frame::GoAway {
                last_good_stream_id: 0,
                status: GOAWAY_PROTOCOL_ERROR,
            },
            "80030007 00000008 00000000 00000001",
        );
        check(
            Frame::WindowUpdate {
                stream_id: 1,
                delta: 0x8000,
            },
            "80030009 00000008 00000001 00008000",
        );
        check(
            Frame::WindowUpdate { stream_id: 0, delta: 1 },
            "80030009 00000008 00000000 00000001",
        );
    }

    #[test]
    fn unknown_control_frames_are_skipped_whole() {
        // A CREDENTIAL frame (type 10) we do not implement, followed by a PING.
        let mut buf = BytesMut::from(&unhex("8003000a 00000003 aabbcc 80030006 00000004 00000001")[..]);
        assert_eq!(
            decode(&mut buf).unwrap(),
            Some(Frame::Unknown {
                kind: 10,
                flags: 0,
                len: 3
            })
        );
        assert_eq!(decode(&mut buf).unwrap(), Some(Frame::Ping { id: 1 }));
    }

    #[test]
    fn reserved_bits_are_ignored() {
        let mut buf = BytesMut::from(&unhex("80030003 00000008 80000003 00000005")[..]);
        assert_eq!(
            decode(&mut buf).unwrap(),
            Some(Frame::RstStream {
                stream_id: 3,
                status: 5
            })
        );
    }

    #[test]
    fn firefox_syn_stream_decodes() {
        // A SYN_STREAM Firefox sent to facebook.com (from proxygen's SPDYCodecTest): FLAG_FIN, a 1040-byte
        // block from a real browser's zlib. The framing must parse and the block must inflate.
        let wire = unhex(FIREFOX_SYN_STREAM);
        let mut buf = BytesMut::from(&wire[..]);
        let Some(Frame::SynStream {
            stream_id: 1,
            fin: true,
            unidirectional: false,
            block,
            ..
        }) = decode(&mut buf).unwrap()
        else {
            panic!("not the expected SYN_STREAM");
        };
        assert!(buf.is_empty());
        let headers = super::super::headers::Decompressor::new().decode(&block).unwrap();
        let get = |n: &str| headers.iter().find(|(k, _)| k == n).map(|(_, v)| v.as_str());
        assert_eq!(get(":method"), Some("GET"));
        assert_eq!(get(":host"), Some("www.afrind.sb.facebook.com"));
        assert_eq!(get(":path"), Some("/status.php"));
        assert_eq!(get(":version"), Some("HTTP/1.1"));
        assert!(headers.iter().all(|(k, _)| *k == k.to_ascii_lowercase()));
    }

    #[test]
    fn malformed_frames_are_errors() {
        let cases = [
            ("80020001 00000000", FrameError::Version(2)),
            ("80030001 00100001", FrameError::TooLarge(MAX_CONTROL_PAYLOAD + 1)),
            (
                "80030001 00000004 00000001",
                invalid("SYN_STREAM", "shorter than 10 bytes"),
            ),
            (
                "80030001 0000000a 00000000 00000000 0000",
                invalid("SYN_STREAM", "stream id 0"),
            ),
            ("80030002 00000002 0000", invalid("SYN_REPLY", "shorter than 4 bytes")),
            ("80030003 00000004 00000001", invalid("RST_STREAM", "wrong length")),
            (
                "80030003 00000008 00000000 00000001",
                invalid("RST_STREAM", "stream id 0"),
            ),
            (
                "80030004 00000004 00000001",
                invalid("SETTINGS", "entry count does not match length"),
            ),
            (
                "80030004 0000000c ffffffff 00000000 00000000",
                invalid("SETTINGS", "entry count does not match length"),
            ),
            ("80030006 00000008 00000001 00000000", invalid("PING", "wrong length")),
            ("80030007 00000004 00000001", invalid("GOAWAY", "wrong length")),
            ("80030009 00000004 00000001", invalid("WINDOW_UPDATE", "wrong length")),
            ("00000000 00000001 00", invalid("DATA", "stream id 0")),
        ];
        for (wire, want) in cases {
            let mut buf = BytesMut::from(&unhex(wire)[..]);
            assert_eq!(decode(&mut buf), Err(want), "{wire}");
        }
        // The size check fires on the header alone: nothing of the payload needs to be buffered.
        let mut buf = BytesMut::from(&unhex("8003000a 00ffffff")[..]);
        assert_eq!(decode(&mut buf), Err(FrameError::TooLarge(MAX_PAYLOAD)));
        // DATA frames may use the whole 24-bit range.
        let mut buf = BytesMut::from(&unhex("00000001 00ffffff")[..]);
        assert_eq!(decode(&mut buf), Ok(None));
        buf.put_bytes(7, MAX_PAYLOAD);
        let Some(Frame::Data { data, .. }) = decode(&mut buf).unwrap() else {
            panic!()
        };
        assert_eq!(data.len(), MAX_PAYLOAD);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        // A cheap deterministic fuzz: random buffers, and random corruptions of a valid stream.
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let mut valid = BytesMut::new();
        Frame::Ping { id: 1 }.encode(&mut valid);
        Frame::Settings {
            clear: false,
            entries: vec![Setting {
                flags: 0,
                id: 4,
                value: 100,
            }],
        }
        .encode(&mut valid);
        Frame::Data {
            stream_id: 1,
            fin: true,
            data: Bytes::from_static(b"abc"),
        }
        .encode(&mut valid);
        for round in 0..20_000 {
            let mut bytes = if round % 2 == 0 {
                (0..next() % 64).map(|_| next() as u8).collect::<Vec<_>>()
            } else {
                valid.to_vec()
            };
            for _ in 0..(next() % 4) {
                let i = next() as usize % bytes.len().max(1);
                if let Some(b) = bytes.get_mut(i) {
                    *b = next() as u8;
                }
            }
            if round % 3 == 0 {
                // Force the control bit and version so the type-specific parsers get exercised.
                if bytes.len() >= 2 {
                    bytes[0] = 0x80;
                    bytes[1] = 0x03;
                }
            }
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(_)) = decode(&mut buf) {}
        }
    }

    const FIREFOX_SYN_STREAM: &str = "
        800300010100041a0000000100000000000038eae3c6a7c20265575022b4c29e20d9ad10a9d9dd350494f1aca0458714
        30edeb25a61565e6a5e81527e9a5018be9246042d54b061730ec56c5c0a233175cbe669494141483b51624828b3b6e80
        00d22f2e492c292dd62bc828000820942280032080f2f27593139333520102085be1cb01104079f9bac989c919a90001
        84521b7821421f7b78a285ba35c8d796d058294f4d2ad0d1d2d7020b5a004d93849601ba9979c5a9c9a545a9ba459084
        0b723f2340001902041046d150ee9b5f95999393a86faa67a0a0e19b989c9957925f9c610d4eba39c01497ace01fac10
        a16068100f44a69ac074084cb5e1a949de9925faa6c6e67ac6660a1ade1e21be3e3a0a3999d9a90aeea9c9d9f99a0ace
        19c0723a55dfc442cf40cfc8d418647a70625a6251265413f64a4f189c161460894101941a9054225741a979baa1c1c0
        3400f7391bac94617a0c1040b9f125c5b68626866696a686e60666d60001a49092585264eb1b5f6010e65892156ee992
        5761e91b16e8e913ef989d66690d10400af1e989b6ee8e867a467a86464686e666661666967a8626c6c6e696c6262626
        d60001a490536a1b92ee53185ae263eee59aa9ebef5e98961498ebe15d9a516e0d10400a15254579b68e21a6c1c6c5ba
        61a67e49a56551a1ce29c98ed60001088243238661200082ad841cf48cfe5e8a5180a24a6c6831cb24dd67f77544fc3e
        ec5f74dd28d90b0e74dddbb350b2478dac91b5b43071a0d744c95e70a0d7dc9e85923d6ad5b6e7bb94da70a0f344c91e
        38d0796ecf42c93f41708e0320080001f0355b9ab007516245f027343454faff38d399c4be6ad8dca00169cd0d09ee05
        1a90d6dcc7f742823b43874ea994713ef72f80140a6c758dac01024821b938d7d6c81a2080142a8a6d4d8c548d1db38a
        2c13537db32c3c7583930b03558d1d8d548d1d0d4d0c2c4ccd2c4ccc0d558d1d4d0d8d8cad010248a1d8d631d1c4a8a4
        28a2d2dd33b03caa2cd0df3bbc5ccf29c432b032c21a208014d28a6c0d4cfc3c937c9c0a9d428353bc7dfc3283f51cc3
        23fc33f39253330c82cd4a3d928b83531243e2bd4de333ddb3f59c828b4c7213f55c0bf5dc2273f50cf41cc343bd221d
        5d52ac0102482139beb438b5c8d6d4c2c0d4dcd4ccd0d01a20801412934b6c0d4d4c4c8d2d4c0d4dcccc0d2c548ddc4c
        ac01021004073708c3300000576184d8b1c179f0a8547b8d8a163f90d208250e5d9fbbdbb7fbf076f853d79f658dcfe9
        06449c85118bcee1dd166449fce03bc0823ae2156eebd8d18088b3504a5272d140db78dff8adf5446bb3569d47a00111
        67a194a41068746bb3568dcb00ff04c1410e80300804c02f95c242371eb1f419c698188f1efc7f9ca136d0dde7f99598
        418719e99dcb0c3ad03b2334e7f5d4fe1eb8311a022e52023273fb059042798aad9185894985a1a9a905400001000000
        ffff
    ";
}
