//! `cargo xtask sim`: the simulated GPU. Builds the fake CUDA driver (`sim/cuda`, over the PTX
//! interpreter `sim/`) and lays it out as `libcuda.so.1` in `target/sim/`, so that
//! `LD_LIBRARY_PATH=target/sim SYMM_BACKEND=cuda <program>` runs any program on it.
//!
//! `cargo xtask sim --test`: what CI runs on the simulated GPU (see [`fn@test`]).

use crate::{cargo, root, run};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Build the fake driver in release and return the directory holding `libcuda.so.1`.
///
/// Laid out as the real driver is, one library: `libcuda.so.1` (its SONAME, see
/// `sim/cuda/build.rs`) and `libcuda.so` a link to it. cudarc opens `libcuda.so` when it
/// exists, CUDA's runtime and programs linked with `-lcuda` open `libcuda.so.1`; two copies
/// would give such a process two drivers, each with its own devices, contexts and memory.
pub fn build() -> Result<PathBuf, String> {
    run(cargo().args(["build", "--release", "-p", "symm-sim-cuda"]))?;
    let root = root();
    let built = root.join("target/release/libsymm_fake_cuda.so");
    let dir = root.join("target/sim");
    std::fs::create_dir_all(&dir).map_err(|e| format!("creating {dir:?}: {e}"))?;
    let library = dir.join("libcuda.so.1");
    let _ = std::fs::remove_file(&library);
    std::fs::copy(&built, &library)
        .map_err(|e| format!("copying {built:?} to {library:?}: {e}"))?;
    let link = dir.join("libcuda.so");
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("libcuda.so.1", &link)
        .map_err(|e| format!("linking {link:?} to libcuda.so.1: {e}"))?;
    Ok(dir)
}

/// `cargo xtask sim [--test]`.
pub fn sim(args: &[String]) -> Result<(), String> {
    match args.first().map(String::as_str) {
        None => {
            let dir = build()?;
            println!("{}", dir.display());
            println!(
                "run a program on the simulated GPU: LD_LIBRARY_PATH={} SYMM_BACKEND=cuda <program>",
                dir.display()
            );
            Ok(())
        }
        Some("--test") => test(),
        Some(other) => Err(format!("usage: cargo xtask sim [--test] (not {other})")),
    }
}

/// Settings of every run on the simulated GPU: the GPU set at its simulated size (every kernel
/// still runs), bounded waits of 5 s, deadlocks reported after 2 s.
const COMMON_ENV: [(&str, &str); 7] = [
    ("SYMM_BACKEND", "cuda"),
    ("SYMM_TIMEOUT_MS", "5000"),
    ("SYMM_GPU_TEST_SUBSET", "1"),
    ("SYMM_GPU_TEST_MAX_COUNT", "4100"),
    ("SYMM_GPU_TEST_REPEATS", "20"),
    ("SYMM_GPU_TEST_MAX_TILES", "300"),
    ("SYMM_SIM_DEADLOCK_MS", "2000"),
];

/// Seeds tried in turn by the weak-memory mutation checks: each catches both relaxed-ordering
/// defects on a quiet machine (seed 5 once missed the acquire one under CI load, and the release
/// one once launches were paced).
const RACE_SEEDS: [&str; 4] = ["3", "4", "5", "6"];

/// One run of the GPU test binary (or another program) on the simulated GPU.
struct SimRun<'a> {
    /// What it checks, for the log.
    what: &'a str,
    program: &'a Path,
    args: Vec<&'a str>,
    env: Vec<(&'a str, &'a str)>,
}

impl SimRun<'_> {
    fn command(&self, dir: &Path) -> Command {
        let mut command = Command::new(self.program);
        command
            .args(&self.args)
            .current_dir(root().join("tests"))
            .env("LD_LIBRARY_PATH", dir);
        for (k, v) in COMMON_ENV.iter().chain(&self.env) {
            command.env(k, v);
        }
        command
    }

    fn describe(&self) -> String {
        let env: Vec<String> = self.env.iter().map(|(k, v)| format!("{k}={v}")).collect();
        format!("{} [{} {}]", self.what, env.join(" "), self.args.join(" "))
    }

    /// Run; it must pass.
    fn pass(&self, dir: &Path) -> Result<(), String> {
        let started = Instant::now();
        println!("sim: {}", self.describe());
        let status = self
            .command(dir)
            .status()
            .map_err(|e| format!("cannot start {:?}: {e}", self.program))?;
        println!("sim:   took {:.1?}", started.elapsed());
        if status.success() {
            Ok(())
        } else {
            Err(self.failed(status))
        }
    }

    /// The error of a run that ended with `status` (not a success).
    fn failed(&self, status: std::process::ExitStatus) -> String {
        format!(
            "on the simulated GPU: {} failed ({status}); the seed is in the environment \
             (SYMM_SIM_SEED) and the output above",
            self.describe()
        )
    }

    /// Run with its output captured; `Ok(output)` when it passed, else the output and the
    /// error [`SimRun::pass`] would give.
    fn pass_quietly(&self, dir: &Path) -> Result<String, (String, String)> {
        let started = Instant::now();
        let output = self
            .command(dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| {
                (
                    String::new(),
                    format!("cannot start {:?}: {e}", self.program),
                )
            })?;
        let text = format!(
            "sim: {}\n{}{}sim:   took {:.1?}\n",
            self.describe(),
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr),
            started.elapsed()
        );
        if output.status.success() {
            Ok(text)
        } else {
            Err((text, self.failed(output.status)))
        }
    }

    /// Run with a deliberate defect; it must fail, and `evidence` (when given) must appear in
    /// its output (proof that the defect was applied).
    fn caught(&self, dir: &Path, evidence: Option<&str>) -> Result<(), String> {
        let started = Instant::now();
        println!("sim: mutation check: {}", self.describe());
        let output = self
            .command(dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot start {:?}: {e}", self.program))?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        let first_panic = text
            .lines()
            .skip_while(|l| !l.contains("panicked at"))
            .take(2)
            .collect::<Vec<_>>()
            .join(" / ");
        println!(
            "sim:   took {:.1?}; {}",
            started.elapsed(),
            if output.status.success() {
                "PASSED (the defect went unnoticed)".to_string()
            } else {
                format!("caught: {first_panic}")
            }
        );
        if let Some(evidence) = evidence
            && !text.contains(evidence)
        {
            return Err(format!(
                "mutation check {}: `{evidence}` is not in the output: the defect was not applied",
                self.describe()
            ));
        }
        if output.status.success() {
            println!("{text}");
            return Err(format!(
                "mutation check {}: the tests passed with the defect in place",
                self.describe()
            ));
        }
        Ok(())
    }
}

/// Run every one of `runs`, as many at once as there are cores (each is a process with its
/// own simulated GPU, whose one device thread keeps one core busy); each run's output is
/// printed whole when it ends. All must pass: the first failure is returned once every run
/// ended.
fn pass_together(runs: &[SimRun<'_>], dir: &Path) -> Result<(), String> {
    let workers = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .min(runs.len());
    let next = std::sync::atomic::AtomicUsize::new(0);
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| {
                loop {
                    let index = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let Some(run) = runs.get(index) else { return };
                    let (text, failure) = match run.pass_quietly(dir) {
                        Ok(text) => (text, None),
                        Err((text, error)) => (text, Some((index, error))),
                    };
                    // One run's output at a time, whole.
                    let mut out = std::io::stdout().lock();
                    let _ = std::io::Write::write_all(&mut out, text.as_bytes());
                    let _ = std::io::Write::flush(&mut out);
                    if let Some(failure) = failure {
                        failures
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(failure);
                    }
                }
            });
        }
    });
    let mut failures = failures.into_inner().unwrap_or_else(|e| e.into_inner());
    failures.sort();
    match failures.into_iter().next() {
        Some((_, error)) => Err(error),
        None => Ok(()),
    }
}

impl SimRun<'_> {
    /// [`SimRun::caught`] for a defect that only some interleavings expose (a data race under
    /// weak memory): runs with each seed in turn (replacing `SYMM_SIM_SEED`) until one catches
    /// it. The seeded schedule also depends on how the OS runs the ranks' host threads, so one
    /// seed that catches it on a quiet machine can miss it on a loaded one.
    fn caught_by_one_of(
        &self,
        dir: &Path,
        evidence: Option<&str>,
        seeds: &[&str],
    ) -> Result<(), String> {
        let mut last = Err("no seed given".to_string());
        for seed in seeds {
            let env = self
                .env
                .iter()
                .filter(|(k, _)| *k != "SYMM_SIM_SEED")
                .copied()
                .chain([("SYMM_SIM_SEED", *seed)])
                .collect();
            let run = SimRun {
                what: self.what,
                program: self.program,
                args: self.args.clone(),
                env,
            };
            last = run.caught(dir, evidence);
            if last.is_ok() {
                return last;
            }
            println!("sim:   seed {seed} missed it; next seed");
        }
        last
    }
}

/// The test binaries the simulated GPU runs, built in release with the `mutations` feature
/// (inactive unless `SYMM_MUTATION` names one).
struct TestBinaries {
    /// The GPU set (`tests/tests/gpu_collectives/`).
    gpu: PathBuf,
    /// Buffers at different window offsets on different ranks (`window_offsets.rs`).
    window_offsets: PathBuf,
    /// A failure reaching every rank at once (`prompt_failure.rs`).
    prompt_failure: PathBuf,
    /// `symmCommAbort` and `symmCommFinalize` (`abort_finalize.rs`).
    abort_finalize: PathBuf,
    /// `symmCommSplit` (`split.rs`).
    split: PathBuf,
    /// `symmCommShrink` (`shrink.rs`).
    shrink: PathBuf,
    /// `symmSend` and `symmRecv` (`point_to_point.rs`).
    point_to_point: PathBuf,
    /// `symmAlltoAllvDevice` (`all_to_all_v.rs`).
    all_to_all_v: PathBuf,
    /// Calls outside windows, staged (`staging.rs`).
    staging: PathBuf,
    /// Sends and receives outside windows, staged (`staging_point_to_point.rs`).
    staging_point_to_point: PathBuf,
    /// The Rust API (`rust_api.rs`).
    rust_api: PathBuf,
    /// Launches of users' kernels the Rust API refuses (`rust_kernels.rs`).
    rust_kernels: PathBuf,
    /// Windows over memory another owner mapped (`peer_windows.rs`).
    peer_windows: PathBuf,
    /// Ranks on several machines (`machines.rs`).
    machines: PathBuf,
    /// The Rust example's kernel launched from its PTX (`examples/rust/app/tests/ring.rs`).
    example_kernels: PathBuf,
}

/// Build the [`TestBinaries`] and return their executables.
fn test_binaries() -> Result<TestBinaries, String> {
    let mut messages = build_tests(
        "the GPU test set",
        &[
            "-p",
            "symm-tests",
            "--features",
            "symm/mutations",
            "--test",
            "gpu_collectives",
            "--test",
            "window_offsets",
            "--test",
            "prompt_failure",
            "--test",
            "abort_finalize",
            "--test",
            "split",
            "--test",
            "shrink",
            "--test",
            "point_to_point",
            "--test",
            "all_to_all_v",
            "--test",
            "staging",
            "--test",
            "staging_point_to_point",
            "--test",
            "rust_api",
            "--test",
            "rust_kernels",
            "--test",
            "peer_windows",
            "--test",
            "machines",
        ],
    )?;
    // The Rust example: its build script compiles its kernels' crate to PTX.
    messages.extend(build_tests(
        "the Rust example",
        &["-p", "symm-example", "--test", "ring"],
    )?);
    let executable = |name: &str| {
        messages
            .iter()
            .filter(|m| m["target"]["name"] == name)
            .find_map(|m| m["executable"].as_str().map(PathBuf::from))
            .ok_or_else(|| format!("cargo did not name the {name} test executable"))
    };
    Ok(TestBinaries {
        gpu: executable("gpu_collectives")?,
        window_offsets: executable("window_offsets")?,
        prompt_failure: executable("prompt_failure")?,
        abort_finalize: executable("abort_finalize")?,
        split: executable("split")?,
        shrink: executable("shrink")?,
        point_to_point: executable("point_to_point")?,
        all_to_all_v: executable("all_to_all_v")?,
        staging: executable("staging")?,
        staging_point_to_point: executable("staging_point_to_point")?,
        rust_api: executable("rust_api")?,
        rust_kernels: executable("rust_kernels")?,
        peer_windows: executable("peer_windows")?,
        machines: executable("machines")?,
        example_kernels: executable("ring")?,
    })
}

/// Build the release test binaries `args` select (`what` in messages), without running them:
/// cargo's JSON messages, which name each executable.
fn build_tests(what: &str, args: &[&str]) -> Result<Vec<serde_json::Value>, String> {
    let output = cargo()
        .args(["test", "--release"])
        .args(args)
        .args(["--no-run", "--message-format=json"])
        .current_dir(root())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("building {what} failed"));
    }
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .collect())
}

/// A directory laid out as `CUDA_HOME` for the C examples' `make CUDA=1`: `include/cuda.h`
/// from NVIDIA's CUDA runtime wheel (headers only), `lib64/stubs/libcuda.so` the fake driver.
fn cuda_home(dir: &Path) -> Result<PathBuf, String> {
    let home = root().join("target/sim/cuda-home");
    let header = home.join("include/cuda.h");
    if !header.exists() {
        let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3".to_string());
        let wheels = root().join("target/sim/wheels");
        run(Command::new(&python)
            .args([
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "nvidia-cuda-runtime-cu12==12.9.79",
                "-d",
            ])
            .arg(&wheels))?;
        let script = "import glob, sys, zipfile\n\
            w = glob.glob(sys.argv[1] + '/nvidia_cuda_runtime*.whl')[0]\n\
            z = zipfile.ZipFile(w)\n\
            for n in z.namelist():\n\
            \x20   if n.startswith('nvidia/cuda_runtime/include/'):\n\
            \x20       z.extract(n, sys.argv[2])\n";
        let unpacked = root().join("target/sim/wheel-include");
        run(Command::new(&python)
            .args(["-c", script])
            .arg(&wheels)
            .arg(&unpacked))?;
        std::fs::create_dir_all(&home).map_err(|e| format!("creating {home:?}: {e}"))?;
        let _ = std::fs::remove_dir_all(home.join("include"));
        std::fs::rename(
            unpacked.join("nvidia/cuda_runtime/include"),
            home.join("include"),
        )
        .map_err(|e| format!("laying out {home:?}: {e}"))?;
    }
    // As CUDA's stub: its SONAME, libcuda.so.1, is what a program linked with `-lcuda` needs,
    // and the loader finds that name in `dir` at run time, never the stub.
    let stubs = home.join("lib64/stubs");
    std::fs::create_dir_all(&stubs).map_err(|e| format!("creating {stubs:?}: {e}"))?;
    let stub = stubs.join("libcuda.so");
    let _ = std::fs::remove_file(&stub);
    std::fs::copy(dir.join("libcuda.so.1"), &stub).map_err(|e| format!("copying the stub: {e}"))?;
    Ok(home)
}

/// What CI runs on the simulated GPU:
///
/// 0. The interpreter's own tests in release (`cargo test --release -p symm-sim`; the
///    collectives of the shipped PTX among them are ignored in debug builds): its
///    instructions, scheduling, weak memory, and the shipped kernels driven directly with the
///    argument tables the host library builds (a refused launch's abort word and out-of-step
///    mark, with the mutants each check catches).
/// 1. The GPU test set (`tests/tests/gpu_collectives/`): all of it with seed 1 on a 16-SM
///    device, then all but the dtype/op sweeps with seed 2 on an H100-shaped one (132 SMs).
///    Then the layouts users run (a thread per rank, a group, a process per rank): buffers at
///    different window offsets refused on every rank (`window_offsets.rs`), a failure
///    reaching every rank at once (`prompt_failure.rs`), and `symmCommAbort` while a peer
///    hangs and `symmCommFinalize` (`abort_finalize.rs`), `symmCommSplit`'s halves running
///    different collectives at once and `symmCommRevoke` (`split.rs`), and `symmCommShrink`
///    (`shrink.rs`: also a rank process killed, the root's among them, then the survivors'
///    shrink and 100 more collectives), sends and receives (`point_to_point.rs`),
///    all-to-all-v with counts in device memory (`all_to_all_v.rs`), and calls outside windows
///    staged through the staging window, a graph replay of one among them (`staging.rs`), and
///    sends and receives staged whole (`staging_point_to_point.rs`), the Rust API
///    (`rust_api.rs`), windows over memory another owner allocated and mapped
///    (`peer_windows.rs`), and ranks on two machines with both kinds of rails (`machines.rs`).
/// 2. Weak memory (`SYMM_SIM_WEAK=1`): the mixed-call sequence on one window and the chained
///    in-place sums across threads, with the automatic, one-shot (its in-place rounds and,
///    every rank in place, its shares) and two-shot algorithms, and with PAT for the
///    all-gathers and reduce-scatters, and all-to-all-v's graph replays with new counts; data
///    races (plain accesses not ordered by happens-before) fail the run. Then teardown right
///    after a collective with `SYMM_SIM_STRICT_FREE=1` (frees do not wait for queued work).
/// 3. The C examples (`make -C examples/c CUDA=1 run`): one process, threads,
///    `allreduce_mp` across processes sharing memory through exported file descriptors, and
///    `allreduce_driver`, which opens `libcuda.so.1` itself and fills and reads the windows
///    through it (one driver in the process, whichever name each part opens it by).
/// 4. Mutation checks: each deliberate defect must make a test fail — kernel parameters
///    swapped, the user streams' completion wait dropped, grids larger than fit co-resident,
///    the barriers' acquire loads or the flags' release stores turned relaxed (reported as
///    data races), a second thread on a rank not refused, the ranks' calls not compared,
///    window teardown not waiting for the callers' streams, a cooperative launch larger than
///    a 1-SM device holds not refused before its calls are numbered, a failing rank raising
///    only its own process's abort words, nobody watching the peers' processes, a window not
///    holding the memory of its peers in this process (a peer that aborted and freed).
pub fn test() -> Result<(), String> {
    let started = Instant::now();
    let dir = build()?;
    let binaries = test_binaries()?;
    let binary = binaries.gpu.clone();
    let gpu = |what, args: Vec<&'static str>, env: Vec<(&'static str, &'static str)>| {
        let mut all = vec!["--ignored", "--test-threads=1"];
        all.extend(args);
        SimRun {
            what,
            program: &binary,
            args: all,
            env,
        }
    };
    let mut steps: Vec<(String, f64)> = Vec::new();
    let mut step = |name: &str, since: Instant| {
        let seconds = since.elapsed().as_secs_f64();
        println!("sim: step '{name}' took {seconds:.0} s");
        steps.push((name.to_string(), seconds));
    };

    let t = Instant::now();
    run(cargo().args(["test", "--release", "-p", "symm-sim"]))?;
    step("the interpreter's tests, release", t);

    let t = Instant::now();
    let mut runs = vec![gpu(
        "the GPU set, 16 SMs",
        vec![],
        vec![("SYMM_SIM_SEED", "1"), ("SYMM_SIM_SMS", "16")],
    )];
    // An H100-shaped device: grids up to 132 blocks per launch. The exhaustive dtype and
    // operator sweeps run in the 16-SM run; at this size they would take about 10 more minutes
    // of CI for kernels the rest of the set already runs at this shape.
    runs.push(gpu(
        "the GPU set but the dtype/op sweeps, 132 SMs",
        vec![
            "--skip",
            "gpu_all_reduce_every_dtype_and_op",
            "--skip",
            "gpu_all_gather_and_reduce_scatter_every_dtype",
            "--skip",
            "gpu_reduce_every_dtype_and_op",
            "--skip",
            "gpu_software_work_source",
        ],
        vec![("SYMM_SIM_SEED", "2"), ("SYMM_SIM_SMS", "132")],
    ));
    // The two at once: each process is its own simulated GPU.
    pass_together(&runs, &dir)?;
    step("GPU set", t);

    let t = Instant::now();
    // `pat` forces PAT on the all-gathers and reduce-scatters of the mixed calls (the cost
    // model picks it only from 32 ranks, so nothing else here runs its PTX).
    let mut runs: Vec<SimRun> = ["auto", "oneshot", "twoshot", "pat"]
        .into_iter()
        .map(|algo| {
            gpu(
                "weak memory",
                vec!["gpu_sequence_of_mixed_calls", "gpu_threads_chain"],
                vec![
                    ("SYMM_SIM_SEED", "3"),
                    ("SYMM_SIM_SMS", "16"),
                    ("SYMM_SIM_WEAK", "1"),
                    ("SYMM_ALGO", algo),
                ],
            )
        })
        .collect();
    // All-to-all-v's count tables, read by peers after the start barrier and written (rows 1
    // and 2) by their owner, under weak memory: data races fail the run.
    runs.push(gpu(
        "weak memory: all-to-all-v",
        vec!["gpu_all_to_all_v"],
        vec![
            ("SYMM_SIM_SEED", "3"),
            ("SYMM_SIM_SMS", "16"),
            ("SYMM_SIM_WEAK", "1"),
        ],
    ));
    // A user's kernel (frames, peer reads, the in-kernel all-reduce) under weak memory.
    runs.push(SimRun {
        what: "weak memory: a user's kernel",
        program: &binaries.example_kernels,
        args: vec![],
        env: vec![
            ("SYMM_SIM_SEED", "3"),
            ("SYMM_SIM_SMS", "16"),
            ("SYMM_SIM_WEAK", "1"),
        ],
    });
    // Two at a time: each process is its own simulated GPU.
    pass_together(&runs, &dir)?;
    step("weak memory", t);

    // The layouts users run (a thread per rank, a group, a process per rank) on the cuda
    // backend: ranks whose buffers lie at different window offsets are refused on every rank,
    // and a failure found by one rank reaches the others at once. One test at a time, as
    // `cargo nextest` runs them (a process each): tests of one process share its simulated
    // GPU, and co-residency is proven per communicator, so two tests' communicators whose
    // grids overlap in time could hold each other's blocks out until the timeout.
    let t = Instant::now();
    for (what, program) in [
        ("different window offsets", &binaries.window_offsets),
        (
            "a failure reaches every rank at once",
            &binaries.prompt_failure,
        ),
        ("abort and finalize", &binaries.abort_finalize),
        ("split", &binaries.split),
        ("shrink", &binaries.shrink),
        ("send and receive", &binaries.point_to_point),
        ("all-to-all-v", &binaries.all_to_all_v),
        ("staged calls", &binaries.staging),
        (
            "staged sends and receives",
            &binaries.staging_point_to_point,
        ),
        ("the Rust API", &binaries.rust_api),
        ("launches of users' kernels", &binaries.rust_kernels),
        (
            "windows over another owner's memory",
            &binaries.peer_windows,
        ),
        ("a user's kernel from its PTX", &binaries.example_kernels),
    ] {
        SimRun {
            what,
            program,
            args: vec!["--test-threads=1"],
            env: vec![("SYMM_SIM_SEED", "7"), ("SYMM_SIM_SMS", "16")],
        }
        .pass(&dir)?;
    }
    SimRun {
        what: "ranks on two machines, rails of sockets and of NCCL's stand-in",
        program: &binaries.machines,
        args: vec![
            "--ignored",
            "--exact",
            "on_the_simulated_gpu_machines_run_the_small_calls_exactly",
        ],
        env: vec![("SYMM_SIM_SEED", "7"), ("SYMM_SIM_SMS", "16")],
    }
    .pass(&dir)?;
    step(
        "layouts: offsets, prompt failure, abort, split, shrink, send/receive, all-to-all-v, \
         staging, Rust API, users' kernels, other owners' windows, machines",
        t,
    );

    // Under SYMM_ALGO=ll the tests that go past the LL buffers expect the refusal (and the
    // graph test captures a count that fits). Reads of pinned host memory cost a PCIe round
    // trip here, as on a GPU, and the host-read count of the LL all-reduce is checked.
    let t = Instant::now();
    gpu(
        "SYMM_ALGO=ll",
        vec![
            "gpu_f32_sum",
            "gpu_graph_capture",
            "gpu_ll_all_reduce_reads",
            // The tests whose subject is not the size run under every algorithm, as on a GPU
            // runner's `SYMM_ALGO` loop.
            "gpu_group_with_a_stream_per_rank",
            "gpu_one_thread_per_rank",
            "gpu_sequence_of_mixed_calls",
            "gpu_teardown_right_after",
        ],
        vec![
            ("SYMM_SIM_SEED", "8"),
            ("SYMM_SIM_SMS", "16"),
            ("SYMM_ALGO", "ll"),
            ("SYMM_SIM_HOST_READ_NS", "1000"),
            ("SYMM_SIM_HOST_READ_GAP_NS", "4"),
        ],
    )
    .pass(&dir)?;
    step("SYMM_ALGO=ll", t);

    // Hardware queues: every stream's kernels in one first-in-first-out queue (the worst
    // aliasing CUDA_DEVICE_MAX_CONNECTIONS allows); a rank running ahead of a lagging peer
    // must not queue its next kernel before the peer's (launch pacing).
    let t = Instant::now();
    gpu(
        "one hardware queue",
        vec![
            "gpu_a_rank_running_ahead",
            "gpu_one_thread_per_rank",
            "gpu_threads_chain",
        ],
        vec![
            ("SYMM_SIM_SEED", "9"),
            ("SYMM_SIM_SMS", "16"),
            ("SYMM_SIM_HW_QUEUES", "1"),
        ],
    )
    .pass(&dir)?;
    step("hardware queues", t);

    let t = Instant::now();
    gpu(
        "teardown right after a collective, cuMemFree without its implicit wait",
        vec!["gpu_teardown_right_after_a_collective"],
        vec![
            ("SYMM_SIM_SEED", "6"),
            ("SYMM_SIM_SMS", "16"),
            ("SYMM_SIM_STRICT_FREE", "1"),
        ],
    )
    .pass(&dir)?;
    step("strict free", t);

    let t = Instant::now();
    let home = cuda_home(&dir)?;
    let home_var = format!("CUDA_HOME={}", home.display());
    run(Command::new("make").args(["-C", "examples/c", "clean"]))?;
    run(cargo().args(["build", "--release", "-p", "symm-c"]))?;
    let make = Command::new("make")
        .arg("-C")
        .arg(root().join("examples/c"))
        .arg("CUDA=1")
        .arg(&home_var)
        .arg("run")
        .env("SYMM_SIM_SEED", "4")
        .env("SYMM_SIM_SMS", "16")
        .env("LD_LIBRARY_PATH", &dir)
        .env("SYMM_BACKEND", "cuda")
        .env("SYMM_TIMEOUT_MS", "5000")
        .status();
    // The host build of the examples is what `cargo xtask test` runs: put it back.
    let restore = run(Command::new("make").args(["-C", "examples/c", "clean"]))
        .and_then(|()| run(Command::new("make").args(["-C", "examples/c"])));
    match make {
        Ok(s) if s.success() => {}
        Ok(s) => {
            return Err(format!(
                "the C examples failed on the simulated GPU ({s}), seed 4"
            ));
        }
        Err(e) => return Err(format!("cannot start make: {e}")),
    }
    restore?;
    step("C examples", t);

    // symm-perf's cuda side (CUDA graphs and events, eager and blocking timing, a broadcast
    // root other than 0), small and checked: it exits non-zero on a wrong element.
    let t = Instant::now();
    run(cargo().args(["build", "--release", "-p", "symm-perf"]))?;
    let perf = root().join("target/release/symm-perf");
    for args in [
        "all_reduce -b 1K -e 4K -f 4 -g 2 -n 2 -w 1 -c 1 -G 0 -z 1",
        "broadcast --minbytes 256 --maxbytes 1K --stepfactor 4 --ngpus 3 --root 2 -n 2 -w 1 -G 2",
    ] {
        SimRun {
            what: "symm-perf",
            program: &perf,
            args: args.split(' ').collect(),
            env: vec![("SYMM_SIM_SEED", "7"), ("SYMM_SIM_SMS", "16")],
        }
        .pass(&dir)?;
    }
    step("symm-perf", t);

    let t = Instant::now();
    gpu(
        "kernel parameters swapped",
        vec!["gpu_f32_sum"],
        vec![
            ("SYMM_SIM_SEED", "5"),
            ("SYMM_MUTATION", "swap-kernel-parameters"),
        ],
    )
    .caught(&dir, None)?;
    gpu(
        "the user streams' completion wait dropped",
        vec!["gpu_group_with_a_stream_per_rank"],
        vec![
            ("SYMM_SIM_SEED", "5"),
            ("SYMM_MUTATION", "skip-completion-wait"),
        ],
    )
    .caught(&dir, None)?;
    // The co-residency checks, on devices small enough that the grids fill them: `test` passes
    // as it is, and with `oversized-grids` (plus `extra` settings) fails showing `evidence`.
    let co_residency =
        |sms, test, baseline, defect, extra: &[(&'static str, &'static str)], evidence| {
            let env = vec![("SYMM_SIM_SEED", "5"), ("SYMM_SIM_SMS", sms)];
            gpu(baseline, vec![test], env.clone()).pass(&dir)?;
            let mut mutant = env;
            mutant.push(("SYMM_MUTATION", "oversized-grids"));
            mutant.extend_from_slice(extra);
            gpu(defect, vec![test], mutant).caught(&dir, Some(evidence))
        };
    co_residency(
        "8",
        "gpu_one_thread_per_rank",
        "separate launches on an 8-SM device (baseline of the next check)",
        "grids larger than fit co-resident",
        &[("SYMM_SIM_DEADLOCK", "fail")],
        "symm-sim: deadlock?",
    )?;
    // One multiprocessor holds at most four blocks of 512 threads: five ranks of one device
    // in a group (one cooperative launch) must be refused before their calls are numbered.
    co_residency(
        "1",
        "gpu_more_ranks_on_one_gpu",
        "more ranks on a 1-SM device than it holds blocks",
        "the cooperative launch's residency not checked",
        &[],
        "CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE",
    )?;
    gpu(
        "the barriers' acquire loads relaxed, weak memory",
        vec!["gpu_threads_chain"],
        vec![
            ("SYMM_SIM_WEAK", "1"),
            ("SYMM_ALGO", "twoshot"),
            (
                "SYMM_SIM_PTX_EDIT",
                "ld.acquire.sys.u32=>ld.relaxed.sys.u32",
            ),
        ],
    )
    .caught_by_one_of(&dir, Some("data race"), &RACE_SEEDS)?;
    gpu(
        "the flags' release stores relaxed, weak memory",
        vec!["gpu_threads_chain"],
        vec![
            ("SYMM_SIM_WEAK", "1"),
            ("SYMM_ALGO", "twoshot"),
            (
                "SYMM_SIM_PTX_EDIT",
                "st.release.sys.u32=>st.relaxed.sys.u32",
            ),
        ],
    )
    .caught_by_one_of(&dir, Some("data race"), &RACE_SEEDS)?;
    gpu(
        "a second thread's call on a rank goes ahead instead of being refused",
        vec!["gpu_a_second_thread_is_refused"],
        vec![
            ("SYMM_SIM_SEED", "5"),
            ("SYMM_TIMEOUT_MS", "2000"),
            ("SYMM_MUTATION", "threads-share-a-rank"),
        ],
    )
    .caught(&dir, None)?;
    gpu(
        "ranks of one process never compare their calls",
        vec!["gpu_a_mismatch_between_threads", "gpu_a_call_refused"],
        vec![
            ("SYMM_SIM_SEED", "5"),
            ("SYMM_TIMEOUT_MS", "2000"),
            ("SYMM_MUTATION", "skip-call-agreement"),
        ],
    )
    .caught(&dir, None)?;
    gpu(
        "window teardown does not wait for the callers' streams, cuMemFree without its wait",
        vec!["gpu_teardown_right_after_a_collective"],
        vec![
            ("SYMM_SIM_SEED", "6"),
            ("SYMM_SIM_SMS", "16"),
            ("SYMM_SIM_STRICT_FREE", "1"),
            ("SYMM_MUTATION", "skip-window-stream-wait"),
        ],
    )
    .caught(&dir, Some("faulted"))?;
    gpu(
        "launches not paced, one hardware queue",
        vec!["gpu_a_rank_running_ahead"],
        vec![
            ("SYMM_SIM_SEED", "9"),
            ("SYMM_SIM_SMS", "16"),
            ("SYMM_SIM_HW_QUEUES", "1"),
            ("SYMM_MUTATION", "skip-launch-pacing"),
        ],
    )
    .caught(&dir, Some("deadlock?"))?;
    SimRun {
        what: "a failing rank raises only its own process's abort words",
        program: &binaries.prompt_failure,
        args: vec!["a_mismatch_fails_every_process_at_once"],
        env: vec![
            ("SYMM_SIM_SEED", "7"),
            ("SYMM_SIM_SMS", "16"),
            ("SYMM_TEST_LONG_TIMEOUT_MS", "4000"),
            ("SYMM_MUTATION", "skip-remote-abort"),
        ],
    }
    .caught(&dir, Some("after the first"))?;
    SimRun {
        what: "nobody watches the peers' processes",
        program: &binaries.prompt_failure,
        args: vec!["a_killed_process_fails_the_others_at_once"],
        env: vec![
            ("SYMM_SIM_SEED", "7"),
            ("SYMM_SIM_SMS", "16"),
            ("SYMM_TEST_LONG_TIMEOUT_MS", "4000"),
            ("SYMM_MUTATION", "skip-process-watch"),
        ],
    }
    .caught(&dir, Some("did not arrive"))?;
    SimRun {
        what: "a window does not hold its peers' memory in this process",
        program: &binaries.point_to_point,
        args: vec![
            "--exact",
            "a_peer_that_aborts_and_frees_leaves_the_memory_a_kernel_writes",
        ],
        env: vec![
            ("SYMM_SIM_SEED", "7"),
            ("SYMM_SIM_SMS", "16"),
            ("SYMM_MUTATION", "skip-peer-memory-hold"),
        ],
    }
    .caught(&dir, Some("faulted"))?;
    SimRun {
        what: "two staged sends of one group placed on the same ring",
        program: &binaries.staging_point_to_point,
        args: vec!["--exact", "staged_rings_of_many_messages_both_ways"],
        env: vec![
            ("SYMM_SIM_SEED", "7"),
            ("SYMM_SIM_SMS", "16"),
            ("SYMM_MUTATION", "p2p-rings-overlap"),
        ],
    }
    .caught(&dir, Some("differs"))?;
    step("mutation checks", t);

    for (name, seconds) in &steps {
        println!("sim: {name}: {seconds:.0} s");
    }
    println!(
        "xtask sim --test: all passed in {:.0} s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_of(program: &Path) -> SimRun<'_> {
        SimRun {
            what: "a stand-in",
            program,
            args: vec![],
            env: vec![],
        }
    }

    /// Every run runs, and the first failing one (in the list's order) is the error.
    #[test]
    fn runs_together_and_reports_the_first_failure() {
        let (yes, no) = (Path::new("/bin/true"), Path::new("/bin/false"));
        let dir = std::env::temp_dir();
        assert_eq!(
            pass_together(&[run_of(yes), run_of(yes), run_of(yes)], &dir),
            Ok(())
        );
        let runs = [run_of(yes), run_of(no), run_of(yes), run_of(no)];
        let error = pass_together(&runs, &dir).unwrap_err();
        assert!(
            error.contains("a stand-in") && error.contains("failed"),
            "{error}"
        );
        let missing = Path::new("/nonexistent/program");
        let error = pass_together(&[run_of(yes), run_of(missing)], &dir).unwrap_err();
        assert!(error.contains("cannot start"), "{error}");
    }
}
