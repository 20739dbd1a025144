//! The one eviction rule of the crate's plan caches ([`Lru`]): entries are stamped with a
//! tick of the cache's own clock each time they are used, and while the cache is over its
//! [`PlanCacheLimits`] the least recently used entry leaves first.
//!
//! The clock advances on uses only (never with time or addresses) and ticks are unique, so
//! the rule is deterministic: two caches that see the same sequence of keys, the same
//! limits and the same weights evict the same entries at the same uses. That is what lets
//! every rank of an MPI communicator keep the same shapes (`mpi/typed.rs`): their keys are
//! agreed, and so are the weights and the limits.

use std::borrow::Borrow;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Arc;

use super::{Cached, PlanCacheLimits};

/// What a cached value holds against the cache's byte limit
/// ([`PlanCacheLimits::max_scratch_bytes`]).
pub(crate) trait Held {
    /// Bytes this value holds now.
    fn held_bytes(&self) -> u64;
}

impl Held for Arc<Cached> {
    fn held_bytes(&self) -> u64 {
        Cached::held_bytes(self)
    }
}

/// A value and the tick of its last use.
#[derive(Debug)]
struct Slot<V> {
    value: V,
    used: u64,
}

/// Values by key, least recently used first out ([the module docs](self)).
#[derive(Debug)]
pub(crate) struct Lru<K, V> {
    map: HashMap<K, Slot<V>>,
    clock: u64,
}

impl<K, V> Default for Lru<K, V> {
    fn default() -> Self {
        Lru {
            map: HashMap::new(),
            clock: 0,
        }
    }
}

impl<K: Eq + Hash + Clone, V: Held> Lru<K, V> {
    /// Mark `key` used (the clock's next tick); false when it is not cached.
    pub fn touch<Q: Eq + Hash + ?Sized>(&mut self, key: &Q) -> bool
    where
        K: Borrow<Q>,
    {
        self.clock += 1;
        let now = self.clock;
        match self.map.get_mut(key) {
            Some(s) => {
                s.used = now;
                true
            }
            None => false,
        }
    }

    /// The value of `key`, without marking it used.
    pub fn peek<Q: Eq + Hash + ?Sized>(&self, key: &Q) -> Option<&V>
    where
        K: Borrow<Q>,
    {
        self.map.get(key).map(|s| &s.value)
    }

    /// The value of `key`, mutable, without marking it used (the MPI caches run a shape in
    /// place).
    #[cfg(feature = "mpi")]
    pub fn peek_mut<Q: Eq + Hash + ?Sized>(&mut self, key: &Q) -> Option<&mut V>
    where
        K: Borrow<Q>,
    {
        self.map.get_mut(key).map(|s| &mut s.value)
    }

    /// Keep `value` for `key`, marked used (the clock's next tick); returns the value it
    /// replaces, if any.
    pub fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.clock += 1;
        let used = self.clock;
        self.map.insert(key, Slot { value, used }).map(|s| s.value)
    }

    /// Remove least recently used values until `plans` more values holding `bytes` more
    /// fit `limits` (at most [`PlanCacheLimits::max_plans`], at least 1, values and
    /// [`PlanCacheLimits::max_scratch_bytes`] bytes), or nothing is left; returns them,
    /// oldest first.
    pub fn evict_to_fit(&mut self, limits: PlanCacheLimits, plans: usize, bytes: u64) -> Vec<V> {
        let mut out = Vec::new();
        let mut held = self.held_bytes();
        loop {
            let over_count = self.map.len().saturating_add(plans) > limits.max_plans.max(1);
            let over_bytes = held.saturating_add(bytes) > limits.max_scratch_bytes;
            if !(over_count || over_bytes) {
                break;
            }
            let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, s)| s.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(s) = self.map.remove(&oldest) {
                held = held.saturating_sub(s.value.held_bytes());
                out.push(s.value);
            }
        }
        out
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Bytes the values hold, summed.
    pub fn held_bytes(&self) -> u64 {
        self.map
            .values()
            .map(|s| s.value.held_bytes())
            .fold(0, u64::saturating_add)
    }

    /// Remove every value.
    pub fn drain(&mut self) -> impl Iterator<Item = V> + '_ {
        self.map.drain().map(|(_, s)| s.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Held for u64 {
        fn held_bytes(&self) -> u64 {
            *self
        }
    }

    fn limits(max_plans: usize, max_scratch_bytes: u64) -> PlanCacheLimits {
        PlanCacheLimits {
            max_plans,
            max_scratch_bytes,
        }
    }

    /// The least recently used value leaves first, a use (not an insertion order) counts,
    /// and the count limit is kept with room for the incoming value.
    #[test]
    fn the_least_recently_used_leaves_first() {
        // Each value is its key plus 100, so evicted values name their keys.
        let mut c: Lru<u32, u64> = Lru::default();
        for k in 0..3 {
            assert!(c.evict_to_fit(limits(3, u64::MAX), 1, 0).is_empty());
            c.insert(k, u64::from(k) + 100);
        }
        assert!(c.touch(&0));
        assert!(!c.touch(&9));
        // Room for one more: key 1, the least recently used, leaves.
        assert_eq!(c.evict_to_fit(limits(3, u64::MAX), 1, 0), vec![101]);
        c.insert(3, 103);
        assert_eq!(c.len(), 3);
        assert!(c.peek(&1).is_none() && c.peek(&0).is_some());
        // Shrinking to one value evicts oldest first: 2, then 0.
        assert_eq!(c.evict_to_fit(limits(1, u64::MAX), 0, 0), vec![102, 100]);
        assert_eq!(c.len(), 1);
    }

    /// The byte limit counts what values hold plus what comes; a value alone above it stays
    /// only when nothing else is left to evict.
    #[test]
    fn the_byte_limit_evicts_until_the_incoming_bytes_fit() {
        let mut c: Lru<u32, u64> = Lru::default();
        c.insert(0, 40);
        c.insert(1, 40);
        c.insert(2, 10);
        assert_eq!(c.held_bytes(), 90);
        assert_eq!(c.evict_to_fit(limits(10, 100), 1, 30), vec![40]);
        assert_eq!(c.held_bytes(), 50);
        assert_eq!(c.evict_to_fit(limits(10, 100), 1, 500), vec![40, 10]);
        assert_eq!(c.len(), 0);
    }

    /// Two caches fed the same uses evict the same values at the same uses, however their
    /// hash maps order the keys (what MPI ranks rely on).
    #[test]
    fn the_same_uses_evict_the_same_values() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut next = move || {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed
        };
        let (mut a, mut b): (Lru<u64, u64>, Lru<u64, u64>) = Default::default();
        for _ in 0..2000 {
            let key = next() % 40;
            let weight = next() % 100;
            let l = limits(8, 400);
            let (ha, hb) = (a.touch(&key), b.touch(&key));
            assert_eq!(ha, hb);
            if !ha {
                assert_eq!(a.evict_to_fit(l, 1, weight), b.evict_to_fit(l, 1, weight));
                a.insert(key, weight);
                b.insert(key, weight);
            }
            assert!(a.len() <= 8 && a.held_bytes() <= 400);
            let mut ka: Vec<u64> = a.map.keys().copied().collect();
            let mut kb: Vec<u64> = b.map.keys().copied().collect();
            ka.sort_unstable();
            kb.sort_unstable();
            assert_eq!(ka, kb);
        }
    }
}
