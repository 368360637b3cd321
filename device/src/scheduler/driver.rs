//! The persistent loop: owns the whole protocol, so kernels only say what a tile is.

use super::policy::{Attempt, Policy};
use super::source::Source;
use super::steal::{Election, Outcome, Steal};
use super::{BlockStats, TileId};
use crate::arch;

/// Broadcast thread 0's answer to the whole block (two barrier reductions).
fn broadcast_attempt(election: &Election, answer: Attempt) -> Attempt {
    let leader = election.is_leader();
    let steal = arch::sync_threads_or(leader && answer == Attempt::Steal);
    let skip = arch::sync_threads_or(leader && answer == Attempt::Skip);
    match (steal, skip) {
        (true, _) => Attempt::Steal,
        (false, true) => Attempt::Skip,
        (false, false) => Attempt::Stop,
    }
}

/// Run this block's own tile (unless another block took it), then steal and run tiles while the policy agrees and work is
/// left. Every thread of the block calls it; `work` runs every tile on every thread. Each
/// stolen tile runs exactly once (the typestate guarantees it is never dropped), and the
/// policy is consulted only before a request or after a stolen tile ran.
pub fn for_each_tile<P: Policy, S: Source>(source: S, mut work: impl FnMut(TileId)) -> BlockStats {
    let election = Election::thread_zero();
    let mut policy = P::init(arch::block_idx_x(), arch::grid_dim_x());
    let mut stats = BlockStats::default();
    let mut ready = Steal::new(source);
    let Some(own) = ready.first_tile() else {
        // Another block stole this block's tile: nothing to do (a canceled launch).
        return stats;
    };
    work(own);
    stats.tiles = 1;
    loop {
        let answer = if election.is_leader() {
            policy.should_try_steal()
        } else {
            Attempt::Stop
        };
        match broadcast_attempt(&election, answer) {
            Attempt::Stop => break,
            Attempt::Skip => {
                arch::nanosleep(500);
                continue;
            }
            Attempt::Steal => {}
        }
        match ready.submit(&election).wait().query() {
            Outcome::Stolen(stolen, next) => {
                let tile = stolen.run(|tile| {
                    work(tile);
                    tile
                });
                stats.tiles += 1;
                stats.steals += 1;
                let go = election.is_leader() && policy.keep_going_after_success(tile);
                if !arch::sync_threads_or(go) {
                    // Dropping the ready handle finishes the source.
                    return stats;
                }
                ready = next;
            }
            // The failed query finished the source.
            Outcome::Exhausted(_) => return stats,
        }
    }
    stats
}
