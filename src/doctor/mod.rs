//! `scute doctor`: finds what is damaged or left behind in scute's root and state, and with
//! `--repair` removes it. Run by the CLI on the store directly when the daemon is stopped, and by
//! the daemon itself (Admin.Doctor) when it runs, so what pulls and creates in flight hold is
//! respected; the daemon also runs the cheap form at start after an unclean stop.
//!
//! The image store's checks are the image manager's (`image/doctor.rs`); the pods' and
//! containers' directories and netns pins are `runtime.rs`'s, their cgroups `cgroups.rs`'s,
//! their network `network.rs`'s and their shims `shims.rs`'s.

pub mod cgroups;
pub mod network;
pub mod runtime;
pub mod shims;

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::admin_api::{admin_client::AdminClient, DoctorRequest};
use crate::config::Config;
use crate::image::{ImageError, ImageManager, ImageManagerConfig};
use crate::sandbox::cni::CniManager;
use crate::sandbox::manager::SandboxManager;
use crate::store::{self, Store};

/// How deep to look.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Every blob's digest read back.
    Full,
    /// Documents (manifests, indexes, configs: up to 4 MiB) hashed, layers only sized.
    Quick,
    /// Nothing hashed: records against what is on disk, and each snapshot's files against the
    /// tally taken when it was committed (the daemon's start after the machine went down with
    /// it running: a power cut or a kernel crash).
    Cheap,
    /// Records against what is on disk only (the daemon's start after it alone was killed: the
    /// page cache kept every file it wrote).
    Records,
}

/// One thing wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A blob whose bytes are not its digest (or not the size its image declares).
    CorruptBlob,
    /// A blob no image references.
    OrphanBlob,
    /// A partial download nothing is writing (a retry would resume it).
    PartialDownload,
    /// A snapshot record whose directory is gone.
    MissingSnapshot,
    /// A snapshot whose parent has no record.
    BrokenChain,
    /// A snapshot whose files are not what was unpacked (emptied or cut short: a power cut took
    /// data the disk never got).
    DamagedSnapshot,
    /// A snapshot directory with no record and nothing using it.
    OrphanSnapshot,
    /// An image some of whose layers are gone (the kubelet pulls it again once dropped).
    DamagedImage,
    /// A container's or pod's directory with no record.
    OrphanDir,
    /// A network namespace file no pod records.
    StaleNetns,
    /// A pod's or container's cgroup no record knows (empty, or with processes nothing stops).
    OrphanCgroup,
    /// A CNI attachment cached for a pod no record knows: its address is still held.
    StaleAttachment,
    /// A lease in the default network's IPAM naming a pod no record knows.
    StaleLease,
    /// A pod recorded ready whose shim is gone or does not answer.
    DeadShim,
}

impl Kind {
    const ALL: [Kind; 14] = [
        Kind::CorruptBlob,
        Kind::OrphanBlob,
        Kind::PartialDownload,
        Kind::MissingSnapshot,
        Kind::BrokenChain,
        Kind::DamagedSnapshot,
        Kind::OrphanSnapshot,
        Kind::DamagedImage,
        Kind::OrphanDir,
        Kind::StaleNetns,
        Kind::OrphanCgroup,
        Kind::StaleAttachment,
        Kind::StaleLease,
        Kind::DeadShim,
    ];

    pub fn parse(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::CorruptBlob => "corrupt-blob",
            Kind::OrphanBlob => "orphan-blob",
            Kind::PartialDownload => "partial-download",
            Kind::MissingSnapshot => "missing-snapshot",
            Kind::BrokenChain => "broken-chain",
            Kind::DamagedSnapshot => "damaged-snapshot",
            Kind::OrphanSnapshot => "orphan-snapshot",
            Kind::DamagedImage => "damaged-image",
            Kind::OrphanDir => "orphan-dir",
            Kind::StaleNetns => "stale-netns",
            Kind::OrphanCgroup => "orphan-cgroup",
            Kind::StaleAttachment => "stale-attachment",
            Kind::StaleLease => "stale-lease",
            Kind::DeadShim => "dead-shim",
        }
    }
}

/// A finding: what, where, how many bytes it holds, and whether `--repair` dealt with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    pub kind: Kind,
    /// A digest, chain ID, image name or path.
    pub subject: String,
    pub bytes: u64,
    pub detail: String,
    pub repaired: bool,
}

impl Finding {
    pub fn new(kind: Kind, subject: impl Into<String>, bytes: u64, detail: impl Into<String>) -> Finding {
        Finding {
            kind,
            subject: subject.into(),
            bytes,
            detail: detail.into(),
            repaired: false,
        }
    }
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}\t{}\t{}\t{}",
            self.kind.as_str(),
            self.subject,
            self.bytes,
            self.detail
        )?;
        if self.repaired {
            write!(f, "\trepaired")?;
        }
        Ok(())
    }
}

/// What a run found, one line per finding and a summary.
pub fn report(findings: &[Finding], repair: bool) -> String {
    let mut out = String::from("KIND\tSUBJECT\tBYTES\tDETAIL\n");
    for f in findings {
        out.push_str(&format!("{f}\n"));
    }
    let bytes: u64 = findings.iter().map(|f| f.bytes).sum();
    let repaired = findings.iter().filter(|f| f.repaired).count();
    out.push_str(&match (findings.len(), repair) {
        (0, _) => "no problem found\n".to_string(),
        (n, false) => format!("{n} problem(s), {bytes} bytes held; `scute doctor --repair` deals with them\n"),
        (n, true) => format!("{n} problem(s), {repaired} repaired, {bytes} bytes held\n"),
    });
    out
}

/// `scute doctor`: the running daemon does the work when it answers on `socket` (it owns the
/// store and knows what is in use); otherwise `config`'s root and state are examined here.
pub async fn run(config: &Config, socket: &Path, depth: Depth, repair: bool) -> anyhow::Result<Vec<Finding>> {
    if std::os::unix::net::UnixStream::connect(socket).is_ok() {
        let channel = crate::client::connect(socket).await?;
        let request = DoctorRequest {
            quick: depth == Depth::Quick,
            repair,
        };
        let response = AdminClient::new(channel)
            .doctor(request)
            .await
            .map_err(|e| anyhow::anyhow!("Doctor: {}", e.message()))?;
        return Ok(response
            .into_inner()
            .findings
            .into_iter()
            .map(|f| Finding {
                kind: Kind::parse(&f.kind).unwrap_or(Kind::OrphanDir),
                subject: f.subject,
                bytes: f.bytes,
                detail: f.detail,
                repaired: f.repaired,
            })
            .collect());
    }
    let offline = config.clone();
    let (store, images) = tokio::task::spawn_blocking(move || open_stopped(&offline)).await??;
    let cni = CniManager::new(&config.cni, &config.state);
    let checks = Checks {
        images,
        store,
        root: config.root.clone(),
        state: config.state.clone(),
        cni: &cni,
        depth,
        repair,
        scope: Scope::Stopped,
    };
    Ok(examine_all(checks).await?)
}

/// Whose view the checks take.
pub enum Scope<'a> {
    /// The running daemon's: what changed less than `runtime::SETTLED` ago may be a pull or a
    /// create in flight and is left alone; shims are asked through its sandbox manager.
    Daemon(&'a SandboxManager),
    /// A stopped daemon's: everything on disk is settled; shims are probed by their sockets.
    Stopped,
}

/// What the checks look at.
pub struct Checks<'a> {
    pub images: Arc<ImageManager>,
    pub store: Arc<Store>,
    pub root: PathBuf,
    pub state: PathBuf,
    pub cni: &'a CniManager,
    pub depth: Depth,
    pub repair: bool,
    pub scope: Scope<'a>,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckError {
    #[error(transparent)]
    Image(#[from] ImageError),
    #[error(transparent)]
    Store(#[from] store::Error),
    #[error("a check's background task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Every check, in one list that both paths run (Admin.Doctor in the daemon, `scute doctor` on a
/// stopped one), so a check cannot be missing from either.
pub async fn examine_all(checks: Checks<'_>) -> Result<Vec<Finding>, CheckError> {
    let Checks {
        images,
        store,
        root,
        state,
        cni,
        depth,
        repair,
        scope,
    } = checks;
    let settled = match scope {
        Scope::Daemon(_) => runtime::SETTLED,
        Scope::Stopped => Duration::ZERO,
    };
    // The store's and the disk's checks block: off the async runtime.
    let (on_disk, disk_state) = (store.clone(), state.clone());
    let mut found = tokio::task::spawn_blocking(move || -> Result<Vec<Finding>, CheckError> {
        let mut found = images.doctor(depth, repair)?;
        found.extend(runtime::examine(&on_disk, &root, &disk_state, repair, settled)?);
        found.extend(cgroups::examine(&on_disk, &disk_state, repair, settled)?);
        Ok(found)
    })
    .await??;
    found.extend(network::examine(&store, cni, repair, settled).await?);
    found.extend(match scope {
        Scope::Daemon(sandboxes) => shims::examine(sandboxes, &store, repair).await?,
        Scope::Stopped => shims::examine_stopped(&store, &state)?,
    });
    Ok(found)
}

/// The daemon is stopped: its store and image manager, opened here.
fn open_stopped(config: &Config) -> anyhow::Result<(Arc<Store>, Arc<ImageManager>)> {
    let store_path = config.root.join("meta.redb");
    anyhow::ensure!(store_path.exists(), "no scute store at {}", store_path.display());
    let store = Arc::new(Store::open(&store_path).with_context(|| {
        format!(
            "opening {} (a scute holding it must answer on {})",
            store_path.display(),
            config.grpc.address.display()
        )
    })?);
    let images = ImageManager::open(
        store.clone(),
        ImageManagerConfig {
            root: &config.root,
            hosts_dir: &config.registry.config_path,
            max_concurrent_downloads: 1,
            discard_unpacked_layers: config.image.discard_unpacked_layers,
            min_free_disk_percent: 0,
            pull_progress_timeout: Duration::ZERO,
            pinned: vec![crate::distribution::reference::ImageRef::parse(&config.image.sandbox_image)?.to_string()],
            held_snapshots: crate::daemon::containers_snapshots(store.clone()),
        },
    )?;
    Ok((store, Arc::new(images)))
}
