//! The verification retries the controller keeps per cache, KernelCaches and `oci://`
//! ModelCaches alike: the one pending, and the next after a verdict
//! ([`decide::next_retry`]).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::decide::{self, Retry};

/// A cache: (namespace, name).
type Key = (String, String);

/// Failed verifications waiting for their retry, per cache.
#[derive(Debug, Default)]
pub(crate) struct Retries(Mutex<HashMap<Key, Retry>>);

impl Retries {
    /// The retry pending for `key`.
    pub(crate) fn pending(&self, key: &Key) -> Option<Retry> {
        self.0.lock().ok().and_then(|r| r.get(key).cloned())
    }

    /// Keep the retry of `key` that [`decide::next_retry`] gives after a verification of
    /// `digest` under `policy_version` (none: forget it); how long until it is due.
    pub(crate) fn schedule(
        &self,
        key: Key,
        passed: bool,
        pending: Option<&Retry>,
        (digest, policy_version): (&str, &str),
        resync: Duration,
        now: Instant,
    ) -> Option<Duration> {
        let next = decide::next_retry(passed, pending, digest, policy_version, resync, now);
        let retry_in = next.as_ref().map(|r| r.at - now);
        if let Ok(mut retries) = self.0.lock() {
            match next {
                Some(r) => retries.insert(key, r),
                None => retries.remove(&key),
            };
        }
        retry_in
    }

    /// Keep only the retries of caches for which `keep` holds.
    pub(crate) fn retain(&self, mut keep: impl FnMut(&Key) -> bool) {
        if let Ok(mut retries) = self.0.lock() {
            retries.retain(|k, _| keep(k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failure_is_kept_until_a_pass_or_its_cache_is_gone() {
        let retries = Retries::default();
        let (key, now, resync) = (
            ("ns".to_string(), "c".to_string()),
            Instant::now(),
            Duration::from_secs(60),
        );
        let due = retries.schedule(key.clone(), false, None, ("sha256:a", "p/1"), resync, now);
        let pending = retries.pending(&key).unwrap();
        assert_eq!((pending.attempts, due), (1, Some(pending.at - now)));
        retries.schedule(
            key.clone(),
            false,
            Some(&pending),
            ("sha256:a", "p/1"),
            resync,
            now,
        );
        assert_eq!(retries.pending(&key).unwrap().attempts, 2, "counted on");
        assert_eq!(
            retries.schedule(key.clone(), true, None, ("sha256:a", "p/1"), resync, now),
            None
        );
        assert!(retries.pending(&key).is_none(), "a pass forgets it");
        retries.schedule(key.clone(), false, None, ("sha256:a", "p/1"), resync, now);
        retries.retain(|k| k.1 != "c");
        assert!(retries.pending(&key).is_none(), "its cache gone");
    }
}
