//! Registry access for one pull: the endpoints from hosts.toml (mirrors first, then the
//! upstream), an oci-client per endpoint configured for its TLS/plain-HTTP settings, manifest
//! resolution with platform selection, and blob streams (with Range resume).
//!
//! oci-client is used for the HTTP work (auth challenges, bearer tokens, redirects); its
//! whole-image `pull()` is not used because it buffers layers in memory.

use std::time::Duration;

use oci_client::client::{BlobResponse, ClientConfig, ClientProtocol, SizedStream};
use oci_client::manifest::{OciDescriptor, OciImageIndex};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use super::digest::Digest;
use super::hosts::{self, HostEndpoint, Scheme};
use super::reference::ImageRef;
use super::PullError;

pub const MEDIA_OCI_MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
pub const MEDIA_OCI_INDEX: &str = "application/vnd.oci.image.index.v1+json";
pub const MEDIA_DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
pub const MEDIA_DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";
const ACCEPTED_MANIFESTS: &[&str] = &[
    MEDIA_OCI_MANIFEST,
    MEDIA_OCI_INDEX,
    MEDIA_DOCKER_MANIFEST,
    MEDIA_DOCKER_LIST,
];

/// Manifests and configs are small; anything bigger is refused rather than buffered.
const MAX_SMALL_BLOB: usize = 8 << 20;

/// Credentials from the CRI AuthConfig.
#[derive(Clone, Default)]
pub struct Credentials {
    pub auth: Option<RegistryAuth>,
    /// The registry the credentials are for (AuthConfig.server_address), when given.
    pub server: Option<String>,
}

struct Endpoint {
    config: HostEndpoint,
    client: Client,
    reference: Reference,
    auth: RegistryAuth,
}

impl Endpoint {
    fn describe(&self) -> String {
        format!("{}://{}", self.config.scheme.as_str(), self.config.host)
    }
}

/// A resolved manifest: the bytes, their digest and the index it came from, if any.
pub struct Resolved {
    pub manifest: Vec<u8>,
    pub manifest_digest: Digest,
    pub media_type: String,
    pub index: Option<(Vec<u8>, Digest)>,
}

pub struct Remote {
    image: ImageRef,
    endpoints: Vec<Endpoint>,
}

impl Remote {
    pub fn new(image: &ImageRef, hosts_dir: &std::path::Path, credentials: &Credentials) -> Result<Remote, PullError> {
        let host_configs =
            hosts::endpoints_for(hosts_dir, image.registry()).map_err(|e| PullError::Config(e.to_string()))?;
        let mut endpoints = Vec::with_capacity(host_configs.len());
        for config in host_configs {
            if config.override_path {
                // oci-client always builds `<host>/v2/...` URLs.
                tracing::warn!(host = %config.host, "skipping mirror with override_path: not supported yet");
                continue;
            }
            let mut reference = image.to_oci();
            // oci-client appends /v2 itself; a mirror path prefix goes into the "registry".
            let prefix = config
                .path
                .strip_suffix("/v2")
                .unwrap_or(&config.path)
                .trim_end_matches('/');
            let resolved_host = format!("{}{}", config.host, prefix);
            if config.is_mirror || resolved_host != image.registry() {
                reference.set_mirror_registry(resolved_host.clone());
            }
            let client = Client::new(client_config(&config, &resolved_host)?);
            // Credentials go to the registry they were given for, never to mirrors (containerd
            // does the same; a mirror must not collect a user's upstream password).
            let for_this_host = !config.is_mirror
                && credentials
                    .server
                    .as_deref()
                    .map(|s| server_host(s) == image.registry() || server_host(s) == config.host)
                    .unwrap_or(true);
            let auth = match (&credentials.auth, for_this_host) {
                (Some(auth), true) => auth.clone(),
                _ => RegistryAuth::Anonymous,
            };
            endpoints.push(Endpoint {
                config,
                client,
                reference,
                auth,
            });
        }
        if endpoints.is_empty() {
            return Err(PullError::Config(format!(
                "no usable registry endpoint for {}",
                image.registry()
            )));
        }
        Ok(Remote {
            image: image.clone(),
            endpoints,
        })
    }

    /// Resolves the reference to a single-platform manifest, trying endpoints in order.
    pub async fn resolve(&self) -> Result<Resolved, PullError> {
        let mut errors = Vec::new();
        for endpoint in self.endpoints.iter().filter(|e| e.config.capabilities.resolve) {
            match self.resolve_at(endpoint).await {
                Ok(resolved) => return Ok(resolved),
                Err(e @ (PullError::NotFound(_) | PullError::Unauthorized(_) | PullError::Remote(_))) => {
                    tracing::debug!(endpoint = endpoint.describe(), error = %e, "resolve failed; trying next endpoint");
                    errors.push((endpoint.describe(), e));
                }
                Err(e) => return Err(e),
            }
        }
        Err(summarize(&self.image, errors))
    }

    async fn resolve_at(&self, endpoint: &Endpoint) -> Result<Resolved, PullError> {
        let (bytes, media_type) = self.fetch_manifest(endpoint, &endpoint.reference).await?;
        let digest = Digest::of(&bytes);
        if let Some(wanted) = self.image.digest() {
            if &digest != wanted {
                return Err(PullError::Integrity(format!(
                    "manifest digest {digest} != requested {wanted}"
                )));
            }
        }
        if media_type != MEDIA_OCI_INDEX && media_type != MEDIA_DOCKER_LIST {
            return Ok(Resolved {
                manifest: bytes,
                manifest_digest: digest,
                media_type,
                index: None,
            });
        }
        let index: OciImageIndex = serde_json::from_slice(&bytes)
            .map_err(|e| PullError::Integrity(format!("image index is not valid JSON: {e}")))?;
        let child = select_platform(&index)?;
        let child_digest = Digest::parse(&child.digest).map_err(|e| PullError::Integrity(e.to_string()))?;
        let child_ref = endpoint.reference.clone_with_digest(child_digest.to_string());
        let (manifest, media_type) = self.fetch_manifest(endpoint, &child_ref).await?;
        if Digest::of(&manifest) != child_digest {
            return Err(PullError::Integrity(format!(
                "manifest {child_digest} from the index does not match its digest"
            )));
        }
        Ok(Resolved {
            manifest,
            manifest_digest: child_digest,
            media_type,
            index: Some((bytes, digest)),
        })
    }

    async fn fetch_manifest(&self, endpoint: &Endpoint, reference: &Reference) -> Result<(Vec<u8>, String), PullError> {
        let (bytes, _digest) = endpoint
            .client
            .pull_manifest_raw(reference, &endpoint.auth, ACCEPTED_MANIFESTS)
            .await
            .map_err(|e| classify(&self.image, e))?;
        if bytes.len() > MAX_SMALL_BLOB {
            return Err(PullError::Integrity(format!(
                "manifest of {} bytes is too large",
                bytes.len()
            )));
        }
        // oci-client does not hand back the Content-Type; the mediaType field says the same.
        let media_type = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.get("mediaType").and_then(|m| m.as_str()).map(str::to_string))
            .unwrap_or_else(|| guess_media_type(&bytes));
        Ok((bytes.to_vec(), media_type))
    }

    /// Fetches a small blob (the config) fully into memory, verified.
    pub async fn fetch_small(&self, descriptor: &OciDescriptor) -> Result<Vec<u8>, PullError> {
        let expected = Digest::parse(&descriptor.digest).map_err(|e| PullError::Integrity(e.to_string()))?;
        if descriptor.size < 0 || descriptor.size as usize > MAX_SMALL_BLOB {
            return Err(PullError::Integrity(format!(
                "config of {} bytes is too large",
                descriptor.size
            )));
        }
        let mut errors = Vec::new();
        for endpoint in self.pull_endpoints() {
            let mut out = Vec::with_capacity(descriptor.size as usize);
            endpoint
                .client
                .store_auth_if_needed(endpoint.reference.resolve_registry(), &endpoint.auth)
                .await;
            match endpoint
                .client
                .pull_blob(&endpoint.reference, descriptor, &mut out)
                .await
            {
                Ok(()) if Digest::of(&out) == expected => return Ok(out),
                Ok(()) => errors.push((
                    endpoint.describe(),
                    PullError::Integrity(format!("blob {expected} failed verification")),
                )),
                Err(e) => errors.push((endpoint.describe(), classify(&self.image, e))),
            }
        }
        Err(summarize(&self.image, errors))
    }

    /// Opens a blob stream from `offset` (resume). Returns the stream and whether the registry
    /// honoured the offset (false: the stream starts at byte 0).
    pub async fn blob_stream(&self, descriptor: &OciDescriptor, offset: u64) -> Result<(SizedStream, bool), PullError> {
        let mut errors = Vec::new();
        for endpoint in self.pull_endpoints() {
            endpoint
                .client
                .store_auth_if_needed(endpoint.reference.resolve_registry(), &endpoint.auth)
                .await;
            let result = if offset == 0 {
                endpoint
                    .client
                    .pull_blob_stream(&endpoint.reference, descriptor)
                    .await
                    .map(|s| (s, false))
            } else {
                endpoint
                    .client
                    .pull_blob_stream_partial(&endpoint.reference, descriptor, offset, None)
                    .await
                    .map(|r| match r {
                        BlobResponse::Full(s) => (s, false),
                        BlobResponse::Partial(s) => (s, true),
                    })
            };
            match result {
                Ok(stream) => return Ok(stream),
                Err(e) => errors.push((endpoint.describe(), classify(&self.image, e))),
            }
        }
        Err(summarize(&self.image, errors))
    }

    fn pull_endpoints(&self) -> impl Iterator<Item = &Endpoint> {
        self.endpoints.iter().filter(|e| e.config.capabilities.pull)
    }
}

fn client_config(endpoint: &HostEndpoint, resolved_host: &str) -> Result<ClientConfig, PullError> {
    let mut extra_root_certificates = Vec::new();
    for ca in &endpoint.ca {
        let data = std::fs::read(ca).map_err(|e| PullError::Config(format!("cannot read CA {}: {e}", ca.display())))?;
        extra_root_certificates.push(oci_client::client::Certificate {
            encoding: oci_client::client::CertificateEncoding::Pem,
            data,
        });
    }
    Ok(ClientConfig {
        protocol: match endpoint.scheme {
            Scheme::Http => ClientProtocol::HttpsExcept(vec![resolved_host.to_string()]),
            Scheme::Https => ClientProtocol::Https,
        },
        accept_invalid_certificates: endpoint.skip_verify,
        extra_root_certificates,
        connect_timeout: Some(Duration::from_secs(30)),
        read_timeout: Some(Duration::from_secs(60)),
        user_agent: concat!("scute/", env!("CARGO_PKG_VERSION")),
        ..ClientConfig::default()
    })
}

/// `https://index.docker.io/v1/` → `index.docker.io`; `registry.k8s.io` stays.
fn server_host(server: &str) -> &str {
    let rest = server.split_once("://").map(|(_, r)| r).unwrap_or(server);
    let host = rest.split('/').next().unwrap_or(rest);
    match host {
        "index.docker.io" | "registry-1.docker.io" => "docker.io",
        h => h,
    }
}

fn guess_media_type(bytes: &[u8]) -> String {
    let v: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
    if v.get("manifests").is_some() {
        MEDIA_OCI_INDEX.to_string()
    } else {
        MEDIA_OCI_MANIFEST.to_string()
    }
}

/// The platform of this node, as OCI names it.
pub fn host_platform() -> (&'static str, &'static str) {
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    };
    ("linux", arch)
}

fn select_platform(index: &OciImageIndex) -> Result<&oci_client::manifest::ImageIndexEntry, PullError> {
    let (os, arch) = host_platform();
    index
        .manifests
        .iter()
        .find(|m| {
            m.platform
                .as_ref()
                .is_some_and(|p| p.os.to_string() == os && p.architecture.to_string() == arch)
        })
        .ok_or_else(|| {
            let available: Vec<String> = index
                .manifests
                .iter()
                .filter_map(|m| m.platform.as_ref())
                .map(|p| format!("{}/{}", p.os, p.architecture))
                .collect();
            PullError::NoPlatform(format!(
                "no {os}/{arch} image in the index (it has: {})",
                available.join(", ")
            ))
        })
}

fn classify(image: &ImageRef, e: oci_client::errors::OciDistributionError) -> PullError {
    use oci_client::errors::OciDistributionError as E;
    match &e {
        E::ImageManifestNotFoundError(_) => PullError::NotFound(format!("{image}: not found")),
        E::AuthenticationFailure(m) => PullError::Unauthorized(m.clone()),
        E::UnauthorizedError { .. } => PullError::Unauthorized(e.to_string()),
        E::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|x| {
                x.code == oci_client::errors::OciErrorCode::ManifestUnknown
                    || x.code == oci_client::errors::OciErrorCode::NameUnknown
            }) =>
        {
            PullError::NotFound(format!("{image}: not found"))
        }
        E::RegistryError { envelope, .. }
            if envelope.errors.iter().any(|x| {
                x.code == oci_client::errors::OciErrorCode::Unauthorized
                    || x.code == oci_client::errors::OciErrorCode::Denied
            }) =>
        {
            PullError::Unauthorized(e.to_string())
        }
        _ => PullError::Remote(e.to_string()),
    }
}

/// Folds the per-endpoint errors into one that names every endpoint tried. It is NotFound when
/// every endpoint that answered said so (an unreachable upstream of an offline node does not make
/// a missing image "unavailable"), Unauthorized when any refused the credentials.
fn summarize(image: &ImageRef, errors: Vec<(String, PullError)>) -> PullError {
    let joined = errors
        .iter()
        .map(|(endpoint, e)| format!("{endpoint}: {e}"))
        .collect::<Vec<_>>()
        .join("; ");
    let answered: Vec<&PullError> = errors
        .iter()
        .map(|(_, e)| e)
        .filter(|e| !matches!(e, PullError::Remote(_)))
        .collect();
    if errors.is_empty() {
        PullError::Remote(format!("{image}: no endpoint to pull from"))
    } else if errors.len() == 1 {
        let (endpoint, e) = errors.into_iter().next().expect("one error");
        match e {
            PullError::Remote(m) => PullError::Remote(format!("{endpoint}: {m}")),
            other => other,
        }
    } else if errors.iter().any(|(_, e)| matches!(e, PullError::Unauthorized(_))) {
        PullError::Unauthorized(joined)
    } else if !answered.is_empty() && answered.iter().all(|e| matches!(e, PullError::NotFound(_))) {
        PullError::NotFound(format!("{image} not found ({joined})"))
    } else {
        PullError::Remote(joined)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_hosts() {
        assert_eq!(server_host("https://index.docker.io/v1/"), "docker.io");
        assert_eq!(server_host("registry.k8s.io"), "registry.k8s.io");
        assert_eq!(server_host("http://127.0.0.1:5000"), "127.0.0.1:5000");
    }
}
