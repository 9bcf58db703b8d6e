//! The daemon's heap. glibc's malloc keeps what a pull or a burst of pods freed: each thread
//! that allocates gets an arena of its own (up to 8 per core), and a block it frees is only
//! handed back when it sits at an arena's top. A daemon that pulled a 200 MB image four times
//! kept all of its 57.8 MiB peak 10 s later (issue 21). Here:
//!
//! - at start, before any thread: at most two arenas;
//! - every few seconds: malloc_trim(0), which also returns the free pages inside the heap
//!   (madvise), not only its top.
//!
//! With that the same pulls settle at 42.4 MiB, at the same speed (`cargo bench --bench pull`);
//! with each layer's download channel holding 8 chunks instead of 32 (image/pull.rs), 33.7 MiB
//! (peak 47.8 MiB).
//! Fixing the mmap and trim thresholds at 128 KiB as well settled at 30.0 MiB but made the pulls
//! about 18% slower (their buffers were mmapped and faulted in again each time): not taken
//! until the pull path's large allocations are found.
//!
//! No maintained crate tunes glibc's allocator; these are its documented mallopt(3) and
//! malloc_trim(3).

use std::time::Duration;

/// How often the free heap is handed back.
pub const TRIM_EVERY: Duration = Duration::from_secs(5);

const ARENA_MAX: i32 = 2;

/// Sets the allocator's limits; call before the async runtime starts its threads.
pub fn tune() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets allocator parameters; no memory is touched.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, ARENA_MAX);
    }
}

/// Hands the free heap back to the kernel every [`TRIM_EVERY`], for the daemon's life.
pub fn spawn_trimmer() {
    tokio::spawn(async {
        let mut every = tokio::time::interval(TRIM_EVERY);
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            // A few hundred microseconds on a daemon's heap, under the arenas' locks.
            let _ = tokio::task::spawn_blocking(trim).await;
        }
    });
}

/// Returns free heap pages to the kernel.
pub fn trim() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim only releases free memory the allocator owns.
    unsafe {
        libc::malloc_trim(0);
    }
}
