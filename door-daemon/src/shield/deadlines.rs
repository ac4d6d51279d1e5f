//! The deadlines of the blocklist entries this daemon wrote, in deadline order, so that expired
//! entries are found without walking the kernel's map.
//!
//! Deleting expired blocklist entries is the daemon's job (docs/decisions.md, "The daemon owns the
//! blocklist's entries; the map is an LRU"). Walking the map to find them costs two system calls
//! per entry (`BPF_MAP_GET_NEXT_KEY`, `BPF_MAP_LOOKUP_ELEM`), up to
//! [`door_common::BLOCKED_CAPACITY`] entries, on every block: during an escalation wave the
//! blocklist writer fell behind the wave. The index answers which entries are due in
//! O(log n) each.
//!
//! The index is bounded by [`door_common::BLOCKED_CAPACITY`]: past it the entry due first is
//! forgotten by the index only (the kernel's LRU map holds at most that many entries anyway, and
//! the program ignores an expired entry, so a forgotten one is at worst left for the LRU to
//! reclaim).

use std::collections::{BTreeSet, HashMap};

use door_common::PrefixKey;

/// Blocklist deadlines by key and by time (ns on the program's `bpf_ktime_get_coarse_ns` clock).
#[derive(Debug, Default)]
pub(super) struct Deadlines {
    by_key: HashMap<PrefixKey, u64>,
    by_time: BTreeSet<(u64, PrefixKey)>,
}

impl Deadlines {
    /// Records that `key`'s entry now ends at `deadline_ns`, replacing what was recorded.
    pub(super) fn set(&mut self, key: PrefixKey, deadline_ns: u64) {
        if let Some(old) = self.by_key.insert(key, deadline_ns) {
            self.by_time.remove(&(old, key));
        }
        self.by_time.insert((deadline_ns, key));
        while self.by_key.len() > door_common::BLOCKED_CAPACITY as usize {
            let Some((_, first)) = self.by_time.pop_first() else {
                break;
            };
            self.by_key.remove(&first);
        }
    }

    /// Forgets `key` (its entry was deleted).
    pub(super) fn remove(&mut self, key: &PrefixKey) {
        if let Some(old) = self.by_key.remove(key) {
            self.by_time.remove(&(old, *key));
        }
    }

    /// Removes and returns the keys whose deadline is at or before `now_ns`, soonest first,
    /// leaving `keep` recorded whatever its deadline.
    pub(super) fn take_due(&mut self, now_ns: u64, keep: &PrefixKey) -> Vec<PrefixKey> {
        let mut due = Vec::new();
        let mut kept = None;
        while let Some(&(deadline, key)) = self.by_time.first() {
            if deadline > now_ns {
                break;
            }
            self.by_time.pop_first();
            if key == *keep {
                kept = Some((deadline, key));
            } else {
                self.by_key.remove(&key);
                due.push(key);
            }
        }
        if let Some(entry) = kept {
            self.by_time.insert(entry);
        }
        due
    }

    /// Keys recorded: the blocks this daemon wrote that are live or not yet taken out as due.
    pub(super) fn len(&self) -> usize {
        self.by_key.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(last: u8) -> PrefixKey {
        PrefixKey::from_ipv4([192, 0, 2, last])
    }

    #[test]
    fn due_entries_come_out_soonest_first_and_once() {
        let mut d = Deadlines::default();
        d.set(key(1), 30);
        d.set(key(2), 10);
        d.set(key(3), 20);
        d.set(key(4), 100);
        assert_eq!(d.take_due(25, &key(9)), vec![key(2), key(3)]);
        assert!(d.take_due(25, &key(9)).is_empty(), "taken once");
        assert_eq!(d.take_due(1_000, &key(9)), vec![key(1), key(4)]);
        assert_eq!(d.len(), 0);
    }

    #[test]
    fn a_new_deadline_replaces_the_old_one() {
        let mut d = Deadlines::default();
        d.set(key(1), 10);
        d.set(key(1), 50);
        assert!(
            d.take_due(20, &key(9)).is_empty(),
            "the old deadline is gone"
        );
        assert_eq!(d.take_due(50, &key(9)), vec![key(1)]);
        d.set(key(2), 10);
        d.remove(&key(2));
        assert!(d.take_due(u64::MAX, &key(9)).is_empty());
    }

    #[test]
    fn the_key_being_blocked_is_kept() {
        let mut d = Deadlines::default();
        d.set(key(1), 10);
        d.set(key(2), 10);
        assert_eq!(d.take_due(20, &key(1)), vec![key(2)]);
        assert_eq!(d.len(), 1);
        assert_eq!(d.take_due(20, &key(9)), vec![key(1)]);
    }

    #[test]
    fn the_index_is_bounded_by_the_maps_capacity() {
        let mut d = Deadlines::default();
        let cap = door_common::BLOCKED_CAPACITY;
        for i in 0..=cap {
            let mut octets = [0u8; 16];
            octets[0] = 0x20;
            octets[1] = 0x01;
            octets[4..8].copy_from_slice(&i.to_be_bytes());
            d.set(PrefixKey::from_ipv6(octets), u64::from(i) + 1);
        }
        assert_eq!(d.len(), cap as usize);
        // The one due first (deadline 1) was forgotten.
        assert_eq!(d.take_due(1, &key(9)), Vec::<PrefixKey>::new());
        assert_eq!(d.take_due(2, &key(9)).len(), 1);
    }
}
