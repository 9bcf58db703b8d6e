//! Pushes the image or index of an OCI layout to a registry with oci-client.

use std::path::Path;

use anyhow::{anyhow, Context, Result};
use http::HeaderValue;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};

use crate::layout::{self, Descriptor, Layout, StoredImage};

pub struct PushRequest<'a> {
    pub layout: &'a Path,
    /// `HOST[:PORT]/repo/name:tag`.
    pub target: &'a str,
    /// More tags in the same repository for the same manifest.
    pub also_tags: &'a [String],
    pub plain_http: bool,
    /// Anonymous, or Basic for registries with htpasswd auth.
    pub auth: RegistryAuth,
}

/// What was pushed, for the caller to print.
pub struct Pushed {
    /// `repo:tag` references the top manifest or index went to.
    pub references: Vec<String>,
    pub digest: String,
    /// For an index: each child manifest, pushed by digest.
    pub children: Vec<Descriptor>,
}

pub async fn push(req: &PushRequest<'_>) -> Result<Pushed> {
    let target: Reference = req
        .target
        .parse()
        .with_context(|| format!("parsing reference {:?}", req.target))?;
    if target.digest().is_some() {
        return Err(anyhow!("--to {:?}: push by tag, not by digest", req.target));
    }
    let references = tag_references(&target, req.also_tags)?;
    let layout = layout::read_layout(req.layout)?;

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
    // The client sends nothing, not even anonymous requests, for a registry
    // it has no auth entry for.
    client.store_auth_if_needed(target.resolve_registry(), &req.auth).await;
    let pusher = Pusher {
        client,
        layout: req.layout,
        target,
    };

    let (top, top_bytes, children) = match &layout {
        Layout::Image(image) => {
            pusher.push_blobs(image).await?;
            (&image.desc, &image.bytes, Vec::new())
        }
        Layout::Index(index) => {
            // A registry accepts an index only once every child it lists is there.
            for child in &index.children {
                pusher.push_blobs(child).await?;
                let by_digest = pusher.target.clone_with_digest(child.desc.digest.clone());
                pusher.push_manifest(&by_digest, &child.desc, &child.bytes).await?;
            }
            let children = index.children.iter().map(|c| c.desc.clone()).collect();
            (&index.desc, &index.bytes, children)
        }
    };
    for reference in &references {
        pusher.push_manifest(reference, top, top_bytes).await?;
    }

    Ok(Pushed {
        references: references.iter().map(Reference::whole).collect(),
        digest: top.digest.clone(),
        children,
    })
}

/// The target plus one reference per extra tag, each checked by the parser.
fn tag_references(target: &Reference, also_tags: &[String]) -> Result<Vec<Reference>> {
    let mut references = vec![target.clone()];
    for tag in also_tags {
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
    Ok(references)
}

struct Pusher<'a> {
    client: Client,
    layout: &'a Path,
    /// Repository every blob and manifest goes to.
    target: Reference,
}

impl Pusher<'_> {
    /// Uploads the config and layers the registry does not have yet.
    async fn push_blobs(&self, image: &StoredImage) -> Result<()> {
        let registry = self.target.registry();
        for desc in image.blobs() {
            let exists = self
                .client
                .blob_exists(&self.target, &desc.digest)
                .await
                .with_context(|| format!("checking blob {} on {registry}", desc.digest))?;
            if exists {
                continue;
            }
            // Read whole (and checked): test and benchmark layers are a few
            // hundred MiB at most, and a monolithic push wants one piece.
            let bytes = layout::read_blob(self.layout, desc)?;
            self.client
                .push_blob(&self.target, bytes, &desc.digest)
                .await
                .with_context(|| format!("pushing blob {} to {registry}", desc.digest))?;
        }
        Ok(())
    }

    async fn push_manifest(&self, to: &Reference, desc: &Descriptor, bytes: &[u8]) -> Result<()> {
        let content_type =
            HeaderValue::from_str(&desc.media_type).with_context(|| format!("media type {:?}", desc.media_type))?;
        self.client
            .push_manifest_raw(to, bytes.to_vec(), content_type)
            .await
            .with_context(|| format!("pushing {} to {}", desc.media_type, to.whole()))?;
        Ok(())
    }
}
