//! Where the rings of the staged sends of one launch lie in the rank's staging window
//! (`point_to_point`). Pure.
//!
//! A send whose buffer is outside every window goes through a ring in its rank's staging window
//! (`symm_device::sync::p2p`): [`RING_SLOTS`] pieces per channel, which the kernel fills from
//! the caller's buffer while the receiver drains them, so a message of any size fits a ring of
//! any size. The window is shared among the launch's staged sends: a send whose whole message
//! fits its share takes only that, and the others share the rest equally. A receive outside
//! every window needs no ring: the kernel copies into the caller's memory.

use symm_device::sync::p2p::{MAX_PIECE, PIECE_UNIT, RING_SLOTS, channel_part, channels_for};

/// A staged send's ring: its offset in the staging window and the bytes of one piece.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ring {
    /// Offset in the staging window (a multiple of [`PIECE_UNIT`]).
    pub offset: u64,
    /// Bytes of one piece (a multiple of [`PIECE_UNIT`], at most [`MAX_PIECE`]).
    pub piece: u64,
}

/// The piece that carries a message of `bytes` whole (each channel's part in one piece).
fn whole_piece(bytes: u64) -> u64 {
    let (lo, hi) = channel_part(bytes, 0);
    (hi - lo)
        .next_multiple_of(PIECE_UNIT)
        .clamp(PIECE_UNIT, MAX_PIECE)
}

/// Ring bytes per byte of piece for a message of `bytes`.
fn slots(bytes: u64) -> u64 {
    channels_for(bytes) as u64 * RING_SLOTS
}

/// The rings, in a staging window of `capacity` bytes, of the staged sends among `sends`
/// (each staged send's bytes, `None` for a task that needs no ring), in order: `Ok` with each
/// staged send's ring, or `Err` with the bytes the smallest rings would need (one
/// [`PIECE_UNIT`] piece per slot) when even they do not fit.
pub fn place_rings(sends: &[Option<u64>], capacity: u64) -> Result<Vec<Option<Ring>>, u64> {
    let minimum: u64 = sends
        .iter()
        .flatten()
        .map(|&bytes| slots(bytes) * PIECE_UNIT)
        .fold(0u64, u64::saturating_add);
    if minimum > capacity {
        return Err(minimum);
    }
    // Each ring gets its smallest size first; the rest of the window goes, water-filling, to
    // what each would add up to its whole message: a ring whose addition fits an equal share of
    // what is left takes it all, and once none does the rest share what is left equally.
    let wanted: Vec<u64> = sends
        .iter()
        .map(|bytes| bytes.map_or(0, |b| (whole_piece(b) - PIECE_UNIT) * slots(b)))
        .collect();
    let mut given: Vec<Option<u64>> = sends.iter().map(|_| None).collect();
    let mut left = capacity - minimum;
    loop {
        let open: Vec<usize> = (0..sends.len())
            .filter(|&i| sends[i].is_some() && given[i].is_none())
            .collect();
        if open.is_empty() {
            break;
        }
        let share = left / open.len() as u64;
        let fitting: Vec<usize> = open
            .iter()
            .copied()
            .filter(|&i| wanted[i] <= share)
            .collect();
        if fitting.is_empty() {
            for i in open {
                given[i] = Some(share);
            }
            break;
        }
        for i in fitting {
            given[i] = Some(wanted[i]);
            left -= wanted[i];
        }
    }
    let pieces: Vec<Option<u64>> = sends
        .iter()
        .zip(&given)
        .map(|(bytes, extra)| {
            let (bytes, extra) = (bytes.as_ref()?, extra.as_ref()?);
            let ring = slots(*bytes) * PIECE_UNIT + extra;
            Some((ring / slots(*bytes) / PIECE_UNIT * PIECE_UNIT).min(MAX_PIECE))
        })
        .collect();
    let mut end = 0u64;
    let rings: Vec<Option<Ring>> = sends
        .iter()
        .zip(pieces)
        .map(|(bytes, piece)| {
            let (bytes, piece) = (bytes.as_ref()?, piece?);
            let ring = Ring { offset: end, piece };
            end += piece * slots(*bytes);
            Some(ring)
        })
        .collect();
    debug_assert!(end <= capacity);
    Ok(rings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use symm_device::sync::p2p::ring_bytes;

    /// The rings lie in the window, in order, without overlap, each a valid piece.
    fn check(sends: &[Option<u64>], capacity: u64, rings: &[Option<Ring>]) {
        let mut end = 0;
        for (bytes, ring) in sends.iter().zip(rings) {
            assert_eq!(bytes.is_some(), ring.is_some(), "{sends:?}: {rings:?}");
            if let (Some(bytes), Some(ring)) = (bytes, ring) {
                assert!(ring.offset >= end && ring.offset % PIECE_UNIT == 0);
                assert!(ring.piece >= PIECE_UNIT && ring.piece % PIECE_UNIT == 0);
                assert!(ring.piece <= MAX_PIECE);
                end = ring.offset + ring_bytes(*bytes, ring.piece);
            }
        }
        assert!(end <= capacity, "{sends:?} in {capacity}: {rings:?}");
    }

    #[test]
    fn a_message_that_fits_takes_its_whole_size_and_no_more() {
        let sends = [Some(100), None, Some(1000)];
        let rings = place_rings(&sends, 1 << 20).unwrap();
        check(&sends, 1 << 20, &rings);
        assert_eq!(
            rings[0],
            Some(Ring {
                offset: 0,
                piece: 256
            })
        );
        assert_eq!(rings[1], None);
        assert_eq!(
            rings[2],
            Some(Ring {
                offset: 512,
                piece: 1024
            })
        );
    }

    #[test]
    fn large_messages_share_what_the_small_ones_leave() {
        let capacity = 64 * 1024;
        let sends = [Some(16 << 20), Some(300), Some(1 << 30)];
        let rings = place_rings(&sends, capacity).unwrap();
        check(&sends, capacity, &rings);
        // The small one takes 2 x 512; the two large ones 4 channels x 2 slots each of the
        // rest: (65536 - 1024) / 2 / 8 = 4032, down to 3840.
        assert_eq!(rings[1].unwrap().piece, 512);
        assert_eq!(rings[0].unwrap().piece, 3840);
        assert_eq!(rings[2].unwrap().piece, 3840);
        // A small send that would fit a share whole leaves the large ones their smallest rings.
        let sends = [Some(1 << 20), Some(1 << 20), Some(700)];
        let rings = place_rings(&sends, 4608).unwrap();
        check(&sends, 4608, &rings);
        assert_eq!(rings[0].unwrap().piece, 256);
    }

    #[test]
    fn one_message_takes_the_whole_window_in_large_pieces() {
        let rings = place_rings(&[Some(1 << 30)], 4 << 20).unwrap();
        assert_eq!(rings[0].unwrap().piece, 512 * 1024);
        let huge = place_rings(&[Some(1 << 40)], 1 << 40).unwrap();
        assert_eq!(huge[0].unwrap().piece, MAX_PIECE);
    }

    #[test]
    fn rings_past_the_window_are_refused_with_what_they_need() {
        // Two messages of 4 channels: 2 x 8 slots x 256 bytes.
        assert_eq!(
            place_rings(&[Some(1 << 20), Some(1 << 20)], 4000),
            Err(4096)
        );
        assert!(place_rings(&[Some(1 << 20), Some(1 << 20)], 4096).is_ok());
        assert_eq!(place_rings(&[None, None], 0), Ok(vec![None, None]));
    }

    #[test]
    fn many_random_batches_fit() {
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..2000 {
            let n = (next() % 12) as usize;
            let sends: Vec<Option<u64>> = (0..n)
                .map(|_| (next() % 3 != 0).then(|| 1 + next() % (1 << (next() % 30))))
                .collect();
            let capacity = 256 * (next() % 4096);
            match place_rings(&sends, capacity) {
                Ok(rings) => check(&sends, capacity, &rings),
                Err(needed) => assert!(needed > capacity),
            }
        }
    }
}
