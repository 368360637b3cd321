//! Compile the kernels' crate to PTX for the cuda backend (the host backend runs the same
//! kernels compiled for the host).

fn main() {
    let ptx = symm_build::Kernels::new("../kernels")
        .build()
        .unwrap_or_else(|e| panic!("{e}"));
    println!("cargo:rustc-env=SYMM_EXAMPLE_KERNELS_PTX={}", ptx.display());
}
