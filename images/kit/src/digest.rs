//! sha256 digests in the `sha256:<hex>` form content descriptors use.

use std::io::{self, Write};

use sha2::{Digest, Sha256};

pub fn sha256_digest(bytes: &[u8]) -> String {
    format_digest(Sha256::digest(bytes).as_slice())
}

fn format_digest(hash: &[u8]) -> String {
    format!("sha256:{}", hex::encode(hash))
}

/// Passes writes through while hashing them and counting bytes, so a blob's
/// digest and size are known once it is written, without reading it back.
pub struct HashingWriter<W> {
    inner: W,
    hasher: Sha256,
    written: u64,
}

impl<W: Write> HashingWriter<W> {
    pub fn new(inner: W) -> Self {
        Self {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    /// Returns the inner writer, the digest and the byte count.
    pub fn finish(self) -> (W, String, u64) {
        let digest = format_digest(self.hasher.finalize().as_slice());
        (self.inner, digest, self.written)
    }
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writer_and_slice_agree() {
        let mut w = HashingWriter::new(Vec::new());
        w.write_all(b"hello ").unwrap();
        w.write_all(b"world").unwrap();
        let (bytes, digest, n) = w.finish();
        assert_eq!(bytes, b"hello world");
        assert_eq!(n, 11);
        assert_eq!(digest, sha256_digest(b"hello world"));
        assert_eq!(
            sha256_digest(b""),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
    }
}
