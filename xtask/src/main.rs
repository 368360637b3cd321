//! `cargo xtask <task>`: the project's build tasks.
//!
//! * `ptx [--check]` — build the device crate for every PTX target and the Triton-linkable
//!   library (`ptx-out/symm_triton.ll.gz`), assemble each PTX with ptxas and report
//!   registers/spills/stack per kernel; write `ptx-out/` (or, with `--check`, fail if
//!   `ptx-out/` differs from a fresh build).
//! * `triton-library` — only `ptx-out/symm_triton.ll.gz`.
//! * `triton-test` — the Triton compile tests under the oldest and newest supported Triton.
//! * `header [--check]` — generate `ffi-headers/symm.h` with cbindgen (or check it).
//! * `test` — the test suite: the layering check (`layers` below), workspace tests (this
//!   crate's own included), the loom model checks
//!   of the synchronization protocols (`--cfg loom`), then the C examples and a small checked
//!   `symm-perf` run on the host backend, the install check (`install` below), then the Python package's tests (`pytest` below)
//!   and the Triton compile tests (`triton-test`).
//! * `demo` — build everything and run the 8-rank all-reduce demo.
//! * `gpu-bundle` — build in release what a GPU machine without Rust runs (the GPU test set,
//!   `symm-perf`, `libsymm`, the C examples, `bench/gpu/run.sh`) into one archive of at most
//!   20 MiB, `target/gpu-bundle/symm-gpu.tar.xz`.
//! * `wheel` — `libsymm.so` in release and a platform wheel of the Python package carrying it,
//!   `symm.h` and the Triton device libraries, in `<target>/wheels/`.
//! * `pytest` — the Python package's tests in a virtual environment, on the host backend.
//! * `fuzz --replay | --time SECONDS | --seeds` — the C ABI fuzz target (`fuzz/`): replay its
//!   corpus, fuzz for a while, or rewrite its generated seeds.
//! * `sim [--test]` — build the simulated GPU (a fake `libcuda.so.1` over the PTX interpreter
//!   in `sim/`) into `target/sim/` and print the directory; with `--test`, run the GPU test
//!   set, the C examples and the mutation checks on it.
//! * `install --prefix P` — libsymm (shared, with its SONAME, and static), `symm.h` and a
//!   pkg-config file `symm.pc` carrying the link flags, under `P`; `install --check` (run by
//!   `test`) builds the C example against a scratch installation with pkg-config's flags alone.
//! * `device-lib [--test]` — `target/device-lib/libsymm_device.a` and `symm_device.ptx`: the
//!   device functions of `ptx-out/symm_triton.ll.gz` for CUDA C++ kernels
//!   (`ffi-headers/symm_device.cuh`), built with the toolchain's llc and the nvcc wheel; with
//!   `--test`, build `examples/cuda` with nvcc and run `jit_link` on the simulated GPU.
//! * `doc` — the documentation of every crate, with rustdoc's warnings as errors, and a check
//!   that the root of `symm` shows the C ABI only (no module: the internals are private).
//! * `layers` — check the imports between modules against the layers `docs/ARCHITECTURE.md`
//!   states (and its list of imports that still break them).

#![deny(unsafe_op_in_unsafe_fn)]

mod bundle;
mod device_lib;
mod fuzz;
mod install;
mod layers;
mod loom;
mod ptx;
mod python;
mod sim;
mod triton;

use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let check = args.iter().any(|a| a == "--check");
    let result = match args.first().map(String::as_str) {
        Some("ptx") => ptx::generate(check),
        Some("triton-library") => ptx::generate_triton_library(),
        Some("triton-test") => triton::test(),
        Some("header") => header(check),
        Some("test") => test(),
        Some("demo") => demo(),
        Some("gpu-bundle") => bundle::build(),
        Some("wheel") => python::wheel(),
        Some("pytest") => python::pytest(),
        Some("fuzz") => fuzz::fuzz(&args[1..]),
        Some("sim") => sim::sim(&args[1..]),
        Some("layers") => layers::check(),
        Some("doc") => doc(),
        Some("install") => install::install(&args[1..]),
        Some("device-lib") => device_lib::device_lib(&args[1..]),
        _ => Err(
            "usage: cargo xtask ptx|header [--check] | triton-library | triton-test | test | demo \
             | gpu-bundle | wheel | pytest | fuzz --replay|--time SECONDS|--seeds | sim [--test] \
             | layers | doc | install --prefix DIRECTORY|--check | device-lib [--test]"
                .to_string(),
        ),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("xtask: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `cargo xtask doc`: `cargo doc --workspace --no-deps` with rustdoc's warnings denied (a
/// link to an item a reader cannot see, a broken link), then the public surface of `symm`:
/// its root page lists no module (the `internals` path for the project's own tests is hidden).
fn doc() -> Result<(), String> {
    run(cargo()
        .args(["doc", "--workspace", "--no-deps", "--quiet"])
        .env("RUSTDOCFLAGS", "-D warnings"))?;
    let index = root().join("target/doc/symm/index.html");
    let page = std::fs::read_to_string(&index).map_err(|e| format!("{}: {e}", index.display()))?;
    let modules: Vec<&str> = page
        .split("class=\"mod\"")
        .skip(1)
        .filter_map(|rest| rest.split('>').nth(1)?.split('<').next())
        .collect();
    if !modules.is_empty() {
        return Err(format!(
            "symm's documentation shows modules at its root ({modules:?}): internals must be \
             private (the project's tests reach them through `symm::internals`)"
        ));
    }
    println!("doc: every crate documented without warnings; symm's root shows no module");
    Ok(())
}

/// The workspace root.
pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("xtask lives in the workspace root")
        .to_path_buf()
}

/// Run a command in the workspace root, failing with its description when it fails.
pub fn run(command: &mut Command) -> Result<(), String> {
    let status = command
        .current_dir(root())
        .status()
        .map_err(|e| format!("cannot start {command:?}: {e}"))?;
    if status.success() {
        Ok(())
    } else {
        Err(format!("{command:?} failed: {status}"))
    }
}

/// The cargo that runs this task.
pub fn cargo() -> Command {
    Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".to_string()))
}

fn header(check: bool) -> Result<(), String> {
    let root = root();
    let config = cbindgen::Config::from_file(root.join("host-shim/cbindgen.toml"))
        .map_err(|e| format!("reading cbindgen.toml: {e}"))?;
    let bindings = cbindgen::Builder::new()
        .with_crate(root.join("host-shim"))
        .with_config(config)
        .generate()
        .map_err(|e| format!("cbindgen: {e}"))?;
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let unprefixed = unprefixed_names(&String::from_utf8_lossy(&generated));
    if !unprefixed.is_empty() {
        return Err(format!(
            "symm.h would declare names without the symm/SYMM_ prefix, which can clash with a \
             user's own (exclude them in host-shim/cbindgen.toml or rename them): {}",
            unprefixed.join(", ")
        ));
    }
    let path = root.join("ffi-headers/symm.h");
    if check {
        let current = std::fs::read(&path).unwrap_or_default();
        if current != generated {
            return Err(
                "ffi-headers/symm.h is out of date: run `cargo xtask header` and commit it"
                    .to_string(),
            );
        }
        println!("ffi-headers/symm.h is up to date");
    } else {
        std::fs::write(&path, generated).map_err(|e| format!("writing {path:?}: {e}"))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// Names a C header may declare without symm's prefix: CUDA's own stream type, declared as
/// `cuda.h` does.
const FOREIGN_NAMES: [&str; 1] = ["CUstream_st"];

/// Every name `header` declares at file scope (types, typedef names, enumerators, functions,
/// macros) that does not start with `symm` or `SYMM_` and is not CUDA's (struct fields are
/// not declarations at file scope).
fn unprefixed_names(header: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_enum = false;
    for line in header.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with("//") || trimmed.is_empty() {
            continue;
        }
        let word = |s: &str| -> String {
            s.chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect()
        };
        if let Some(rest) = trimmed.strip_prefix("#define ") {
            names.push(word(rest));
        } else if trimmed.starts_with("typedef enum") {
            in_enum = true;
        } else if let Some(rest) = trimmed.strip_prefix('}') {
            in_enum = false;
            let name = word(rest.trim_start());
            if !name.is_empty() {
                names.push(name);
            }
        } else if in_enum {
            names.push(word(trimmed));
        } else if let Some(rest) = trimmed.strip_prefix("typedef ") {
            if !rest.trim_end().ends_with('{') {
                // `typedef struct A B;`: both names.
                for part in rest.trim_end_matches(';').split_whitespace().skip(1) {
                    names.push(word(part.trim_start_matches('*')));
                }
            }
        } else if !line.starts_with(' ') && !line.starts_with('#') && line.contains('(') {
            let before = &line[..line.find('(').unwrap_or(0)];
            if let Some(name) = before.split([' ', '*']).next_back() {
                names.push(word(name));
            }
        }
    }
    names.retain(|n| {
        !n.is_empty()
            && !n.starts_with("symm")
            && !n.starts_with("SYMM_")
            && !FOREIGN_NAMES.contains(&n.as_str())
    });
    names.sort();
    names.dedup();
    names
}

fn build_release_and_examples() -> Result<(), String> {
    run(cargo().args(["build", "--release", "-p", "symm-c", "-p", "symm-perf"]))?;
    run(Command::new("make").args(["-C", "examples/c"]))
}

/// The test files of `tests/` that `cargo xtask test` runs a second time in the host backend's
/// fast mode (the workspace's tests run its testing mode, `.cargo/config.toml`): every
/// collective against its reference, threads and processes, offsets, failures and misuse.
const FAST_MODE_SUITES: [&str; 17] = [
    "collectives_host",
    "processes",
    "window_offsets",
    "prompt_failure",
    "failed_comm",
    "misuse",
    "abi_errors",
    "fork_children",
    "split",
    "shrink",
    "point_to_point",
    "all_to_all_v",
    "staging",
    "staging_point_to_point",
    "rust_api",
    "peer_windows",
    "engine_windows",
];

/// The test executables of `package` named `tests`, built by `cargo test --no-run` (already
/// built: nothing is compiled again), with their names.
fn test_executables(package: &str, tests: &[&str]) -> Result<Vec<(String, PathBuf)>, String> {
    // The whole workspace, as `cargo test --workspace` built it: a build of one package
    // resolves the dependencies' features differently and compiles everything again.
    let output = cargo()
        .args(["test", "--workspace", "--no-run", "--message-format=json"])
        .current_dir(root())
        .stderr(std::process::Stdio::inherit())
        .output()
        .map_err(|e| format!("cannot start cargo: {e}"))?;
    if !output.status.success() {
        return Err(format!("building the tests of {package} failed"));
    }
    let messages: Vec<serde_json::Value> = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    tests
        .iter()
        .map(|test| {
            messages
                .iter()
                .filter(|m| {
                    m["target"]["name"] == *test
                        && m["profile"]["test"] == true
                        && m["package_id"].as_str().is_some_and(|id| {
                            id.contains(&format!("/{package}#"))
                                || id.contains(&format!("#{package}@"))
                        })
                })
                .find_map(|m| m["executable"].as_str().map(PathBuf::from))
                .map(|executable| (test.to_string(), executable))
                .ok_or_else(|| format!("cargo did not name the {test} test executable"))
        })
        .collect()
}

fn test() -> Result<(), String> {
    let started = std::time::Instant::now();
    part("layering", layers::check)?;
    part("cargo test --workspace", || {
        run(cargo().args(["test", "--workspace"]))
    })?;
    // The cross-rank suites again, in the host backend's fast mode (what users run by
    // default): one thread per rank, on the caller's thread. The executables just built run
    // as they are: `SYMM_HOST_MODE` is set by `.cargo/config.toml`'s `[env]`, and cargo
    // rebuilds everything when an `[env]` value changes.
    part("the cross-rank suites in the fast mode", || {
        for (suite, executable) in test_executables("symm-tests", &FAST_MODE_SUITES)? {
            println!("xtask test: {suite} in the fast mode");
            run(Command::new(executable)
                .current_dir(root().join("tests"))
                .env("SYMM_HOST_MODE", "fast"))?;
        }
        Ok(())
    })?;
    part("loom", loom::run)?;
    part(
        "release build, C examples, install check, symm-perf",
        || {
            build_release_and_examples()?;
            run(Command::new("make")
                .args(["-C", "examples/c", "run"])
                .env("SYMM_BACKEND", "host")
                .env("SYMM_HOST_MODE", "fast"))?;
            install::check()?;
            // The benchmark, small and checked, on the host backend (it exits non-zero on a
            // wrong element).
            for args in [
                "all_reduce -b 8 -e 256K -f 8 -g 4 -n 2 -w 1 -c 1",
                "all_gather -b 64 -e 64K -f 16 -g 3 -d bfloat16 -n 2 -w 1 -c 1",
                "reduce_scatter -b 64 -e 64K -f 16 -g 5 -d int32 -o max -n 2 -w 1 -c 1",
                "all_reduce -b 8 -e 256K -f 8 --procs 3 -n 2 -w 1 -c 1",
                "all_gather -b 64 -e 64K -f 16 --procs 2 -d bfloat16 -n 2 -w 1 -c 1",
                "clc -t 300 -x 2 -k 10 -r 100 -n 1",
            ] {
                run(Command::new("target/release/symm-perf")
                    .args(args.split(' '))
                    .env("SYMM_BACKEND", "host")
                    .env("SYMM_HOST_MODE", "fast"))?;
            }
            Ok(())
        },
    )?;
    part("Python package and torch", python::pytest)?;
    part("Triton compile tests", triton::test)?;
    println!("xtask test: all passed in {:.0?}", started.elapsed());
    Ok(())
}

/// Run one part of `cargo xtask test` and print its wall time (CI's logs show where the
/// minutes go).
fn part(name: &str, body: impl FnOnce() -> Result<(), String>) -> Result<(), String> {
    let started = std::time::Instant::now();
    let result = body();
    println!("xtask test: {name}: {:.0?}", started.elapsed());
    result
}

fn demo() -> Result<(), String> {
    build_release_and_examples()?;
    run(Command::new("examples/c/allreduce")
        .arg("8")
        .env("SYMM_HOST_MODE", "fast"))
}

#[cfg(test)]
mod header_tests {
    use super::unprefixed_names;

    #[test]
    fn every_unprefixed_declaration_is_found() {
        let header = "#define SYMM_H\n#define MAX 3\ntypedef enum {\n  symmSuccess = 0,\n  \
                      Oops = 1,\n} symmResult_t;\ntypedef struct CUstream_st CUstream_st;\n\
                      typedef struct Model Model;\ntypedef struct {\n  int field;\n} Pair;\n\
                      // comment(x)\nsymmResult_t symmInit(int *x,\n                 int y);\n\
                      const char *helper(void);\n";
        assert_eq!(
            unprefixed_names(header),
            ["MAX", "Model", "Oops", "Pair", "helper"]
        );
    }

    #[test]
    fn the_shipped_header_declares_only_prefixed_names() {
        let header = std::fs::read_to_string(crate::root().join("ffi-headers/symm.h")).unwrap();
        assert_eq!(unprefixed_names(&header), Vec::<String>::new());
    }
}
