//! The client table of one limiter shard: a bounded map from [`PrefixKey`] to a value (the
//! limiter's `Row`), kept in an approximate least-recently-used order: CLOCK's second chance
//! (Corbató, 1968), in the list form of Linux's page reclaim.
//!
//! The entries sit in a list in the order they were *placed* at its front (inserted, refreshed,
//! or given a second chance). A use ([`Table::get_mut`]) only marks the entry: it writes nothing
//! but the entry itself, where an exact LRU would relink the entry, both its neighbours and the
//! old head on every use, cache lines every core writes in turn. Before a miss reads the oldest
//! entries ([`Table::oldest`]), each marked entry at the old end gets a second chance
//! ([`Table::second_chances`]): it is moved to the front and its mark cleared, so that an entry
//! used since it was placed is not taken for an old one.
//!
//! The entries sit inline in one array (key, value, the two links of the list and the use mark
//! together, 56 bytes for a `Row`), reached through an open-addressing index of entry numbers
//! (linear probing, at most half full, deletion by backward shift: Knuth, *The Art of Computer
//! Programming* vol. 3, §6.4, algorithm R). Each index slot also keeps a tag, bits of the key's
//! hash that the slot's position does not give, in the bits its entry number leaves free, so
//! that a probe passing another key's slot reads the entry (a cache miss in a large table) only
//! when the tags agree, as SwissTable's control bytes spare its buckets (Abseil, "Swiss Tables
//! Design Notes"). Entries never move: an entry's number stays valid
//! until the entry is removed, so a permit can keep it and settle without a lookup
//! ([`Table::live_at_mut`]). Keys are hashed with a per-table random key (`foldhash`), which a
//! client would have to learn to choose addresses that collide in the index (foldhash does not
//! claim resistance to an attacker who can time many lookups; the index is kept at most half full).
//!
//! The table allocates its entry array (`cap` entries) and its index when it is created or
//! resized, never on the request path.

use core::hash::BuildHasher as _;

use door_common::prefix::PrefixKey;

/// No entry: an end of the list.
const NIL: u32 = u32::MAX;

/// The `prev` link of an entry on the free list (not in the table).
const FREE: u32 = u32::MAX - 1;

/// One entry: a key, its value, its neighbours in the list (`prev` was placed later) and whether
/// it was used since it was placed.
#[derive(Debug, Clone, Copy)]
struct Entry<V> {
    key: PrefixKey,
    value: V,
    prev: u32,
    next: u32,
    used: bool,
}

/// A bounded map from [`PrefixKey`] to `V` in second-chance order (see the module docs).
#[derive(Debug)]
pub(super) struct Table<V> {
    /// Every entry ever allocated, live or on the free list.
    entries: Vec<Entry<V>>,
    /// Numbers of the entries on the free list.
    free: Vec<u32>,
    /// Per slot `0` when empty, else `entry number + 1` in the low `log2(index.len())` bits
    /// (every entry number is below `index.len() / 2`, see [`tag_bits`]) and the key's tag in
    /// the others ([`Table::probe`]); a power of two long, at least twice `cap` and twice `len`
    /// (never shrunk, so at most half full when busy entries keep `len` past a smaller `cap`).
    index: Box<[u32]>,
    hasher: foldhash::fast::RandomState,
    /// The bits of an index slot that hold its key's tag ([`tag_bits`]).
    tags: u32,
    /// The most bits a tag takes: 32 (all an index slot has beside its entry number); fewer in
    /// tests, so that tags collide.
    tag_width: u32,
    /// The entry placed last.
    head: u32,
    /// The entry placed first (the oldest).
    tail: u32,
    len: usize,
    cap: usize,
}

impl<V: Copy> Table<V> {
    /// An empty table of at most `cap` entries (at least 1).
    pub(super) fn new(cap: usize) -> Self {
        let cap = cap.max(1);
        let index = empty_index(cap);
        let tag_width = u32::BITS;
        Self {
            entries: Vec::with_capacity(cap),
            free: Vec::new(),
            tags: tag_bits(index.len(), tag_width),
            index,
            hasher: foldhash::fast::RandomState::default(),
            tag_width,
            head: NIL,
            tail: NIL,
            len: 0,
            cap,
        }
    }

    /// Entries in the table.
    pub(super) fn len(&self) -> usize {
        self.len
    }

    /// Whether the table holds `cap` entries or more (more only after [`Table::resize`] kept busy
    /// entries past a smaller `cap`).
    pub(super) fn is_full(&self) -> bool {
        self.len >= self.cap
    }

    fn mask(&self) -> usize {
        self.index.len() - 1
    }

    /// Where `key`'s probe starts, and its tag: the low bits of its hash select the slot, the
    /// high half gives the tag, masked to the slot's free bits.
    fn probe(&self, key: &PrefixKey) -> (usize, u32) {
        // Hashed as a byte array (its length, then its bytes): foldhash's one-call `u128` hash
        // spread keys that differ in a few bytes only, as clients' prefixes do, unevenly, by how
        // much depending on the random seed (1.26 to 1.87 slots probed a key in runs over
        // 262,144 of them, where a uniform hash gives 1.5).
        let h = self.hasher.hash_one(key.addr);
        #[expect(
            clippy::cast_possible_truncation,
            reason = "only the low bits select a slot, and the tag is the high half"
        )]
        let (slot, tag) = (h as usize & self.mask(), (h >> 32) as u32);
        (slot, tag & self.tags)
    }

    /// The index slot and entry number of `key`. Only an entry whose slot's tag is `key`'s is
    /// read, so a probe past other keys' slots reads, nearly always, one entry: `key`'s.
    fn find(&self, key: &PrefixKey) -> Option<(usize, u32)> {
        let mask = self.mask();
        let tags = self.tags;
        let (mut slot, tag) = self.probe(key);
        // The index is at most half full, so an empty slot ends every probe; the bound only
        // makes that visible.
        for _ in 0..self.index.len() {
            let n = *self.index.get(slot)?;
            let at = (n & !tags).checked_sub(1)?;
            if n & tags == tag && self.entries.get(at as usize).is_some_and(|e| e.key == *key) {
                return Some((slot, at));
            }
            slot = (slot + 1) & mask;
        }
        None
    }

    fn entry(&self, at: u32) -> Option<&Entry<V>> {
        self.entries.get(at as usize)
    }

    fn entry_mut(&mut self, at: u32) -> Option<&mut Entry<V>> {
        self.entries.get_mut(at as usize)
    }

    /// Whether `key` has an entry.
    pub(super) fn contains(&self, key: &PrefixKey) -> bool {
        self.find(key).is_some()
    }

    /// The value of `key`, leaving the order and the use mark alone.
    pub(super) fn peek(&self, key: &PrefixKey) -> Option<&V> {
        let (_, at) = self.find(key)?;
        self.entry(at).map(|e| &e.value)
    }

    /// The value of `key`, mutable, leaving the order and the use mark alone.
    pub(super) fn peek_mut(&mut self, key: &PrefixKey) -> Option<&mut V> {
        let (_, at) = self.find(key)?;
        self.entry_mut(at).map(|e| &mut e.value)
    }

    /// The entry number and value of `key`, marked used (the entry stays where it is in the
    /// list; [`Table::second_chances`] gives it its second chance).
    pub(super) fn get_mut(&mut self, key: &PrefixKey) -> Option<(u32, &mut V)> {
        let (_, at) = self.find(key)?;
        self.entry_mut(at).map(|e| {
            e.used = true;
            (at, &mut e.value)
        })
    }

    /// The value of entry `at` if it is still `key`'s (an entry number kept since
    /// [`Table::get_mut`] or [`Table::insert`]), without a lookup; the order and the use mark are
    /// left alone. `None` when the entry was removed since, even if `key` has another entry now.
    pub(super) fn at_mut(&mut self, at: u32, key: &PrefixKey) -> Option<&mut V> {
        self.entry_mut(at)
            .filter(|e| e.prev != FREE && e.key == *key)
            .map(|e| &mut e.value)
    }

    /// The key and value of entry `at` if it is in the table, without a lookup; the order and
    /// the use mark are left alone. The caller knows the entry is still the one it numbered
    /// (the limiter's permits: a busy entry is never removed or replaced, only cleared).
    pub(super) fn live_at_mut(&mut self, at: u32) -> Option<(PrefixKey, &mut V)> {
        self.entry_mut(at)
            .filter(|e| e.prev != FREE)
            .map(|e| (e.key, &mut e.value))
    }

    /// Adds `key`, which has no entry, at the front with `value`, unmarked; `None` (nothing
    /// changed) when the table is full or `key` has an entry already.
    pub(super) fn insert(&mut self, key: PrefixKey, value: V) -> Option<u32> {
        if self.is_full() || self.contains(&key) {
            return None;
        }
        let entry = Entry {
            key,
            value,
            prev: NIL,
            next: NIL,
            used: false,
        };
        let at = if let Some(at) = self.free.pop() {
            *self.entry_mut(at)? = entry;
            at
        } else {
            let at = u32::try_from(self.entries.len())
                .ok()
                .filter(|&n| n < FREE)?;
            self.entries.push(entry);
            at
        };
        self.index_insert(&key, at);
        self.link_front(at);
        self.len += 1;
        Some(at)
    }

    /// Gives entry `at` to `key` (which has no entry) with `value`, at the front and unmarked:
    /// the entry's old key leaves the table. Returns `false`, changing nothing, when `at` is not
    /// in the table or `key` already is.
    pub(super) fn replace(&mut self, at: u32, key: PrefixKey, value: V) -> bool {
        let Some(old) = self.entry(at).filter(|e| e.prev != FREE).map(|e| e.key) else {
            return false;
        };
        if self.contains(&key) {
            return false;
        }
        if let Some((slot, _)) = self.find(&old) {
            self.index_remove(slot);
        }
        if let Some(e) = self.entry_mut(at) {
            e.key = key;
            e.value = value;
        }
        self.index_insert(&key, at);
        self.promote(at);
        true
    }

    /// Removes `key`'s entry and returns its value.
    pub(super) fn remove(&mut self, key: &PrefixKey) -> Option<V> {
        let (slot, at) = self.find(key)?;
        self.index_remove(slot);
        self.unlink(at);
        let e = self.entry_mut(at)?;
        e.prev = FREE;
        e.next = NIL;
        let value = e.value;
        self.free.push(at);
        self.len -= 1;
        Some(value)
    }

    /// Places entry `at` at the front, unmarked.
    pub(super) fn promote(&mut self, at: u32) {
        let Some(e) = self.entry_mut(at).filter(|e| e.prev != FREE) else {
            return;
        };
        e.used = false;
        if self.head != at {
            self.unlink(at);
            self.link_front(at);
        }
    }

    /// Gives the marked entries at the old end their second chance, oldest first, until the
    /// oldest entry is unmarked or `max` were given: each is placed at the front, unmarked.
    /// Returns how many were given.
    ///
    /// Each chance clears a mark a use set, so the chances given are never more than the uses:
    /// O(1) per use, amortised; `max` bounds one call's work whatever the marks.
    pub(super) fn second_chances(&mut self, max: usize) -> usize {
        let mut given = 0;
        while given < max && self.entry(self.tail).is_some_and(|e| e.used) {
            self.promote(self.tail);
            given += 1;
        }
        given
    }

    /// The numbers of up to `N` oldest entries, oldest first, and how many there are.
    pub(super) fn oldest<const N: usize>(&self) -> ([u32; N], usize) {
        let mut out = [NIL; N];
        let mut n = 0;
        let mut at = self.tail;
        for slot in &mut out {
            let Some(e) = self.entry(at) else { break };
            *slot = at;
            n += 1;
            at = e.prev;
        }
        (out, n)
    }

    /// The value of entry `at`, if it is in the table.
    pub(super) fn value_at(&self, at: u32) -> Option<&V> {
        self.entry(at).filter(|e| e.prev != FREE).map(|e| &e.value)
    }

    /// Changes the capacity to `cap` (at least 1), removing entries past it that are not `busy`:
    /// the unmarked ones first, oldest first, then the marked ones, oldest first (a client that
    /// came back since its entry was placed stays longest); returns how many were removed. Busy
    /// entries stay (their numbers are held by someone), so the table may stay over `cap` until
    /// they are removed ([`Table::over_cap`]). Entry numbers of the remaining entries stay valid.
    pub(super) fn resize(&mut self, cap: usize, busy: impl Fn(&V) -> bool) -> usize {
        let cap = cap.max(1);
        let removed = self.remove_oldest(cap, |e| !e.used && !busy(&e.value))
            + self.remove_oldest(cap, |e| !busy(&e.value));
        self.cap = cap;
        self.entries
            .reserve_exact(cap.saturating_sub(self.entries.len()));
        if self.index.len() < cap * 2 {
            self.index = empty_index(cap.max(self.len));
            self.tags = tag_bits(self.index.len(), self.tag_width);
            let mut at = self.head;
            while let Some(e) = self.entry(at) {
                let (key, next) = (e.key, e.next);
                self.index_insert(&key, at);
                at = next;
            }
        }
        debug_assert!(self.index.len() >= 2 * self.len.max(self.cap));
        removed
    }

    /// Removes the entries `gone` says, oldest first, while the table holds more than `cap`;
    /// returns how many it removed.
    fn remove_oldest(&mut self, cap: usize, gone: impl Fn(&Entry<V>) -> bool) -> usize {
        let mut removed = 0;
        let mut at = self.tail;
        while self.len > cap {
            let Some(e) = self.entry(at) else { break };
            let (key, prev, remove) = (e.key, e.prev, gone(e));
            if remove && self.remove(&key).is_some() {
                removed += 1;
            }
            at = prev;
        }
        removed
    }

    /// Whether the table holds more entries than its capacity (after [`Table::resize`] kept
    /// busy entries past a smaller one).
    pub(super) fn over_cap(&self) -> bool {
        self.len > self.cap
    }

    /// Every entry, the one placed last first.
    pub(super) fn iter(&self) -> impl Iterator<Item = (&PrefixKey, &V)> {
        let mut at = self.head;
        core::iter::from_fn(move || {
            let e = self.entry(at)?;
            at = e.next;
            Some((&e.key, &e.value))
        })
    }

    /// Every value, mutable, in no particular order.
    pub(super) fn values_mut(&mut self) -> impl Iterator<Item = &mut V> {
        self.entries
            .iter_mut()
            .filter(|e| e.prev != FREE)
            .map(|e| &mut e.value)
    }

    fn index_insert(&mut self, key: &PrefixKey, at: u32) {
        let mask = self.mask();
        let (mut slot, tag) = self.probe(key);
        debug_assert!(
            (at as usize) < self.index.len() / 2,
            "entry number {at} reaches the tag bits of {} slots",
            self.index.len()
        );
        for _ in 0..self.index.len() {
            match self.index.get_mut(slot) {
                Some(s) if *s == 0 => {
                    *s = tag | (at + 1);
                    return;
                }
                Some(_) => slot = (slot + 1) & mask,
                None => return,
            }
        }
    }

    /// Empties `slot` and moves later entries of its probe run back into the hole, so that
    /// every key stays reachable from its home slot without tombstones.
    fn index_remove(&mut self, slot: usize) {
        let mask = self.mask();
        let tags = self.tags;
        let mut hole = slot;
        let mut i = (slot + 1) & mask;
        for _ in 0..self.index.len() {
            let n = self.index.get(i).copied().unwrap_or(0);
            let Some(key) = (n & !tags)
                .checked_sub(1)
                .and_then(|at| self.entry(at))
                .map(|e| e.key)
            else {
                break;
            };
            let (start, _) = self.probe(&key);
            // The entry may fill the hole if the hole lies between its home and its slot.
            if (i.wrapping_sub(start) & mask) >= (i.wrapping_sub(hole) & mask) {
                if let Some(h) = self.index.get_mut(hole) {
                    *h = n;
                }
                hole = i;
            }
            i = (i + 1) & mask;
        }
        if let Some(h) = self.index.get_mut(hole) {
            *h = 0;
        }
    }

    fn unlink(&mut self, at: u32) {
        let Some(&Entry { prev, next, .. }) = self.entry(at) else {
            return;
        };
        match self.entry_mut(prev) {
            Some(p) => p.next = next,
            None => self.head = next,
        }
        match self.entry_mut(next) {
            Some(n) => n.prev = prev,
            None => self.tail = prev,
        }
    }

    fn link_front(&mut self, at: u32) {
        let head = self.head;
        if let Some(e) = self.entry_mut(at) {
            e.prev = NIL;
            e.next = head;
        }
        match self.entry_mut(head) {
            Some(h) => h.prev = at,
            None => self.tail = at,
        }
        self.head = at;
    }
}

/// The bytes one entry takes in a table of `V` values (the limiter asserts its own).
pub(super) const fn entry_size<V>() -> usize {
    size_of::<Entry<V>>()
}

/// The bits of a slot of an index of `slots` slots that hold a tag: at most `width` of those
/// above its entry number, which is below `slots` (entries are only added while `len < cap`, so
/// every entry number ever handed out is below the `cap` of its time, and the index, never
/// shrunk, was at least twice that long then). None for an index of 2^32 slots or more.
fn tag_bits(slots: usize, width: u32) -> u32 {
    let above_entry = u32::MAX.checked_shl(slots.trailing_zeros()).unwrap_or(0);
    above_entry
        & u32::MAX
            .checked_shl(u32::BITS.saturating_sub(width))
            .unwrap_or(0)
}

/// An index for `cap` entries: empty, a power of two slots, at least twice `cap`.
fn empty_index(cap: usize) -> Box<[u32]> {
    vec![0; cap.saturating_mul(2).next_power_of_two().max(8)].into_boxed_slice()
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;

    fn key(i: u16) -> PrefixKey {
        let [hi, lo] = i.to_be_bytes();
        PrefixKey::from_ipv4([10, 0, hi, lo])
    }

    fn order<V: Copy>(t: &Table<V>) -> Vec<(PrefixKey, V)> {
        t.iter().map(|(k, v)| (*k, *v)).collect()
    }

    #[test]
    fn a_used_entry_gets_a_second_chance_and_the_oldest_is_replaced_in_place() {
        let mut t = Table::new(3);
        let a = t.insert(key(1), 10).unwrap();
        t.insert(key(2), 20).unwrap();
        t.insert(key(3), 30).unwrap();
        assert!(t.insert(key(4), 40).is_none(), "full");
        assert_eq!(t.get_mut(&key(1)).map(|(at, v)| (at, *v)), Some((a, 10)));
        assert_eq!(
            order(&t),
            [(key(3), 30), (key(2), 20), (key(1), 10)],
            "a use does not move the entry"
        );
        assert_eq!(t.second_chances(8), 1);
        assert_eq!(order(&t), [(key(1), 10), (key(3), 30), (key(2), 20)]);
        assert_eq!(t.second_chances(8), 0, "the oldest is unmarked now");
        let (oldest, n) = t.oldest::<8>();
        assert_eq!(n, 3);
        assert_eq!(t.value_at(oldest[0]), Some(&20));
        assert!(t.replace(oldest[0], key(4), 40));
        assert!(!t.contains(&key(2)));
        assert_eq!(t.peek(&key(4)), Some(&40));
        assert_eq!(order(&t), [(key(4), 40), (key(1), 10), (key(3), 30)]);
        assert_eq!(t.at_mut(a, &key(1)).copied(), Some(10));
        assert_eq!(t.at_mut(a, &key(4)), None, "entry a is key 1's");
    }

    #[test]
    fn second_chances_are_bounded_and_each_clears_one_mark() {
        let mut t = Table::new(4);
        for i in 0..4 {
            t.insert(key(i), i).unwrap();
            t.get_mut(&key(i)).unwrap();
        }
        assert_eq!(t.second_chances(0), 0);
        assert_eq!(t.second_chances(2), 2);
        assert_eq!(
            order(&t),
            [(key(1), 1), (key(0), 0), (key(3), 3), (key(2), 2)]
        );
        assert_eq!(t.second_chances(100), 2, "only 2 and 3 were still marked");
        assert_eq!(
            order(&t),
            [(key(3), 3), (key(2), 2), (key(1), 1), (key(0), 0)]
        );
        assert_eq!(t.second_chances(100), 0);
        assert_eq!(Table::<u16>::new(1).second_chances(100), 0);
    }

    #[test]
    fn a_removed_entry_number_no_longer_reaches_its_key() {
        let mut t = Table::new(2);
        let a = t.insert(key(1), 1).unwrap();
        assert_eq!(t.remove(&key(1)), Some(1));
        assert_eq!(t.at_mut(a, &key(1)), None);
        let b = t.insert(key(2), 2).unwrap();
        assert_eq!(b, a, "the free entry is reused");
        assert_eq!(t.at_mut(a, &key(1)), None);
        assert_eq!(t.at_mut(b, &key(2)).copied(), Some(2));
    }

    #[test]
    fn an_entry_number_reaches_its_entry_while_it_is_in_the_table() {
        let mut t = Table::new(2);
        let a = t.insert(key(1), 1).unwrap();
        let b = t.insert(key(2), 2).unwrap();
        assert_eq!(t.live_at_mut(a).map(|(k, v)| (k, *v)), Some((key(1), 1)));
        // Reordering and a growing resize keep the numbers.
        t.get_mut(&key(1)).unwrap();
        t.second_chances(10);
        t.resize(8, |_| false);
        assert_eq!(t.live_at_mut(b).map(|(k, v)| (k, *v)), Some((key(2), 2)));
        assert_eq!(t.remove(&key(1)), Some(1));
        assert_eq!(t.live_at_mut(a), None, "a removed entry is free");
        let c = t.insert(key(3), 3).unwrap();
        assert_eq!(c, a, "the free entry is reused");
        assert_eq!(t.live_at_mut(a).map(|(k, v)| (k, *v)), Some((key(3), 3)));
        assert_eq!(t.len(), 2);
        // A limiter that goes replaces its tables with empty ones: its numbers reach nothing.
        let t: Table<i32> = Table::new(1);
        assert_eq!(t.len(), 0);
        let mut t = t;
        assert_eq!(t.live_at_mut(a), None, "an emptied table has no entries");
        assert_eq!(t.live_at_mut(b), None);
        assert_eq!(t.live_at_mut(u32::MAX), None);
    }

    #[test]
    fn resize_drops_unmarked_entries_before_marked_ones() {
        let mut t = Table::new(4);
        for i in 0..4 {
            t.insert(key(i), i).unwrap();
        }
        t.get_mut(&key(0)).unwrap();
        t.get_mut(&key(2)).unwrap();
        assert_eq!(t.resize(3, |_| false), 1);
        assert!(!t.contains(&key(1)), "the oldest unmarked entry goes first");
        assert_eq!(t.resize(1, |_| false), 2);
        assert_eq!(order(&t), [(key(2), 2)], "then the marked, oldest first");
    }

    #[test]
    fn resize_drops_the_oldest_and_keeps_entry_numbers() {
        let mut t = Table::new(4);
        let ats: Vec<u32> = (0..4).map(|i| t.insert(key(i), i).unwrap()).collect();
        assert_eq!(t.resize(2, |_| false), 2);
        assert_eq!(t.len(), 2);
        assert!(!t.over_cap());
        assert!(!t.contains(&key(0)) && !t.contains(&key(1)));
        assert_eq!(t.resize(64, |_| false), 0);
        assert_eq!(t.at_mut(ats[3], &key(3)).copied(), Some(3));
        assert_eq!(t.peek(&key(2)), Some(&2));
        for i in 10..72 {
            t.insert(key(i), i);
        }
        assert_eq!(t.len(), 64);
    }

    /// A table whose tags are `width` bits at most (see `Table::tag_width`).
    fn with_tag_width<V: Copy>(cap: usize, width: u32) -> Table<V> {
        let t = Table::new(cap);
        Table {
            tags: tag_bits(t.index.len(), width),
            tag_width: width,
            ..t
        }
    }

    /// Slots of other keys with `key`'s tag that a probe for `key` passes: up to `key`'s own
    /// slot, or to the empty slot that ends the probe of an absent key.
    fn same_tag_passed<V: Copy>(t: &Table<V>, key: &PrefixKey) -> usize {
        let (mut slot, tag) = t.probe(key);
        let mut n = 0;
        while let Some(&s) = t.index.get(slot).filter(|&&s| s != 0) {
            if t.entry((s & !t.tags) - 1).map(|e| e.key) == Some(*key) {
                break;
            }
            n += usize::from(s & t.tags == tag);
            slot = (slot + 1) & t.mask();
        }
        n
    }

    /// Keys whose index slots share a tag are told apart by their entries' keys: with one-bit
    /// tags, probes pass slots of other keys with the same tag, and every key still finds its
    /// own value, and no absent key finds one, before and after half the keys are removed (the
    /// backward shift moves tags with their slots).
    #[test]
    fn keys_with_the_same_tag_are_told_apart() {
        const N: u16 = 512;
        let mut t = with_tag_width(usize::from(N), 1);
        for i in 0..N {
            assert!(t.insert(key(i), i).is_some());
        }
        assert_eq!(t.tags, 1 << 31);
        // 400 to 600 in runs: one slot passed in two has the same one-bit tag.
        let collisions: usize = (0..2 * N).map(|i| same_tag_passed(&t, &key(i))).sum();
        assert!(
            collisions > 100,
            "{collisions} probes passed a slot with their tag"
        );
        for i in 0..2 * N {
            assert_eq!(t.peek(&key(i)).copied(), (i < N).then_some(i), "key {i}");
        }
        for i in (0..N).step_by(2) {
            assert_eq!(t.remove(&key(i)), Some(i));
        }
        for i in 0..2 * N {
            let present = i < N && i % 2 == 1;
            assert_eq!(t.peek(&key(i)).copied(), present.then_some(i), "key {i}");
        }
    }

    /// A tag takes the bits above the largest entry number an index of that length holds, at
    /// most `width` of them, and none at 2^32 slots.
    #[test]
    fn tags_take_every_bit_above_the_entry_number() {
        for (slots, width, want) in [
            (8, 32, !0b111),
            (2048, 32, !0b111_1111_1111),
            (1 << 31, 32, 1 << 31),
            (1 << 32, 32, 0),
            (2048, 0, 0),
            (2048, 2, 0b11 << 30),
            (8, 40, !0b111),
        ] {
            assert_eq!(tag_bits(slots, width), want, "{slots} slots, width {width}");
        }
    }

    /// A table as the limiter builds it, filled to powers of two and other caps, grown, and
    /// filled again: its tags take every bit above the entry number, so a probe passes at most
    /// one slot of another key with its tag (a chance of about one in 2^20 a slot passed), and
    /// every key finds its own value.
    #[test]
    fn a_full_table_with_its_own_tags_reads_no_other_entry() {
        for cap in [1usize, 3, 4, 8, 512, 1000, 1024] {
            let mut t = Table::new(cap);
            let n = u16::try_from(cap).unwrap();
            for i in 0..n {
                assert!(t.insert(key(i), i).is_some(), "cap {cap}, key {i}");
            }
            assert_eq!(t.resize(2 * cap, |_| false), 0);
            for i in n..2 * n {
                assert!(t.insert(key(i), i).is_some(), "cap {}, key {i}", 2 * cap);
            }
            let slots = t.index.len();
            assert_eq!(
                t.tags.count_ones(),
                32 - slots.trailing_zeros(),
                "cap {cap}"
            );
            let mut passed = 0;
            for i in 0..4 * n {
                passed += same_tag_passed(&t, &key(i));
                assert_eq!(t.peek(&key(i)).copied(), (i < 2 * n).then_some(i));
            }
            assert!(
                passed <= 1,
                "cap {cap}: {passed} slots passed with the key's tag"
            );
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u16),
        Get(u16),
        Remove(u16),
        Promote(u16),
        /// Reach the entry as a settlement does, by its number (the mark stays as it is).
        Settle(u16),
        /// Reach the value by key without a use (the mark stays as it is).
        PeekMut(u16),
        /// Give up to this many second chances, then replace the oldest entry.
        ReplaceOldest(u16, usize),
        Resize(usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Few keys, so that operations meet the same keys often.
        prop_oneof![
            (0u16..24).prop_map(Op::Insert),
            (0u16..24).prop_map(Op::Get),
            (0u16..24).prop_map(Op::Remove),
            (0u16..24).prop_map(Op::Promote),
            (0u16..24).prop_map(Op::Settle),
            (0u16..24).prop_map(Op::PeekMut),
            (0u16..24, 0usize..6).prop_map(|(i, c)| Op::ReplaceOldest(i, c)),
            (1usize..20).prop_map(Op::Resize),
        ]
    }

    /// The model's entry: key, value, used since placed.
    type Modelled = (PrefixKey, u16, bool);

    /// Places the model's entry `pos` at the front, unmarked.
    fn model_promote(model: &mut VecDeque<Modelled>, pos: usize) {
        if let Some((k, v, _)) = model.remove(pos) {
            model.push_front((k, v, false));
        }
    }

    proptest! {
        /// The table behaves as a list in placement order with a use mark per entry (the model:
        /// placed last first), the oldest unused entry found by second chances; with tags of
        /// any width, down to none (every probe reads the entry).
        #[test]
        fn matches_a_second_chance_list(
            cap in 1usize..16,
            tag_width in prop_oneof![Just(0u32), Just(1), Just(2), Just(u32::BITS)],
            ops in prop::collection::vec(op(), 1..300),
        ) {
            let mut t = with_tag_width(cap, tag_width);
            let mut model: VecDeque<Modelled> = VecDeque::new();
            let mut cap = cap;
            let pos = |model: &VecDeque<Modelled>, i: u16| model.iter().position(|e| e.0 == key(i));
            for op in ops {
                match op {
                    Op::Insert(i) => {
                        let fits = model.len() < cap && pos(&model, i).is_none();
                        prop_assert_eq!(t.insert(key(i), i).is_some(), fits);
                        if fits {
                            model.push_front((key(i), i, false));
                        }
                    }
                    Op::Get(i) => {
                        let got = t.get_mut(&key(i)).map(|(_, v)| *v);
                        let e = pos(&model, i).and_then(|p| model.get_mut(p));
                        prop_assert_eq!(got, e.as_ref().map(|e| e.1));
                        if let Some(e) = e {
                            e.2 = true;
                        }
                    }
                    Op::Remove(i) => {
                        let want = pos(&model, i).and_then(|p| model.remove(p)).map(|e| e.1);
                        prop_assert_eq!(t.remove(&key(i)), want);
                    }
                    Op::Promote(i) => {
                        if let Some((_, at)) = t.find(&key(i)) {
                            t.promote(at);
                        }
                        if let Some(p) = pos(&model, i) {
                            model_promote(&mut model, p);
                        }
                    }
                    Op::Settle(i) => {
                        let at = t.find(&key(i)).map(|(_, at)| at);
                        let got = at.and_then(|at| t.at_mut(at, &key(i))).map(|v| *v);
                        prop_assert_eq!(got, pos(&model, i).map(|p| model[p].1));
                    }
                    Op::PeekMut(i) => {
                        let got = t.peek_mut(&key(i)).map(|v| *v);
                        prop_assert_eq!(got, pos(&model, i).map(|p| model[p].1));
                    }
                    Op::ReplaceOldest(i, chances) => {
                        let mut given = 0;
                        while given < chances && model.back().is_some_and(|e| e.2) {
                            given += 1;
                            let last = model.len() - 1;
                            model_promote(&mut model, last);
                        }
                        prop_assert_eq!(t.second_chances(chances), given);
                        let (oldest, n) = t.oldest::<1>();
                        prop_assert_eq!(
                            t.value_at(oldest[0]).copied().filter(|_| n == 1),
                            model.back().map(|e| e.1)
                        );
                        let taken = pos(&model, i).is_some();
                        let done = n == 1 && t.replace(oldest[0], key(i), i);
                        prop_assert_eq!(done, n == 1 && !taken);
                        if done {
                            model.pop_back();
                            model.push_front((key(i), i, false));
                        }
                    }
                    Op::Resize(c) => {
                        // Odd values are busy: they stay, and only they may stay past `c`.
                        // Unmarked idle entries go first, then marked idle ones, oldest first.
                        let busy = |v: &u16| v % 2 == 1;
                        let before = model.len();
                        for marked_too in [false, true] {
                            let mut i = model.len();
                            while model.len() > c && i > 0 {
                                i -= 1;
                                if !busy(&model[i].1) && (marked_too || !model[i].2) {
                                    model.remove(i);
                                }
                            }
                        }
                        prop_assert_eq!(t.resize(c, busy), before - model.len());
                        prop_assert_eq!(t.over_cap(), model.len() > c);
                        prop_assert!(t.len() <= c || t.iter().all(|(_, v)| busy(v)));
                        cap = c;
                    }
                }
                let want: Vec<(PrefixKey, u16)> = model.iter().map(|e| (e.0, e.1)).collect();
                prop_assert_eq!(&order(&t), &want);
                prop_assert_eq!(t.len(), model.len());
                for (k, v, used) in &model {
                    prop_assert_eq!(t.peek(k), Some(v));
                    let marked = t.find(k).and_then(|(_, at)| t.entry(at)).map(|e| e.used);
                    prop_assert_eq!(marked, Some(*used));
                }
            }
        }
    }
}
