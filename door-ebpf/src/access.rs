//! The only `unsafe` of the eBPF crate: bounds-checked reads of the packet and the dereference
//! of pointers the kernel's map helpers return.
//!
//! The verifier rejects any packet access it cannot prove lies inside `[data, data_end)`; the
//! checks below are the ones it looks for, so a program that passes them cannot read out of bounds.
#![expect(
    unsafe_code,
    reason = "packet and map memory can only be reached through raw pointers in XDP"
)]

use core::ptr::NonNull;

use aya_ebpf::programs::XdpContext;

/// The largest header offset the parser ever asks for, in bytes. Bounding the offset gives the
/// verifier a finite range for `data + offset` (Ethernet 14 + two VLAN tags 8 + IPv6 40 + its
/// extension headers, or IPv4 up to 60).
pub(crate) const MAX_OFFSET: usize = 1024;

/// The packet of one XDP invocation: the bytes in `[start, end)`.
#[derive(Clone, Copy)]
pub(crate) struct Packet {
    start: usize,
    end: usize,
}

impl Packet {
    /// The packet `ctx` points at.
    #[inline(always)]
    pub(crate) fn new(ctx: &XdpContext) -> Self {
        Self {
            start: ctx.data(),
            end: ctx.data_end(),
        }
    }

    /// A copy of the `T` at `offset` bytes from the start of the packet, or `None` when the
    /// packet ends before `offset + size_of::<T>()` or `offset` exceeds [`MAX_OFFSET`].
    ///
    /// `T` must be a plain header type (`#[repr(C)]`, any bit pattern valid), as the
    /// `network-types` headers and byte arrays are.
    #[inline(always)]
    pub(crate) fn read<T: Copy>(&self, offset: usize) -> Option<T> {
        if offset > MAX_OFFSET {
            return None;
        }
        let at = self.start + offset;
        if at + size_of::<T>() > self.end {
            return None;
        }
        // SAFETY: `[at, at + size_of::<T>())` lies inside `[data, data_end)`, checked just above
        // (and `offset` is bounded, so the sum cannot wrap); the kernel keeps the packet alive and
        // readable for the whole invocation. Headers in a packet have no alignment guarantee,
        // hence `read_unaligned`. `T` is plain data, so any bytes are a valid `T`.
        Some(unsafe { core::ptr::read_unaligned(at as *const T) })
    }
}

/// A value inside a BPF map, as returned by a lookup helper (`get_ptr_mut`) during this
/// invocation. The kernel keeps it alive and aligned until the program returns. Other CPUs (and
/// the daemon's syscalls) may read and write it at the same time; the BPF target has no atomic
/// read-modify-write at the default CPU level, so fields are read and written with single
/// volatile 8-byte loads and stores (the kernel's `READ_ONCE`/`WRITE_ONCE`): a value is never
/// torn, but a concurrent read-modify-write can lose an update. Callers document what that allows.
#[derive(Clone, Copy)]
pub(crate) struct MapValue<T> {
    ptr: NonNull<T>,
}

impl<T> MapValue<T> {
    /// Wraps a lookup helper's result; `None` when the key was absent (null).
    #[inline(always)]
    pub(crate) fn from_lookup(ptr: Option<*mut T>) -> Option<Self> {
        NonNull::new(ptr?).map(|ptr| Self { ptr })
    }

    /// The `U` embedded at byte `offset` of this value (pass `core::mem::offset_of!(T, field)`),
    /// or `None` if it would not lie inside `T` or would be misaligned.
    #[inline(always)]
    pub(crate) fn project<U>(&self, offset: usize) -> Option<MapValue<U>> {
        if !offset.is_multiple_of(align_of::<U>()) || offset + size_of::<U>() > size_of::<T>() {
            return None;
        }
        NonNull::new(self.ptr.as_ptr().wrapping_byte_add(offset).cast::<U>())
            .map(|ptr| MapValue { ptr })
    }

    /// Pointer to the `u64` field at byte `offset` of the value (pass
    /// `core::mem::offset_of!(T, field)`), or `None` if `offset` does not name an aligned `u64`
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
            // SAFETY: `field` returned a pointer to an 8-aligned `u64` inside a live map value
            // (this type's invariant: non-null pointer from the kernel's lookup helper).
            Some(field) => unsafe { field.read_volatile() },
            None => 0,
        }
    }

    /// Writes the `u64` at byte `offset` (see [`MapValue::field`]); nothing if `offset` is invalid.
    #[inline(always)]
    pub(crate) fn store(&self, offset: usize, value: u64) {
        if let Some(field) = self.field(offset) {
            // SAFETY: as in `load`; the map value is writable by the program.
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
