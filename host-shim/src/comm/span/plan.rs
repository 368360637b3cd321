//! The plan of a collective on a communicator spanning machines: a pure function of the call
//! and of this rank's place, listing the legs this rank runs in order. Inside legs are symm
//! collectives of the machine's communicator; rail legs exchange with the ranks of the same
//! local rank on the other machines (rail `i`: local rank `i` of every machine).
//!
//! | call | legs |
//! |---|---|
//! | all-reduce `n` | reduce-scatter inside (shard `i` of `s = n / L`), all-reduce of shard `i` on rail `i`, all-gather inside; the `n mod L` last elements all-reduced inside, then on every rail |
//! | all-gather `c` | all-gather on the rail (machine `m'`'s block to rank `(m', i)`'s place), then one all-gather inside per machine block, in place |
//! | reduce-scatter `c` | one reduce-scatter inside per machine block (this machine's first), each kept in scratch; reduce-scatter of the `M` blocks on the rail |
//! | broadcast from `(m0, i0)` | broadcast on rail `i0` from machine `m0`; broadcast inside from local rank `i0` |

use super::shape::Shape;
use crate::plan::Collective;

/// A buffer of the call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Buffer {
    /// `sendbuff`.
    Send,
    /// `recvbuff`.
    Recv,
    /// Scratch of this rank for this call ([`Plan::scratch`] elements).
    Scratch,
}

/// Elements from `offset` (in elements) of a buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Region {
    /// Which buffer.
    pub buffer: Buffer,
    /// Offset in elements.
    pub offset: usize,
}

const fn at(buffer: Buffer, offset: usize) -> Region {
    Region { buffer, offset }
}

/// One leg of a rank's plan.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// A collective of the machine's communicator (`root`: a local rank).
    Inside {
        /// All-reduce, all-gather, reduce-scatter or broadcast.
        collective: Collective,
        /// Its send buffer.
        send: Region,
        /// Its receive buffer.
        recv: Region,
        /// Its count (per rank for all-gather and reduce-scatter).
        count: usize,
        /// Its root (broadcast).
        root: usize,
    },
    /// Copy `count` elements of this rank.
    Copy {
        /// From.
        from: Region,
        /// To.
        to: Region,
        /// Elements.
        count: usize,
    },
    /// All-reduce on the rail of `count` elements, in place; the machines' values combine in
    /// machine order, so every rank of the rail gets the same bits.
    RailAllReduce {
        /// The elements.
        at: Region,
        /// Elements.
        count: usize,
    },
    /// All-gather on the rail: this rank's `count` elements at `from`; machine `m`'s land at
    /// `to.offset + m * stride`.
    RailAllGather {
        /// This rank's elements.
        from: Region,
        /// Where machine 0's land.
        to: Region,
        /// Elements per machine.
        count: usize,
        /// Elements between two machines' blocks in `to`.
        stride: usize,
    },
    /// Reduce-scatter on the rail: `from` holds a block of `count` elements for each machine,
    /// in machine order; block `m` of every machine, combined in machine order, lands at `to`
    /// on machine `m`.
    RailReduceScatter {
        /// The blocks.
        from: Region,
        /// The result.
        to: Region,
        /// Elements per block.
        count: usize,
    },
    /// Broadcast on the rail from machine `root_machine`: its `count` elements at `from` land
    /// at `to` on every machine (its own included).
    RailBroadcast {
        /// The machine whose rank sends.
        root_machine: usize,
        /// The root's elements (read on the root machine only).
        from: Region,
        /// Where they land.
        to: Region,
        /// Elements.
        count: usize,
    },
}

/// What this rank runs for one call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Plan {
    /// The legs, in order.
    pub steps: Vec<Step>,
    /// Elements of scratch the steps use.
    pub scratch: usize,
}

/// A call as the plan needs it.
#[derive(Clone, Copy, Debug)]
pub struct Call {
    /// All-reduce, all-gather, reduce-scatter or broadcast.
    pub collective: Collective,
    /// `count`, `sendcount` or `recvcount`.
    pub count: usize,
    /// Whether the call is in place (as the collective defines it).
    pub in_place: bool,
    /// The root (broadcast), a rank of the spanning communicator.
    pub root: usize,
}

/// The plan of `call` for `rank` of a communicator of `shape`. Collectives other than the four
/// have no plan (`None`).
pub fn plan(shape: Shape, rank: usize, call: Call) -> Option<Plan> {
    let (machines, local) = (shape.machines, shape.local);
    let (m, i) = (shape.machine_of(rank), shape.local_rank_of(rank));
    let c = call.count;
    let mut steps = Vec::new();
    let mut scratch = 0;
    use Buffer::{Recv, Scratch, Send};
    match call.collective {
        Collective::AllReduce => {
            if !call.in_place && c > 0 {
                steps.push(Step::Copy {
                    from: at(Send, 0),
                    to: at(Recv, 0),
                    count: c,
                });
            }
            let shard = c / local;
            if shard > 0 {
                steps.push(Step::Inside {
                    collective: Collective::ReduceScatter,
                    send: at(Recv, 0),
                    recv: at(Recv, i * shard),
                    count: shard,
                    root: 0,
                });
                steps.push(Step::RailAllReduce {
                    at: at(Recv, i * shard),
                    count: shard,
                });
                steps.push(Step::Inside {
                    collective: Collective::AllGather,
                    send: at(Recv, i * shard),
                    recv: at(Recv, 0),
                    count: shard,
                    root: 0,
                });
            }
            let tail = c - shard * local;
            if tail > 0 {
                let start = shard * local;
                steps.push(Step::Inside {
                    collective: Collective::AllReduce,
                    send: at(Recv, start),
                    recv: at(Recv, start),
                    count: tail,
                    root: 0,
                });
                steps.push(Step::RailAllReduce {
                    at: at(Recv, start),
                    count: tail,
                });
            }
        }
        Collective::AllGather => {
            if c > 0 {
                steps.push(Step::RailAllGather {
                    from: at(Send, 0),
                    to: at(Recv, i * c),
                    count: c,
                    stride: local * c,
                });
                for block in 0..machines {
                    steps.push(Step::Inside {
                        collective: Collective::AllGather,
                        send: at(Recv, (block * local + i) * c),
                        recv: at(Recv, block * local * c),
                        count: c,
                        root: 0,
                    });
                }
            }
        }
        Collective::ReduceScatter => {
            if c > 0 {
                // This machine's block first: in place, the result's place lies in it.
                let order = std::iter::once(m).chain((0..machines).filter(|&b| b != m));
                for block in order {
                    steps.push(Step::Inside {
                        collective: Collective::ReduceScatter,
                        send: at(Send, block * local * c),
                        recv: at(Recv, 0),
                        count: c,
                        root: 0,
                    });
                    steps.push(Step::Copy {
                        from: at(Recv, 0),
                        to: at(Scratch, block * c),
                        count: c,
                    });
                }
                steps.push(Step::RailReduceScatter {
                    from: at(Scratch, 0),
                    to: at(Recv, 0),
                    count: c,
                });
                scratch = machines * c;
            }
        }
        Collective::Broadcast => {
            if c > 0 {
                let (root_machine, root_local) =
                    (shape.machine_of(call.root), shape.local_rank_of(call.root));
                if i == root_local {
                    steps.push(Step::RailBroadcast {
                        root_machine,
                        from: at(Send, 0),
                        to: at(Recv, 0),
                        count: c,
                    });
                }
                steps.push(Step::Inside {
                    collective: Collective::Broadcast,
                    send: at(Recv, 0),
                    recv: at(Recv, 0),
                    count: c,
                    root: root_local,
                });
            }
        }
        _ => return None,
    }
    Some(Plan { steps, scratch })
}

#[cfg(test)]
mod tests {
    //! The plans run on a model of every rank (inside legs and rail legs by their definitions,
    //! the machines in lock step), against each collective's definition on the whole
    //! communicator: proves the index maps, for many shapes and counts.
    use super::*;

    /// A rank's memory: its send and receive buffers at offsets of one array (so that an
    /// in-place call's buffers overlap as they do for the user), and its scratch.
    #[derive(Clone)]
    struct Rank {
        memory: Vec<i64>,
        send_at: usize,
        recv_at: usize,
        scratch: Vec<i64>,
    }

    impl Rank {
        fn new(memory: Vec<i64>, send_at: usize, recv_at: usize) -> Rank {
            Rank {
                memory,
                send_at,
                recv_at,
                scratch: vec![],
            }
        }
        fn slot(&mut self, r: Region, n: usize) -> &mut [i64] {
            let (buffer, base) = match r.buffer {
                Buffer::Send => (&mut self.memory, self.send_at),
                Buffer::Recv => (&mut self.memory, self.recv_at),
                Buffer::Scratch => (&mut self.scratch, 0),
            };
            &mut buffer[base + r.offset..base + r.offset + n]
        }
        fn read(&mut self, r: Region, n: usize) -> Vec<i64> {
            self.slot(r, n).to_vec()
        }
        fn write(&mut self, r: Region, values: &[i64]) {
            self.slot(r, values.len()).copy_from_slice(values);
        }
        fn received(&mut self, n: usize) -> Vec<i64> {
            self.read(at(Buffer::Recv, 0), n)
        }
    }

    /// Run every rank's plan, step by step (every rank of a machine has the same inside legs;
    /// every rank of a rail the same rail legs).
    fn run(shape: Shape, call: Call, ranks: &mut [Rank]) {
        let plans: Vec<Plan> = (0..shape.nranks())
            .map(|r| plan(shape, r, call).unwrap())
            .collect();
        for (rank, p) in ranks.iter_mut().zip(&plans) {
            rank.scratch = vec![0; p.scratch];
        }
        // Each rank runs its steps in order; an inside leg runs once every rank of the machine
        // is at one, a rail leg once every rank of the rail is at one (as the real legs wait
        // for their peers). No progress with steps left is a deadlock.
        let mut next = vec![0usize; shape.nranks()];
        let is_rail = |s: &Step| {
            matches!(
                s,
                Step::RailAllReduce { .. }
                    | Step::RailAllGather { .. }
                    | Step::RailReduceScatter { .. }
                    | Step::RailBroadcast { .. }
            )
        };
        loop {
            let kinds: Vec<Option<Step>> = (0..shape.nranks())
                .map(|r| plans[r].steps.get(next[r]).copied())
                .collect();
            if kinds.iter().all(Option::is_none) {
                return;
            }
            let mut progress = false;
            for r in 0..shape.nranks() {
                if let Some(Step::Copy { from, to, count }) = kinds[r] {
                    let v = ranks[r].read(from, count);
                    ranks[r].write(to, &v);
                    next[r] += 1;
                    progress = true;
                }
            }
            for machine in 0..shape.machines {
                let members: Vec<usize> = (0..shape.local)
                    .map(|i| shape.rank_of(machine, i))
                    .collect();
                if !members
                    .iter()
                    .all(|&r| matches!(kinds[r], Some(Step::Inside { .. })))
                {
                    continue;
                }
                let Some(Step::Inside {
                    collective,
                    count,
                    root,
                    ..
                }) = kinds[members[0]]
                else {
                    unreachable!()
                };
                let regions: Vec<(Region, Region)> = members
                    .iter()
                    .map(|&r| match kinds[r] {
                        Some(Step::Inside {
                            send,
                            recv,
                            collective: c2,
                            count: n2,
                            root: o2,
                        }) => {
                            assert_eq!(
                                (c2, n2, o2),
                                (collective, count, root),
                                "machine legs differ"
                            );
                            (send, recv)
                        }
                        _ => unreachable!(),
                    })
                    .collect();
                inside(collective, count, root, &members, &regions, ranks);
                for &r in &members {
                    next[r] += 1;
                }
                progress = true;
            }
            for i in 0..shape.local {
                let members: Vec<usize> =
                    (0..shape.machines).map(|m| shape.rank_of(m, i)).collect();
                if !members
                    .iter()
                    .all(|&r| kinds[r].as_ref().is_some_and(is_rail))
                {
                    continue;
                }
                rail(&members, &kinds, ranks);
                for &r in &members {
                    next[r] += 1;
                }
                progress = true;
            }
            assert!(progress, "the plans deadlock at steps {next:?}: {kinds:?}");
        }
    }

    fn inside(
        collective: Collective,
        count: usize,
        root: usize,
        members: &[usize],
        regions: &[(Region, Region)],
        ranks: &mut [Rank],
    ) {
        let l = members.len();
        match collective {
            Collective::AllReduce => {
                let inputs: Vec<Vec<i64>> = members
                    .iter()
                    .zip(regions)
                    .map(|(&r, (s, _))| ranks[r].read(*s, count))
                    .collect();
                let sum: Vec<i64> = (0..count)
                    .map(|e| inputs.iter().map(|v| v[e]).sum())
                    .collect();
                for (&r, (_, d)) in members.iter().zip(regions) {
                    ranks[r].write(*d, &sum);
                }
            }
            Collective::ReduceScatter => {
                let inputs: Vec<Vec<i64>> = members
                    .iter()
                    .zip(regions)
                    .map(|(&r, (s, _))| ranks[r].read(*s, count * l))
                    .collect();
                for (j, (&r, (_, d))) in members.iter().zip(regions).enumerate() {
                    let part: Vec<i64> = (0..count)
                        .map(|e| inputs.iter().map(|v| v[j * count + e]).sum())
                        .collect();
                    ranks[r].write(*d, &part);
                }
            }
            Collective::AllGather => {
                let inputs: Vec<Vec<i64>> = members
                    .iter()
                    .zip(regions)
                    .map(|(&r, (s, _))| ranks[r].read(*s, count))
                    .collect();
                let all: Vec<i64> = inputs.concat();
                for (&r, (_, d)) in members.iter().zip(regions) {
                    ranks[r].write(*d, &all);
                }
            }
            Collective::Broadcast => {
                let data = ranks[members[root]].read(regions[root].0, count);
                for (&r, (_, d)) in members.iter().zip(regions) {
                    ranks[r].write(*d, &data);
                }
            }
            other => panic!("no inside {other:?}"),
        }
    }

    fn rail(members: &[usize], kinds: &[Option<Step>], ranks: &mut [Rank]) {
        let steps: Vec<Step> = members.iter().map(|&r| kinds[r].unwrap()).collect();
        match steps[0] {
            Step::RailAllReduce { count, .. } => {
                let inputs: Vec<Vec<i64>> = members
                    .iter()
                    .zip(&steps)
                    .map(|(&r, s)| match s {
                        Step::RailAllReduce { at, count: n } => {
                            assert_eq!(*n, count);
                            ranks[r].read(*at, count)
                        }
                        other => panic!("{other:?}"),
                    })
                    .collect();
                let sum: Vec<i64> = (0..count)
                    .map(|e| inputs.iter().map(|v| v[e]).sum())
                    .collect();
                for (&r, s) in members.iter().zip(&steps) {
                    if let Step::RailAllReduce { at, .. } = s {
                        ranks[r].write(*at, &sum)
                    }
                }
            }
            Step::RailAllGather { count, .. } => {
                let inputs: Vec<Vec<i64>> = members
                    .iter()
                    .zip(&steps)
                    .map(|(&r, s)| match s {
                        Step::RailAllGather { from, .. } => ranks[r].read(*from, count),
                        other => panic!("{other:?}"),
                    })
                    .collect();
                for (&r, s) in members.iter().zip(&steps) {
                    if let Step::RailAllGather { to, stride, .. } = s {
                        for (m, v) in inputs.iter().enumerate() {
                            ranks[r].write(at(to.buffer, to.offset + m * stride), v);
                        }
                    }
                }
            }
            Step::RailReduceScatter { count, .. } => {
                let machines = members.len();
                let inputs: Vec<Vec<i64>> = members
                    .iter()
                    .zip(&steps)
                    .map(|(&r, s)| match s {
                        Step::RailReduceScatter { from, .. } => {
                            ranks[r].read(*from, count * machines)
                        }
                        other => panic!("{other:?}"),
                    })
                    .collect();
                for (m, (&r, s)) in members.iter().zip(&steps).enumerate() {
                    if let Step::RailReduceScatter { to, .. } = s {
                        let part: Vec<i64> = (0..count)
                            .map(|e| inputs.iter().map(|v| v[m * count + e]).sum())
                            .collect();
                        ranks[r].write(*to, &part);
                    }
                }
            }
            Step::RailBroadcast {
                root_machine,
                from,
                count,
                ..
            } => {
                let data = ranks[members[root_machine]].read(from, count);
                for (&r, s) in members.iter().zip(&steps) {
                    if let Step::RailBroadcast { to, .. } = s {
                        ranks[r].write(*to, &data)
                    }
                }
            }
            other => panic!("{other:?}"),
        }
    }

    fn value(rank: usize, e: usize) -> i64 {
        (rank as i64 + 1) * 1000 + e as i64
    }

    #[test]
    fn the_plans_compute_each_collective_on_every_shape() {
        for (machines, local) in [(2, 1), (2, 2), (3, 2), (2, 3), (4, 3)] {
            let shape = Shape { machines, local };
            let n = shape.nranks();
            for count in [0, 1, 2, 5, 7, 12, 13] {
                for in_place in [false, true] {
                    // All-reduce (in place: one buffer).
                    let mut ranks: Vec<Rank> = (0..n)
                        .map(|r| {
                            let mut memory: Vec<i64> = (0..count).map(|e| value(r, e)).collect();
                            if in_place {
                                Rank::new(memory, 0, 0)
                            } else {
                                memory.extend(std::iter::repeat_n(-1, count));
                                Rank::new(memory, 0, count)
                            }
                        })
                        .collect();
                    let call = Call {
                        collective: Collective::AllReduce,
                        count,
                        in_place,
                        root: 0,
                    };
                    run(shape, call, &mut ranks);
                    let want: Vec<i64> = (0..count)
                        .map(|e| (0..n).map(|r| value(r, e)).sum())
                        .collect();
                    for (r, rank) in ranks.iter_mut().enumerate() {
                        assert_eq!(
                            rank.received(count),
                            want,
                            "all-reduce {shape:?} count {count} in place {in_place} rank {r}"
                        );
                    }
                    // All-gather (in place: the send buffer is the rank's block of recvbuff).
                    let mut ranks: Vec<Rank> = (0..n)
                        .map(|r| {
                            let own: Vec<i64> = (0..count).map(|e| value(r, e)).collect();
                            let mut memory = vec![-1; count * n];
                            if in_place {
                                memory[r * count..(r + 1) * count].copy_from_slice(&own);
                                Rank::new(memory, r * count, 0)
                            } else {
                                memory.extend(own);
                                Rank::new(memory, count * n, 0)
                            }
                        })
                        .collect();
                    let call = Call {
                        collective: Collective::AllGather,
                        count,
                        in_place,
                        root: 0,
                    };
                    run(shape, call, &mut ranks);
                    let want: Vec<i64> = (0..n)
                        .flat_map(|r| (0..count).map(move |e| value(r, e)))
                        .collect();
                    for (r, rank) in ranks.iter_mut().enumerate() {
                        assert_eq!(
                            rank.received(count * n),
                            want,
                            "all-gather {shape:?} count {count} in place {in_place} rank {r}"
                        );
                    }
                    // Reduce-scatter (in place: recvbuff is the rank's segment of sendbuff).
                    let mut ranks: Vec<Rank> = (0..n)
                        .map(|r| {
                            let mut memory: Vec<i64> =
                                (0..count * n).map(|e| value(r, e)).collect();
                            if in_place {
                                Rank::new(memory, 0, r * count)
                            } else {
                                memory.extend(std::iter::repeat_n(-1, count));
                                Rank::new(memory, 0, count * n)
                            }
                        })
                        .collect();
                    let call = Call {
                        collective: Collective::ReduceScatter,
                        count,
                        in_place,
                        root: 0,
                    };
                    run(shape, call, &mut ranks);
                    for (r, rank) in ranks.iter_mut().enumerate() {
                        let want: Vec<i64> = (0..count)
                            .map(|e| (0..n).map(|q| value(q, r * count + e)).sum())
                            .collect();
                        assert_eq!(
                            rank.received(count),
                            want,
                            "reduce-scatter {shape:?} count {count} in place {in_place} rank {r}"
                        );
                    }
                    // Broadcast from every root (in place on the root: one buffer).
                    for root in 0..n {
                        let mut ranks: Vec<Rank> = (0..n)
                            .map(|r| {
                                let mut memory: Vec<i64> =
                                    (0..count).map(|e| value(r, e)).collect();
                                if in_place && r == root {
                                    Rank::new(memory, 0, 0)
                                } else {
                                    memory.extend(std::iter::repeat_n(-1, count));
                                    Rank::new(memory, 0, count)
                                }
                            })
                            .collect();
                        let call = Call {
                            collective: Collective::Broadcast,
                            count,
                            in_place,
                            root,
                        };
                        run(shape, call, &mut ranks);
                        let want: Vec<i64> = (0..count).map(|e| value(root, e)).collect();
                        for (r, rank) in ranks.iter_mut().enumerate() {
                            assert_eq!(
                                rank.received(count),
                                want,
                                "broadcast {shape:?} count {count} root {root} rank {r}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn only_the_four_collectives_have_a_plan() {
        let shape = Shape {
            machines: 2,
            local: 2,
        };
        let call = |collective| Call {
            collective,
            count: 4,
            in_place: false,
            root: 0,
        };
        assert!(plan(shape, 0, call(Collective::Reduce)).is_none());
        assert!(plan(shape, 0, call(Collective::AllToAll)).is_none());
        // A broadcast's rail leg runs on the root's rail only.
        let p = plan(
            shape,
            1,
            Call {
                root: 2,
                ..call(Collective::Broadcast)
            },
        )
        .unwrap();
        assert!(
            !p.steps
                .iter()
                .any(|s| matches!(s, Step::RailBroadcast { .. }))
        );
        let p = plan(
            shape,
            0,
            Call {
                root: 2,
                ..call(Collective::Broadcast)
            },
        )
        .unwrap();
        assert!(matches!(
            p.steps[0],
            Step::RailBroadcast {
                root_machine: 1,
                ..
            }
        ));
    }
}
