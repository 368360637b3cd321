//! Writes the seed inputs of the `abi_sequence` target: sequences like the library's tests
//! (set-up, collectives of every kind on 1–4 ranks, teardown) and their misuse variants, encoded
//! as operations so that they are reproducible. Usage: `abi_sequence_seeds <directory>`.

use symm_fuzz::input::{BufSel, CallSpec, CommSel, Op, encode_all};

/// Set up `n` ranks with two windows of `bytes` each (the second at the allocation's
/// middle).
fn setup(n: u8, bytes: u16, unique_id: bool) -> Vec<Op> {
    let init = if unique_id {
        Op::InitUniqueId { nranks: n - 1 }
    } else {
        Op::InitAll { nranks: n - 1 }
    };
    with_init(init, bytes)
}

/// As [`setup`], with `symmCommInitAll` and the short timeout, where calls that time out are
/// made.
fn setup_fast(n: u8, bytes: u16) -> Vec<Op> {
    with_init(
        Op::InitAll {
            nranks: 0x80 | (n - 1),
        },
        bytes,
    )
}

fn with_init(init: Op, bytes: u16) -> Vec<Op> {
    vec![
        init,
        Op::AllocAll {
            clique: 0,
            size: bytes,
        },
        Op::RegisterAll {
            clique: 0,
            alloc: 0,
            offset: 0,
            size: bytes / 2,
        },
        Op::RegisterAll {
            clique: 0,
            alloc: 0,
            offset: bytes / 2,
            size: 0xFFFF,
        },
    ]
}

fn teardown() -> Vec<Op> {
    vec![
        Op::DeregisterAll {
            clique: 0,
            win: 0,
            free: 0,
        },
        Op::DeregisterAll {
            clique: 0,
            win: 0,
            free: 1,
        },
        Op::DestroyAll { clique: 0 },
    ]
}

fn collective(kind: u8, dtype: u8, op: u8, count: u16, in_place: bool, variant: u8) -> Op {
    Op::CollectiveAll {
        clique: 0,
        call: CallSpec {
            kind,
            dtype,
            op,
            count,
        },
        whole: 0,
        whole_offset: 0,
        share: if in_place { 0xFF } else { 1 },
        share_offset: 0,
        variant,
    }
}

fn main() {
    let dir = std::env::args()
        .nth(1)
        .expect("usage: abi_sequence_seeds <directory>");
    std::fs::create_dir_all(&dir).expect("creating the seed directory");
    let mut seeds: Vec<(String, Vec<Op>)> = Vec::new();

    // Every collective, type and operator on 1-4 ranks, in place and out of place.
    for n in 1..=4u8 {
        for kind in 0..3u8 {
            for dtype in 0..12u8 {
                let mut ops = setup(n, 8192, false);
                for op in 0..5u8 {
                    let count = [0, 1, 7, 100, 0xFFFC][(op as usize + dtype as usize) % 5];
                    ops.push(collective(kind, dtype, op, count, op % 2 == 0, 0));
                }
                ops.extend(teardown());
                seeds.push((format!("collectives-n{n}-k{kind}-t{dtype}"), ops));
            }
        }
    }
    // Larger payloads (past the low-latency limit) and offsets.
    for n in [2u8, 4] {
        let mut ops = setup(n, 0xF000, false);
        for kind in 0..3u8 {
            ops.push(collective(kind, 7, 0, 0xFFFC, false, 0));
            ops.push(Op::CollectiveAll {
                clique: 0,
                call: CallSpec {
                    kind,
                    dtype: 2,
                    op: 2,
                    count: 1000,
                },
                whole: 1,
                whole_offset: 3,
                share: 0,
                share_offset: 5,
                variant: 0,
            });
        }
        ops.extend(teardown());
        seeds.push((format!("large-n{n}"), ops));
    }
    // Unique-id communicators.
    for n in 1..=3u8 {
        let mut ops = setup(n, 4096, true);
        ops.push(collective(0, 7, 0, 64, true, 0));
        ops.push(collective(1, 0, 0, 16, false, 0));
        ops.extend(teardown());
        seeds.push((format!("unique-id-n{n}"), ops));
    }
    // Several collectives in one group; a group left open at the end.
    let mut ops = setup(3, 4096, false);
    ops.push(Op::GroupStart);
    ops.push(collective(0, 7, 0, 32, true, 0));
    ops.push(collective(2, 3, 4, 8, false, 0));
    ops.push(Op::GroupEnd);
    ops.push(Op::GroupStart);
    ops.push(collective(1, 9, 0, 5, true, 0));
    seeds.push(("group-several".into(), ops));
    // Registration and collective in one group.
    let mut ops = vec![
        Op::InitAll { nranks: 1 },
        Op::AllocAll {
            clique: 0,
            size: 2048,
        },
        Op::GroupStart,
        Op::RegisterAll {
            clique: 0,
            alloc: 0,
            offset: 0,
            size: 0xFFFF,
        },
        collective(0, 4, 1, 100, true, 0),
        Op::GroupEnd,
    ];
    ops.extend(teardown());
    seeds.push(("register-and-reduce-in-group".into(), ops));
    // Misuse: mismatched parts, a rank missing, teardown in an open group.
    for variant in 3..=6u8 {
        let mut ops = setup_fast(2, 4096);
        ops.push(collective(0, 7, 0, 50, true, variant));
        ops.push(collective(0, 7, 0, 50, true, 0));
        ops.extend(teardown());
        seeds.push((format!("variant-{variant}"), ops));
    }
    let live = CommSel::live(0);
    let own_window = BufSel {
        kind: 5,
        index: 0,
        offset: 0,
    };
    let mut ops = setup(2, 4096, false);
    ops.extend([
        Op::GroupStart,
        collective(0, 7, 0, 16, true, 0),
        Op::Destroy { comm: live },
        Op::Deregister {
            comm: live,
            win: own_window,
        },
        Op::Free {
            comm: live,
            ptr: BufSel {
                kind: 4,
                index: 0,
                offset: 0,
            },
        },
        Op::InitRankMisuse { what: 0 },
        Op::GroupEnd,
    ]);
    ops.extend(teardown());
    seeds.push(("teardown-in-open-group".into(), ops));
    // Bad handles and arguments on single calls.
    let mut ops = setup_fast(2, 4096);
    for kind in 0..8u8 {
        ops.push(Op::Collective {
            comm: CommSel {
                kind: kind % 4,
                index: 0,
            },
            call: CallSpec {
                kind: kind % 3,
                dtype: [7, 12, 0xFF, 3][kind as usize % 4],
                op: [0, 5, 0xFF, 1][kind as usize % 4],
                count: [4, 0xFFFF, 0xFFFE, 0xFFFD][kind as usize % 4],
            },
            send: BufSel {
                kind,
                index: 1,
                offset: [0, 1, 0xFFFF, 0xFFFE][kind as usize % 4],
            },
            recv: BufSel {
                kind: 5,
                index: 0,
                offset: 2,
            },
        });
        ops.push(Op::Query {
            comm: CommSel {
                kind: kind % 4,
                index: kind,
            },
            what: kind,
            win: own_window,
        });
        ops.push(Op::ErrorString {
            code: kind.wrapping_mul(37),
        });
        ops.push(Op::InitRankMisuse { what: kind });
    }
    ops.extend([
        Op::Free {
            comm: live,
            ptr: BufSel {
                kind: 4,
                index: 0,
                offset: 0,
            },
        },
        Op::Register {
            comm: live,
            ptr: BufSel {
                kind: 4,
                index: 0,
                offset: 8,
            },
            size: 64,
            flags: 0,
        },
        Op::Register {
            comm: CommSel::live(1),
            ptr: BufSel {
                kind: 3,
                index: 0,
                offset: 8,
            },
            size: 64,
            flags: 1,
        },
        Op::GroupEnd,
        Op::Alloc {
            comm: live,
            size: 0,
        },
        Op::Alloc {
            comm: live,
            size: 0xFFFF,
        },
    ]);
    ops.extend(teardown());
    ops.extend([
        Op::Destroy {
            comm: CommSel { kind: 2, index: 0 },
        },
        Op::Free {
            comm: live,
            ptr: BufSel {
                kind: 2,
                index: 0,
                offset: 0,
            },
        },
    ]);
    seeds.push(("bad-arguments".into(), ops));
    // A peer deregisters, then a rank calls alone.
    let mut ops = setup_fast(2, 4096);
    ops.extend([
        Op::Deregister {
            comm: CommSel::live(1),
            win: own_window,
        },
        Op::Collective {
            comm: live,
            call: CallSpec {
                kind: 0,
                dtype: 7,
                op: 0,
                count: 16,
            },
            send: own_window,
            recv: own_window,
        },
    ]);
    ops.extend(teardown());
    seeds.push(("peer-deregistered".into(), ops));

    // Each rank registers alone (both time out), then both in a group.
    let mut ops = vec![
        Op::InitAll { nranks: 0x81 },
        Op::AllocAll {
            clique: 0,
            size: 1024,
        },
    ];
    for rank in 0..2 {
        ops.push(Op::Register {
            comm: CommSel::live(rank),
            ptr: BufSel {
                kind: 4,
                index: 0,
                offset: 0,
            },
            size: 0xFFFF,
            flags: 0,
        });
    }
    ops.push(Op::RegisterAll {
        clique: 0,
        alloc: 0,
        offset: 0,
        size: 0xFFFF,
    });
    ops.push(collective(0, 7, 0, 16, true, 0));
    ops.extend(teardown());
    seeds.push(("registration-timed-out".into(), ops));

    for (name, ops) in &seeds {
        let path = std::path::Path::new(&dir).join(format!("seed-{name}"));
        std::fs::write(&path, encode_all(ops)).expect("writing a seed");
    }
    println!("wrote {} seeds to {dir}", seeds.len());
}
