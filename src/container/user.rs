//! The user a container runs as: the security context's run_as_user / run_as_username /
//! run_as_group, else the image's USER (`name`, `uid`, `name:group`, `uid:gid`), with names,
//! the primary gid and (SupplementalGroupsPolicy Merge) the user's groups looked up in the
//! container's own /etc/passwd and /etc/group — the way containerd's `oci.WithUser` and
//! `WithAdditionalGIDs` do it.
//!
//! The rootfs is hostile: /etc/passwd may be a symlink to /etc/shadow, `../../etc/passwd`, a
//! FIFO or a device. Both files are opened with `openat2(RESOLVE_IN_ROOT)` relative to a
//! descriptor of the rootfs directory, so every symlink (absolute or `..`) resolves inside the
//! rootfs; only regular files are read, opened non-blocking and size-capped.

use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::{open, openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{fstat, Mode, SFlag};

use super::spec::SpecError;
use crate::api;

/// /etc/passwd or /etc/group bigger than this is not a user database.
const MAX_DB_SIZE: u64 = 8 << 20;
/// openat2 answers EAGAIN when a rename raced the lookup; retrying is safe.
const OPENAT2_ATTEMPTS: usize = 16;

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

/// The user for a container: `sc` is the container's security context (None → image USER).
pub fn resolve(
    rootfs: &Path,
    sc: Option<&api::LinuxContainerSecurityContext>,
    image_user: &str,
) -> Result<User, SpecError> {
    let default_sc = api::LinuxContainerSecurityContext::default();
    let sc = sc.unwrap_or(&default_sc);
    let db = UserDb::new(rootfs);

    let userstr = requested_user(sc)?.unwrap_or_else(|| image_user.to_string());
    let (uid, gid) = if userstr.is_empty() {
        (0, 0)
    } else {
        resolve_userstr(&userstr, &db)?
    };

    let mut groups = vec![gid];
    if sc.supplemental_groups_policy() == api::SupplementalGroupsPolicy::Merge {
        groups.extend(member_groups(&membership_name(sc, image_user), &db)?);
    }
    for g in &sc.supplemental_groups {
        groups.push(id32(*g, "supplemental group")?);
    }
    groups.sort_unstable();
    groups.dedup();
    Ok(User {
        uid,
        gid,
        additional_gids: groups,
    })
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
        Ok(uid) => match db.passwd()?.into_iter().find(|p| p.uid == uid) {
            Some(p) => p.name,
            None => return Ok(Vec::new()),
        },
        Err(_) => user.to_string(),
    };
    Ok(db
        .group()?
        .into_iter()
        .filter(|g| g.members.contains(&name))
        .map(|g| g.gid)
        .collect())
}

/// `uid`, `name`, `uid:gid`, `name:gid`, `uid:group`, `name:group` → (uid, gid).
fn resolve_userstr(userstr: &str, db: &UserDb<'_>) -> Result<(u32, u32), SpecError> {
    let parts: Vec<&str> = userstr.split(':').collect();
    match parts.as_slice() {
        [user] => match user.parse::<u32>() {
            // A uid need not exist; its gid comes from /etc/passwd when it does (else 0).
            Ok(uid) => Ok((uid, db.passwd()?.iter().find(|p| p.uid == uid).map_or(0, |p| p.gid))),
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
                    db.group()?
                        .into_iter()
                        .find(|g| g.name == *group)
                        .map(|g| g.gid)
                        .ok_or_else(|| {
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
    db.passwd()?
        .into_iter()
        .find(|p| p.name == name)
        .ok_or_else(|| SpecError::Invalid(format!("user {name:?} not found in the image's /etc/passwd")))
}

fn id32(v: i64, what: &str) -> Result<u32, SpecError> {
    u32::try_from(v).map_err(|_| SpecError::Invalid(format!("{what} {v} is out of range")))
}

/// The image's user database, read on first use.
struct UserDb<'a> {
    rootfs: &'a Path,
    passwd: std::cell::OnceCell<Vec<PasswdEntry>>,
    group: std::cell::OnceCell<Vec<GroupEntry>>,
}

impl<'a> UserDb<'a> {
    fn new(rootfs: &'a Path) -> Self {
        UserDb {
            rootfs,
            passwd: Default::default(),
            group: Default::default(),
        }
    }

    fn passwd(&self) -> Result<Vec<PasswdEntry>, SpecError> {
        if let Some(v) = self.passwd.get() {
            return Ok(v.clone());
        }
        let text = read_db(self.rootfs, "etc/passwd")?;
        Ok(self.passwd.get_or_init(|| parse_passwd(&text)).clone())
    }

    fn group(&self) -> Result<Vec<GroupEntry>, SpecError> {
        if let Some(v) = self.group.get() {
            return Ok(v.clone());
        }
        let text = read_db(self.rootfs, "etc/group")?;
        Ok(self.group.get_or_init(|| parse_group(&text)).clone())
    }
}

/// A missing file is an empty database; anything unreadable (a symlink loop, a FIFO) is an error.
fn read_db(rootfs: &Path, rel: &str) -> Result<String, SpecError> {
    match read_in_root(rootfs, rel) {
        Ok(Some(text)) => Ok(text),
        Ok(None) => Ok(String::new()),
        Err(e) => Err(SpecError::Invalid(format!(
            "reading /{rel} of the container image: {e}"
        ))),
    }
}

/// Reads the regular file `rel` of `rootfs` with every symlink resolved inside `rootfs`
/// (`RESOLVE_IN_ROOT`): Ok(None) when it does not exist there.
pub fn read_in_root(rootfs: &Path, rel: &str) -> std::io::Result<Option<String>> {
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
    if st.st_size as u64 > MAX_DB_SIZE {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, "file too large"));
    }
    let mut buf = Vec::new();
    std::fs::File::from(fd).take(MAX_DB_SIZE).read_to_end(&mut buf)?;
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
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

/// `name:password:uid:gid:gecos:home:shell`; malformed lines and NIS (`+`/`-`) lines skipped.
pub fn parse_passwd(text: &str) -> Vec<PasswdEntry> {
    text.lines()
        .filter_map(|line| {
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
        })
        .collect()
}

/// `name:password:gid:member,member`; malformed lines skipped.
pub fn parse_group(text: &str) -> Vec<GroupEntry> {
    text.lines()
        .filter_map(|line| {
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
        })
        .collect()
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
        assert_eq!(resolve(p, None, "").unwrap(), user(0, 0, &[0]));
        assert_eq!(resolve(p, None, "33").unwrap(), user(33, 33, &[33, 44]));
        assert_eq!(
            resolve(p, None, "4242").unwrap(),
            user(4242, 0, &[0]),
            "unknown uid: gid 0"
        );
        assert_eq!(resolve(p, None, "alice").unwrap(), user(1000, 1001, &[44, 50, 1001]));
        assert_eq!(resolve(p, None, "alice:staff").unwrap(), user(1000, 50, &[44, 50]));
        assert_eq!(resolve(p, None, "alice:7").unwrap(), user(1000, 7, &[7, 44, 50]));
        assert_eq!(resolve(p, None, "1003:1004").unwrap(), user(1003, 1004, &[1004]));
        assert_eq!(resolve(p, None, "1000:video").unwrap(), user(1000, 44, &[44, 50]));
        for bad in ["nobody", "alice:nogroup", "a:b:c", "nobody:1"] {
            let e = resolve(p, None, bad).unwrap_err();
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
            resolve(p, Some(&c), "www-data").unwrap(),
            user(1000, 1001, &[44, 50, 1001])
        );
        c.run_as_group = Some(api::Int64Value { value: 3000 });
        assert_eq!(
            resolve(p, Some(&c), "www-data").unwrap(),
            user(1000, 3000, &[44, 50, 3000])
        );
        c.run_as_username = "www-data".into();
        assert_eq!(resolve(p, Some(&c), "").unwrap(), user(33, 3000, &[44, 3000]));

        let mut only_group = sc();
        only_group.run_as_group = Some(api::Int64Value { value: 5 });
        assert!(resolve(p, Some(&only_group), "alice").is_err());

        let mut negative = sc();
        negative.run_as_user = Some(api::Int64Value { value: -1 });
        assert!(resolve(p, Some(&negative), "").is_err());
    }

    #[test]
    fn supplemental_groups_merge_and_strict() {
        let r = rootfs();
        let p = r.path();
        let mut c = sc();
        c.run_as_user = Some(api::Int64Value { value: 1000 });
        c.supplemental_groups = vec![60000, 50];
        assert_eq!(
            resolve(p, Some(&c), "").unwrap(),
            user(1000, 1001, &[44, 50, 1001, 60000])
        );
        c.set_supplemental_groups_policy(api::SupplementalGroupsPolicy::Strict);
        assert_eq!(resolve(p, Some(&c), "").unwrap(), user(1000, 1001, &[50, 1001, 60000]));
        c.supplemental_groups = vec![-3];
        assert!(resolve(p, Some(&c), "").is_err());
    }

    #[test]
    fn no_user_database() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(resolve(dir.path(), None, "1000").unwrap(), user(1000, 0, &[0]));
        assert_eq!(
            resolve(dir.path(), None, "1000:1000").unwrap(),
            user(1000, 1000, &[1000])
        );
        assert!(resolve(dir.path(), None, "alice").is_err());
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
        let e = resolve(&root, None, "hostonly").unwrap_err();
        assert!(!e.to_string().contains("4242"), "{e}");
        assert!(read_in_root(&root, "etc/passwd").is_err());

        // An absolute link to the host's file resolves to <rootfs>/<that path>: absent.
        fs::remove_file(&passwd).unwrap();
        symlink(host.path().join("etc/shadow"), &passwd).unwrap();
        assert!(fs::read_to_string(&passwd).unwrap().contains("hostonly"));
        assert_eq!(read_in_root(&root, "etc/passwd").unwrap(), None);
        assert!(resolve(&root, None, "hostonly").is_err());
        assert_eq!(resolve(&root, None, "4242").unwrap(), user(4242, 0, &[0]));

        // /etc/shadow of the rootfs, not of the host.
        fs::remove_file(&passwd).unwrap();
        symlink("/etc/shadow", &passwd).unwrap();
        assert_eq!(read_in_root(&root, "etc/passwd").unwrap(), None);
        fs::write(root.join("etc/shadow"), "inroot:x:7:8::/:/bin/sh\n").unwrap();
        assert_eq!(resolve(&root, None, "inroot").unwrap(), user(7, 8, &[8]));

        // A symlinked /etc directory is resolved inside the root too.
        fs::remove_dir_all(root.join("etc")).unwrap();
        symlink("../etc", root.join("etc")).unwrap();
        assert!(fs::read_to_string(root.join("etc/passwd"))
            .unwrap()
            .contains("hostonly"));
        // Inside the root, /etc → /etc is a loop.
        assert!(read_in_root(&root, "etc/passwd").is_err());
        assert!(resolve(&root, None, "hostonly").is_err());
        fs::remove_file(root.join("etc")).unwrap();
        fs::create_dir_all(root.join("real/etc")).unwrap();
        fs::write(root.join("real/etc/passwd"), "real:x:9:9::/:/bin/sh\n").unwrap();
        symlink("/real/etc", root.join("etc")).unwrap();
        assert_eq!(resolve(&root, None, "real").unwrap(), user(9, 9, &[9]));
    }

    #[test]
    fn fifos_and_directories_are_refused_without_blocking() {
        let (_host, root) = host_and_root();
        nix::unistd::mkfifo(&root.join("etc/passwd"), Mode::from_bits_truncate(0o644)).unwrap();
        assert!(resolve(&root, None, "alice").is_err());
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
        let p = parse_passwd("a:x:1:2\n:x:3:3\nb:x:notanumber:1\n+nis\nc:x:4:5:::\n");
        assert_eq!(p.iter().map(|e| e.name.as_str()).collect::<Vec<_>>(), ["a", "c"]);
        let g = parse_group("g:x:5\nh:x:6:u1,,u2\n");
        assert_eq!(g[0].members, Vec::<String>::new());
        assert_eq!(g[1].members, ["u1", "u2"]);
    }
}
