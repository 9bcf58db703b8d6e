//! One-time URLs: Exec, Attach and PortForward park their request here under a random token; the
//! client's connection to `/<kind>/<token>` takes it out again (once). Tokens expire, and the
//! cache is bounded, like the kubelet's streaming request cache.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use base64::Engine;

use crate::api;

/// Requests waiting for their client, at most (the kubelet's figure).
pub const MAX_PENDING: usize = 1000;
/// Random bytes per token (the kubelet uses 8; more costs nothing).
const TOKEN_BYTES: usize = 18;

/// A request waiting for its client, already checked by its RPC.
#[derive(Debug, Clone)]
pub enum Pending {
    Exec(api::ExecRequest),
    Attach(api::AttachRequest),
    PortForward(api::PortForwardRequest),
}

impl Pending {
    /// The URL path segment for this kind of request.
    pub fn kind(&self) -> &'static str {
        match self {
            Pending::Exec(_) => "exec",
            Pending::Attach(_) => "attach",
            Pending::PortForward(_) => "portforward",
        }
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum TokenError {
    #[error("too many streaming requests are waiting for their client ({MAX_PENDING}); retry later")]
    Full,
    #[error("no randomness for a token: {0}")]
    Random(String),
}

pub struct TokenCache {
    ttl: Duration,
    pending: Mutex<HashMap<String, (Pending, Instant)>>,
}

impl TokenCache {
    pub fn new(ttl: Duration) -> Self {
        TokenCache {
            ttl,
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// Parks `request` and returns its token.
    pub fn insert(&self, request: Pending) -> Result<String, TokenError> {
        let mut bytes = [0u8; TOKEN_BYTES];
        getrandom::getrandom(&mut bytes).map_err(|e| TokenError::Random(e.to_string()))?;
        let token = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes);
        let now = Instant::now();
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.retain(|_, (_, expires)| *expires > now);
        if pending.len() >= MAX_PENDING {
            return Err(TokenError::Full);
        }
        pending.insert(token.clone(), (request, now + self.ttl));
        Ok(token)
    }

    /// Takes the request of `token` if it is there and not expired; a token works once.
    pub fn consume(&self, token: &str) -> Option<Pending> {
        let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
        let (request, expires) = pending.remove(token)?;
        (expires > Instant::now()).then_some(request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exec(id: &str) -> Pending {
        Pending::Exec(api::ExecRequest {
            container_id: id.into(),
            ..Default::default()
        })
    }

    #[test]
    fn a_token_works_once() {
        let cache = TokenCache::new(Duration::from_secs(60));
        let token = cache.insert(exec("a")).unwrap();
        assert!(matches!(cache.consume(&token), Some(Pending::Exec(r)) if r.container_id == "a"));
        assert!(cache.consume(&token).is_none());
        assert!(cache.consume("not-a-token").is_none());
    }

    #[test]
    fn tokens_are_random_and_url_safe() {
        let cache = TokenCache::new(Duration::from_secs(60));
        let a = cache.insert(exec("a")).unwrap();
        let b = cache.insert(exec("a")).unwrap();
        assert_ne!(a, b);
        assert_eq!(a.len(), 24);
        assert!(
            a.bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_'),
            "{a}"
        );
    }

    #[test]
    fn expired_tokens_are_refused() {
        let cache = TokenCache::new(Duration::from_millis(1));
        let token = cache.insert(exec("a")).unwrap();
        std::thread::sleep(Duration::from_millis(5));
        assert!(cache.consume(&token).is_none());
    }

    #[test]
    fn the_cache_is_bounded() {
        let cache = TokenCache::new(Duration::from_secs(60));
        for _ in 0..MAX_PENDING {
            cache.insert(exec("a")).unwrap();
        }
        assert_eq!(cache.insert(exec("a")), Err(TokenError::Full));
    }
}
