//! The user a container runs as: the security context's run_as_user / run_as_username /
//! run_as_group, else the image's USER (`name`, `uid`, `name:group`, `uid:gid`), with names,
//! the primary gid and (SupplementalGroupsPolicy Merge) the user's groups looked up in the
//! container's own /etc/passwd and /etc/group — the way containerd's `oci.WithUser` and
//! `WithAdditionalGIDs` do it.
//!
//! Every id, whatever its source, is checked before anything runs: 4294967295 is `(uid_t)-1`,
//! which setresuid/setresgid read as "leave unchanged", so a process asked to run as it keeps
//! root (the runAsNonRoot bypass of issue 13); and in a pod with its own user namespace an id
//! the namespace does not map cannot be entered.
//!
//! The rootfs is hostile: /etc/passwd may be a symlink to /etc/shadow, `../../etc/passwd`, a
//! FIFO or a device. Both files are opened with `openat2(RESOLVE_IN_ROOT)` relative to a
//! descriptor of the rootfs directory, so every symlink (absolute or `..`) resolves inside the
//! rootfs; only regular files are read, opened non-blocking, and read a line at a time (no
//! size cap: memory is bounded by the longest line kept, not by the file).

use std::io::{BufRead, BufReader, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{open, openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, Mode, SFlag};

use super::SpecError;
use crate::api;
use crate::oci::userns::PodUserNs;

/// A user-database line longer than this is not a user entry (skipped, never buffered whole).
const MAX_LINE: usize = 64 << 10;
/// An image's /etc/passwd or /etc/group bigger than this is refused unread: it is scanned at
/// every create (hundreds of thousands of users fit in a few MiB).
const MAX_DB: u64 = 64 << 20;
/// The kernel's NGROUPS_MAX: setgroups takes no more.
const MAX_GROUPS: usize = 65536;
/// openat2 answers EAGAIN when a rename raced the lookup; retrying is safe.
const OPENAT2_ATTEMPTS: usize = 16;
/// `(uid_t)-1` / `(gid_t)-1`: "no change" to the set*id calls, never a real id.
const NO_ID: u32 = u32::MAX;

/// The process user of a container's spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    pub uid: u32,
    pub gid: u32,
    /// Sorted and deduplicated; always holds `gid` (containerd's `ensureAdditionalGids`).
    pub additional_gids: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasswdEntry {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupEntry {
    pub name: String,
    pub gid: u32,
    pub members: Vec<String>,
}

/// The user for a container: `sc` is the container's security context (None → image USER);
/// `userns` the pod's user namespace, whose mappings every id must fall in.
pub fn resolve(
    rootfs: &Path,
    sc: Option<&api::LinuxContainerSecurityContext>,
    image_user: &str,
    userns: Option<&PodUserNs>,
) -> Result<User, SpecError> {
    let default_sc = api::LinuxContainerSecurityContext::default();
    let sc = sc.unwrap_or(&default_sc);
    let db = UserDb::new(rootfs);

    let (userstr, source) = match requested_user(sc)? {
        Some(u) => (u, "the security context's user"),
        None => (image_user.to_string(), "the image's USER"),
    };
    let (uid, gid) = if userstr.is_empty() {
        (0, 0)
    } else {
        resolve_userstr(&userstr, &db)?
    };
    check_id(uid, Kind::Uid, &format!("{source} {userstr:?} (uid {uid})"), userns)?;
    check_id(gid, Kind::Gid, &format!("{source} {userstr:?} (gid {gid})"), userns)?;

    let mut groups = vec![gid];
    if sc.supplemental_groups_policy() == api::SupplementalGroupsPolicy::Merge {
        let name = membership_name(sc, image_user);
        for g in member_groups(&name, &db)? {
            check_id(
                g,
                Kind::Gid,
                &format!("group {g} of user {name:?} in the image's /etc/group"),
                userns,
            )?;
            groups.push(g);
        }
    }
    for g in &sc.supplemental_groups {
        let g = id32(*g, "supplemental_groups")?;
        check_id(g, Kind::Gid, &format!("supplemental_groups entry {g}"), userns)?;
        groups.push(g);
    }
    groups.sort_unstable();
    groups.dedup();
    if groups.len() > MAX_GROUPS {
        return Err(SpecError::Invalid(format!(
            "{source} {userstr:?} would be in {} groups (the image's /etc/group and supplemental_groups); the kernel allows {MAX_GROUPS}",
            groups.len()
        )));
    }
    Ok(User {
        uid,
        gid,
        additional_gids: groups,
    })
}

#[derive(Clone, Copy)]
pub enum Kind {
    Uid,
    Gid,
}

/// Refuses an id no process can validly hold: `(uid_t)-1`, or one outside the pod's user
/// namespace mappings. `what` names where the id came from.
pub fn check_id(id: u32, kind: Kind, what: &str, userns: Option<&PodUserNs>) -> Result<(), SpecError> {
    let name = match kind {
        Kind::Uid => "uid",
        Kind::Gid => "gid",
    };
    if id == NO_ID {
        return Err(SpecError::Invalid(format!(
            "{what}: {name} {id} is not a valid {name} ((uid_t)-1 means \"unchanged\" to the kernel, so the process would keep root); use an id below {NO_ID}"
        )));
    }
    if let Some(ns) = userns {
        let range = match kind {
            Kind::Uid => &ns.uids,
            Kind::Gid => &ns.gids,
        };
        let end = u64::from(range.container_id) + u64::from(range.length);
        if u64::from(id) < u64::from(range.container_id) || u64::from(id) >= end {
            return Err(SpecError::Invalid(format!(
                "{what}: {name} {id} is not mapped by the pod's user namespace (it maps {name}s {}..{}); choose an id inside the mapping",
                range.container_id,
                end - 1
            )));
        }
    }
    Ok(())
}

/// `user[:group]` from the security context (containerd's `GenerateUserString`); None when it
/// names no user. A group without a user is refused, as containerd does.
fn requested_user(sc: &api::LinuxContainerSecurityContext) -> Result<Option<String>, SpecError> {
    let mut user = match &sc.run_as_user {
        Some(u) => Some(id32(u.value, "run_as_user")?.to_string()),
        None => None,
    };
    if !sc.run_as_username.is_empty() {
        user = Some(sc.run_as_username.clone());
    }
    let group = match &sc.run_as_group {
        Some(g) => Some(id32(g.value, "run_as_group")?.to_string()),
        None => None,
    };
    match (user, group) {
        (None, Some(g)) => Err(SpecError::Invalid(format!(
            "run_as_group {g} is specified without run_as_user or run_as_username"
        ))),
        (None, None) => Ok(None),
        (Some(u), None) => Ok(Some(u)),
        (Some(u), Some(g)) => Ok(Some(format!("{u}:{g}"))),
    }
}

/// The name whose /etc/group memberships are merged in: the username, or the name of the uid
/// (containerd resolves a numeric user through /etc/passwd; an unknown uid has no groups).
fn membership_name(sc: &api::LinuxContainerSecurityContext, image_user: &str) -> String {
    if !sc.run_as_username.is_empty() {
        sc.run_as_username.clone()
    } else if let Some(u) = &sc.run_as_user {
        u.value.to_string()
    } else if !image_user.is_empty() {
        image_user.split(':').next().unwrap_or_default().to_string()
    } else {
        "0".to_string()
    }
}

fn member_groups(user: &str, db: &UserDb<'_>) -> Result<Vec<u32>, SpecError> {
    let name = match user.parse::<u32>() {
        Ok(uid) => match db.find_passwd(|p| p.uid == uid)? {
            Some(p) => p.name,
            None => return Ok(Vec::new()),
        },
        Err(_) => user.to_string(),
    };
    db.gids_where(|g| g.members.contains(&name))
}

/// `uid`, `name`, `uid:gid`, `name:gid`, `uid:group`, `name:group` → (uid, gid).
fn resolve_userstr(userstr: &str, db: &UserDb<'_>) -> Result<(u32, u32), SpecError> {
    let parts: Vec<&str> = userstr.split(':').collect();
    match parts.as_slice() {
        [user] => match user.parse::<u32>() {
            // A uid need not exist; its gid comes from /etc/passwd when it does (else 0).
            Ok(uid) => Ok((uid, db.find_passwd(|p| p.uid == uid)?.map_or(0, |p| p.gid))),
            Err(_) => {
                let entry = lookup_user(user, db)?;
                Ok((entry.uid, entry.gid))
            }
        },
        [user, group] => {
            let uid = match user.parse::<u32>() {
                Ok(uid) => uid,
                Err(_) => lookup_user(user, db)?.uid,
            };
            let gid = match group.parse::<u32>() {
                Ok(gid) => gid,
                Err(_) => {
                    if group.is_empty() {
                        return Err(SpecError::Invalid(format!("invalid user {userstr:?}: empty group")));
                    }
                    db.find_group(|g| g.name == *group)?.map(|g| g.gid).ok_or_else(|| {
                        SpecError::Invalid(format!(
                            "group {group:?} (user {userstr:?}) not found in the image's /etc/group"
                        ))
                    })?
                }
            };
            Ok((uid, gid))
        }
        _ => Err(SpecError::Invalid(format!(
            "invalid user {userstr:?}: expected user[:group]"
        ))),
    }
}

fn lookup_user(name: &str, db: &UserDb<'_>) -> Result<PasswdEntry, SpecError> {
    if name.is_empty() {
        return Err(SpecError::Invalid("empty user name".into()));
    }
    db.find_passwd(|p| p.name == name)?
        .ok_or_else(|| SpecError::Invalid(format!("user {name:?} not found in the image's /etc/passwd")))
}

/// An id from a request (i64 on the wire) as a uid/gid: negative, too large and `(uid_t)-1`
/// are refused naming `what`.
pub fn id32(v: i64, what: &str) -> Result<u32, SpecError> {
    match u32::try_from(v) {
        Ok(id) if id != NO_ID => Ok(id),
        _ => Err(SpecError::Invalid(format!(
            "{what} {v} is not a valid id: ids run from 0 to {}",
            NO_ID - 1
        ))),
    }
}

/// The image's user database, scanned a line at a time for each lookup (a resolve makes at
/// most three), so neither file is ever held in memory whole.
struct UserDb<'a> {
    rootfs: &'a Path,
}

impl<'a> UserDb<'a> {
    fn new(rootfs: &'a Path) -> Self {
        UserDb { rootfs }
    }

    fn find_passwd(&self, want: impl Fn(&PasswdEntry) -> bool) -> Result<Option<PasswdEntry>, SpecError> {
        self.find("etc/passwd", parse_passwd_line, want)
    }

    fn find_group(&self, want: impl Fn(&GroupEntry) -> bool) -> Result<Option<GroupEntry>, SpecError> {
        self.find("etc/group", parse_group_line, want)
    }

    /// The first entry of the image's database `rel` that `parse` reads and `want` accepts.
    fn find<E>(
        &self,
        rel: &str,
        parse: impl Fn(&str) -> Option<E>,
        want: impl Fn(&E) -> bool,
    ) -> Result<Option<E>, SpecError> {
        let mut found = None;
        scan_db(self.rootfs, rel, |line| match parse(line) {
            Some(e) if want(&e) => {
                found = Some(e);
                false
            }
            _ => true,
        })?;
        Ok(found)
    }

    fn gids_where(&self, want: impl Fn(&GroupEntry) -> bool) -> Result<Vec<u32>, SpecError> {
        let mut gids = Vec::new();
        // Distinct gids, and only until there are more than the kernel allows: the answer is a
        // refusal then, whatever follows.
        let mut seen = std::collections::HashSet::new();
        scan_db(self.rootfs, "etc/group", |line| {
            if let Some(e) = parse_group_line(line).filter(|e| want(e)) {
                if seen.insert(e.gid) {
                    gids.push(e.gid);
                }
            }
            gids.len() <= MAX_GROUPS
        })?;
        Ok(gids)
    }
}

/// Feeds each line of the image's `rel` to `each` until it answers false. A missing file is an
/// empty database; anything unreadable (a symlink loop, a FIFO) is an error naming the file.
fn scan_db(rootfs: &Path, rel: &str, each: impl FnMut(&str) -> bool) -> Result<(), SpecError> {
    let err = |e: std::io::Error| SpecError::Invalid(format!("reading /{rel} of the container image: {e}"));
    match open_in_root(rootfs, rel).map_err(err)? {
        Some(file) => {
            let size = file.metadata().map_err(err)?.len();
            if size > MAX_DB {
                return Err(SpecError::Invalid(format!(
                    "/{rel} of the container image is {size} bytes (at most {MAX_DB} are read)"
                )));
            }
            for_each_line(BufReader::new(file), each).map_err(err)
        }
        None => Ok(()),
    }
}

/// Lines of at most MAX_LINE bytes; longer ones are skipped without being buffered.
fn for_each_line(mut r: impl BufRead, mut each: impl FnMut(&str) -> bool) -> std::io::Result<()> {
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut r).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut line)?;
        if n == 0 {
            return Ok(());
        }
        if line.len() > MAX_LINE {
            // Skip the rest of the over-long line.
            loop {
                let buf = r.fill_buf()?;
                if buf.is_empty() {
                    return Ok(());
                }
                match buf.iter().position(|&b| b == b'\n') {
                    Some(i) => {
                        r.consume(i + 1);
                        break;
                    }
                    None => {
                        let len = buf.len();
                        r.consume(len);
                    }
                }
            }
            continue;
        }
        if !each(String::from_utf8_lossy(&line).trim_end_matches('\n')) {
            return Ok(());
        }
    }
}

/// Opens the regular file `rel` of `rootfs` with every symlink resolved inside `rootfs`
/// (`RESOLVE_IN_ROOT`): Ok(None) when it does not exist there.
fn open_in_root(rootfs: &Path, rel: &str) -> std::io::Result<Option<std::fs::File>> {
    let root = open(
        rootfs,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map(unsafe_owned)?;
    let how = OpenHow::new()
        // O_NONBLOCK: opening a FIFO must not hang the daemon.
        .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS | ResolveFlag::RESOLVE_NO_XDEV);
    let rel = rel.trim_start_matches('/');
    let mut attempts = 0;
    let fd = loop {
        match openat2(root.as_raw_fd(), rel, how) {
            Err(Errno::EAGAIN) if attempts < OPENAT2_ATTEMPTS => attempts += 1,
            Err(Errno::ENOENT) => return Ok(None),
            Err(e) => return Err(e.into()),
            Ok(fd) => break unsafe_owned(fd),
        }
    };
    let st = fstat(fd.as_raw_fd())?;
    if SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT != SFlag::S_IFREG {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "not a regular file",
        ));
    }
    Ok(Some(std::fs::File::from(fd)))
}

/// The whole of `rel` inside `rootfs` (tests read what a lookup would see).
#[cfg(test)]
fn read_in_root(rootfs: &Path, rel: &str) -> std::io::Result<Option<String>> {
    let Some(mut f) = open_in_root(rootfs, rel)? else {
        return Ok(None);
    };
    let mut s = String::new();
    f.read_to_string(&mut s)?;
    Ok(Some(s))
}

/// Makes sure directory `path` exists in `rootfs`, creating what is missing (mode 0755, owned
/// by the daemon: root), every component resolved inside `rootfs` (`RESOLVE_IN_ROOT`), so a
/// symlink in the image cannot lead the creation out. Returns whether something was created.
pub fn ensure_dir_in_root(rootfs: &Path, path: &str) -> std::io::Result<bool> {
    let root = open(
        rootfs,
        OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map(unsafe_owned)?;
    let how = OpenHow::new()
        .flags(OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC)
        .resolve(ResolveFlag::RESOLVE_IN_ROOT | ResolveFlag::RESOLVE_NO_MAGICLINKS | ResolveFlag::RESOLVE_NO_XDEV);
    let open_dir = |rel: &str| -> Result<OwnedFd, Errno> {
        let rel = if rel.is_empty() { "." } else { rel };
        let mut attempts = 0;
        loop {
            match openat2(root.as_raw_fd(), rel, how) {
                Err(Errno::EAGAIN) if attempts < OPENAT2_ATTEMPTS => attempts += 1,
                Err(e) => return Err(e),
                Ok(fd) => return Ok(unsafe_owned(fd)),
            }
        }
    };
    let components: Vec<&str> = path.split('/').filter(|c| !c.is_empty() && *c != ".").collect();
    if components.contains(&"..") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "a path with \"..\"",
        ));
    }
    let mut created = false;
    for i in 0..components.len() {
        let rel = components[..=i].join("/");
        match open_dir(&rel) {
            Ok(_) => continue,
            Err(Errno::ENOENT) => {}
            Err(e) => return Err(e.into()),
        }
        // The parent resolved (inside the root); the name is created under it, not followed.
        let parent = open_dir(&components[..i].join("/"))?;
        match nix::sys::stat::mkdirat(Some(parent.as_raw_fd()), components[i], Mode::from_bits_truncate(0o755)) {
            Ok(()) => created = true,
            // Raced, or a dangling symlink: the next open tells.
            Err(Errno::EEXIST) => {}
            Err(e) => return Err(e.into()),
        }
        open_dir(&rel)?;
    }
    Ok(created)
}

fn unsafe_owned(fd: std::os::fd::RawFd) -> OwnedFd {
    // SAFETY: `fd` was just returned by a successful open and nothing else owns it.
    unsafe { OwnedFd::from_raw_fd(fd) }
}

/// `name:password:uid:gid:gecos:home:shell`; malformed lines and NIS (`+`/`-`) lines are None.
fn parse_passwd_line(line: &str) -> Option<PasswdEntry> {
    let line = line.trim_end_matches('\r');
    if line.is_empty() || line.starts_with('#') || line.starts_with('+') || line.starts_with('-') {
        return None;
    }
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 4 || f[0].is_empty() {
        return None;
    }
    Some(PasswdEntry {
        name: f[0].to_string(),
        uid: f[2].trim().parse().ok()?,
        gid: f[3].trim().parse().ok()?,
    })
}

/// `name:password:gid:member,member`; malformed lines are None.
fn parse_group_line(line: &str) -> Option<GroupEntry> {
    let line = line.trim_end_matches('\r');
    if line.is_empty() || line.starts_with('#') || line.starts_with('+') || line.starts_with('-') {
        return None;
    }
    let f: Vec<&str> = line.split(':').collect();
    if f.len() < 3 || f[0].is_empty() {
        return None;
    }
    Some(GroupEntry {
        name: f[0].to_string(),
        gid: f[2].trim().parse().ok()?,
        members: f
            .get(3)
            .map(|m| {
                m.split(',')
                    .map(str::trim)
                    .filter(|m| !m.is_empty())
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs;
    use std::os::unix::fs::symlink;

    const PASSWD: &str = "root:x:0:0:root:/root:/bin/sh\n\
                          # comment\n\
                          daemon:x:1:1::/:/sbin/nologin\n\
                          www-data:x:33:33:www:/var/www:/bin/false\n\
                          alice:x:1000:1001::/home/alice:/bin/sh\n\
                          broken:line\n";
    const GROUP: &str = "root:x:0:\n\
                         daemon:x:1:\n\
                         www-data:x:33:\n\
                         staff:x:50:alice,bob\n\
                         alice:x:1001:\n\
                         video:x:44:www-data, alice\n\
                         wheel:x:10:bob\n";

    fn rootfs() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        fs::create_dir_all(dir.path().join("etc")).unwrap();
        fs::write(dir.path().join("etc/passwd"), PASSWD).unwrap();
        fs::write(dir.path().join("etc/group"), GROUP).unwrap();
        dir
    }

    fn sc() -> api::LinuxContainerSecurityContext {
        api::LinuxContainerSecurityContext::default()
    }

    fn user(uid: u32, gid: u32, groups: &[u32]) -> User {
        User {
            uid,
            gid,
            additional_gids: groups.to_vec(),
        }
    }

    #[test]
    fn image_user_forms() {
        let r = rootfs();
        let p = r.path();
        assert_eq!(resolve(p, None, "", None).unwrap(), user(0, 0, &[0]));
        assert_eq!(resolve(p, None, "33", None).unwrap(), user(33, 33, &[33, 44]));
        assert_eq!(
            resolve(p, None, "4242", None).unwrap(),
            user(4242, 0, &[0]),
            "unknown uid: gid 0"
        );
        assert_eq!(
            resolve(p, None, "alice", None).unwrap(),
            user(1000, 1001, &[44, 50, 1001])
        );
        assert_eq!(
            resolve(p, None, "alice:staff", None).unwrap(),
            user(1000, 50, &[44, 50])
        );
        assert_eq!(resolve(p, None, "alice:7", None).unwrap(), user(1000, 7, &[7, 44, 50]));
        assert_eq!(resolve(p, None, "1003:1004", None).unwrap(), user(1003, 1004, &[1004]));
        assert_eq!(resolve(p, None, "1000:video", None).unwrap(), user(1000, 44, &[44, 50]));
        for bad in ["nobody", "alice:nogroup", "a:b:c", "nobody:1"] {
            let e = resolve(p, None, bad, None).unwrap_err();
            assert!(matches!(e, SpecError::Invalid(_)), "{bad}: {e}");
        }
    }

    #[test]
    fn security_context_overrides_the_image() {
        let r = rootfs();
        let p = r.path();
        let mut c = sc();
        c.run_as_user = Some(api::Int64Value { value: 1000 });
        assert_eq!(
            resolve(p, Some(&c), "www-data", None).unwrap(),
            user(1000, 1001, &[44, 50, 1001])
        );
        c.run_as_group = Some(api::Int64Value { value: 3000 });
        assert_eq!(
            resolve(p, Some(&c), "www-data", None).unwrap(),
            user(1000, 3000, &[44, 50, 3000])
        );
        c.run_as_username = "www-data".into();
        assert_eq!(resolve(p, Some(&c), "", None).unwrap(), user(33, 3000, &[44, 3000]));

        let mut only_group = sc();
        only_group.run_as_group = Some(api::Int64Value { value: 5 });
        assert!(resolve(p, Some(&only_group), "alice", None).is_err());

        let mut negative = sc();
        negative.run_as_user = Some(api::Int64Value { value: -1 });
        assert!(resolve(p, Some(&negative), "", None).is_err());
    }

    #[test]
    fn supplemental_groups_merge_and_strict() {
        let r = rootfs();
        let p = r.path();
        let mut c = sc();
        c.run_as_user = Some(api::Int64Value { value: 1000 });
        c.supplemental_groups = vec![60000, 50];
        assert_eq!(
            resolve(p, Some(&c), "", None).unwrap(),
            user(1000, 1001, &[44, 50, 1001, 60000])
        );
        c.set_supplemental_groups_policy(api::SupplementalGroupsPolicy::Strict);
        assert_eq!(
            resolve(p, Some(&c), "", None).unwrap(),
            user(1000, 1001, &[50, 1001, 60000])
        );
        c.supplemental_groups = vec![-3];
        assert!(resolve(p, Some(&c), "", None).is_err());
    }

    fn refused(r: Result<User, SpecError>, needle: &str) {
        match r {
            Err(SpecError::Invalid(m)) => assert!(m.contains(needle), "{needle:?} not in {m:?}"),
            other => panic!("want InvalidArgument naming {needle:?}, got {other:?}"),
        }
    }

    /// (uid_t)-1 from every source of ids is refused, naming the source (issue 13).
    #[test]
    fn no_id_is_refused_from_every_source() {
        let r = rootfs();
        let p = r.path();
        fs::write(
            p.join("etc/passwd"),
            format!("{PASSWD}evil:x:4294967295:0::/:/bin/sh\nevilgid:x:1000:4294967295::/:/bin/sh\n"),
        )
        .unwrap();
        fs::write(p.join("etc/group"), format!("{GROUP}nogroup:x:4294967295:alice\n")).unwrap();
        let strict = |mut c: api::LinuxContainerSecurityContext| {
            c.set_supplemental_groups_policy(api::SupplementalGroupsPolicy::Strict);
            c
        };

        let mut c = sc();
        c.run_as_user = Some(api::Int64Value { value: 4294967295 });
        refused(resolve(p, Some(&c), "", None), "run_as_user 4294967295");
        let mut c = sc();
        c.run_as_user = Some(api::Int64Value { value: 1000 });
        c.run_as_group = Some(api::Int64Value { value: 4294967295 });
        refused(resolve(p, Some(&c), "", None), "run_as_group 4294967295");
        let mut c = strict(sc());
        c.supplemental_groups = vec![4294967295];
        refused(resolve(p, Some(&c), "", None), "supplemental_groups 4294967295");
        let mut c = sc();
        c.run_as_username = "evil".into();
        refused(
            resolve(p, Some(&c), "", None),
            "security context's user \"evil\" (uid 4294967295)",
        );

        refused(resolve(p, None, "4294967295", None), "image's USER \"4294967295\"");
        refused(resolve(p, None, "1000:4294967295", None), "gid 4294967295");
        refused(resolve(p, None, "evil", None), "image's USER \"evil\" (uid 4294967295)");
        refused(resolve(p, None, "evilgid", None), "(gid 4294967295)");
        refused(
            resolve(p, Some(&strict(sc())), "1000:nogroup", None),
            "(gid 4294967295)",
        );
        // Merge: alice is a member of nogroup in the image's /etc/group.
        refused(resolve(p, None, "alice", None), "/etc/group");
        assert_eq!(
            resolve(p, Some(&strict(sc())), "alice", None).unwrap(),
            user(1000, 1001, &[1001])
        );
        // Out of u32 range entirely: refused too, never truncated.
        let mut c = sc();
        c.supplemental_groups = vec![4294967296];
        refused(resolve(p, Some(&c), "", None), "supplemental_groups 4294967296");
        assert_eq!(id32(4294967294, "x").unwrap(), 4294967294);
    }

    /// In a pod with its own user namespace, ids the namespace does not map are refused.
    #[test]
    fn ids_outside_the_pods_user_namespace_are_refused() {
        use crate::oci::userns::IdRange;
        let r = rootfs();
        let p = r.path();
        let range = IdRange {
            container_id: 0,
            host_id: 65536 * 5,
            length: 65536,
        };
        let ns = PodUserNs {
            uids: range,
            gids: range,
        };
        assert_eq!(
            resolve(p, None, "1000:65535", Some(&ns)).unwrap(),
            user(1000, 65535, &[44, 50, 65535])
        );
        refused(resolve(p, None, "65536", Some(&ns)), "uid 65536 is not mapped");
        refused(resolve(p, None, "1000:70000", Some(&ns)), "gid 70000 is not mapped");
        let mut c = sc();
        c.supplemental_groups = vec![65536];
        refused(resolve(p, Some(&c), "", Some(&ns)), "supplemental_groups entry 65536");
    }

    /// A user database far bigger than any real one is scanned, not refused (issue 13, point 5),
    /// up to MAX_DB.
    #[test]
    fn big_user_databases_are_scanned_a_line_at_a_time() {
        let r = rootfs();
        let p = r.path();
        let mut passwd = String::with_capacity(12 << 20);
        for i in 0..200_000 {
            passwd.push_str(&format!(
                "user{i}:x:{}:{}::/home/user{i}:/bin/sh\n",
                10_000 + i,
                10_000 + i
            ));
        }
        // An over-long line (no newline for 1 MiB) is skipped, not buffered whole.
        passwd.push_str(&"z".repeat(1 << 20));
        passwd.push_str("\nlast:x:4242:4343::/:/bin/sh\n");
        assert!(passwd.len() > 8 << 20);
        fs::write(p.join("etc/passwd"), passwd).unwrap();
        assert_eq!(resolve(p, None, "last", None).unwrap(), user(4242, 4343, &[4343]));
        assert_eq!(
            resolve(p, None, "user199999", None).unwrap(),
            user(209_999, 209_999, &[209_999])
        );
    }

    /// Hostile group databases (containerd CVE-2026-47262's unbounded group parsing): membership
    /// in more groups than the kernel takes is refused (duplicates count once), and a database
    /// past MAX_DB is refused unread.
    #[test]
    fn hostile_group_databases_are_bounded() {
        let r = rootfs();
        let p = r.path();
        let mut group = String::new();
        for _ in 0..70_000 {
            group.push_str("dup:x:777:root\n");
        }
        group.push_str("late:x:778:root\n");
        fs::write(p.join("etc/group"), &group).unwrap();
        assert_eq!(resolve(p, None, "root", None).unwrap(), user(0, 0, &[0, 777, 778]));

        let mut group = String::new();
        for g in 0..(MAX_GROUPS as u32 + 10) {
            group.push_str(&format!("g{g}:x:{}:root\n", 100_000 + g));
        }
        fs::write(p.join("etc/group"), &group).unwrap();
        refused(resolve(p, None, "root", None), "the kernel allows 65536");

        let big = fs::File::create(p.join("etc/group")).unwrap();
        big.set_len(MAX_DB + 1).unwrap();
        refused(
            resolve(p, None, "root", None),
            "/etc/group of the container image is 67108865 bytes",
        );
        let big = fs::File::create(p.join("etc/passwd")).unwrap();
        big.set_len(MAX_DB + 1).unwrap();
        refused(
            resolve(p, None, "nobody", None),
            "/etc/passwd of the container image is",
        );
    }

    #[test]
    fn no_user_database() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(resolve(dir.path(), None, "1000", None).unwrap(), user(1000, 0, &[0]));
        assert_eq!(
            resolve(dir.path(), None, "1000:1000", None).unwrap(),
            user(1000, 1000, &[1000])
        );
        assert!(resolve(dir.path(), None, "alice", None).is_err());
    }

    /// A host-looking tree next to the rootfs, with a user only the host has.
    fn host_and_root() -> (tempfile::TempDir, std::path::PathBuf) {
        let host = tempfile::tempdir().unwrap();
        fs::create_dir_all(host.path().join("etc")).unwrap();
        fs::write(host.path().join("etc/passwd"), "hostonly:x:4242:4242::/:/bin/sh\n").unwrap();
        fs::write(host.path().join("etc/shadow"), "hostonly:x:4242:4242::/:/bin/sh\n").unwrap();
        let root = host.path().join("rootfs");
        fs::create_dir_all(root.join("etc")).unwrap();
        (host, root)
    }

    #[test]
    fn hostile_symlinks_stay_inside_the_rootfs() {
        let (host, root) = host_and_root();
        let passwd = root.join("etc/passwd");

        // ../../etc/passwd from rootfs/etc is the host's file without RESOLVE_IN_ROOT; inside
        // the root it is the link itself (a loop).
        symlink("../../etc/passwd", &passwd).unwrap();
        assert!(
            fs::read_to_string(&passwd).unwrap().contains("hostonly"),
            "the test really points outside"
        );
        let e = resolve(&root, None, "hostonly", None).unwrap_err();
        assert!(!e.to_string().contains("4242"), "{e}");
        assert!(read_in_root(&root, "etc/passwd").is_err());

        // An absolute link to the host's file resolves to <rootfs>/<that path>: absent.
        fs::remove_file(&passwd).unwrap();
        symlink(host.path().join("etc/shadow"), &passwd).unwrap();
        assert!(fs::read_to_string(&passwd).unwrap().contains("hostonly"));
        assert_eq!(read_in_root(&root, "etc/passwd").unwrap(), None);
        assert!(resolve(&root, None, "hostonly", None).is_err());
        assert_eq!(resolve(&root, None, "4242", None).unwrap(), user(4242, 0, &[0]));

        // /etc/shadow of the rootfs, not of the host.
        fs::remove_file(&passwd).unwrap();
        symlink("/etc/shadow", &passwd).unwrap();
        assert_eq!(read_in_root(&root, "etc/passwd").unwrap(), None);
        fs::write(root.join("etc/shadow"), "inroot:x:7:8::/:/bin/sh\n").unwrap();
        assert_eq!(resolve(&root, None, "inroot", None).unwrap(), user(7, 8, &[8]));

        // A symlinked /etc directory is resolved inside the root too.
        fs::remove_dir_all(root.join("etc")).unwrap();
        symlink("../etc", root.join("etc")).unwrap();
        assert!(fs::read_to_string(root.join("etc/passwd"))
            .unwrap()
            .contains("hostonly"));
        // Inside the root, /etc → /etc is a loop.
        assert!(read_in_root(&root, "etc/passwd").is_err());
        assert!(resolve(&root, None, "hostonly", None).is_err());
        fs::remove_file(root.join("etc")).unwrap();
        fs::create_dir_all(root.join("real/etc")).unwrap();
        fs::write(root.join("real/etc/passwd"), "real:x:9:9::/:/bin/sh\n").unwrap();
        symlink("/real/etc", root.join("etc")).unwrap();
        assert_eq!(resolve(&root, None, "real", None).unwrap(), user(9, 9, &[9]));
    }

    #[test]
    fn fifos_and_directories_are_refused_without_blocking() {
        let (_host, root) = host_and_root();
        nix::unistd::mkfifo(&root.join("etc/passwd"), Mode::from_bits_truncate(0o644)).unwrap();
        assert!(resolve(&root, None, "alice", None).is_err());
        fs::create_dir(root.join("etc/group")).unwrap();
        assert!(read_in_root(&root, "etc/group").is_err());
    }

    #[test]
    fn directories_are_created_inside_the_root_only() {
        let dir = tempfile::tempdir().unwrap();
        let rootfs = dir.path().join("rootfs");
        let outside = dir.path().join("outside");
        std::fs::create_dir_all(rootfs.join("etc")).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        assert!(ensure_dir_in_root(&rootfs, "/work/dir").unwrap());
        assert!(rootfs.join("work/dir").is_dir());
        assert!(!ensure_dir_in_root(&rootfs, "/work/dir/").unwrap(), "exists already");
        assert!(!ensure_dir_in_root(&rootfs, "/").unwrap());
        // An absolute symlink and a `..` one both resolve inside the rootfs.
        std::os::unix::fs::symlink(&outside, rootfs.join("abs")).unwrap();
        std::os::unix::fs::symlink("../../outside", rootfs.join("etc/rel")).unwrap();
        // Dangling inside the rootfs: refused, and nothing is created outside.
        assert!(ensure_dir_in_root(&rootfs, "/abs/x").is_err());
        assert!(ensure_dir_in_root(&rootfs, "/etc/rel/y").is_err());
        assert_eq!(std::fs::read_dir(&outside).unwrap().count(), 0);
        std::fs::create_dir_all(rootfs.join(outside.strip_prefix("/").unwrap())).unwrap();
        std::fs::create_dir_all(rootfs.join("outside")).unwrap();
        ensure_dir_in_root(&rootfs, "/abs/x").unwrap();
        ensure_dir_in_root(&rootfs, "/etc/rel/y").unwrap();
        assert_eq!(
            std::fs::read_dir(&outside).unwrap().count(),
            0,
            "nothing created outside"
        );
        assert!(rootfs.join(outside.strip_prefix("/").unwrap()).join("x").is_dir());
        assert!(rootfs.join("outside/y").is_dir());
        // A file in the way, and "..", are errors.
        std::fs::write(rootfs.join("file"), "").unwrap();
        assert!(ensure_dir_in_root(&rootfs, "/file/sub").is_err());
        assert!(ensure_dir_in_root(&rootfs, "/a/../b").is_err());
    }

    #[test]
    fn parsers_skip_garbage() {
        let p: Vec<_> = "a:x:1:2\n:x:3:3\nb:x:notanumber:1\n+nis\nc:x:4:5:::\n"
            .lines()
            .filter_map(parse_passwd_line)
            .collect();
        assert_eq!(p.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["a", "c"]);
        let g: Vec<_> = "g:x:5\nh:x:6:u1,,u2\n".lines().filter_map(parse_group_line).collect();
        assert_eq!(g[0].members, Vec::<String>::new());
        assert_eq!(g[1].members, ["u1", "u2"]);
    }
}
