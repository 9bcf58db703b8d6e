//! Pushes the image of an OCI layout to a registry with oci-client.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use crate::image::{self, MEDIA_TYPE_MANIFEST};

pub struct PushRequest<'a> {
    pub layout: &'a Path,
    /// `HOST[:PORT]/repo/name:tag`.
    pub target: &'a str,
    /// More tags in the same repository for the same manifest.
    pub also_tags: &'a [String],
    pub plain_http: bool,
}

/// What was pushed: `repo:tag@digest` lines for the caller to print.
pub struct Pushed {
    pub references: Vec<String>,
    pub manifest_digest: String,
}

pub async fn push(req: &PushRequest<'_>) -> Result<Pushed> {
    let target: Reference = req
        .target
        .parse()
        .with_context(|| format!("parsing reference {:?}", req.target))?;
    if target.digest().is_some() {
        return Err(anyhow!("--to {:?}: push by tag, not by digest", req.target));
    }
    let mut references = vec![target.clone()];
    for tag in req.also_tags {
        let tagged = Reference::with_tag(
            target.registry().to_string(),
            target.repository().to_string(),
            tag.clone(),
        );
        // Round-trip through the parser so a malformed tag is rejected here.
        let tagged: Reference = tagged
            .whole()
            .parse()
            .with_context(|| format!("--also-tag {tag:?} is not a valid tag"))?;
        references.push(tagged);
    }

    let layout = image::read_layout(req.layout)?;
    let client = Client::new(ClientConfig {
        protocol: if req.plain_http {
            ClientProtocol::Http
        } else {
            ClientProtocol::Https
        },
        // One PUT per blob: the simplest flow every registry implements.
        use_monolithic_push: true,
        ..Default::default()
    });
    // Test registries are anonymous; the client needs an entry to use at all.
    client
        .store_auth_if_needed(target.resolve_registry(), &RegistryAuth::Anonymous)
        .await;

    let manifest = &layout.manifest;
    for desc in manifest
        .layers
        .iter()
        .chain(std::iter::once(&manifest.config))
    {
        let exists = client
            .blob_exists(&target, &desc.digest)
            .await
            .with_context(|| format!("checking blob {} on {}", desc.digest, target.registry()))?;
        if exists {
            continue;
        }
        // Images built here are a few MiB: reading a blob whole is fine.
        let bytes = image::read_blob(req.layout, desc)?;
        client
            .push_blob(&target, bytes, &desc.digest)
            .await
            .with_context(|| format!("pushing blob {} to {}", desc.digest, target.whole()))?;
    }

    let content_type = http::HeaderValue::from_static(MEDIA_TYPE_MANIFEST);
    for reference in &references {
        client
            .push_manifest_raw(
                reference,
                layout.manifest_bytes.clone(),
                content_type.clone(),
            )
            .await
            .with_context(|| format!("pushing manifest to {}", reference.whole()))?;
    }

    Ok(Pushed {
        references: references.iter().map(Reference::whole).collect(),
        manifest_digest: image::sha256_digest(&layout.manifest_bytes),
    })
}
