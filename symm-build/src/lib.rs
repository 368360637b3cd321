//! Compile a crate of kernels written with `symm_device::kernel!` to PTX, from the build script
//! of the crate that launches them (or any tool):
//!
//! ```no_run
//! // build.rs of the host crate; the kernels' crate is `../kernels`.
//! let ptx = symm_build::Kernels::new("../kernels").build().unwrap_or_else(|e| panic!("{e}"));
//! println!("cargo:rustc-env=KERNELS_PTX={}", ptx.display());
//! // src: static PTX: &str = include_str!(env!("KERNELS_PTX"));
//! ```
//!
//! It runs `cargo rustc --release --target nvptx64-nvidia-cuda -Zbuild-std=core --crate-type
//! cdylib -- -C target-cpu=<cpu>` in the kernels' crate with the toolchain that runs it (the
//! device features it needs are enabled for that build alone with `RUSTC_BOOTSTRAP=1`, as symm's
//! own PTX is built), in a target directory of its own. It never installs anything: when the
//! toolchain lacks a component the build needs (`rust-src` for `-Zbuild-std`,
//! `llvm-bitcode-linker` to link for nvptx64), the error names it and the command that adds
//! it.

use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Why a kernels' crate did not compile to PTX.
#[derive(Debug)]
pub enum Error {
    /// The toolchain lacks components the build needs: their names and the command that adds
    /// them.
    MissingComponents {
        /// The components (`rust-src`, `llvm-bitcode-linker`).
        components: Vec<&'static str>,
        /// `rustup component add …` for this toolchain.
        command: String,
    },
    /// A command could not run or failed: what it was, and its output.
    Command(String),
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::MissingComponents {
                components,
                command,
            } => write!(
                f,
                "compiling kernels to PTX needs the toolchain components {}, which this \
                 toolchain lacks: run `{command}`",
                components.join(" and ")
            ),
            Error::Command(message) => f.write_str(message),
        }
    }
}

impl std::error::Error for Error {}

/// A crate of kernels to compile to PTX.
pub struct Kernels {
    crate_dir: PathBuf,
    cpu: String,
    target_dir: Option<PathBuf>,
    out_dir: Option<PathBuf>,
}

impl Kernels {
    /// The kernels' crate at `crate_dir` (relative paths are the calling crate's: a build
    /// script runs in its manifest's directory), for `sm_80` (PTX that every later GPU JITs).
    pub fn new(crate_dir: impl Into<PathBuf>) -> Self {
        Kernels {
            crate_dir: crate_dir.into(),
            cpu: "sm_80".to_string(),
            target_dir: None,
            out_dir: None,
        }
    }

    /// Compile for `cpu` (`sm_80`, `sm_90`, …).
    pub fn cpu(mut self, cpu: &str) -> Self {
        self.cpu = cpu.to_string();
        self
    }

    /// Where the PTX is written (default: `$OUT_DIR`, a build script's).
    pub fn out_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.out_dir = Some(dir.into());
        self
    }

    /// The nvptx64 build's target directory (default: `<out dir>/kernels-target`).
    pub fn target_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.target_dir = Some(dir.into());
        self
    }

    /// Compile: the path of `<out dir>/<crate name>.ptx`. In a build script it also asks cargo
    /// to run it again when the kernels' sources change.
    pub fn build(self) -> Result<PathBuf, Error> {
        let missing = missing_components()?;
        if !missing.is_empty() {
            return Err(Error::MissingComponents {
                command: format!(
                    "rustup component add {}{}",
                    missing.join(" "),
                    toolchain_flag()
                ),
                components: missing,
            });
        }
        let out_dir = match self.out_dir {
            Some(dir) => dir,
            None => std::env::var_os("OUT_DIR")
                .map(PathBuf::from)
                .ok_or_else(|| {
                    Error::Command("no out dir: set Kernels::out_dir outside a build script".into())
                })?,
        };
        let target_dir = self
            .target_dir
            .unwrap_or_else(|| out_dir.join("kernels-target"));
        let name = package_name(&self.crate_dir)?;
        let mut command = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
        command
            .current_dir(&self.crate_dir)
            .args(["rustc", "--release", "--quiet", "--lib"])
            .args(["--target", "nvptx64-nvidia-cuda", "-Zbuild-std=core"])
            .args(["--crate-type", "cdylib", "--target-dir"])
            .arg(&target_dir)
            .args(["--", "-C", &format!("target-cpu={}", self.cpu)])
            .env("RUSTC_BOOTSTRAP", "1");
        // The calling build's flags and wrappers are for the host, not this target.
        for variable in [
            "RUSTFLAGS",
            "CARGO_ENCODED_RUSTFLAGS",
            "CARGO_BUILD_RUSTFLAGS",
            "CARGO_TARGET_DIR",
            "CARGO_BUILD_TARGET",
            "RUSTC_WRAPPER",
            "RUSTC_WORKSPACE_WRAPPER",
        ] {
            command.env_remove(variable);
        }
        let output = command
            .output()
            .map_err(|e| Error::Command(format!("running cargo for {}: {e}", name)))?;
        if !output.status.success() {
            return Err(Error::Command(format!(
                "compiling {name} ({}) to PTX for {} failed:\n{}",
                self.crate_dir.display(),
                self.cpu,
                String::from_utf8_lossy(&output.stderr)
            )));
        }
        let built = target_dir
            .join("nvptx64-nvidia-cuda/release")
            .join(format!("{}.ptx", name.replace('-', "_")));
        let ptx = out_dir.join(format!("{name}.ptx"));
        std::fs::copy(&built, &ptx).map_err(|e| {
            Error::Command(format!(
                "copying {} to {}: {e}",
                built.display(),
                ptx.display()
            ))
        })?;
        if std::env::var_os("OUT_DIR").is_some() {
            for dir in
                std::iter::once(self.crate_dir.clone()).chain(path_dependencies(&self.crate_dir))
            {
                println!("cargo:rerun-if-changed={}", dir.join("src").display());
                println!(
                    "cargo:rerun-if-changed={}",
                    dir.join("Cargo.toml").display()
                );
            }
        }
        Ok(ptx)
    }
}

/// The components the nvptx64 build needs that the running toolchain lacks.
pub fn missing_components() -> Result<Vec<&'static str>, Error> {
    let sysroot = rustc_output(&["--print", "sysroot"])?;
    let sysroot = Path::new(sysroot.trim());
    let host = rustc_output(&["-vV"])?
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .ok_or_else(|| Error::Command("rustc -vV names no host".into()))?;
    let mut missing = Vec::new();
    if !sysroot
        .join("lib/rustlib/src/rust/library/core/src/lib.rs")
        .is_file()
    {
        missing.push("rust-src");
    }
    let linker = sysroot.join("lib/rustlib").join(&host).join("bin");
    if !linker.join("self-contained/llvm-bitcode-linker").is_file()
        && !linker.join("llvm-bitcode-linker").is_file()
    {
        missing.push("llvm-bitcode-linker");
    }
    Ok(missing)
}

/// ` --toolchain <name>` when rustup says which toolchain runs, else nothing.
fn toolchain_flag() -> String {
    std::env::var("RUSTUP_TOOLCHAIN")
        .map(|t| format!(" --toolchain {t}"))
        .unwrap_or_default()
}

fn rustc_output(args: &[&str]) -> Result<String, Error> {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let output = Command::new(&rustc)
        .args(args)
        .output()
        .map_err(|e| Error::Command(format!("{rustc} {}: {e}", args.join(" "))))?;
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The package name in `crate_dir/Cargo.toml`.
fn package_name(crate_dir: &Path) -> Result<String, Error> {
    let manifest = crate_dir.join("Cargo.toml");
    let text = std::fs::read_to_string(&manifest)
        .map_err(|e| Error::Command(format!("reading {}: {e}", manifest.display())))?;
    let mut in_package = false;
    for line in text.lines() {
        let line = line.trim();
        if line.starts_with('[') {
            in_package = line == "[package]";
        } else if in_package && let Some(value) = line.strip_prefix("name") {
            let value = value.trim_start().trim_start_matches('=').trim();
            return Ok(value.trim_matches('"').to_string());
        }
    }
    Err(Error::Command(format!(
        "{} names no package",
        manifest.display()
    )))
}

/// The directories of `crate_dir`'s path dependencies (`name = { path = "…" }` in its
/// manifest): their sources are the kernels' too.
fn path_dependencies(crate_dir: &Path) -> Vec<PathBuf> {
    let Ok(text) = std::fs::read_to_string(crate_dir.join("Cargo.toml")) else {
        return Vec::new();
    };
    text.lines()
        .filter_map(|line| {
            let rest = &line[line.find("path")? + 4..];
            let rest = rest
                .trim_start()
                .strip_prefix('=')?
                .trim_start()
                .strip_prefix('"')?;
            Some(crate_dir.join(&rest[..rest.find('"')?]))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The package name and the path dependencies come from the kernels' manifest.
    #[test]
    fn a_manifest_names_the_package_and_its_path_dependencies() {
        let dir = std::env::temp_dir().join(format!("symm-build-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("Cargo.toml"),
            "[package]\nname = \"my-kernels\"\nversion = \"0.1.0\"\n\n[dependencies]\n\
             symm-device = { path = \"../device\" }\nother = \"1\"\n",
        )
        .unwrap();
        assert_eq!(package_name(&dir).unwrap(), "my-kernels");
        assert_eq!(path_dependencies(&dir), vec![dir.join("../device")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    /// A missing component is named with the command that adds it.
    #[test]
    fn missing_components_are_named_with_the_command() {
        let error = Error::MissingComponents {
            components: vec!["rust-src", "llvm-bitcode-linker"],
            command: "rustup component add rust-src llvm-bitcode-linker".into(),
        };
        let text = error.to_string();
        assert!(text.contains("rust-src and llvm-bitcode-linker"), "{text}");
        assert!(text.contains("run `rustup component add rust-src llvm-bitcode-linker`"));
        // This toolchain has both (rust-toolchain.toml lists them).
        assert_eq!(missing_components().unwrap(), Vec::<&str>::new());
    }
}
