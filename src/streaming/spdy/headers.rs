//! SPDY/3 name/value header blocks and their zlib compression.
//!
//! A block is a 4-byte pair count followed by 4-byte-length-prefixed names and values (SPDY/3 widened the
//! v2 2-byte fields). Several values of one name travel as a single NUL-joined value. Every block of a
//! connection direction goes through one zlib stream primed with the SPDY/3 dictionary and ends with a
//! sync flush, so both ends must compress and decompress blocks in frame order.

use flate2::{Compress, Compression, Decompress, FlushCompress, FlushDecompress, Status};

use super::Headers;

/// Largest decompressed header block accepted from a peer; real blocks are well under 1 KiB.
pub(super) const MAX_HEADER_BLOCK: usize = 1 << 20;

/// The SPDY/3 header compression dictionary (draft 3, section 2.6.10.1), identical to spdystream's
/// `spdy/dictionary.go`. Its Adler-32 is 0xe3c6a7c2, which peers put in the zlib header.
#[rustfmt::skip]
pub(super) const DICTIONARY: &[u8; 1423] = b"\
    \x00\x00\x00\x07options\x00\x00\x00\x04head\x00\x00\x00\x04post\x00\x00\x00\x03put\
    \x00\x00\x00\x06delete\x00\x00\x00\x05trace\x00\x00\x00\x06accept\x00\x00\x00\x0eaccept-charset\
    \x00\x00\x00\x0faccept-encoding\x00\x00\x00\x0faccept-language\x00\x00\x00\x0daccept-ranges\
    \x00\x00\x00\x03age\x00\x00\x00\x05allow\x00\x00\x00\x0dauthorization\x00\x00\x00\x0dcache-control\
    \x00\x00\x00\x0aconnection\x00\x00\x00\x0ccontent-base\x00\x00\x00\x10content-encoding\
    \x00\x00\x00\x10content-language\x00\x00\x00\x0econtent-length\x00\x00\x00\x10content-location\
    \x00\x00\x00\x0bcontent-md5\x00\x00\x00\x0dcontent-range\x00\x00\x00\x0ccontent-type\
    \x00\x00\x00\x04date\x00\x00\x00\x04etag\x00\x00\x00\x06expect\x00\x00\x00\x07expires\
    \x00\x00\x00\x04from\x00\x00\x00\x04host\x00\x00\x00\x08if-match\x00\x00\x00\x11if-modified-since\
    \x00\x00\x00\x0dif-none-match\x00\x00\x00\x08if-range\x00\x00\x00\x13if-unmodified-since\
    \x00\x00\x00\x0dlast-modified\x00\x00\x00\x08location\x00\x00\x00\x0cmax-forwards\
    \x00\x00\x00\x06pragma\x00\x00\x00\x12proxy-authenticate\x00\x00\x00\x13proxy-authorization\
    \x00\x00\x00\x05range\x00\x00\x00\x07referer\x00\x00\x00\x0bretry-after\x00\x00\x00\x06server\
    \x00\x00\x00\x02te\x00\x00\x00\x07trailer\x00\x00\x00\x11transfer-encoding\x00\x00\x00\x07upgrade\
    \x00\x00\x00\x0auser-agent\x00\x00\x00\x04vary\x00\x00\x00\x03via\x00\x00\x00\x07warning\
    \x00\x00\x00\x10www-authenticate\x00\x00\x00\x06method\x00\x00\x00\x03get\x00\x00\x00\x06status\
    \x00\x00\x00\x06200 OK\x00\x00\x00\x07version\x00\x00\x00\x08HTTP/1.1\x00\x00\x00\x03url\
    \x00\x00\x00\x06public\x00\x00\x00\x0aset-cookie\x00\x00\x00\x0akeep-alive\x00\x00\x00\x06origin\
    100101201202205206300302303304305306307402405406407408409410411412413414415416417502504505203 Non-Au\
    thoritative Information204 No Content301 Moved Permanently400 Bad Request401 Unauthorized403 Forbidd\
    en404 Not Found500 Internal Server Error501 Not Implemented503 Service UnavailableJan Feb Mar Apr Ma\
    y Jun Jul Aug Sept Oct Nov Dec 00:00:00 Mon, Tue, Wed, Thu, Fri, Sat, Sun, GMTchunked,text/html,imag\
    e/png,image/jpg,image/gif,application/xml,application/xhtml+xml,text/plain,text/javascript,publicpri\
    vatemax-age=gzip,deflate,sdchcharset=utf-8charset=iso-8859-1,utf-,*,enq=0.";

/// Adler-32 of [`DICTIONARY`]: the dictionary id a peer's zlib header must name.
const DICTIONARY_ID: u32 = 0xe3c6_a7c2;

#[derive(Debug, thiserror::Error)]
pub(crate) enum HeaderError {
    /// The zlib stream is broken; the shared context is lost, so this is a session error.
    #[error("header block does not decompress: {0}")]
    Compression(String),
    /// Also a session error: we stopped part-way through the shared zlib stream.
    #[error("header block decompresses to more than {MAX_HEADER_BLOCK} bytes")]
    TooLarge,
    /// The block decompressed fine but its contents are malformed: a stream error.
    #[error("malformed header block: {0}")]
    Malformed(&'static str),
}

impl HeaderError {
    /// Whether the connection's decompression context is still usable after this error.
    pub(super) fn is_stream_error(&self) -> bool {
        matches!(self, HeaderError::Malformed(_))
    }
}

/// Serialises headers as an uncompressed SPDY/3 block: names lower-cased, repeated names NUL-joined
/// (spdystream rejects a block that names a header twice, and it rejects upper-case names).
pub(crate) fn encode_block(headers: &Headers) -> Vec<u8> {
    let mut grouped: Vec<(String, String)> = Vec::with_capacity(headers.len());
    for (name, value) in headers {
        let name = name.to_ascii_lowercase();
        match grouped.iter_mut().find(|(n, _)| *n == name) {
            Some((_, joined)) => {
                joined.push('\0');
                joined.push_str(value);
            }
            None => grouped.push((name, value.clone())),
        }
    }
    let len = 4 + grouped.iter().map(|(n, v)| 8 + n.len() + v.len()).sum::<usize>();
    let mut out = Vec::with_capacity(len);
    out.extend_from_slice(&(grouped.len() as u32).to_be_bytes());
    for (name, value) in &grouped {
        out.extend_from_slice(&(name.len() as u32).to_be_bytes());
        out.extend_from_slice(name.as_bytes());
        out.extend_from_slice(&(value.len() as u32).to_be_bytes());
        out.extend_from_slice(value.as_bytes());
    }
    out
}

/// Parses an uncompressed block. NUL-joined values come back as separate entries under the same
/// name; names are lower-cased (tolerating a sloppy peer rather than failing the stream).
pub(crate) fn parse_block(block: &[u8]) -> Result<Headers, HeaderError> {
    let mut rest = block;
    let count = take_u32(&mut rest)?;
    // Each pair needs at least 8 bytes, which bounds a lying count before anything is allocated.
    if count as usize > rest.len() / 8 {
        return Err(HeaderError::Malformed("pair count exceeds block length"));
    }
    let mut headers = Headers::with_capacity(count as usize);
    for _ in 0..count {
        let name = take_str(&mut rest)?;
        if name.is_empty() {
            return Err(HeaderError::Malformed("empty header name"));
        }
        let name = name.to_ascii_lowercase();
        let value = take_str(&mut rest)?;
        for part in value.split('\0') {
            headers.push((name.clone(), part.to_owned()));
        }
    }
    if !rest.is_empty() {
        return Err(HeaderError::Malformed("trailing bytes after the last header"));
    }
    Ok(headers)
}

fn take_u32(rest: &mut &[u8]) -> Result<u32, HeaderError> {
    let Some((head, tail)) = rest.split_first_chunk::<4>() else {
        return Err(HeaderError::Malformed("truncated length field"));
    };
    *rest = tail;
    Ok(u32::from_be_bytes(*head))
}

fn take_str(rest: &mut &[u8]) -> Result<String, HeaderError> {
    let len = take_u32(rest)? as usize;
    if len > rest.len() {
        return Err(HeaderError::Malformed("string runs past the end of the block"));
    }
    let (bytes, tail) = rest.split_at(len);
    *rest = tail;
    // Header values here are ASCII in practice; a stray byte must not fail the stream.
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

/// Our direction's compression context: one zlib stream for every block we send on a connection.
pub(super) struct Compressor {
    z: Compress,
    primed: bool,
}

impl Compressor {
    pub(super) fn new() -> Self {
        Compressor {
            z: Compress::new(Compression::default(), true),
            primed: false,
        }
    }

    /// Compresses one header block, ending it with a sync flush so the peer can decode it alone.
    pub(super) fn compress(&mut self, headers: &Headers) -> Result<Vec<u8>, HeaderError> {
        self.compress_raw(&encode_block(headers))
    }

    /// Compresses an already serialised block (tests use it to send malformed ones).
    pub(super) fn compress_raw(&mut self, input: &[u8]) -> Result<Vec<u8>, HeaderError> {
        if !self.primed {
            // Set before the first byte so the zlib header carries the dictionary id, as peers expect.
            self.z
                .set_dictionary(DICTIONARY)
                .map_err(|e| HeaderError::Compression(e.to_string()))?;
            self.primed = true;
        }
        let mut out = Vec::with_capacity(input.len() / 2 + 64);
        let start = self.z.total_in();
        loop {
            if out.len() == out.capacity() {
                out.reserve(out.capacity().max(64));
            }
            let done = (self.z.total_in() - start) as usize;
            self.z
                .compress_vec(&input[done..], &mut out, FlushCompress::Sync)
                .map_err(|e| HeaderError::Compression(e.to_string()))?;
            // zlib has finished a flush once it returns with output space left over.
            if (self.z.total_in() - start) as usize == input.len() && out.len() < out.capacity() {
                return Ok(out);
            }
        }
    }
}

/// The peer's direction: one zlib stream spanning every block the peer sends.
pub(crate) struct Decompressor {
    z: Decompress,
}

impl Decompressor {
    pub(crate) fn new() -> Self {
        Decompressor {
            z: Decompress::new(true),
        }
    }

    /// Decompresses one block, bounded by [`MAX_HEADER_BLOCK`], and parses it.
    pub(crate) fn decode(&mut self, block: &[u8]) -> Result<Headers, HeaderError> {
        parse_block(&self.decompress(block)?)
    }

    pub(super) fn decompress(&mut self, block: &[u8]) -> Result<Vec<u8>, HeaderError> {
        let mut out = Vec::with_capacity((block.len() * 4).clamp(256, 16 * 1024));
        let start = self.z.total_in();
        loop {
            if out.len() == out.capacity() {
                out.reserve(out.capacity());
            }
            let consumed = (self.z.total_in() - start) as usize;
            let produced = out.len();
            match self
                .z
                .decompress_vec(&block[consumed..], &mut out, FlushDecompress::Sync)
            {
                Ok(Status::Ok | Status::BufError | Status::StreamEnd) => {}
                Err(e) => match e.needs_dictionary() {
                    Some(DICTIONARY_ID) => {
                        self.z
                            .set_dictionary(DICTIONARY)
                            .map_err(|e| HeaderError::Compression(e.to_string()))?;
                        continue;
                    }
                    Some(other) => return Err(HeaderError::Compression(format!("unknown dictionary {other:#x}"))),
                    None => return Err(HeaderError::Compression(e.to_string())),
                },
            }
            if out.len() > MAX_HEADER_BLOCK {
                return Err(HeaderError::TooLarge);
            }
            let now_consumed = (self.z.total_in() - start) as usize;
            if out.len() < out.capacity() {
                if now_consumed == block.len() {
                    return Ok(out);
                }
                if now_consumed == consumed && out.len() == produced {
                    // Input left that zlib will not take: data after the end of the zlib stream.
                    return Err(HeaderError::Compression("trailing data after the zlib stream".into()));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn dictionary_is_the_spdy3_one() {
        // zlib's Adler-32, computed by hand so the test does not trust the library under test.
        let (mut a, mut b) = (1u32, 0u32);
        for &byte in DICTIONARY.iter() {
            a = (a + byte as u32) % 65521;
            b = (b + a) % 65521;
        }
        assert_eq!((b << 16) | a, DICTIONARY_ID);
        assert!(DICTIONARY.starts_with(b"\x00\x00\x00\x07options\x00\x00\x00\x04head"));
        assert!(DICTIONARY.ends_with(b"charset=iso-8859-1,utf-,*,enq=0."));
    }

    #[test]
    fn block_layout_uses_32_bit_counts_and_lengths() {
        let block = encode_block(&h(&[("Port", "80"), ("streamtype", "data")]));
        let mut want = vec![0, 0, 0, 2];
        want.extend_from_slice(b"\x00\x00\x00\x04port\x00\x00\x00\x0280");
        want.extend_from_slice(b"\x00\x00\x00\x0astreamtype\x00\x00\x00\x04data");
        assert_eq!(block, want);
        assert_eq!(
            parse_block(&block).unwrap(),
            h(&[("port", "80"), ("streamtype", "data")])
        );
    }

    #[test]
    fn repeated_names_are_nul_joined_and_split_back() {
        let block = encode_block(&h(&[("a", "1"), ("B", "2"), ("A", "3"), ("b", "")]));
        assert_eq!(&block[..4], &[0, 0, 0, 2]);
        assert!(block.windows(3).any(|w| w == b"1\x003"));
        assert_eq!(
            parse_block(&block).unwrap(),
            h(&[("a", "1"), ("a", "3"), ("b", "2"), ("b", "")])
        );
    }

    #[test]
    fn empty_block() {
        let block = encode_block(&Headers::new());
        assert_eq!(block, [0, 0, 0, 0]);
        assert!(parse_block(&block).unwrap().is_empty());
    }

    #[test]
    fn malformed_blocks_are_stream_errors() {
        for bad in [
            &b""[..],
            b"\x00\x00\x00",
            b"\x00\x00\x00\x01",
            b"\xff\xff\xff\xff\x00\x00\x00\x00",
            b"\x00\x00\x00\x01\x00\x00\x00\x09ab\x00\x00\x00\x00",
            b"\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x00",
            b"\x00\x00\x00\x00\x01",
            b"\x00\x00\x00\x01\x00\x00\x00\x01a\xff\xff\xff\xff",
        ] {
            let err = parse_block(bad).unwrap_err();
            assert!(err.is_stream_error(), "{bad:?}: {err}");
        }
    }

    #[test]
    fn compression_round_trip_shares_one_context() {
        let mut c = Compressor::new();
        let mut d = Decompressor::new();
        let first = h(&[("streamtype", "error"), ("port", "8080"), ("requestid", "0")]);
        let second = h(&[("streamtype", "data"), ("port", "8080"), ("requestid", "0")]);
        let a = c.compress(&first).unwrap();
        let b = c.compress(&second).unwrap();
        // The zlib header names the SPDY dictionary; every block ends at a sync flush.
        assert_eq!(a[0] & 0x0f, 8);
        assert_ne!(a[1] & 0x20, 0, "FDICT flag");
        assert_eq!(&a[2..6], &DICTIONARY_ID.to_be_bytes());
        assert!(a.ends_with(&[0, 0, 0xff, 0xff]) && b.ends_with(&[0, 0, 0xff, 0xff]));
        assert!(b.len() < a.len(), "second block reuses the first's history");
        assert_eq!(d.decode(&a).unwrap(), first);
        assert_eq!(d.decode(&b).unwrap(), second);
        assert_eq!(d.decode(&c.compress(&Headers::new()).unwrap()).unwrap(), Headers::new());
    }

    #[test]
    fn decodes_a_block_from_an_independent_zlib_with_the_dictionary() {
        // flate2's raw deflate driven by hand (not our Compressor): zlib header + dictionary id,
        // then a block compressed against the dictionary, as Go's zlib.NewWriterLevelDict does.
        let mut z = Compress::new(Compression::best(), false);
        z.set_dictionary(DICTIONARY).unwrap();
        let plain = encode_block(&h(&[("streamtype", "stdout"), ("requestid", "")]));
        let mut deflated = Vec::with_capacity(512);
        z.compress_vec(&plain, &mut deflated, FlushCompress::Sync).unwrap();
        let mut block = vec![0x78, 0xf9];
        block.extend_from_slice(&DICTIONARY_ID.to_be_bytes());
        block.extend_from_slice(&deflated);
        assert_eq!(
            Decompressor::new().decode(&block).unwrap(),
            h(&[("streamtype", "stdout"), ("requestid", "")])
        );
    }

    #[test]
    fn decodes_c_zlib_blocks_across_frames() {
        // Header blocks of two port-forward SYN_STREAMs, compressed by C zlib (level 9, sync flush)
        // in one stream: the second block is only 14 bytes because it refers back to the first.
        let a = unhex(
            "78f9e3c6a7c202253a703a2b294a4dcc851625aca9a0808614cb45a024cc64610024398b209198094adc8c0600000000ffff",
        );
        let b = unhex("c2aa15540a2512d209000000ffff");
        let mut d = Decompressor::new();
        assert_eq!(
            d.decode(&a).unwrap(),
            h(&[("streamtype", "error"), ("port", "80"), ("requestid", "0")])
        );
        assert_eq!(
            d.decode(&b).unwrap(),
            h(&[("streamtype", "data"), ("port", "80"), ("requestid", "0")])
        );
    }

    #[test]
    fn decodes_chromium_spdy3_block() {
        // Chromium spdy_framer_test CreateSynStreamCompressed (SPDY/3): headers bar: foo, foo: bar.
        let block = unhex("38eae3c6a7c202e50e50c24b4a04e50b6680004acbcf0708201095969f0fa200022829b108208000000000ffff");
        assert_eq!(
            Decompressor::new().decode(&block).unwrap(),
            h(&[("bar", "foo"), ("foo", "bar")])
        );
    }

    #[test]
    fn garbage_and_bombs_are_rejected_without_panicking() {
        assert!(!Decompressor::new()
            .decode(b"not zlib at all")
            .unwrap_err()
            .is_stream_error());
        // A zlib stream demanding some other dictionary.
        assert!(Decompressor::new().decode(&unhex("78bb00000001")).is_err());
        // Truncated zlib header.
        assert!(Decompressor::new().decode(&[0x78]).is_err());
        // 2 MiB of zeros compresses to a few KiB but must not be inflated past the limit.
        let mut z = Compress::new(Compression::best(), true);
        let zeros = vec![0u8; 2 * MAX_HEADER_BLOCK];
        let mut bomb = Vec::with_capacity(64 * 1024);
        z.compress_vec(&zeros, &mut bomb, FlushCompress::Sync).unwrap();
        assert!(bomb.len() < 64 * 1024);
        let mut d = Decompressor::new();
        assert!(matches!(
            d.decode(&bomb),
            Err(HeaderError::TooLarge) | Err(HeaderError::Compression(_))
        ));
        let mut z = Compress::new(Compression::best(), true);
        z.set_dictionary(DICTIONARY).unwrap();
        let mut bomb = Vec::with_capacity(64 * 1024);
        z.compress_vec(&zeros, &mut bomb, FlushCompress::Sync).unwrap();
        assert!(matches!(Decompressor::new().decode(&bomb), Err(HeaderError::TooLarge)));
    }
}
