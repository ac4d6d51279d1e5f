//! The only `unsafe` of the eBPF crate: bounds-checked reads and writes of the packet, access to
//! the values the kernel's map lookup helpers return, the clock helpers, and the SYN cookie path's
//! helpers (`bpf_skc_lookup_tcp`, `bpf_tcp_gen_syncookie`, `bpf_sk_release`,
//! `bpf_xdp_adjust_tail`, `bpf_fib_lookup`).
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

use core::mem::offset_of;

use aya_ebpf::{
    bindings::{bpf_fib_lookup as FibLookup, bpf_sock_tuple, xdp_md},
    helpers::{
        bpf_fib_lookup, bpf_sk_release, bpf_skc_lookup_tcp, bpf_tcp_gen_syncookie,
        bpf_xdp_adjust_tail,
    },
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
    ctx: *mut xdp_md,
    start: usize,
    end: usize,
    limit: usize,
}

impl Packet {
    /// The packet `ctx` points at.
    #[inline(always)]
    pub(crate) fn new(ctx: &XdpContext) -> Self {
        Self {
            ctx: ctx.ctx,
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

    /// Whether the frame holds the whole datagram (see [`Packet::limited_to`]): `false` for a
    /// datagram whose length field says it goes on past the frame's end, which the kernel drops.
    #[inline(always)]
    pub(crate) fn frame_holds_datagram(&self) -> bool {
        self.limit <= self.end - self.start
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

impl Packet {
    /// The address of the `N` bytes at `offset`, checked exactly as [`Packet::read`] checks.
    #[inline(always)]
    fn pointer<const N: usize>(&self, offset: usize) -> Option<usize> {
        if offset > MAX_OFFSET || offset + N > self.limit {
            return None;
        }
        let at = self.start + offset;
        if at + N > self.end {
            return None;
        }
        Some(at)
    }

    /// Writes `bytes` at `offset` from the start of the packet; `false`, with nothing written,
    /// where [`Packet::read`] of the same bytes would return `None`.
    #[inline(always)]
    pub(crate) fn write<const N: usize>(&self, offset: usize, bytes: [u8; N]) -> bool {
        let Some(at) = self.pointer::<N>(offset) else {
            return false;
        };
        // SAFETY: `[at, at + N)` lies inside `[data, data_end)` (checked by `pointer`); XDP
        // packet memory is writable by the program for the whole invocation and nothing else
        // accesses it meanwhile. Alignment 1: an unaligned write of a byte array.
        unsafe { core::ptr::write_unaligned(at as *mut [u8; N], bytes) };
        true
    }

    /// The frame's length in bytes (`data_end - data`), padding included.
    #[inline(always)]
    pub(crate) fn len(&self) -> usize {
        self.end - self.start
    }

    /// Cuts the frame to its first `len` bytes (`bpf_xdp_adjust_tail`, Linux 4.18); `false` when
    /// `len` is not shorter than the frame or the kernel refused. Consumes the packet: the helper
    /// invalidates every pointer into it, so nothing may read or write it afterwards.
    #[inline(always)]
    pub(crate) fn truncate(self, len: usize) -> bool {
        let cut = self.len().saturating_sub(len);
        let Ok(delta) = i32::try_from(cut) else {
            return false;
        };
        if delta == 0 {
            return false;
        }
        // SAFETY: `ctx` is this invocation's context (from `Packet::new`); the helper only moves
        // `data_end`. `self` is consumed, so no pointer derived from it is used afterwards.
        unsafe { bpf_xdp_adjust_tail(self.ctx, -delta) == 0 }
    }

    /// Asks the kernel for a SYN cookie for the SYN whose IP and TCP headers were copied into
    /// `scratch` (see [`CookieScratch`], with its `tuple` filled in), on behalf of the listening
    /// socket the tuple reaches in the network namespace of the interface the packet arrived on:
    /// `bpf_skc_lookup_tcp` (Linux 5.2, "bpf: add skc_lookup_tcp helper") and
    /// `bpf_tcp_gen_syncookie` (Linux 5.4, "bpf: add bpf_tcp_gen_syncookie helper"). Returns the
    /// cookie (the SYN-ACK's sequence number) and the MSS it encodes, in bytes. No state is kept: the reference to the socket is released before returning.
    #[inline(always)]
    pub(crate) fn syn_cookie(
        &self,
        scratch: &MapValue<CookieScratch>,
        v6: bool,
    ) -> Result<(u32, u16), CookieError> {
        let base = scratch.ptr.as_ptr() as usize;
        let tuple = base + offset_of!(CookieScratch, tuple);
        let ip = base + offset_of!(CookieScratch, ip);
        let tcp = base + offset_of!(CookieScratch, tcp);
        // `struct bpf_sock_tuple`'s IPv4 member is 12 bytes, its IPv6 member 36.
        let (tuple_len, ip_len) = if v6 { (36, 40) } else { (12, 20) };
        // SAFETY: `ctx` is this invocation's context. `tuple` points at `tuple_len` (12 or 36)
        // initialised bytes inside the scratch map value (40 bytes at that offset), laid out as
        // `struct bpf_sock_tuple`. BPF_F_CURRENT_NETNS (-1 as u64): the namespace of the device
        // the packet arrived on. The helper returns a referenced socket or null.
        let sk = unsafe {
            bpf_skc_lookup_tcp(
                self.ctx.cast(),
                tuple as *mut bpf_sock_tuple,
                tuple_len,
                u64::MAX,
                0,
            )
        };
        if sk.is_null() {
            return Err(CookieError::NoListener);
        }
        let sk = sk.cast::<core::ffi::c_void>();
        // The helper checks that `th_len` is the header's data offset × 4 (byte 12, high nibble).
        // Read and checked here, next to the call, so that the bound the check proves is on the
        // register the call is passed: Linux 6.1's verifier does not carry it to a copy spilled
        // to the stack before the check and reloaded after the lookup, and refuses a length that
        // may be 0. The parser refused a data offset under 5 already: this path is never taken.
        let doff = u32::from(
            scratch
                .load_u32(offset_of!(CookieScratch, tcp) + 12)
                .to_ne_bytes()[0]
                >> 4,
        );
        if doff < 5 {
            // SAFETY: `sk` is the non-null reference `bpf_skc_lookup_tcp` returned, released
            // once on this path, which returns at once.
            unsafe { bpf_sk_release(sk) };
            return Err(CookieError::Declined);
        }
        let tcp_len = doff * 4;
        // SAFETY: `sk` is the live socket reference returned above. `ip` points at `ip_len` (20
        // or 40) bytes and `tcp` at `tcp_len` (20 to 60) bytes inside the scratch map value (40
        // and 64 bytes there); the helper only reads them.
        let result =
            unsafe { bpf_tcp_gen_syncookie(sk, ip as *mut _, ip_len, tcp as *mut _, tcp_len) };
        // SAFETY: `sk` is the non-null reference `bpf_skc_lookup_tcp` returned, released exactly
        // once, on every path.
        unsafe { bpf_sk_release(sk) };
        if result < 0 {
            return Err(CookieError::Declined);
        }
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "the helper returns the cookie in the low 32 bits and the MSS in the next 16"
        )]
        Ok((result as u32, (result >> 32) as u16))
    }
}

impl Packet {
    /// Whether the kernel would deliver the SYN whose IP and TCP headers were copied into
    /// `scratch` to this host rather than forward it: `bpf_fib_lookup` (Linux 4.18, "bpf: Provide
    /// helper to do forwarding lookups in kernel FIB table") from the interface the packet came
    /// in on answers `BPF_FIB_LKUP_RET_NOT_FWDED` for a local destination (and for one without a
    /// route), or `BPF_FIB_LKUP_RET_FWD_DISABLED` when the interface does not forward at all,
    /// before looking. Any other answer is a route elsewhere (a forwarding host: a Kubernetes
    /// node, a router) or one the kernel refuses: not this host's SYN to answer.
    #[inline(always)]
    pub(crate) fn delivered_here(&self, scratch: &MapValue<CookieScratch>, v6: bool) -> bool {
        const AF_INET: u8 = 2;
        const AF_INET6: u8 = 10;
        const IPPROTO_TCP: u8 = 6;
        const NOT_FWDED: i64 = 4;
        const FWD_DISABLED: i64 = 5;
        let fib = offset_of!(CookieScratch, fib);
        let ip = offset_of!(CookieScratch, ip);
        let ports = scratch
            .load_u32(offset_of!(CookieScratch, tcp))
            .to_ne_bytes();
        // SAFETY: `ctx` is this invocation's context, an `xdp_md` the kernel keeps readable for
        // the whole invocation; the verifier allows reading its fields.
        let ifindex = unsafe { (*self.ctx).ingress_ifindex };
        let (family, tot_len, src, dst, words) = if v6 {
            (AF_INET6, 40 + 20, ip + 8, ip + 24, 4)
        } else {
            (AF_INET, 20 + 20, ip + 12, ip + 16, 1)
        };
        let [t0, t1] = u16::to_ne_bytes(tot_len);
        scratch.store_u32(
            fib,
            u32::from_ne_bytes([family, IPPROTO_TCP, ports[0], ports[1]]),
        );
        scratch.store_u32(fib + 4, u32::from_ne_bytes([ports[2], ports[3], t0, t1]));
        scratch.store_u32(fib + 8, ifindex);
        for i in 0..13 {
            scratch.store_u32(fib + 12 + 4 * i, 0);
        }
        for i in 0..4 {
            if i < words {
                scratch.store_u32(fib + 16 + 4 * i, scratch.load_u32(src + 4 * i));
                scratch.store_u32(fib + 32 + 4 * i, scratch.load_u32(dst + 4 * i));
            }
        }
        let params = scratch.ptr.as_ptr() as usize + fib;
        // SAFETY: `ctx` is this invocation's context; `params` points at the 64-byte
        // `struct bpf_fib_lookup` inside the scratch map value, filled in above; the helper reads
        // it and writes its results there.
        let ret =
            unsafe { bpf_fib_lookup(self.ctx.cast(), params as *mut FibLookup, FIB_LOOKUP_LEN, 0) };
        ret == NOT_FWDED || ret == FWD_DISABLED
    }
}

/// Why [`Packet::syn_cookie`] has no cookie.
#[derive(Clone, Copy)]
pub(crate) enum CookieError {
    /// No listening socket for the SYN's destination address and port.
    NoListener,
    /// The kernel declined (`-ENOENT`: no SYN flood pressure on the listener, or SYN cookies
    /// disabled, or its accept queue full; `-EINVAL`: a header it refuses).
    Declined,
}

/// Per-CPU scratch space of the SYN cookie path, a map value rather than the 512-byte BPF stack:
/// the lookup tuple and copies of the SYN's IP and TCP headers, as the helpers read them.
/// 4-byte words holding the bytes in packet (network) order.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct CookieScratch {
    /// `struct bpf_sock_tuple`: IPv4 `saddr`, `daddr` (4 bytes each), `sport`, `dport` (12
    /// bytes), or IPv6 `saddr`, `daddr` (16 bytes each), `sport`, `dport` (36 bytes).
    pub(crate) tuple: [u32; 10],
    /// The SYN's IP header: IPv4 without options (20 bytes) or IPv6 (40 bytes).
    pub(crate) ip: [u32; 10],
    /// The SYN's TCP header with its options (20 to 60 bytes).
    pub(crate) tcp: [u32; 16],
    /// `struct bpf_fib_lookup` of [`Packet::delivered_here`] (64 bytes).
    pub(crate) fib: [u32; 16],
}

const _: () = assert!(size_of::<CookieScratch>() == 208);
/// `struct bpf_fib_lookup`'s size, as [`Packet::delivered_here`] passes it to the helper.
const FIB_LOOKUP_LEN: i32 = 64;
const _: () = assert!(size_of::<FibLookup>() == FIB_LOOKUP_LEN as usize);

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

    /// Reads the `u32` at byte `offset`, a multiple of 4 inside `T`; 0 if `offset` is invalid.
    /// For per-CPU scratch values only (no other CPU accesses them).
    #[inline(always)]
    pub(crate) fn load_u32(&self, offset: usize) -> u32 {
        match self.field32(offset) {
            // SAFETY: `field32` returned a pointer to a 4-aligned `u32` inside a live map value
            // (this type's invariant; map values are 8-aligned).
            Some(field) => unsafe { field.read_volatile() },
            None => 0,
        }
    }

    /// Writes the `u32` at byte `offset` (see [`MapValue::load_u32`]); nothing if invalid.
    #[inline(always)]
    pub(crate) fn store_u32(&self, offset: usize, value: u32) {
        if let Some(field) = self.field32(offset) {
            // SAFETY: as in `load_u32`; map values are writable by the program.
            unsafe { field.write_volatile(value) }
        }
    }

    /// Pointer to the `u32` at byte `offset`, or `None` unless it is 4-aligned inside `T`.
    #[inline(always)]
    fn field32(&self, offset: usize) -> Option<*mut u32> {
        if !offset.is_multiple_of(align_of::<u32>()) || offset + size_of::<u32>() > size_of::<T>() {
            return None;
        }
        Some(self.ptr.as_ptr().wrapping_byte_add(offset).cast::<u32>())
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

/// The kernel's `CLOCK_MONOTONIC_COARSE` in nanoseconds (`bpf_ktime_get_coarse_ns`, Linux 5.11):
/// `CLOCK_MONOTONIC` as of the last timer tick (1 to 4 ms old), read without touching the clock
/// source; the daemon reads the same clock (docs/decisions.md, "XDP: the coarse clock"). A helper
/// call: the program asks it about once per tick per CPU ([`crate::clock::now_ns`]).
#[inline(always)]
pub(crate) fn coarse_ns() -> u64 {
    // SAFETY: `bpf_ktime_get_coarse_ns` takes no arguments, touches no memory and is allowed in
    // XDP for a program loaded with CAP_BPF, as door's is.
    unsafe { aya_ebpf::helpers::bpf_ktime_get_coarse_ns() }
}

/// The kernel's `jiffies`: timer ticks since boot, plus an offset (`bpf_jiffies64`, Linux 5.5).
/// Not a helper call: the verifier replaces it with one load of `jiffies` on 64-bit JITs
/// (kernel/bpf/verifier.c, "Implement bpf_jiffies64 inline").
#[inline(always)]
pub(crate) fn jiffies() -> u64 {
    // SAFETY: `bpf_jiffies64` takes no arguments, touches no memory and is allowed in XDP for a
    // program loaded with CAP_BPF, as door's is.
    unsafe { aya_ebpf::helpers::bpf_jiffies64() }
}

/// The number of the CPU running the program (`bpf_get_smp_processor_id`, Linux 4.1).
#[inline(always)]
pub(crate) fn cpu() -> u32 {
    // SAFETY: `bpf_get_smp_processor_id` takes no arguments and touches no memory.
    unsafe { aya_ebpf::helpers::bpf_get_smp_processor_id() }
}
