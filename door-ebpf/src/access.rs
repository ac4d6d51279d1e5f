//! The only `unsafe` of the eBPF crate: bounds-checked reads of the packet, access to the values
//! the kernel's map lookup helpers return, and the clock helper.
//!
//! The verifier rejects any packet access it cannot prove lies inside `[data, data_end)`; the
//! checks below are the ones it looks for, so a program that passes them cannot read out of bounds.
//! Nothing here can be misused from safe code: packet reads only produce byte arrays, and map
//! values can only be obtained from the lookup helpers themselves.
#![expect(
    unsafe_code,
    reason = "packet and map memory can only be reached through raw pointers in XDP"
)]

use core::ptr::NonNull;

use aya_ebpf::{
    maps::{Array, LruHashMap, PerCpuArray},
    programs::XdpContext,
};

/// The largest header offset the parser ever asks for, in bytes. Bounding the offset gives the
/// verifier a finite range for `data + offset`; it also bounds the IPv6 extension-header walk
/// (Ethernet 14 + two VLAN tags 8 + IPv6 40 leaves 962 bytes of extension headers).
pub(crate) const MAX_OFFSET: usize = 1024;

/// The packet of one XDP invocation: the bytes in `[start, end)`, of which only the first `limit`
/// belong to the datagram being parsed (the rest is link-layer padding).
#[derive(Clone, Copy)]
pub(crate) struct Packet {
    start: usize,
    end: usize,
    limit: usize,
}

impl Packet {
    /// The packet `ctx` points at.
    #[inline(always)]
    pub(crate) fn new(ctx: &XdpContext) -> Self {
        Self {
            start: ctx.data(),
            end: ctx.data_end(),
            limit: usize::MAX,
        }
    }

    /// The same packet, with reads past `limit` bytes from its start refused: the end of the IP
    /// datagram (from its total or payload length), so that Ethernet padding is never parsed as
    /// a header.
    #[inline(always)]
    pub(crate) fn limited_to(self, limit: usize) -> Self {
        Self {
            limit: if limit < self.limit {
                limit
            } else {
                self.limit
            },
            ..self
        }
    }

    /// Whether the datagram (see [`Packet::limited_to`]) ends before `end` bytes from the start of
    /// the packet, whatever the frame's length.
    #[inline(always)]
    pub(crate) fn datagram_ends_before(&self, end: usize) -> bool {
        end > self.limit
    }

    /// The `N` bytes at `offset` from the start of the packet, or `None` when the packet (or the
    /// datagram, see [`Packet::limited_to`]) ends before `offset + N` or `offset` exceeds
    /// [`MAX_OFFSET`].
    #[inline(always)]
    pub(crate) fn read<const N: usize>(&self, offset: usize) -> Option<[u8; N]> {
        if offset > MAX_OFFSET || offset + N > self.limit {
            return None;
        }
        let at = self.start + offset;
        if at + N > self.end {
            return None;
        }
        // SAFETY: `[at, at + N)` lies inside `[data, data_end)`, checked just above (and
        // `offset` is bounded, so the sum cannot wrap); the kernel keeps the packet alive and
        // readable for the whole invocation. A byte array has alignment 1 and no invalid bit
        // patterns, so any bytes read are a valid value.
        Some(unsafe { core::ptr::read_unaligned(at as *const [u8; N]) })
    }
}

/// A value inside a BPF map, obtained from one of the lookup functions below during this
/// invocation. The kernel keeps it alive until the program returns, and map values start 8-byte
/// aligned (hash and array values are rounded up to 8 bytes by the kernel).
///
/// Other CPUs, and the daemon's syscalls, may read and write the same value at the same time. The
/// BPF target at the default CPU level has no atomic read-modify-write Rust can emit, so fields
/// are read and written with single volatile 8-byte loads and stores: the kernel memory model's
/// `READ_ONCE`/`WRITE_ONCE`, which never tear an aligned 8-byte value. Under the Rust memory
/// model these concurrent non-atomic accesses would be a data race; the argument here is the
/// kernel's. A concurrent read-modify-write can lose an update: callers document what that allows.
#[derive(Clone, Copy)]
pub(crate) struct MapValue<T> {
    ptr: NonNull<T>,
}

impl<T> MapValue<T> {
    /// `key`'s value in an LRU hash map, if present.
    #[inline(always)]
    pub(crate) fn in_lru<K>(map: &LruHashMap<K, T>, key: &K) -> Option<Self> {
        Self::from_lookup(map.get_ptr_mut(key))
    }

    /// Entry `index` of an array map, if in range.
    #[inline(always)]
    pub(crate) fn in_array(map: &Array<T>, index: u32) -> Option<Self> {
        Self::from_lookup(map.get_ptr_mut(index))
    }

    /// This CPU's entry `index` of a per-CPU array map, if in range.
    #[inline(always)]
    pub(crate) fn in_per_cpu_array(map: &PerCpuArray<T>, index: u32) -> Option<Self> {
        Self::from_lookup(map.get_ptr_mut(index))
    }

    /// Wraps a lookup helper's result; `None` when absent (null). Private: only pointers the
    /// kernel's helpers returned may become a `MapValue`.
    #[inline(always)]
    fn from_lookup(ptr: Option<*mut T>) -> Option<Self> {
        NonNull::new(ptr?).map(|ptr| Self { ptr })
    }

    /// The `U` embedded at byte `offset` of this value (pass `core::mem::offset_of!(T, field)`),
    /// or `None` if it would not lie inside `T` or would be misaligned for `U`.
    #[inline(always)]
    pub(crate) fn project<U>(&self, offset: usize) -> Option<MapValue<U>> {
        if !offset.is_multiple_of(align_of::<U>()) || offset + size_of::<U>() > size_of::<T>() {
            return None;
        }
        NonNull::new(self.ptr.as_ptr().wrapping_byte_add(offset).cast::<U>())
            .map(|ptr| MapValue { ptr })
    }

    /// Pointer to the `u64` field at byte `offset` of the value (pass
    /// `core::mem::offset_of!(T, field)`), or `None` if `offset` does not name an 8-aligned `u64`
    /// inside `T`.
    #[inline(always)]
    fn field(&self, offset: usize) -> Option<*mut u64> {
        if !offset.is_multiple_of(align_of::<u64>()) || offset + size_of::<u64>() > size_of::<T>() {
            return None;
        }
        Some(self.ptr.as_ptr().wrapping_byte_add(offset).cast::<u64>())
    }

    /// Reads the `u64` at byte `offset` (see [`MapValue::field`]); 0 if `offset` is invalid.
    #[inline(always)]
    pub(crate) fn load(&self, offset: usize) -> u64 {
        match self.field(offset) {
            // SAFETY: `field` returned a pointer to a `u64` inside a live map value (this type's
            // invariant), 8-aligned: the offset is a multiple of 8 and the value's base is
            // 8-aligned. Volatile: see the type's docs on concurrency.
            Some(field) => unsafe { field.read_volatile() },
            None => 0,
        }
    }

    /// Writes the `u64` at byte `offset` (see [`MapValue::field`]); nothing if `offset` is invalid.
    #[inline(always)]
    pub(crate) fn store(&self, offset: usize, value: u64) {
        if let Some(field) = self.field(offset) {
            // SAFETY: as in `load`; map values are writable by the program.
            unsafe { field.write_volatile(value) }
        }
    }
}

/// The kernel's `CLOCK_MONOTONIC` in nanoseconds (`bpf_ktime_get_ns`, Linux 4.1).
#[inline(always)]
pub(crate) fn now_ns() -> u64 {
    // SAFETY: `bpf_ktime_get_ns` takes no arguments, touches no memory and is allowed in XDP.
    unsafe { aya_ebpf::helpers::bpf_ktime_get_ns() }
}
