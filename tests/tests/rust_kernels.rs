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

/// The same kernel under a name its (stand-in) PTX does not declare.
static MISNAMED: Kernel<(WindowArg<f32>, u64)> = Kernel::new(
    "tuoch",
    ".version 8.0\n.visible .entry touch(\n)\n",
    |(window, n)| touch(window, n),
);

/// A window argument of a window the launching scope does not hold, a grid of no block, a
/// launch inside a group, more blocks than a window has barrier slots and a name the kernel's
/// PTX does not declare are refused, naming what is wrong, with nothing run.
#[test]
fn launches_the_scope_cannot_vouch_for_are_refused() {
    use_backend_from_env();
    let comm = Comm::init_all(&[0]).unwrap().pop().unwrap();
    let stream = Stream::new(&comm).unwrap();
    let mut outer: Window<f32> = comm.window(8).unwrap();
    let mut inner: Window<f32> = comm.window(8).unwrap();
    let messages = scope(|s| {
        let held = s.bind(&mut outer, &stream);
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
        [in_inner, empty, grouped, wide, misnamed]
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
    drop((outer, inner));
    comm.destroy().unwrap();
}
