//! PullImage: pull (through mirrors) into the content store and snapshots; answers the image ID,
//! which the kubelet records as the container's imageRef.

use std::time::Duration;

use base64::Engine as _;
use oci_client::secrets::RegistryAuth;

use super::{Cri, RpcError};
use crate::api::{AuthConfig, PullImageRequest, PullImageResponse};
use crate::image::Credentials;

impl Cri {
    pub(super) async fn pull_image(
        &self,
        request: PullImageRequest,
        deadline: Option<Duration>,
    ) -> Result<PullImageResponse, RpcError> {
        let spec = request.image.unwrap_or_default();
        let (reference, handler) = (spec.image, spec.runtime_handler);
        if reference.is_empty() {
            return Err(RpcError::InvalidArgument(
                "PullImage: image.image must name an image".into(),
            ));
        }
        check_reference("PullImage", &reference)?;
        self.check_runtime_handler("PullImage", &handler)?;
        tracing::Span::current().record("id", reference.as_str());
        let credentials = credentials(request.auth)?;
        let pull = self.images.pull(&reference, &credentials, &handler);
        let record = match deadline {
            Some(d) => tokio::time::timeout(d, pull).await.map_err(|_| {
                RpcError::DeadlineExceeded(format!(
                    "pulling {reference}: deadline of {d:?} exceeded; a retry resumes the download"
                ))
            })??,
            None => pull.await?,
        };
        Ok(PullImageResponse {
            image_ref: record.id.to_string(),
        })
    }
}

/// CRI AuthConfig → registry credentials: username/password, or `auth` (base64 user:password,
/// as in a docker config), or a registry bearer token.
/// References longer than this are refused before parsing (a name is at most 255 characters,
/// a tag 128, a digest ~100).
const MAX_REFERENCE: usize = 4096;

/// InvalidArgument for a reference no registry could serve: a NUL byte or an absurd length.
pub(super) fn check_reference(rpc: &str, reference: &str) -> Result<(), RpcError> {
    if reference.len() > MAX_REFERENCE {
        return Err(RpcError::InvalidArgument(format!(
            "{rpc}: image reference of {} bytes (at most {MAX_REFERENCE})",
            reference.len()
        )));
    }
    if reference.contains(|c: char| c.is_control()) {
        return Err(RpcError::InvalidArgument(format!(
            "{rpc}: image reference {reference:?} contains a control character"
        )));
    }
    Ok(())
}

fn credentials(auth: Option<AuthConfig>) -> Result<Credentials, RpcError> {
    let Some(auth) = auth else {
        return Ok(Credentials::default());
    };
    let server = (!auth.server_address.is_empty()).then(|| auth.server_address.clone());
    let registry_auth = if !auth.registry_token.is_empty() {
        Some(RegistryAuth::Bearer(auth.registry_token))
    } else if !auth.username.is_empty() || !auth.password.is_empty() {
        Some(RegistryAuth::Basic(auth.username, auth.password))
    } else if !auth.auth.is_empty() {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.auth.trim())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| RpcError::InvalidArgument("AuthConfig.auth is not base64 of user:password".into()))?;
        let (user, password) = decoded
            .split_once(':')
            .ok_or_else(|| RpcError::InvalidArgument("AuthConfig.auth must decode to user:password".into()))?;
        Some(RegistryAuth::Basic(user.to_string(), password.to_string()))
    } else if !auth.identity_token.is_empty() {
        return Err(RpcError::InvalidArgument(
            "AuthConfig.identity_token (an OAuth2 refresh token) is not supported yet; pass username/password or registry_token".into(),
        ));
    } else {
        None
    };
    Ok(Credentials {
        auth: registry_auth,
        server,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auth_config_forms() {
        let basic = |c: Credentials| match c.auth {
            Some(RegistryAuth::Basic(u, p)) => (u, p),
            other => panic!("{other:?}"),
        };
        let c = credentials(Some(AuthConfig {
            username: "u".into(),
            password: "p".into(),
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(basic(c), ("u".into(), "p".into()));
        let c = credentials(Some(AuthConfig {
            auth: base64::engine::general_purpose::STANDARD.encode("alice:s3:cret"),
            server_address: "https://index.docker.io/v1/".into(),
            ..Default::default()
        }))
        .unwrap();
        assert_eq!(c.server.as_deref(), Some("https://index.docker.io/v1/"));
        assert_eq!(basic(c), ("alice".into(), "s3:cret".into()));
        assert!(matches!(
            credentials(Some(AuthConfig {
                registry_token: "t".into(),
                ..Default::default()
            }))
            .unwrap()
            .auth,
            Some(RegistryAuth::Bearer(_))
        ));
        assert!(credentials(Some(AuthConfig {
            auth: "!!".into(),
            ..Default::default()
        }))
        .is_err());
        assert!(credentials(None).unwrap().auth.is_none());
    }
}
