//! The OCI distribution spec's vocabulary, below everything that stores or fetches images:
//! content digests and image references. Pure values: no I/O, no state.

pub mod digest;
pub mod reference;
