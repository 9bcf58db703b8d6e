//! Image references with docker-style normalisation (`busybox` → `docker.io/library/busybox:latest`),
//! parsed by the grammar of distribution/reference, plus the names scute records: RepoTags
//! `registry/repo:tag` and RepoDigests `registry/repo@sha256:…`.
//!
//! The grammar is checked by hand. oci-spec's `Reference` parses with one regex whose tag part,
//! `[\w][\w.-]{0,127}`, is Unicode in Rust (ASCII in Go's regexp, which the grammar is written
//! for): it compiles to a 4 MiB automaton, built at the first parse (the config's mirrors, at
//! start) and held for the daemon's life, a sixth of its idle memory.

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
        let (name, tag, digest) = grammar::split(input).map_err(|reason| err(reason.into()))?;
        let (registry, repository) = grammar::split_domain(name);
        // A first component the grammar took for a host but docker's normalisation does not (a
        // bracketed IPv6 address without a ':' in it, `[6]/ca`) lands in the path, where it is
        // no path component: distribution's ParseNormalizedNamed refuses such a name too.
        if let Some(bad) = repository.split('/').find(|c| !grammar::is_path_component(c)) {
            return Err(err(format!(
                "{bad:?} is not a repository path component (lowercase letters and digits, \
                 joined by '.', '_', '__' or dashes)"
            )));
        }
        if repository.len() > grammar::NAME_TOTAL_LENGTH_MAX {
            return Err(err(format!(
                "repository name longer than {} bytes",
                grammar::NAME_TOTAL_LENGTH_MAX
            )));
        }
        // A domain may have capitals; a repository path may not (distribution/reference).
        if repository.bytes().any(|b| b.is_ascii_uppercase()) {
            return Err(err("repository name must be lowercase".into()));
        }
        let digest = digest
            .map(|d| Digest::parse(d).map_err(|e| err(e.to_string())))
            .transpose()?;
        let tag = match (tag, &digest) {
            (Some(t), _) => Some(t.to_string()),
            // No tag and no digest means :latest.
            (None, None) => Some("latest".to_string()),
            (None, Some(_)) => None,
        };
        Ok(ImageRef {
            registry,
            repository,
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

/// distribution/reference's grammar (reference/regexp.go), ASCII as Go's regexp is:
///
/// ```text
/// reference := name [ ":" tag ] [ "@" digest ]
/// name      := [ domain "/" ] path-component [ "/" path-component ]*
/// domain    := host [ ":" port ], host := label [ "." label ]* | "[" ipv6 "]",
///              label := [a-zA-Z0-9]([a-zA-Z0-9-]*[a-zA-Z0-9])?, ipv6 := [a-fA-F0-9:]+
/// path-component := [a-z0-9]+ ( ( "." | "_" | "__" | "-"+ ) [a-z0-9]+ )*
/// tag       := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
/// digest    := algorithm ":" [0-9a-fA-F]{32,}, algorithm := [A-Za-z][A-Za-z0-9]* ( [-_+.] [A-Za-z][A-Za-z0-9]* )*
/// ```
mod grammar {
    pub(super) const NAME_TOTAL_LENGTH_MAX: usize = 255;
    const DOCKER_HUB: &str = "docker.io";

    /// The name, tag and digest of a reference, each checked against the grammar.
    pub(super) fn split(input: &str) -> Result<(&str, Option<&str>, Option<&str>), &'static str> {
        let (rest, digest) = match input.split_once('@') {
            Some((rest, digest)) => (rest, Some(digest)),
            None => (input, None),
        };
        // A tag's colon comes after the last slash; one before it is a domain's port.
        let last = rest.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match rest[last..].rfind(':') {
            Some(i) => (&rest[..last + i], Some(&rest[last + i + 1..])),
            None => (rest, None),
        };
        if !is_name(name) {
            return Err("invalid reference format: the name is not domain/path of lowercase components");
        }
        if tag.is_some_and(|t| !is_tag(t)) {
            return Err(
                "invalid reference format: a tag is 1 to 128 of A-Z, a-z, 0-9, _, . and -, not starting with . or -",
            );
        }
        if digest.is_some_and(|d| !is_digest(d)) {
            return Err("invalid reference format: a digest is algorithm:hex");
        }
        Ok((name, tag, digest))
    }

    /// The registry and repository of a valid name, as docker normalises them (distribution's
    /// normalize.go splitDockerDomain): no domain, or a first component that is neither a host
    /// with a dot or port, nor localhost, nor spelt with capitals (a path cannot be), means
    /// Docker Hub, whose one-component names are `library/`'s.
    pub(super) fn split_domain(name: &str) -> (String, String) {
        let is_domain = |first: &str| {
            first.contains(['.', ':']) || first == "localhost" || first.bytes().any(|b| b.is_ascii_uppercase())
        };
        let (mut domain, mut remainder) = match name.split_once('/') {
            Some((first, rest)) if is_domain(first) => (first.to_string(), rest.to_string()),
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        if domain == "index.docker.io" {
            domain = DOCKER_HUB.to_string();
        }
        if domain == DOCKER_HUB && !remainder.contains('/') {
            remainder = format!("library/{remainder}");
        }
        (domain, remainder)
    }

    fn is_name(name: &str) -> bool {
        let mut components = name.split('/');
        let first = components.next().unwrap_or_default();
        let rest: Vec<&str> = components.collect();
        let first_ok = is_path_component(first) || (!rest.is_empty() && is_domain(first));
        first_ok && rest.iter().all(|c| is_path_component(c))
    }

    fn is_domain(domain: &str) -> bool {
        let port_ok = |p: Option<&str>| p.is_none_or(|p| !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()));
        if let Some(bracketed) = domain.strip_prefix('[') {
            let Some((ip, rest)) = bracketed.split_once(']') else {
                return false;
            };
            let port = match rest {
                "" => None,
                _ => match rest.strip_prefix(':') {
                    Some(port) => Some(port),
                    None => return false,
                },
            };
            return !ip.is_empty() && ip.bytes().all(|c| c.is_ascii_hexdigit() || c == b':') && port_ok(port);
        }
        let (host, port) = match domain.split_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (domain, None),
        };
        let label = |l: &str| {
            let b = l.as_bytes();
            !b.is_empty()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
                && b[0] != b'-'
                && b[b.len() - 1] != b'-'
        };
        host.split('.').all(label) && port_ok(port)
    }

    pub(super) fn is_path_component(c: &str) -> bool {
        let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let b = c.as_bytes();
        if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
            return false;
        }
        // Between alphanumeric runs: one '.', one '_', "__", or any number of '-'.
        let mut i = 0;
        while i < b.len() {
            if alnum(b[i]) {
                i += 1;
                continue;
            }
            let start = i;
            while i < b.len() && !alnum(b[i]) {
                i += 1;
            }
            match &c[start..i] {
                "." | "_" | "__" => {}
                sep if sep.bytes().all(|s| s == b'-') => {}
                _ => return false,
            }
        }
        true
    }

    fn is_tag(tag: &str) -> bool {
        let word = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
        let b = tag.as_bytes();
        !b.is_empty() && b.len() <= 128 && word(b[0]) && b.iter().all(|&c| word(c) || c == b'.' || c == b'-')
    }

    fn is_digest(digest: &str) -> bool {
        let Some((algorithm, hex)) = digest.split_once(':') else {
            return false;
        };
        let part = |p: &str| {
            let b = p.as_bytes();
            !b.is_empty() && b[0].is_ascii_alphabetic() && b.iter().all(|c| c.is_ascii_alphanumeric())
        };
        algorithm.split(['-', '_', '+', '.']).all(part) && hex.len() >= 32 && hex.bytes().all(|c| c.is_ascii_hexdigit())
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
            "busybox/UPPER",
            "busybox:",
            "a b",
            "busybox@sha256:short",
            "busybox@md5:0123",
            "9700f9a2f5bf2c45f2f605a0bd3bce7cf37420ec9d3ed50ac2758413308766bf",
            "busybox:é",
            "busybox:.x",
            &format!("busybox:{}", "a".repeat(129)),
            "a..b",
            "a/-b",
            "a___b",
            "-host.com/a",
            "host.com:/a",
            "host.com:5x/a",
            "busybox@sha256",
            "busybox@:0123456789abcdef0123456789abcdef",
            &format!("a/{}", "b".repeat(254)),
            "/a",
            "a/",
            "[::1/a",
            "[]/a",
            "[::1]x/a",
            "[::g]/a",
            // Found by the `reference` fuzz target: a host to the grammar, a path to docker's
            // normalisation, so it printed as docker.io/[6]/ca, which did not parse.
            "[6]/ca",
        ] {
            assert!(ImageRef::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    /// The grammar's corners, and docker's normalisation, as distribution/reference has them.
    #[test]
    fn the_grammar_by_hand() {
        for (input, want) in [
            ("test.com:tag", "docker.io/library/test.com:tag"),
            ("test.com:5000", "docker.io/library/test.com:5000"),
            ("test.com/repo:tag", "test.com/repo:tag"),
            ("test:5000/repo", "test:5000/repo:latest"),
            ("index.docker.io/busybox", "docker.io/library/busybox:latest"),
            ("Host.Example.com/a/b", "Host.Example.com/a/b:latest"),
            ("a__b/c--d/e.f/g_h:V1_x.y-z", "docker.io/a__b/c--d/e.f/g_h:V1_x.y-z"),
            ("localhost/x", "localhost/x:latest"),
            ("localhost:5000/x/y", "localhost:5000/x/y:latest"),
            ("host-1.example.com:443/r", "host-1.example.com:443/r:latest"),
            ("UPPER/case", "UPPER/case:latest"),
            ("[::1]:5000/repo:v1", "[::1]:5000/repo:v1"),
            ("[fe80::1]/repo", "[fe80::1]/repo:latest"),
        ] {
            assert_eq!(ImageRef::parse(input).unwrap().to_string(), want, "{input}");
        }
        let long_tag = format!("busybox:{}", "a".repeat(128));
        assert!(ImageRef::parse(&long_tag).is_ok());
        let r = ImageRef::parse(&format!("test:5000/repo:tag@{D}")).unwrap();
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("test:5000", "repo", Some("tag"))
        );
    }
}
