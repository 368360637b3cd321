//! `cargo xtask ptx`: PTX per target, the Triton-linkable library, and the ptxas report.

use crate::{cargo, root};
use std::path::{Path, PathBuf};
use std::process::Command;
use symm_artifacts::{gzip, split};

/// (target-cpu, PTX file name). `ptx-out/` holds each gzip-compressed (`<name>.gz`, see
/// [`gzip`]), and for [`SASS_TARGETS`] its SASS (`<stem>.cubin.gz`, see [`sass_file`]); the
/// plain text is written to `target/ptx/<name>`, the cubin next to it.
const TARGETS: [(&str, &str); 3] = [
    ("sm_80", "symm_sm80.ptx"),
    ("sm_90", "symm_sm90.ptx"),
    ("sm_100a", "symm_sm100a.ptx"),
];
/// Target-cpu the Triton libraries are built for: the oldest target (the functions use nothing
/// newer); Triton links them for every target (see [`triton_libraries`]).
const TRITON_CPU: &str = "sm_80";

/// The Triton-linkable libraries: the device functions of `symm_device::triton` and what they
/// call, as textual LLVM IR, each with the functions it exports (everything else is
/// internalized). `ptx-out/` holds each gzip-compressed (`symm_triton.ll.gz`: 2.9 MB instead of
/// 21.6, which keeps the checkout a GPU machine is sent small); [`plain_triton_library`] writes
/// the text where a tool needs it.
///
/// * `symm_triton.ll`: the native functions, linked into every kernel that calls symm;
/// * `symm_triton_<engine>.ll` (NVSHMEM, NCCL): that engine's functions on its engine windows,
///   and those that dispatch on the context's tag, linked beside `symm_triton.ll` only into a
///   kernel that links the engine's device bitcode too. Every kernel compile parses each library
///   it links, so a kernel without an engine does not parse the engines' code.
pub const TRITON_LIBRARIES: [(&str, &[&str]); 3] = [
    ("symm_triton.ll", &NATIVE_FUNCTIONS),
    (
        "symm_triton_nvshmem.ll",
        &[
            "symm_nvshmem_all_reduce",
            "symm_nvshmem_all_gather",
            "symm_nvshmem_barrier",
            "symm_dispatch_nvshmem_all_reduce",
            "symm_dispatch_nvshmem_all_gather",
            "symm_dispatch_nvshmem_barrier",
        ],
    ),
    (
        "symm_triton_nccl.ll",
        &[
            "symm_nccl_all_reduce",
            "symm_nccl_all_gather",
            "symm_nccl_barrier",
            "symm_dispatch_nccl_all_reduce",
            "symm_dispatch_nccl_all_gather",
            "symm_dispatch_nccl_barrier",
        ],
    ),
];

/// The native Triton library's file name (`symm_triton.ll`).
pub const NATIVE_TRITON_LIBRARY: &str = TRITON_LIBRARIES[0].0;

/// The Triton library `name`'s text, from `ptx-out/<name>.gz`.
pub fn triton_library_text(name: &str) -> Result<Vec<u8>, String> {
    std::fs::read(root().join("ptx-out").join(format!("{name}.gz")))
        .map_err(|e| e.to_string())
        .and_then(|bytes| gzip::decompress(&bytes))
        .map_err(|e| format!("ptx-out/{name}.gz: {e} (run `cargo xtask ptx`)"))
}

/// Write the Triton library `name`'s text as `dir/<name>` (creating `dir`) unless that file
/// already holds it; return its path.
pub fn plain_triton_library(dir: &Path, name: &str) -> Result<PathBuf, String> {
    let text = triton_library_text(name)?;
    std::fs::create_dir_all(dir).map_err(|e| format!("creating {dir:?}: {e}"))?;
    let path = dir.join(name);
    if std::fs::read(&path).ok().as_deref() != Some(&text[..]) {
        std::fs::write(&path, &text).map_err(|e| format!("writing {path:?}: {e}"))?;
    }
    Ok(path)
}

/// The device functions of native windows: the Triton library's and `libsymm_device.a`'s.
pub const NATIVE_FUNCTIONS: [&str; 3] = ["symm_all_reduce", "symm_all_gather", "symm_barrier"];

pub fn generate(check: bool) -> Result<(), String> {
    let root = root();
    let plain_dir = root.join("target/ptx");
    let out_dir = if check {
        root.join("target/ptx/check")
    } else {
        root.join("ptx-out")
    };
    std::fs::create_dir_all(&out_dir).map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&plain_dir).map_err(|e| e.to_string())?;
    let ptxas = find_ptxas()?;

    let started = std::time::Instant::now();
    // Each build spends most of its time in one thread (the device crate's codegen and the
    // bitcode linker): the targets and the Triton library build beside each other, each in
    // its own target directory.
    let (built, library) = std::thread::scope(|scope| {
        let targets: Vec<_> = TARGETS
            .iter()
            .map(|(cpu, _)| scope.spawn(move || build_device(cpu, false)))
            .collect();
        let library = scope.spawn(|| triton_libraries(TRITON_CPU));
        let built: Vec<Result<PathBuf, String>> = targets
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("build thread panicked".into()))
            })
            .collect();
        let library = library
            .join()
            .unwrap_or_else(|_| Err("build thread panicked".into()));
        (built, library)
    });
    let library = library?;
    println!("   built in {:.0?}", started.elapsed());
    for ((_, file), built) in TARGETS.iter().zip(built) {
        let built = built?;
        let plain = plain_dir.join(file);
        std::fs::copy(&built, &plain).map_err(|e| format!("copying {built:?}: {e}"))?;
    }
    // Each target's whole module is one long ptxas run: the three run beside the per-kernel
    // checks, which share the remaining cores.
    let assembled: Vec<Result<Vec<String>, String>> = std::thread::scope(|scope| {
        let whole: Vec<_> = TARGETS
            .iter()
            .map(|(cpu, file)| {
                let plain = plain_dir.join(file);
                let ptxas = &ptxas;
                scope.spawn(move || assemble(ptxas, cpu, &plain, &plain.with_extension("cubin")))
            })
            .collect();
        let each: Result<(), String> = TARGETS
            .iter()
            .try_for_each(|(cpu, file)| assemble_each_kernel(&ptxas, cpu, &plain_dir.join(file)));
        let mut results: Vec<_> = whole
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err("ptxas thread panicked".into()))
            })
            .collect();
        results.push(each.map(|()| Vec::new()));
        results
    });
    println!("   ptxas checks done at {:.0?}", started.elapsed());
    let mut failures = Vec::new();
    for result in assembled {
        failures.extend(result?);
    }
    for (cpu, file) in TARGETS {
        let plain = plain_dir.join(file);
        let cubin = plain.with_extension("cubin");
        let text = std::fs::read(&plain).map_err(|e| format!("reading {plain:?}: {e}"))?;
        let compressed = out_dir.join(format!("{file}.gz"));
        std::fs::write(&compressed, gzip::compress(&text))
            .map_err(|e| format!("writing {compressed:?}: {e}"))?;
        if SASS_TARGETS.contains(&cpu) {
            let sass = std::fs::read(&cubin).map_err(|e| format!("reading {cubin:?}: {e}"))?;
            let compressed = out_dir.join(sass_file(file));
            std::fs::write(&compressed, gzip::compress(&sass))
                .map_err(|e| format!("writing {compressed:?}: {e}"))?;
        }
    }
    let version = ptxas_version(&ptxas)?;
    std::fs::write(out_dir.join(SASS_VERSION_FILE), &version)
        .map_err(|e| format!("writing {SASS_VERSION_FILE}: {e}"))?;
    for (file, text) in &library {
        std::fs::write(plain_dir.join(file), text).map_err(|e| format!("writing {file}: {e}"))?;
        if !check {
            write_compressed_triton_library(file, text.as_bytes())?;
        }
    }

    if !failures.is_empty() {
        return Err(format!(
            "kernels with spills, a stack frame or more than {MAX_REGISTERS_PER_THREAD} registers: \
             {failures:?}"
        ));
    }
    if check {
        // The SASS is what this ptxas makes of the PTX; another ptxas version makes other
        // bytes, so the version is compared first.
        let committed_version =
            std::fs::read_to_string(root.join("ptx-out").join(SASS_VERSION_FILE))
                .map_err(|e| format!("ptx-out/{SASS_VERSION_FILE}: {e}"))?;
        if committed_version != version {
            return Err(format!(
                "ptx-out/*.cubin.gz were assembled by {:?}, this ptxas is {:?}: check with that \
                 ptxas (PTXAS=...) or run `cargo xtask ptx` and commit",
                committed_version.trim(),
                version.trim()
            ));
        }
        for (_, file) in TARGETS.iter().filter(|(cpu, _)| SASS_TARGETS.contains(cpu)) {
            let fresh = std::fs::read(plain_dir.join(file).with_extension("cubin"))
                .map_err(|e| e.to_string())?;
            let name = sass_file(file);
            let committed = std::fs::read(root.join("ptx-out").join(&name))
                .map_err(|e| e.to_string())
                .and_then(|bytes| gzip::decompress(&bytes))
                .map_err(|e| format!("ptx-out/{name}: {e}"))?;
            if fresh != committed {
                return Err(format!(
                    "ptx-out/{name} differs from a fresh build: run `cargo xtask ptx` and commit"
                ));
            }
        }
        // The PTX is compared as text (a different compressor may write other bytes).
        for (_, file) in TARGETS {
            let fresh = std::fs::read(plain_dir.join(file)).map_err(|e| e.to_string())?;
            let name = format!("{file}.gz");
            let committed = std::fs::read(root.join("ptx-out").join(&name))
                .map_err(|e| e.to_string())
                .and_then(|bytes| gzip::decompress(&bytes))
                .map_err(|e| format!("ptx-out/{name}: {e}"))?;
            if fresh != committed {
                return Err(format!(
                    "ptx-out/{name} differs from a fresh build: run `cargo xtask ptx` and commit"
                ));
            }
        }
        for (file, _) in TRITON_LIBRARIES {
            let fresh = std::fs::read(plain_dir.join(file)).map_err(|e| e.to_string())?;
            if fresh != triton_library_text(file)? {
                return Err(format!(
                    "ptx-out/{file}.gz differs from a fresh build: run `cargo xtask ptx` and commit"
                ));
            }
        }
        println!("ptx-out/ is up to date");
    } else {
        for (_, file) in TARGETS {
            println!(
                "wrote ptx-out/{file}.gz (plain text: target/ptx/{file}, or gunzip -k ptx-out/{file}.gz)"
            );
        }
    }
    Ok(())
}

/// `cargo xtask triton-library`: only the Triton libraries (`ptx-out/symm_triton*.ll.gz`, part
/// of `cargo xtask ptx`), for working on the device functions without rebuilding every kernel.
pub fn generate_triton_library() -> Result<(), String> {
    let plain_dir = root().join("target/ptx");
    std::fs::create_dir_all(&plain_dir).map_err(|e| e.to_string())?;
    for (file, text) in triton_libraries(TRITON_CPU)? {
        let plain = plain_dir.join(file);
        std::fs::write(&plain, &text).map_err(|e| format!("writing {plain:?}: {e}"))?;
        write_compressed_triton_library(file, text.as_bytes())?;
    }
    Ok(())
}

/// Write `ptx-out/<file>.gz` (and remove an uncompressed copy an older checkout left).
fn write_compressed_triton_library(file: &str, text: &[u8]) -> Result<(), String> {
    let out = root().join("ptx-out");
    let dest = out.join(format!("{file}.gz"));
    // Written beside it and renamed: a process decompressing it meanwhile reads the old file
    // or the new one, never half of one.
    let partial = out.join(format!(".{file}.gz.partial"));
    std::fs::write(&partial, gzip::compress(text))
        .and_then(|()| std::fs::rename(&partial, &dest))
        .map_err(|e| format!("writing {dest:?}: {e}"))?;
    let _ = std::fs::remove_file(out.join(file));
    println!("wrote ptx-out/{file}.gz (plain text: target/ptx/{file})");
    Ok(())
}

/// Build the device crate for `cpu`; return the PTX, or the fat-LTO bitcode of the
/// `triton-library` build when `bitcode`.
fn build_device(cpu: &str, bitcode: bool) -> Result<PathBuf, String> {
    let kind = if bitcode { "triton" } else { "ptx" };
    let target_dir = root().join(format!("target/ptx/{kind}_{cpu}"));
    let mut command = cargo();
    command
        .args(["rustc", "-p", "symm-device", "--release", "--quiet"])
        .args(if bitcode {
            ["--features", "triton-library"]
        } else {
            ["--features", "kernels"]
        })
        .args(["--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
        .args(["--crate-type", "cdylib", "--target-dir"])
        .arg(&target_dir)
        .args(["--", "-C", &format!("target-cpu={cpu}")])
        // Nightly-only device features (abi_ptx, stdarch_nvptx, asm_experimental_arch) are
        // enabled for this build alone.
        .env("RUSTC_BOOTSTRAP", "1")
        .env_remove("RUSTFLAGS")
        .env_remove("CARGO_ENCODED_RUSTFLAGS");
    if bitcode {
        // Panic locations inside `core` name the toolchain's source directory: map it to a
        // fixed name so that the library does not depend on where the toolchain lives.
        let remap = format!("--remap-path-prefix={}=/rust", sysroot()?.display());
        command
            .arg("--emit=llvm-bc")
            .env("CARGO_PROFILE_RELEASE_LTO", "fat")
            .env("CARGO_ENCODED_RUSTFLAGS", remap);
    }
    crate::run(&mut command)?;
    let release = target_dir.join("nvptx64-nvidia-cuda/release");
    Ok(if bitcode {
        release.join("deps/symm_device.bc")
    } else {
        release.join("symm_device.ptx")
    })
}

/// The toolchain's sysroot (where `opt`, `llvm-dis` and the `core` sources live).
fn sysroot() -> Result<PathBuf, String> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    let output = Command::new(rustc)
        .args(["--print", "sysroot"])
        .current_dir(root())
        .output()
        .map_err(|e| format!("rustc --print sysroot: {e}"))?;
    Ok(PathBuf::from(
        String::from_utf8_lossy(&output.stdout).trim(),
    ))
}

/// An LLVM tool of the toolchain's `llvm-tools` component (the LLVM that wrote the bitcode).
pub fn llvm_tool(name: &str) -> Result<PathBuf, String> {
    let sysroot = sysroot()?;
    let bin = sysroot
        .join("lib/rustlib")
        .join(host_triple())
        .join("bin")
        .join(name);
    if bin.exists() {
        Ok(bin)
    } else {
        Err(format!(
            "{} not found: `rustup component add llvm-tools`",
            bin.display()
        ))
    }
}

/// The host's target triple, as rustc names it.
fn host_triple() -> String {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_string());
    Command::new(rustc)
        .arg("-vV")
        .current_dir(root())
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        })
        .unwrap_or_else(|| "x86_64-unknown-linux-gnu".to_string())
}

/// The Triton-linkable libraries ([`TRITON_LIBRARIES`]: file name and text) as textual LLVM IR:
/// the `triton-library` build's fat-LTO bitcode, reduced for each to its exported functions and
/// what they call (`internalize` +
/// `globaldce`), disassembled, and made readable by every Triton from 3.5 on:
///
/// * the attribute `nocreateundeforpoison`, which this LLVM (22.1) puts on intrinsic
///   declarations, is removed: the LLVM 22.0 snapshots inside Triton 3.5 and 3.6 refuse it
///   ("Failed to parse library"), and as text (unlike bitcode, which re-derives intrinsic
///   attributes) it stays removed; it only allows optimizations, so dropping it is sound;
/// * `"target-cpu"` and `"target-features"` function attributes are removed, so that Triton
///   can inline the functions into kernels for any target (LLVM refuses to inline across
///   different target attributes); the functions use nothing newer than sm_70.
///
/// Each library defines no external function but its exports, so that a kernel links several
/// side by side. Triton replaces the triple and data layout with its own when it links them.
fn triton_libraries(cpu: &str) -> Result<Vec<(&'static str, String)>, String> {
    let bitcode = build_device(cpu, true)?;
    let work = root().join("target/ptx/triton_work");
    std::fs::create_dir_all(&work).map_err(|e| e.to_string())?;
    let mut libraries = Vec::new();
    for (file, exports) in TRITON_LIBRARIES {
        let stem = file.trim_end_matches(".ll");
        let native = file == NATIVE_TRITON_LIBRARY;
        // An engine's library keeps the native functions its dispatching ones call, as
        // declarations: the native library defines them.
        let kept: Vec<&str> = if native {
            exports.to_vec()
        } else {
            exports.iter().chain(&NATIVE_FUNCTIONS).copied().collect()
        };
        let reduced = work.join(format!("{stem}.bc"));
        let text = work.join(file);
        crate::run(
            Command::new(llvm_tool("opt")?)
                .arg("-passes=internalize,globaldce")
                .arg(format!("-internalize-public-api-list={}", kept.join(",")))
                .arg(&bitcode)
                .arg("-o")
                .arg(&reduced),
        )?;
        if !native {
            // The native definitions become declarations, and what only they called goes.
            let disassembled = work.join(format!("{stem}.full.ll"));
            crate::run(
                Command::new(llvm_tool("llvm-dis")?)
                    .arg(&reduced)
                    .arg("-o")
                    .arg(&disassembled),
            )?;
            let ir = std::fs::read_to_string(&disassembled)
                .map_err(|e| format!("reading {disassembled:?}: {e}"))?;
            let declared = work.join(format!("{stem}.declared.ll"));
            std::fs::write(&declared, declare_functions(&ir, &NATIVE_FUNCTIONS)?)
                .map_err(|e| format!("writing {declared:?}: {e}"))?;
            crate::run(
                Command::new(llvm_tool("opt")?)
                    .arg("-passes=globaldce")
                    .arg(&declared)
                    .arg("-o")
                    .arg(&reduced),
            )?;
        }
        crate::run(
            Command::new(llvm_tool("llvm-dis")?)
                .arg(&reduced)
                .arg("-o")
                .arg(&text),
        )?;
        let ir = std::fs::read_to_string(&text).map_err(|e| format!("reading {text:?}: {e}"))?;
        let library = make_portable(&ir);
        check_exports(file, &library, exports)?;
        libraries.push((file, library));
    }
    Ok(libraries)
}

/// Textual IR `ir` with each function of `names` made a declaration: its `define` header
/// becomes a `declare` (parameter names dropped), its body goes.
fn declare_functions(ir: &str, names: &[&str]) -> Result<String, String> {
    let mut out = String::with_capacity(ir.len());
    let mut lines = ir.lines();
    let mut declared = Vec::new();
    while let Some(line) = lines.next() {
        let name = line
            .strip_prefix("define ")
            .and_then(|rest| rest.split_once(" @"))
            .and_then(|(_, rest)| rest.split_once('('))
            .map(|(name, _)| name)
            .filter(|name| names.contains(name));
        let Some(name) = name else {
            out.push_str(line);
            out.push('\n');
            continue;
        };
        let header = line.strip_suffix(" {").ok_or_else(|| {
            format!("the definition of {name} does not open its body on its line")
        })?;
        let open = header.find('(').expect("the name was followed by '('");
        let close = header
            .rfind(')')
            .filter(|close| *close > open)
            .ok_or_else(|| format!("no parameter list in the definition of {name}"))?;
        let parameters: Vec<&str> = header[open + 1..close]
            .split(", ")
            .map(|p| p.rsplit_once(" %").map_or(p, |(ty, _)| ty))
            .collect();
        // Attachments such as `!dbg` belong to a body.
        let after = header[close + 1..]
            .split(" !")
            .next()
            .expect("split yields one part");
        out.push_str(&format!(
            "declare {}({}){after}\n",
            &header["define ".len()..open],
            parameters.join(", ")
        ));
        for body in lines.by_ref() {
            if body == "}" {
                break;
            }
        }
        declared.push(name);
    }
    match names.iter().find(|n| !declared.contains(n)) {
        Some(missing) => Err(format!("no definition of {missing} to declare")),
        None => Ok(out),
    }
}

/// Check that the Triton library `file` defines each of `exports`, no other external function
/// (the libraries are linked side by side), and no kernel entry point.
fn check_exports(file: &str, library: &str, exports: &[&str]) -> Result<(), String> {
    let defined: Vec<&str> = library
        .lines()
        .filter(|l| {
            l.starts_with("define ")
                && !l.starts_with("define internal ")
                && !l.starts_with("define private ")
        })
        .filter_map(|l| {
            l.split_once(" @")
                .and_then(|(_, rest)| rest.split_once('('))
                .map(|(name, _)| name)
        })
        .collect();
    for function in exports {
        if !defined.contains(function) {
            return Err(format!("{file} lacks a definition of {function}"));
        }
    }
    if let Some(other) = defined.iter().find(|name| !exports.contains(name)) {
        return Err(format!("{file} defines {other}, which it does not export"));
    }
    if library
        .lines()
        .any(|l| l.starts_with("define ") && l.contains("ptx_kernel"))
    {
        return Err(format!("{file} holds kernel entry points"));
    }
    Ok(())
}

/// Remove from textual IR what older LLVMs cannot read or what ties it to one target (see
/// [`triton_libraries`]); the module identifier line names a work file and is dropped too.
fn make_portable(ir: &str) -> String {
    let mut out = String::with_capacity(ir.len());
    for line in ir.lines() {
        if line.starts_with("; ModuleID") {
            continue;
        }
        let line = line.replace(" nocreateundeforpoison", "");
        // A `memory(...)` naming the target-specific locations `target_mem0`/`target_mem1`
        // (new in LLVM 22.1) is dropped whole: no memory attribute means "may access
        // anything", which is always sound.
        let mut line = strip_target_memory(&line);
        for key in ["\"target-cpu\"=\"", "\"target-features\"=\""] {
            while let Some(start) = line.find(&format!(" {key}")) {
                let value = start + 1 + key.len();
                let end = line[value..]
                    .find('"')
                    .map_or(line.len(), |e| value + e + 1);
                line.replace_range(start..end, "");
            }
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}

/// Drop every ` memory(...)` attribute of `text` that names `target_mem*` (see
/// [`make_portable`]).
fn strip_target_memory(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find(" memory(") {
        let Some(length) = rest[start..].find(')') else {
            break;
        };
        let end = start + length + 1;
        out.push_str(&rest[..start]);
        if !rest[start..end].contains("target_mem") {
            out.push_str(&rest[start..end]);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// ptxas from `$PTXAS`, the PATH, or the pip cache that `.ci/run` fills.
fn find_ptxas() -> Result<PathBuf, String> {
    if let Ok(path) = std::env::var("PTXAS") {
        return Ok(PathBuf::from(path));
    }
    let cache = std::env::var("SYMM_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/symm")
        });
    let candidates = [
        cache.join("nvcc/nvidia/cu13/bin/ptxas"),
        cache.join("nvcc/nvidia/cuda_nvcc/bin/ptxas"),
    ];
    if let Some(found) = candidates.iter().find(|p| p.exists()) {
        return Ok(found.clone());
    }
    if Command::new("ptxas").arg("--version").output().is_ok() {
        return Ok(PathBuf::from("ptxas"));
    }
    Err(format!(
        "ptxas not found: `python3 -m pip install --target {}/nvcc nvidia-cuda-nvcc` or set PTXAS",
        cache.display()
    ))
}

/// Cut every kernel of `ptx` into its own module, as libsymm loads them, and check that ptxas
/// accepts each one (on every core).
fn assemble_each_kernel(ptxas: &Path, cpu: &str, ptx: &Path) -> Result<(), String> {
    let text = std::fs::read_to_string(ptx).map_err(|e| format!("reading {ptx:?}: {e}"))?;
    let index = split::PtxIndex::new(&text);
    let kernels = index.kernels();
    let dir = root().join("target/ptx/kernels").join(cpu);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(2, |n| n.get());
    let errors: Vec<String> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut errors = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let Some(kernel) = kernels.get(i) else { break };
                        let module = index.kernel_module(kernel).expect("listed kernel");
                        let file = dir.join(format!("{kernel}.ptx"));
                        let checked = std::fs::write(&file, module)
                            .map_err(|e| e.to_string())
                            .and_then(|()| {
                                // Whether ptxas accepts the module on its own (every
                                // name it uses declared) does not depend on optimization:
                                // `-O0` answers in about half the time. The whole module is
                                // assembled as shipped by `assemble`.
                                Command::new(ptxas)
                                    .args([&format!("-arch={cpu}"), "-O0", "-o", "/dev/null"])
                                    .arg(&file)
                                    .output()
                                    .map_err(|e| e.to_string())
                            });
                        // The module is only ptxas's input: ~2000 of them per target would
                        // otherwise stay on the disk.
                        let _ = std::fs::remove_file(&file);
                        match checked {
                            Ok(out) if out.status.success() => {}
                            Ok(out) => errors.push(format!(
                                "{cpu} {kernel}: {}",
                                String::from_utf8_lossy(&out.stderr)
                            )),
                            Err(e) => errors.push(format!("{cpu} {kernel}: {e}")),
                        }
                    }
                    errors
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    if !errors.is_empty() {
        return Err(format!(
            "per-kernel modules rejected by ptxas:\n{}",
            errors.join("\n")
        ));
    }
    println!(
        "{cpu:>8}: all {} per-kernel modules assemble on their own",
        kernels.len()
    );
    Ok(())
}

/// The targets whose SASS is shipped: every target, so that no supported GPU JIT-compiles a
/// kernel at its first use (sm_80 SASS runs on 8.0–8.9, sm_90 on Hopper, sm_100a on 10.0).
/// Each cubin is about 2.5 MB compressed in every binary that embeds libsymm; GPUs without
/// SASS of their own (10.3, 12.x) JIT-compile the PTX.
const SASS_TARGETS: [&str; 3] = ["sm_80", "sm_90", "sm_100a"];

/// The file in `ptx-out/` naming the ptxas that assembled the shipped SASS.
const SASS_VERSION_FILE: &str = "sass-ptxas-version.txt";

/// `ptx-out/` name of the SASS assembled from PTX file `ptx` (`symm_sm90.ptx` →
/// `symm_sm90.cubin.gz`).
fn sass_file(ptx: &str) -> String {
    format!("{}.cubin.gz", ptx.trim_end_matches(".ptx"))
}

/// The last line of `ptxas --version` (the release and build), with a newline.
fn ptxas_version(ptxas: &Path) -> Result<String, String> {
    let output = Command::new(ptxas)
        .arg("--version")
        .output()
        .map_err(|e| format!("running {ptxas:?} --version: {e}"))?;
    let text = String::from_utf8_lossy(&output.stdout).into_owned();
    let last = text
        .lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or("");
    Ok(format!("{}\n", last.trim()))
}

/// Most registers a kernel's thread may use: the host launches 512 threads per block
/// (`plan::GPU_MODEL`), and a multiprocessor has 65536 registers; a kernel above this would
/// fail to launch (`CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`).
const MAX_REGISTERS_PER_THREAD: u64 = 65536 / 512;

/// Threads per block of the send/receive kernel at most (`point_to_point::MAX_THREADS` of the
/// device crate, which the host's plan keeps to).
const SEND_RECEIVE_MAX_THREADS: u64 = 256;

/// Assemble `ptx` for `cpu` into `cubin`, print per-kernel resources, and return the kernels
/// that spill, have a stack frame or use more than [`MAX_REGISTERS_PER_THREAD`] registers.
fn assemble(ptxas: &Path, cpu: &str, ptx: &Path, cubin: &Path) -> Result<Vec<String>, String> {
    let output = Command::new(ptxas)
        .args(["-v", &format!("-arch={cpu}"), "-o"])
        .arg(cubin)
        .arg(ptx)
        .output()
        .map_err(|e| format!("running {ptxas:?}: {e}"))?;
    let log = String::from_utf8_lossy(&output.stderr).into_owned()
        + &String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!("ptxas rejected {}:\n{log}", ptx.display()));
    }
    let mut failures = Vec::new();
    let mut entry: Option<String> = None;
    let mut frame_and_spills = (0u64, 0u64);
    for line in log.lines() {
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            entry = rest.split('\'').next().map(str::to_string);
        } else if line.contains("bytes stack frame") {
            let numbers: Vec<u64> = line
                .split_whitespace()
                .filter_map(|w| w.parse().ok())
                .collect();
            if let [frame, stores, loads, ..] = numbers[..] {
                frame_and_spills = (frame, stores + loads);
            }
        } else if let (Some(name), Some(rest)) = (&entry, line.split("Used ").nth(1)) {
            let registers = rest.split_whitespace().next().unwrap_or("?");
            let (frame, spills) = frame_and_spills;
            println!(
                "{cpu:>8} {name}: {registers} registers, {spills} spill bytes, {frame} bytes stack frame"
            );
            // The send/receive kernel is launched with smaller blocks (the host's plan).
            let limit = if name == "symm_send_receive" {
                65536 / SEND_RECEIVE_MAX_THREADS
            } else {
                MAX_REGISTERS_PER_THREAD
            };
            let too_many = registers.parse::<u64>().is_ok_and(|r| r > limit);
            if frame > 0 || spills > 0 || too_many {
                failures.push(format!("{cpu}:{name}"));
            }
            entry = None;
            frame_and_spills = (0, 0);
        }
    }
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::make_portable;

    #[test]
    fn portable_ir_drops_new_attributes_and_target_pins() {
        let ir = "; ModuleID = 'x.bc'\nattributes #0 = { nounwind \"target-cpu\"=\"sm_80\" \"target-features\"=\"+ptx70,+sm_80\" }\nattributes #1 = { nocallback nocreateundeforpoison nofree memory(none) }\nattributes #2 = { nofree memory(readwrite, inaccessiblemem: none, target_mem0: none) nosync }\n";
        assert_eq!(
            make_portable(ir),
            "attributes #0 = { nounwind }\nattributes #1 = { nocallback nofree memory(none) }\nattributes #2 = { nofree nosync }\n"
        );
    }
}
