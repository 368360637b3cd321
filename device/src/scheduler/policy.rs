//! Scheduling policies: *when* a block asks for more work, never *what* it gets. Static
//! dispatch (generic parameters), per-block state evaluated by one thread and broadcast, so
//! control flow stays uniform across the block.
//!
//! A policy answers before each request ([`Policy::should_try_steal`]) and after each
//! successful steal ([`Policy::keep_going_after_success`]). It can never drop a stolen tile:
//! the tile it is told about has already been run.

use super::TileId;
use crate::arch;

/// The answer before a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Attempt {
    /// Stop stealing: the block exits.
    Stop = 0,
    /// Not now: back off briefly and ask again.
    Skip = 1,
    /// Submit a request.
    Steal = 2,
}

/// A scheduling policy (the seed's three callbacks).
pub trait Policy: Sized {
    /// Called once per block at kernel start.
    fn init(block: u32, blocks: u32) -> Self;
    /// Called before each request.
    fn should_try_steal(&mut self) -> Attempt;
    /// Called after a stolen tile has run: `false` stops stealing.
    fn keep_going_after_success(&mut self, stolen: TileId) -> bool;
}

/// Always steal.
pub struct Greedy;

impl Policy for Greedy {
    fn init(_: u32, _: u32) -> Self {
        Greedy
    }
    fn should_try_steal(&mut self) -> Attempt {
        Attempt::Steal
    }
    fn keep_going_after_success(&mut self, _: TileId) -> bool {
        true
    }
}

/// At most `N` successful steals per block.
pub struct MaxSteals<const N: u32> {
    steals: u32,
}

impl<const N: u32> Policy for MaxSteals<N> {
    fn init(_: u32, _: u32) -> Self {
        MaxSteals { steals: 0 }
    }
    fn should_try_steal(&mut self) -> Attempt {
        if self.steals < N {
            Attempt::Steal
        } else {
            Attempt::Stop
        }
    }
    fn keep_going_after_success(&mut self, _: TileId) -> bool {
        self.steals += 1;
        self.steals < N
    }
}

/// Throttle: request only on every `N`-th attempt, backing off on the others.
pub struct EveryNth<const N: u32> {
    attempts: u32,
}

impl<const N: u32> Policy for EveryNth<N> {
    fn init(_: u32, _: u32) -> Self {
        EveryNth { attempts: 0 }
    }
    fn should_try_steal(&mut self) -> Attempt {
        let attempt = self.attempts;
        self.attempts = self.attempts.wrapping_add(1);
        if attempt.is_multiple_of(N.max(1)) {
            Attempt::Steal
        } else {
            Attempt::Skip
        }
    }
    fn keep_going_after_success(&mut self, _: TileId) -> bool {
        true
    }
}

/// Only the first `NUM/DEN` of the blocks steal; the others run their own tile and exit.
pub struct FirstFraction<const NUM: u32, const DEN: u32> {
    eligible: bool,
}

impl<const NUM: u32, const DEN: u32> Policy for FirstFraction<NUM, DEN> {
    fn init(block: u32, blocks: u32) -> Self {
        FirstFraction {
            eligible: (block as u64) * (DEN as u64) < (blocks as u64) * (NUM as u64),
        }
    }
    fn should_try_steal(&mut self) -> Attempt {
        if self.eligible {
            Attempt::Steal
        } else {
            Attempt::Stop
        }
    }
    fn keep_going_after_success(&mut self, _: TileId) -> bool {
        self.eligible
    }
}

/// Steal only during the first `NS` nanoseconds of the block's life (global timer, not
/// clock cycles).
pub struct TimeBudget<const NS: u64> {
    start: u64,
}

impl<const NS: u64> TimeBudget<NS> {
    fn within(&self) -> bool {
        arch::global_timer_ns().wrapping_sub(self.start) < NS
    }
}

impl<const NS: u64> Policy for TimeBudget<NS> {
    fn init(_: u32, _: u32) -> Self {
        TimeBudget {
            start: arch::global_timer_ns(),
        }
    }
    fn should_try_steal(&mut self) -> Attempt {
        if self.within() {
            Attempt::Steal
        } else {
            Attempt::Stop
        }
    }
    fn keep_going_after_success(&mut self, _: TileId) -> bool {
        self.within()
    }
}

/// Both policies must agree to steal (the stricter answer wins).
pub struct And<P, Q>(P, Q);

impl<P: Policy, Q: Policy> Policy for And<P, Q> {
    fn init(block: u32, blocks: u32) -> Self {
        And(P::init(block, blocks), Q::init(block, blocks))
    }
    fn should_try_steal(&mut self) -> Attempt {
        self.0.should_try_steal().min(self.1.should_try_steal())
    }
    fn keep_going_after_success(&mut self, stolen: TileId) -> bool {
        let p = self.0.keep_going_after_success(stolen);
        let q = self.1.keep_going_after_success(stolen);
        p && q
    }
}

/// Either policy suffices (the more eager answer wins).
pub struct Or<P, Q>(P, Q);

impl<P: Policy, Q: Policy> Policy for Or<P, Q> {
    fn init(block: u32, blocks: u32) -> Self {
        Or(P::init(block, blocks), Q::init(block, blocks))
    }
    fn should_try_steal(&mut self) -> Attempt {
        self.0.should_try_steal().max(self.1.should_try_steal())
    }
    fn keep_going_after_success(&mut self, stolen: TileId) -> bool {
        let p = self.0.keep_going_after_success(stolen);
        let q = self.1.keep_going_after_success(stolen);
        p || q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_steals_stops_after_n() {
        let mut p = MaxSteals::<2>::init(0, 4);
        assert_eq!(p.should_try_steal(), Attempt::Steal);
        assert!(p.keep_going_after_success(TileId(5)));
        assert_eq!(p.should_try_steal(), Attempt::Steal);
        assert!(!p.keep_going_after_success(TileId(6)));
        assert_eq!(p.should_try_steal(), Attempt::Stop);
    }

    #[test]
    fn every_nth_skips_between() {
        let mut p = EveryNth::<3>::init(0, 1);
        let answers: [Attempt; 6] = core::array::from_fn(|_| p.should_try_steal());
        use Attempt::*;
        assert_eq!(answers, [Steal, Skip, Skip, Steal, Skip, Skip]);
    }

    #[test]
    fn first_fraction_and_composition() {
        assert_eq!(
            FirstFraction::<1, 2>::init(1, 4).should_try_steal(),
            Attempt::Steal
        );
        assert_eq!(
            FirstFraction::<1, 2>::init(2, 4).should_try_steal(),
            Attempt::Stop
        );
        let mut and = And::<FirstFraction<1, 2>, EveryNth<2>>::init(0, 4);
        assert_eq!(and.should_try_steal(), Attempt::Steal);
        assert_eq!(and.should_try_steal(), Attempt::Skip);
        let mut or = Or::<FirstFraction<1, 2>, MaxSteals<1>>::init(3, 4);
        assert_eq!(or.should_try_steal(), Attempt::Steal);
        assert!(!or.keep_going_after_success(TileId(9)));
    }
}
