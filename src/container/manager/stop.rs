//! StopContainer: the stop signal (the config's, else the image's STOPSIGNAL, else SIGTERM), then
//! SIGKILL after the grace period; the exited container is released (see `release`) before the
//! answer, as containerd's StopContainer waits for the task's delete.

use std::time::Duration;

use super::{shim_failed, ContainerError, ContainerManager};
use crate::api;
use crate::container::record::{ContainerRecord, ContainerState};
use crate::shim_client::{ShimClient, ShimError};

impl ContainerManager {
    /// StopContainer: the stop signal (config, else image, else SIGTERM), then SIGKILL after
    /// `timeout` (0: at once). Idempotent; unknown IDs succeed.
    pub async fn stop(&self, id_or_prefix: &str, timeout: Duration) -> Result<(), ContainerError> {
        let id = match self.resolve(id_or_prefix) {
            Ok(id) => id,
            Err(ContainerError::NotFound(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let _lock = self.id_locks.lock(&id).await;
        let record = self.refresh(self.get(&id)?).await?;
        if record.state != ContainerState::Running {
            // Exited by itself: released at its exit, unless that has not happened (yet).
            self.release_exited(&record).await;
            return Ok(());
        }
        let shim = self.shim(&record.sandbox_id).await?;
        let signal = stop_signal(&record.config(), &self.image_stop_signal(&record));
        if !timeout.is_zero() && signal != libc::SIGKILL {
            match shim.kill(&id, signal, false).await {
                Ok(()) | Err(ShimError::NotFound(_)) => {}
                Err(e) => return Err(shim_failed("signalling the container")(e)),
            }
            if self.wait_exit(&shim, &id, timeout).await {
                let record = self.refresh(record).await?;
                self.release_exited(&record).await;
                return Ok(());
            }
            tracing::info!(container = %id, ?timeout, "grace period over: killing");
        }
        match shim.kill(&id, libc::SIGKILL, true).await {
            Ok(()) | Err(ShimError::NotFound(_)) => {}
            Err(e) => return Err(shim_failed("killing the container")(e)),
        }
        self.wait_exit(&shim, &id, Duration::from_secs(10)).await;
        let record = self.refresh(record).await?;
        self.release_exited(&record).await;
        Ok(())
    }

    pub(super) fn image_stop_signal(&self, record: &ContainerRecord) -> String {
        self.store
            .get::<crate::image::record::ImageRecord>(record.image_id.as_str())
            .ok()
            .flatten()
            .map(|i| i.config.stop_signal)
            .unwrap_or_default()
    }

    pub(super) async fn wait_exit(&self, shim: &ShimClient, id: &str, timeout: Duration) -> bool {
        let tick = Duration::from_millis(20);
        self.sandboxes
            .exit_notices
            .until_not_running(shim, id, timeout, tick)
            .await
    }
}

/// The signal StopContainer sends first: the config's (CRI 1.33+), else the image's STOPSIGNAL,
/// else SIGTERM.
pub(super) fn stop_signal(config: &api::ContainerConfig, image_signal: &str) -> i32 {
    let from_config = api::Signal::try_from(config.stop_signal)
        .ok()
        .filter(|s| *s != api::Signal::RuntimeDefault)
        .and_then(|s| signal_number(s.as_str_name()));
    from_config
        .or_else(|| signal_number(image_signal))
        .unwrap_or(libc::SIGTERM)
}

/// `SIGTERM`, `TERM`, `15` → 15.
pub(super) fn signal_number(name: &str) -> Option<i32> {
    if let Ok(n) = name.parse::<i32>() {
        return (1..=64).contains(&n).then_some(n);
    }
    let name = name.strip_prefix("SIG").unwrap_or(name);
    let n = match name {
        "HUP" => libc::SIGHUP,
        "INT" => libc::SIGINT,
        "QUIT" => libc::SIGQUIT,
        "KILL" => libc::SIGKILL,
        "USR1" => libc::SIGUSR1,
        "USR2" => libc::SIGUSR2,
        "TERM" => libc::SIGTERM,
        "STOP" => libc::SIGSTOP,
        "WINCH" => libc::SIGWINCH,
        "PWR" => libc::SIGPWR,
        "ABRT" => libc::SIGABRT,
        "ALRM" => libc::SIGALRM,
        _ => return None,
    };
    Some(n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stop_signals() {
        let mut config = api::ContainerConfig::default();
        assert_eq!(stop_signal(&config, ""), libc::SIGTERM);
        assert_eq!(stop_signal(&config, "SIGQUIT"), libc::SIGQUIT);
        assert_eq!(stop_signal(&config, "9"), libc::SIGKILL);
        config.stop_signal = api::Signal::Sigusr1 as i32;
        assert_eq!(stop_signal(&config, "SIGQUIT"), libc::SIGUSR1);
    }
}
