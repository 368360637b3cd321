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

/// Whether kernels on `T` use packs. Elements of 4 and 8 bytes only: with 1- and 2-byte
/// elements (8 or 16 lanes, each widened to f32 for the narrow floats) the unrolled lanes do
/// not fit in registers and ptxas would put them in local memory; those types keep the
/// element path, whose accesses still coalesce across a warp.
#[inline(always)]
pub const fn packed<T>() -> bool {
    core::mem::size_of::<T>() >= 4
}

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

/// `true` when `T` uses packs ([`packed`]), every rank's window base is 16-byte aligned, and
/// so are `offsets` and this rank's `local` address (so every buffer involved is).
///
/// # Safety
/// `ctx` is host-built.
#[inline(always)]
pub unsafe fn aligned<T>(ctx: &SymmContext, offsets: &[u64], local: u64) -> bool {
    if !packed::<T>() || !local.is_multiple_of(16) || offsets.iter().any(|o| !o.is_multiple_of(16))
    {
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
    const MAX_LANES: usize = 4;
    let mut acc = [<T::Acc as Accumulator>::ZERO; MAX_LANES];
    for peer in 0..ctx.world_size {
        // SAFETY: forwarded contract.
        let pack = unsafe { load(ctx, peer, offset, index) };
        for (e, a) in acc.iter_mut().enumerate().take(lanes::<T>() as usize) {
            let value = lane::<T>(&pack, e as u64).widen();
            *a = if peer == 0 {
                value
            } else {
                O::combine(*a, value)
            };
        }
    }
    let mut out = Pack::default();
    for (e, a) in acc.iter().enumerate().take(lanes::<T>() as usize) {
        set_lane(&mut out, e as u64, T::narrow(O::finish(*a, ctx.world_size)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::numeric::element::{Bf16, F8E4M3};

    #[test]
    fn only_wide_elements_are_packed() {
        assert!(packed::<f32>() && packed::<u64>());
        assert!(!packed::<Bf16>() && !packed::<i8>());
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
