//! Keeping the idle shim small (the per-pod budget is 2 MiB RSS; containerd's Go shim uses
//! ~13.5 MiB).
//!
//! Most of an idle shim's RSS is clean file pages: the binary's code and read-only data and
//! libc's, faulted in (64 KiB at a time) while starting and while serving a request, plus the
//! relocation table the dynamic loader read once. They live in the page cache, shared by every
//! shim, and the idle loop needs few of them. `trim` unmaps them from this process (MADV_DONTNEED
//! on read-only private file mappings that have no private copy of any page: such a mapping is
//! re-read from the page cache on the next access, nothing can be lost) and returns free heap to
//! the kernel. The event loop calls it once activity has settled.

use std::time::Duration;

/// How long the event loop waits after the last activity before trimming.
pub const SETTLE: Duration = Duration::from_secs(1);

pub fn trim() {
    unsafe {
        libc::malloc_trim(0);
    }
    let Ok(smaps) = std::fs::read_to_string("/proc/self/smaps") else {
        return;
    };
    for (start, end) in droppable(&smaps) {
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
}

/// Address ranges of private, readable, non-writable, file-backed mappings without anonymous (copied)
/// pages, from the text of /proc/self/smaps.
fn droppable(smaps: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, usize)> = None;
    for line in smaps.lines() {
        if let Some(range) = mapping_header(line) {
            current = range;
            continue;
        }
        if let Some(rest) = line.strip_prefix("Anonymous:") {
            if let Some(range) = current.take() {
                if rest.split_whitespace().next() == Some("0") {
                    out.push(range);
                }
            }
        }
    }
    out
}

/// For a mapping's header line: Some(Some(range)) when the mapping qualifies, Some(None) when it
/// does not; None for the other lines.
fn mapping_header(line: &str) -> Option<Option<(usize, usize)>> {
    let mut fields = line.split_whitespace();
    let range = fields.next()?;
    let (start, end) = range.split_once('-')?;
    let start = usize::from_str_radix(start, 16).ok()?;
    let end = usize::from_str_radix(end, 16).ok()?;
    let perms = fields.next()?.as_bytes();
    let _offset = fields.next()?;
    let _dev = fields.next()?;
    let inode = fields.next()?;
    if perms.len() != 4 {
        return None;
    }
    let qualifies = perms[0] == b'r' && perms[1] == b'-' && perms[3] == b'p' && inode != "0" && end > start;
    Some(qualifies.then_some((start, end)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMAPS: &str = "\
5616450f1000-561645297000 r--p 00000000 fe:00 5311428                    /usr/bin/scute-shim
Size:               1688 kB
Rss:                 448 kB
Anonymous:             0 kB
VmFlags: rd mr mw me dw sd
561645297000-56164568b000 r-xp 001a5000 fe:00 5311428                    /usr/bin/scute-shim
Rss:                 744 kB
Anonymous:             0 kB
56164568b000-5616456e9000 r--p 00598000 fe:00 5311428                    /usr/bin/scute-shim
Rss:                 376 kB
Anonymous:           376 kB
5616456e9000-5616456ed000 rw-p 005f5000 fe:00 5311428                    /usr/bin/scute-shim
Anonymous:            16 kB
56166b19d000-56166b1be000 rw-p 00000000 00:00 0                          [heap]
Anonymous:            40 kB
7f46ab4e3000-7f46ab4e5000 r-xp 00000000 00:00 0                          [vdso]
Anonymous:             0 kB
7f46ab500000-7f46ab510000 r--s 00000000 fe:00 42                         /dev/shm/x
Anonymous:             0 kB
7f46ab520000-7f46ab530000 ---p 00000000 fe:00 43                         /usr/lib/libx.so
Anonymous:             0 kB
";

    #[test]
    fn only_clean_read_only_private_file_mappings() {
        assert_eq!(
            droppable(SMAPS),
            vec![(0x5616450f1000, 0x561645297000), (0x561645297000, 0x56164568b000)]
        );
    }

    #[test]
    fn trimming_this_process_keeps_it_working() {
        let before: Vec<u8> = (0..=255).collect();
        trim();
        trim();
        let after: Vec<u8> = (0..=255).collect();
        assert_eq!(before, after);
        assert!(droppable(&std::fs::read_to_string("/proc/self/smaps").unwrap()).len() > 1);
    }
}
