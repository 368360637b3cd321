//! Launches of a user's kernel (`Scope::launch`) that the scope cannot vouch for are refused by
//! name, with nothing run. The kernels themselves run in `examples/rust` (host backend and
//! simulated GPU).

use symm::{Comm, Kernel, Stream, Window, WindowArg, group, scope};
use symm_tests::use_backend_from_env;

symm_device::kernel! {
    /// Opens its window and does nothing with it.
    fn touch(block, window: WindowArg<f32>, n: u64) {
        let _ = n;
        let _ = block.window(window, |_, _, _| ());
    }
}

/// The kernel as the launch knows it: its entry's name in its crate's PTX (none here: the host
/// backend runs the host form) and the host form.
static TOUCH: Kernel<(WindowArg<f32>, u64)> =
    Kernel::new("touch", "", |(window, n)| touch(window, n));

symm_device::kernel! {
    /// Opens two windows and does nothing with them.
    fn touch_two(block, first: WindowArg<f32>, second: WindowArg<f32>) {
        let _ = block.window(first, |_, _, _| ());
        let _ = block.window(second, |_, _, _| ());
    }
}

static TOUCH_TWO: Kernel<(WindowArg<f32>, WindowArg<f32>)> =
    Kernel::new("touch_two", "", |(first, second)| touch_two(first, second));

/// The same kernel under a name its (stand-in) PTX does not declare.
static MISNAMED: Kernel<(WindowArg<f32>, u64)> = Kernel::new(
    "tuoch",
    ".version 8.0\n.visible .entry touch(\n)\n",
    |(window, n)| touch(window, n),
);

/// A window argument of a window the launching scope does not hold, a grid of no block, a
/// launch inside a group, more blocks than a window has barrier slots, a name the kernel's PTX
/// does not declare, one window passed twice and (on the cuda backend, where streams are apart)
/// a window bound to another stream are refused, naming what is wrong, with nothing run.
#[test]
fn launches_the_scope_cannot_vouch_for_are_refused() {
    use_backend_from_env();
    let comm = Comm::init_all(&[0]).unwrap().pop().unwrap();
    let stream = Stream::new(&comm).unwrap();
    let mut outer: Window<f32> = comm.window(8).unwrap();
    let mut inner: Window<f32> = comm.window(8).unwrap();
    let second_stream = Stream::new(&comm).unwrap();
    let mut on_second: Window<f32> = comm.window(8).unwrap();
    let messages = scope(|s| {
        let held = s.bind(&mut outer, &stream);
        let other = s.bind(&mut on_second, &second_stream);
        let foreign = held.kernel_arg();
        let in_inner = scope(|t| {
            let bound = t.bind(&mut inner, &stream);
            t.launch(&bound, &TOUCH, 1, 1, (foreign, 4))
                .unwrap_err()
                .to_string()
        })
        .unwrap();
        let empty = s
            .launch(&held, &TOUCH, 0, 32, (held.kernel_arg(), 4))
            .unwrap_err()
            .to_string();
        let grouped = group(|| {
            Ok(s.launch(&held, &TOUCH, 1, 1, (held.kernel_arg(), 4))
                .unwrap_err()
                .to_string())
        })
        .unwrap();
        let wide = s
            .launch(&held, &TOUCH, 65, 1, (held.kernel_arg(), 4))
            .unwrap_err()
            .to_string();
        let misnamed = s
            .launch(&held, &MISNAMED, 1, 1, (held.kernel_arg(), 4))
            .unwrap_err()
            .to_string();
        let twice = s
            .launch(
                &held,
                &TOUCH_TWO,
                1,
                1,
                (held.kernel_arg(), held.kernel_arg()),
            )
            .unwrap_err()
            .to_string();
        let elsewhere = s
            .launch(
                &held,
                &TOUCH_TWO,
                1,
                1,
                (held.kernel_arg(), other.kernel_arg()),
            )
            .map_or_else(|e| e.to_string(), |()| "launched".to_string());
        [in_inner, empty, grouped, wide, misnamed, twice, elsewhere]
    })
    .unwrap();
    assert!(
        messages[0].contains("is not a window bound to this scope"),
        "{}",
        messages[0]
    );
    assert!(messages[1].contains("grid = 0"), "{}", messages[1]);
    assert!(messages[2].contains("inside a group"), "{}", messages[2]);
    assert!(
        messages[3].contains("grid = 65 blocks for kernel touch"),
        "{}",
        messages[3]
    );
    assert!(
        messages[4].contains("declares no entry of that name"),
        "{}",
        messages[4]
    );
    assert!(
        messages[5].contains("names a window an earlier argument already names"),
        "{}",
        messages[5]
    );
    if comm.backend() == "cuda" {
        assert!(
            messages[6].contains("bound to another stream than the launch's"),
            "{}",
            messages[6]
        );
    } else {
        // The host backend has one stream (work runs in the calling thread, in call order).
        assert_eq!(messages[6], "launched");
    }
    drop((outer, inner, on_second));
    comm.destroy().unwrap();
}

symm_device::kernel! {
    /// Rank 0 sums `[0, n)` in the kernel, the others `[n, 2n)`: the same barriers, other calls.
    fn sums_that_differ(block, window: WindowArg<f32>, n: u64) {
        let _ = block.window(window, |block, win, mut slot| {
            let span = if win.rank() == 0 { win.span(0..n) } else { win.span(n..2 * n) };
            if let Some(span) = span {
                let _ = symm_device::kernel::all_reduce(block, win, &mut slot, span, symm_device::kernel::Sum);
            }
        });
    }
}

static SUMS_THAT_DIFFER: Kernel<(WindowArg<f32>, u64)> =
    Kernel::new("sums_that_differ", "", |(window, n)| {
        sums_that_differ(window, n)
    });

/// Ranks whose kernels make different calls on a window (an in-kernel all-reduce of different
/// spans) get an error on every rank that says so, promptly, with the window untouched.
#[test]
fn kernels_making_different_calls_fail_every_rank_by_name() {
    use_backend_from_env();
    if std::env::var("SYMM_BACKEND").is_ok_and(|b| b == "cuda") {
        return; // host forms only here: the example's kernels run from PTX
    }
    let nranks = 2;
    let n = 16usize;
    let id = symm::UniqueId::new().unwrap();
    let started = std::time::Instant::now();
    let messages: Vec<String> = std::thread::scope(|s| {
        let ranks: Vec<_> = (0..nranks)
            .map(|rank| {
                let id = &id;
                s.spawn(move || {
                    let comm = Comm::init_rank(nranks, id, rank).unwrap();
                    let stream = Stream::new(&comm).unwrap();
                    let mut window: Window<f32> = comm.window(2 * n).unwrap();
                    window.write(0, &vec![1.0; 2 * n]).unwrap();
                    let outcome = scope(|s| {
                        let bound = s.bind(&mut window, &stream);
                        s.launch(
                            &bound,
                            &SUMS_THAT_DIFFER,
                            2,
                            8,
                            (bound.kernel_arg(), n as u64),
                        )
                    });
                    let message = match outcome {
                        Ok(Ok(())) => comm
                            .async_error()
                            .err()
                            .map_or_else(|| "no error".to_string(), |e| e.to_string()),
                        Ok(Err(e)) | Err(e) => e.to_string(),
                    };
                    let untouched = window.to_vec().unwrap().iter().all(|v| *v == 1.0);
                    assert!(untouched, "rank {rank}: the window was written");
                    drop(window);
                    let _ = comm.destroy();
                    message
                })
            })
            .collect();
        ranks.into_iter().map(|r| r.join().unwrap()).collect()
    });
    assert!(
        started.elapsed().as_secs() < 5,
        "took {:?}",
        started.elapsed()
    );
    for (rank, message) in messages.iter().enumerate() {
        assert!(
            message.contains("made different calls on a window"),
            "rank {rank}: {message}"
        );
    }
}
