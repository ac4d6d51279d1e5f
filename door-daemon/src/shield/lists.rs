//! The operator's lists as the program holds them: the lists trie's entries
//! ([`door_common::MAP_EXEMPT`], [`list_entries`]) and the filter in front of it
//! ([`door_common::list_filter`], [`ListFilter`]).
//!
//! For the filter, an entry that can decide a source (exempt or denied;
//! [`door_common::UNLISTED`] decides nothing) sets the bit of its lead in the bitmap of each
//! family whose sources it can match: the IPv6 bitmap for every entry (an IPv6 packet's source is
//! looked up as it is, whatever it holds), the IPv4 bitmap for the entries that can decide an
//! IPv4 source, looked up in its mapped form `::ffff:a.b.c.d`: IPv4 networks ([`leads`]). Each
//! family's lead mask is its shortest such prefix, so that each entry's bit is the bit of every
//! source it covers.

use std::net::Ipv4Addr;

use aya::maps::lpm_trie::Key;
use door_common::{
    DENIED, EXEMPT, ExemptKey,
    list_filter::{FAMILY_WORDS, LIST_FILTER_WORDS, filter_bit, lead_mask, lead_v4, lead_v6},
};
use ipnet::IpNet;

/// The exempt trie's keys for `net`: an IPv6 network as it is; an IPv4 one twice, with prefix
/// length 96 + n, in its mapped 16-byte form (how the program keys an IPv4 source) and under the
/// NAT64 prefix `64:ff9b::/96` (RFC 6052 §2.1), whose clients door keys, limits and lists by the
/// IPv4 address they embed ([`crate::client::listed`]).
fn exempt_keys(net: IpNet) -> impl Iterator<Item = Key<ExemptKey>> {
    let keys = match net {
        IpNet::V4(v4) => {
            let len = 96 + u32::from(v4.prefix_len());
            let mut nat64 = [0, 0x64, 0xff, 0x9b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            if let Some(tail) = nat64.last_chunk_mut::<4>() {
                *tail = v4.network().octets();
            }
            [
                Some(Key::new(len, v4.network().to_ipv6_mapped().octets())),
                Some(Key::new(len, nat64)),
            ]
        }
        IpNet::V6(v6) => [
            Some(Key::new(u32::from(v6.prefix_len()), v6.network().octets())),
            None,
        ],
    };
    keys.into_iter().flatten()
}

/// The lists trie's entries for `exempt` (never shed) and `deny` (dropped), one per key: each
/// network's [`exempt_keys`], a key on both lists denied. When an IPv6 network covers
/// `::ffff:0:0/96` ([`crate::client::covers_ipv4_mapped`]), the entry at that key decides every
/// IPv4 source that no more specific IPv4 network matches: an IPv4 `0.0.0.0/0`'s value when one is
/// listed (its key is that one), [`door_common::UNLISTED`] otherwise, also over an IPv6 network
/// written as `::ffff:0:0/96` (layer 7 never matches an IPv4 client against an IPv6 network).
/// [`crate::config::shield_list_entries`] counts them before a configuration is accepted.
pub(super) fn list_entries(exempt: &[IpNet], deny: &[IpNet]) -> Vec<(Key<ExemptKey>, u32)> {
    let mut entries: Vec<(Key<ExemptKey>, u32)> = Vec::new();
    let listed = || {
        exempt
            .iter()
            .map(|n| (n, EXEMPT))
            .chain(deny.iter().map(|n| (n, DENIED)))
    };
    for (net, value) in listed() {
        for key in exempt_keys(*net) {
            match entries.iter_mut().find(|(k, _)| same_key(k, &key)) {
                Some(entry) => entry.1 = value.max(entry.1),
                None => entries.push((key, value)),
            }
        }
    }
    if listed().any(|(net, _)| crate::client::covers_ipv4_mapped(net)) {
        let ipv4_anywhere = listed()
            .filter(|(net, _)| matches!(net, IpNet::V4(v4) if v4.prefix_len() == 0))
            .map(|(_, value)| value)
            .max();
        let value = ipv4_anywhere.unwrap_or(door_common::UNLISTED);
        let mapped = Key::new(96, Ipv4Addr::UNSPECIFIED.to_ipv6_mapped().octets());
        match entries.iter_mut().find(|(k, _)| same_key(k, &mapped)) {
            Some(entry) => entry.1 = value,
            None => entries.push((mapped, value)),
        }
    }
    entries
}

pub(super) fn same_key(a: &Key<ExemptKey>, b: &Key<ExemptKey>) -> bool {
    a.prefix_len() == b.prefix_len() && a.data() == b.data()
}

/// The first 12 bytes of an IPv4-mapped IPv6 address (RFC 4291 §2.5.5.2).
const MAPPED: [u8; 12] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff];

/// The filter for one set of lists: the words of [`door_common::MAP_LIST_FILTER`] and the
/// configuration's two lead masks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct ListFilter {
    /// [`LIST_FILTER_WORDS`] words: the IPv4 bitmap, then the IPv6 one.
    pub(super) words: Box<[u64]>,
    /// [`door_common::ShieldConfig::lead_mask_v4`].
    pub(super) mask_v4: u64,
    /// [`door_common::ShieldConfig::lead_mask_v6`].
    pub(super) mask_v6: u64,
}

/// One entry's leads: `(IPv4 prefix length, IPv4 lead)` when IPv4 sources can match it, and the
/// IPv6 side's `(prefix length, lead)`.
type Leads = (Option<(u32, u64)>, (u32, u64));

impl ListFilter {
    /// The filter of the trie's entries `entries` ([`list_entries`]; a key's bits past its
    /// prefix length are ignored).
    pub(super) fn of(entries: &[(Key<ExemptKey>, u32)]) -> Self {
        let deciding = entries
            .iter()
            .filter(|&&(_, value)| value == EXEMPT || value == DENIED)
            .map(|(key, _)| leads(key.prefix_len(), &key.data()));
        let mask_v4 = lead_mask(
            deciding
                .clone()
                .filter_map(|(v4, _)| v4.map(|(len, _)| len))
                .min()
                .unwrap_or(32),
        );
        let mask_v6 = lead_mask(
            deciding
                .clone()
                .map(|(_, (len, _))| len)
                .min()
                .unwrap_or(64),
        );
        let mut words = vec![0u64; LIST_FILTER_WORDS as usize].into_boxed_slice();
        let mut set = |start: u32, lead: u64, mask: u64| {
            let (word, bit) = filter_bit(lead, mask);
            if let Some(w) = words.get_mut((start + word) as usize) {
                *w |= 1 << bit;
            }
        };
        for (v4, (_, lead6)) in deciding {
            if let Some((_, lead4)) = v4 {
                set(0, lead4, mask_v4);
            }
            set(FAMILY_WORDS, lead6, mask_v6);
        }
        Self {
            words,
            mask_v4,
            mask_v6,
        }
    }

    /// Whether the program walks the trie for the source `addr` (16 bytes; IPv4 mapped when
    /// `v6` is false): what the program computes, for tests.
    #[cfg(test)]
    pub(super) fn walks(&self, addr: &ExemptKey, v6: bool) -> bool {
        let (start, lead, mask) = if v6 {
            (FAMILY_WORDS, lead_v6(first::<8>(addr, 0)), self.mask_v6)
        } else {
            (0, lead_v4(first::<4>(addr, 12)), self.mask_v4)
        };
        let (word, bit) = filter_bit(lead, mask);
        self.words
            .get((start + word) as usize)
            .is_some_and(|w| w & (1 << bit) != 0)
    }
}

/// The leads of the entry `key/len` (see [`Leads`]). An IPv4 source can be decided only by an
/// entry in the mapped range, `::ffff:0:0/96` or longer (an IPv4 network): an IPv6 network that
/// covers the range is shorter than the [`door_common::UNLISTED`] entry [`list_entries`] writes
/// at `::ffff:0:0/96` with it, which is then the IPv4 source's longest match.
fn leads(len: u32, key: &ExemptKey) -> Leads {
    let v6 = (len.min(64), lead_v6(first::<8>(key, 0)));
    let v4 = (len >= 96 && first::<12>(key, 0) == MAPPED)
        .then(|| (len - 96, lead_v4(first::<4>(key, 12))));
    (v4, v6)
}

/// `N` bytes of `key` from `at` (zeros past its end, which the callers' constants never reach).
fn first<const N: usize>(key: &ExemptKey, at: usize) -> [u8; N] {
    key.get(at..)
        .and_then(|rest| rest.first_chunk::<N>())
        .copied()
        .unwrap_or([0; N])
}

#[cfg(test)]
mod tests {
    use std::net::{IpAddr, Ipv6Addr};

    use proptest::prelude::*;

    use super::*;

    /// What the trie answers for `addr`: the value of the longest entry whose first bits are the
    /// address's (Linux's `trie_lookup_elem`), `None` when none matches.
    fn lookup(entries: &[(Key<ExemptKey>, u32)], addr: &ExemptKey) -> Option<u32> {
        let bits = |a: &ExemptKey, len: u32| {
            u128::from_be_bytes(*a) & u128::MAX.checked_shl(128 - len).unwrap_or(0)
        };
        entries
            .iter()
            .filter(|(k, _)| bits(&k.data(), k.prefix_len()) == bits(addr, k.prefix_len()))
            .max_by_key(|(k, _)| k.prefix_len())
            .map(|&(_, value)| value)
    }

    /// A source as the program looks it up: 16 bytes (an IPv4 one mapped), and whether IPv6.
    fn source(ip: IpAddr) -> (ExemptKey, bool) {
        match ip {
            IpAddr::V4(v4) => (v4.to_ipv6_mapped().octets(), false),
            IpAddr::V6(v6) => (v6.octets(), true),
        }
    }

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|n| n.parse().unwrap()).collect()
    }

    #[test]
    fn a_source_on_no_list_skips_the_trie_and_a_listed_one_walks_it() {
        let exempt = nets(&["192.0.2.10/32", "2001:db8:ffff::/48"]);
        let deny = nets(&["203.0.113.128/25"]);
        let entries = list_entries(&exempt, &deny);
        let filter = ListFilter::of(&entries);
        assert_eq!(filter.mask_v4, lead_mask(25));
        assert_eq!(filter.mask_v6, lead_mask(48));
        for ip in [
            "192.0.2.10",
            "203.0.113.200",
            "2001:db8:ffff:1::7",
            "64:ff9b::c000:20a",
        ] {
            let (addr, v6) = source(ip.parse().unwrap());
            assert!(filter.walks(&addr, v6), "{ip} is listed: the trie decides");
        }
        for ip in [
            "198.51.100.7",
            "192.0.2.200",
            "2001:db8:1::7",
            "2001:db8:fffe::7",
        ] {
            let (addr, v6) = source(ip.parse().unwrap());
            assert_eq!(lookup(&entries, &addr), None, "{ip}");
            assert!(!filter.walks(&addr, v6), "{ip} is on no list: no walk");
        }
    }

    #[test]
    fn ipv4_anywhere_beside_an_ipv6_network_over_the_mapped_range_decides_ipv4_sources() {
        // `::/0` covers `::ffff:0:0/96`, the key `0.0.0.0/0` has too: the IPv4 network decides
        // IPv4 sources (layer 7 never matches an IPv4 client against an IPv6 network). door's
        // configuration refuses a /0; the shield's own interface takes one.
        let v4 = |ip: &str| source(ip.parse().unwrap()).0;
        let entries = list_entries(&nets(&["0.0.0.0/0", "::/0"]), &[]);
        assert_eq!(lookup(&entries, &v4("198.51.100.7")), Some(EXEMPT));
        let entries = list_entries(&nets(&["0.0.0.0/0"]), &nets(&["::/8"]));
        assert_eq!(lookup(&entries, &v4("198.51.100.7")), Some(EXEMPT));
        // Without it, an IPv4 source is on no list, whatever the IPv6 networks.
        for (exempt, deny) in [
            (vec![], vec!["::/0"]),
            (vec!["::ffff:0:0/96"], vec!["::/8"]),
        ] {
            let entries = list_entries(&nets(&exempt), &nets(&deny));
            assert_eq!(
                lookup(&entries, &v4("198.51.100.7")),
                Some(door_common::UNLISTED)
            );
        }
    }

    /// Networks of both families, some of them long, short, covering the mapped range or
    /// under the NAT64 prefix.
    fn net() -> impl Strategy<Value = IpNet> {
        let v4 = (any::<[u8; 4]>(), 0u8..=32)
            .prop_map(|(a, len)| IpNet::new(IpAddr::from(a), len).unwrap().trunc());
        let near = prop_oneof![
            Just(Ipv6Addr::UNSPECIFIED.octets()),
            Just(Ipv6Addr::new(0x64, 0xff9b, 0, 0, 0, 0, 0, 0).octets()),
            Just(Ipv6Addr::new(0, 0, 0, 0, 0, 0xffff, 0, 0).octets()),
            Just(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 0).octets()),
            any::<[u8; 16]>(),
        ];
        let v6 =
            (near, any::<[u8; 16]>(), 0u8..=128, 0u8..=128).prop_map(|(base, noise, cut, len)| {
                let keep = u128::MAX.checked_shl(128 - u32::from(cut)).unwrap_or(0);
                let a = (u128::from_be_bytes(base) & keep) | (u128::from_be_bytes(noise) & !keep);
                IpNet::new(IpAddr::from(a.to_be_bytes()), len)
                    .unwrap()
                    .trunc()
            });
        prop_oneof![v4, v6]
    }

    /// A source inside a listed network (its host bits random), or anywhere.
    fn sources(nets: &[IpNet], picks: &[(usize, [u8; 16])]) -> Vec<IpAddr> {
        let mut out = Vec::new();
        for &(i, noise) in picks {
            let Some(net) = nets.get(i % nets.len().max(1)) else {
                out.push(IpAddr::from(noise));
                continue;
            };
            let ip = match net {
                IpNet::V4(v4) => {
                    let host = u32::from_be_bytes(noise[..4].try_into().unwrap())
                        & !u32::from(v4.netmask());
                    IpAddr::from((u32::from(v4.network()) | host).to_be_bytes())
                }
                IpNet::V6(v6) => {
                    let host = u128::from_be_bytes(noise) & !u128::from(v6.netmask());
                    IpAddr::from((u128::from(v6.network()) | host).to_be_bytes())
                }
            };
            out.push(ip);
            out.push(IpAddr::from(noise));
        }
        out
    }

    proptest! {
        /// No false negatives: whenever the trie would exempt or deny a source, the program walks
        /// it.
        #[test]
        fn every_source_the_trie_decides_walks_it(
            exempt in prop::collection::vec(net(), 0..6),
            deny in prop::collection::vec(net(), 0..6),
            picks in prop::collection::vec((any::<usize>(), any::<[u8; 16]>()), 1..24),
        ) {
            let entries = list_entries(&exempt, &deny);
            for (i, (a, _)) in entries.iter().enumerate() {
                prop_assert!(
                    entries.iter().skip(i + 1).all(|(b, _)| !same_key(a, b)),
                    "one entry per key: the trie keeps only the last written"
                );
            }
            let filter = ListFilter::of(&entries);
            let all: Vec<IpNet> = exempt.iter().chain(&deny).copied().collect();
            for ip in sources(&all, &picks) {
                let (addr, v6) = source(ip);
                if matches!(lookup(&entries, &addr), Some(EXEMPT | DENIED)) {
                    prop_assert!(filter.walks(&addr, v6), "{ip} decided by the trie, filter skips it; exempt {exempt:?}, deny {deny:?}");
                }
            }
        }
    }
}
