//! `symmReduce` on the host backend, through the C ABI, one thread driving every rank in a
//! group: 1 to 6 ranks, every root, every operator, integers (wrapping, exact) and floats whose
//! results are exact (small integers), odd counts, in place on the root and not, NULL receive
//! buffers off the root; every byte of every window checked against a reference built from the
//! inputs (only the root's receive buffer changes). Then the refusals, and reduces mixed with
//! all-reduces on one window.

use symm::*;
use symm_tests::*;

/// Bytes of each window.
const WINDOW: usize = 2 * 8 * 1031 + 512;

/// An element type of the cases, with its reference reduction.
#[derive(Clone, Copy, Debug)]
enum Elem {
    Int32,
    Float64,
}

impl Elem {
    fn raw(self) -> i32 {
        match self {
            Elem::Int32 => symmDataType_t::symmInt32 as i32,
            Elem::Float64 => symmDataType_t::symmFloat64 as i32,
        }
    }

    fn size(self) -> usize {
        match self {
            Elem::Int32 => 4,
            Elem::Float64 => 8,
        }
    }

    /// A random input: any 32-bit integer; a small integer as a float (every sum, product,
    /// maximum and minimum of six is exact).
    fn random(self, rng: &mut Rng) -> Vec<u8> {
        match self {
            Elem::Int32 => (rng.next_u64() as i32).to_ne_bytes().to_vec(),
            Elem::Float64 => (((rng.next_u64() % 9) as f64) - 4.0).to_ne_bytes().to_vec(),
        }
    }

    /// The reduction of `inputs` (one element's bytes per rank) with `op`, as bytes.
    fn reduce(self, op: symmRedOp_t, inputs: &[&[u8]]) -> Vec<u8> {
        let n = inputs.len();
        match self {
            Elem::Int32 => {
                let values = inputs
                    .iter()
                    .map(|b| i32::from_ne_bytes((*b).try_into().unwrap()) as i128);
                let exact = match op {
                    symmRedOp_t::symmSum => values.fold(0i128, i128::wrapping_add),
                    symmRedOp_t::symmProd => values.fold(1i128, i128::wrapping_mul),
                    symmRedOp_t::symmMax => values.max().unwrap(),
                    symmRedOp_t::symmMin => values.min().unwrap(),
                    symmRedOp_t::symmAvg => values.sum::<i128>() / n as i128,
                };
                (exact as i32).to_ne_bytes().to_vec()
            }
            Elem::Float64 => {
                let values = inputs
                    .iter()
                    .map(|b| f64::from_ne_bytes((*b).try_into().unwrap()));
                let exact = match op {
                    symmRedOp_t::symmSum => values.sum(),
                    symmRedOp_t::symmProd => values.product(),
                    symmRedOp_t::symmMax => values.fold(f64::MIN, f64::max),
                    symmRedOp_t::symmMin => values.fold(f64::MAX, f64::min),
                    symmRedOp_t::symmAvg => values.sum::<f64>() / n as f64,
                };
                exact.to_ne_bytes().to_vec()
            }
        }
    }
}

const OPS: [symmRedOp_t; 5] = [
    symmRedOp_t::symmSum,
    symmRedOp_t::symmProd,
    symmRedOp_t::symmMax,
    symmRedOp_t::symmMin,
    symmRedOp_t::symmAvg,
];

/// Random bytes in every rank's whole window, and `count` random elements at `send`; returns
/// the windows' bytes.
fn fill(
    buffers: &[RankBuffer],
    elem: Elem,
    send: usize,
    count: usize,
    rng: &mut Rng,
) -> Vec<Vec<u8>> {
    buffers
        .iter()
        .map(|b| {
            let mut bytes: Vec<u8> = (0..WINDOW).map(|_| rng.next_u64() as u8).collect();
            for i in 0..count {
                let at = send + i * elem.size();
                bytes[at..at + elem.size()].copy_from_slice(&elem.random(rng));
            }
            // SAFETY: host memory of the window, WINDOW bytes.
            unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), b.base, WINDOW) };
            bytes
        })
        .collect()
}

/// One reduce on every rank in a group, the send buffer at `send` and the root's receive
/// buffer at `recv` (bytes into the window; in place when equal); the other ranks pass NULL
/// as their receive buffer on odd ranks, and an unused address on even ones. Checks every
/// window byte for byte.
#[allow(clippy::too_many_arguments)]
fn check_case(
    buffers: &[RankBuffer],
    elem: Elem,
    op: symmRedOp_t,
    count: usize,
    root: usize,
    (send, recv): (usize, usize),
    seed: u64,
) {
    let nranks = buffers.len();
    let size = elem.size();
    let mut rng = Rng(seed);
    let before = fill(buffers, elem, send, count, &mut rng);
    check(symmGroupStart(), std::ptr::null_mut());
    for (r, b) in buffers.iter().enumerate() {
        // SAFETY: offsets inside the window (the cases keep them so).
        let (s, d) = unsafe { (b.base.add(send), b.base.add(recv)) };
        let d = if r != root && r % 2 == 1 {
            std::ptr::null_mut()
        } else {
            d
        };
        let result = symmReduce(
            s.cast(),
            d.cast(),
            count,
            elem.raw(),
            op as i32,
            root as i32,
            b.comm,
            std::ptr::null_mut(),
        );
        check(result, b.comm);
    }
    check(symmGroupEnd(), std::ptr::null_mut());
    let mut want = before.clone();
    for i in 0..count {
        let at = send + i * size;
        let inputs: Vec<&[u8]> = before.iter().map(|w| &w[at..at + size]).collect();
        let out = recv + i * size;
        want[root][out..out + size].copy_from_slice(&elem.reduce(op, &inputs));
    }
    let case = format!(
        "reduce {elem:?} {op:?}: {nranks} ranks, count {count}, root {root}, send {send}, recv {recv}"
    );
    for (r, b) in buffers.iter().enumerate() {
        // SAFETY: host memory of the window.
        let got = unsafe { std::slice::from_raw_parts(b.base, WINDOW) };
        if let Some(at) = (0..WINDOW).find(|&i| got[i] != want[r][i]) {
            panic!(
                "{case}: rank {r}, byte {at}: {} instead of {}",
                got[at], want[r][at]
            );
        }
    }
}

/// Every operator on 1 to 6 ranks to every root, both element types, odd counts, the buffers
/// apart or in place.
#[test]
fn reduce_matches_the_reference_for_1_to_6_ranks() {
    use_host_backend();
    let counts = [1usize, 7, 1031, 130];
    let mut seed = 0u64;
    for nranks in 1..=6 {
        let comms = init_all(nranks);
        let buffers = alloc_windows(&comms, WINDOW);
        for root in 0..nranks {
            for (k, elem) in [Elem::Int32, Elem::Float64].into_iter().enumerate() {
                for (j, op) in OPS.into_iter().enumerate() {
                    let count = counts[(k + j + root + nranks) % counts.len()];
                    let bytes = count * elem.size();
                    seed += 1;
                    let placement = if (seed as usize + root).is_multiple_of(2) {
                        (64, 64)
                    } else {
                        (64 + elem.size(), (64 + bytes + 16).next_multiple_of(16))
                    };
                    check_case(&buffers, elem, op, count, root, placement, seed);
                }
            }
        }
        teardown(buffers);
    }
}

/// Reduces and all-reduces one after another on one window, many calls, every result exact:
/// the kernel they share keeps the ranks' barriers in step whichever flags a call carries.
#[test]
fn reduces_mixed_with_all_reduces_on_one_window() {
    use_host_backend();
    let nranks = 4;
    let comms = init_all(nranks);
    let buffers = alloc_windows(&comms, WINDOW);
    let mut rng = Rng(77);
    for call in 0..60u64 {
        let count = [1usize, 33, 1031][call as usize % 3];
        let op = OPS[call as usize % OPS.len()];
        if call % 3 == 2 {
            let inputs: Vec<Vec<f32>> = (0..nranks)
                .map(|_| (0..count).map(|_| (rng.next_u64() % 7) as f32).collect())
                .collect();
            for (b, input) in buffers.iter().zip(&inputs) {
                // SAFETY: inside the window.
                unsafe { write_f32(b.base.add(64), input) };
            }
            check(symmGroupStart(), std::ptr::null_mut());
            for b in &buffers {
                // SAFETY: inside the window.
                let p = unsafe { b.base.add(64) };
                check(
                    symmAllReduce(
                        p.cast(),
                        p.cast(),
                        count,
                        symmDataType_t::symmFloat32 as i32,
                        symmRedOp_t::symmSum as i32,
                        b.comm,
                        std::ptr::null_mut(),
                    ),
                    b.comm,
                );
            }
            check(symmGroupEnd(), std::ptr::null_mut());
            for b in &buffers {
                // SAFETY: inside the window.
                let got = unsafe { read_f32(b.base.add(64), count) };
                for (i, value) in got.iter().enumerate() {
                    let exact: f32 = inputs.iter().map(|x| x[i]).sum();
                    assert_eq!(*value, exact, "call {call}, all-reduce index {i}");
                }
            }
        } else {
            let root = (call as usize * 3) % nranks;
            let placement = if call % 2 == 0 { (64, 64) } else { (64, 8192) };
            check_case(
                &buffers,
                Elem::Int32,
                op,
                count,
                root,
                placement,
                1000 + call,
            );
        }
    }
    teardown(buffers);
}

/// The refusals, each an invalid-argument error naming what is wrong, nothing written; after
/// them the ranks are still in step.
#[test]
fn bad_roots_ops_and_overlapping_buffers_are_refused() {
    use_host_backend();
    let nranks = 3;
    let comms = init_all(nranks);
    let buffers = alloc_windows(&comms, WINDOW);
    let i32_ = symmDataType_t::symmInt32 as i32;
    let sum = symmRedOp_t::symmSum as i32;
    let null = std::ptr::null_mut();
    let before = fill(&buffers, Elem::Int32, 64, 4, &mut Rng(7));
    for b in &buffers {
        let at = |bytes: usize| b.base.wrapping_add(bytes).cast::<std::ffi::c_void>();
        type Call<'a> = Box<dyn Fn() -> symmResult_t + 'a>;
        let refusals: [(Call, &str); 5] = [
            (
                Box::new(|| symmReduce(at(64), at(1024), 4, i32_, sum, 3, b.comm, null)),
                "root = 3",
            ),
            (
                Box::new(|| symmReduce(at(64), at(1024), 4, i32_, 17, 0, b.comm, null)),
                "op = 17",
            ),
            (
                Box::new(|| symmReduce(at(64), at(1024), 4, 99, sum, 0, b.comm, null)),
                "datatype = 99",
            ),
            (
                Box::new(|| symmReduce(std::ptr::null(), at(1024), 4, i32_, sum, 0, b.comm, null)),
                "sendbuff is NULL",
            ),
            (
                Box::new(|| {
                    symmReduce(at(64), at(1024), usize::MAX / 2, i32_, sum, 0, b.comm, null)
                }),
                "overflow",
            ),
        ];
        for (call, says) in refusals {
            assert_eq!(call(), symmResult_t::symmInvalidArgument);
            let message = last_error(b.comm);
            assert!(message.contains(says), "{message:?} does not say {says:?}");
        }
    }
    for (r, b) in buffers.iter().enumerate() {
        // SAFETY: host memory of the window.
        let got = unsafe { std::slice::from_raw_parts(b.base, WINDOW) };
        assert!(
            got == before[r].as_slice(),
            "rank {r}: a refused call wrote"
        );
    }
    // Still in step.
    check_case(
        &buffers,
        Elem::Int32,
        symmRedOp_t::symmSum,
        5,
        2,
        (64, 1024),
        11,
    );
    // The root alone checks its receive buffer: one overlapping its send buffer (4 ints from
    // 64) is refused on the root only. In a group that one thread drives, the group's end
    // refuses the whole group, naming the root's refusal, and launches nothing of it.
    let before = fill(&buffers, Elem::Int32, 64, 4, &mut Rng(8));
    check(symmGroupStart(), std::ptr::null_mut());
    for (r, b) in buffers.iter().enumerate() {
        let recv = if r == 1 { 68 } else { 1024 };
        let result = symmReduce(
            b.base.wrapping_add(64).cast(),
            b.base.wrapping_add(recv).cast(),
            4,
            i32_,
            sum,
            1,
            b.comm,
            null,
        );
        if r == 1 {
            assert_eq!(result, symmResult_t::symmInvalidArgument);
            assert!(
                last_error(b.comm).contains("overlap"),
                "{}",
                last_error(b.comm)
            );
        } else {
            check(result, b.comm);
        }
    }
    assert_ne!(symmGroupEnd(), symmResult_t::symmSuccess);
    let message = last_error(std::ptr::null_mut());
    assert!(
        message.contains("overlap") && message.contains("nothing of this group was launched"),
        "{message}"
    );
    for (r, b) in buffers.iter().enumerate() {
        // SAFETY: host memory of the window.
        let got = unsafe { std::slice::from_raw_parts(b.base, WINDOW) };
        assert!(
            got == before[r].as_slice(),
            "rank {r}: a refused group wrote"
        );
    }
    check_case(
        &buffers,
        Elem::Float64,
        symmRedOp_t::symmMax,
        5,
        0,
        (64, 64),
        12,
    );
    teardown(buffers);
}
