//! Exit records: `<state-dir>/exits/<container-id>.json`, written before the shim reports an exit
//! to anyone, atomically (temp file, fsync, rename, fsync of the directory), so that the daemon
//! finds the exit code and time after a crash of either process.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use nix::sys::wait::WaitStatus;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct ExitRecord {
    /// The exit status, or 128 + the signal number for a process killed by a signal.
    pub exit_code: i32,
    /// When the shim reaped the process, nanoseconds since the Unix epoch.
    pub finished_at_ns: i64,
    /// Killed by SIGKILL after its memory cgroup counted an OOM kill.
    #[serde(default)]
    pub oom_killed: bool,
}

pub fn path(dir: &Path, container_id: &str) -> PathBuf {
    dir.join(format!("{container_id}.json"))
}

pub fn write(dir: &Path, container_id: &str, record: &ExitRecord) -> io::Result<()> {
    let target = path(dir, container_id);
    let tmp = dir.join(format!(".{container_id}.json.tmp"));
    let body = serde_json::to_vec(record).map_err(io::Error::other)?;
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .custom_flags(libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(&body)?;
        f.sync_all()?;
    }
    fs::rename(&tmp, &target)?;
    File::open(dir)?.sync_all()
}

#[cfg(test)]
pub fn read(dir: &Path, container_id: &str) -> io::Result<Option<ExitRecord>> {
    match fs::read(path(dir, container_id)) {
        Ok(body) => serde_json::from_slice(&body)
            .map(Some)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

pub fn remove(dir: &Path, container_id: &str) -> io::Result<()> {
    match fs::remove_file(path(dir, container_id)) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// The pid and exit code of a wait status that means the process is gone.
pub fn exit_of(status: WaitStatus) -> Option<(i32, i32)> {
    match status {
        WaitStatus::Exited(pid, code) => Some((pid.as_raw(), code)),
        WaitStatus::Signaled(pid, sig, _) => Some((pid.as_raw(), 128 + sig as i32)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::signal::Signal;
    use nix::unistd::Pid;

    #[test]
    fn write_read_remove() {
        let dir = tempfile::tempdir().unwrap();
        let rec = ExitRecord {
            exit_code: 137,
            finished_at_ns: 1_700_000_000_123_456_789,
            oom_killed: true,
        };
        assert_eq!(read(dir.path(), "c1").unwrap(), None);
        write(dir.path(), "c1", &rec).unwrap();
        assert_eq!(read(dir.path(), "c1").unwrap(), Some(rec));
        // Overwrite is atomic and leaves no temp file.
        let rec2 = ExitRecord {
            exit_code: 0,
            finished_at_ns: 1,
            oom_killed: false,
        };
        write(dir.path(), "c1", &rec2).unwrap();
        assert_eq!(read(dir.path(), "c1").unwrap(), Some(rec2));
        let names: Vec<_> = fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert_eq!(names, vec!["c1.json"]);
        let text = fs::read_to_string(path(dir.path(), "c1")).unwrap();
        assert_eq!(text, r#"{"exit_code":0,"finished_at_ns":1,"oom_killed":false}"#);
        // Files of older shims (no oom_killed) still read.
        fs::write(path(dir.path(), "old"), r#"{"exit_code":1,"finished_at_ns":2}"#).unwrap();
        assert!(!read(dir.path(), "old").unwrap().unwrap().oom_killed);
        remove(dir.path(), "c1").unwrap();
        remove(dir.path(), "c1").unwrap();
        assert_eq!(read(dir.path(), "c1").unwrap(), None);
    }

    #[test]
    fn signals_map_to_128_plus_signo() {
        let p = Pid::from_raw(42);
        assert_eq!(exit_of(WaitStatus::Exited(p, 3)), Some((42, 3)));
        assert_eq!(
            exit_of(WaitStatus::Signaled(p, Signal::SIGKILL, false)),
            Some((42, 137))
        );
        assert_eq!(exit_of(WaitStatus::Signaled(p, Signal::SIGTERM, true)), Some((42, 143)));
        assert_eq!(exit_of(WaitStatus::StillAlive), None);
    }
}
