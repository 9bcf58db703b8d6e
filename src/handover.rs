//! Creates that outlive their caller, shared by RunPodSandbox and CreateContainer (CRI-O's
//! resource store does the same).
//!
//! A create runs in a task of its own, so a kubelet that stops waiting (its deadline) cannot
//! leave a half-made object behind. What is made is "unclaimed" until its ID reaches the caller;
//! if the caller has gone by then, the kubelet's retry of the same name is handed that object
//! instead of a "name is reserved" error. A retry arriving while the first create is still
//! running waits for it on the name lock, which the create holds until its answer is decided.
//!
//! An object is unclaimed in memory from the moment it is made until its caller has the ID, and
//! on disk (the record's `unclaimed` flag) once the caller is known to be gone, so that a retry
//! after a daemon restart gets it too.

use std::collections::HashSet;
use std::future::Future;
use std::sync::{Arc, Mutex};

use tokio::sync::oneshot;
use tracing::Instrument;

use crate::store::{Record, Store};

/// A record that can be kept for a retry.
pub trait Claimable: Record {
    /// The stored flag: made after its caller had gone, not yet handed to a retry.
    fn unclaimed_mut(&mut self) -> &mut bool;
}

/// The IDs made but not yet delivered to (or taken by) a caller.
#[derive(Default)]
pub struct Unclaimed(Mutex<HashSet<String>>);

/// The way back to the caller of one create.
pub struct Answer<E> {
    tx: oneshot::Sender<Result<String, E>>,
    unclaimed: Arc<Unclaimed>,
}

impl<E> Answer<E> {
    /// Answers the caller; call it with the name lock still held, so that a retry waiting on the
    /// lock sees the outcome. Returns the ID of an object whose caller has gone: keep it for the
    /// retry with `Unclaimed::keep`.
    #[must_use]
    pub fn send(self, result: Result<String, E>) -> Option<String> {
        if let Ok(id) = &result {
            self.unclaimed.set().insert(id.clone());
        }
        match self.tx.send(result) {
            Err(Ok(id)) => Some(id),
            _ => None,
        }
    }
}

impl Unclaimed {
    fn set(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Runs `create` in a task of its own and waits for its answer. `died` is the error when the
    /// task ends without answering.
    pub async fn run<E, F, Fut>(self: &Arc<Self>, create: F, died: impl FnOnce() -> E) -> Result<String, E>
    where
        E: Send + 'static,
        F: FnOnce(Answer<E>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (tx, rx) = oneshot::channel();
        let answer = Answer {
            tx,
            unclaimed: self.clone(),
        };
        tokio::spawn(create(answer).instrument(tracing::Span::current()));
        let id = rx.await.map_err(|_| died())??;
        // Delivered: from here on a create of the same name is a duplicate.
        self.forget(&id);
        Ok(id)
    }

    /// Stores `id` as unclaimed: its caller has gone, and a retry after a restart must still find it.
    pub fn keep<R: Claimable>(&self, store: &Store, id: &str) -> crate::store::Result<()> {
        if let Some(mut record) = store.get::<R>(id)? {
            *record.unclaimed_mut() = true;
            store.put(&record)?;
        }
        Ok(())
    }

    /// A create of the name `holder` holds (name lock held): true if `holder` is unclaimed, and
    /// then it is the retry's from now on.
    pub fn claim<R: Claimable>(&self, store: &Store, holder: &str) -> crate::store::Result<bool> {
        let in_memory = self.set().remove(holder);
        let Some(mut record) = store.get::<R>(holder)? else {
            return Ok(false);
        };
        if *record.unclaimed_mut() {
            *record.unclaimed_mut() = false;
            store.put(&record)?;
            return Ok(true);
        }
        Ok(in_memory)
    }

    /// The object is gone (removed).
    pub fn forget(&self, id: &str) {
        self.set().remove(id);
    }
}
