//! ImageStatus: an absent image is not an error; CRI wants `image` unset.

use std::collections::HashMap;

use super::image_convert::to_cri_image;
use super::{Cri, RpcError};
use crate::api::{ImageStatusRequest, ImageStatusResponse};
use crate::image::ImageError;

impl Cri {
    pub(super) async fn image_status(&self, request: ImageStatusRequest) -> Result<ImageStatusResponse, RpcError> {
        let spec = request.image.unwrap_or_default();
        let (reference, handler) = (spec.image, spec.runtime_handler);
        if reference.is_empty() {
            return Err(RpcError::InvalidArgument(
                "ImageStatus: image.image must name an image".into(),
            ));
        }
        super::image_pull::check_reference("ImageStatus", &reference)?;
        self.check_runtime_handler("ImageStatus", &handler)?;
        tracing::Span::current().record("id", reference.as_str());
        let record = match self.images.resolve(&reference) {
            Ok(record) => record,
            Err(ImageError::NotFound(_)) => return Ok(ImageStatusResponse::default()),
            Err(e) => return Err(e.into()),
        };
        if !handler.is_empty() && !record.handlers().contains(&handler) {
            // One snapshotter: an image pulled for any handler is there for every handler. The
            // kubelet will not pull it for this one, so this handler's claim is recorded now.
            self.images.claim(&record.id, &handler).await?;
        }
        let mut info = HashMap::new();
        if request.verbose {
            // The whole image config as pulled, plus where its layers live (as containerd's
            // verbose "info" does with imageSpec and chainID).
            let config: serde_json::Value = self
                .images
                .content()
                .read(&record.id)
                .ok()
                .and_then(|b| serde_json::from_slice(&b).ok())
                .unwrap_or_default();
            let detail = serde_json::json!({
                "imageSpec": config,
                "chainID": record.top_chain_id().map(|c| c.to_string()),
                "manifestDigest": record.manifest_digest.to_string(),
                "manifestMediaType": record.manifest_media_type,
                "indexDigest": record.index_digest.as_ref().map(|d| d.to_string()),
                "layers": record.layers.iter().map(|l| serde_json::json!({
                    "digest": l.digest.to_string(), "diffID": l.diff_id.to_string(),
                    "chainID": l.chain_id.to_string(), "size": l.size, "mediaType": l.media_type,
                })).collect::<Vec<_>>(),
            });
            info.insert("info".to_string(), detail.to_string());
        }
        Ok(ImageStatusResponse {
            image: Some(to_cri_image(&self.images, &record, &handler)),
            info,
        })
    }
}
