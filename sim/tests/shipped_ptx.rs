//! Every kernel of the shipped sm_80 and sm_90 PTX loads, one module per kernel exactly as
//! the CUDA backend cuts them (the splitting code of `symm-artifacts`).

use symm_artifacts::{gzip, split};
use symm_sim::Module;

/// The text of `ptx-out/<name>`, inflated.
fn ptx(name: &str) -> String {
    let path = format!("{}/../ptx-out/{name}", env!("CARGO_MANIFEST_DIR"));
    let file = std::fs::read(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let text = gzip::decompress(&file).unwrap_or_else(|e| panic!("{path}: {e}"));
    String::from_utf8(text).expect("UTF-8")
}

#[test]
fn every_sm80_and_sm90_kernel_loads_as_its_own_module() {
    for file in ["symm_sm80.ptx.gz", "symm_sm90.ptx.gz"] {
        let text = ptx(file);
        let index = split::PtxIndex::new(&text);
        let kernels = index.kernels();
        assert!(kernels.len() > 300, "{file}: {} kernels", kernels.len());
        let mut instructions = 0;
        for kernel in kernels {
            let module_text = index.kernel_module(kernel).expect("defined");
            let module =
                Module::load(&module_text).unwrap_or_else(|e| panic!("{file} {kernel}: {e}"));
            let id = module.kernel(kernel).expect("the kernel is in its module");
            let params = module.kernel_params(id);
            if !kernel.starts_with("symm_clc_") {
                // Every collective takes (table, task count, ranks).
                assert_eq!(params.len(), 3, "{file} {kernel}");
                assert_eq!((params[0].size, params[0].align), (8, 8), "{kernel}");
                assert_eq!((params[1].size, params[2].size), (4, 4), "{kernel}");
            }
            instructions += module.instruction_count();
        }
        assert!(instructions > 300_000, "{file}: {instructions}");
    }
}

#[test]
fn the_whole_file_loads_as_one_module_too() {
    let module = Module::load(&ptx("symm_sm90.ptx.gz")).expect("loads");
    assert!(module.kernel_names().len() > 300);
}
