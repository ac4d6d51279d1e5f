//! The lists filter: a bitmap in front of the lists trie ([`crate::MAP_EXEMPT`]) that tells the
//! program, for most sources, that the trie has nothing to say about them, so that it skips the
//! trie's walk (about 15 ns a SYN on the benchmark's Intel Xeon, where a SYN counted without
//! lists takes 24–25 ns in all).
//!
//! The filter is a pair of 65,536-bit bitmaps, one for IPv4 sources and one for IPv6 sources, in
//! the array [`crate::MAP_LIST_FILTER`] of [`LIST_FILTER_WORDS`] `u64` words. A source's *lead*
//! is an IPv4 address whole, or an IPv6 address's first 64 bits (its /64); its bit is a
//! multiplicative hash (Knuth, *The Art of Computer Programming* vol. 3, §6.4) of its lead under
//! the family's *lead mask*, the first `n` bits, where `n` is the shortest prefix length on the
//! family's side of the lists, at most 64 ([`lead_mask`]). Every network on the lists that can
//! decide a source of the family (exempt or denied) sets the bit of its own lead, so every source
//! it covers, which shares those first `n` bits, finds its bit set: the filter has false
//! positives (then the trie is walked, as without a filter) and no false negatives
//! ([`filter_bit`]). The daemon fills it from the trie's entries and then sets
//! [`crate::shield::CONFIG_LIST_FILTER`] with the two masks; while the flag is clear the program
//! walks the trie for every source, as before the filter.

/// Bits of a family's bitmap, as a power of two: 65,536 bits, 8 KiB.
pub const FILTER_BITS_LOG2: u32 = 16;

/// `u64` words of one family's bitmap (1,024).
pub const FAMILY_WORDS: u32 = 1 << (FILTER_BITS_LOG2 - 6);

/// Words of [`crate::MAP_LIST_FILTER`]: the IPv4 bitmap (words `0..FAMILY_WORDS`), then the IPv6
/// one.
pub const LIST_FILTER_WORDS: u32 = 2 * FAMILY_WORDS;

/// First word of the IPv6 bitmap in [`crate::MAP_LIST_FILTER`].
pub const V6_WORDS_START: u32 = FAMILY_WORDS;

/// The lead of an IPv4 source: its address in the top 32 bits.
pub const fn lead_v4(addr: [u8; 4]) -> u64 {
    (u32::from_be_bytes(addr) as u64) << 32
}

/// The lead of an IPv6 source: its first 64 bits (its /64).
pub const fn lead_v6(first: [u8; 8]) -> u64 {
    u64::from_be_bytes(first)
}

/// The first `len` bits of a lead, as a mask (`len` above 64 counts as 64: an IPv6 network longer
/// than /64 keeps all of its lead; an IPv4 `/n` is `n` bits of [`lead_v4`]).
pub const fn lead_mask(len: u32) -> u64 {
    match len {
        0 => 0,
        1..=63 => u64::MAX << (64 - len),
        _ => u64::MAX,
    }
}

/// Where the bit of `lead` under `mask` lies in one family's bitmap: `(word, bit)`, the word
/// below [`FAMILY_WORDS`] (add [`V6_WORDS_START`] for an IPv6 source) and the bit below 64.
/// Sources that agree on the masked bits share a bit; so may others (the hash folds 64 bits
/// into 16).
pub const fn filter_bit(lead: u64, mask: u64) -> (u32, u32) {
    let h = (lead & mask).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - FILTER_BITS_LOG2);
    // The shift leaves FILTER_BITS_LOG2 bits.
    let h = h as u32;
    (h >> 6, h & 63)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mask_keeps_the_first_bits_of_a_lead() {
        assert_eq!(lead_mask(0), 0);
        assert_eq!(lead_mask(8), 0xff00_0000_0000_0000);
        assert_eq!(lead_mask(32 + 24), 0xffff_ffff_ffff_ff00);
        assert_eq!(lead_mask(64), u64::MAX);
        assert_eq!(lead_mask(128), u64::MAX);
        assert_eq!(lead_v4([192, 0, 2, 1]), 0xc000_0201_0000_0000);
        assert_eq!(
            lead_v6([0x20, 0x01, 0x0d, 0xb8, 0, 1, 0, 2]),
            0x2001_0db8_0001_0002
        );
    }

    #[test]
    fn leads_that_agree_under_the_mask_share_a_bit() {
        let mask = lead_mask(24);
        assert_eq!(
            filter_bit(lead_v4([192, 0, 2, 1]), mask),
            filter_bit(lead_v4([192, 0, 2, 254]), mask),
            "192.0.2.1 and 192.0.2.254 under /24"
        );
        let (word, bit) = filter_bit(lead_v4([203, 0, 113, 128]), lead_mask(32));
        assert!(word < FAMILY_WORDS && bit < 64);
        // A mask of nothing puts every lead on one bit.
        assert_eq!(filter_bit(1, 0), filter_bit(u64::MAX, 0));
    }

    #[test]
    fn distinct_leads_spread_over_the_bitmap() {
        // 4,096 IPv4 /24s, or IPv6 /48s of one /36, take almost as many distinct bits (about
        // 3,970 for a random function; a hash that folded them together would send the sources
        // of all of them to the trie).
        let spread = |leads: &mut dyn Iterator<Item = u64>, mask: u64| {
            let mut seen = [0u64; FAMILY_WORDS as usize];
            let mut distinct = 0;
            for lead in leads {
                let (word, bit) = filter_bit(lead, mask);
                if let Some(w) = seen.get_mut(word as usize) {
                    if *w & (1 << bit) == 0 {
                        distinct += 1;
                    }
                    *w |= 1 << bit;
                }
            }
            distinct
        };
        let v4 = spread(
            &mut (0..4_096u32).map(|i| lead_v4((0xc600_0000 | (i << 8)).to_be_bytes())),
            lead_mask(24),
        );
        assert!(v4 > 3_900, "IPv4: {v4} distinct bits of 4,096");
        let v6 = spread(
            &mut (0..4_096u64).map(|i| 0x2001_0db8_0000_0000 | (i << 16)),
            lead_mask(48),
        );
        assert!(v6 > 3_900, "IPv6: {v6} distinct bits of 4,096");
    }
}
