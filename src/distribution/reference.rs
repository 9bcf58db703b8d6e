//! Image references with docker-style normalisation (`busybox` → `docker.io/library/busybox:latest`),
//! parsed by oci-spec's distribution `Reference` (the grammar of distribution/reference), plus the
//! names scute records: RepoTags `registry/repo:tag` and RepoDigests `registry/repo@sha256:…`.

use std::fmt;

use oci_client::Reference;

use super::digest::Digest;

#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid image reference {reference:?}: {reason}")]
pub struct RefError {
    pub reference: String,
    pub reason: String,
}

/// A normalised, validated image reference.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageRef {
    registry: String,
    repository: String,
    tag: Option<String>,
    digest: Option<Digest>,
}

impl ImageRef {
    pub fn parse(input: &str) -> Result<ImageRef, RefError> {
        let err = |reason: String| RefError {
            reference: input.to_string(),
            reason,
        };
        if input.is_empty() {
            return Err(err("empty".into()));
        }
        if input.len() > 4096 {
            return Err(err("longer than 4096 bytes".into()));
        }
        // A bare 64-hex string is an image ID, not a repository name (containerd refuses it too).
        if input.len() == 64 && input.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(err("a bare 64-hex string is an image ID, not a reference".into()));
        }
        let parsed: Reference = input.parse().map_err(|e: oci_client::ParseError| err(e.to_string()))?;
        // distribution/reference requires lowercase repository paths; oci-spec lets uppercase by.
        if parsed.repository().bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(err("repository name must be lowercase".into()));
        }
        let digest = parsed
            .digest()
            .map(|d| Digest::parse(d).map_err(|e| err(e.to_string())))
            .transpose()?;
        let tag = match (parsed.tag(), &digest) {
            (Some(t), _) => Some(t.to_string()),
            // No tag and no digest means :latest.
            (None, None) => Some("latest".to_string()),
            (None, Some(_)) => None,
        };
        Ok(ImageRef {
            registry: parsed.registry().to_string(),
            repository: parsed.repository().to_string(),
            tag,
            digest,
        })
    }

    /// The registry host as written in the reference (`docker.io`, `registry.k8s.io`, `localhost:5000`).
    pub fn registry(&self) -> &str {
        &self.registry
    }

    pub fn repository(&self) -> &str {
        &self.repository
    }

    pub fn tag(&self) -> Option<&str> {
        self.tag.as_deref()
    }

    pub fn digest(&self) -> Option<&Digest> {
        self.digest.as_ref()
    }

    /// `registry/repository`, e.g. `docker.io/library/busybox`.
    pub fn name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }

    /// The RepoTag this reference names (`docker.io/library/busybox:latest`), if it has a tag.
    pub fn repo_tag(&self) -> Option<String> {
        self.tag.as_ref().map(|t| format!("{}:{t}", self.name()))
    }

    /// The RepoDigest of this repository for a manifest digest.
    pub fn repo_digest(&self, manifest: &Digest) -> String {
        format!("{}@{manifest}", self.name())
    }

    /// The oci-client reference to fetch: by digest when known, else by tag.
    pub fn to_oci(&self) -> Reference {
        match (&self.digest, &self.tag) {
            (Some(d), _) => Reference::with_digest(self.registry.clone(), self.repository.clone(), d.to_string()),
            (None, Some(t)) => Reference::with_tag(self.registry.clone(), self.repository.clone(), t.clone()),
            (None, None) => unreachable!("parse gives every reference a tag or a digest"),
        }
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.name())?;
        if let Some(t) = &self.tag {
            write!(f, ":{t}")?;
        }
        if let Some(d) = &self.digest {
            write!(f, "@{d}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:9700f9a2f5bf2c45f2f605a0bd3bce7cf37420ec9d3ed50ac2758413308766bf";

    #[test]
    fn docker_normalisation() {
        let r = ImageRef::parse("busybox").unwrap();
        assert_eq!(r.to_string(), "docker.io/library/busybox:latest");
        assert_eq!(r.repo_tag().unwrap(), "docker.io/library/busybox:latest");
        assert_eq!(
            ImageRef::parse("user/app:1").unwrap().to_string(),
            "docker.io/user/app:1"
        );
        assert_eq!(
            ImageRef::parse("registry.k8s.io/e2e-test-images/busybox:1.29-2")
                .unwrap()
                .to_string(),
            "registry.k8s.io/e2e-test-images/busybox:1.29-2"
        );
        let local = ImageRef::parse("localhost:5000/pause").unwrap();
        assert_eq!(local.registry(), "localhost:5000");
        assert_eq!(local.repository(), "pause");
        assert_eq!(local.tag(), Some("latest"));
    }

    #[test]
    fn digests_and_tag_at_digest() {
        let r = ImageRef::parse(&format!("gcr.io/a/b@{D}")).unwrap();
        assert_eq!(r.tag(), None);
        assert_eq!(r.digest().unwrap().to_string(), D);
        assert_eq!(r.repo_tag(), None);
        assert_eq!(r.to_oci().digest(), Some(D));
        let r = ImageRef::parse(&format!("busybox:1.36@{D}")).unwrap();
        assert_eq!(r.tag(), Some("1.36"));
        assert_eq!(r.to_oci().digest(), Some(D), "pull by digest when one is given");
        assert_eq!(
            r.repo_digest(r.digest().unwrap()),
            format!("docker.io/library/busybox@{D}")
        );
    }

    #[test]
    fn invalid_references() {
        for bad in [
            "",
            "UPPER/case",
            "busybox:",
            "a b",
            "busybox@sha256:short",
            "busybox@md5:0123",
            "9700f9a2f5bf2c45f2f605a0bd3bce7cf37420ec9d3ed50ac2758413308766bf",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?} accepted");
        }
    }
}
