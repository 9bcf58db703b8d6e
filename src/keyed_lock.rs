//! Per-key async locks: one pull per image reference and one download per layer at a time,
//! so concurrent pulls of the same content share the work instead of doing it twice. A key can
//! also be held shared: many holders at once, none while someone holds it alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{OwnedRwLockReadGuard, OwnedRwLockWriteGuard, RwLock};

#[derive(Default)]
pub struct KeyedLocks {
    locks: Mutex<HashMap<String, Arc<RwLock<()>>>>,
}

pub struct KeyedGuard<'a> {
    owner: &'a KeyedLocks,
    key: String,
    guard: Option<Held>,
}

/// Only ever dropped: the guard's job is to be held.
#[allow(dead_code)]
enum Held {
    Alone(OwnedRwLockWriteGuard<()>),
    Shared(OwnedRwLockReadGuard<()>),
}

impl KeyedLocks {
    /// Holds `key` alone.
    pub async fn lock(&self, key: &str) -> KeyedGuard<'_> {
        let guard = Held::Alone(self.entry(key).write_owned().await);
        self.guard(key, guard)
    }

    /// Holds `key` beside other shared holders; waits while someone holds it alone.
    pub async fn share(&self, key: &str) -> KeyedGuard<'_> {
        let guard = Held::Shared(self.entry(key).read_owned().await);
        self.guard(key, guard)
    }

    fn entry(&self, key: &str) -> Arc<RwLock<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(key.to_string()).or_default().clone()
    }

    fn guard(&self, key: &str, guard: Held) -> KeyedGuard<'_> {
        KeyedGuard {
            owner: self,
            key: key.to_string(),
            guard: Some(guard),
        }
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.locks.lock().unwrap().len()
    }
}

impl Drop for KeyedGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        // Forget the key when nobody else holds or waits for it, so the map does not grow forever.
        let mut locks = self.owner.locks.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(lock) = locks.get(&self.key) {
            if Arc::strong_count(lock) == 1 {
                locks.remove(&self.key);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn same_key_serialises_and_map_empties() {
        let locks = Arc::new(KeyedLocks::default());
        let order = Arc::new(Mutex::new(Vec::new()));
        let g = locks.lock("a").await;
        let (l2, o2) = (locks.clone(), order.clone());
        let waiter = tokio::spawn(async move {
            let _g = l2.lock("a").await;
            o2.lock().unwrap().push("second");
        });
        // A different key is not blocked.
        drop(locks.lock("b").await);
        tokio::task::yield_now().await;
        order.lock().unwrap().push("first");
        drop(g);
        waiter.await.unwrap();
        assert_eq!(*order.lock().unwrap(), vec!["first", "second"]);
        assert_eq!(locks.len(), 0);
    }

    #[tokio::test]
    async fn shared_holders_overlap_and_exclude_one_alone() {
        let locks = Arc::new(KeyedLocks::default());
        let first = locks.share("pod").await;
        // A second shared holder does not wait for the first.
        let second = tokio::time::timeout(std::time::Duration::from_secs(5), locks.share("pod"))
            .await
            .expect("a shared holder waited for another");
        let l2 = locks.clone();
        let alone = tokio::spawn(async move {
            let _g = l2.lock("pod").await;
        });
        tokio::task::yield_now().await;
        assert!(!alone.is_finished(), "held alone while shared holders held it");
        drop((first, second));
        alone.await.unwrap();
        assert_eq!(locks.len(), 0);
    }
}
