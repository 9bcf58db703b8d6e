//! Per-key async locks: one pull per image reference and one download per layer at a time,
//! so concurrent pulls of the same content share the work instead of doing it twice.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

#[derive(Default)]
pub struct KeyedLocks {
    locks: Mutex<HashMap<String, Arc<AsyncMutex<()>>>>,
}

pub struct KeyedGuard<'a> {
    owner: &'a KeyedLocks,
    key: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl KeyedLocks {
    pub async fn lock(&self, key: &str) -> KeyedGuard<'_> {
        let lock = {
            let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
            locks.entry(key.to_string()).or_default().clone()
        };
        let guard = lock.lock_owned().await;
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
}
