//! ImageRecord → CRI `Image`, shared by ListImages and ImageStatus, and the runtime handler
//! check every image RPC makes (KEP-4216: an ImageSpec may name the runtime class's handler).

use super::{Cri, RpcError};
use crate::api;
use crate::image::record::{image_user, ImageRecord};
use crate::image::ImageManager;

impl Cri {
    /// InvalidArgument for a runtime handler scute has not configured.
    pub(super) fn check_runtime_handler(&self, rpc: &str, handler: &str) -> Result<(), RpcError> {
        if self.config.handler(handler).is_some() {
            return Ok(());
        }
        Err(RpcError::InvalidArgument(format!(
            "{rpc}: unknown runtime handler {handler:?} (configured: {:?})",
            self.config.handler_names().collect::<Vec<_>>()
        )))
    }
}

/// The image as `runtime_handler` sees it (its `spec.runtime_handler`).
pub(super) fn to_cri_image(images: &ImageManager, record: &ImageRecord, runtime_handler: &str) -> api::Image {
    let (uid, username) = image_user(&record.config.user);
    api::Image {
        id: record.id.to_string(),
        repo_tags: record.repo_tags.clone(),
        repo_digests: record.repo_digests.clone(),
        size: record.size,
        uid: uid.map(|value| api::Int64Value { value }),
        username,
        spec: Some(api::ImageSpec {
            image: record.id.to_string(),
            runtime_handler: runtime_handler.to_string(),
            ..Default::default()
        }),
        pinned: images.is_pinned(record),
    }
}
