//! Framing of the shim protocol: a 4-byte big-endian length, then that many bytes of one protobuf
//! message (see proto/shim/v1/shim.proto). The daemon side (src/shim_client) frames the same way.

use prost::Message;

/// Largest message either side accepts. Requests and responses are small; a bigger length is a
/// peer speaking another protocol (or garbage) and ends the connection.
pub const MAX_FRAME: usize = 4 << 20;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("undecodable message: {0}")]
    Decode(String),
}

/// Encodes `msg` as one frame.
pub fn encode<M: Message>(msg: &M) -> Vec<u8> {
    let mut out = Vec::with_capacity(4 + msg.encoded_len());
    encode_to(msg, &mut out);
    out
}

/// Appends `msg` as one frame to `out`.
pub fn encode_to<M: Message>(msg: &M, out: &mut Vec<u8>) {
    let len = msg.encoded_len();
    out.reserve(4 + len);
    out.extend_from_slice(&(len as u32).to_be_bytes());
    msg.encode(out).expect("a Vec grows as needed");
}

/// Accumulates bytes read from a connection and splits them into frames.
#[derive(Default)]
pub struct FrameReader {
    buf: Vec<u8>,
}

impl FrameReader {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// True while a frame has started but is not complete (EOF now would cut a message).
    pub fn is_partial(&self) -> bool {
        !self.buf.is_empty()
    }

    /// True when a complete frame (or an oversized length) is waiting to be taken.
    pub fn has_frame(&self) -> bool {
        self.buf.len() >= 4 && {
            let len = u32::from_be_bytes(self.buf[..4].try_into().unwrap()) as usize;
            len > MAX_FRAME || self.buf.len() >= 4 + len
        }
    }

    /// The next complete frame's payload, if one has arrived.
    pub fn next_frame(&mut self) -> Result<Option<Vec<u8>>, FrameError> {
        if self.buf.len() < 4 {
            return Ok(None);
        }
        let len = u32::from_be_bytes(self.buf[..4].try_into().unwrap()) as usize;
        if len > MAX_FRAME {
            return Err(FrameError::TooLarge(len));
        }
        if self.buf.len() < 4 + len {
            return Ok(None);
        }
        let payload = self.buf[4..4 + len].to_vec();
        self.buf.drain(..4 + len);
        if self.buf.is_empty() {
            // Connections are long-lived and mostly idle: give the memory back.
            self.buf = Vec::new();
        }
        Ok(Some(payload))
    }

    /// The next complete frame decoded as `M`.
    pub fn next_message<M: Message + Default>(&mut self) -> Result<Option<M>, FrameError> {
        match self.next_frame()? {
            None => Ok(None),
            Some(payload) => M::decode(payload.as_slice())
                .map(Some)
                .map_err(|e| FrameError::Decode(e.to_string())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pb;

    fn kill(id: &str) -> pb::Request {
        pb::Request {
            kind: Some(pb::request::Kind::Kill(pb::KillRequest {
                container_id: id.into(),
                signal: 9,
                all: true,
            })),
        }
    }

    #[test]
    fn round_trip_byte_by_byte() {
        let a = encode(&kill("a"));
        let b = encode(&kill("bb"));
        let mut wire = a.clone();
        wire.extend_from_slice(&b);
        let mut r = FrameReader::default();
        let mut got = Vec::new();
        for byte in wire {
            r.push(&[byte]);
            while let Some(m) = r.next_message::<pb::Request>().unwrap() {
                got.push(m);
            }
        }
        assert_eq!(got, vec![kill("a"), kill("bb")]);
        assert!(!r.is_partial());
    }

    #[test]
    fn header_is_big_endian_length() {
        let f = encode(&kill("abc"));
        let len = u32::from_be_bytes(f[..4].try_into().unwrap()) as usize;
        assert_eq!(len, f.len() - 4);
    }

    #[test]
    fn empty_message_is_a_zero_length_frame() {
        let f = encode(&pb::Request::default());
        assert_eq!(f, vec![0, 0, 0, 0]);
        let mut r = FrameReader::default();
        r.push(&f);
        assert_eq!(r.next_message::<pb::Request>().unwrap(), Some(pb::Request::default()));
    }

    #[test]
    fn partial_frame_waits() {
        let f = encode(&kill("abc"));
        let mut r = FrameReader::default();
        r.push(&f[..f.len() - 1]);
        assert!(!r.has_frame());
        assert_eq!(r.next_frame().unwrap(), None);
        assert!(r.is_partial());
        r.push(&f[f.len() - 1..]);
        assert!(r.has_frame());
        assert!(r.next_frame().unwrap().is_some());
        assert!(!r.has_frame());
    }

    #[test]
    fn session_frames_round_trip() {
        let mut wire = Vec::new();
        let outputs = [
            pb::session_output::Kind::Stdout(b"out".to_vec()),
            pb::session_output::Kind::Stderr(vec![0; 70_000]),
            pb::session_output::Kind::Exit(pb::SessionExit { exit_code: 3 }),
        ];
        for k in &outputs {
            encode_to(&pb::SessionOutput { kind: Some(k.clone()) }, &mut wire);
        }
        let mut r = FrameReader::default();
        r.push(&wire);
        for k in outputs {
            assert_eq!(r.next_message::<pb::SessionOutput>().unwrap().unwrap().kind, Some(k));
        }
        assert!(!r.is_partial());
        let input = pb::SessionInput {
            kind: Some(pb::session_input::Kind::Resize(pb::Resize { width: 80, height: 24 })),
        };
        r.push(&encode(&input));
        assert_eq!(r.next_message::<pb::SessionInput>().unwrap(), Some(input));
    }

    #[test]
    fn oversized_length_is_refused_before_buffering() {
        let mut r = FrameReader::default();
        r.push(&((MAX_FRAME as u32) + 1).to_be_bytes());
        assert_eq!(r.next_frame(), Err(FrameError::TooLarge(MAX_FRAME + 1)));
    }

    #[test]
    fn garbage_payload_is_a_decode_error() {
        let mut r = FrameReader::default();
        r.push(&[0, 0, 0, 2, 0xff, 0xff]);
        assert!(matches!(r.next_message::<pb::Request>(), Err(FrameError::Decode(_))));
    }
}
