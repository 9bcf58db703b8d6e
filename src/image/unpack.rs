//! Secure layer unpacking into overlay snapshots. Being written.
