//! ImageRecord → CRI `Image`, shared by ListImages and ImageStatus.

use crate::api;
use crate::image::record::{image_user, ImageRecord};
use crate::image::ImageManager;

pub(super) fn to_cri_image(images: &ImageManager, record: &ImageRecord) -> api::Image {
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
            ..Default::default()
        }),
        pinned: images.is_pinned(record),
    }
}
