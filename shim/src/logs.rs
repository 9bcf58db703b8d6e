//! Container logs, written by the shim itself: the container's stdout and stderr are pipes (or one
//! terminal master) whose read ends the event loop drains (so the container never waits for
//! anybody but the shim's own loop), and every line goes to the CRI log file (what is read is also
//! handed to the attached sessions, see `LogStream::drain`):
//!
//! ```text
//! 2026-11-21T16:12:44.123456789Z stdout F a whole line, without its newline
//! 2026-11-21T16:12:44.123456789Z stderr P a chunk of a longer line (or the end without newline)
//! ```
//!
//! Writing to the file may fail (disk full, directory removed): the output is then dropped and
//! counted, the error logged once, and the pipes keep being drained.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// Longest line written as one entry unless the container asks for another size.
pub const DEFAULT_MAX_LINE: usize = 16 << 10;
/// Bounds of a requested max line size.
pub const MIN_MAX_LINE: usize = 64;
pub const MAX_MAX_LINE: usize = 1 << 20;
/// One read from a pipe.
const READ_CHUNK: usize = 64 << 10;
/// Reads per stream and wake-up, so that one chatty container cannot starve the loop.
const READS_PER_WAKE: usize = 16;
/// Reads when everything available is wanted (after an exit): more than a pipe holds, still
/// bounded (other processes may hold the pipe and write on).
const READS_WHEN_ALL: usize = 256;

/// Formats `t` as RFC 3339 in UTC with nanoseconds (always 9 digits), as containerd and CRI-O do.
pub fn timestamp(t: SystemTime) -> String {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, day) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{day:02}T{:02}:{:02}:{:02}.{:09}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60,
        d.subsec_nanos()
    )
}

/// Days since 1970-01-01 to a proleptic Gregorian (year, month, day); Howard Hinnant's algorithm.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

/// Splits what a stream produced into CRI log entries, appended to `out`. `pending` holds the
/// unterminated tail of earlier input (at most `max` bytes) and is updated. Lines longer than `max`
/// become `max`-byte P entries and an F entry for the rest; at `eof` a tail is written as P.
pub fn format_entries(
    ts: &str,
    stream: &str,
    pending: &mut Vec<u8>,
    input: &[u8],
    max: usize,
    eof: bool,
    out: &mut Vec<u8>,
) {
    let entry = |tag: u8, content: &[u8], out: &mut Vec<u8>| {
        out.extend_from_slice(ts.as_bytes());
        out.push(b' ');
        out.extend_from_slice(stream.as_bytes());
        out.push(b' ');
        out.push(tag);
        out.push(b' ');
        out.extend_from_slice(content);
        out.push(b'\n');
    };
    let mut rest = input;
    while let Some(nl) = rest.iter().position(|&b| b == b'\n') {
        let mut line: &[u8] = &rest[..nl];
        rest = &rest[nl + 1..];
        if !pending.is_empty() {
            // pending is at most `max` bytes, so only its join with `line` can be too long.
            pending.extend_from_slice(line);
            let joined = std::mem::take(pending);
            let mut l: &[u8] = &joined;
            while l.len() > max {
                entry(b'P', &l[..max], out);
                l = &l[max..];
            }
            entry(b'F', l, out);
            continue;
        }
        while line.len() > max {
            entry(b'P', &line[..max], out);
            line = &line[max..];
        }
        entry(b'F', line, out);
    }
    pending.extend_from_slice(rest);
    if pending.len() > max {
        let mut l: &[u8] = pending;
        while l.len() > max {
            entry(b'P', &l[..max], out);
            l = &l[max..];
        }
        *pending = l.to_vec();
    }
    if eof && !pending.is_empty() {
        entry(b'P', pending, out);
        pending.clear();
    }
    if pending.is_empty() && pending.capacity() > 0 {
        // Mostly idle streams: give the memory back.
        *pending = Vec::new();
    }
}

/// Opens (creating it 0640, and missing parent directories 0755) a log file for appending.
pub fn open_log(path: &Path) -> io::Result<File> {
    if let Some(parent) = path.parent() {
        if !parent.is_dir() {
            fs::DirBuilder::new().recursive(true).mode(0o755).create(parent)?;
        }
    }
    let f = OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(path)?;
    // A umask of 077 (the shim's, during its setup) takes group read away.
    let meta = f.metadata()?;
    if meta.permissions().mode() & 0o777 == 0o600 {
        f.set_permissions(fs::Permissions::from_mode(0o640))?;
    }
    Ok(f)
}

/// One container's log file.
pub struct LogFile {
    path: PathBuf,
    file: Option<File>,
    pub max_line: usize,
    /// Output that could not be written, in bytes of log entries.
    pub dropped: u64,
    error_logged: bool,
}

impl LogFile {
    pub fn open(path: PathBuf, max_line: usize) -> io::Result<LogFile> {
        let file = open_log(&path)?;
        Ok(LogFile {
            path,
            file: Some(file),
            max_line,
            dropped: 0,
            error_logged: false,
        })
    }

    /// Opens the file at the path again (it was renamed away for rotation). On failure the old
    /// file stays in use.
    pub fn reopen(&mut self) -> io::Result<()> {
        let file = open_log(&self.path)?;
        self.file = Some(file);
        self.error_logged = false;
        Ok(())
    }

    pub fn write(&mut self, entries: &[u8], container: &str) {
        if entries.is_empty() {
            return;
        }
        let result = match &mut self.file {
            Some(f) => f.write_all(entries),
            None => Err(io::Error::other("no log file open")),
        };
        if let Err(e) = result {
            self.dropped += entries.len() as u64;
            if !self.error_logged {
                self.error_logged = true;
                tracing::error!(
                    container,
                    path = ?self.path,
                    error = %e,
                    "writing the container log failed; its output is dropped until this works again"
                );
            }
        } else if self.error_logged {
            self.error_logged = false;
            tracing::info!(container, path = ?self.path, dropped = self.dropped, "writing the container log works again");
        }
    }
}

/// The read end of a container's stdout or stderr pipe (or its terminal's master), with the tail
/// of an unfinished line.
pub struct LogStream {
    pub name: &'static str,
    fd: Option<OwnedFd>,
    pending: Vec<u8>,
}

impl LogStream {
    /// `fd` must be non-blocking.
    pub fn new(name: &'static str, fd: OwnedFd) -> Self {
        LogStream {
            name,
            fd: Some(fd),
            pending: Vec::new(),
        }
    }

    pub fn fd(&self) -> Option<BorrowedFd<'_>> {
        self.fd.as_ref().map(|f| f.as_fd())
    }

    pub fn is_open(&self) -> bool {
        self.fd.is_some()
    }

    /// Reads what the pipe holds (a few reads), hands each chunk to `copy` and writes the entries
    /// to `log` (if any). `all`: until the pipe is empty (the container has exited: everything it
    /// wrote must be in the log before its exit is reported), still bounded. At EOF the tail is
    /// flushed and the pipe closed.
    pub fn drain(&mut self, mut log: Option<&mut LogFile>, container: &str, all: bool, copy: &mut dyn FnMut(&[u8])) {
        let Some(fd) = self.fd.take() else { return };
        let mut pipe = File::from(fd);
        let mut buf = vec![0u8; READ_CHUNK];
        let mut out = Vec::new();
        let mut eof = false;
        let mut reads = 0;
        loop {
            match pipe.read(&mut buf) {
                Ok(0) => {
                    eof = true;
                    break;
                }
                Ok(n) => {
                    copy(&buf[..n]);
                    if let Some(log) = log.as_deref_mut() {
                        let ts = timestamp(SystemTime::now());
                        format_entries(
                            &ts,
                            self.name,
                            &mut self.pending,
                            &buf[..n],
                            log.max_line,
                            false,
                            &mut out,
                        );
                        log.write(&out, container);
                        out.clear();
                    }
                    reads += 1;
                    if reads >= if all { READS_WHEN_ALL } else { READS_PER_WAKE } {
                        break;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                // A terminal master once every slave descriptor is closed: the end.
                Err(e) if e.raw_os_error() == Some(libc::EIO) => {
                    eof = true;
                    break;
                }
                Err(e) => {
                    tracing::warn!(container, stream = self.name, error = %e, "reading container output");
                    eof = true;
                    break;
                }
            }
        }
        if eof {
            self.flush(log, container);
        } else {
            self.fd = Some(pipe.into());
        }
    }

    /// Writes an unfinished line as P and closes the pipe.
    pub fn flush(&mut self, log: Option<&mut LogFile>, container: &str) {
        self.fd = None;
        match log {
            Some(log) if !self.pending.is_empty() => {
                let mut out = Vec::new();
                let ts = timestamp(SystemTime::now());
                format_entries(&ts, self.name, &mut self.pending, &[], log.max_line, true, &mut out);
                log.write(&out, container);
            }
            _ => self.pending = Vec::new(),
        }
    }
}

/// A container's output: its log file (if it has one) and its streams: stdout and stderr, or
/// only stdout (the terminal) for a container with a tty.
pub struct ContainerLog {
    pub file: Option<LogFile>,
    pub streams: Vec<LogStream>,
    /// The one stream is a terminal (stdout and stderr in one).
    pub terminal: bool,
}

impl ContainerLog {
    pub fn is_open(&self) -> bool {
        self.streams.iter().any(|s| s.is_open())
    }

    /// Reads stream `stream`; `copy` gets (stream, chunk) for the attached sessions.
    pub fn drain(&mut self, stream: usize, container: &str, all: bool, copy: &mut dyn FnMut(usize, &[u8])) {
        if let Some(s) = self.streams.get_mut(stream) {
            s.drain(self.file.as_mut(), container, all, &mut |chunk| copy(stream, chunk));
        }
    }

    pub fn drain_all(&mut self, container: &str, copy: &mut dyn FnMut(usize, &[u8])) {
        for (i, s) in self.streams.iter_mut().enumerate() {
            s.drain(self.file.as_mut(), container, true, &mut |chunk| copy(i, chunk));
        }
    }

    /// Drains what is there and writes unfinished lines, closing the pipes (the container is
    /// being deleted).
    pub fn close(&mut self, container: &str) {
        for s in &mut self.streams {
            s.drain(self.file.as_mut(), container, true, &mut |_| {});
            s.flush(self.file.as_mut(), container);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, UNIX_EPOCH};

    #[test]
    fn timestamps() {
        assert_eq!(timestamp(UNIX_EPOCH), "1970-01-01T00:00:00.000000000Z");
        let t = UNIX_EPOCH + Duration::new(1_795_277_564, 123_456_789);
        assert_eq!(timestamp(t), "2026-11-21T16:12:44.123456789Z");
        // A leap day, and the end of a year.
        let t = UNIX_EPOCH + Duration::new(951_782_400, 5);
        assert_eq!(timestamp(t), "2000-02-29T00:00:00.000000005Z");
        let t = UNIX_EPOCH + Duration::from_secs(1_704_067_199);
        assert_eq!(timestamp(t), "2023-12-31T23:59:59.000000000Z");
    }

    fn entries(chunks: &[&[u8]], max: usize, eof: bool) -> String {
        let mut pending = Vec::new();
        let mut out = Vec::new();
        for (i, c) in chunks.iter().enumerate() {
            let last = i + 1 == chunks.len();
            format_entries("T", "stdout", &mut pending, c, max, eof && last, &mut out);
        }
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn whole_and_partial_lines() {
        assert_eq!(entries(&[b"out\n"], 16, false), "T stdout F out\n");
        assert_eq!(
            entries(&[b"a\n\nb\n"], 16, false),
            "T stdout F a\nT stdout F \nT stdout F b\n"
        );
        // A line across reads is one entry.
        assert_eq!(
            entries(&[b"hel", b"lo\nwor", b"ld\n"], 16, false),
            "T stdout F hello\nT stdout F world\n"
        );
        // The end without a newline: P.
        assert_eq!(
            entries(&[b"x\npartial"], 16, true),
            "T stdout F x\nT stdout P partial\n"
        );
        assert_eq!(entries(&[b"partial"], 16, false), "");
        assert_eq!(entries(&[b""], 16, true), "");
    }

    #[test]
    fn long_lines_split() {
        assert_eq!(
            entries(&[b"abcdefghij\n"], 4, false),
            "T stdout P abcd\nT stdout P efgh\nT stdout F ij\n"
        );
        // Exactly max: one F.
        assert_eq!(entries(&[b"abcd\n"], 4, false), "T stdout F abcd\n");
        assert_eq!(entries(&[b"abcd", b"\n"], 4, false), "T stdout F abcd\n");
        // Split while unterminated, across reads.
        assert_eq!(
            entries(&[b"abc", b"defgh", b"ij\n"], 4, false),
            "T stdout P abcd\nT stdout P efgh\nT stdout F ij\n"
        );
        assert_eq!(
            entries(&[b"abcdefghij"], 4, true),
            "T stdout P abcd\nT stdout P efgh\nT stdout P ij\n"
        );
        let mut pending = Vec::new();
        let mut out = Vec::new();
        format_entries("T", "stderr", &mut pending, &[b'z'; 100], 8, false, &mut out);
        assert!(pending.len() <= 8);
    }

    #[test]
    fn log_file_is_created_0640_with_its_directory_and_reopened() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pods/ns_pod_uid/c/0.log");
        let old_umask = unsafe { libc::umask(0o077) };
        let mut log = LogFile::open(path.clone(), DEFAULT_MAX_LINE).unwrap();
        unsafe { libc::umask(old_umask) };
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640);
        log.write(b"one\n", "c");
        fs::rename(&path, dir.path().join("rotated")).unwrap();
        log.write(b"two\n", "c");
        log.reopen().unwrap();
        log.write(b"three\n", "c");
        assert_eq!(fs::read_to_string(dir.path().join("rotated")).unwrap(), "one\ntwo\n");
        assert_eq!(fs::read_to_string(&path).unwrap(), "three\n");
        assert_eq!(log.dropped, 0);
    }

    #[test]
    fn stream_drains_a_pipe_and_flushes_at_eof() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.log");
        let mut log = LogFile::open(path.clone(), DEFAULT_MAX_LINE).unwrap();
        let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC | nix::fcntl::OFlag::O_NONBLOCK).unwrap();
        let mut s = LogStream::new("stderr", r);
        let mut w = File::from(w);
        w.write_all(b"err\nno newline").unwrap();
        let mut copied = Vec::new();
        s.drain(Some(&mut log), "c", false, &mut |c| copied.extend_from_slice(c));
        assert_eq!(copied, b"err\nno newline");
        assert!(s.is_open());
        drop(w);
        assert!(crate::test_support::eventually(|| {
            s.drain(Some(&mut log), "c", false, &mut |_| {});
            !s.is_open()
        }));
        let text = fs::read_to_string(&path).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(
            lines[0].ends_with(" stderr F err") && lines[0].len() == 30 + " stderr F err".len(),
            "{text}"
        );
        assert!(lines[1].ends_with(" stderr P no newline"), "{text}");
    }

    #[test]
    fn write_failures_are_counted_not_fatal() {
        let mut log = LogFile {
            path: PathBuf::from("/dev/full"),
            file: Some(OpenOptions::new().append(true).open("/dev/full").unwrap()),
            max_line: 16,
            dropped: 0,
            error_logged: false,
        };
        log.write(b"abc\n", "c");
        log.write(b"de\n", "c");
        assert_eq!(log.dropped, 7);
    }
}
