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

/// Pack `index` of rank `peer`'s buffer at `offset`.
///
/// # Safety
/// The pack lies inside that rank's window and the buffers are 16-byte aligned.
#[inline(always)]
pub unsafe fn load(ctx: &SymmContext, peer: u32, offset: u64, index: u64) -> Pack {
    // SAFETY: forwarded contract (`Pack` is 16 bytes, 16-aligned).
    unsafe {
        let base = (ctx.peer_base(peer) + offset) as *const Pack;
        base.add(index as usize).read()
    }
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

/// Peers whose packs [`reduce_pack`] loads before combining them (the `unroll!` lists there
/// have this many indices).
const PEERS_IN_FLIGHT: u32 = 4;

/// Reduce pack `index` of the buffers at `offset` over all ranks, in rank order, lane by lane.
///
/// # Safety
/// As for [`load`], for every rank.
#[inline(always)]
pub unsafe fn reduce_pack<T: Element, O: ReduceOp>(
    ctx: &SymmContext,
    offset: u64,
    index: u64,
) -> Pack {
    const MAX_LANES: usize = 16;
    let lanes = lanes::<T>() as usize;
    // SAFETY: forwarded contract; rank 0 < world_size.
    let first = unsafe { load(ctx, 0, offset, index) };
    let mut acc = [<T::Acc as Accumulator>::ZERO; MAX_LANES];
    for_each_lane!(e => {
        if e < lanes {
            acc[e] = lane::<T>(&first, e as u64).widen();
        }
    });
    // Peers in groups of PEERS_IN_FLIGHT: their loads are issued back to back, then combined
    // in rank order (the same bits as one at a time), so that several remote loads are in
    // flight where the combining of a wide conversion would otherwise wait for each.
    // 1-byte elements (16 lanes) take one peer at a time: four unrolled 16-lane float8
    // reductions push the kernels' per-task bodies out of line (a stack frame).
    let mut peer = 1;
    while lanes <= 8 && peer + PEERS_IN_FLIGHT <= ctx.world_size {
        // The lists below have PEERS_IN_FLIGHT indices (a shorter one would skip peers).
        const _: () = assert!(PEERS_IN_FLIGHT == 4);
        let mut packs = [Pack::default(); PEERS_IN_FLIGHT as usize];
        unroll!(k in [0 1 2 3] => {
            // SAFETY: forwarded contract; peer + k < world_size.
            packs[k] = unsafe { load(ctx, peer + k as u32, offset, index) };
        });
        unroll!(k in [0 1 2 3] => {
            for_each_lane!(e => {
                if e < lanes {
                    acc[e] = O::combine(acc[e], lane::<T>(&packs[k], e as u64).widen());
                }
            });
        });
        peer += PEERS_IN_FLIGHT;
    }
    while peer < ctx.world_size {
        // SAFETY: forwarded contract.
        let pack = unsafe { load(ctx, peer, offset, index) };
        for_each_lane!(e => {
            if e < lanes {
                acc[e] = O::combine(acc[e], lane::<T>(&pack, e as u64).widen());
            }
        });
        peer += 1;
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
