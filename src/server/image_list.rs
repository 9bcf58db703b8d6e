//! ListImages: every image, or the one the filter names.

use super::image_convert::to_cri_image;
use super::{Cri, RpcError};
use crate::api::{ListImagesRequest, ListImagesResponse};
use crate::image::ImageError;

impl Cri {
    pub(super) async fn list_images(&self, request: ListImagesRequest) -> Result<ListImagesResponse, RpcError> {
        let wanted = request
            .filter
            .and_then(|f| f.image)
            .map(|i| i.image)
            .filter(|i| !i.is_empty());
        let records = match wanted {
            Some(reference) => match self.images.resolve(&reference) {
                Ok(record) => vec![record],
                Err(ImageError::NotFound(_) | ImageError::InvalidReference(_)) => vec![],
                Err(e) => return Err(e.into()),
            },
            None => self.images.list()?,
        };
        Ok(ListImagesResponse {
            images: records.iter().map(|r| to_cri_image(&self.images, r)).collect(),
        })
    }
}
