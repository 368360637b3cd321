//! `cargo xtask device-lib [--test]`: symm's device functions for CUDA C++ kernels.
//!
//! From `ptx-out/symm_triton.ll.gz` (the device functions Triton links), built with the Rust
//! toolchain's own `llc` (the LLVM that wrote the IR) and NVIDIA's compiler from the
//! `nvidia-cuda-nvcc` wheel (no GPU and no toolkit needed):
//!
//! * `target/device-lib/symm_device.ptx` — the functions as PTX (sm_80, runs on every newer
//!   target), for programs that link at run time (`cuLinkAddData` with `CU_JIT_INPUT_PTX`);
//!   the driver JIT-compiles all of it at every link (tens of seconds);
//! * `target/device-lib/libsymm_device.a` — relocatable device code with sm_80 and sm_90
//!   SASS and compute_80 PTX (for newer targets), for `nvcc -rdc=true ... -lsymm_device`, and
//!   for linking at run time without compiling (`cuLinkAddFile` with `CU_JIT_INPUT_LIBRARY`;
//!   `symm_device.o`, the same code, with `CU_JIT_INPUT_OBJECT`).
//!
//! The declarations are `ffi-headers/symm_device.cuh`. `--test` then builds the examples of
//! `examples/cuda` with nvcc — `device_allreduce` is compiled and device-linked against the
//! archive (nvlink refuses a prototype whose parameter sizes differ), `kernel.ptx` is the
//! user kernel for run-time linking — and, when the simulated GPU is built (`cargo xtask
//! sim`), runs `jit_link` on it: the user kernel and the library linked by the driver and
//! executed through libsymm's cuda backend, checked against a reference.

use crate::{cargo, root, run};
use std::path::{Path, PathBuf};
use std::process::Command;

/// The directory the library is written to.
pub fn out_dir() -> PathBuf {
    root().join("target/device-lib")
}

/// `cargo xtask device-lib [--test]`.
pub fn device_lib(args: &[String]) -> Result<(), String> {
    let nvcc = find_nvcc()?;
    build(&nvcc)?;
    if args.iter().any(|a| a == "--test") {
        test(&nvcc)?;
    }
    Ok(())
}

/// nvcc from `$NVCC`, the pip cache that `.ci/run` fills (`nvidia-cuda-nvcc` with its
/// dependencies), or the PATH.
fn find_nvcc() -> Result<PathBuf, String> {
    if let Ok(path) = std::env::var("NVCC") {
        return Ok(PathBuf::from(path));
    }
    let cache = std::env::var("SYMM_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/symm")
        });
    let wheel = cache.join("nvcc/nvidia/cu13/bin/nvcc");
    if wheel.exists() {
        return Ok(wheel);
    }
    if Command::new("nvcc").arg("--version").output().is_ok() {
        return Ok(PathBuf::from("nvcc"));
    }
    Err(format!(
        "nvcc not found: `python3 -m pip install --target {}/nvcc nvidia-cuda-nvcc==13.5.37` \
         or set NVCC",
        cache.display()
    ))
}

/// A command running `nvcc` with its own directory first on the PATH (it finds cicc, ptxas,
/// nvlink and fatbinary there).
fn nvcc_command(nvcc: &Path) -> Command {
    let mut command = Command::new(nvcc);
    if let Some(bin) = nvcc.parent().filter(|p| !p.as_os_str().is_empty()) {
        let path = std::env::var("PATH").unwrap_or_default();
        command.env("PATH", format!("{}:{path}", bin.display()));
    }
    command
}

fn build(nvcc: &Path) -> Result<(), String> {
    let out = out_dir();
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {out:?}: {e}"))?;
    let ptx = out.join("symm_device.ptx");
    let library = crate::ptx::plain_triton_library(&out, crate::ptx::NATIVE_TRITON_LIBRARY)?;
    // The native library exports the native functions only: the engine ones need an engine's
    // device bitcode, which a CUDA C++ program linking this archive need not have.
    // No jump tables: an indexed branch (`brx.idx`) is slower than the few compares it
    // replaces here, and the simulated GPU runs the same text.
    run(Command::new(crate::ptx::llvm_tool("llc")?)
        .args([
            "-march=nvptx64",
            "-mcpu=sm_80",
            "-O3",
            "-min-jump-table-entries=1000000",
        ])
        .arg(&library)
        .arg("-o")
        .arg(&ptx))?;
    let object = out.join("symm_device.o");
    run(nvcc_command(nvcc)
        .args(["-dc", "-gencode", "arch=compute_80,code=sm_80"])
        .args(["-gencode", "arch=compute_80,code=sm_90"])
        .args(["-gencode", "arch=compute_80,code=compute_80"])
        .arg(&ptx)
        .arg("-o")
        .arg(&object))?;
    let archive = out.join("libsymm_device.a");
    let _ = std::fs::remove_file(&archive);
    run(nvcc_command(nvcc)
        .arg("-lib")
        .arg(&object)
        .arg("-o")
        .arg(&archive))?;
    println!("wrote {} and {}", ptx.display(), archive.display());
    Ok(())
}

fn test(nvcc: &Path) -> Result<(), String> {
    run(cargo().args(["build", "--release", "-p", "symm-c"]))?;
    let examples = root().join("examples/cuda");
    let nvcc_var = format!("NVCC={}", nvcc.display());
    let bin = nvcc.parent().map(Path::to_path_buf).unwrap_or_default();
    let path = format!(
        "{}:{}",
        bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // The CUDA headers of the wheel (cuda.h for jit_link); the driver is the simulator's
    // when it is built, else the program is only compiled.
    let cuda_home = bin.parent().map(Path::to_path_buf).unwrap_or_default();
    let sim = root().join("target/sim");
    let mut make = Command::new("make");
    make.arg("-C")
        .arg(&examples)
        .arg(&nvcc_var)
        .arg(format!(
            "CUDA_INCLUDE={}",
            cuda_home.join("include").display()
        ))
        .arg(format!("CUDA_LIB={}", sim.display()))
        .env("PATH", &path);
    run(make.arg("clean").arg("all"))?;
    if !sim.join("libcuda.so").exists() {
        println!(
            "device-lib: examples built; the simulated GPU is not built (`cargo xtask sim`), \
             so jit_link did not run"
        );
        return Ok(());
    }
    // The library as PTX (JIT-compiled whole), as the archive (CU_JIT_INPUT_LIBRARY: on a GPU
    // its SASS, here the PTX inside its fatbin) and as the object (CU_JIT_INPUT_OBJECT).
    for (seed, ranks, count, library) in [
        ("1", "4", "4099", "symm_device.ptx"),
        ("2", "3", "1023", "symm_device.ptx"),
        ("3", "1", "7", "symm_device.ptx"),
        ("4", "4", "4099", "libsymm_device.a"),
        ("5", "2", "513", "symm_device.o"),
    ] {
        let status = Command::new(examples.join("jit_link"))
            .arg(examples.join("kernel.ptx"))
            .arg(out_dir().join(library))
            .args([ranks, count])
            .current_dir(&examples)
            .env("LD_LIBRARY_PATH", &sim)
            .env("SYMM_BACKEND", "cuda")
            .env("SYMM_TIMEOUT_MS", "5000")
            .env("SYMM_SIM_SEED", seed)
            .env("SYMM_SIM_SMS", "16")
            .status()
            .map_err(|e| format!("cannot start jit_link: {e}"))?;
        if !status.success() {
            return Err(format!(
                "jit_link {library} {ranks} {count} failed on the simulated GPU ({status}), \
                 SYMM_SIM_SEED={seed}"
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// (name, parameter types) of each `extern "C"` function declared in `symm_device.cuh`.
    fn header_prototypes(text: &str) -> Vec<(String, Vec<String>)> {
        text.split("__device__ int ")
            .skip(1)
            .map(|decl| {
                let decl = &decl[..decl.find(';').expect("declaration ends")];
                let (name, params) = decl.split_once('(').expect("parameters");
                let params = &params[..params.rfind(')').expect("close")];
                let types = params
                    .split(',')
                    .map(|p| {
                        let words: Vec<&str> = p.split_whitespace().collect();
                        words[..words.len() - 1].join(" ")
                    })
                    .collect();
                (name.trim().to_string(), types)
            })
            .collect()
    }

    /// (name, LLVM parameter types) of each exported `define` in the Triton library.
    fn library_functions(text: &str) -> Vec<(String, Vec<String>)> {
        text.lines()
            .filter(|l| l.starts_with("define ") && !l.contains(" internal "))
            .filter(|l| {
                crate::ptx::NATIVE_FUNCTIONS
                    .iter()
                    .any(|f| l.contains(&format!(" @{f}(")))
            })
            .map(|l| {
                let at = l.find(" @").expect("name");
                let (name, params) = l[at + 2..].split_once('(').expect("parameters");
                let params = &params[..params.find(')').expect("close")];
                let types = params
                    .split(',')
                    .map(|p| p.split_whitespace().next().unwrap_or("").to_string())
                    .collect();
                (name.to_string(), types)
            })
            .collect()
    }

    #[test]
    fn the_header_declares_every_library_function_with_its_exact_types() {
        let root = crate::root();
        let header = std::fs::read_to_string(root.join("ffi-headers/symm_device.cuh"))
            .expect("symm_device.cuh");
        let library = String::from_utf8(
            crate::ptx::triton_library_text(crate::ptx::NATIVE_TRITON_LIBRARY).expect("library"),
        )
        .expect("the library is text");
        let mut declared = header_prototypes(&header);
        let mut defined = library_functions(&library);
        declared.sort();
        defined.sort();
        let as_llvm = |c: &str| match c {
            "long long" => "i64",
            "int" => "i32",
            other => panic!("symm_device.cuh uses {other:?}: only int and long long map exactly"),
        };
        let declared: Vec<(String, Vec<&str>)> = declared
            .iter()
            .map(|(n, t)| (n.clone(), t.iter().map(|t| as_llvm(t)).collect()))
            .collect();
        let defined: Vec<(String, Vec<&str>)> = defined
            .iter()
            .map(|(n, t)| (n.clone(), t.iter().map(String::as_str).collect()))
            .collect();
        assert_eq!(declared, defined);
        assert_eq!(declared.len(), 3, "all-reduce, all-gather and barrier");
    }
}
