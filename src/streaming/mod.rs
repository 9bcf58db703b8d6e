//! The streaming server: the HTTP(S) endpoint behind the URLs that Exec, Attach and PortForward
//! return, as the kubelet's streaming library serves them (`/exec/<token>`, `/attach/<token>`,
//! `/portforward/<token>`, GET or POST, SPDY/3.1 upgrade or WebSocket). A token is single use,
//! expires, and carries the request it was made for; an unknown or reused one gets 404.
//!
//! ```text
//!   Exec RPC ──▶ TokenCache.insert(request) ──▶ URL ──▶ client connects ──▶ consume(token)
//!      ──▶ upgrade (SPDY or WebSocket) ──▶ remotecommand / portforward session ──▶ shim / netns
//! ```
//!
//! Sessions are bounded: at most `max_sessions` at once, and one without traffic for
//! `idle_timeout` is closed. Dropping a session closes its shim connection, which kills an
//! exec'd process: a dead client frees what it used.

pub mod portforward;
pub mod remotecommand;
pub mod session;
pub mod spdy;
pub mod tokens;
pub mod ws;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};
use tokio_tungstenite::tungstenite::protocol::Role as WsRole;
use tokio_tungstenite::WebSocketStream;

use crate::api;
use crate::config::StreamingConfig;
use crate::container::manager::ContainerManager;
use crate::container::streams::ExecSession;
use crate::sandbox::manager::SandboxManager;
use crate::shim_client::AttachOptions;
use remotecommand::{RemoteCommand, Starter, StdioOptions};
use session::Activity;
pub use tokens::{Pending, TokenError};

/// A session's whole life, as one future.
type Session = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

const STREAM_PROTOCOL_HEADER: &str = "x-stream-protocol-version";
const ACCEPTED_PROTOCOLS_HEADER: &str = "x-accepted-stream-protocol-versions";

pub struct StreamingServer {
    base_url: String,
    tokens: tokens::TokenCache,
    sessions: Arc<Semaphore>,
    idle_timeout: Duration,
    creation_timeout: Duration,
    containers: Arc<ContainerManager>,
    sandboxes: Arc<SandboxManager>,
}

impl StreamingServer {
    /// Binds the configured address and serves until `shutdown` turns true.
    pub async fn start(
        config: &StreamingConfig,
        containers: Arc<ContainerManager>,
        sandboxes: Arc<SandboxManager>,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<Arc<StreamingServer>> {
        let tls = load_tls(config)?;
        let listener = TcpListener::bind(&config.address)
            .await
            .with_context(|| format!("binding the streaming server to {}", config.address))?;
        let local = listener.local_addr()?;
        let scheme = if tls.is_some() { "https" } else { "http" };
        let server = Arc::new(StreamingServer {
            base_url: format!("{scheme}://{local}"),
            tokens: tokens::TokenCache::new(Duration::from_secs(config.token_ttl_seconds)),
            sessions: Arc::new(Semaphore::new(config.max_sessions)),
            idle_timeout: Duration::from_secs(config.idle_timeout_seconds),
            creation_timeout: Duration::from_secs(config.stream_creation_timeout_seconds),
            containers,
            sandboxes,
        });
        tracing::info!(url = %server.base_url, "streaming server (exec, attach, port-forward) listening");
        let accepting = server.clone();
        tokio::spawn(async move {
            loop {
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = async { let _ = shutdown.wait_for(|stop| *stop).await; } => return,
                };
                let (stream, peer) = match accepted {
                    Ok(accepted) => accepted,
                    Err(e) => {
                        // Out of fds, mostly: back off instead of spinning.
                        tracing::warn!(error = %e, "streaming server accept failed");
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                let server = accepting.clone();
                let tls = tls.clone();
                tokio::spawn(async move {
                    let _ = stream.set_nodelay(true);
                    match tls {
                        Some(acceptor) => match acceptor.accept(stream).await {
                            Ok(stream) => server.serve_connection(stream, peer).await,
                            Err(e) => tracing::info!(%peer, error = %e, "streaming TLS handshake failed"),
                        },
                        None => server.serve_connection(stream, peer).await,
                    }
                });
            }
        });
        Ok(server)
    }

    /// The base URL (scheme, host and port) the session URLs are on.
    pub fn base_url(&self) -> &str {
        &self.base_url
    }

    /// Parks a checked request and returns its one-time URL.
    pub fn url_for(&self, request: Pending) -> Result<String, TokenError> {
        let kind = request.kind();
        let token = self.tokens.insert(request)?;
        Ok(format!("{}/{kind}/{token}", self.base_url))
    }

    async fn serve_connection<IO>(self: Arc<Self>, io: IO, peer: SocketAddr)
    where
        IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
    {
        let service = hyper::service::service_fn(move |request| {
            let server = self.clone();
            async move { Ok::<_, Infallible>(server.handle(request)) }
        });
        let served = hyper::server::conn::http1::Builder::new()
            .serve_connection(TokioIo::new(io), service)
            .with_upgrades()
            .await;
        if let Err(e) = served {
            tracing::debug!(%peer, error = %e, "streaming connection ended with an error");
        }
    }

    /// Routes one HTTP request: checks the token, answers the upgrade, and starts the session
    /// on the upgraded connection.
    fn handle(self: Arc<Self>, mut request: Request<Incoming>) -> Response<Full<Bytes>> {
        if request.method() != Method::GET && request.method() != Method::POST {
            return plain(StatusCode::METHOD_NOT_ALLOWED, "only GET and POST are served");
        }
        let path = request.uri().path().to_string();
        let mut parts = path.trim_start_matches('/').splitn(2, '/');
        let (Some(kind), Some(token)) = (parts.next(), parts.next()) else {
            return plain(StatusCode::NOT_FOUND, "404 page not found");
        };
        let Some(pending) = self.tokens.consume(token).filter(|p| p.kind() == kind) else {
            return plain(StatusCode::NOT_FOUND, "404 page not found");
        };
        let Ok(permit) = self.sessions.clone().try_acquire_owned() else {
            return plain(
                StatusCode::SERVICE_UNAVAILABLE,
                "too many streaming sessions are open; retry later",
            );
        };
        let websocket = header_has(request.headers(), header::UPGRADE, "websocket");
        let upgrade = hyper::upgrade::on(&mut request);
        let headers = request.headers().clone();
        let id = match &pending {
            Pending::Exec(r) => r.container_id.clone(),
            Pending::Attach(r) => r.container_id.clone(),
            Pending::PortForward(r) => r.pod_sandbox_id.clone(),
        };
        tracing::info!(kind, id, websocket, "streaming session starting");
        if websocket {
            self.upgrade_websocket(&headers, pending, upgrade, permit)
        } else {
            self.upgrade_spdy(&headers, pending, upgrade, permit)
        }
    }

    fn upgrade_spdy(
        self: Arc<Self>,
        headers: &HeaderMap,
        pending: Pending,
        upgrade: hyper::upgrade::OnUpgrade,
        permit: OwnedSemaphorePermit,
    ) -> Response<Full<Bytes>> {
        if !header_has(headers, header::CONNECTION, "upgrade") || !header_has(headers, header::UPGRADE, "spdy/3.1") {
            return plain(
                StatusCode::BAD_REQUEST,
                "unable to upgrade: missing upgrade headers in request",
            );
        }
        let supported = match pending {
            Pending::PortForward(_) => portforward::SPDY_PROTOCOLS,
            _ => remotecommand::SPDY_PROTOCOLS,
        };
        let offered = headers
            .get_all(STREAM_PROTOCOL_HEADER)
            .iter()
            .filter_map(|v| v.to_str().ok());
        let Some(protocol) = ws::negotiate(offered, supported) else {
            let mut response = plain(
                StatusCode::FORBIDDEN,
                &format!(
                    "unable to upgrade: unable to negotiate protocol: server accepts {}",
                    supported.join(", ")
                ),
            );
            for p in supported {
                response
                    .headers_mut()
                    .append(ACCEPTED_PROTOCOLS_HEADER, HeaderValue::from_static(p));
            }
            return response;
        };
        let mut response = Response::new(Full::default());
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = response.headers_mut();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("SPDY/3.1"));
        if let Ok(value) = HeaderValue::from_str(&protocol) {
            if !protocol.is_empty() {
                h.insert(STREAM_PROTOCOL_HEADER, value);
            }
        }
        tokio::spawn(async move {
            let upgraded = match upgrade.await {
                Ok(upgraded) => upgraded,
                Err(e) => return tracing::info!(error = %e, "SPDY upgrade failed"),
            };
            let (conn, incoming) = spdy::Connection::new(TokioIo::new(upgraded), spdy::Role::Server);
            let activity = Activity::default();
            let session = self.spdy_session(conn, incoming, pending, protocol, activity.clone());
            self.run_bounded(session, activity, permit).await;
        });
        response
    }

    fn upgrade_websocket(
        self: Arc<Self>,
        headers: &HeaderMap,
        pending: Pending,
        upgrade: hyper::upgrade::OnUpgrade,
        permit: OwnedSemaphorePermit,
    ) -> Response<Full<Bytes>> {
        let Some(key) = headers.get(header::SEC_WEBSOCKET_KEY) else {
            return plain(StatusCode::BAD_REQUEST, "WebSocket upgrade without Sec-WebSocket-Key");
        };
        if headers.get(header::SEC_WEBSOCKET_VERSION).map(|v| v.as_bytes()) != Some(b"13") {
            return plain(StatusCode::BAD_REQUEST, "only WebSocket version 13 is supported");
        }
        let supported = match pending {
            Pending::PortForward(_) => portforward::WS_PROTOCOLS,
            _ => remotecommand::WS_PROTOCOLS,
        };
        let offered = headers
            .get_all(header::SEC_WEBSOCKET_PROTOCOL)
            .iter()
            .filter_map(|v| v.to_str().ok());
        let Some(protocol) = ws::negotiate(offered, supported) else {
            return plain(
                StatusCode::BAD_REQUEST,
                &format!(
                    "no supported WebSocket subprotocol; the server accepts {}",
                    supported.join(", ")
                ),
            );
        };
        let mut response = Response::new(Full::default());
        *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
        let h = response.headers_mut();
        h.insert(header::CONNECTION, HeaderValue::from_static("Upgrade"));
        h.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
        if let Ok(accept) = HeaderValue::from_str(&ws::accept_key(key.as_bytes())) {
            h.insert(header::SEC_WEBSOCKET_ACCEPT, accept);
        }
        if !protocol.is_empty() {
            if let Ok(value) = HeaderValue::from_str(&protocol) {
                h.insert(header::SEC_WEBSOCKET_PROTOCOL, value);
            }
        }
        tokio::spawn(async move {
            let upgraded = match upgrade.await {
                Ok(upgraded) => upgraded,
                Err(e) => return tracing::info!(error = %e, "WebSocket upgrade failed"),
            };
            let socket = WebSocketStream::from_raw_socket(TokioIo::new(upgraded), WsRole::Server, None).await;
            let activity = Activity::default();
            let session: Session = match pending {
                pending @ Pending::PortForward(_) if protocol.starts_with(ws::SPDY_TUNNEL_PREFIX) => {
                    let (conn, incoming) = spdy::Connection::new(ws::tunnel(socket), spdy::Role::Server);
                    self.spdy_session(conn, incoming, pending, String::new(), activity.clone())
                }
                Pending::PortForward(r) => {
                    let ports = r.port.iter().filter_map(|p| u16::try_from(*p).ok()).collect();
                    Box::pin(portforward::serve_websocket(
                        socket,
                        protocol,
                        ports,
                        self.connector(r.pod_sandbox_id),
                        activity.clone(),
                    ))
                }
                pending => {
                    let remote = self.remote_command(pending);
                    Box::pin(remotecommand::serve_websocket(
                        socket,
                        protocol,
                        remote,
                        activity.clone(),
                    ))
                }
            };
            self.run_bounded(session, activity, permit).await;
        });
        response
    }

    /// The session on a SPDY connection (upgraded, or tunnelled through WebSocket).
    fn spdy_session(
        &self,
        conn: spdy::Connection,
        incoming: spdy::Incoming,
        pending: Pending,
        protocol: String,
        activity: Activity,
    ) -> Session {
        match pending {
            Pending::PortForward(r) => Box::pin(portforward::serve_spdy(
                conn,
                incoming,
                self.connector(r.pod_sandbox_id),
                self.creation_timeout,
                activity,
            )),
            pending => {
                let remote = self.remote_command(pending);
                Box::pin(remotecommand::serve_spdy(
                    conn,
                    incoming,
                    protocol,
                    remote,
                    self.creation_timeout,
                    activity,
                ))
            }
        }
    }

    /// Runs a session until it ends or idles out; the permit is held meanwhile.
    async fn run_bounded(
        &self,
        session: impl std::future::Future<Output = ()>,
        activity: Activity,
        permit: OwnedSemaphorePermit,
    ) {
        activity.touch();
        tokio::select! {
            _ = session => tracing::info!("streaming session ended"),
            _ = activity.idle_for(self.idle_timeout) => {
                tracing::info!(idle_timeout = ?self.idle_timeout, "streaming session idle for too long; closed");
            }
        }
        drop(permit);
    }

    /// The stdio options, command and shim-session starter of an exec or attach.
    fn remote_command(&self, pending: Pending) -> RemoteCommand {
        let containers = self.containers.clone();
        match pending {
            Pending::Exec(r) => {
                let opts = StdioOptions {
                    stdin: r.stdin,
                    stdout: r.stdout,
                    stderr: r.stderr && !r.tty,
                    tty: r.tty,
                };
                let exec = ExecSession {
                    cmd: r.cmd.clone(),
                    tty: r.tty,
                    stdin: r.stdin,
                };
                let id = r.container_id;
                let start: Starter =
                    Box::pin(async move { containers.exec_session(&id, &exec).await.map_err(|e| e.to_string()) });
                RemoteCommand {
                    opts,
                    command: Some(r.cmd),
                    start,
                }
            }
            Pending::Attach(r) => {
                let opts = StdioOptions {
                    stdin: r.stdin,
                    stdout: r.stdout,
                    stderr: r.stderr && !r.tty,
                    tty: r.tty,
                };
                let attach = AttachOptions {
                    stdin: r.stdin,
                    stdout: r.stdout,
                    stderr: r.stderr,
                };
                let id = r.container_id;
                let start: Starter =
                    Box::pin(async move { containers.attach_session(&id, &attach).await.map_err(|e| e.to_string()) });
                RemoteCommand {
                    opts,
                    command: None,
                    start,
                }
            }
            Pending::PortForward(_) => unreachable!("port-forward is not a remote command"),
        }
    }

    fn connector(&self, sandbox_id: String) -> portforward::Connector {
        let sandboxes = self.sandboxes.clone();
        Arc::new(move |port| {
            let (sandboxes, id) = (sandboxes.clone(), sandbox_id.clone());
            Box::pin(async move {
                match sandboxes.connect_port(&id, port).await {
                    Ok(Ok(tcp)) => Ok(tcp),
                    Ok(Err(e)) => Err(format!("connecting to port {port} in the pod: {e}")),
                    Err(e) => Err(e.to_string()),
                }
            })
        })
    }
}

/// The exec request a token is made for, checked as the kubelet's streaming server checks it.
pub fn check_exec(request: &api::ExecRequest) -> Result<(), String> {
    check_stdio(
        &request.container_id,
        request.tty,
        request.stdin,
        request.stdout,
        request.stderr,
    )?;
    if request.cmd.is_empty() || request.cmd[0].is_empty() {
        return Err("cmd must not be empty".into());
    }
    Ok(())
}

pub fn check_attach(request: &api::AttachRequest) -> Result<(), String> {
    check_stdio(
        &request.container_id,
        request.tty,
        request.stdin,
        request.stdout,
        request.stderr,
    )
}

fn check_stdio(container_id: &str, tty: bool, stdin: bool, stdout: bool, stderr: bool) -> Result<(), String> {
    if container_id.is_empty() {
        return Err("missing required container_id".into());
    }
    if tty && stderr {
        return Err("tty and stderr cannot both be true: a terminal has one output stream".into());
    }
    if !stdin && !stdout && !stderr {
        return Err("one of stdin, stdout and stderr must be set".into());
    }
    Ok(())
}

fn header_has(headers: &HeaderMap, name: header::HeaderName, token: &str) -> bool {
    headers
        .get_all(name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|v| v.trim().eq_ignore_ascii_case(token))
}

fn plain(status: StatusCode, body: &str) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(format!("{body}\n"))));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

/// The TLS acceptor when `tls_cert` and `tls_key` are set (both checked by the config).
fn load_tls(config: &StreamingConfig) -> Result<Option<tokio_rustls::TlsAcceptor>> {
    use rustls_pki_types::pem::PemObject;
    use rustls_pki_types::{CertificateDer, PrivateKeyDer};
    if config.tls_cert.as_os_str().is_empty() {
        return Ok(None);
    }
    let certs = CertificateDer::pem_file_iter(&config.tls_cert)
        .and_then(|certs| certs.collect::<Result<Vec<_>, _>>())
        .with_context(|| format!("reading streaming.tls_cert {}", config.tls_cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(&config.tls_key)
        .with_context(|| format!("reading streaming.tls_key {}", config.tls_key.display()))?;
    let tls = rustls::ServerConfig::builder()
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .context("streaming.tls_cert and streaming.tls_key do not make a TLS identity")?;
    Ok(Some(tokio_rustls::TlsAcceptor::from(Arc::new(tls))))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_requests_are_checked_like_the_kubelets() {
        let ok = api::ExecRequest {
            container_id: "c".into(),
            cmd: vec!["ls".into()],
            stdout: true,
            ..Default::default()
        };
        assert!(check_exec(&ok).is_ok());
        let tty_stderr = api::ExecRequest {
            tty: true,
            stderr: true,
            ..ok.clone()
        };
        assert!(check_exec(&tty_stderr).unwrap_err().contains("tty and stderr"));
        let nothing = api::ExecRequest {
            stdout: false,
            ..ok.clone()
        };
        assert!(check_exec(&nothing).is_err());
        let no_id = api::ExecRequest {
            container_id: String::new(),
            ..ok
        };
        assert!(check_exec(&no_id).unwrap_err().contains("container_id"));
    }

    #[test]
    fn header_tokens_are_matched_case_insensitively_in_lists() {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONNECTION, HeaderValue::from_static("keep-alive, Upgrade"));
        assert!(header_has(&headers, header::CONNECTION, "upgrade"));
        assert!(!header_has(&headers, header::CONNECTION, "close"));
    }
}
