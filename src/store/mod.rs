//! Metadata store: typed records per object kind in one redb database (`<root>/meta.redb`).
//!
//! redb gives ACID transactions with a durable commit (fsync) per write transaction, so a crash
//! leaves either the old or the new state, never half a record. The store is the truth for what
//! *should* exist; recovery (later issues) reconciles it with what runs.
//!
//! Every kind has its own table keyed by full ID; values are JSON so records can grow fields
//! (with `#[serde(default)]`) without a migration. Names (`<pod namespace>_<pod name>_…`, as the
//! kubelet builds them) are reserved in a separate table in the same transaction as the record,
//! so a name can never point at a record that doesn't exist.
//!
//! All calls are synchronous; a write waits for its fsync (and for the writes before it), so it
//! runs through [`crate::blocking::run`], which keeps an async caller's worker free for others.
//!
//! Reads come from a cache of decoded records (see [`Cache`]): decoding JSON was most of what
//! ListContainers and ListPodSandbox cost with 1000 records (issue 21).

use std::any::{Any, TypeId};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use redb::{Database, ReadableTable, TableDefinition};
use serde::{de::DeserializeOwned, Serialize};

/// Bumped when a record layout changes incompatibly; a store written by a newer scute is refused
/// rather than misread.
pub const SCHEMA_VERSION: u64 = 1;

const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const NAMES: TableDefinition<&str, &str> = TableDefinition::new("names");
const SCHEMA_KEY: &str = "schema_version";

/// The kinds of object the store keeps, one table each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Sandbox,
    Container,
    Image,
    Snapshot,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Sandbox => "sandbox",
            Kind::Container => "container",
            Kind::Image => "image",
            Kind::Snapshot => "snapshot",
        }
    }

    fn table(self) -> TableDefinition<'static, &'static str, &'static [u8]> {
        match self {
            Kind::Sandbox => TableDefinition::new("sandboxes"),
            Kind::Container => TableDefinition::new("containers"),
            Kind::Image => TableDefinition::new("images"),
            Kind::Snapshot => TableDefinition::new("snapshots"),
        }
    }

    fn name_key(self, name: &str) -> String {
        format!("{}/{}", self.as_str(), name)
    }
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A record kept in the store under its kind's table.
pub trait Record: Serialize + DeserializeOwned + Clone + Send + Sync + 'static {
    const KIND: Kind;
    fn id(&self) -> &str;
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{kind} {id:?} not found")]
    NotFound { kind: Kind, id: String },
    #[error("{kind} ID prefix {prefix:?} is ambiguous: it matches {matches} {kind}s; give more characters")]
    Ambiguous { kind: Kind, prefix: String, matches: usize },
    #[error("{kind} name {name:?} is already reserved by {kind} {holder}")]
    NameTaken { kind: Kind, name: String, holder: String },
    #[error("{kind} {id} already exists")]
    AlreadyExists { kind: Kind, id: String },
    #[error(
        "store {path} has schema version {found}, newer than this scute supports ({supported}); run a newer scute"
    )]
    SchemaTooNew { path: PathBuf, found: u64, supported: u64 },
    #[error("store {path} is in use by another process (is another scute running with the same root?)")]
    Locked { path: PathBuf },
    #[error("{kind} {id} in the store is unreadable: {source}")]
    Corrupt {
        kind: Kind,
        id: String,
        source: serde_json::Error,
    },
    #[error("daemon setting {key:?} in the store is unreadable: {source}")]
    BadSetting { key: String, source: serde_json::Error },
    #[error("metadata store: {0}")]
    Db(Box<redb::Error>),
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for Error {
            fn from(e: $t) -> Self {
                Error::Db(Box::new(e.into()))
            }
        }
    )*};
}
from_redb!(
    redb::Error,
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError
);

pub struct Store {
    db: Database,
    path: PathBuf,
    cache: Cache,
}

/// The committed records of each record type read so far, decoded, so that a list or a get
/// clones them instead of parsing JSON. A type's records are loaded on its first read; every
/// write through the store updates them after its commit. `writes` is held from a write's
/// transaction to its cache update, and across a load, so the cache follows the commit order
/// and a load never misses a write. (No crate caches a redb table's decoded values.)
#[derive(Default)]
struct Cache {
    writes: Mutex<()>,
    types: Mutex<HashMap<TypeId, Loaded>>,
}

/// One record type's records, by ID.
struct Loaded {
    kind: Kind,
    records: BTreeMap<String, Cached>,
}

/// Cheap to clone: readers copy these under the lock and the records after releasing it.
#[derive(Clone)]
enum Cached {
    Decoded(Arc<dyn Any + Send + Sync>),
    /// Kept as stored (ID, bytes): every read reports it as corrupt, as reading the table would.
    Undecodable(Arc<(String, Box<[u8]>)>),
}

impl Cached {
    /// What reading the stored bytes gives: the decoded record, or the error it did.
    fn from_stored<R: Record>(id: &str, bytes: &[u8]) -> Cached {
        match decode::<R>(id, bytes) {
            Ok(record) => Cached::Decoded(Arc::new(record)),
            Err(_) => Cached::Undecodable(Arc::new((id.to_string(), bytes.into()))),
        }
    }

    fn record<R: Record>(&self) -> Result<R> {
        self.shared().map(Arc::unwrap_or_clone)
    }

    fn shared<R: Record>(&self) -> Result<Arc<R>> {
        match self {
            Cached::Decoded(any) => Ok(any
                .clone()
                .downcast::<R>()
                .expect("records are cached under their own TypeId")),
            Cached::Undecodable(stored) => decode::<R>(&stored.0, &stored.1).map(Arc::new),
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic elsewhere with the lock held leaves the cache as consistent as before it.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Store {
    /// Opens (creating if needed) the store at `path`, checking its schema version.
    pub fn open(path: &Path) -> Result<Store> {
        let io_error = |e: std::io::Error| Error::Db(Box::new(redb::StorageError::Io(e).into()));
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(io_error)?;
        }
        // Root's alone (records hold pod configs, env and mounts): made 0600 before redb opens
        // it, and tightened if an older scute left it world-readable.
        {
            use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
            let with_path =
                |e: std::io::Error| io_error(std::io::Error::new(e.kind(), format!("{}: {e}", path.display())));
            let file = std::fs::OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .open(path)
                .map_err(with_path)?;
            file.set_permissions(std::fs::Permissions::from_mode(0o600))
                .map_err(with_path)?;
        }
        let db = Database::create(path).map_err(|e| match e {
            redb::DatabaseError::DatabaseAlreadyOpen => Error::Locked {
                path: path.to_path_buf(),
            },
            other => other.into(),
        })?;
        let store = Store {
            db,
            path: path.to_path_buf(),
            cache: Cache::default(),
        };
        store.init_schema()?;
        Ok(store)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    fn init_schema(&self) -> Result<()> {
        let tx = self.db.begin_write()?;
        {
            let mut meta = tx.open_table(META)?;
            let found = meta.get(SCHEMA_KEY)?.map(|v| decode_u64(v.value()));
            match found {
                Some(found) if found > SCHEMA_VERSION => {
                    return Err(Error::SchemaTooNew {
                        path: self.path.clone(),
                        found,
                        supported: SCHEMA_VERSION,
                    });
                }
                Some(_) => {}
                None => {
                    meta.insert(SCHEMA_KEY, SCHEMA_VERSION.to_be_bytes().as_slice())?;
                }
            }
            // Create every table up front so read transactions never meet a missing table.
            tx.open_table(NAMES)?;
            for kind in [Kind::Sandbox, Kind::Container, Kind::Image, Kind::Snapshot] {
                tx.open_table(kind.table())?;
            }
        }
        tx.commit()?;
        Ok(())
    }

    pub fn schema_version(&self) -> Result<u64> {
        let tx = self.db.begin_read()?;
        let meta = tx.open_table(META)?;
        Ok(meta.get(SCHEMA_KEY)?.map(|v| decode_u64(v.value())).unwrap_or(0))
    }

    /// Inserts or replaces a record.
    pub fn put<R: Record>(&self, record: &R) -> Result<()> {
        let bytes = serde_json::to_vec(record).map_err(|source| Error::Corrupt {
            kind: R::KIND,
            id: record.id().to_string(),
            source,
        })?;
        crate::blocking::run(|| {
            let _writes = lock(&self.cache.writes);
            let tx = self.db.begin_write()?;
            tx.open_table(R::KIND.table())?.insert(record.id(), bytes.as_slice())?;
            tx.commit()?;
            self.cached_write::<R>(record.id(), Some(&bytes));
            Ok(())
        })
    }

    /// Reserves `name` for the record and inserts it, in one transaction. Retrying with the same
    /// record ID is not an error (a kubelet retry after a timeout must not trip over itself).
    pub fn create<R: Record>(&self, name: &str, record: &R) -> Result<()> {
        let bytes = serde_json::to_vec(record).map_err(|source| Error::Corrupt {
            kind: R::KIND,
            id: record.id().to_string(),
            source,
        })?;
        crate::blocking::run(|| {
            let _writes = lock(&self.cache.writes);
            let tx = self.db.begin_write()?;
            {
                let mut names = tx.open_table(NAMES)?;
                let key = R::KIND.name_key(name);
                let holder = names.get(key.as_str())?.map(|v| v.value().to_string());
                match holder {
                    Some(holder) if holder != record.id() => {
                        return Err(Error::NameTaken {
                            kind: R::KIND,
                            name: name.to_string(),
                            holder,
                        });
                    }
                    Some(_) => {}
                    None => {
                        names.insert(key.as_str(), record.id())?;
                    }
                }
                tx.open_table(R::KIND.table())?.insert(record.id(), bytes.as_slice())?;
            }
            tx.commit()?;
            self.cached_write::<R>(record.id(), Some(&bytes));
            Ok(())
        })
    }

    pub fn get<R: Record>(&self, id: &str) -> Result<Option<R>> {
        let cached = self.with_loaded::<R, _>(|loaded| loaded.records.get(id).cloned())?;
        cached.map(|c| c.record::<R>()).transpose()
    }

    /// Every record of the type, in ID order.
    pub fn list<R: Record>(&self) -> Result<Vec<R>> {
        Ok(self.list_shared::<R>()?.into_iter().map(Arc::unwrap_or_clone).collect())
    }

    /// Every record of the type, shared with the cache rather than copied: for listings that
    /// only read them (cloning each of 1000 containers was a good part of a ListContainers).
    pub fn list_shared<R: Record>(&self) -> Result<Vec<Arc<R>>> {
        let cached = self.with_loaded::<R, _>(|loaded| loaded.records.values().cloned().collect::<Vec<_>>())?;
        cached.iter().map(Cached::shared::<R>).collect()
    }

    /// Runs `f` on the type's cached records, loading them from the table on first use. `f` runs
    /// under the cache's lock: it only copies `Cached` handles (records are cloned, if at all, after).
    fn with_loaded<R: Record, T>(&self, f: impl Fn(&Loaded) -> T) -> Result<T> {
        if let Some(loaded) = lock(&self.cache.types).get(&TypeId::of::<R>()) {
            return Ok(f(loaded));
        }
        let _writes = lock(&self.cache.writes);
        let mut records = BTreeMap::new();
        {
            let tx = self.db.begin_read()?;
            let table = tx.open_table(R::KIND.table())?;
            for entry in table.iter()? {
                let (id, value) = entry?;
                let (id, value) = (id.value(), value.value());
                records.insert(id.to_string(), Cached::from_stored::<R>(id, value));
            }
        }
        let mut types = lock(&self.cache.types);
        let loaded = types
            .entry(TypeId::of::<R>())
            .or_insert(Loaded { kind: R::KIND, records });
        Ok(f(loaded))
    }

    /// After a committed write of `id` (`stored`: its bytes; `None`: deleted): the type's cache
    /// follows with the record read back from those bytes (what a restart reads, not the
    /// caller's value, which a JSON round trip may change); another type read from the same
    /// table (tests do that) is dropped, to be loaded again.
    fn cached_write<R: Record>(&self, id: &str, stored: Option<&[u8]>) {
        let mut types = lock(&self.cache.types);
        types.retain(|type_id, loaded| loaded.kind != R::KIND || *type_id == TypeId::of::<R>());
        if let Some(loaded) = types.get_mut(&TypeId::of::<R>()) {
            match stored {
                Some(bytes) => loaded
                    .records
                    .insert(id.to_string(), Cached::from_stored::<R>(id, bytes)),
                None => loaded.records.remove(id),
            };
        }
    }

    /// Deletes a record and releases its name (if it holds one). Deleting an absent record is
    /// not an error: Remove RPCs are idempotent. Returns whether a record was deleted.
    pub fn delete<R: Record>(&self, id: &str, name: Option<&str>) -> Result<bool> {
        crate::blocking::run(|| {
            let _writes = lock(&self.cache.writes);
            let tx = self.db.begin_write()?;
            let existed = {
                let existed = tx.open_table(R::KIND.table())?.remove(id)?.is_some();
                if let Some(name) = name {
                    let mut names = tx.open_table(NAMES)?;
                    let key = R::KIND.name_key(name);
                    let held_by_id = names.get(key.as_str())?.is_some_and(|v| v.value() == id);
                    if held_by_id {
                        names.remove(key.as_str())?;
                    }
                }
                existed
            };
            tx.commit()?;
            self.cached_write::<R>(id, None);
            Ok(existed)
        })
    }

    /// The ID holding `name`, if any.
    pub fn name_holder(&self, kind: Kind, name: &str) -> Result<Option<String>> {
        let tx = self.db.begin_read()?;
        let names = tx.open_table(NAMES)?;
        Ok(names.get(kind.name_key(name).as_str())?.map(|v| v.value().to_string()))
    }

    /// Resolves a full ID or a unique ID prefix (crictl passes truncated IDs) to a full ID.
    pub fn resolve_id(&self, kind: Kind, id_or_prefix: &str) -> Result<String> {
        let not_found = || Error::NotFound {
            kind,
            id: id_or_prefix.to_string(),
        };
        if id_or_prefix.is_empty() {
            return Err(not_found());
        }
        let tx = self.db.begin_read()?;
        let table = tx.open_table(kind.table())?;
        if table.get(id_or_prefix)?.is_some() {
            return Ok(id_or_prefix.to_string());
        }
        // Keys are sorted, so every key with this prefix sits in one contiguous range.
        let mut found: Option<String> = None;
        let mut matches = 0usize;
        for entry in table.range(id_or_prefix..)? {
            let (id, _) = entry?;
            let id = id.value();
            if !id.starts_with(id_or_prefix) {
                break;
            }
            matches += 1;
            found.get_or_insert_with(|| id.to_string());
        }
        match (matches, found) {
            (1, Some(id)) => Ok(id),
            (0, _) => Err(not_found()),
            (n, _) => Err(Error::Ambiguous {
                kind,
                prefix: id_or_prefix.to_string(),
                matches: n,
            }),
        }
    }

    /// Stores a singleton daemon setting (e.g. the pod CIDR the kubelet sent).
    pub fn put_setting<T: Serialize>(&self, key: &str, value: &T) -> Result<()> {
        debug_assert_ne!(key, SCHEMA_KEY);
        let bytes = serde_json::to_vec(value).map_err(|source| Error::BadSetting {
            key: key.to_string(),
            source,
        })?;
        crate::blocking::run(|| {
            let tx = self.db.begin_write()?;
            tx.open_table(META)?
                .insert(format!("setting/{key}").as_str(), bytes.as_slice())?;
            tx.commit()?;
            Ok(())
        })
    }

    pub fn get_setting<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>> {
        let tx = self.db.begin_read()?;
        let meta = tx.open_table(META)?;
        let Some(value) = meta.get(format!("setting/{key}").as_str())? else {
            return Ok(None);
        };
        serde_json::from_slice(value.value())
            .map(Some)
            .map_err(|source| Error::BadSetting {
                key: key.to_string(),
                source,
            })
    }
}

pub(crate) fn decode<R: Record>(id: &str, bytes: &[u8]) -> Result<R> {
    serde_json::from_slice(bytes).map_err(|source| Error::Corrupt {
        kind: R::KIND,
        id: id.to_string(),
        source,
    })
}

fn decode_u64(bytes: &[u8]) -> u64 {
    let mut buf = [0u8; 8];
    let n = bytes.len().min(8);
    buf[8 - n..].copy_from_slice(&bytes[bytes.len() - n..]);
    u64::from_be_bytes(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct Pod {
        id: String,
        name: String,
        #[serde(default)]
        attempt: u32,
    }

    impl Record for Pod {
        const KIND: Kind = Kind::Sandbox;
        fn id(&self) -> &str {
            &self.id
        }
    }

    fn pod(id: &str, name: &str) -> Pod {
        Pod {
            id: id.into(),
            name: name.into(),
            attempt: 0,
        }
    }

    fn temp_store() -> (tempfile::TempDir, Store) {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("meta.redb")).unwrap();
        (dir, store)
    }

    #[test]
    fn records_round_trip_and_survive_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sub/meta.redb");
        {
            let store = Store::open(&path).unwrap();
            store.create("default_web_uid_0", &pod("abc123", "web")).unwrap();
            store.put_setting("pod_cidr", &"10.88.0.0/16").unwrap();
        }
        let store = Store::open(&path).unwrap();
        assert_eq!(store.get::<Pod>("abc123").unwrap(), Some(pod("abc123", "web")));
        assert_eq!(store.list::<Pod>().unwrap().len(), 1);
        assert_eq!(
            store.get_setting::<String>("pod_cidr").unwrap().as_deref(),
            Some("10.88.0.0/16")
        );
        assert_eq!(store.schema_version().unwrap(), SCHEMA_VERSION);
    }

    #[test]
    fn second_open_of_same_store_is_refused() {
        let (dir, _store) = temp_store();
        match Store::open(&dir.path().join("meta.redb")) {
            Err(Error::Locked { .. }) => {}
            Err(other) => panic!("unexpected error: {other}"),
            Ok(_) => panic!("second open succeeded"),
        }
    }

    #[test]
    fn the_store_file_is_root_only_also_when_an_older_scute_left_it_open() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        let mode = || std::fs::metadata(&path).unwrap().permissions().mode() & 0o7777;
        drop(Store::open(&path).unwrap());
        assert_eq!(mode(), 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        drop(Store::open(&path).unwrap());
        assert_eq!(mode(), 0o600);
    }

    #[test]
    fn newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("meta.redb");
        {
            let db = Database::create(&path).unwrap();
            let tx = db.begin_write().unwrap();
            tx.open_table(META)
                .unwrap()
                .insert(SCHEMA_KEY, (SCHEMA_VERSION + 1).to_be_bytes().as_slice())
                .unwrap();
            tx.commit().unwrap();
        }
        let err = Store::open(&path).err().expect("must refuse");
        assert!(matches!(err, Error::SchemaTooNew { found, .. } if found == SCHEMA_VERSION + 1));
    }

    #[test]
    fn name_reservation_is_exclusive_and_idempotent() {
        let (_dir, store) = temp_store();
        store.create("ns_web_uid_0", &pod("aaa", "web")).unwrap();
        // The same record retried keeps its reservation.
        store.create("ns_web_uid_0", &pod("aaa", "web")).unwrap();
        let err = store.create("ns_web_uid_0", &pod("bbb", "web")).unwrap_err();
        assert!(
            matches!(&err, Error::NameTaken { holder, .. } if holder == "aaa"),
            "{err}"
        );
        assert!(
            store.get::<Pod>("bbb").unwrap().is_none(),
            "a refused create must write nothing"
        );
        // Deleting releases the name for a new record.
        assert!(store.delete::<Pod>("aaa", Some("ns_web_uid_0")).unwrap());
        assert!(!store.delete::<Pod>("aaa", Some("ns_web_uid_0")).unwrap());
        assert_eq!(store.name_holder(Kind::Sandbox, "ns_web_uid_0").unwrap(), None);
        store.create("ns_web_uid_0", &pod("bbb", "web")).unwrap();
    }

    #[test]
    fn delete_does_not_release_a_name_held_by_another_id() {
        let (_dir, store) = temp_store();
        store.create("n", &pod("aaa", "x")).unwrap();
        store.delete::<Pod>("zzz", Some("n")).unwrap();
        assert_eq!(store.name_holder(Kind::Sandbox, "n").unwrap().as_deref(), Some("aaa"));
    }

    #[test]
    fn id_prefixes_resolve_when_unique() {
        let (_dir, store) = temp_store();
        store.put(&pod("abc111", "a")).unwrap();
        store.put(&pod("abc222", "b")).unwrap();
        store.put(&pod("abd333", "c")).unwrap();
        assert_eq!(store.resolve_id(Kind::Sandbox, "abc111").unwrap(), "abc111");
        assert_eq!(store.resolve_id(Kind::Sandbox, "abc2").unwrap(), "abc222");
        assert_eq!(store.resolve_id(Kind::Sandbox, "abd").unwrap(), "abd333");
        assert!(matches!(
            store.resolve_id(Kind::Sandbox, "abc"),
            Err(Error::Ambiguous { matches: 2, .. })
        ));
        assert!(matches!(
            store.resolve_id(Kind::Sandbox, "x"),
            Err(Error::NotFound { .. })
        ));
        assert!(matches!(
            store.resolve_id(Kind::Sandbox, ""),
            Err(Error::NotFound { .. })
        ));
        // Kinds do not see each other's IDs.
        assert!(matches!(
            store.resolve_id(Kind::Container, "abc111"),
            Err(Error::NotFound { .. })
        ));
    }

    #[test]
    fn unreadable_record_is_reported_not_panicked() {
        let (_dir, store) = temp_store();
        let tx = store.db.begin_write().unwrap();
        tx.open_table(Kind::Sandbox.table())
            .unwrap()
            .insert("bad", b"{not json".as_slice())
            .unwrap();
        tx.commit().unwrap();
        assert!(matches!(store.get::<Pod>("bad"), Err(Error::Corrupt { .. })));
        assert!(matches!(store.list::<Pod>(), Err(Error::Corrupt { .. })));
        assert!(matches!(store.list_shared::<Pod>(), Err(Error::Corrupt { .. })));
    }

    /// Reads come from the cache once a type is loaded: every write must show in them, in
    /// commit order, and what a reopened store reads must agree.
    #[test]
    fn reads_follow_every_write() {
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
        struct PodName {
            id: String,
            name: String,
        }
        impl Record for PodName {
            const KIND: Kind = Kind::Sandbox;
            fn id(&self) -> &str {
                &self.id
            }
        }
        let (dir, store) = temp_store();
        assert!(store.list::<Pod>().unwrap().is_empty());
        store.create("a", &pod("id-a", "a")).unwrap();
        store.put(&pod("id-b", "b")).unwrap();
        let mut b = store.get::<Pod>("id-b").unwrap().unwrap();
        b.attempt = 7;
        store.put(&b).unwrap();
        assert_eq!(store.list::<Pod>().unwrap(), vec![pod("id-a", "a"), b.clone()]);
        let shared = store.list_shared::<Pod>().unwrap();
        assert_eq!(
            shared.iter().map(|p| (**p).clone()).collect::<Vec<_>>(),
            vec![pod("id-a", "a"), b.clone()]
        );
        assert!(
            Arc::ptr_eq(&shared[1], &store.list_shared::<Pod>().unwrap()[1]),
            "shared with the cache, not copied"
        );
        // Another type over the same table sees the writes of the first, and its own writes
        // show through the first.
        assert_eq!(store.list::<PodName>().unwrap().len(), 2);
        assert!(store.delete::<Pod>("id-a", Some("a")).unwrap());
        assert_eq!(store.get::<Pod>("id-a").unwrap(), None);
        assert_eq!(
            store.list::<PodName>().unwrap(),
            vec![PodName {
                id: "id-b".into(),
                name: "b".into()
            }]
        );
        store
            .put(&PodName {
                id: "id-c".into(),
                name: "c".into(),
            })
            .unwrap();
        assert_eq!(store.get::<Pod>("id-c").unwrap(), Some(pod("id-c", "c")));
        let path = store.path().to_path_buf();
        let listed = store.list::<Pod>().unwrap();
        drop(store);
        assert_eq!(Store::open(&path).unwrap().list::<Pod>().unwrap(), listed);
        drop(dir);
    }
}
