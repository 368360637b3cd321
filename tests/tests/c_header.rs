//! The checked-in header compiles as C11 and C++17 and states the promised layout and values
//! (see `tests/c/header_check.c`).

use std::path::Path;
use std::process::Command;

fn compile(compiler: &str, language: &[&str]) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let output = Command::new(compiler)
        .args(language)
        .arg("-fsyntax-only")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-I")
        .arg(root.join("ffi-headers"))
        .arg(root.join("tests/c/header_check.c"))
        .output()
        .unwrap_or_else(|e| panic!("cannot run {compiler}: {e}"));
    assert!(
        output.status.success(),
        "{compiler} rejected the header:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

#[test]
fn header_compiles_as_c11_with_the_promised_layout() {
    compile("cc", &["-std=c11", "-x", "c"]);
}

#[test]
fn header_compiles_as_cpp17() {
    compile("c++", &["-std=c++17", "-x", "c++"]);
}
