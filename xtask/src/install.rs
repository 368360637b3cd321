//! `cargo xtask install --prefix P`: libsymm for C and C++ programs, laid out as a system
//! library: `P/lib/libsymm.so.<version>` with its SONAME link and the development link,
//! `P/lib/libsymm.a`, `P/include/symm.h`, and pkg-config files with the flags to link either
//! library: `pkg-config --cflags --libs symm` (shared) or `symm-static` (the archive and the
//! system libraries it needs).
//!
//! `--check` (run by the test suite) installs into a scratch prefix and builds the C all-reduce example against
//! the installed files through pkg-config alone, shared and static, then runs both.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::python::build_library;
use crate::{root, run};

pub(crate) use symm_artifacts::soname;

/// The system libraries the static library needs (what rustc reports as
/// `native-static-libs` for a Linux staticlib of this crate).
pub const STATIC_LIBS: &str = "-lgcc_s -lutil -lrt -lpthread -lm -ldl -lc";

/// The text of `symm.pc` (shared library) or, with `static_`, `symm-static.pc` (the archive
/// and the system libraries it needs) for an installation at `prefix`.
pub fn pkg_config(prefix: &Path, version: &str, static_: bool) -> String {
    let libs = if static_ {
        format!("Libs: ${{libdir}}/libsymm.a {STATIC_LIBS}\n")
    } else {
        format!("Libs: -L${{libdir}} -lsymm\nLibs.private: {STATIC_LIBS}\n")
    };
    format!(
        "prefix={}\n\
         libdir=${{prefix}}/lib\n\
         includedir=${{prefix}}/include\n\
         \n\
         Name: symm\n\
         Description: Symmetric-memory collectives for NVIDIA GPUs, with a host backend (NCCL-shaped C ABI){}\n\
         Version: {version}\n\
         Cflags: -I${{includedir}}\n\
         {libs}",
        prefix.display(),
        if static_ { ", linked statically" } else { "" }
    )
}

/// `cargo xtask install --prefix P` (the arguments after `install`).
pub fn install(args: &[String]) -> Result<(), String> {
    let prefix = match args {
        [flag, prefix] if flag == "--prefix" => PathBuf::from(prefix),
        [flag] if flag == "--check" => return check(),
        _ => return Err("usage: cargo xtask install --prefix DIRECTORY | --check".into()),
    };
    let prefix = if prefix.is_absolute() {
        prefix
    } else {
        std::env::current_dir()
            .map_err(|e| format!("current directory: {e}"))?
            .join(prefix)
    };
    let installed = install_into(&prefix)?;
    println!(
        "installed libsymm {} into {}",
        installed.version,
        prefix.display()
    );
    println!(
        "  build with: PKG_CONFIG_PATH={}/lib/pkgconfig cc prog.c $(pkg-config --cflags --libs symm)",
        prefix.display()
    );
    Ok(())
}

/// What [`install_into`] installed.
pub struct Installed {
    /// The library's version.
    pub version: String,
}

/// Build libsymm in release and install it under `prefix`.
pub fn install_into(prefix: &Path) -> Result<Installed, String> {
    let shared = build_library()?;
    let release = shared
        .parent()
        .ok_or_else(|| format!("{shared:?} has no directory"))?;
    let version = env!("CARGO_PKG_VERSION").to_string();
    let lib = prefix.join("lib");
    let include = prefix.join("include");
    let pkgconfig = lib.join("pkgconfig");
    for dir in [&lib, &include, &pkgconfig] {
        std::fs::create_dir_all(dir).map_err(|e| format!("creating {dir:?}: {e}"))?;
    }
    let real = format!("libsymm.so.{version}");
    copy(&shared, &lib.join(&real))?;
    link(&real, &lib.join(soname(&version)))?;
    link(&soname(&version), &lib.join("libsymm.so"))?;
    copy(&release.join("libsymm.a"), &lib.join("libsymm.a"))?;
    copy(&root().join("ffi-headers/symm.h"), &include.join("symm.h"))?;
    // The CUDA C++ device API: the header always; the library when `cargo xtask device-lib`
    // built it.
    copy(
        &root().join("ffi-headers/symm_device.cuh"),
        &include.join("symm_device.cuh"),
    )?;
    let device_lib = crate::device_lib::out_dir();
    for file in ["libsymm_device.a", "symm_device.ptx"] {
        if device_lib.join(file).exists() {
            copy(&device_lib.join(file), &lib.join(file))?;
        }
    }
    for (name, static_) in [("symm.pc", false), ("symm-static.pc", true)] {
        let pc = pkgconfig.join(name);
        std::fs::write(&pc, pkg_config(prefix, &version, static_))
            .map_err(|e| format!("writing {pc:?}: {e}"))?;
    }
    Ok(Installed { version })
}

fn copy(from: &Path, to: &Path) -> Result<(), String> {
    // Replace, never write through: an installed library may be mapped by a running program.
    let _ = std::fs::remove_file(to);
    std::fs::copy(from, to)
        .map(|_| ())
        .map_err(|e| format!("copying {from:?} to {to:?}: {e}"))
}

fn link(target: &str, at: &Path) -> Result<(), String> {
    let _ = std::fs::remove_file(at);
    std::os::unix::fs::symlink(target, at).map_err(|e| format!("linking {at:?}: {e}"))
}

/// Install into a scratch prefix, then build `examples/c/allreduce.c` against the installed
/// files with nothing but pkg-config's flags — once against the shared library (found through
/// its SONAME at run time), once statically — and run both on the host backend.
pub fn check() -> Result<(), String> {
    let prefix = root().join("target/install-check");
    let _ = std::fs::remove_dir_all(&prefix);
    install_into(&prefix)?;
    let lib = prefix.join("lib");
    let soname_expected = soname(env!("CARGO_PKG_VERSION"));
    let dynamic = read_dynamic_section(&lib.join("libsymm.so"))?;
    if !dynamic.contains(&format!("[{soname_expected}]")) {
        return Err(format!(
            "the installed libsymm.so has no SONAME {soname_expected}:\n{dynamic}"
        ));
    }
    let pc_path = lib.join("pkgconfig");
    let flags = |static_: bool| -> Result<Vec<String>, String> {
        let output = Command::new("pkg-config")
            .env("PKG_CONFIG_PATH", &pc_path)
            .args(["--cflags", "--libs"])
            .arg(if static_ { "symm-static" } else { "symm" })
            .output()
            .map_err(|e| format!("cannot start pkg-config: {e}"))?;
        if !output.status.success() {
            return Err(format!(
                "pkg-config failed: {}",
                String::from_utf8_lossy(&output.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&output.stdout)
            .split_whitespace()
            .map(str::to_string)
            .collect())
    };
    let example = root().join("examples/c/allreduce.c");
    let out = prefix.join("bin");
    std::fs::create_dir_all(&out).map_err(|e| format!("creating {out:?}: {e}"))?;
    for static_ in [false, true] {
        let program = out.join(if static_ {
            "allreduce_static"
        } else {
            "allreduce_shared"
        });
        let mut cc = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".to_string()));
        cc.args(["-O2", "-std=c11", "-D_POSIX_C_SOURCE=200809L"])
            .arg(&example)
            .arg("-o")
            .arg(&program);
        cc.args(flags(static_)?);
        run(&mut cc)?;
        let mut program_run = Command::new(&program);
        program_run
            .args(["3", "1023"])
            .env("SYMM_BACKEND", "host")
            .env("SYMM_HOST_MODE", "fast");
        if !static_ {
            program_run.env("LD_LIBRARY_PATH", &lib);
        }
        run(&mut program_run)?;
        let needed = read_dynamic_section(&program)?;
        let uses_shared = needed.contains("libsymm.so");
        if uses_shared == static_ {
            return Err(format!(
                "{program:?} should {}link libsymm.so:\n{needed}",
                if static_ { "not " } else { "" }
            ));
        }
    }
    println!("install check: pkg-config builds of the C example run, shared and static");
    Ok(())
}

/// `readelf -d` of `file` (the dynamic section: SONAME, NEEDED).
fn read_dynamic_section(file: &Path) -> Result<String, String> {
    let output = Command::new("readelf")
        .arg("-d")
        .arg(file)
        .output()
        .map_err(|e| format!("cannot start readelf: {e}"))?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soname_follows_the_compatible_version() {
        assert_eq!(soname("0.1.0"), "libsymm.so.0.1");
        assert_eq!(soname("0.2.7"), "libsymm.so.0.2");
        assert_eq!(soname("1.4.2"), "libsymm.so.1");
    }

    #[test]
    fn the_pkg_config_file_carries_the_static_link_flags() {
        let pc = pkg_config(Path::new("/opt/symm"), "0.1.0", false);
        assert!(pc.starts_with("prefix=/opt/symm\n"), "{pc}");
        assert!(pc.contains("Libs: -L${libdir} -lsymm\n"), "{pc}");
        assert!(
            pc.contains(&format!("Libs.private: {STATIC_LIBS}\n")),
            "{pc}"
        );
        assert!(pc.contains("Cflags: -I${includedir}\n"), "{pc}");
        let pc = pkg_config(Path::new("/opt/symm"), "0.1.0", true);
        assert!(
            pc.contains(&format!("Libs: ${{libdir}}/libsymm.a {STATIC_LIBS}\n")),
            "{pc}"
        );
    }
}
