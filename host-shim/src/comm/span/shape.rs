//! Which machine each rank of a communicator is on, and where it sits there: a pure function of
//! the node ids every rank reported at bootstrap (the same table on every rank, so every rank
//! decides alike).

use crate::error::{Error, Result};

/// How the ranks of a communicator spanning machines are laid out: `machines` machines of
/// `local` ranks each, rank `r` being local rank `r % local` of machine `r / local`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    /// Machines (at least 2).
    pub machines: usize,
    /// Ranks on each machine.
    pub local: usize,
}

impl Shape {
    /// The machine of `rank`.
    pub fn machine_of(self, rank: usize) -> usize {
        rank / self.local
    }

    /// The local rank of `rank` on its machine.
    pub fn local_rank_of(self, rank: usize) -> usize {
        rank % self.local
    }

    /// The global rank of local rank `local_rank` of machine `machine`.
    pub fn rank_of(self, machine: usize, local_rank: usize) -> usize {
        machine * self.local + local_rank
    }

    /// Every rank.
    pub fn nranks(self) -> usize {
        self.machines * self.local
    }
}

/// The machines of ranks whose node ids are `nodes` (by rank), in order of their first rank,
/// with their ranks.
pub fn machines<T: PartialEq>(nodes: &[T]) -> Vec<Vec<usize>> {
    let mut machines: Vec<(&T, Vec<usize>)> = Vec::new();
    for (r, node) in nodes.iter().enumerate() {
        match machines.iter_mut().find(|(n, _)| *n == node) {
            Some((_, ranks)) => ranks.push(r),
            None => machines.push((node, vec![r])),
        }
    }
    machines.into_iter().map(|(_, ranks)| ranks).collect()
}

/// The shape of ranks on the machines `nodes` names (by rank): `None` when they are all on one
/// machine; refused unless every machine has the same number of ranks and holds consecutive
/// ranks (what torchrun and Slurm's block distribution assign). Reordering ranks would change
/// where each rank's data lands, so another layout is refused, naming each machine's ranks.
pub fn shape<T: PartialEq>(nodes: &[T]) -> Result<Option<Shape>> {
    let machines = machines(nodes);
    if machines.len() <= 1 {
        return Ok(None);
    }
    let local = machines[0].len();
    let blocks = machines
        .iter()
        .enumerate()
        .all(|(m, ranks)| ranks.iter().copied().eq(m * local..(m + 1) * local));
    if !blocks {
        let listed: Vec<String> = machines
            .iter()
            .map(|ranks| format!("ranks {ranks:?}"))
            .collect();
        return Err(Error::unsupported(format!(
            "the ranks span {} machines ({}; told apart by the kernel's boot id, or \
             SYMM_HOST_ID), and a communicator across machines needs the same number of ranks \
             on every machine, each machine holding consecutive ranks (rank r on machine r / L \
             with L ranks per machine): start the ranks so (torchrun and Slurm's block \
             distribution do)",
            machines.len(),
            listed.join(", ")
        )));
    }
    Ok(Some(Shape {
        machines: machines.len(),
        local,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_machine_has_no_shape() {
        assert_eq!(shape(&["a", "a", "a"]).unwrap(), None);
    }

    #[test]
    fn consecutive_equal_machines_have_a_shape() {
        let s = shape(&["a", "a", "b", "b", "c", "c"]).unwrap().unwrap();
        assert_eq!(
            s,
            Shape {
                machines: 3,
                local: 2
            }
        );
        assert_eq!((s.machine_of(3), s.local_rank_of(3)), (1, 1));
        assert_eq!(s.rank_of(2, 1), 5);
        assert_eq!(s.nranks(), 6);
        // One rank per machine.
        assert_eq!(shape(&[1, 2]).unwrap().unwrap().local, 1);
    }

    #[test]
    fn uneven_or_interleaved_machines_are_refused_naming_their_ranks() {
        for (nodes, listed) in [
            (vec!["a", "b", "a", "b"], "ranks [0, 2], ranks [1, 3]"),
            (vec!["a", "a", "a", "b"], "ranks [0, 1, 2], ranks [3]"),
            (vec!["a", "b", "b", "a"], "ranks [0, 3], ranks [1, 2]"),
        ] {
            let e = shape(&nodes).unwrap_err();
            assert!(e.message.contains(listed), "{}", e.message);
            assert!(e.message.contains("consecutive ranks"), "{}", e.message);
        }
    }
}
