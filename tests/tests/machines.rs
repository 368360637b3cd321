//! Ranks on several machines, played on one machine with `SYMM_HOST_ID` (a process per rank,
//! host backend): machines of consecutive ranks form one communicator, symm inside each
//! machine and the rails between them. Every collective it runs is checked exactly against a
//! reference in f64, on 2 × 2 and 3 × 2 ranks (machines × ranks); a call that differs between
//! machines is refused on every rank before any data moves; a rank killed on one machine is
//! seen by every other rank at its next call; the machines share no memory. Layouts it cannot
//! run (interleaved or uneven machines) are refused on every rank, naming each machine's
//! ranks.

use std::ffi::c_void;
use std::ptr::null_mut;
use std::time::{Duration, Instant};
use symm::*;
use symm_device::DataType;
use symm_device::numeric::dynamic::{decode, encode, representable};
use symm_tests::*;

const CHILD: &str = "machine_rank";

/// Run a rank process per entry of `hosts` (rank `r` naming machine `hosts[r]`) in `mode`;
/// every rank's success and log.
fn ranks_on(hosts: &[&str], mode: &str) -> Vec<(bool, String)> {
    ranks_on_with(hosts, mode, &[])
}

/// As [`ranks_on`], with `extra` added to every rank's environment (replacing a default).
fn ranks_on_with(hosts: &[&str], mode: &str, extra: &[(&str, &str)]) -> Vec<(bool, String)> {
    let extra: Vec<(String, String)> = extra
        .iter()
        .map(|(n, v)| (n.to_string(), v.to_string()))
        .collect();
    ranks_on_each(hosts, mode, &|_| extra.clone())
}

/// As [`ranks_on`], with `extra(rank)` added to each rank's environment (replacing a default).
fn ranks_on_each(
    hosts: &[&str],
    mode: &str,
    extra: &dyn Fn(usize) -> Vec<(String, String)>,
) -> Vec<(bool, String)> {
    use_host_backend();
    let id = id_to_hex(&new_unique_id());
    let ranks: Vec<Vec<(String, String)>> = hosts
        .iter()
        .enumerate()
        .map(|(rank, host)| {
            vec![
                ("SYMM_BACKEND".into(), "host".into()),
                ("SYMM_HOST_ID".into(), host.to_string()),
                ("SYMM_BOOTSTRAP_TIMEOUT_MS".into(), "60000".into()),
                ("SYMM_TIMEOUT_MS".into(), "60000".into()),
                ("MACHINE_TEST_ID".into(), id.clone()),
                ("MACHINE_TEST_RANK".into(), rank.to_string()),
                ("MACHINE_TEST_NRANKS".into(), hosts.len().to_string()),
                ("MACHINE_TEST_MODE".into(), mode.to_string()),
            ]
            .into_iter()
            .filter(|(name, _)| !extra(rank).iter().any(|(n, _)| n == name))
            .chain(extra(rank))
            .collect()
        })
        .collect();
    run_rank_processes(CHILD, &ranks, Duration::from_secs(300))
}

/// The stand-in for NCCL's host collectives (`tests/fakes/fake_nccl_rails.c`), built once into
/// this test's scratch directory.
fn fake_nccl() -> String {
    static BUILT: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    BUILT.get_or_init(build_fake_nccl).clone()
}

fn build_fake_nccl() -> String {
    let out = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("fake-nccl-rails");
    let name = format!("libfake_nccl_rails-{}.so", std::process::id());
    let library = build_fake_library("fake_nccl_rails.c", &out, &name);
    library.to_string_lossy().into_owned()
}

/// Rails on NCCL (`SYMM_RAILS=nccl`, against a stand-in of NCCL's host collectives): 2 × 2 and
/// 3 × 2, every call of the sequence whose type the stand-in reduces, exact.
#[test]
fn rails_on_nccl_run_every_collective_exactly() {
    let nccl = fake_nccl();
    for hosts in [
        &["a", "a", "b", "b"][..],
        &["a", "a", "b", "b", "c", "c"][..],
    ] {
        let env = [
            ("SYMM_RAILS", "nccl"),
            ("SYMM_NCCL_LIBRARY", nccl.as_str()),
            ("FAKE_NCCL_VERSION", "22403"),
        ];
        let outcomes = ranks_on_with(hosts, "collectives", &env);
        assert_every_rank_says(&outcomes, "every call exact", &format!("nccl {hosts:?}"));
    }
}

/// On the simulated GPU (the cuda backend through the PTX interpreter, `cargo xtask sim`):
/// 2 × 2, the small calls of the sequence in device memory, exact, on rails of sockets (the
/// data through the host) and on the NCCL stand-in reading and writing device memory.
#[test]
#[ignore = "runs on the simulated GPU (cargo xtask sim --test)"]
fn on_the_simulated_gpu_machines_run_the_small_calls_exactly() {
    assert!(
        on_cuda(),
        "run with SYMM_BACKEND=cuda and the simulated GPU's libcuda on LD_LIBRARY_PATH (the rank \
         processes inherit it): cargo xtask sim --test"
    );
    let nccl = fake_nccl();
    for rails in [
        &[("SYMM_RAILS", "sockets")][..],
        &[
            ("SYMM_RAILS", "nccl"),
            ("SYMM_NCCL_LIBRARY", nccl.as_str()),
            ("FAKE_NCCL_VERSION", "22403"),
            ("FAKE_NCCL_DEVICE", "1"),
        ][..],
    ] {
        let mut env = vec![("SYMM_BACKEND", "cuda")];
        env.extend_from_slice(rails);
        let outcomes = ranks_on_with(&["a", "a", "b", "b"], "collectives-small", &env);
        let case = format!("simulated GPU, {rails:?}");
        assert_every_rank_says(&outcomes, "every call exact", &case);
    }
}

/// Rails on an NCCL without float8 types (before 2.24): a float8 call is refused on every rank
/// before any leg runs, naming the version.
#[test]
fn rails_on_an_nccl_without_float8_refuse_float8_calls() {
    let nccl = fake_nccl();
    let env = [
        ("SYMM_RAILS", "nccl"),
        ("SYMM_NCCL_LIBRARY", nccl.as_str()),
        ("FAKE_NCCL_VERSION", "22203"),
    ];
    let outcomes = ranks_on_with(&["a", "a", "b", "b"], "float8-old-nccl", &env);
    assert_every_rank_says(&outcomes, "float8 refused", "NCCL 2.22");
}

/// Rails on NCCL where one rank cannot load it: every rank's `symmCommInitRank` fails at once,
/// naming that rank and why, and none waits in NCCL for it.
#[test]
fn rails_on_nccl_without_nccl_on_one_rank_are_refused_on_every_rank() {
    let nccl = fake_nccl();
    let outcomes = ranks_on_each(&["a", "a", "b", "b"], "refused-nccl", &|rank| {
        let library = if rank == 3 {
            "/nonexistent/libnccl.so.2"
        } else {
            nccl.as_str()
        };
        vec![
            ("SYMM_RAILS".into(), "nccl".into()),
            ("SYMM_NCCL_LIBRARY".into(), library.into()),
        ]
    });
    assert_every_rank_says(&outcomes, "refused without NCCL", "no NCCL on rank 3");
}

fn assert_every_rank_says(outcomes: &[(bool, String)], what: &str, case: &str) {
    for (rank, (ok, log)) in outcomes.iter().enumerate() {
        assert!(
            *ok && log.contains(&format!("machine rank {rank}: {what}")),
            "{case}, rank {rank}:\n{log}"
        );
    }
}

/// Interleaved and uneven machines: refused on every rank, naming each machine's ranks.
#[test]
fn interleaved_or_uneven_machines_are_refused_on_every_rank_naming_them() {
    for (hosts, machines) in [
        (["a", "b", "a", "b"], "ranks [0, 2], ranks [1, 3]"),
        (["a", "a", "a", "b"], "ranks [0, 1, 2], ranks [3]"),
    ] {
        let outcomes = ranks_on(&hosts, &format!("refused:{machines}"));
        assert_every_rank_says(&outcomes, "refused as expected", &format!("{hosts:?}"));
    }
}

/// 2 × 2 and 3 × 2: every collective a spanning communicator runs, exact, mixed on one window
/// and on buffers outside it; and ranks naming one machine still form a plain communicator.
#[test]
fn machines_of_two_ranks_run_every_collective_exactly() {
    for hosts in [
        &["a", "a", "b", "b"][..],
        &["a", "a", "b", "b", "c", "c"][..],
        &["a", "a", "a", "a"][..],
    ] {
        let outcomes = ranks_on(hosts, "collectives");
        assert_every_rank_says(&outcomes, "every call exact", &format!("{hosts:?}"));
    }
}

/// Machines of one process each, whose ranks are threads (2 × 2 and 3 × 2): every collective,
/// exact, as with a process per rank.
#[test]
fn machines_whose_ranks_are_threads_run_every_collective_exactly() {
    for machines in [2, 3] {
        use_host_backend();
        let id = id_to_hex(&new_unique_id());
        let processes: Vec<Vec<(String, String)>> = (0..machines)
            .map(|m| {
                vec![
                    ("SYMM_BACKEND".into(), "host".into()),
                    ("SYMM_HOST_ID".into(), format!("machine-{m}")),
                    ("SYMM_BOOTSTRAP_TIMEOUT_MS".into(), "60000".into()),
                    ("SYMM_TIMEOUT_MS".into(), "60000".into()),
                    ("MACHINE_TEST_ID".into(), id.clone()),
                    (
                        "MACHINE_TEST_RANK".into(),
                        format!("{},{}", 2 * m, 2 * m + 1),
                    ),
                    ("MACHINE_TEST_NRANKS".into(), (2 * machines).to_string()),
                    ("MACHINE_TEST_MODE".into(), "collectives".into()),
                ]
            })
            .collect();
        let outcomes = run_rank_processes(CHILD, &processes, Duration::from_secs(300));
        for (m, (ok, log)) in outcomes.iter().enumerate() {
            for rank in [2 * m, 2 * m + 1] {
                assert!(
                    *ok && log.contains(&format!("machine rank {rank}: every call exact")),
                    "{machines} machines, process {m}:\n{log}"
                );
            }
        }
    }
}

/// A count, a root or a buffer offset that differs between ranks of two machines: every rank refuses the call
/// at once, naming both calls, and no data moves.
#[test]
fn a_call_that_differs_between_machines_is_refused_on_every_rank() {
    for mode in ["differ:count", "differ:root", "differ:offset"] {
        let outcomes = ranks_on(&["a", "a", "b", "b"], mode);
        assert_every_rank_says(&outcomes, "refused the differing call", mode);
    }
}

/// Calls a spanning communicator does not run (point-to-point pairs of some ranks, a reduce,
/// a collective inside a group) are refused at once on the ranks that make them, without
/// waiting for the others; the communicator stays usable by every rank.
#[test]
fn calls_every_maker_refuses_alike_leave_the_communicator_usable() {
    let outcomes = ranks_on(&["a", "a", "b", "b"], "unsupported");
    assert_every_rank_says(&outcomes, "refused alike and went on", "unsupported");
}

/// Machine b's ranks stop calling (a frozen machine: connections open, no calls): machine a's
/// ranks fail at the timeout (3 s here), and machine b's ranks, once they call again, fail at
/// once with that cause instead of running the call without machine a.
#[test]
fn a_frozen_machine_is_found_at_the_timeout_and_told() {
    let outcomes = ranks_on_with(
        &["a", "a", "b", "b"],
        "frozen",
        &[("SYMM_TIMEOUT_MS", "3000")],
    );
    assert_every_rank_says(&outcomes, "saw the frozen machine", "frozen");
}

/// A rank process killed on machine b: every rank of both machines fails its next call within
/// seconds (the timeout is a minute).
#[test]
fn a_rank_killed_on_one_machine_is_seen_by_every_other_rank() {
    let nccl = fake_nccl();
    for rails in [
        &[][..],
        &[
            ("SYMM_RAILS", "nccl"),
            ("SYMM_NCCL_LIBRARY", nccl.as_str()),
            ("FAKE_NCCL_VERSION", "22403"),
        ][..],
    ] {
        let outcomes = ranks_on_with(&["a", "a", "b", "b"], "killed", rails);
        for (rank, (ok, log)) in outcomes.iter().enumerate().take(3) {
            assert!(
                *ok && log.contains(&format!("machine rank {rank}: saw the killed rank")),
                "{rails:?}, rank {rank}:\n{log}"
            );
        }
        assert!(!outcomes[3].0, "the killed rank:\n{}", outcomes[3].1);
    }
}

/// Rank 2's process dies in the middle of a call, inside its rail's NCCL call (the stand-in
/// kills it 300 ms into the call's first rail leg) while its rail peer, rank 0, waits in NCCL
/// for it: every other rank's call fails within seconds (the timeout is 60 s), naming rank 2.
/// Rank 0's rail is aborted under its call in NCCL, which only the abort ends. An all-reduce
/// (one NCCL call per leg) and an all-gather (a group of broadcasts, none of which may enter
/// NCCL after the abort: the stand-in crashes on a call after `ncclCommAbort`).
#[test]
fn a_machine_lost_in_the_middle_of_a_rail_call_fails_every_other_rank_promptly() {
    let nccl = fake_nccl();
    // Call 0 makes two rail calls of its kind (the all-reduce's shard and tail; the
    // all-gather's broadcast from each machine): die in call 1's first.
    for (collective, call) in [
        ("all_reduce", "ncclAllReduce"),
        ("all_gather", "ncclBroadcast"),
    ] {
        let mode = format!("lost-in-rail:{collective}");
        let outcomes = ranks_on_each(&["a", "a", "b", "b"], &mode, &|rank| {
            let mut env = vec![
                ("SYMM_RAILS".to_string(), "nccl".to_string()),
                ("SYMM_NCCL_LIBRARY".to_string(), nccl.clone()),
                ("FAKE_NCCL_VERSION".to_string(), "22403".to_string()),
            ];
            if rank == 2 {
                env.push(("FAKE_NCCL_DIE_IN".to_string(), format!("{call}:3")));
            }
            env
        });
        for (rank, (ok, log)) in outcomes.iter().enumerate() {
            if rank == 2 {
                assert!(
                    !ok,
                    "{collective}: rank 2 was to die in its rail call:\n{log}"
                );
                continue;
            }
            assert!(
                *ok && log.contains(&format!("machine rank {rank}: saw the lost rank")),
                "{collective}, rank {rank}:\n{log}"
            );
        }
    }
}

/// A rank of machine b that aborts its communicator (`symmCommAbort`): every other rank fails
/// its next call at once, naming the abort.
#[test]
fn a_rank_that_aborts_on_one_machine_fails_every_other_rank_with_its_cause() {
    let nccl = fake_nccl();
    for rails in [
        &[][..],
        &[
            ("SYMM_RAILS", "nccl"),
            ("SYMM_NCCL_LIBRARY", nccl.as_str()),
            ("FAKE_NCCL_VERSION", "22403"),
        ][..],
    ] {
        let outcomes = ranks_on_with(&["a", "a", "b", "b"], "aborted", rails);
        assert_every_rank_says(&outcomes, "saw the abort", &format!("aborted {rails:?}"));
    }
}

/// No memory file of one machine's ranks is mapped by another machine's (while the ranks of
/// one machine do map each other's).
#[test]
fn machines_share_no_memory() {
    let outcomes = ranks_on(&["a", "a", "b", "b"], "apart");
    let files: Vec<Vec<String>> = outcomes
        .iter()
        .enumerate()
        .map(|(rank, (ok, log))| {
            assert!(*ok, "rank {rank}:\n{log}");
            let prefix = format!("machine rank {rank}: memory files ");
            let line = log
                .lines()
                .find_map(|l| l.find(&prefix).map(|at| &l[at + prefix.len()..]))
                .unwrap_or_else(|| panic!("rank {rank} listed no memory files:\n{log}"));
            line.split(',').map(str::to_string).collect()
        })
        .collect();
    let shared = |a: usize, b: usize| files[a].iter().any(|f| files[b].contains(f));
    assert!(
        shared(0, 1) && shared(2, 3),
        "machine peers map each other's windows: {files:?}"
    );
    for a in 0..2 {
        for b in 2..4 {
            assert!(
                !shared(a, b),
                "ranks {a} and {b} share a memory file: {files:?}"
            );
        }
    }
}

/// One collective of the test sequence.
#[derive(Clone, Copy, Debug)]
struct Case {
    collective: &'static str,
    dtype: DataType,
    op: symmRedOp_t,
    count: usize,
    root: usize,
    in_place: bool,
    staged: bool,
    /// Every rank's every element is this value (`None`: small values that vary).
    constant: Option<f64>,
}

const fn case(collective: &'static str, dtype: DataType, count: usize) -> Case {
    Case {
        collective,
        dtype,
        op: symmRedOp_t::symmSum,
        count,
        root: 0,
        in_place: false,
        staged: false,
        constant: None,
    }
}

/// The sequence every rank runs on one window (roots are taken modulo the ranks).
fn cases() -> Vec<Case> {
    use DataType::*;
    use symmRedOp_t::*;
    vec![
        case("all_reduce", Float32, 13),
        Case {
            op: symmMax,
            in_place: true,
            ..case("all_reduce", Int32, 7)
        },
        case("all_gather", Bfloat16, 5),
        case("reduce_scatter", Float64, 3),
        Case {
            root: 3,
            ..case("broadcast", Uint8, 9)
        },
        Case {
            constant: Some(100.0),
            ..case("all_reduce", Int8, 1)
        },
        Case {
            op: symmMin,
            in_place: true,
            ..case("reduce_scatter", Int64, 1)
        },
        Case {
            in_place: true,
            ..case("all_gather", Uint32, 1)
        },
        Case {
            in_place: true,
            ..case("broadcast", Float16, 5)
        },
        case("all_reduce", Float8E4M3, 11),
        Case {
            op: symmProd,
            ..case("all_reduce", Float8E5M2, 6)
        },
        case("reduce_scatter", Uint64, 4),
        Case {
            op: symmAvg,
            ..case("all_reduce", Float64, 9)
        },
        Case {
            op: symmAvg,
            in_place: true,
            ..case("all_reduce", Float32, 2)
        },
        case("all_gather", Float32, 0),
        case("all_reduce", Float32, 300_001),
        Case {
            root: 5,
            ..case("broadcast", Float32, 2)
        },
        Case {
            staged: true,
            ..case("all_reduce", Float32, 17)
        },
        Case {
            op: symmMax,
            in_place: true,
            ..case("reduce_scatter", Bfloat16, 5)
        },
        Case {
            staged: true,
            ..case("all_gather", Int8, 7)
        },
        Case {
            op: symmMin,
            ..case("all_reduce", Uint8, 5)
        },
        Case {
            root: 1,
            ..case("broadcast", Int64, 3)
        },
        Case {
            staged: true,
            op: symmProd,
            ..case("reduce_scatter", Int32, 2)
        },
    ]
}

/// Rank `rank`'s element `e` of call `salt`.
fn value(c: &Case, rank: usize, e: usize, salt: usize) -> f64 {
    if let Some(v) = c.constant {
        return v;
    }
    let unsigned = matches!(
        c.dtype,
        DataType::Uint8 | DataType::Uint32 | DataType::Uint64
    );
    let v = ((rank * 7 + e * 3 + salt) % 3) as f64;
    if unsigned { v } else { v - 1.0 }
}

fn encode_all(dtype: DataType, values: &[f64]) -> Vec<u8> {
    let size = dtype.size_bytes();
    let mut out = vec![0u8; values.len() * size];
    for (v, slot) in values.iter().zip(out.chunks_exact_mut(size)) {
        encode(dtype, *v, slot);
    }
    out
}

fn decode_all(dtype: DataType, bytes: &[u8]) -> Vec<f64> {
    bytes
        .chunks_exact(dtype.size_bytes())
        .map(|b| decode(dtype, b))
        .collect()
}

/// The reduction of `values` (every rank's, as stored) with `op`, as stored.
fn reduce(dtype: DataType, op: symmRedOp_t, values: &[f64]) -> f64 {
    let v = match op {
        symmRedOp_t::symmSum => values.iter().sum(),
        symmRedOp_t::symmProd => values.iter().product(),
        symmRedOp_t::symmMax => values.iter().copied().fold(f64::MIN, f64::max),
        symmRedOp_t::symmMin => values.iter().copied().fold(f64::MAX, f64::min),
        _ => values.iter().sum::<f64>() / values.len() as f64,
    };
    representable(dtype, v)
}

/// One rank process of the tests above.
#[test]
#[ignore = "a rank process of the machines tests"]
fn machine_rank() {
    let ranks: Vec<usize> = std::env::var("MACHINE_TEST_RANK")
        .unwrap()
        .split(',')
        .map(|r| r.parse().unwrap())
        .collect();
    // Several ranks in one process: a thread each.
    std::thread::scope(|scope| {
        for rank in ranks {
            scope.spawn(move || one_rank(rank));
        }
    });
}

/// Rank `rank`'s part of a machines test.
fn one_rank(rank: usize) {
    let nranks: usize = std::env::var("MACHINE_TEST_NRANKS")
        .unwrap()
        .parse()
        .unwrap();
    let id = id_from_hex(&std::env::var("MACHINE_TEST_ID").unwrap());
    let mode = std::env::var("MACHINE_TEST_MODE").unwrap();
    let mut comm = null_mut();
    // SAFETY: a valid out-pointer.
    let result = unsafe { symmCommInitRank(&mut comm, nranks as i32, id, rank as i32) };
    if mode == "refused-nccl" {
        assert_eq!(
            result,
            symmResult_t::symmSystemError,
            "{}",
            last_error(null_mut())
        );
        let message = last_error(null_mut());
        for needle in [
            "rank 3 could not load",
            "/nonexistent/libnccl.so.2",
            "SYMM_NCCL_LIBRARY",
        ] {
            assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        }
        println!("machine rank {rank}: refused without NCCL");
        return;
    }
    if let Some(machines) = mode.strip_prefix("refused:") {
        assert_eq!(
            result,
            symmResult_t::symmUnsupported,
            "{}",
            last_error(null_mut())
        );
        let message = last_error(null_mut());
        for needle in [machines, "SYMM_HOST_ID", "consecutive ranks"] {
            assert!(message.contains(needle), "{message:?} lacks {needle:?}");
        }
        println!("machine rank {rank}: refused as expected");
        return;
    }
    check(result, null_mut());
    let mut size = 0;
    // SAFETY: a valid out-pointer.
    check(unsafe { symmCommCount(comm, &mut size) }, comm);
    assert_eq!(size as usize, nranks);
    const HALF: usize = 2 << 20;
    let (base, window) = window_of_bytes(comm, 2 * HALF);
    let base = base as *mut u8;
    match mode.as_str() {
        "collectives" | "collectives-small" => {
            if mode == "collectives-small" {
                assert_eq!(backend(comm), "cuda");
            }
            for (salt, c) in cases().iter().enumerate() {
                // The simulated GPU interprets every kernel: small calls in device memory only.
                if mode == "collectives-small" && (c.count > 17 || c.staged) {
                    continue;
                }
                // The stand-in NCCL reduces no 16- or 8-bit floats.
                let narrow = c.dtype.is_float() && c.dtype.size_bytes() < 4;
                let reduces = matches!(c.collective, "all_reduce" | "reduce_scatter");
                let nccl = std::env::var("SYMM_RAILS").as_deref() == Ok("nccl");
                if nccl && narrow && reduces {
                    continue;
                }
                run_case(comm, rank, nranks, base, HALF, c, salt);
            }
            println!("machine rank {rank}: every call exact");
        }
        "differ:count" | "differ:root" | "differ:offset" => {
            let sentinel = vec![0x5au8; 64];
            put_bytes(base.wrapping_add(HALF), &sentinel);
            let started = Instant::now();
            let result = {
                if mode == "differ:offset" {
                    // Machine b's ranks agree among themselves, not with machine a's.
                    let shift = if rank >= 2 { 64 } else { 0 };
                    let recv = base.wrapping_add(HALF + shift);
                    symmAllReduce(
                        base as *const c_void,
                        recv as *mut c_void,
                        13,
                        symmDataType_t::symmFloat32 as _,
                        symmRedOp_t::symmSum as _,
                        comm,
                        null_mut(),
                    )
                } else if mode == "differ:count" {
                    let count = if rank == 2 { 14 } else { 13 };
                    symmAllReduce(
                        base as *const c_void,
                        base.wrapping_add(HALF) as *mut c_void,
                        count,
                        symmDataType_t::symmFloat32 as _,
                        symmRedOp_t::symmSum as _,
                        comm,
                        null_mut(),
                    )
                } else {
                    let root = if rank == 1 { 2 } else { 3 };
                    symmBroadcast(
                        base as *const c_void,
                        base.wrapping_add(HALF) as *mut c_void,
                        16,
                        symmDataType_t::symmFloat32 as _,
                        root,
                        comm,
                        null_mut(),
                    )
                }
            };
            let took = started.elapsed();
            let message = last_error(comm);
            assert_ne!(result, symmResult_t::symmSuccess);
            assert!(took < Duration::from_secs(10), "took {took:?}: {message}");
            assert!(
                message.contains("differs")
                    && message.contains("rank 0 made")
                    && message.contains("rank"),
                "{message}"
            );
            let named = match mode.as_str() {
                "differ:count" => "rank 2 made symmAllReduce of 14 f32 elements",
                "differ:offset" => "at byte 2097216",
                _ => "root 2",
            };
            assert!(message.contains(named), "{message}");
            assert_eq!(
                get_bytes(base.wrapping_add(HALF), 64),
                sentinel,
                "data moved"
            );
            // The communicator failed on every rank.
            let again = symmAllReduce(
                base as *const c_void,
                base.wrapping_add(HALF) as *mut c_void,
                4,
                symmDataType_t::symmFloat32 as _,
                symmRedOp_t::symmSum as _,
                comm,
                null_mut(),
            );
            assert_ne!(again, symmResult_t::symmSuccess);
            println!("machine rank {rank}: refused the differing call ({took:?}): {message}");
        }
        "killed" => {
            two_calls_rank_3_completes(comm, rank, nranks, base, HALF);
            if rank == 3 {
                // SAFETY: signals this process.
                unsafe { kill(getpid(), 9) };
            }
            std::thread::sleep(Duration::from_millis(500));
            let (took, message) = failing_all_reduce(comm, base, HALF);
            if rank < 2 {
                // Machine a hears it from the spanning root; machine b from its watch, or so.
                assert!(message.contains("rank 3"), "{message}");
            }
            println!("machine rank {rank}: saw the killed rank ({took:?}): {message}");
        }
        "lost-in-rail:all_reduce" | "lost-in-rail:all_gather" => {
            let all_reduce = mode.ends_with("all_reduce");
            let collective = if all_reduce {
                "all_reduce"
            } else {
                "all_gather"
            };
            run_case(
                comm,
                rank,
                nranks,
                base,
                HALF,
                &case(collective, DataType::Float32, 5),
                0,
            );
            let (s, r) = (
                base as *const c_void,
                base.wrapping_add(HALF) as *mut c_void,
            );
            let f32 = symmDataType_t::symmFloat32 as symmDataTypeRaw;
            let started = Instant::now();
            let result = if all_reduce {
                symmAllReduce(s, r, 5, f32, symmRedOp_t::symmSum as _, comm, null_mut())
            } else {
                symmAllGather(s, r, 5, f32, comm, null_mut())
            };
            let took = started.elapsed();
            let message = last_error(comm);
            assert_ne!(result, symmResult_t::symmSuccess, "rank {rank}");
            assert!(
                took < Duration::from_secs(10),
                "rank {rank} took {took:?}: {message}"
            );
            // From the spanning root, or from machine 1's own watch (rank 2 is its rank 0),
            // directly or relayed.
            let from_root = message.contains("rank 2 left the communicator");
            let from_machine = message.contains("machine 1, whose rank r is rank 2 + r")
                && message.contains("rank 0's process");
            assert!(from_root || from_machine, "rank {rank}: {message}");
            assert!(!message.contains("symmCommSplit"), "rank {rank}: {message}");
            println!("machine rank {rank}: saw the lost rank ({took:?}): {message}");
        }
        "float8-old-nccl" => {
            let (s, r) = (
                base as *const c_void,
                base.wrapping_add(HALF) as *mut c_void,
            );
            let f8 = symmDataType_t::symmFloat8e4m3 as symmDataTypeRaw;
            let result = symmAllGather(s, r, 4, f8, comm, null_mut());
            let message = last_error(comm);
            assert_eq!(result, symmResult_t::symmUnsupported, "{message}");
            assert!(message.contains("no float8 types"), "{message}");
            println!("machine rank {rank}: float8 refused");
        }
        "unsupported" => {
            let started = Instant::now();
            let (s, r) = (
                base as *const c_void,
                base.wrapping_add(HALF) as *mut c_void,
            );
            let f32 = symmDataType_t::symmFloat32 as symmDataTypeRaw;
            // Ranks 0 and 1 pair a send and a receive; ranks 2 and 3 make no such call.
            let refused = match rank {
                0 => symmSend(s, 4, f32, 1, comm, null_mut()),
                1 => symmRecv(r, 4, f32, 0, comm, null_mut()),
                _ => symmReduce(s, r, 4, f32, symmRedOp_t::symmSum as _, 0, comm, null_mut()),
            };
            assert_eq!(
                refused,
                symmResult_t::symmUnsupported,
                "{}",
                last_error(comm)
            );
            assert!(
                last_error(comm).contains("span machines"),
                "{}",
                last_error(comm)
            );
            check(symmGroupStart(), null_mut());
            let grouped = symmAllReduce(s, r, 4, f32, symmRedOp_t::symmSum as _, comm, null_mut());
            check(symmGroupEnd(), null_mut());
            assert_eq!(
                grouped,
                symmResult_t::symmUnsupported,
                "{}",
                last_error(comm)
            );
            assert!(started.elapsed() < Duration::from_secs(10));
            // Nothing was numbered: every rank's next call pairs and is exact.
            run_case(
                comm,
                rank,
                nranks,
                base,
                HALF,
                &case("all_reduce", DataType::Float32, 6),
                0,
            );
            assert_eq!(async_error(comm), symmResult_t::symmSuccess);
            println!("machine rank {rank}: refused alike and went on");
        }
        "frozen" => {
            run_case(
                comm,
                rank,
                nranks,
                base,
                HALF,
                &case("all_reduce", DataType::Float32, 5),
                0,
            );
            if rank >= 2 {
                std::thread::sleep(Duration::from_secs(6));
            }
            let started = Instant::now();
            let (s, r) = (
                base as *const c_void,
                base.wrapping_add(HALF) as *mut c_void,
            );
            let result = symmAllReduce(
                s,
                r,
                5,
                symmDataType_t::symmFloat32 as _,
                symmRedOp_t::symmSum as _,
                comm,
                null_mut(),
            );
            let took = started.elapsed();
            let message = last_error(comm);
            assert_ne!(result, symmResult_t::symmSuccess);
            // Every error names the timeout: this rank's own, or a machine peer's, relayed.
            assert!(message.contains("within the timeout"), "{message}");
            if rank < 2 {
                assert!(
                    took >= Duration::from_millis(2900) && took < Duration::from_secs(6),
                    "took {took:?}: {message}"
                );
            } else {
                assert!(took < Duration::from_secs(1), "took {took:?}: {message}");
            }
            println!("machine rank {rank}: saw the frozen machine ({took:?}): {message}");
        }
        "aborted" => {
            two_calls_rank_3_completes(comm, rank, nranks, base, HALF);
            if rank == 3 {
                check(symmCommAbort(comm), null_mut());
                println!("machine rank {rank}: saw the abort (its own)");
                return;
            }
            std::thread::sleep(Duration::from_millis(500));
            let (took, message) = failing_all_reduce(comm, base, HALF);
            assert!(message.contains("symmCommAbort"), "{message}");
            println!("machine rank {rank}: saw the abort ({took:?}): {message}");
        }
        "apart" => {
            run_case(
                comm,
                rank,
                nranks,
                base,
                HALF,
                &case("all_reduce", DataType::Float32, 5),
                0,
            );
            let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
            let mut files: Vec<String> = maps
                .lines()
                .filter(|l| l.contains("memfd:") || l.contains("/dev/shm"))
                .filter_map(|l| {
                    let fields: Vec<&str> = l.split_whitespace().collect();
                    Some(format!("{}:{}", fields.get(3)?, fields.get(4)?))
                })
                .collect();
            files.sort();
            files.dedup();
            println!("machine rank {rank}: memory files {}", files.join(","));
            // Every rank reads its maps before any rank leaves.
            run_case(
                comm,
                rank,
                nranks,
                base,
                HALF,
                &case("all_reduce", DataType::Float32, 5),
                1,
            );
        }
        other => panic!("unknown mode {other}"),
    }
    check(symmCommWindowDeregister(comm, window), comm);
    check(symmCommDestroy(comm), null_mut());
}

/// Calls 0 (checked) and 1 of the killed and abort modes: every rank has finished call 0 once
/// rank 3's call 1 returns (checked on rank 3); the others' call 1 may meet rank 3's end (it
/// fails then, as calls in flight do), so its result is not checked, only that it returns
/// within seconds (a rail call that met rank 3's end is aborted under it, not left to NCCL's
/// own wait).
fn two_calls_rank_3_completes(
    comm: symmComm_t,
    rank: usize,
    nranks: usize,
    base: *mut u8,
    half: usize,
) {
    run_case(
        comm,
        rank,
        nranks,
        base,
        half,
        &case("all_reduce", DataType::Float32, 5),
        0,
    );
    let (s, r) = (
        base as *const c_void,
        base.wrapping_add(half) as *mut c_void,
    );
    let f32 = symmDataType_t::symmFloat32 as symmDataTypeRaw;
    let started = Instant::now();
    let settled = symmAllReduce(s, r, 5, f32, symmRedOp_t::symmSum as _, comm, null_mut());
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(10),
        "rank {rank}: call 1 took {took:?}"
    );
    if rank == 3 {
        check(settled, comm);
    }
}

/// An all-reduce that must fail within 10 s: how long it took, and the error's message.
fn failing_all_reduce(comm: symmComm_t, base: *mut u8, half: usize) -> (Duration, String) {
    let started = Instant::now();
    let result = symmAllReduce(
        base as *const c_void,
        base.wrapping_add(half) as *mut c_void,
        5,
        symmDataType_t::symmFloat32 as _,
        symmRedOp_t::symmSum as _,
        comm,
        null_mut(),
    );
    let took = started.elapsed();
    let message = last_error(comm);
    assert_ne!(result, symmResult_t::symmSuccess);
    assert!(took < Duration::from_secs(10), "took {took:?}: {message}");
    (took, message)
}

unsafe extern "C" {
    fn kill(pid: i32, sig: i32) -> i32;
    fn getpid() -> i32;
}

/// Run `c` (call number `salt`) on this rank and check its result, and that an
/// out-of-place call left its send buffer alone.
fn run_case(
    comm: symmComm_t,
    rank: usize,
    nranks: usize,
    base: *mut u8,
    half: usize,
    c: &Case,
    salt: usize,
) {
    let dtype = c.dtype;
    let size = dtype.size_bytes();
    let root = c.root % nranks;
    let n = c.count;
    let (send_len, recv_len) = match c.collective {
        "all_gather" => (n, n * nranks),
        "reduce_scatter" => (n * nranks, n),
        _ => (n, n),
    };
    let inputs: Vec<Vec<f64>> = (0..nranks)
        .map(|r| {
            let raw: Vec<f64> = (0..send_len).map(|e| value(c, r, e, salt)).collect();
            decode_all(dtype, &encode_all(dtype, &raw))
        })
        .collect();
    let want: Vec<f64> = match c.collective {
        "all_reduce" => (0..n)
            .map(|e| {
                reduce(
                    dtype,
                    c.op,
                    &inputs.iter().map(|v| v[e]).collect::<Vec<_>>(),
                )
            })
            .collect(),
        "all_gather" => inputs.iter().flat_map(|v| v.iter().copied()).collect(),
        "reduce_scatter" => (0..n)
            .map(|e| {
                reduce(
                    dtype,
                    c.op,
                    &inputs.iter().map(|v| v[rank * n + e]).collect::<Vec<_>>(),
                )
            })
            .collect(),
        _ => inputs[root].clone(),
    };
    let mine = encode_all(dtype, &inputs[rank]);
    // Staged buffers live outside every window.
    let mut staged = vec![0u8; (send_len + recv_len) * size + 64];
    let area = if c.staged { staged.as_mut_ptr() } else { base };
    let (send, recv) = match (c.in_place, c.collective) {
        (false, _) => (
            area,
            if c.staged {
                area.wrapping_add(send_len * size)
            } else {
                area.wrapping_add(half)
            },
        ),
        (true, "all_gather") => (area.wrapping_add(rank * n * size), area),
        (true, "reduce_scatter") => (area, area.wrapping_add(rank * n * size)),
        (true, _) => (area, area),
    };
    let fill = vec![0xeeu8; recv_len * size];
    put_bytes(recv, &fill);
    put_bytes(send, &mine);
    let (d, o) = (dtype as i32 as symmDataTypeRaw, c.op as i32 as symmRedOpRaw);
    let (s, r) = (send as *const c_void, recv as *mut c_void);
    // The buffers lie in the window or in `staged`, sized for the call.
    let result = match c.collective {
        "all_reduce" => symmAllReduce(s, r, n, d, o, comm, null_mut()),
        "all_gather" => symmAllGather(s, r, n, d, comm, null_mut()),
        "reduce_scatter" => symmReduceScatter(s, r, n, d, o, comm, null_mut()),
        _ => symmBroadcast(s, r, n, d, root as i32, comm, null_mut()),
    };
    check(result, comm);
    let got = decode_all(dtype, &get_bytes(recv, recv_len * size));
    assert_eq!(got, want, "rank {rank}: call {salt} {c:?}");
    if !c.in_place {
        assert_eq!(
            get_bytes(send, send_len * size),
            mine,
            "rank {rank}: call {salt} {c:?} changed its send buffer"
        );
    }
}
