//! A fanotify watch of a daemon's root that stops the shim at a set point of a StartContainer:
//! its first open of a container's `bundle/config.json` (after the daemon pinned the bind sources
//! and mounted the rootfs, before libcontainer reads the spec). Tests use it to make a race land
//! in its window by construction, not by timing. The root must be a mount of its own
//! (`Daemon::start_on_tmpfs`): the mark covers the whole mount, and every open on it waits for
//! this watch's answer.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sys::fanotify::{
    EventFFlags, Fanotify, FanotifyEvent, FanotifyResponse, InitFlags, MarkFlags, MaskFlags, Response,
};

/// The first open of a container's config.json by a process other than the daemon: its path
/// and the opener's pid.
pub type FirstOpen = (PathBuf, i32);

pub struct OpenWatch {
    stop: Arc<AtomicBool>,
    wake: PathBuf,
    release: mpsc::Sender<()>,
    first: mpsc::Receiver<FirstOpen>,
    thread: Option<JoinHandle<()>>,
}

impl OpenWatch {
    /// Answers every open on `root`'s mount (allowed, always). At the first open of a container's
    /// config.json by another process than `daemon_pid`, runs `at_first` and then, with `hold`,
    /// keeps that open waiting until [`OpenWatch::release`] (or the end of the watch).
    pub fn start(root: &Path, daemon_pid: i32, hold: bool, at_first: impl FnOnce() + Send + 'static) -> OpenWatch {
        let wake = root.join("wake");
        std::fs::write(&wake, "").unwrap();
        let fan = Fanotify::init(
            InitFlags::FAN_CLASS_CONTENT | InitFlags::FAN_CLOEXEC,
            EventFFlags::O_RDONLY | EventFFlags::O_LARGEFILE | EventFFlags::O_CLOEXEC,
        )
        .expect("fanotify_init (root holds CAP_SYS_ADMIN)");
        fan.mark(
            MarkFlags::FAN_MARK_ADD | MarkFlags::FAN_MARK_MOUNT,
            MaskFlags::FAN_OPEN_PERM,
            None,
            Some(root),
        )
        .expect("a permission mark on the daemon's root (a kernel with fanotify access permissions)");
        let stop = Arc::new(AtomicBool::new(false));
        let (first_tx, first) = mpsc::channel();
        let (release, release_rx) = mpsc::channel::<()>();
        let containers = root.join("containers");
        let thread = std::thread::spawn({
            let stop = stop.clone();
            move || {
                let allow = |event: &FanotifyEvent| {
                    if let Some(fd) = event.fd() {
                        fan.write_response(FanotifyResponse::new(fd, Response::FAN_ALLOW))
                            .unwrap();
                    }
                };
                let (mut at_first, mut held) = (Some(at_first), None);
                while !stop.load(Ordering::SeqCst) {
                    for event in fan.read_events().expect("reading fanotify events") {
                        let Some(fd) = event.fd() else { continue };
                        let path =
                            std::fs::read_link(format!("/proc/self/fd/{}", std::os::fd::AsRawFd::as_raw_fd(&fd)))
                                .unwrap_or_default();
                        if at_first.is_some()
                            && event.pid() != daemon_pid
                            && path.starts_with(&containers)
                            && path.ends_with("bundle/config.json")
                        {
                            (at_first.take().unwrap())();
                            let _ = first_tx.send((path, event.pid()));
                            if hold {
                                held = Some(event);
                                continue;
                            }
                        }
                        allow(&event);
                    }
                    if held.is_some() && release_rx.try_recv().is_ok() {
                        allow(&held.take().unwrap());
                    }
                }
                if let Some(event) = held {
                    allow(&event);
                }
            }
        });
        OpenWatch {
            stop,
            wake,
            release,
            first,
            thread: Some(thread),
        }
    }

    /// Waits (blocking) for the first open of a container's config.json.
    pub fn first_open(&self, timeout: Duration) -> Option<FirstOpen> {
        self.first.recv_timeout(timeout).ok()
    }

    /// Lets the held open through.
    pub fn release(&self) {
        let _ = self.release.send(());
        self.poke();
    }

    /// An open on the root: the watcher looks at its stop and release signals after each batch
    /// of events it answers.
    pub fn poke(&self) {
        let _ = std::fs::read(&self.wake);
    }

    /// Ends the watch (a held open is let through); answers the first open, if there was one.
    pub fn finish(mut self) -> Option<FirstOpen> {
        self.end();
        self.first.try_recv().ok()
    }

    fn end(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        self.poke();
        if let Some(thread) = self.thread.take() {
            thread.join().expect("the fanotify watcher");
        }
    }
}

impl Drop for OpenWatch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            self.end();
        }
    }
}
