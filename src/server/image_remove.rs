//! RemoveImage: by ID, tag or digest; removes the image with all its names (for a named runtime
//! handler, that handler's claim: see `ImageManager::remove`). Unknown images succeed (the
//! kubelet retries removals).

use super::{Cri, RpcError};
use crate::api::{RemoveImageRequest, RemoveImageResponse};

impl Cri {
    pub(super) async fn remove_image(&self, request: RemoveImageRequest) -> Result<RemoveImageResponse, RpcError> {
        let spec = request.image.unwrap_or_default();
        let (reference, handler) = (spec.image, spec.runtime_handler);
        if reference.is_empty() {
            return Err(RpcError::InvalidArgument(
                "RemoveImage: image.image must name an image".into(),
            ));
        }
        self.check_runtime_handler("RemoveImage", &handler)?;
        tracing::Span::current().record("id", reference.as_str());
        self.images.remove(&reference, &handler).await?;
        Ok(RemoveImageResponse {})
    }
}
