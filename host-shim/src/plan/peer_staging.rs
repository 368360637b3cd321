//! Where the staged sends and receives of one launch lie in each rank's staging window
//! (`point_to_point`). Pure.
//!
//! A send or receive whose buffer is outside every window is staged **whole**: its bytes take
//! a region of the rank's staging window for the launch (a send's copied in before it, a
//! receive's copied out after it), and messages are never cut. Cutting would have to be alike
//! on both sides of a pair, and a launch cut into rounds can wait forever when the two ranks
//! group their calls differently (a rank's first round waiting for a receive its peer makes
//! only after a send that waits for this rank's second round), which NCCL programs do. So a
//! launch is one launch, as for calls in windows, and a rank whose staged messages do not fit
//! its staging window is refused (`SYMM_STAGING_BYTES`).

use super::staging::REGION_ALIGN;

/// The offsets in a staging window of `capacity` bytes of the staged ones of `messages` (their
/// bytes, `None` for a message in its window), in order: `Ok` with each staged message's
/// offset (aligned to [`REGION_ALIGN`]), or `Err` with the bytes they would need.
pub fn place_staged(messages: &[Option<u64>], capacity: u64) -> Result<Vec<Option<u64>>, u64> {
    let mut end = 0u64;
    let placed: Vec<Option<u64>> = messages
        .iter()
        .map(|m| {
            m.map(|bytes| {
                let at = end.div_ceil(REGION_ALIGN).saturating_mul(REGION_ALIGN);
                end = at.saturating_add(bytes);
                at
            })
        })
        .collect();
    if end > capacity { Err(end) } else { Ok(placed) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_messages_are_placed_aligned_in_order() {
        let placed = place_staged(&[Some(100), None, Some(0), Some(300), Some(1)], 4096);
        assert_eq!(
            placed,
            Ok(vec![Some(0), None, Some(256), Some(256), Some(768)])
        );
    }

    #[test]
    fn messages_past_the_window_are_refused_with_what_they_need() {
        assert_eq!(place_staged(&[Some(4000), Some(100)], 4096), Err(4196));
        assert_eq!(place_staged(&[Some(4096)], 4096), Ok(vec![Some(0)]));
        assert_eq!(place_staged(&[None, None], 0), Ok(vec![None, None]));
        assert_eq!(
            place_staged(&[Some(u64::MAX), Some(1)], 4096),
            Err(u64::MAX)
        );
    }
}
