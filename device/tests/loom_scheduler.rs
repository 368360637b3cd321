//! Loom model of the software work source of Cluster Launch Control's scheduler: every interleaving (up to a preemption bound) of a few ranks'
//! blocks, on loom's weak memory model. Shared setup: `loom_support`. Run with
//! `RUSTFLAGS="--cfg loom" cargo test -p symm-device --release --test loom_scheduler --target-dir
//! target/loom` (`cargo xtask test` runs every `loom_*` file).

#![cfg(loom)]

mod loom_support;

use loom_support::*;

// ---------------------------------------------------------------------------------------------
// Software work source.

/// Launches over `tiles` tiles on one state array: the first with every block resident, the
/// others `resident` at a time; each tile's counter (a loom cell, so that two blocks running
/// one tile at once are reported) must count one run per launch.
fn software_source(tiles: u32, resident: &[u32]) {
    let mut state = vec![0u32; SoftwareSource::state_words(tiles)];
    let state = state.as_mut_ptr() as u64;
    for word in 0..SoftwareSource::state_words(tiles) {
        // Counters, epoch and claims are atomic (the epoch is also read plainly at the start of
        // a launch); the response slots are plain.
        let kind = if word < 3 + tiles as usize {
            WordKind::AtomicU32
        } else {
            WordKind::PlainU32
        };
        // SAFETY: inside the state array; no grid runs yet.
        unsafe { model_word(state + 4 * word as u64, kind) };
    }
    let runs = Payload::new(tiles as usize);
    let kernel = || {
        // SAFETY: one block per tile; the state array is sized for `tiles` and outlives the
        // launches.
        let source = unsafe { SoftwareSource::new(state as *mut u32, tiles) };
        for_each_tile::<Greedy, _>(source, |tile| {
            if arch::thread_idx_x() == 0 {
                let t = tile.0 as usize;
                runs.write(t, runs.read(t) + 1);
            }
        });
    };
    let launch = |k: usize, run: &dyn Fn()| {
        run();
        for tile in 0..tiles as usize {
            assert_eq!(
                runs.read(tile),
                k as u64 + 1,
                "tile {tile} after launch {k}"
            );
        }
    };
    launch(0, &|| run_grid(tiles, 1, &kernel));
    for (k, &r) in resident.iter().enumerate() {
        launch(k + 1, &|| run_grid_with_residency(tiles, 1, r, &kernel));
    }
}

/// Two tiles, three launches (all resident; then one block at a time, twice): every tile runs
/// exactly once per launch, and the last block's reset lets the next launch start over.
#[test]
fn software_source_runs_every_tile_once_across_launches() {
    explore(|| software_source(2, &[1, 1]));
}
