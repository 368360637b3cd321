//! 16-byte vector access for the reduction kernels: a [`Pack`] holds `16 / size_of::<T>()`
//! elements, loaded and stored with one 16-byte access when every buffer involved is 16-byte
//! aligned; lanes are taken apart with shifts (no local arrays on the GPU).

use crate::context::SymmContext;
use crate::numeric::element::Element;
use crate::numeric::ops::{Accumulator, ReduceOp};

/// 16 bytes, loaded and stored as one vector.
#[repr(C, align(16))]
#[derive(Clone, Copy, Default)]
pub struct Pack(pub [u32; 4]);

/// Elements of `T` per pack.
#[inline(always)]
pub const fn lanes<T>() -> u64 {
    16 / core::mem::size_of::<T>() as u64
}

/// Lane `e` of `pack`.
#[inline(always)]
pub fn lane<T: Element>(pack: &Pack, e: u64) -> T {
    let size = core::mem::size_of::<T>() as u64;
    let bit = e * size * 8;
    let word = (bit / 32) as usize;
    let bits = if size == 8 {
        pack.0[word] as u64 | (pack.0[word + 1] as u64) << 32
    } else {
        (pack.0[word] >> (bit % 32)) as u64
    };
    T::from_bits(bits)
}

/// Set lane `e` of `pack` to `value`.
#[inline(always)]
pub fn set_lane<T: Element>(pack: &mut Pack, e: u64, value: T) {
    let size = core::mem::size_of::<T>() as u64;
    let bits = value.to_bits();
    let bit = e * size * 8;
    let word = (bit / 32) as usize;
    if size == 8 {
        pack.0[word] = bits as u32;
        pack.0[word + 1] = (bits >> 32) as u32;
    } else {
        let mask = if size == 4 {
            u32::MAX
        } else {
            ((1u32 << (size * 8)) - 1) << (bit % 32)
        };
        pack.0[word] = (pack.0[word] & !mask) | ((bits as u32) << (bit % 32) & mask);
    }
}

/// `true` when every rank's window base is 16-byte aligned, and so are `offsets` and this
/// rank's `local` address (so every buffer involved is, for any element type).
///
/// # Safety
/// `ctx` is host-built.
#[inline(always)]
pub unsafe fn aligned(ctx: &SymmContext, offsets: &[u64], local: u64) -> bool {
    if !local.is_multiple_of(16) || offsets.iter().any(|o| !o.is_multiple_of(16)) {
        return false;
    }
    // SAFETY: peer < world_size.
    (0..ctx.world_size).all(|peer| unsafe { ctx.peer_base(peer) }.is_multiple_of(16))
}

/// Pack `index` of the buffer at address `buffer` (a rank's window base plus an offset).
///
/// # Safety
/// The pack lies inside that rank's window and the buffer is 16-byte aligned.
#[inline(always)]
pub unsafe fn load_at(buffer: u64, index: u64) -> Pack {
    // SAFETY: forwarded contract (`Pack` is 16 bytes, 16-aligned).
    unsafe { (buffer as *const Pack).add(index as usize).read() }
}

/// Call `$body` with each lane index `0..16` as a constant, unrolled by hand: LLVM's unroller
/// gives up on 16 lanes of the wider conversions, and a rolled loop would index the
/// accumulators dynamically, which puts them in local memory on the GPU.
macro_rules! for_each_lane {
    ($lane:ident => $body:block) => {
        for_each_lane!(@ $lane $body; 0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    };
    (@ $lane:ident $body:block; $($e:literal)*) => {
        $({
            let $lane: usize = $e;
            $body
        })*
    };
}

/// The most ranks whose packs [`reduce_pack`] loads back to back before combining them (the
/// `unroll!` lists in [`combine_group`] have this many indices).
const MOST_PEERS_IN_FLIGHT: usize = 8;

/// Ranks in flight per pack for the bandwidth kernels (two-shot, reduce-scatter): up to 8
/// ranks, every load of a pack at once (32 registers of data, 16 of addresses; the kernels
/// stay under 110 registers on sm_90).
pub const PEERS_IN_FLIGHT_FOR_BANDWIDTH: usize = 8;

/// Ranks in flight per pack for one-shot, whose kernel keeps more state live (barrier, rounds):
/// 8 took it past 128 registers, the most a 512-thread block may use.
pub const PEERS_IN_FLIGHT_FOR_LATENCY: usize = 4;

/// Load the packs `index` of ranks `first_peer .. first_peer + peers` back to back (all their
/// loads in flight together), then combine them into `acc` in rank order, lane by lane; rank
/// 0's values start the accumulators. The same bits as one rank at a time: only the loads
/// move. `MOST` (at most [`MOST_PEERS_IN_FLIGHT`]) bounds `peers` at compile time: the code
/// has `MOST` guarded loads and combines, one copy for every group size. `START`: the group
/// starts at rank 0, whose values start the accumulators.
///
/// # Safety
/// As for [`load_at`], for the buffers at `offset` of ranks `first_peer .. first_peer + peers`
/// (all `< world_size`);
/// `1 <= peers <= MOST`.
#[inline(always)]
unsafe fn combine_group<T: Element, O: ReduceOp, const MOST: usize, const START: bool>(
    ctx: &SymmContext,
    offset: u64,
    index: u64,
    first_peer: u32,
    peers: u32,
    acc: &mut [T::Acc; 16],
) {
    const { assert!(MOST >= 1 && MOST <= MOST_PEERS_IN_FLIGHT) };
    let lanes = lanes::<T>() as usize;
    // The lists below have MOST_PEERS_IN_FLIGHT indices (a shorter one would skip ranks).
    const _: () = assert!(MOST_PEERS_IN_FLIGHT == 8);
    // Three passes, so that nothing between a group's loads waits for one of them: the
    // ranks' addresses (the context's table), then every pack, then the combining.
    let mut at = [0u64; MOST_PEERS_IN_FLIGHT];
    unroll!(k in [0 1 2 3 4 5 6 7] => {
        if k < MOST && (k as u32) < peers {
            // SAFETY: forwarded contract; first_peer + k < world_size.
            at[k] = unsafe { ctx.peer_base(first_peer + k as u32) } + offset;
        }
    });
    // Not zeroed: a guarded slot is read only under the same guard that wrote it, and zeroing
    // them ties every load's registers to a move ahead of it.
    let mut packs = [core::mem::MaybeUninit::<Pack>::uninit(); MOST_PEERS_IN_FLIGHT];
    unroll!(k in [0 1 2 3 4 5 6 7] => {
        if k < MOST && (k as u32) < peers {
            // SAFETY: forwarded contract (the pack lies in rank first_peer + k's window,
            // 16-byte aligned).
            packs[k].write(unsafe { load_at(at[k], index) });
        }
    });
    unroll!(k in [0 1 2 3 4 5 6 7] => {
        if k < MOST && (k as u32) < peers {
            // SAFETY: written above under the same guard.
            let pack = unsafe { packs[k].assume_init() };
            for_each_lane!(e => {
                if e < lanes {
                    let value = lane::<T>(&pack, e as u64).widen();
                    acc[e] = if START && k == 0 { value } else { O::combine(acc[e], value) };
                }
            });
        }
    });
}

/// Reduce pack `index` of the buffers at `offset` over all ranks, in rank order, lane by lane.
///
/// The ranks' packs are loaded in groups of up to `MOST` ([`PEERS_IN_FLIGHT_FOR_BANDWIDTH`] or
/// [`PEERS_IN_FLIGHT_FOR_LATENCY`]) whose loads are in flight together, then combined in rank
/// order (the same bits as one at a time): one rank at a time, a thread waits one remote-load
/// latency per rank, and with one 16-byte load in flight per thread a kernel reaches a fraction
/// of the memory bandwidth. 1-byte elements (16 lanes) take one rank at a time: unrolled groups
/// of 16-lane float8 reductions push the kernels' per-task bodies out of line (a stack frame).
///
/// # Safety
/// As for [`load_at`], for the buffer at `offset` of every rank.
#[inline(always)]
pub unsafe fn reduce_pack<T: Element, O: ReduceOp, const MOST: usize>(
    ctx: &SymmContext,
    offset: u64,
    index: u64,
) -> Pack {
    let lanes = lanes::<T>() as usize;
    let world = ctx.world_size;
    let mut acc = [<T::Acc as Accumulator>::ZERO; 16];
    // The first group holds rank 0, whose values start the accumulators: a group of its own
    // (`START`), so that starting them is no select that ties rank 0's load to the others'.
    let mut peer = if lanes <= 8 {
        let group = Ord::min(world, MOST as u32);
        // SAFETY: forwarded contract; group <= world_size, 1 <= group <= MOST.
        unsafe { combine_group::<T, O, MOST, true>(ctx, offset, index, 0, group, &mut acc) };
        group
    } else {
        // SAFETY: forwarded contract; rank 0 < world_size.
        unsafe { combine_group::<T, O, 1, true>(ctx, offset, index, 0, 1, &mut acc) };
        1
    };
    // More ranks than one group (more than 8, or more than 4 for one-shot): groups of up to
    // 4, or one rank at a time for 1-byte elements.
    while peer < world {
        if lanes <= 8 {
            let group = Ord::min(world - peer, 4);
            // SAFETY: forwarded contract; peer + group <= world_size, 1 <= group <= 4.
            unsafe { combine_group::<T, O, 4, false>(ctx, offset, index, peer, group, &mut acc) };
            peer += group;
        } else {
            // SAFETY: forwarded contract; peer < world_size.
            unsafe { combine_group::<T, O, 1, false>(ctx, offset, index, peer, 1, &mut acc) };
            peer += 1;
        }
    }
    let mut out = Pack::default();
    for_each_lane!(e => {
        if e < lanes {
            set_lane(&mut out, e as u64, T::narrow(O::finish(acc[e], ctx.world_size)));
        }
    });
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numeric::element::{Bf16, F8E4M3};

    #[test]
    fn every_width_fills_sixteen_bytes() {
        assert_eq!(lanes::<i8>(), 16);
        assert_eq!(lanes::<Bf16>(), 8);
        assert_eq!(lanes::<f32>(), 4);
        assert_eq!(lanes::<u64>(), 2);
    }

    #[test]
    fn lanes_round_trip_for_every_width() {
        let mut p = Pack::default();
        for e in 0..16 {
            set_lane::<i8>(&mut p, e, e as i8 - 8);
        }
        for e in 0..16 {
            assert_eq!(lane::<i8>(&p, e), e as i8 - 8);
        }
        let mut p = Pack::default();
        for e in 0..8 {
            set_lane(&mut p, e, Bf16::from_f32(e as f32));
        }
        assert_eq!(lane::<Bf16>(&p, 5).to_f32(), 5.0);
        let mut p = Pack::default();
        set_lane(&mut p, 1, -2.5f64);
        assert_eq!(lane::<f64>(&p, 1), -2.5);
        set_lane(&mut p, 3, 7u32);
        assert_eq!(lane::<u32>(&p, 3), 7);
        let mut p = Pack::default();
        set_lane(&mut p, 15, F8E4M3::from_f32(448.0));
        assert_eq!(lane::<F8E4M3>(&p, 15).to_f32(), 448.0);
        assert_eq!(lane::<F8E4M3>(&p, 14).to_f32(), 0.0);
    }
}
