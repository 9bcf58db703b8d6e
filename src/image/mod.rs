//! Images: references, registry hosts (mirrors), registry access, the content store, secure
//! layer unpacking, and the image records kept in the store.

pub mod hosts;
pub mod unpack;
