//! Which staged caches make room for a wanted cache that does not fit the node's disk,
//! decided without I/O: the least recently used caches no pod on the node uses, and only
//! when evicting them makes the cache fit.
//!
//! "In use" comes from the node's `KernelCacheNode.spec.inUse`, which the controller
//! writes from the serving pods on the node (the agent reads no pods). Without that
//! record nothing is evicted. A cache evicted once is staged again only when it fits
//! without evicting another (so two caches never push each other out in turn).

use std::collections::{BTreeMap, BTreeSet};
use std::time::SystemTime;

use super::plan::Key;

/// A staged cache directory that could make room.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// Which.
    pub key: Key,
    /// Bytes on disk.
    pub size_bytes: u64,
    /// When a pod on the node last used it (or when it was staged, if never).
    pub last_used: SystemTime,
}

/// A cache the plan would stage.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToStage {
    /// Which.
    pub key: Key,
    /// The size its image's labels declare (unknown: no room is made for it).
    pub declared: Option<u64>,
    /// Whether it was evicted from this node before.
    pub evicted_before: bool,
}

/// The room new stages have.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Space {
    /// Bytes a stage may write now: what the budget and the free-space floor leave.
    pub left: u64,
    /// The most bytes one cache may have (the extraction limit); eviction never helps a
    /// larger one.
    pub layer_limit: u64,
}

/// One cache to remove, and for which.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Eviction {
    /// The cache removed.
    pub key: Key,
    /// The cache it makes room for.
    pub made_room_for: Key,
}

/// What to do.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Decision {
    /// Remove these, in this order.
    pub evict: Vec<Eviction>,
    /// Do not stage these: evicted before, and still without room.
    pub hold: Vec<Key>,
}

/// The caches of one digest on disk (copies are hard links: only removing all of them
/// frees the bytes).
#[derive(Debug)]
struct Group {
    keys: Vec<Key>,
    size_bytes: u64,
    last_used: SystemTime,
}

/// Decide for `to_stage` (in order) given the caches on disk (`held`), the caches pods
/// on the node use (`in_use`; none: unknown, nothing is evicted) and the `space` left.
pub fn decide(
    to_stage: &[ToStage],
    held: &[Held],
    in_use: Option<&BTreeSet<Key>>,
    space: Space,
) -> Decision {
    let mut decision = Decision::default();
    let on_disk: BTreeSet<&str> = held.iter().map(|h| h.key.digest.as_str()).collect();
    let mut groups = in_use.map(|u| candidates(held, u)).unwrap_or_default();
    let mut left = space.left;
    for t in to_stage {
        let Some(need) = t.declared else { continue };
        // A digest already on disk is linked, not downloaded.
        if on_disk.contains(t.key.digest.as_str()) {
            continue;
        }
        if need <= left {
            left -= need;
            continue;
        }
        if t.evicted_before {
            decision.hold.push(t.key.clone());
            continue;
        }
        if need > space.layer_limit {
            continue;
        }
        let Some(n) = lru_prefix(&groups, need - left) else {
            // Evicting everything evictable would not make it fit: keep them all.
            continue;
        };
        let freed: u64 = groups[..n].iter().map(|g| g.size_bytes).sum();
        for g in groups.drain(..n) {
            decision
                .evict
                .extend(g.keys.into_iter().map(|key| Eviction {
                    key,
                    made_room_for: t.key.clone(),
                }));
        }
        left = (left + freed).saturating_sub(need);
    }
    decision
}

/// The digests on disk none of whose caches is in use, least recently used first (ties
/// by key: deterministic).
fn candidates(held: &[Held], in_use: &BTreeSet<Key>) -> Vec<Group> {
    let mut by_digest: BTreeMap<&str, Vec<&Held>> = BTreeMap::new();
    for h in held {
        by_digest.entry(h.key.digest.as_str()).or_default().push(h);
    }
    let mut groups: Vec<Group> = by_digest
        .into_values()
        .filter(|hs| hs.iter().all(|h| !in_use.contains(&h.key)))
        .map(|hs| Group {
            keys: hs.iter().map(|h| h.key.clone()).collect(),
            size_bytes: hs.iter().map(|h| h.size_bytes).max().unwrap_or(0),
            last_used: hs
                .iter()
                .map(|h| h.last_used)
                .max()
                .unwrap_or(SystemTime::UNIX_EPOCH),
        })
        .collect();
    groups.sort_by(|a, b| a.last_used.cmp(&b.last_used).then(a.keys.cmp(&b.keys)));
    groups
}

/// How many of the first `groups` free at least `missing` bytes, if all of them do.
fn lru_prefix(groups: &[Group], missing: u64) -> Option<usize> {
    let mut freed = 0u64;
    for (i, g) in groups.iter().enumerate() {
        freed = freed.saturating_add(g.size_bytes);
        if freed >= missing {
            return Some(i + 1);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn key(name: &str, digest: &str) -> Key {
        Key {
            namespace: "ml".into(),
            name: name.into(),
            digest: format!("sha256:{digest}"),
        }
    }
    fn at(seconds: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_secs(seconds)
    }
    fn held(name: &str, digest: &str, size_bytes: u64, last_used: u64) -> Held {
        Held {
            key: key(name, digest),
            size_bytes,
            last_used: at(last_used),
        }
    }
    fn wants(name: &str, digest: &str, declared: u64) -> ToStage {
        ToStage {
            key: key(name, digest),
            declared: Some(declared),
            evicted_before: false,
        }
    }
    fn space(left: u64) -> Space {
        Space {
            left,
            layer_limit: 1000,
        }
    }
    fn evicted(d: &Decision) -> Vec<(String, String)> {
        d.evict
            .iter()
            .map(|e| (e.key.name.clone(), e.made_room_for.name.clone()))
            .collect()
    }
    fn pair(a: &str, b: &str) -> (String, String) {
        (a.into(), b.into())
    }

    #[test]
    fn the_least_recently_used_make_room_and_no_more_than_needed() {
        let disk = [
            held("new", "1", 40, 300),
            held("old", "2", 40, 100),
            held("mid", "3", 40, 200),
        ];
        let none = BTreeSet::new();
        // 10 left, 50 needed: the oldest (40) makes it fit.
        let d = decide(&[wants("b", "9", 50)], &disk, Some(&none), space(10));
        assert_eq!(evicted(&d), [pair("old", "b")]);
        // 90 needed: the two oldest.
        let d = decide(&[wants("b", "9", 90)], &disk, Some(&none), space(10));
        assert_eq!(evicted(&d), [pair("old", "b"), pair("mid", "b")]);
        // What fits needs nothing.
        let d = decide(&[wants("b", "9", 10)], &disk, Some(&none), space(10));
        assert_eq!(d, Decision::default());
    }

    #[test]
    fn a_cache_in_use_is_never_evicted() {
        let disk = [held("old", "2", 40, 100), held("new", "1", 40, 300)];
        let in_use = BTreeSet::from([key("old", "2")]);
        let d = decide(&[wants("b", "9", 50)], &disk, Some(&in_use), space(10));
        assert_eq!(evicted(&d), [pair("new", "b")]);
        // Both in use: nothing, and the stage reports that it does not fit.
        let both = BTreeSet::from([key("old", "2"), key("new", "1")]);
        let d = decide(&[wants("b", "9", 50)], &disk, Some(&both), space(10));
        assert_eq!(d, Decision::default());
        // Another cache of an in-use digest keeps the files: not a candidate either.
        let shared = [held("copy", "2", 40, 50), held("old", "2", 40, 100)];
        let d = decide(&[wants("b", "9", 50)], &shared, Some(&in_use), space(10));
        assert_eq!(d, Decision::default());
    }

    #[test]
    fn nothing_is_evicted_for_a_cache_that_still_would_not_fit() {
        let disk = [held("a", "1", 40, 100), held("b", "2", 40, 200)];
        let none = BTreeSet::new();
        // 10 + 80 < 100.
        let d = decide(&[wants("c", "9", 100)], &disk, Some(&none), space(10));
        assert_eq!(d, Decision::default());
        // Over the limit of one cache: no eviction ever helps.
        let big = Space {
            left: 10,
            layer_limit: 30,
        };
        let d = decide(&[wants("c", "9", 40)], &disk, Some(&none), big);
        assert_eq!(d, Decision::default());
    }

    #[test]
    fn without_the_in_use_record_or_a_declared_size_nothing_is_evicted() {
        let disk = [held("a", "1", 40, 100)];
        let d = decide(&[wants("c", "9", 50)], &disk, None, space(10));
        assert_eq!(d, Decision::default());
        let unknown = ToStage {
            declared: None,
            ..wants("c", "9", 0)
        };
        let d = decide(&[unknown], &disk, Some(&BTreeSet::new()), space(10));
        assert_eq!(d, Decision::default());
        // A digest already on disk is linked: it needs no room.
        let d = decide(
            &[wants("c", "1", 50)],
            &disk,
            Some(&BTreeSet::new()),
            space(10),
        );
        assert_eq!(d, Decision::default());
    }

    #[test]
    fn an_evicted_cache_waits_for_room_and_never_evicts_in_turn() {
        let disk = [held("b", "2", 40, 100)];
        let none = BTreeSet::new();
        let mut a = wants("a", "1", 50);
        a.evicted_before = true;
        let d = decide(std::slice::from_ref(&a), &disk, Some(&none), space(10));
        assert_eq!(d.hold, [key("a", "1")]);
        assert!(d.evict.is_empty());
        // With room, it is staged again (neither held nor evicting).
        let d = decide(&[a], &disk, Some(&none), space(50));
        assert_eq!(d, Decision::default());
    }

    #[test]
    fn stages_in_order_share_the_room_and_the_candidates() {
        let disk = [held("old", "2", 40, 100), held("new", "3", 40, 200)];
        let none = BTreeSet::new();
        // x takes the 30 left; y then needs the oldest; z the next one.
        let d = decide(
            &[
                wants("x", "7", 30),
                wants("y", "8", 30),
                wants("z", "9", 40),
            ],
            &disk,
            Some(&none),
            space(30),
        );
        assert_eq!(evicted(&d), [pair("old", "y"), pair("new", "z")]);
        // Equal last use: by key.
        let tied = [held("q", "3", 40, 100), held("p", "2", 40, 100)];
        let d = decide(&[wants("y", "8", 40)], &tied, Some(&none), space(0));
        assert_eq!(evicted(&d), [pair("p", "y")]);
        // All copies of a digest go together, counted once.
        let copies = [held("c1", "2", 40, 100), held("c2", "2", 40, 100)];
        let d = decide(&[wants("y", "8", 40)], &copies, Some(&none), space(0));
        assert_eq!(evicted(&d), [pair("c1", "y"), pair("c2", "y")]);
        let d = decide(&[wants("y", "8", 80)], &copies, Some(&none), space(0));
        assert_eq!(d, Decision::default());
    }
}
