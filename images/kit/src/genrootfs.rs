//! Root filesystems of pseudo-random files, for benchmark images: random
//! bytes do not compress, so a layer's blob is about as large as its files
//! and a pull moves the bytes the benchmark asks for.

use std::fs::{self, File};
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// Bytes generated and written per step.
const CHUNK: usize = 64 * 1024;

/// SplitMix64: tiny, fast and well distributed; not cryptographic, which a
/// benchmark's filler does not need. Fixed here so a seed means the same
/// bytes on every machine and version.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let word = self.next().to_le_bytes();
            chunk.copy_from_slice(&word[..chunk.len()]);
        }
    }
}

/// Writes `files` files totalling `size` bytes into `out` (new or empty):
/// `file-000000`, `file-000001`, …, sizes as equal as can be. The content
/// depends only on (`seed`, file number): give each layer its own seed, or
/// identical layers collapse into one blob on the registry.
pub fn generate(out: &Path, files: u64, size: u64, seed: u64) -> Result<Vec<PathBuf>> {
    if files == 0 {
        bail!("--files must be at least 1");
    }
    prepare_out_dir(out)?;
    let (base, extra) = (size / files, size % files);
    let mut written = Vec::with_capacity(usize::try_from(files).unwrap_or(0));
    for n in 0..files {
        let path = out.join(format!("file-{n:06}"));
        let len = base + u64::from(n < extra);
        write_random_file(&path, len, file_seed(seed, n))?;
        written.push(path);
    }
    Ok(written)
}

/// Refuses a non-empty `out`: deleting what is there could destroy data the
/// caller pointed at by mistake.
fn prepare_out_dir(out: &Path) -> Result<()> {
    fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let mut listing = fs::read_dir(out).with_context(|| format!("listing {}", out.display()))?;
    if listing.next().is_some() {
        bail!("--out {} is not empty", out.display());
    }
    Ok(())
}

/// Distinct streams for every (seed, file) pair, including seed 0.
fn file_seed(seed: u64, file: u64) -> u64 {
    SplitMix64(seed ^ file.wrapping_mul(0xd134_2543_de82_ef95)).next()
}

fn write_random_file(path: &Path, len: u64, seed: u64) -> Result<()> {
    let file = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut out = BufWriter::with_capacity(CHUNK, file);
    let mut rng = SplitMix64(seed);
    let mut buf = vec![0u8; CHUNK];
    let mut left = len;
    while left > 0 {
        let n = usize::try_from(left).map_or(CHUNK, |l| l.min(CHUNK));
        rng.fill(&mut buf[..n]);
        out.write_all(&buf[..n])
            .with_context(|| format!("writing {}", path.display()))?;
        left -= n as u64;
    }
    out.flush().with_context(|| format!("writing {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gzip_len(bytes: &[u8]) -> usize {
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(bytes).unwrap();
        gz.finish().unwrap().len()
    }

    #[test]
    fn sizes_add_up_and_content_follows_the_seed() {
        let dir = tempfile::tempdir().unwrap();
        let a = generate(&dir.path().join("a"), 3, 200_002, 7).unwrap();
        let sizes: Vec<u64> = a.iter().map(|p| fs::metadata(p).unwrap().len()).collect();
        assert_eq!(sizes, [66_668, 66_667, 66_667]);
        assert_eq!(sizes.iter().sum::<u64>(), 200_002);

        let b = generate(&dir.path().join("b"), 3, 200_002, 7).unwrap();
        let c = generate(&dir.path().join("c"), 3, 200_002, 8).unwrap();
        let read = |p: &PathBuf| fs::read(p).unwrap();
        assert_eq!(read(&a[0]), read(&b[0]));
        assert_ne!(read(&a[0]), read(&c[0]));
        // Files of one seed differ from each other too.
        assert_ne!(read(&a[0]), read(&a[1]));
    }

    #[test]
    fn content_does_not_compress() {
        let dir = tempfile::tempdir().unwrap();
        let files = generate(&dir.path().join("r"), 1, 1 << 20, 0).unwrap();
        let bytes = fs::read(&files[0]).unwrap();
        assert!(gzip_len(&bytes) > bytes.len() * 99 / 100);
    }

    #[test]
    fn refuses_bad_arguments() {
        let dir = tempfile::tempdir().unwrap();
        assert!(generate(&dir.path().join("z"), 0, 10, 0).is_err());
        fs::write(dir.path().join("keep"), b"").unwrap();
        assert!(generate(dir.path(), 1, 10, 0).is_err());
        let empty = generate(&dir.path().join("e"), 2, 0, 0).unwrap();
        assert!(empty.iter().all(|p| fs::metadata(p).unwrap().len() == 0));
    }
}
