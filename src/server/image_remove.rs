//! RemoveImage: by ID, tag or digest; removes the image with all its names. Unknown images
//! succeed (the kubelet retries removals).

use super::{Cri, RpcError};
use crate::api::{RemoveImageRequest, RemoveImageResponse};

impl Cri {
    pub(super) async fn remove_image(&self, request: RemoveImageRequest) -> Result<RemoveImageResponse, RpcError> {
        let reference = request.image.map(|i| i.image).unwrap_or_default();
        if reference.is_empty() {
            return Err(RpcError::InvalidArgument(
                "RemoveImage: image.image must name an image".into(),
            ));
        }
        tracing::Span::current().record("id", reference.as_str());
        self.images.remove(&reference).await?;
        Ok(RemoveImageResponse {})
    }
}
