//! ListImages and StreamImages (the same list, paged): every image, or the one the filter names.

use tonic::codegen::BoxStream;

use super::image_convert::to_cri_image;
use super::{Cri, RpcError};
use crate::api::{self, ListImagesRequest, ListImagesResponse, StreamImagesRequest, StreamImagesResponse};
use crate::image::ImageError;

impl Cri {
    pub(super) async fn list_images(&self, request: ListImagesRequest) -> Result<ListImagesResponse, RpcError> {
        let images = self.images_listed(request.filter)?;
        Ok(ListImagesResponse { images })
    }

    pub(super) async fn stream_images(
        &self,
        request: StreamImagesRequest,
    ) -> Result<BoxStream<StreamImagesResponse>, RpcError> {
        let images = self.images_listed(request.filter)?;
        Ok(self.paged(images, |images| StreamImagesResponse { images }))
    }

    /// Every image, or the one `filter` names (none when it names no image).
    fn images_listed(&self, filter: Option<api::ImageFilter>) -> Result<Vec<api::Image>, RpcError> {
        let wanted = filter.and_then(|f| f.image).map(|i| i.image).filter(|i| !i.is_empty());
        let records = match wanted {
            Some(reference) => match self.images.resolve(&reference) {
                Ok(record) => vec![record],
                Err(ImageError::NotFound(_) | ImageError::InvalidReference(_)) => vec![],
                Err(e) => return Err(e.into()),
            },
            None => self.images.list()?,
        };
        Ok(records.iter().map(|r| to_cri_image(&self.images, r)).collect())
    }
}
