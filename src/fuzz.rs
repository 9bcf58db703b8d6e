//! Entry points for the fuzz targets (`fuzz/`, `hack/fuzz.sh`): one per parser of bytes from
//! outside: registries and their layers, clients of the streaming server, a shim, the node's
//! files. Each takes the fuzzer's bytes, and panics only when a property that matters breaks
//! (a path outside the root, a value that does not survive its own round trip, a bound passed),
//! so every panic is a finding. The unit tests below run each target over its kept corpus
//! (`fuzz/corpus/<target>/`), which makes every input the fuzzers kept, and every crash they
//! found, a regression test of `cargo test`.
//!
//! Compiled in every build (not only under `cfg(fuzzing)`) so that a change that breaks a
//! target breaks the build, not a fuzzing run weeks later.

use std::io::Read;
use std::path::Path;

use bytes::BytesMut;

/// A fuzz target: the fuzzer's bytes in, a panic when a property breaks.
pub type Target = fn(&[u8]);

/// Every target, by the name of its `fuzz/fuzz_targets/<name>.rs` and corpus directory.
pub const TARGETS: &[(&str, Target)] = &[
    ("layer_tar", layer_tar),
    ("layer_stream", layer_stream),
    ("reference", reference),
    ("image_documents", image_documents),
    ("hosts_toml", hosts_toml),
    ("spdy_frames", spdy_frames),
    ("spdy_headers", spdy_headers),
    ("websocket_channels", websocket_channels),
    ("shim_frames", shim_frames),
    ("records", records),
    ("cni_result", cni_result),
    ("cdi_spec", cdi_spec),
    ("user_databases", user_databases),
    ("mountinfo", mountinfo),
];

/// Uncompressed bytes one layer may produce in a run (the daemon's bound is the disk reserve).
const MAX_LAYER_BYTES: u64 = 64 << 20;

/// A tar stream unpacked into an empty root inside a jail holding a sentinel: whatever the
/// archive says, nothing but the root may change in the jail.
pub fn layer_tar(data: &[u8]) {
    unpack_jailed(data);
}

/// First byte: gzip, zstd or plain; the rest is a layer blob as a registry sends it.
pub fn layer_stream(data: &[u8]) {
    let Some((&kind, blob)) = data.split_first() else {
        return;
    };
    let media_type = match kind % 3 {
        0 => "application/vnd.oci.image.layer.v1.tar+gzip",
        1 => "application/vnd.oci.image.layer.v1.tar+zstd",
        _ => "application/vnd.oci.image.layer.v1.tar",
    };
    let decoder = crate::image::pull::Decoder::for_media_type(media_type).expect("a known media type");
    let Ok(reader) = decoder.reader(blob) else { return };
    unpack_jailed(reader.take(MAX_LAYER_BYTES));
}

fn unpack_jailed(layer: impl Read) {
    let jail = tempfile::tempdir().expect("a temp dir");
    let root = jail.path().join("root");
    std::fs::create_dir(&root).unwrap();
    std::fs::write(jail.path().join("sentinel"), b"untouched").unwrap();
    let _ = crate::image::unpack::unpack_layer(layer, &root);
    let mut names: Vec<String> = std::fs::read_dir(jail.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(names, ["root", "sentinel"], "the layer wrote beside its root");
    let sentinel = std::fs::symlink_metadata(jail.path().join("sentinel")).unwrap();
    assert!(sentinel.is_file(), "the sentinel was replaced");
    assert_eq!(std::fs::read(jail.path().join("sentinel")).unwrap(), b"untouched");
    assert!(
        std::fs::symlink_metadata(&root).unwrap().is_dir(),
        "the root was replaced"
    );
}

/// Image references and digests: what parses survives its own printing.
pub fn reference(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Ok(digest) = crate::distribution::digest::Digest::parse(text) {
        assert_eq!(digest.as_str(), text, "a digest parses to itself");
        assert_eq!(digest.hex().len(), 64);
    }
    if let Ok(image) = crate::distribution::reference::ImageRef::parse(text) {
        let printed = image.to_string();
        let again = crate::distribution::reference::ImageRef::parse(&printed)
            .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}, which does not parse: {e}"));
        assert_eq!(again.to_string(), printed, "{text:?}");
        let _ = (
            image.registry(),
            image.repository(),
            image.tag(),
            image.name(),
            image.repo_tag(),
        );
        let _ = image.to_oci();
    }
}

/// Manifests, indexes and image configs (OCI and Docker schema 2), through the checks a pull
/// makes of them: the platform an index offers, a manifest's digests and artifact files, a
/// config's diff IDs and the chain IDs they give.
pub fn image_documents(data: &[u8]) {
    use crate::distribution::digest::{chain_ids, Digest};
    if let Ok(index) = serde_json::from_slice::<oci_client::manifest::OciImageIndex>(data) {
        if let Ok(child) = crate::image::registry::select_platform(&index) {
            let _ = Digest::parse(&child.digest);
        }
    }
    if let Ok(manifest) = serde_json::from_slice::<oci_client::manifest::OciImageManifest>(data) {
        let _ = crate::image::artifact::is_artifact(&manifest);
        let _ = Digest::parse(&manifest.config.digest);
        for layer in &manifest.layers {
            let _ = Digest::parse(&layer.digest);
            let _ = crate::image::pull::Decoder::for_media_type(&layer.media_type);
        }
    }
    if let Ok(config) = serde_json::from_slice::<oci_spec::image::ImageConfiguration>(data) {
        let diff_ids: Result<Vec<Digest>, _> = config.rootfs().diff_ids().iter().map(|d| Digest::parse(d)).collect();
        if let Ok(diff_ids) = diff_ids {
            let chains = chain_ids(&diff_ids);
            assert_eq!(chains.len(), diff_ids.len());
        }
        // What the pull keeps of it: stored as JSON in the image's record and read back whole.
        let summary = crate::image::pull::summarize_config(&config);
        let stored = serde_json::to_vec(&summary).expect("an image config summary always encodes");
        let read_back: crate::image::record::ImageConfig = serde_json::from_slice(&stored).expect("and decodes");
        assert_eq!(read_back, summary);
    }
}

/// A registry's `hosts.toml`: endpoints with URLs this parser made, the upstream last.
pub fn hosts_toml(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let file = Path::new("/nonexistent/certs.d/registry.example/hosts.toml");
    if let Ok(endpoints) = crate::image::hosts::parse_hosts_file(file, text, "registry.example") {
        assert!(!endpoints.is_empty(), "the upstream is always last");
        for endpoint in &endpoints {
            let _ = endpoint.base_url();
        }
    }
}

/// SPDY/3.1 frames as a client sends them: decoded one by one off a buffer, and each decoded
/// frame encodes to bytes that decode to it again.
pub fn spdy_frames(data: &[u8]) {
    use crate::streaming::spdy::frame;
    let mut buf = BytesMut::from(data);
    for _ in 0..1024 {
        let before = buf.len();
        match frame::decode(&mut buf) {
            Ok(Some(decoded)) => {
                assert!(buf.len() < before, "a frame was decoded from no bytes");
                let mut wire = BytesMut::new();
                decoded.encode(&mut wire);
                let again = frame::decode(&mut wire)
                    .unwrap_or_else(|e| panic!("{decoded:?} encodes to bytes that do not decode: {e:?}"))
                    .expect("a whole frame");
                assert_eq!(format!("{again:?}"), format!("{decoded:?}"));
            }
            Ok(None) | Err(_) => return,
        }
    }
}

/// A SPDY header block, compressed (one connection's zlib stream, several blocks) and plain;
/// what parses encodes back to a block that parses the same.
pub fn spdy_headers(data: &[u8]) {
    use crate::streaming::spdy::headers;
    if let Ok(parsed) = headers::parse_block(data) {
        // Values holding NUL come back split: compare after one round.
        let once = headers::parse_block(&headers::encode_block(&parsed)).expect("an encoded block parses");
        let twice = headers::parse_block(&headers::encode_block(&once)).expect("an encoded block parses");
        assert_eq!(once, twice);
    }
    let mut z = headers::Decompressor::new();
    for block in data.split(|&b| b == 0xff).take(8) {
        if z.decode(block).is_err() {
            return;
        }
    }
}

/// Client messages of the WebSocket channel protocols (binary, and base64 text), and the
/// terminal-resize JSON stream of the resize channel.
pub fn websocket_channels(data: &[u8]) {
    use crate::streaming::ws::WsChannels;
    use tokio_tungstenite::tungstenite::Message;
    let binary = WsChannels::for_protocol("v5.channel.k8s.io");
    let _ = binary.decode(&Message::Binary(data.to_vec().into()));
    if let Ok(text) = std::str::from_utf8(data) {
        let base64 = WsChannels::for_protocol("v4.base64.channel.k8s.io");
        if let Some((channel, bytes)) = base64.decode(&Message::Text(text.into())) {
            // What decodes encodes back to the same channel and bytes.
            let again = base64
                .decode(&base64.encode(channel, &bytes))
                .expect("an encoded message decodes");
            assert_eq!(again, (channel, bytes));
        }
    }
    let mut pending = Vec::new();
    for piece in data.chunks(7) {
        if crate::streaming::session::parse_resizes(&mut pending, piece).is_err() {
            break;
        }
        assert!(pending.len() <= data.len(), "the resize buffer grew past its input");
    }
}

/// What a broken or compromised shim may send the daemon: length-prefixed protobuf frames of
/// responses, session output and exits.
pub fn shim_frames(data: &[u8]) {
    use crate::shim_client::pb;
    use prost::Message;
    let _ = pb::Response::decode(data);
    let _ = pb::ContainerExit::decode(data);
    let mut buf = BytesMut::from(data);
    for _ in 0..1024 {
        match crate::shim_client::parse_session_frame(&mut buf) {
            Ok(Some(_)) => {}
            Ok(None) | Err(_) => return,
        }
    }
}

/// The daemon's records as read back after a crash: store records, a shim's exit file, a
/// cached CNI attachment. A torn or foreign record is an error, never a panic.
pub fn records(data: &[u8]) {
    use crate::store::decode;
    let _ = decode::<crate::sandbox::record::SandboxRecord>("fuzz", data);
    let _ = decode::<crate::container::record::ContainerRecord>("fuzz", data);
    let _ = decode::<crate::image::record::ImageRecord>("fuzz", data);
    let _ = decode::<crate::snapshot::SnapshotRecord>("fuzz", data);
    let _ = serde_json::from_slice::<crate::shim_client::ExitRecord>(data);
    let _ = serde_json::from_slice::<crate::sandbox::cni::CachedAttachment>(data);
}

/// A CNI plugin's result: the pod's addresses are read from it.
pub fn cni_result(data: &[u8]) {
    if let Ok(result) = serde_json::from_slice::<serde_json::Value>(data) {
        let _ = crate::sandbox::cni::result_ips(&result);
    }
}

/// A CDI spec file as it lies in a spec directory.
pub fn cdi_spec(data: &[u8]) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let path = dir.path().join("vendor.yaml");
    std::fs::write(&path, data).unwrap();
    let _ = crate::cdi::devices_in(&path);
}

/// An image's /etc/passwd and /etc/group (split at the first NUL), resolved for a USER taken
/// from the last line: whatever resolves is an id the kernel takes as itself.
pub fn user_databases(data: &[u8]) {
    let mut parts = data.splitn(2, |&b| b == 0);
    let passwd = parts.next().unwrap_or_default();
    let group = parts.next().unwrap_or_default();
    let root = tempfile::tempdir().expect("a temp dir");
    std::fs::create_dir(root.path().join("etc")).unwrap();
    std::fs::write(root.path().join("etc/passwd"), passwd).unwrap();
    std::fs::write(root.path().join("etc/group"), group).unwrap();
    let user = String::from_utf8_lossy(passwd.rsplit(|&b| b == b'\n').next().unwrap_or_default());
    let user = user.split(':').next().unwrap_or_default();
    for image_user in [user, "0", "root", "nobody:nogroup"] {
        if let Ok(resolved) = crate::oci::user::resolve(root.path(), None, image_user, None) {
            let ids = [resolved.uid, resolved.gid];
            for id in ids.iter().chain(&resolved.additional_gids) {
                assert_ne!(*id, u32::MAX, "{image_user:?} resolved to (uid_t)-1");
            }
        }
    }
}

/// /proc/self/mountinfo lines: at most one mount per line, and every mount point the parser
/// returns is the fifth field of a line (unescaped): nothing invented, nothing shifted.
pub fn mountinfo(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mounts = scute_sys::mountinfo::parse(text);
    assert!(mounts.len() <= text.lines().count());
    let fifth_fields: std::collections::HashSet<String> = text
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(scute_sys::mountinfo::unescape)
        .collect();
    for mount in &mounts {
        let point = mount.mount_point.to_string_lossy();
        assert!(
            fifth_fields.contains(point.as_ref()),
            "mount point {point:?} is no line's fifth field"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::TARGETS;

    /// xorshift64*: a fixed sequence, so the mutation pass is the same in every run.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
        }

        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    /// One libFuzzer-style mutation of `input`: bit flips, interesting bytes, inserted or
    /// removed runs, truncation, a splice with another input.
    fn mutate(rng: &mut Rng, input: &[u8], other: &[u8]) -> Vec<u8> {
        let mut out = input.to_vec();
        for _ in 0..=rng.below(4) {
            let at = rng.below(out.len() + 1);
            match rng.below(7) {
                0 if !out.is_empty() => {
                    let i = at.min(out.len() - 1);
                    out[i] ^= 1 << rng.below(8);
                }
                1 if !out.is_empty() => {
                    let i = at.min(out.len() - 1);
                    out[i] = [0, 0xff, 0x7f, 0x80, b'/', b'.', b'\n', b'"'][rng.below(8)];
                }
                2 => {
                    let n = 1 + rng.below(16);
                    let byte = rng.next() as u8;
                    out.splice(at..at, std::iter::repeat_n(byte, n));
                }
                3 => {
                    let end = (at + 1 + rng.below(64)).min(out.len());
                    out.drain(at.min(end)..end);
                }
                4 => out.truncate(at),
                5 if !other.is_empty() => {
                    let from = rng.below(other.len());
                    let to = (from + 1 + rng.below(256)).min(other.len());
                    out.splice(at..at, other[from..to].iter().copied());
                }
                _ => {
                    let n = (rng.next() as u32).to_be_bytes();
                    let end = (at + 4).min(out.len());
                    out.splice(at..end, n);
                }
            }
        }
        out
    }

    fn kept(name: &str) -> Vec<(std::path::PathBuf, Vec<u8>)> {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("fuzz/corpus")
            .join(name);
        let entries =
            std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("no corpus for {name} in {}: {e}", dir.display()));
        let mut files: Vec<_> = entries
            .map(|e| e.unwrap().path())
            .map(|p| {
                let data = std::fs::read(&p).unwrap();
                (p, data)
            })
            .collect();
        files.sort();
        files
    }

    /// What CI runs of the fuzz targets on every change without building them for libFuzzer
    /// (that build costs minutes: `hack/fuzz.sh` runs them coverage-guided): each target over
    /// a fixed sequence of mutations of its kept inputs. A failure prints the input to keep.
    #[test]
    fn every_target_survives_mutations_of_its_corpus() {
        // Per target, spread over its kept inputs: the layer targets make a temp dir per run
        // (a few ms), and the corpus grows with every libFuzzer run.
        const PER_TARGET: usize = 4096;
        let mut rng = Rng(0x0005_c07e_f022);
        let mut ran = 0;
        for (name, target) in TARGETS {
            let corpus = kept(name);
            let per_input = PER_TARGET.div_ceil(corpus.len());
            for (i, (path, data)) in corpus.iter().enumerate() {
                let other = &corpus[(i + 1) % corpus.len()].1;
                for _ in 0..per_input {
                    let input = mutate(&mut rng, data, other);
                    let result = std::panic::catch_unwind(|| target(&input));
                    assert!(
                        result.is_ok(),
                        "{name}: a mutation of {} fails its target; keep it as a corpus file: {:02x?}",
                        path.display(),
                        input
                    );
                    ran += 1;
                }
            }
        }
        assert!(ran >= TARGETS.len() * PER_TARGET);
    }

    /// Every input kept in `fuzz/corpus/<target>/` (seeds, what the fuzzers kept, and the
    /// crashes they found) runs through its target: a crash found once is a test for ever.
    #[test]
    fn every_kept_input_passes_its_target() {
        let mut ran = 0;
        for (name, target) in TARGETS {
            for (path, data) in kept(name) {
                let result = std::panic::catch_unwind(|| target(&data));
                assert!(result.is_ok(), "{name}: {} fails its target", path.display());
                ran += 1;
            }
        }
        assert!(ran >= TARGETS.len(), "only {ran} kept inputs");
    }
}
