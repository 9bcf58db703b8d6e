//! Content digests. Only sha256 is accepted: digests become file names in the content store, so
//! anything that is not exactly `sha256:<64 lowercase hex>` is refused before it reaches a path.

use std::fmt;

use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Digest(String);

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid digest {0:?}: want sha256:<64 lowercase hex digits>")]
pub struct DigestError(pub String);

impl Digest {
    pub fn parse(s: &str) -> Result<Digest, DigestError> {
        match s.strip_prefix("sha256:") {
            Some(hex) if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)) => {
                Ok(Digest(s.to_string()))
            }
            _ => Err(DigestError(s.to_string())),
        }
    }

    pub fn of(bytes: &[u8]) -> Digest {
        Digest::from_hasher(Sha256::new_with_prefix(bytes))
    }

    pub fn from_hasher(hasher: Sha256) -> Digest {
        Digest(format!("sha256:{}", hex::encode(hasher.finalize())))
    }

    pub fn from_sha256(sum: [u8; 32]) -> Digest {
        Digest(format!("sha256:{}", hex::encode(sum)))
    }

    /// The 64 hex digits.
    pub fn hex(&self) -> &str {
        &self.0["sha256:".len()..]
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<String> for Digest {
    type Error = DigestError;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Digest::parse(&s)
    }
}

impl From<Digest> for String {
    fn from(d: Digest) -> String {
        d.0
    }
}

/// Chain IDs name a stack of layers (OCI image spec): the first layer's is its diff ID, then
/// `sha256(parent_chain + " " + diff_id)`. A snapshot is keyed by its chain ID, so images that share
/// a base share its snapshots.
pub fn chain_ids(diff_ids: &[Digest]) -> Vec<Digest> {
    let mut out: Vec<Digest> = Vec::with_capacity(diff_ids.len());
    for diff in diff_ids {
        let next = match out.last() {
            None => diff.clone(),
            Some(parent) => Digest::of(format!("{parent} {diff}").as_bytes()),
        };
        out.push(next);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_accepts_only_sha256_hex() {
        let ok = format!("sha256:{}", "a".repeat(64));
        assert_eq!(Digest::parse(&ok).unwrap().hex(), "a".repeat(64));
        for bad in [
            "sha256:".to_string(),
            format!("sha256:{}", "A".repeat(64)),
            format!("sha512:{}", "a".repeat(128)),
            format!("sha256:{}/../x", "a".repeat(60)),
            format!("sha256:{}", "a".repeat(65)),
        ] {
            assert!(Digest::parse(&bad).is_err(), "{bad}");
        }
        assert!(serde_json::from_str::<Digest>("\"sha256:../../etc\"").is_err());
    }

    #[test]
    fn chain_ids_follow_the_image_spec() {
        let a = Digest::of(b"a");
        let b = Digest::of(b"b");
        let chain = chain_ids(&[a.clone(), b.clone()]);
        assert_eq!(chain[0], a);
        assert_eq!(chain[1], Digest::of(format!("{a} {b}").as_bytes()));
        assert!(chain_ids(&[]).is_empty());
    }
}
