//! Registry host configuration in containerd's `hosts.toml` layout (containerd `docs/hosts.md`).
//!
//! An operator's existing `/etc/containerd/certs.d` keeps working unchanged: the same directory
//! lookup (`host_port_`, `host:port`, `_default`, for each root of a `:`-separated config path),
//! the same keys and defaults, the Docker certificate-file fallback (`*.crt`, `*.cert`/`*.key`)
//! when a host directory has no `hosts.toml`, and mirrors tried in file order before the server.
//!
//! Deliberate differences from containerd's `ConfigureHosts`:
//! - an unparsable `hosts.toml` (bad TOML, wrong value type, unknown capability) is an error
//!   naming the file and key; containerd logs it and silently falls back to certificate files,
//!   which would pull from the upstream the operator meant to avoid;
//! - unknown keys are ignored with a warning (containerd ignores them silently);
//! - a default localhost upstream with a port other than 443 is plain HTTP directly, where
//!   containerd first tries HTTPS (without verification) and falls back to HTTP;
//! - `http://` URLs are always plain HTTP, where containerd tries HTTPS first when the entry also
//!   has TLS settings (`ca`, `client`, `skip_verify`) and a port other than 80;
//! - `client = [["cert", ""]]` means "key in the cert file" as documented (containerd turns the
//!   empty key into the directory path); a URL path of `/` counts as no path.

use std::io::ErrorKind;
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use toml::{Table, Value};

const HOSTS_FILE: &str = "hosts.toml";
const DEFAULT_DIR: &str = "_default";
const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_API: &str = "registry-1.docker.io";
const API_PATH: &str = "/v2";

/// URL scheme of a registry endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    Http,
    Https,
}

impl Scheme {
    pub fn as_str(self) -> &'static str {
        match self {
            Scheme::Http => "http",
            Scheme::Https => "https",
        }
    }
}

/// Operations an endpoint may be trusted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capabilities {
    pub pull: bool,
    pub resolve: bool,
    pub push: bool,
}

impl Capabilities {
    pub const ALL: Capabilities = Capabilities {
        pull: true,
        resolve: true,
        push: true,
    };
}

/// One registry endpoint to try.
#[derive(Debug, Clone, PartialEq)]
pub struct HostEndpoint {
    pub scheme: Scheme,
    /// `host[:port]` as used in URLs.
    pub host: String,
    /// API path prefix: `/v2` by default; with `override_path` the configured path as is.
    pub path: String,
    pub override_path: bool,
    pub capabilities: Capabilities,
    pub skip_verify: bool,
    /// CA certificate files, resolved relative to the `hosts.toml` directory.
    pub ca: Vec<PathBuf>,
    /// Client certificate files with their key file (`None`: the key is in the cert file).
    pub client_certs: Vec<(PathBuf, Option<PathBuf>)>,
    /// Extra request headers in file order; an array value gives repeated entries.
    pub headers: Vec<(String, String)>,
    /// False for the upstream server entry.
    pub is_mirror: bool,
}

impl HostEndpoint {
    /// `scheme://host/path`, the prefix of every API URL of this endpoint.
    pub fn base_url(&self) -> String {
        format!("{}://{}{}", self.scheme.as_str(), self.host, self.path)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    #[error("reading {}: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: invalid TOML: {message}", path.display())]
    Toml { path: PathBuf, message: String },
    #[error("{}: key `{key}`: {message}", path.display())]
    Key {
        path: PathBuf,
        key: String,
        message: String,
    },
}

/// Endpoints to try, in order, for images whose reference names registry `registry`
/// (e.g. "registry.k8s.io", "docker.io", "localhost:5000"). `config_path` may hold several
/// roots separated by `:` like containerd's `config_path`; a missing root is skipped.
pub fn endpoints_for(config_path: &Path, registry: &str) -> Result<Vec<HostEndpoint>, HostsError> {
    match find_host_dir(config_path, registry)? {
        Some(dir) => load_host_dir(&dir, registry),
        None => Ok(vec![default_upstream(registry, Settings::default())]),
    }
}

/// containerd's directory name for a registry with a port: `host:port` → `host_port_`
/// (usable where `:` is not allowed in file names). Other names are returned unchanged.
pub fn registry_host_dir_name(registry: &str) -> String {
    match registry.rfind(':') {
        Some(i) if i > 0 => format!("{}_{}_", &registry[..i], &registry[i + 1..]),
        _ => registry.to_string(),
    }
}

/// The first existing host directory: per root, `host_port_`, `host:port`, then `_default`.
fn find_host_dir(config_path: &Path, registry: &str) -> Result<Option<PathBuf>, HostsError> {
    for root in std::env::split_paths(config_path.as_os_str()) {
        for dir in candidate_dirs(&root, registry) {
            if is_dir(&dir)? {
                return Ok(Some(dir));
            }
        }
    }
    Ok(None)
}

fn candidate_dirs(root: &Path, registry: &str) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    // A registry name never holds a path separator; refuse to let one walk out of the root.
    let safe = !registry.is_empty() && registry != "." && registry != ".." && !registry.contains('/');
    if safe {
        let alt = registry_host_dir_name(registry);
        if alt != registry {
            dirs.push(root.join(alt));
        }
        dirs.push(root.join(registry));
    }
    dirs.push(root.join(DEFAULT_DIR));
    dirs
}

fn is_dir(path: &Path) -> Result<bool, HostsError> {
    match std::fs::metadata(path) {
        Ok(meta) => Ok(meta.is_dir()),
        Err(e) if matches!(e.kind(), ErrorKind::NotFound | ErrorKind::NotADirectory) => Ok(false),
        Err(source) => Err(HostsError::Io {
            path: path.to_path_buf(),
            source,
        }),
    }
}

fn load_host_dir(dir: &Path, registry: &str) -> Result<Vec<HostEndpoint>, HostsError> {
    let file = dir.join(HOSTS_FILE);
    tracing::debug!(file = %file.display(), registry, "loading registry host configuration");
    match std::fs::read_to_string(&file) {
        Ok(text) if !text.is_empty() => parse_hosts_file(&file, &text, registry),
        Ok(_) => Ok(vec![default_upstream(registry, load_cert_files(dir)?)]),
        Err(e) if e.kind() == ErrorKind::NotFound => Ok(vec![default_upstream(registry, load_cert_files(dir)?)]),
        Err(source) => Err(HostsError::Io { path: file, source }),
    }
}

/// Docker's `certs.d` layout: `*.crt` are CA files, `*.cert` client certs with an optional
/// `*.key` of the same stem beside them. Files are taken in name order, as containerd does.
fn load_cert_files(dir: &Path) -> Result<Settings, HostsError> {
    let io_err = |source| HostsError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let mut names = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(io_err)? {
        let entry = entry.map_err(io_err)?;
        if entry.file_type().map_err(io_err)?.is_dir() {
            continue;
        }
        if let Ok(name) = entry.file_name().into_string() {
            names.push(name);
        }
    }
    names.sort();
    let mut settings = Settings::default();
    for name in names {
        if name.ends_with(".crt") {
            settings.ca.push(dir.join(&name));
        } else if let Some(stem) = name.strip_suffix(".cert") {
            let key = dir.join(format!("{stem}.key"));
            settings
                .client_certs
                .push((dir.join(&name), key.is_file().then_some(key)));
        }
    }
    Ok(settings)
}

/// Where parsing happens: the file (for messages) and its directory (for relative paths).
struct Ctx<'a> {
    file: &'a Path,
    dir: &'a Path,
}

impl Ctx<'_> {
    fn err(&self, key: &str, message: impl Into<String>) -> HostsError {
        HostsError::Key {
            path: self.file.to_path_buf(),
            key: key.to_string(),
            message: message.into(),
        }
    }

    fn type_err(&self, key: &str, expected: &str, value: &Value) -> HostsError {
        self.err(key, format!("expected {expected}, found {}", value.type_str()))
    }

    fn string<'v>(&self, key: &str, value: &'v Value) -> Result<&'v str, HostsError> {
        value.as_str().ok_or_else(|| self.type_err(key, "a string", value))
    }

    fn boolean(&self, key: &str, value: &Value) -> Result<bool, HostsError> {
        value.as_bool().ok_or_else(|| self.type_err(key, "a boolean", value))
    }

    fn table<'v>(&self, key: &str, value: &'v Value) -> Result<&'v Table, HostsError> {
        value.as_table().ok_or_else(|| self.type_err(key, "a table", value))
    }

    fn strings<'v>(&self, key: &str, value: &'v Value) -> Result<Vec<&'v str>, HostsError> {
        let expected = "an array of strings";
        let array = value.as_array().ok_or_else(|| self.type_err(key, expected, value))?;
        array
            .iter()
            .map(|v| v.as_str().ok_or_else(|| self.type_err(key, expected, v)))
            .collect()
    }

    /// Paths may be absolute or relative to the `hosts.toml` directory.
    fn path(&self, p: &str) -> PathBuf {
        self.dir.join(p)
    }
}

/// Settings shared by the server (top level) and each `[host."<url>"]` table.
#[derive(Default)]
struct Settings {
    capabilities: Option<Capabilities>,
    skip_verify: Option<bool>,
    ca: Vec<PathBuf>,
    client_certs: Vec<(PathBuf, Option<PathBuf>)>,
    headers: Vec<(String, String)>,
    override_path: bool,
}

impl Settings {
    /// Applies one key; `key_path` is the key's full name for messages. Keys match
    /// case-insensitively, as go-toml's struct decoding does.
    fn apply(&mut self, ctx: &Ctx, key_path: &str, key: &str, value: &Value) -> Result<(), HostsError> {
        match key.to_ascii_lowercase().as_str() {
            "capabilities" => self.capabilities = Some(parse_capabilities(ctx, key_path, value)?),
            "skip_verify" => self.skip_verify = Some(ctx.boolean(key_path, value)?),
            "ca" => self.ca = parse_ca(ctx, key_path, value)?,
            "client" => self.client_certs = parse_client(ctx, key_path, value)?,
            "header" => self.headers = parse_headers(ctx, key_path, value)?,
            "override_path" => self.override_path = ctx.boolean(key_path, value)?,
            "dial_timeout" => {
                ctx.string(key_path, value)?;
                tracing::debug!(file = %ctx.file.display(), key = key_path, "dial_timeout is not supported; ignored");
            }
            _ => {
                tracing::warn!(file = %ctx.file.display(), key = key_path, "ignoring unknown key in hosts.toml")
            }
        }
        Ok(())
    }

    fn into_endpoint(self, scheme: Scheme, host: String, path: String, is_mirror: bool) -> HostEndpoint {
        HostEndpoint {
            scheme,
            host,
            path,
            override_path: self.override_path,
            capabilities: self.capabilities.unwrap_or(Capabilities::ALL),
            skip_verify: self.skip_verify.unwrap_or(false),
            ca: self.ca,
            client_certs: self.client_certs,
            headers: self.headers,
            is_mirror,
        }
    }
}

/// An empty list means all capabilities, as in containerd.
fn parse_capabilities(ctx: &Ctx, key: &str, value: &Value) -> Result<Capabilities, HostsError> {
    let names = ctx.strings(key, value)?;
    if names.is_empty() {
        return Ok(Capabilities::ALL);
    }
    let mut caps = Capabilities::default();
    for name in names {
        match name.to_ascii_lowercase().as_str() {
            "pull" => caps.pull = true,
            "resolve" => caps.resolve = true,
            "push" => caps.push = true,
            _ => {
                return Err(ctx.err(
                    key,
                    format!("unknown capability {name:?} (expected pull, resolve, push)"),
                ))
            }
        }
    }
    Ok(caps)
}

/// `ca`: a path or an array of paths.
fn parse_ca(ctx: &Ctx, key: &str, value: &Value) -> Result<Vec<PathBuf>, HostsError> {
    match value {
        Value::String(p) => Ok(vec![ctx.path(p)]),
        Value::Array(_) => Ok(ctx.strings(key, value)?.into_iter().map(|p| ctx.path(p)).collect()),
        _ => Err(ctx.type_err(key, "a string or an array of strings", value)),
    }
}

/// `client`: a path, an array of paths, or an array of `[cert, key]` pairs (`""` key: none).
fn parse_client(ctx: &Ctx, key: &str, value: &Value) -> Result<Vec<(PathBuf, Option<PathBuf>)>, HostsError> {
    let expected = "a string, an array of strings or an array of [cert, key] pairs";
    let items = match value {
        Value::String(_) => std::slice::from_ref(value),
        Value::Array(items) => items.as_slice(),
        _ => return Err(ctx.type_err(key, expected, value)),
    };
    items
        .iter()
        .map(|item| match item {
            Value::String(cert) => Ok((ctx.path(cert), None)),
            Value::Array(_) => match ctx.strings(key, item)?.as_slice() {
                [cert, key_file] => Ok((ctx.path(cert), (!key_file.is_empty()).then(|| ctx.path(key_file)))),
                _ => Err(ctx.err(key, "a client pair must hold exactly [cert, key]")),
            },
            _ => Err(ctx.type_err(key, expected, item)),
        })
        .collect()
}

/// `[header]`: each value a string or an array of strings (repeated header).
fn parse_headers(ctx: &Ctx, key: &str, value: &Value) -> Result<Vec<(String, String)>, HostsError> {
    let mut headers = Vec::new();
    for (name, v) in ctx.table(key, value)? {
        let key_path = format!("{key}.{name}");
        let values = match v {
            Value::String(s) => vec![s.as_str()],
            Value::Array(_) => ctx.strings(&key_path, v)?,
            _ => return Err(ctx.type_err(&key_path, "a string or an array of strings", v)),
        };
        headers.extend(values.into_iter().map(|s| (name.clone(), s.to_string())));
    }
    Ok(headers)
}

pub(crate) fn parse_hosts_file(file: &Path, text: &str, registry: &str) -> Result<Vec<HostEndpoint>, HostsError> {
    let table: Table = text.parse().map_err(|e: toml::de::Error| HostsError::Toml {
        path: file.to_path_buf(),
        message: e.to_string(),
    })?;
    let ctx = Ctx {
        file,
        dir: file.parent().unwrap_or(Path::new("")),
    };
    let mut server = None;
    let mut endpoints = Vec::new();
    let mut settings = Settings::default();
    for (key, value) in &table {
        match key.to_ascii_lowercase().as_str() {
            "server" => server = Some(ctx.string(key, value)?),
            "host" => endpoints = parse_mirrors(&ctx, key, value)?,
            _ => settings.apply(&ctx, key, key, value)?,
        }
    }
    let upstream = match server.filter(|s| !s.is_empty()) {
        Some(url) => url_endpoint(&ctx, "server", url, settings, false)?,
        None => default_upstream(registry, settings),
    };
    endpoints.push(upstream);
    Ok(endpoints)
}

/// `[host."<url>"]` tables, in file order.
fn parse_mirrors(ctx: &Ctx, key: &str, value: &Value) -> Result<Vec<HostEndpoint>, HostsError> {
    let mut mirrors = Vec::new();
    for (url, host_value) in ctx.table(key, value)? {
        let host_key = format!("{key}.{url:?}");
        let mut settings = Settings::default();
        for (k, v) in ctx.table(&host_key, host_value)? {
            settings.apply(ctx, &format!("{host_key}.{k}"), k, v)?;
        }
        mirrors.push(url_endpoint(ctx, &host_key, url, settings, true)?);
    }
    Ok(mirrors)
}

fn url_endpoint(
    ctx: &Ctx,
    key: &str,
    url: &str,
    settings: Settings,
    is_mirror: bool,
) -> Result<HostEndpoint, HostsError> {
    let (scheme, host, path) = split_url(url).map_err(|message| ctx.err(key, message))?;
    let path = api_path(&path, settings.override_path);
    Ok(settings.into_endpoint(scheme, host, path, is_mirror))
}

/// `[scheme://][user@]host[:port][/path][?query][#fragment]` → (scheme, host, cleaned path).
/// No scheme means https, as in containerd.
fn split_url(url: &str) -> Result<(Scheme, String, String), String> {
    let (scheme, rest) = match url.split_once("://") {
        Some((s, rest)) => match s.to_ascii_lowercase().as_str() {
            "http" => (Scheme::Http, rest),
            "https" => (Scheme::Https, rest),
            _ => {
                return Err(format!(
                    "unsupported scheme {s:?} in URL {url:?} (expected http or https)"
                ))
            }
        },
        None => (Scheme::Https, url),
    };
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    let (authority, path) = rest.find('/').map_or((rest, ""), |i| rest.split_at(i));
    let host = authority.rsplit('@').next().unwrap_or_default();
    if host.is_empty() {
        return Err(format!("no host in URL {url:?}"));
    }
    Ok((scheme, host.to_string(), clean_path(path)))
}

/// Like Go's `path.Clean`, except that an empty or root path becomes "" (no path).
fn clean_path(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    parts.iter().map(|p| format!("/{p}")).collect()
}

/// No path → `/v2`; a path → `<path>/v2` unless it already ends in `/v2`; with `override_path`
/// the path as is.
fn api_path(path: &str, override_path: bool) -> String {
    if override_path || path.ends_with(API_PATH) {
        path.to_string()
    } else {
        format!("{path}{API_PATH}")
    }
}

/// The registry itself, used when no `server` is configured. The file's top-level TLS and header
/// settings still apply; capabilities and path are the defaults, as in containerd.
fn default_upstream(registry: &str, mut settings: Settings) -> HostEndpoint {
    let (host, port) = split_host_port(registry);
    let scheme = if registry == DOCKER_HUB {
        Scheme::Https
    } else if is_localhost(host) {
        localhost_scheme(port, &mut settings)
    } else {
        Scheme::Https
    };
    let host = if registry == DOCKER_HUB {
        DOCKER_HUB_API
    } else {
        registry
    };
    settings.capabilities = None;
    settings.override_path = false;
    settings.into_endpoint(scheme, host.to_string(), API_PATH.to_string(), false)
}

/// containerd: no port or 443 → https without verification; 80 → http; any other port →
/// https first, falling back to http. We pick http directly for other ports, which is what a
/// local development registry (`localhost:5000`) serves.
fn localhost_scheme(port: Option<&str>, settings: &mut Settings) -> Scheme {
    match port {
        None | Some("443") => {
            settings.skip_verify = Some(true);
            Scheme::Https
        }
        Some(_) => Scheme::Http,
    }
}

/// `host:port`, `[v6]:port` → (host, port); anything else → (whole, None).
fn split_host_port(registry: &str) -> (&str, Option<&str>) {
    if let Some(rest) = registry.strip_prefix('[') {
        if let Some((host, after)) = rest.split_once(']') {
            return (host, after.strip_prefix(':'));
        }
    }
    match registry.split_once(':') {
        Some((host, port)) if !port.contains(':') => (host, Some(port)),
        _ => (registry, None),
    }
}

/// `localhost` or a loopback address (127.0.0.0/8, ::1), as containerd's `IsLocalhost`.
fn is_localhost(host: &str) -> bool {
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(root: &Path, dir: &str, text: &str) -> PathBuf {
        let d = root.join(dir);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join(HOSTS_FILE), text).unwrap();
        d
    }

    fn only(eps: Vec<HostEndpoint>) -> HostEndpoint {
        assert_eq!(eps.len(), 1, "{eps:?}");
        eps.into_iter().next().unwrap()
    }

    fn caps(pull: bool, resolve: bool, push: bool) -> Capabilities {
        Capabilities { pull, resolve, push }
    }

    #[test]
    fn no_config_dir_gives_default_upstream() {
        let tmp = tempfile::tempdir().unwrap();
        let ep = only(endpoints_for(&tmp.path().join("missing"), "registry.k8s.io").unwrap());
        assert_eq!(ep.scheme, Scheme::Https);
        assert_eq!(ep.host, "registry.k8s.io");
        assert_eq!(ep.path, "/v2");
        assert_eq!(ep.capabilities, Capabilities::ALL);
        assert!(!ep.is_mirror && !ep.skip_verify && !ep.override_path);
        assert_eq!(ep.base_url(), "https://registry.k8s.io/v2");
    }

    #[test]
    fn docker_io_default_server() {
        let tmp = tempfile::tempdir().unwrap();
        let ep = only(endpoints_for(tmp.path(), "docker.io").unwrap());
        assert_eq!(ep.base_url(), "https://registry-1.docker.io/v2");
    }

    #[test]
    fn localhost_defaults() {
        let tmp = tempfile::tempdir().unwrap();
        let ep = only(endpoints_for(tmp.path(), "localhost:5000").unwrap());
        assert_eq!(ep.base_url(), "http://localhost:5000/v2");
        let ep = only(endpoints_for(tmp.path(), "127.0.0.1:5000").unwrap());
        assert_eq!(ep.scheme, Scheme::Http);
        let ep = only(endpoints_for(tmp.path(), "[::1]:5000").unwrap());
        assert_eq!(ep.base_url(), "http://[::1]:5000/v2");
        let ep = only(endpoints_for(tmp.path(), "localhost").unwrap());
        assert_eq!((ep.scheme, ep.skip_verify), (Scheme::Https, true));
        let ep = only(endpoints_for(tmp.path(), "localhost.example.com:5000").unwrap());
        assert_eq!(ep.scheme, Scheme::Https);
    }

    #[test]
    fn server_and_mirrors_in_file_order() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = write(
            tmp.path(),
            "docker.io",
            r#"
server = "https://registry-1.docker.io"

[host."https://zz-mirror.example.com"]
  capabilities = ["pull"]
  skip_verify = true
  [host."https://zz-mirror.example.com".header]
    x-custom = ["a", "b"]
    x-single = "c"

[host."http://aa-mirror.internal:5000"]
  capabilities = ["pull", "resolve"]
  ca = "mirror.crt"
  client = [["client.cert", "client.key"], ["/abs/both.pem", ""]]

[host."https://raw.example.com/v2/upstream"]
  override_path = true
"#,
        );
        let eps = endpoints_for(tmp.path(), "docker.io").unwrap();
        assert_eq!(eps.len(), 4);

        assert_eq!(eps[0].base_url(), "https://zz-mirror.example.com/v2");
        assert_eq!(eps[0].capabilities, caps(true, false, false));
        assert!(eps[0].skip_verify && eps[0].is_mirror);
        let headers =
            [("x-custom", "a"), ("x-custom", "b"), ("x-single", "c")].map(|(k, v)| (k.to_string(), v.to_string()));
        assert_eq!(eps[0].headers, headers);

        assert_eq!(eps[1].base_url(), "http://aa-mirror.internal:5000/v2");
        assert_eq!(eps[1].capabilities, caps(true, true, false));
        assert!(!eps[1].skip_verify);
        assert_eq!(eps[1].ca, vec![dir.join("mirror.crt")]);
        assert_eq!(
            eps[1].client_certs,
            vec![
                (dir.join("client.cert"), Some(dir.join("client.key"))),
                (PathBuf::from("/abs/both.pem"), None),
            ]
        );

        assert_eq!(eps[2].base_url(), "https://raw.example.com/v2/upstream");
        assert!(eps[2].override_path);
        assert_eq!(eps[2].capabilities, Capabilities::ALL);

        assert_eq!(eps[3].base_url(), "https://registry-1.docker.io/v2");
        assert_eq!(eps[3].capabilities, Capabilities::ALL);
        assert!(!eps[3].is_mirror);
    }

    #[test]
    fn default_dir_fallback() {
        let tmp = tempfile::tempdir().unwrap();
        write(
            tmp.path(),
            "_default",
            "[host.\"https://registry.example.com\"]\ncapabilities = [\"pull\", \"resolve\"]\n",
        );
        write(tmp.path(), "quay.io", "server = \"https://quay.example.com\"\n");
        let eps = endpoints_for(tmp.path(), "ghcr.io").unwrap();
        assert_eq!(eps.len(), 2);
        assert_eq!(eps[0].base_url(), "https://registry.example.com/v2");
        assert_eq!(eps[1].base_url(), "https://ghcr.io/v2");
        let ep = only(endpoints_for(tmp.path(), "quay.io").unwrap());
        assert_eq!(ep.base_url(), "https://quay.example.com/v2");
    }

    #[test]
    fn port_directory_names() {
        assert_eq!(registry_host_dir_name("myregistry.io:5000"), "myregistry.io_5000_");
        assert_eq!(registry_host_dir_name("registry.k8s.io"), "registry.k8s.io");
        let tmp = tempfile::tempdir().unwrap();
        write(tmp.path(), "myregistry.io:5000", "server = \"https://colon.example\"\n");
        let ep = only(endpoints_for(tmp.path(), "myregistry.io:5000").unwrap());
        assert_eq!(ep.host, "colon.example");
        write(
            tmp.path(),
            "myregistry.io_5000_",
            "server = \"https://underscore.example\"\n",
        );
        let ep = only(endpoints_for(tmp.path(), "myregistry.io:5000").unwrap());
        assert_eq!(ep.host, "underscore.example");
    }

    #[test]
    fn multiple_roots() {
        let tmp = tempfile::tempdir().unwrap();
        let (a, b) = (tmp.path().join("a"), tmp.path().join("b"));
        write(&b, "quay.io", "server = \"https://b.example\"\n");
        let joined = std::env::join_paths([&a, &b]).unwrap();
        let ep = only(endpoints_for(Path::new(&joined), "quay.io").unwrap());
        assert_eq!(ep.host, "b.example");
    }

    #[test]
    fn mirror_urls_with_paths() {
        let tmp = tempfile::tempdir().unwrap();
        write(
            tmp.path(),
            "registry.k8s.io",
            r#"
[host."https://mirror.example.com/k8s"]
[host."mirror2.example.com:8443/prefix/v2/"]
[host."https://mirror3.example.com/"]
[host."https://mirror4.example.com/a/./b/../c"]
"#,
        );
        let eps = endpoints_for(tmp.path(), "registry.k8s.io").unwrap();
        let urls: Vec<_> = eps.iter().map(HostEndpoint::base_url).collect();
        assert_eq!(
            urls,
            [
                "https://mirror.example.com/k8s/v2",
                "https://mirror2.example.com:8443/prefix/v2",
                "https://mirror3.example.com/v2",
                "https://mirror4.example.com/a/c/v2",
                "https://registry.k8s.io/v2",
            ]
        );
    }

    #[test]
    fn bad_toml_names_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = write(tmp.path(), "docker.io", "server = \n[host.\n");
        let err = endpoints_for(tmp.path(), "docker.io").unwrap_err();
        assert!(matches!(err, HostsError::Toml { .. }), "{err:?}");
        assert!(
            err.to_string().contains(&dir.join(HOSTS_FILE).display().to_string()),
            "{err}"
        );
    }

    #[test]
    fn wrong_type_names_key() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = write(
            tmp.path(),
            "docker.io",
            "[host.\"https://m.example\"]\ncapabilities = \"pull\"\n",
        );
        let err = endpoints_for(tmp.path(), "docker.io").unwrap_err().to_string();
        assert!(err.contains(&dir.join(HOSTS_FILE).display().to_string()), "{err}");
        assert!(err.contains(r#"host."https://m.example".capabilities"#), "{err}");

        write(tmp.path(), "quay.io", "skip_verify = \"yes\"\n");
        let err = endpoints_for(tmp.path(), "quay.io").unwrap_err().to_string();
        assert!(err.contains("`skip_verify`"), "{err}");

        write(tmp.path(), "ghcr.io", "capabilities = [\"pull\", \"fly\"]\n");
        let err = endpoints_for(tmp.path(), "ghcr.io").unwrap_err().to_string();
        assert!(err.contains("fly"), "{err}");

        write(tmp.path(), "gcr.io", "server = \"ftp://x\"\n");
        let err = endpoints_for(tmp.path(), "gcr.io").unwrap_err().to_string();
        assert!(err.contains("`server`"), "{err}");
    }

    #[test]
    fn unknown_keys_ignored() {
        let tmp = tempfile::tempdir().unwrap();
        write(
            tmp.path(),
            "docker.io",
            "flavour = 1\ndial_timeout = \"1s\"\n[host.\"https://m.example\"]\nsomething = true\n",
        );
        let eps = endpoints_for(tmp.path(), "docker.io").unwrap();
        assert_eq!(eps.len(), 2);
    }

    #[test]
    fn top_level_settings_apply_to_default_upstream() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = write(
            tmp.path(),
            "registry.internal",
            "ca = [\"ca.pem\"]\ncapabilities = [\"pull\"]\n[header]\nx-a = \"1\"\n",
        );
        let ep = only(endpoints_for(tmp.path(), "registry.internal").unwrap());
        assert_eq!(ep.ca, vec![dir.join("ca.pem")]);
        assert_eq!(ep.headers, vec![("x-a".to_string(), "1".to_string())]);
        // As in containerd, the defaulted upstream keeps all capabilities.
        assert_eq!(ep.capabilities, Capabilities::ALL);
    }

    #[test]
    fn docker_cert_files_fallback() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().join("registry.internal:5000");
        std::fs::create_dir_all(&dir).unwrap();
        for f in ["ca.crt", "client.cert", "client.key", "other.cert", "readme.txt"] {
            std::fs::write(dir.join(f), "x").unwrap();
        }
        write(tmp.path(), "_default", "server = \"https://never.example\"\n");
        let ep = only(endpoints_for(tmp.path(), "registry.internal:5000").unwrap());
        assert_eq!(ep.base_url(), "https://registry.internal:5000/v2");
        assert_eq!(ep.ca, vec![dir.join("ca.crt")]);
        assert_eq!(
            ep.client_certs,
            vec![
                (dir.join("client.cert"), Some(dir.join("client.key"))),
                (dir.join("other.cert"), None)
            ]
        );
    }

    #[test]
    fn containerd_docs_example_parses() {
        let tmp = tempfile::tempdir().unwrap();
        write(
            tmp.path(),
            "docker.io",
            r#"
server = "https://registry-1.docker.io"    # Exclude this to not use upstream

[host."https://mirror.registry"]
  capabilities = ["pull"]
  ca = "/etc/certs/mirror.pem"
  skip_verify = false
  [host."https://mirror.registry".header]
    x-custom-2 = ["value1", "value2"]

[host."https://mirror-bak.registry/us"]
  capabilities = ["pull"]
  skip_verify = true

[host."http://mirror.registry"]
  capabilities = ["pull"]

[host."https://test-1.registry"]
  capabilities = ["pull", "resolve", "push"]
  ca = ["/etc/certs/test-1-ca.pem", "/etc/certs/special.pem"]
  client = [["/etc/certs/client.cert", "/etc/certs/client.key"],["/etc/certs/client.pem", ""]]

[host."https://test-2.registry"]
  client = "/etc/certs/client.pem"

[host."https://test-3.registry"]
  client = ["/etc/certs/client-1.pem", "/etc/certs/client-2.pem"]

[host."https://non-compliant-mirror.registry/v2/upstream"]
  capabilities = ["pull"]
  override_path = true
"#,
        );
        let eps = endpoints_for(tmp.path(), "docker.io").unwrap();
        let urls: Vec<_> = eps.iter().map(HostEndpoint::base_url).collect();
        assert_eq!(
            urls,
            [
                "https://mirror.registry/v2",
                "https://mirror-bak.registry/us/v2",
                "http://mirror.registry/v2",
                "https://test-1.registry/v2",
                "https://test-2.registry/v2",
                "https://test-3.registry/v2",
                "https://non-compliant-mirror.registry/v2/upstream",
                "https://registry-1.docker.io/v2",
            ]
        );
        assert_eq!(eps[0].headers.len(), 2);
        assert_eq!(eps[3].ca.len(), 2);
        assert_eq!(eps[3].client_certs[1], (PathBuf::from("/etc/certs/client.pem"), None));
        assert_eq!(
            eps[4].client_certs,
            vec![(PathBuf::from("/etc/certs/client.pem"), None)]
        );
        assert_eq!(eps[5].client_certs.len(), 2);
        assert!(eps.iter().take(7).all(|e| e.is_mirror));
    }
}
