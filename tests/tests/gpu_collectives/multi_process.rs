//! Communicators that span processes: a rank started in a child process (this binary run
//! again for one test), a process driving two GPUs with a rank in another process, and two
//! processes on one GPU.

use crate::{download, multiprocessors, synchronize, upload};
use cudarc::driver::{result, sys};
use std::ptr::null_mut;
use symm::*;
use symm_tests::*;

/// Environment of a rank this file's multi-process tests start in a child process:
/// `scenario,rank,nranks,device,ranks on its GPU,id in hex`.
const CHILD_RANK_ENV: &str = "SYMM_GPU_TEST_CHILD";

/// Make `device`'s primary context current on this thread (the device `symmCommInitRank`
/// joins with).
fn use_device(device: i32) {
    // SAFETY: the caller checked that `device` exists; its primary context is retained for
    // the process.
    unsafe {
        result::init().unwrap();
        let cu = result::device::get(device).unwrap();
        let context = result::primary_ctx::retain(cu).unwrap();
        result::ctx::set_current(context).unwrap();
    }
}

fn device_count() -> i32 {
    let mut count = 0;
    // SAFETY: writes one int; the library initialized the driver.
    unsafe {
        result::init().unwrap();
        sys::cuDeviceGetCount(&mut count).result().unwrap();
    }
    count
}

/// One rank of a communicator of several processes, on `device`, whose GPU holds `on_gpu` of
/// the ranks (in any process): join, check that the grids of every rank on the GPU fit it at
/// once, register a window and run three all-reduces of small integers (exact in f32),
/// checked against the sum over the ranks.
fn multi_process_rank(rank: usize, nranks: usize, device: i32, on_gpu: usize, id: symmUniqueId) {
    use_device(device);
    let mut comm = null_mut();
    // SAFETY: valid out-pointer.
    check(
        unsafe { symmCommInitRank(&mut comm, nranks as i32, id, rank as i32) },
        null_mut(),
    );
    assert_eq!(
        backend(comm),
        "cuda",
        "run the GPU set with SYMM_BACKEND=cuda"
    );
    let sms = multiprocessors(device);
    let max_blocks = symm::internals::Comm::from_handle(comm).unwrap().max_blocks as usize;
    assert!(
        max_blocks * on_gpu <= sms,
        "rank {rank}: {on_gpu} ranks of up to {max_blocks} blocks each on a GPU of {sms} SMs"
    );
    let count = 1000;
    let mut buffer = alloc(&[comm], 8 * count);
    check(symmGroupStart(), null_mut());
    register_in_group(&mut buffer);
    check(symmGroupEnd(), null_mut());
    let base = buffer[0].base;
    let value = |r: usize, round: usize, i: usize| ((r + 1 + round) * (i % 7 + 1)) as f32;
    for round in 0..3 {
        let input: Vec<f32> = (0..count).map(|i| value(rank, round, i)).collect();
        upload(base, &input);
        // SAFETY: both halves of the window.
        check(
            all_reduce_f32_sum(comm, base, unsafe { base.add(4 * count) }, count),
            comm,
        );
        synchronize();
        // SAFETY: the second half of the window.
        let got = download(unsafe { base.add(4 * count) }, count);
        for (i, g) in got.iter().enumerate() {
            let want: f32 = (0..nranks).map(|r| value(r, round, i)).sum();
            assert_eq!(*g, want, "rank {rank}, round {round}, element {i}");
        }
    }
    teardown(buffer);
}

/// The name libtest gives `gpu_child_rank_of_a_multi_process_test` (its module path, less the
/// crate's name), for `--exact`.
fn child_test_name() -> String {
    match module_path!().split_once("::") {
        Some((_, module)) => format!("{module}::gpu_child_rank_of_a_multi_process_test"),
        None => "gpu_child_rank_of_a_multi_process_test".to_string(),
    }
}

/// Run ranks `here` (with their devices) in threads of this process and `children` in
/// child processes, one each, of a communicator of `here.len() + children.len()` ranks;
/// `on_gpu(rank)` is how many ranks share that rank's GPU.
fn run_multi_process(
    scenario: &str,
    here: &[(usize, i32)],
    children: &[(usize, i32)],
    on_gpu: fn(usize) -> usize,
) {
    let nranks = here.len() + children.len();
    let mut id = symmUniqueId {
        internal: [0; SYMM_UNIQUE_ID_BYTES],
    };
    // SAFETY: valid out-pointer.
    check(unsafe { symmGetUniqueId(&mut id) }, null_mut());
    let child_test = child_test_name();
    let processes: Vec<_> = children
        .iter()
        .map(|&(rank, device)| {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--ignored",
                    "--exact",
                    child_test.as_str(),
                    "--test-threads=1",
                    "--nocapture",
                ])
                .env(
                    CHILD_RANK_ENV,
                    format!(
                        "{scenario},{rank},{nranks},{device},{},{}",
                        on_gpu(rank),
                        id_to_hex(&id)
                    ),
                )
                .spawn()
                .unwrap()
        })
        .collect();
    std::thread::scope(|scope| {
        for &(rank, device) in here {
            scope.spawn(move || multi_process_rank(rank, nranks, device, on_gpu(rank), id));
        }
    });
    for (mut child, (rank, _)) in processes.into_iter().zip(children) {
        let status = child.wait().unwrap();
        assert!(
            status.success(),
            "{scenario}: rank {rank}'s process: {status}"
        );
    }
}

gpu_test! {
    /// The rank a multi-process test started in this process (does nothing when run by itself).
    fn gpu_child_rank_of_a_multi_process_test() {
        let Ok(text) = std::env::var(CHILD_RANK_ENV) else {
            return;
        };
        let fields: Vec<&str> = text.split(',').collect();
        let number = |i: usize| fields[i].parse::<usize>().unwrap();
        multi_process_rank(
            number(1),
            number(2),
            number(3) as i32,
            number(4),
            id_from_hex(fields[5]),
        );
    }
}

gpu_test! {
    /// One process drives two GPUs (ranks 0 and 1 on devices 0 and 1) and another process holds
    /// rank 2 (device 2): windows and signal pads are then CUDA VMM memory, which a device may
    /// touch only when `cuMemSetAccess` names it, so rank 0's kernel reading rank 1's window
    /// needs device 0 to be granted access to it (peer access between the contexts does not
    /// cover VMM memory). On the simulated GPU, a missing grant is an illegal address.
    fn gpu_a_process_with_two_gpus_and_a_rank_in_another_process() {
        if device_count() < 3 {
            eprintln!("skipped: needs 3 devices");
            return;
        }
        run_multi_process("two-gpus-here", &[(0, 0), (1, 1)], &[(2, 2)], |_| 1);
    }
}

gpu_test! {
    /// Two processes, one rank each, on one GPU: each rank's grids are sized for both ranks of
    /// the GPU (a rank of another process on the same GPU counts, found by the GPU's UUID), and
    /// the all-reduces are right.
    fn gpu_two_processes_on_one_gpu_size_their_grids_for_both() {
        run_multi_process("one-gpu-two-processes", &[(0, 0)], &[(1, 0)], |_| 2);
    }
}
