//! The pager behind the KEP-5825 Stream* list RPCs (StreamPodSandboxes, StreamContainers,
//! StreamContainerStats, StreamPodSandboxStats, StreamImages): the objects their List*
//! counterparts return, cut into pages bounded by encoded size and count, one response message
//! per page, so a list past the gRPC message cap still arrives. An object bigger than a page goes
//! alone in its own message. An empty list sends no message: the stream just ends (the kubelet
//! reads until end of stream).

use futures_util::StreamExt as _;
use tonic::codegen::BoxStream;

use super::Cri;

/// Most bytes of objects in one response message (a quarter of the default 16 MiB cap).
pub(crate) const PAGE_BYTES: usize = 4 << 20;
/// Most objects in one response message.
pub(crate) const PAGE_ITEMS: usize = 4096;

/// Bytes `item` takes as one element of a response's `repeated` field number 1: key, length, body.
fn encoded_len_in_list<T: prost::Message>(item: &T) -> usize {
    let len = item.encoded_len();
    1 + prost::length_delimiter_len(len) + len
}

/// Splits `items` in order into pages of at most `max_bytes` (encoded, as list elements) and at
/// most `max_items` objects each; an object bigger than `max_bytes` is a page of its own. No
/// items, no pages.
pub(crate) fn pages<T: prost::Message>(items: Vec<T>, max_bytes: usize, max_items: usize) -> Vec<Vec<T>> {
    let max_items = max_items.max(1);
    let mut pages = Vec::new();
    let mut page = Vec::new();
    let mut bytes = 0;
    for item in items {
        let size = encoded_len_in_list(&item);
        if !page.is_empty() && (bytes + size > max_bytes || page.len() >= max_items) {
            pages.push(std::mem::take(&mut page));
            bytes = 0;
        }
        bytes += size;
        page.push(item);
    }
    if !page.is_empty() {
        pages.push(page);
    }
    pages
}

impl Cri {
    /// Bytes of objects per page: [`PAGE_BYTES`], less when `grpc.max_send_message_size` is so
    /// small that such a page would not fit (a quarter of it then, leaving room for one object
    /// bigger than the rest).
    fn page_bytes(&self) -> usize {
        PAGE_BYTES.min(self.config.grpc.max_send_message_size / 4).max(1)
    }

    /// `items` as a stream of responses, `wrap` making one response of each page.
    pub(super) fn paged<T, R>(&self, items: Vec<T>, wrap: fn(Vec<T>) -> R) -> BoxStream<R>
    where
        T: prost::Message + 'static,
        R: Send + 'static,
    {
        let pages = pages(items, self.page_bytes(), PAGE_ITEMS);
        futures_util::stream::iter(pages.into_iter().map(move |page| Ok(wrap(page)))).boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api;

    fn image(id: &str, tag_bytes: usize) -> api::Image {
        api::Image {
            id: id.into(),
            repo_tags: vec!["t".repeat(tag_bytes)],
            ..Default::default()
        }
    }

    fn ids(pages: &[Vec<api::Image>]) -> Vec<Vec<&str>> {
        pages
            .iter()
            .map(|p| p.iter().map(|i| i.id.as_str()).collect())
            .collect()
    }

    #[test]
    fn paging_nothing_gives_no_pages() {
        assert!(pages(Vec::<api::Image>::new(), 100, 10).is_empty());
    }

    #[test]
    fn paging_keeps_order_and_bounds_bytes() {
        let items: Vec<_> = (0..10).map(|i| image(&format!("i{i}"), 100)).collect();
        let one = encoded_len_in_list(&items[0]);
        let pages = pages(items, one * 3, 100);
        assert_eq!(
            ids(&pages),
            vec![
                vec!["i0", "i1", "i2"],
                vec!["i3", "i4", "i5"],
                vec!["i6", "i7", "i8"],
                vec!["i9"]
            ]
        );
        for page in &pages {
            // Each page fits the bound as a whole encoded response.
            let response = api::StreamImagesResponse { images: page.clone() };
            assert!(prost::Message::encoded_len(&response) <= one * 3);
        }
    }

    #[test]
    fn paging_bounds_count() {
        let items: Vec<_> = (0..5).map(|i| image(&format!("i{i}"), 1)).collect();
        let pages = pages(items, usize::MAX, 2);
        assert_eq!(ids(&pages), vec![vec!["i0", "i1"], vec!["i2", "i3"], vec!["i4"]]);
    }

    #[test]
    fn paging_sends_an_object_bigger_than_a_page_alone() {
        let items = vec![image("small", 1), image("huge", 1000), image("small2", 1)];
        let pages = pages(items, 200, 100);
        assert_eq!(ids(&pages), vec![vec!["small"], vec!["huge"], vec!["small2"]]);
        let pages = self::pages(vec![image("huge", 1000)], 200, 100);
        assert_eq!(ids(&pages), vec![vec!["huge"]]);
    }

    #[test]
    fn paging_exact_fit_and_zero_count_bound() {
        let items: Vec<_> = (0..4).map(|i| image(&format!("i{i}"), 10)).collect();
        let one = encoded_len_in_list(&items[0]);
        assert_eq!(
            ids(&pages(items.clone(), one * 2, 100)),
            vec![vec!["i0", "i1"], vec!["i2", "i3"]]
        );
        // A count bound of 0 is taken as 1: every object still goes out.
        assert_eq!(ids(&pages(items, usize::MAX, 0)).len(), 4);
    }
}
