//! Replays every input of the checked-in corpus through the harness without libFuzzer (a
//! plain test build, no sanitizer): a quick check that the corpus passes, and a way to debug
//! one input (`SYMM_FUZZ_INPUT=path cargo test --test replay -- --nocapture`).

use std::path::PathBuf;

#[test]
fn corpus_replays_cleanly() {
    let inputs: Vec<PathBuf> = match std::env::var_os("SYMM_FUZZ_INPUT") {
        Some(path) => vec![PathBuf::from(path)],
        None => {
            let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("corpus/abi_sequence");
            let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
                .expect("the corpus directory")
                .map(|e| e.expect("a corpus entry").path())
                .collect();
            files.sort();
            files
        }
    };
    assert!(!inputs.is_empty(), "no inputs to replay");
    for path in &inputs {
        let data = std::fs::read(path).expect("reading an input");
        let started = std::time::Instant::now();
        symm_fuzz::run_input(&data);
        eprintln!(
            "{:>8.1} ms {}",
            started.elapsed().as_secs_f64() * 1e3,
            path.display()
        );
    }
    let (checked, errors, timeouts) = symm_fuzz::stats::read();
    eprintln!(
        "{} inputs: {checked} collectives checked, {errors} predicted errors, {timeouts} timeouts",
        inputs.len()
    );
}
