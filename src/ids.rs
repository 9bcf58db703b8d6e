//! Object IDs: 64 hex digits from the kernel's CSPRNG, as containerd and CRI-O make them.

pub fn random_id() -> String {
    let mut bytes = [0u8; 32];
    // SAFETY: the buffer is valid for its length. getrandom(2) on 32 bytes does not return
    // short; it fails only for bad arguments, so an ID from a failed call would be a kernel bug.
    let n = unsafe { libc::getrandom(bytes.as_mut_ptr().cast(), bytes.len(), 0) };
    assert_eq!(n, bytes.len() as isize, "getrandom failed");
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ids_are_64_hex_and_distinct() {
        let a = super::random_id();
        assert_eq!(a.len(), 64);
        assert!(a.bytes().all(|b| b.is_ascii_hexdigit()));
        assert_ne!(a, super::random_id());
    }
}
