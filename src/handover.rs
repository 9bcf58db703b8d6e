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
//! after a daemon restart gets it too. An object in memory only is handed over only once its
//! caller has gone: while the caller is still there to read the ID (between the answer and the
//! caller taking it), the object is the caller's and another create of the name a duplicate.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex, Weak};

use tokio::sync::oneshot;
use tracing::Instrument;

use crate::store::{Record, Store};

/// A record that can be kept for a retry.
pub trait Claimable: Record {
    /// The stored flag: made after its caller had gone, not yet handed to a retry.
    fn unclaimed_mut(&mut self) -> &mut bool;
}

/// The IDs made but not yet delivered to (or taken by) a caller, each with its caller: alive
/// while the caller may still take the ID.
#[derive(Default)]
pub struct Unclaimed(Mutex<HashMap<String, Weak<()>>>);

/// The way back to the caller of one create.
pub struct Answer<E> {
    tx: oneshot::Sender<Result<String, E>>,
    caller: Weak<()>,
    unclaimed: Arc<Unclaimed>,
}

impl<E> Answer<E> {
    /// Answers the caller; call it with the name lock still held, so that a retry waiting on the
    /// lock sees the outcome. Returns the ID of an object whose caller has gone: keep it for the
    /// retry with `Unclaimed::keep`.
    #[must_use]
    pub fn send(self, result: Result<String, E>) -> Option<String> {
        if let Ok(id) = &result {
            self.unclaimed.set().insert(id.clone(), self.caller.clone());
        }
        match self.tx.send(result) {
            Err(Ok(id)) => Some(id),
            _ => None,
        }
    }
}

/// Dropped while set: the caller stopped waiting for the create (its deadline passed).
struct Waiting(bool);

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.0 {
            tracing::info!(
                "the caller stopped waiting; the create goes on, and what it makes is kept for a retry of the name"
            );
        }
    }
}

impl Unclaimed {
    fn set(&self) -> std::sync::MutexGuard<'_, HashMap<String, Weak<()>>> {
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
        // Lives as long as this caller: dropped with `rx` when the caller stops waiting.
        let caller = Arc::new(());
        let answer = Answer {
            tx,
            caller: Arc::downgrade(&caller),
            unclaimed: self.clone(),
        };
        tokio::spawn(create(answer).instrument(tracing::Span::current()));
        let mut waiting = Waiting(true);
        let id = rx.await.map_err(|_| died());
        waiting.0 = false;
        let id = id??;
        // Delivered: from here on a create of the same name is a duplicate.
        self.forget(&id);
        drop(caller);
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
        let in_memory = self.take_orphan(holder);
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

    /// True (and forgotten) if `id` was made in memory and its caller has gone without taking it.
    /// A caller still there gets the ID; its object is not another create's to take.
    fn take_orphan(&self, id: &str) -> bool {
        let mut set = self.set();
        let orphan = set.get(id).is_some_and(|caller| caller.strong_count() == 0);
        if orphan {
            set.remove(id);
        }
        orphan
    }

    /// The object is gone (removed).
    pub fn forget(&self, id: &str) {
        self.set().remove(id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The race CI once hit: the first create's answer reached its (live) caller, and before that
    /// caller took the ID, another create of the name was handed the same object.
    #[test]
    fn an_answer_whose_caller_is_there_is_not_handed_over() {
        let unclaimed = Arc::new(Unclaimed::default());
        let answer = |caller: &Arc<()>| {
            let (tx, rx) = oneshot::channel::<Result<String, ()>>();
            let answer = Answer {
                tx,
                caller: Arc::downgrade(caller),
                unclaimed: unclaimed.clone(),
            };
            (answer, rx)
        };

        // Answered while the caller waits: the caller's, not another create's.
        let caller = Arc::new(());
        let (a, mut rx) = answer(&caller);
        assert_eq!(a.send(Ok("live".into())), None);
        assert!(!unclaimed.take_orphan("live"));
        assert_eq!(rx.try_recv().unwrap(), Ok("live".to_string()));
        // The caller drops without running `forget` (cancelled between answer and return): a
        // retry takes it, once.
        drop(caller);
        assert!(unclaimed.take_orphan("live"));
        assert!(!unclaimed.take_orphan("live"));

        // The caller was gone before the answer: `send` says so, and a retry takes it.
        let caller = Arc::new(());
        let (a, rx) = answer(&caller);
        drop((rx, caller));
        assert_eq!(a.send(Ok("orphan".into())), Some("orphan".to_string()));
        assert!(unclaimed.take_orphan("orphan"));

        // Failures leave nothing to hand over.
        let caller = Arc::new(());
        let (a, _rx) = answer(&caller);
        drop(caller);
        assert_eq!(a.send(Err(())), None);
        assert!(unclaimed.set().is_empty());
    }
}
