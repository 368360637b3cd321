//! Gives the fake driver the real driver's SONAME, `libcuda.so.1`: a program linked against it
//! (`-lcuda`) then records `NEEDED libcuda.so.1`, the name the driver is installed under, and
//! opening `libcuda.so.1` finds the library already loaded under another file name.

fn main() {
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libcuda.so.1");
    println!("cargo:rerun-if-changed=build.rs");
}
