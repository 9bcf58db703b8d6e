//! Registry access for one pull: the endpoints from hosts.toml (mirrors first, then the
//! upstream), an oci-client per endpoint configured for its TLS/plain-HTTP settings, manifest
//! resolution with platform selection, and blob streams (with Range resume).
//!
//! oci-client is used for the HTTP work (auth challenges, bearer tokens, redirects); its
//! whole-image `pull()` is not used because it buffers layers in memory. Manifests are fetched
//! with reqwest directly (the client oci-client uses, with the same settings) because oci-client
//! reads a manifest body whole, whatever its size.
//!
//! Registries are untrusted: every document is read against a size known before its body is
//! read (the cap for manifests, the descriptor's size for blobs), so the daemon's memory is
//! bounded by its own limits, never by what a registry sends.

use std::time::Duration;

use bytes::Bytes;
use futures_util::{Stream, StreamExt};
use oci_client::client::{BlobResponse, ClientConfig, ClientProtocol, SizedStream};
use oci_client::manifest::{OciDescriptor, OciImageIndex};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};

use super::hosts::{self, HostEndpoint, Scheme};
use super::PullError;
use crate::distribution::digest::Digest;
use crate::distribution::reference::ImageRef;
use scute_sys::errors::chain;

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

/// Largest manifest or index accepted. The distribution spec asks clients to accept at least
/// 4 MiB and containerd refuses more (MaxManifestSize); real ones are a few KiB.
pub const MAX_MANIFEST_SIZE: u64 = 4 << 20;
/// Largest image config accepted. It is held in memory and parsed whole; no spec bounds it, and
/// it carries the build history, labels and env of every layer, so it gets twice the manifest
/// cap: still a fixed buffer per pull.
pub const MAX_CONFIG_SIZE: u64 = 8 << 20;
/// An error body is read only for its message.
const MAX_ERROR_BODY: usize = 64 << 10;

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
    /// For manifests, configured like `client`.
    http: reqwest::Client,
    /// The bearer token oci-client obtained for this repository (None: the registry asked for
    /// none, or for basic auth), fetched once per pull.
    token: tokio::sync::OnceCell<Option<String>>,
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

impl Resolved {
    /// The digest the reference points at: the index of a multi-arch image, else the manifest.
    /// containerd records it as the RepoDigest: pulling `name@<it>` must find the image.
    pub fn top_digest(&self) -> &Digest {
        self.index.as_ref().map(|(_, d)| d).unwrap_or(&self.manifest_digest)
    }

    pub fn index_digest(&self) -> Option<Digest> {
        self.index.as_ref().map(|(_, d)| d.clone())
    }
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
            let Clients { oci: client, http } =
                clients(&config, &resolved_host, matches!(auth, RegistryAuth::Anonymous))?;
            endpoints.push(Endpoint {
                config,
                client,
                http,
                token: tokio::sync::OnceCell::new(),
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
        let (bytes, media_type) = self.fetch_manifest(endpoint, &endpoint.reference, None).await?;
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
        let child_size = u64::try_from(child.size)
            .map_err(|_| PullError::Integrity(format!("manifest {child_digest} has a negative size in the index")))?;
        let (manifest, media_type) = self.fetch_manifest(endpoint, &child_ref, Some(child_size)).await?;
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

    /// Fetches one manifest or index, refusing it from its Content-Length when that is over the
    /// cap (or not the `expected` size from its index) and cutting the body off at the cap when
    /// it comes without one.
    async fn fetch_manifest(
        &self,
        endpoint: &Endpoint,
        reference: &Reference,
        expected: Option<u64>,
    ) -> Result<(Vec<u8>, String), PullError> {
        let what = format!(
            "manifest {}",
            reference.digest().or(reference.tag()).unwrap_or("latest")
        );
        if let Some(size) = expected.filter(|s| *s > MAX_MANIFEST_SIZE) {
            return Err(too_large(&what, size, MAX_MANIFEST_SIZE));
        }
        let url = manifest_url(endpoint.config.scheme, reference);
        let token = endpoint
            .token
            .get_or_try_init(|| endpoint.client.auth(reference, &endpoint.auth, RegistryOperation::Pull))
            .await
            .map_err(|e| classify(&self.image, e))?;
        let remote = |e: reqwest::Error| PullError::Remote(format!("{url}: {}", chain(&e)));
        let get = |basic: bool| {
            let request = endpoint
                .http
                .get(&url)
                .header(reqwest::header::ACCEPT, ACCEPTED_MANIFESTS.join(", "))
                // Said outright: without it any coding is acceptable (RFC 9110), and a body to
                // inflate is a bomb the size cap could only catch after inflating.
                .header(reqwest::header::ACCEPT_ENCODING, "identity");
            match (token, &endpoint.auth) {
                (Some(token), _) => request.bearer_auth(token),
                (None, RegistryAuth::Basic(user, password)) if basic => request.basic_auth(user, Some(password)),
                _ => request,
            }
        };
        let mut response = get(false).send().await.map_err(remote)?;
        if response.status() == reqwest::StatusCode::UNAUTHORIZED
            && token.is_none()
            && matches!(endpoint.auth, RegistryAuth::Basic(..))
        {
            // The registry challenged for basic auth (oci-client found no bearer realm).
            response = get(true).send().await.map_err(remote)?;
        }
        if !response.status().is_success() {
            return Err(self.status_error(&url, response).await);
        }
        if let Some(coding) = response
            .headers()
            .get(reqwest::header::CONTENT_ENCODING)
            .filter(|c| !c.as_bytes().eq_ignore_ascii_case(b"identity"))
        {
            return Err(PullError::Integrity(format!(
                "{what}: the registry sent it with Content-Encoding {}, which scute asked it not to \
                 (Accept-Encoding: identity); refused unread",
                String::from_utf8_lossy(coding.as_bytes())
            )));
        }
        let header_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .map(|v| v.split(';').next().unwrap_or(v).trim().to_string());
        let limit = expected.unwrap_or(MAX_MANIFEST_SIZE);
        // Refused from the announced length: the body is never read.
        match (response.content_length(), expected) {
            (Some(announced), _) if announced > MAX_MANIFEST_SIZE => {
                return Err(too_large(&what, announced, MAX_MANIFEST_SIZE))
            }
            (Some(announced), Some(size)) if announced != size => {
                return Err(PullError::Integrity(format!(
                    "{what}: registry announces {announced} bytes, but the index declares {size}; refused"
                )))
            }
            _ => {}
        }
        let mut bytes = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(remote)? {
            if (bytes.len() + chunk.len()) as u64 > limit {
                return Err(match expected {
                    Some(size) => more_than_declared(&what, size),
                    None => {
                        PullError::Integrity(format!("{what} exceeds the {} limit; refused", mib(MAX_MANIFEST_SIZE)))
                    }
                });
            }
            bytes.extend_from_slice(&chunk);
        }
        if let Some(size) = expected.filter(|s| *s != bytes.len() as u64) {
            return Err(fewer_than_declared(&what, bytes.len() as u64, size));
        }
        // The mediaType field names the document; older manifests may only have the header.
        let media_type = serde_json::from_slice::<serde_json::Value>(&bytes)
            .ok()
            .and_then(|v| v.get("mediaType").and_then(|m| m.as_str()).map(str::to_string))
            .or(header_type.filter(|t| ACCEPTED_MANIFESTS.contains(&t.as_str())))
            .unwrap_or_else(|| guess_media_type(&bytes));
        Ok((bytes, media_type))
    }

    /// The error for a refused manifest request, from its status and (capped) body.
    async fn status_error(&self, url: &str, mut response: reqwest::Response) -> PullError {
        use oci_client::errors::{OciDistributionError as E, OciEnvelope};
        let status = response.status();
        let mut body = Vec::new();
        while let Ok(Some(chunk)) = response.chunk().await {
            body.extend_from_slice(&chunk[..chunk.len().min(MAX_ERROR_BODY - body.len())]);
            if body.len() >= MAX_ERROR_BODY {
                break;
            }
        }
        let error = match serde_json::from_slice::<OciEnvelope>(&body) {
            _ if status == reqwest::StatusCode::UNAUTHORIZED => E::UnauthorizedError { url: url.to_string() },
            _ if status == reqwest::StatusCode::NOT_FOUND => E::ImageManifestNotFoundError(url.to_string()),
            Ok(envelope) if status.is_client_error() => E::RegistryError {
                envelope,
                url: url.to_string(),
            },
            _ => E::ServerError {
                code: status.as_u16(),
                url: url.to_string(),
                message: String::from_utf8_lossy(&body).into_owned(),
            },
        };
        classify(&self.image, error)
    }

    /// Fetches the image config into memory, verified: at most [`MAX_CONFIG_SIZE`] and exactly
    /// the size its descriptor declares.
    pub async fn fetch_small(&self, descriptor: &OciDescriptor) -> Result<Vec<u8>, PullError> {
        let expected = Digest::parse(&descriptor.digest).map_err(|e| PullError::Integrity(e.to_string()))?;
        let what = format!("config {expected}");
        let size =
            u64::try_from(descriptor.size).map_err(|_| PullError::Integrity(format!("{what} has a negative size")))?;
        if size > MAX_CONFIG_SIZE {
            return Err(too_large(&what, size, MAX_CONFIG_SIZE));
        }
        let mut errors = Vec::new();
        for endpoint in self.pull_endpoints() {
            endpoint
                .client
                .store_auth_if_needed(endpoint.reference.resolve_registry(), &endpoint.auth)
                .await;
            let result = match endpoint.client.pull_blob_stream(&endpoint.reference, descriptor).await {
                Ok(stream) => match check_announced(&stream, 0, size, &what) {
                    Ok(()) => read_sized(stream, size, &what).await,
                    Err(e) => Err(e),
                },
                Err(e) => Err(classify(&self.image, e)),
            };
            match result {
                Ok(out) if Digest::of(&out) == expected => return Ok(out),
                Ok(_) => errors.push((
                    endpoint.describe(),
                    PullError::Integrity(format!("blob {expected} failed verification")),
                )),
                Err(e) => errors.push((endpoint.describe(), e)),
            }
        }
        Err(summarize(&self.image, errors))
    }

    /// Opens a blob stream from `offset` (resume). Returns the stream and whether the registry
    /// honoured the offset (false: the stream starts at byte 0).
    ///
    /// Always asked for as a range (`bytes=0-` for a whole blob): a registry that answers it
    /// with 206 gets the stream unhashed by oci-client, whose full-blob stream hashes every
    /// byte for a digest check of its own. The pull's content store hashes each byte anyway and
    /// commits nothing else (`content.rs`): that second SHA-256 of every compressed byte was a
    /// sixth of a 200 MB pull's CPU. A 200 (a registry without ranges) is hashed by both, as
    /// before.
    pub async fn blob_stream(&self, descriptor: &OciDescriptor, offset: u64) -> Result<(SizedStream, bool), PullError> {
        let mut errors = Vec::new();
        for endpoint in self.pull_endpoints() {
            endpoint
                .client
                .store_auth_if_needed(endpoint.reference.resolve_registry(), &endpoint.auth)
                .await;
            let result = if offset == 0 && descriptor.size == 0 {
                // `bytes=0-` of nothing is unsatisfiable (416): an empty blob is asked whole.
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
                        BlobResponse::Partial(s) => (s, offset > 0),
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

/// The blob stream of a descriptor of `size` bytes, read into memory: the announced length
/// must be `size`, the read stops at the first byte past it, and a body that ends short is
/// refused too (the OCI spec requires the sizes to match).
async fn read_sized<S>(mut stream: S, size: u64, what: &str) -> Result<Vec<u8>, PullError>
where
    S: Stream<Item = Result<Bytes, std::io::Error>> + Unpin,
{
    let mut out = Vec::with_capacity(size as usize);
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| PullError::Remote(format!("{what}: {}", chain(&e))))?;
        if (out.len() + chunk.len()) as u64 > size {
            return Err(more_than_declared(what, size));
        }
        out.extend_from_slice(&chunk);
    }
    if (out.len() as u64) < size {
        return Err(fewer_than_declared(what, out.len() as u64, size));
    }
    Ok(out)
}

/// Checks a blob's announced length (Content-Length, from `offset` when resuming) against its
/// descriptor before any of the body is read.
pub fn check_announced(stream: &SizedStream, offset: u64, size: u64, what: &str) -> Result<(), PullError> {
    match stream.content_length {
        Some(announced) if offset.checked_add(announced) != Some(size) => {
            let from = if offset > 0 {
                format!(" from offset {offset}")
            } else {
                String::new()
            };
            Err(PullError::Integrity(format!(
                "{what}: registry announces {announced} bytes{from}, but its descriptor declares \
                 {size}; refused"
            )))
        }
        _ => Ok(()),
    }
}

pub fn more_than_declared(what: &str, size: u64) -> PullError {
    PullError::Integrity(format!(
        "{what}: registry sent more than the {size} bytes its descriptor declares; refused"
    ))
}

pub fn fewer_than_declared(what: &str, got: u64, size: u64) -> PullError {
    PullError::Integrity(format!(
        "{what}: registry sent {got} bytes, but its descriptor declares {size}; refused"
    ))
}

fn too_large(what: &str, size: u64, limit: u64) -> PullError {
    PullError::Integrity(format!(
        "{what} is {size} bytes, over the {} limit; refused",
        mib(limit)
    ))
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

/// `<scheme>://<registry>/v2/<repository>/manifests/<tag or digest>`, with `?ns=` naming the
/// upstream when the registry is a mirror (as oci-client and containerd build it).
fn manifest_url(scheme: Scheme, reference: &Reference) -> String {
    let target = reference.digest().or(reference.tag()).unwrap_or("latest");
    let ns = reference.namespace().map(|ns| format!("?ns={ns}")).unwrap_or_default();
    format!(
        "{}://{}/v2/{}/manifests/{target}{ns}",
        scheme.as_str(),
        reference.resolve_registry(),
        reference.repository()
    )
}

fn read_cas(endpoint: &HostEndpoint) -> Result<Vec<Vec<u8>>, PullError> {
    endpoint
        .ca
        .iter()
        .map(|ca| std::fs::read(ca).map_err(|e| PullError::Config(format!("cannot read CA {}: {e}", ca.display()))))
        .collect()
}

/// The clients of one endpoint: oci-client's, and reqwest's for manifests (configured alike).
#[derive(Clone)]
struct Clients {
    oci: Client,
    http: reqwest::Client,
}

/// What makes two endpoints' clients the same: scheme, host and TLS settings.
#[derive(PartialEq, Eq, Hash)]
struct ClientsKey {
    plain_http: bool,
    resolved_host: String,
    skip_verify: bool,
    cas: Vec<Vec<u8>>,
}

/// Kept clients beyond this many are dropped all at once (each hosts.toml or CA change makes a
/// new key; a node has a handful).
const MAX_KEPT_CLIENTS: usize = 64;

/// An endpoint's clients, kept for the daemon's life per scheme, host and TLS setting: building
/// them cost a small image's pull about a third of its time (the TLS roots: `system_roots`).
/// The CA files are read at every pull, so a changed hosts.toml or CA gets new clients.
/// oci-client's client keeps the credentials it was first used with and the tokens they got, so
/// only an anonymous one is shared; a pull with credentials gets its own, dropped with the pull
/// (containerd too keeps no credentials past a pull).
fn clients(endpoint: &HostEndpoint, resolved_host: &str, anonymous: bool) -> Result<Clients, PullError> {
    type Kept = std::collections::HashMap<ClientsKey, Clients>;
    static KEPT: std::sync::OnceLock<std::sync::Mutex<Kept>> = std::sync::OnceLock::new();
    let cas = read_cas(endpoint)?;
    let key = ClientsKey {
        plain_http: endpoint.scheme == Scheme::Http,
        resolved_host: resolved_host.to_string(),
        skip_verify: endpoint.skip_verify,
        cas,
    };
    // A pull with credentials gets an oci-client of its own, configured as the kept one.
    let own_config = (!anonymous).then(|| client_config(endpoint, resolved_host, &key.cas));
    let mut kept = KEPT
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    let shared = match kept.get(&key) {
        Some(shared) => shared.clone(),
        None => {
            let built = build_clients(endpoint, &key)?;
            if kept.len() >= MAX_KEPT_CLIENTS {
                kept.clear();
            }
            kept.insert(key, built.clone());
            built
        }
    };
    drop(kept);
    Ok(match own_config {
        None => shared,
        Some(config) => Clients {
            oci: Client::new(config),
            http: shared.http,
        },
    })
}

/// The system's TLS roots (DER), read once for the daemon's life, as Go's crypto/x509 reads its
/// system pool once for containerd's. A reqwest client built with its platform verifier reads
/// and parses /etc/ssl/certs again (3.3 ms here), and a pull's first clients built three; given
/// these as the only roots, reqwest and oci-client's client read nothing (oci-client still
/// builds one default client it drops: one read per endpoint's first pull). Certificates
/// rustls cannot use are left out, as the platform verifier leaves them out.
fn system_roots() -> &'static [Vec<u8>] {
    static ROOTS: std::sync::OnceLock<Vec<Vec<u8>>> = std::sync::OnceLock::new();
    ROOTS.get_or_init(|| {
        let loaded = rustls_native_certs::load_native_certs();
        for error in &loaded.errors {
            tracing::warn!(%error, "loading the system's TLS root certificates");
        }
        let mut usable = Vec::with_capacity(loaded.certs.len());
        for cert in loaded.certs {
            match rustls::RootCertStore::empty().add(cert.clone()) {
                Ok(()) => usable.push(cert.to_vec()),
                Err(error) => tracing::debug!(%error, "a system TLS root certificate rustls cannot use: left out"),
            }
        }
        usable
    })
}

/// Reads the system's TLS roots on a thread of their own, so that the first pull after the
/// daemon starts does not wait for them.
pub fn preload_system_roots() {
    if let Err(error) = std::thread::Builder::new().name("tls-roots".into()).spawn(|| {
        system_roots();
    }) {
        tracing::debug!(%error, "reading the TLS roots ahead: the first pull will");
    }
}

fn build_clients(endpoint: &HostEndpoint, key: &ClientsKey) -> Result<Clients, PullError> {
    let mut roots = Vec::new();
    for pem in &key.cas {
        roots.push(reqwest::Certificate::from_pem(pem).map_err(|e| PullError::Config(format!("invalid CA: {e}")))?);
    }
    for der in system_roots() {
        roots.push(reqwest::Certificate::from_der(der).map_err(|e| PullError::Config(format!("system CA: {e}")))?);
    }
    let http = reqwest::Client::builder()
        .tls_danger_accept_invalid_certs(endpoint.skip_verify)
        .tls_certs_only(roots)
        .connect_timeout(Duration::from_secs(30))
        .read_timeout(Duration::from_secs(60))
        .user_agent(concat!("scute/", env!("CARGO_PKG_VERSION")))
        .build()
        .map_err(|e| PullError::Config(format!("registry client for {}: {e}", endpoint.host)))?;
    Ok(Clients {
        oci: Client::new(client_config(endpoint, &key.resolved_host, &key.cas)),
        http,
    })
}

fn client_config(endpoint: &HostEndpoint, resolved_host: &str, cas: &[Vec<u8>]) -> ClientConfig {
    let certificate = |encoding, data: &Vec<u8>| oci_client::client::Certificate {
        encoding,
        data: data.clone(),
    };
    use oci_client::client::CertificateEncoding::{Der, Pem};
    let tls_certs_only = cas
        .iter()
        .map(|pem| certificate(Pem, pem))
        .chain(system_roots().iter().map(|der| certificate(Der, der)))
        .collect();
    ClientConfig {
        protocol: match endpoint.scheme {
            Scheme::Http => ClientProtocol::HttpsExcept(vec![resolved_host.to_string()]),
            Scheme::Https => ClientProtocol::Https,
        },
        accept_invalid_certificates: endpoint.skip_verify,
        tls_certs_only,
        connect_timeout: Some(Duration::from_secs(30)),
        read_timeout: Some(Duration::from_secs(60)),
        user_agent: concat!("scute/", env!("CARGO_PKG_VERSION")),
        ..ClientConfig::default()
    }
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

pub(crate) fn select_platform(index: &OciImageIndex) -> Result<&oci_client::manifest::ImageIndexEntry, PullError> {
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
        _ => PullError::Remote(chain(&e)),
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

    fn chunks(parts: &[&'static [u8]]) -> impl Stream<Item = Result<Bytes, std::io::Error>> + Unpin {
        futures_util::stream::iter(parts.iter().map(|p| Ok(Bytes::from_static(p))).collect::<Vec<_>>())
    }

    fn integrity(result: Result<Vec<u8>, PullError>) -> String {
        match result {
            Err(PullError::Integrity(m)) => m,
            other => panic!("expected an integrity error, got {:?}", other.map(|b| b.len())),
        }
    }

    #[tokio::test]
    async fn blob_reads_hold_the_registry_to_the_declared_size() {
        let exact = read_sized(chunks(&[b"ab", b"cd"]), 4, "config x").await.unwrap();
        assert_eq!(exact, b"abcd");
        // One byte too many, even at the end of a chunk, is refused, not truncated.
        let more = integrity(read_sized(chunks(&[b"ab", b"cde"]), 4, "config x").await);
        assert!(more.contains("more than the 4 bytes"), "{more}");
        let fewer = integrity(read_sized(chunks(&[b"ab"]), 4, "config x").await);
        assert!(fewer.contains("sent 2 bytes, but its descriptor declares 4"), "{fewer}");
    }

    #[test]
    fn announced_lengths_must_match_the_descriptor() {
        let sized = |content_length| SizedStream {
            content_length,
            digest_header_value: None,
            stream: Box::pin(futures_util::stream::empty()),
        };
        assert!(check_announced(&sized(Some(10)), 0, 10, "layer x").is_ok());
        assert!(check_announced(&sized(Some(4)), 6, 10, "layer x").is_ok());
        assert!(check_announced(&sized(None), 0, 10, "layer x").is_ok());
        let e = check_announced(&sized(Some(200 << 20)), 0, 1234, "config x").unwrap_err();
        assert!(
            e.to_string()
                .contains("announces 209715200 bytes, but its descriptor declares 1234"),
            "{e}"
        );
        assert!(check_announced(&sized(Some(u64::MAX)), 6, 10, "layer x").is_err());
    }

    #[test]
    fn manifest_urls() {
        let mut reference = Reference::try_from("127.0.0.1:5000/a/b:v1").unwrap();
        assert_eq!(
            manifest_url(Scheme::Http, &reference),
            "http://127.0.0.1:5000/v2/a/b/manifests/v1"
        );
        reference.set_mirror_registry("mirror:5000/prefix".to_string());
        let pinned = reference.clone_with_digest(format!("sha256:{}", "a".repeat(64)));
        assert_eq!(
            manifest_url(Scheme::Https, &pinned),
            format!(
                "https://mirror:5000/prefix/v2/a/b/manifests/sha256:{}?ns=127.0.0.1:5000",
                "a".repeat(64)
            )
        );
    }
}
