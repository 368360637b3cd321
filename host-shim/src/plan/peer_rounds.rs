//! The rounds of a launch of sends and receives (`point_to_point`): messages cut into pieces,
//! pieces ordered by one key every rank computes alike, and cut into launches that each fit
//! the ranks' staging windows and the kernel's task table. Pure.
//!
//! **Pieces.** On a communicator with a staging window every message is cut into pieces of
//! [`piece_bytes`] (an eighth of the window), whether its buffers are in windows or staged, so
//! that a send and its receive are cut alike whatever path either side takes. Both sides
//! derive the cut from their own count; the last piece is marked ([`Piece::last`], carried in
//! the descriptor's data type), so that counts that differ are refused at the first piece
//! where the cuts part (a cut on a piece boundary would otherwise pair the longer message's
//! next piece with the peer's next receive).
//!
//! **Order.** Piece `k` of the `j`-th message from rank `s` to rank `r` in this launch has the
//! key `(k, min(s, r), max(s, r), s, j)`, the same on both ranks. Each rank's pieces run in
//! key order and every round is a contiguous run of keys that never splits a key between
//! rounds. That keeps every pair in step: take the smallest key not yet done; each side's
//! current round either holds it or lies wholly below it (and so completes, since everything
//! below the key is done), so both sides come to run it in one round, where the kernel
//! serves it (it skips units that are not ready, so a later piece never blocks it). Rounds cut
//! by one rank's counts alone (such as "as many pieces as fit", message by message) have no
//! such order, and two ranks could each wait for a piece the other puts in its next round.

/// Staged bytes are placed at this alignment in the staging window.
pub(crate) const PIECE_ALIGN: u64 = 256;

/// Bytes of a piece on a communicator whose staging window holds `staging_bytes` (0: none, so
/// messages are not cut): an eighth of the window, so that one round holds a piece of eight
/// staged messages, in multiples of [`PIECE_ALIGN`].
pub fn piece_bytes(staging_bytes: u64) -> u64 {
    if staging_bytes == 0 {
        u64::MAX
    } else {
        (staging_bytes / 8 / PIECE_ALIGN * PIECE_ALIGN).max(PIECE_ALIGN)
    }
}

/// One send or receive of a rank, as the rounds see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Message {
    /// `true` for a send.
    pub send: bool,
    /// The rank.
    pub rank: usize,
    /// The other rank.
    pub peer: usize,
    /// Bytes.
    pub bytes: u64,
    /// `true` when its buffer goes through the staging window.
    pub staged: bool,
}

/// One piece of a message in a round.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// Which message of its rank (index into the rank's messages).
    pub message: usize,
    /// The piece's first byte in the message.
    pub start: u64,
    /// Bytes.
    pub bytes: u64,
    /// `true` for the message's last piece.
    pub last: bool,
    /// Where a staged piece lies: its byte offset in the rank's staging window.
    pub staging_offset: Option<u64>,
}

/// A piece's place in the order every rank shares: (piece number, lower rank of the pair,
/// higher rank, sender, the message's place among the pair's messages that way).
type Key = (u64, usize, usize, usize, usize);

/// The rounds of one launch: for each round, for each rank (in the order of `parts`), its
/// pieces in key order.
pub type Rounds = Vec<Vec<Vec<Piece>>>;

/// Cut the messages of `parts` (each rank's messages, in call order) into pieces of `piece`
/// bytes and the pieces into rounds, each holding at most `max_tasks` pieces of a rank and at
/// most `capacity` staged bytes of a rank (placed at [`PIECE_ALIGN`]). A message of 0 bytes
/// is one piece. `piece` must be at most `capacity / 2` rounded down to [`PIECE_ALIGN`] and
/// `max_tasks` at least 2 (a rank's key holds at most two pieces: a send to itself and its
/// receive), so that any key fits an empty round.
pub fn plan_rounds(parts: &[Vec<Message>], piece: u64, capacity: u64, max_tasks: usize) -> Rounds {
    let piece = piece.max(1);
    // (key, part, piece) for every piece of every rank.
    let mut keyed: Vec<(Key, usize, Piece)> = Vec::new();
    for (part, messages) in parts.iter().enumerate() {
        let mut ordinal: Vec<((bool, usize), usize)> = Vec::new();
        for (m, message) in messages.iter().enumerate() {
            let direction = (message.send, message.peer);
            let j = match ordinal.iter_mut().find(|(d, _)| *d == direction) {
                Some((_, n)) => {
                    *n += 1;
                    *n - 1
                }
                None => {
                    ordinal.push((direction, 1));
                    0
                }
            };
            let sender = if message.send {
                message.rank
            } else {
                message.peer
            };
            let (low, high) = (
                message.rank.min(message.peer),
                message.rank.max(message.peer),
            );
            let count = message.bytes.div_ceil(piece).max(1);
            for k in 0..count {
                let start = k * piece;
                keyed.push((
                    (k, low, high, sender, j),
                    part,
                    Piece {
                        message: m,
                        start,
                        bytes: (message.bytes - start.min(message.bytes)).min(piece),
                        last: k + 1 == count,
                        staging_offset: None,
                    },
                ));
            }
        }
    }
    keyed.sort_by_key(|(key, part, piece)| (*key, *part, piece.message));
    let mut rounds: Rounds = Vec::new();
    let mut used = vec![(0u64, 0usize); parts.len()];
    let mut i = 0;
    while i < keyed.len() {
        let key = keyed[i].0;
        let end = i + keyed[i..].iter().take_while(|k| k.0 == key).count();
        let needs = |used: &[(u64, usize)]| {
            let mut after = used.to_vec();
            for (_, part, p) in &keyed[i..end] {
                if parts[*part][p.message].staged {
                    after[*part].0 = after[*part].0.div_ceil(PIECE_ALIGN) * PIECE_ALIGN + p.bytes;
                }
                after[*part].1 += 1;
            }
            after
                .iter()
                .all(|(bytes, tasks)| *bytes <= capacity && *tasks <= max_tasks)
        };
        if rounds.is_empty() || !needs(&used) {
            rounds.push(vec![Vec::new(); parts.len()]);
            used.iter_mut().for_each(|u| *u = (0, 0));
        }
        let round = rounds.last_mut().expect("a round was pushed");
        for (_, part, mut p) in keyed[i..end].iter().copied() {
            if parts[part][p.message].staged {
                let offset = used[part].0.div_ceil(PIECE_ALIGN) * PIECE_ALIGN;
                p.staging_offset = Some(offset);
                used[part].0 = offset + p.bytes;
            }
            used[part].1 += 1;
            round[part].push(p);
        }
        i = end;
    }
    rounds
}

#[cfg(test)]
mod tests {
    use super::*;

    fn message(send: bool, rank: usize, peer: usize, bytes: u64, staged: bool) -> Message {
        Message {
            send,
            rank,
            peer,
            bytes,
            staged,
        }
    }

    /// Every piece of every message, once, in order within its message, covering its bytes.
    fn check_cover(parts: &[Vec<Message>], rounds: &Rounds, piece: u64) {
        for (part, messages) in parts.iter().enumerate() {
            for (m, message) in messages.iter().enumerate() {
                let pieces: Vec<Piece> = rounds
                    .iter()
                    .flat_map(|r| r[part].iter().copied())
                    .filter(|p| p.message == m)
                    .collect();
                let mut at = 0;
                for (k, p) in pieces.iter().enumerate() {
                    assert_eq!(p.start, at);
                    assert!(p.bytes <= piece);
                    assert_eq!(p.last, k + 1 == pieces.len());
                    assert_eq!(p.staging_offset.is_some(), message.staged);
                    at += p.bytes;
                }
                assert_eq!(at, message.bytes);
                assert!(!pieces.is_empty());
            }
        }
    }

    #[test]
    fn piece_bytes_is_an_eighth_of_the_window() {
        assert_eq!(piece_bytes(4 << 20), 512 << 10);
        assert_eq!(piece_bytes(4096), 512);
        assert_eq!(piece_bytes(0), u64::MAX);
        assert_eq!(piece_bytes(1000), 256);
    }

    #[test]
    fn a_message_is_cut_into_pieces_with_the_last_marked() {
        let parts = vec![vec![message(true, 0, 1, 1000, true)]];
        let rounds = plan_rounds(&parts, 256, 4096, 256);
        assert_eq!(rounds.len(), 1);
        let bytes: Vec<u64> = rounds[0][0].iter().map(|p| p.bytes).collect();
        assert_eq!(bytes, [256, 256, 256, 232]);
        let offsets: Vec<Option<u64>> = rounds[0][0].iter().map(|p| p.staging_offset).collect();
        assert_eq!(offsets, [Some(0), Some(256), Some(512), Some(768)]);
        check_cover(&parts, &rounds, 256);
        let empty = vec![vec![message(false, 0, 1, 0, false)]];
        let rounds = plan_rounds(&empty, 256, 4096, 256);
        assert_eq!(rounds[0][0].len(), 1);
        assert!(rounds[0][0][0].last);
    }

    #[test]
    fn rounds_respect_the_staging_capacity_and_the_task_table() {
        let parts = vec![vec![
            message(true, 0, 1, 5000, true),
            message(false, 0, 1, 5000, false),
            message(true, 0, 2, 3000, true),
        ]];
        for (capacity, max_tasks) in [(1024, 256), (4096, 3), (2048, 2)] {
            let rounds = plan_rounds(&parts, 512, capacity, max_tasks);
            for round in &rounds {
                assert!(round[0].len() <= max_tasks);
                let staged_end = round[0]
                    .iter()
                    .filter_map(|p| p.staging_offset.map(|o| o + p.bytes))
                    .max()
                    .unwrap_or(0);
                assert!(staged_end <= capacity, "{staged_end} > {capacity}");
                // Staged pieces of a round do not overlap.
                let mut spans: Vec<(u64, u64)> = round[0]
                    .iter()
                    .filter_map(|p| p.staging_offset.map(|o| (o, o + p.bytes)))
                    .collect();
                spans.sort();
                assert!(spans.windows(2).all(|w| w[0].1 <= w[1].0));
            }
            check_cover(&parts, &rounds, 512);
        }
    }

    /// The pieces of a pair come in the same order on both ranks, and each side's rounds are
    /// contiguous runs of one key order: for every piece of a send and its receive, the
    /// number of keys before it is the same, and a rank's rounds never go back in key.
    #[test]
    fn both_sides_of_a_pair_order_their_pieces_alike() {
        // Rank 0 stages everything, rank 1 nothing: their rounds differ, their order must not.
        let rank0 = vec![
            message(true, 0, 1, 3000, true),
            message(false, 0, 1, 700, true),
            message(true, 0, 1, 100, true),
            message(true, 0, 0, 600, true),
            message(false, 0, 0, 600, true),
        ];
        let rank1 = vec![
            message(false, 1, 0, 3000, false),
            message(true, 1, 0, 700, false),
            message(false, 1, 0, 100, false),
        ];
        let piece = 256;
        let a = plan_rounds(std::slice::from_ref(&rank0), piece, 1024, 256);
        let b = plan_rounds(std::slice::from_ref(&rank1), piece, 1024, 256);
        assert!(
            a.len() > b.len(),
            "rank 0's staging cuts it into more rounds"
        );
        // The pieces rank 0 exchanges with rank 1, in its order, against rank 1's order.
        let seq = |rounds: &Rounds, messages: &[Message]| -> Vec<(bool, u64, u64, bool)> {
            rounds
                .iter()
                .flat_map(|r| r[0].iter())
                .filter(|p| messages[p.message].peer != messages[p.message].rank)
                .map(|p| {
                    let m = messages[p.message];
                    let sender_is_0 = m.send == (m.rank == 0);
                    (sender_is_0, m.bytes, p.start, p.last)
                })
                .collect()
        };
        assert_eq!(seq(&a, &rank0), seq(&b, &rank1));
        check_cover(std::slice::from_ref(&rank0), &a, piece);
        check_cover(std::slice::from_ref(&rank1), &b, piece);
    }

    /// Several ranks in one launch (one thread drives them): a key is never split between
    /// rounds, so a send and its receive in the same launch run in the same round.
    #[test]
    fn a_key_is_never_split_between_rounds() {
        let parts = vec![
            vec![
                message(true, 0, 1, 2000, true),
                message(false, 0, 1, 2000, false),
            ],
            vec![
                message(false, 1, 0, 2000, false),
                message(true, 1, 0, 2000, true),
            ],
        ];
        let rounds = plan_rounds(&parts, 256, 600, 256);
        assert!(rounds.len() > 1);
        for round in &rounds {
            // Rank 0's send pieces and rank 1's receive pieces of this round match.
            let sends: Vec<u64> = round[0]
                .iter()
                .filter(|p| p.message == 0)
                .map(|p| p.start)
                .collect();
            let receives: Vec<u64> = round[1]
                .iter()
                .filter(|p| p.message == 0)
                .map(|p| p.start)
                .collect();
            assert_eq!(sends, receives);
        }
        check_cover(&parts, &rounds, 256);
    }
}
