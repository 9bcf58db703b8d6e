//! Pulls in flight as an operator watches them: bytes and layers done of the total, rate and
//! phase, logged every few seconds, listed by `scute pulls` (the Admin service) and exported as
//! metrics; and a watchdog that aborts a pull that made no progress for
//! `[image] pull_progress_timeout_seconds` (containerd's image_pull_progress_timeout, 5 min) —
//! never one that is slow but moving.

use std::future::Future;
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// tokio's clock: the same as std's in the daemon, and paused time in the tests.
use tokio::time::Instant;

use super::PullError;

/// How often a running pull logs its progress.
const LOG_EVERY: Duration = Duration::from_secs(5);

/// Where a pull is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Reading the manifest (and index) and the config.
    Resolving,
    /// Layers downloading and unpacking.
    Downloading,
    /// Writing the image record.
    Committing,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Resolving => "resolving",
            Phase::Downloading => "downloading",
            Phase::Committing => "committing",
        }
    }

    fn from_u8(v: u8) -> Phase {
        match v {
            0 => Phase::Resolving,
            1 => Phase::Downloading,
            _ => Phase::Committing,
        }
    }
}

/// One pull's counters, shared by its layer downloads (atomics: they run on blocking threads).
#[derive(Debug)]
pub struct PullState {
    image: String,
    started: Instant,
    phase: AtomicU8,
    bytes_done: AtomicU64,
    bytes_total: AtomicU64,
    layers_done: AtomicU32,
    layers_total: AtomicU32,
    /// Milliseconds from `started` to the last byte received (or phase change).
    last_progress_ms: AtomicU64,
    /// Pulls whose download of a layer this one waits for: it moves while they do (their own
    /// watchdogs stop them if they stall, and then this one takes over).
    following: Mutex<Vec<Arc<PullState>>>,
    /// Waits on a holder not known yet (the moment between its lock and its registration).
    blind_waits: AtomicU32,
}

impl PullState {
    fn new(image: String) -> PullState {
        PullState {
            image,
            started: Instant::now(),
            phase: AtomicU8::new(Phase::Resolving as u8),
            bytes_done: AtomicU64::new(0),
            bytes_total: AtomicU64::new(0),
            layers_done: AtomicU32::new(0),
            layers_total: AtomicU32::new(0),
            last_progress_ms: AtomicU64::new(0),
            following: Mutex::new(Vec::new()),
            blind_waits: AtomicU32::new(0),
        }
    }

    /// While the guard lives this pull waits for `holder`'s download (None: a holder not known):
    /// it is idle only when the holder is. Waiting for itself (an image listing one layer twice)
    /// counts as idle.
    pub fn follow(&self, holder: Option<Arc<PullState>>) -> Following<'_> {
        match &holder {
            Some(h) if std::ptr::eq(Arc::as_ptr(h), self) => {}
            Some(h) => self.followed().push(h.clone()),
            None => {
                self.blind_waits.fetch_add(1, Ordering::Relaxed);
            }
        }
        Following { state: self, holder }
    }

    fn followed(&self) -> std::sync::MutexGuard<'_, Vec<Arc<PullState>>> {
        self.following.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The pull moved without a byte arriving (unpacking what is already on disk).
    pub fn moved(&self) {
        self.touch();
    }

    fn touch(&self) {
        let now = self.started.elapsed().as_millis() as u64;
        self.last_progress_ms.fetch_max(now, Ordering::Relaxed);
    }

    /// The layers are known: `bytes` to download in all.
    pub fn downloading(&self, bytes: u64, layers: usize) {
        self.bytes_total.store(bytes, Ordering::Relaxed);
        self.layers_total
            .store(u32::try_from(layers).unwrap_or(u32::MAX), Ordering::Relaxed);
        self.phase.store(Phase::Downloading as u8, Ordering::Relaxed);
        self.touch();
    }

    pub fn committing(&self) {
        self.phase.store(Phase::Committing as u8, Ordering::Relaxed);
        self.touch();
    }

    /// `n` bytes of a layer arrived (or were already there).
    pub fn add_bytes(&self, n: u64) {
        self.bytes_done.fetch_add(n, Ordering::Relaxed);
        self.touch();
    }

    pub fn layer_done(&self) {
        self.layers_done.fetch_add(1, Ordering::Relaxed);
        self.touch();
    }

    /// How long since the pull, or a pull it waits for, last moved.
    fn idle(&self) -> Duration {
        if self.blind_waits.load(Ordering::Relaxed) > 0 {
            return Duration::ZERO;
        }
        let own = self.own_idle();
        self.followed().iter().map(|h| h.own_idle()).fold(own, Duration::min)
    }

    fn own_idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_progress_ms.load(Ordering::Relaxed));
        self.started.elapsed().saturating_sub(last)
    }

    pub fn snapshot(&self) -> PullSnapshot {
        PullSnapshot {
            image: self.image.clone(),
            phase: Phase::from_u8(self.phase.load(Ordering::Relaxed)),
            bytes_done: self.bytes_done.load(Ordering::Relaxed),
            bytes_total: self.bytes_total.load(Ordering::Relaxed),
            layers_done: self.layers_done.load(Ordering::Relaxed),
            layers_total: self.layers_total.load(Ordering::Relaxed),
            elapsed: self.started.elapsed(),
            idle: self.idle(),
        }
    }
}

/// A pull waiting for another's download; see `PullState::follow`.
pub struct Following<'a> {
    state: &'a PullState,
    holder: Option<Arc<PullState>>,
}

impl Drop for Following<'_> {
    fn drop(&mut self) {
        match &self.holder {
            Some(h) => {
                let mut followed = self.state.followed();
                if let Some(at) = followed.iter().position(|f| Arc::ptr_eq(f, h)) {
                    followed.remove(at);
                }
            }
            None => {
                self.state.blind_waits.fetch_sub(1, Ordering::Relaxed);
            }
        }
        self.state.touch();
    }
}

/// A pull's progress at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PullSnapshot {
    pub image: String,
    pub phase: Phase,
    pub bytes_done: u64,
    /// 0 until the manifest is read.
    pub bytes_total: u64,
    pub layers_done: u32,
    pub layers_total: u32,
    pub elapsed: Duration,
    /// Since the last byte arrived.
    pub idle: Duration,
}

/// The pulls in flight (owned by the ImageManager).
#[derive(Debug, Default)]
pub struct Pulls {
    running: Mutex<Vec<Arc<PullState>>>,
}

impl Pulls {
    /// Registers a pull of `image` until the handle drops.
    pub fn begin(&self, image: &str) -> PullHandle<'_> {
        let state = Arc::new(PullState::new(image.to_string()));
        self.lock().push(state.clone());
        PullHandle { pulls: self, state }
    }

    /// The pulls in flight, oldest first.
    pub fn list(&self) -> Vec<PullSnapshot> {
        self.lock().iter().map(|p| p.snapshot()).collect()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Arc<PullState>>> {
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// A registered pull; unregistered on drop, however the pull ends.
pub struct PullHandle<'a> {
    pulls: &'a Pulls,
    pub state: Arc<PullState>,
}

impl Drop for PullHandle<'_> {
    fn drop(&mut self) {
        self.pulls.lock().retain(|p| !Arc::ptr_eq(p, &self.state));
    }
}

/// Runs `pull` to its end, logging its progress every LOG_EVERY; or aborts it (dropping it,
/// which stops its downloads; their partial blobs stay to resume) once it made no progress for
/// `stall` (zero: never), answering PullError::Stalled.
pub async fn watched<F: Future>(state: &PullState, stall: Duration, pull: F) -> Result<F::Output, PullError> {
    tokio::pin!(pull);
    // Checked often enough to stop a stalled pull within a quarter of its timeout.
    let check = if stall.is_zero() {
        LOG_EVERY
    } else {
        (stall / 4).clamp(Duration::from_millis(100), LOG_EVERY)
    };
    let mut ticks = tokio::time::interval_at(Instant::now() + check, check);
    let (mut logged_at, mut logged_bytes) = (Instant::now(), 0u64);
    loop {
        tokio::select! {
            result = &mut pull => return Ok(result),
            _ = ticks.tick() => {
                let now = state.snapshot();
                if !stall.is_zero() && now.idle >= stall {
                    return Err(PullError::Stalled(format!(
                        "no progress for {}s while {} ({} of {} bytes, {} of {} layers); \
                         aborted ([image] pull_progress_timeout_seconds = {}), a retry resumes",
                        now.idle.as_secs(), now.phase.as_str(), now.bytes_done, now.bytes_total,
                        now.layers_done, now.layers_total, stall.as_secs()
                    )));
                }
                if logged_at.elapsed() >= LOG_EVERY {
                    let rate = (now.bytes_done - logged_bytes.min(now.bytes_done)) as f64 / logged_at.elapsed().as_secs_f64();
                    tracing::info!(
                        image = %now.image,
                        phase = now.phase.as_str(),
                        bytes_done = now.bytes_done,
                        bytes_total = now.bytes_total,
                        layers_done = now.layers_done,
                        layers_total = now.layers_total,
                        bytes_per_second = rate as u64,
                        elapsed_s = now.elapsed.as_secs(),
                        "pull progress"
                    );
                    (logged_at, logged_bytes) = (Instant::now(), now.bytes_done);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // Real time, with margins several times any scheduling delay: tokio's paused clock
    // (`test-util`) would give the benchmarks a daemon built with other features than the one
    // users run.
    const STALL: Duration = Duration::from_secs(1);
    const STEP: Duration = Duration::from_millis(200);

    #[tokio::test]
    async fn a_stalled_pull_is_aborted_and_a_moving_one_is_not() {
        let pulls = Pulls::default();
        let handle = pulls.begin("example.com/stalls:1");
        let state = handle.state.clone();
        let never = std::future::pending::<()>();
        let err = watched(&state, STALL, never).await.unwrap_err();
        assert!(
            matches!(err, PullError::Stalled(ref m) if m.contains("pull_progress_timeout_seconds")),
            "{err}"
        );
        assert_eq!(pulls.list().len(), 1);
        drop(handle);
        assert!(pulls.list().is_empty());

        // A byte every 200 ms for 1.6 s against a 1 s timeout: slow, but moving.
        let handle = pulls.begin("example.com/slow:1");
        let state = handle.state.clone();
        state.downloading(8, 1);
        let slow = async {
            for _ in 0..8 {
                tokio::time::sleep(STEP).await;
                state.add_bytes(1);
            }
            state.layer_done();
        };
        watched(&state, STALL, slow).await.unwrap();
        let now = pulls.list().remove(0);
        assert_eq!(
            (now.bytes_done, now.bytes_total, now.layers_done, now.layers_total),
            (8, 8, 1, 1)
        );
        assert_eq!(now.phase, Phase::Downloading);
    }

    #[tokio::test]
    async fn a_waiter_moves_while_the_pull_it_waits_for_does() {
        let pulls = Pulls::default();
        let (holder, waiter) = (pulls.begin("example.com/a:1"), pulls.begin("example.com/b:1"));
        // The holder moves for 1.6 s: the waiter, receiving nothing itself, is not aborted.
        let holder_state = holder.state.clone();
        let wait = async {
            let _following = waiter.state.follow(Some(holder_state.clone()));
            for _ in 0..8 {
                tokio::time::sleep(STEP).await;
                holder_state.add_bytes(1);
            }
        };
        watched(&waiter.state, STALL, wait).await.unwrap();
        // The holder stalls: so does the waiter.
        let wait = async {
            let _following = waiter.state.follow(Some(holder.state.clone()));
            std::future::pending::<()>().await
        };
        assert!(watched(&waiter.state, STALL, wait).await.is_err());
        // Waiting for itself (one layer listed twice) is no excuse.
        let wait = async {
            let _following = waiter.state.follow(Some(waiter.state.clone()));
            std::future::pending::<()>().await
        };
        assert!(watched(&waiter.state, STALL, wait).await.is_err());
    }

    #[tokio::test]
    async fn no_timeout_never_aborts() {
        let pulls = Pulls::default();
        let handle = pulls.begin("example.com/quiet:1");
        // Past the first check (LOG_EVERY with no timeout), with nothing received.
        let late = tokio::time::sleep(LOG_EVERY + STEP);
        watched(&handle.state, Duration::ZERO, late).await.unwrap();
    }
}
