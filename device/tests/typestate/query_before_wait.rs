// The response can only be read after the barrier wait.
include!("common.rs");

fn kernel() {
    let election = Election::thread_zero();
    let submitted = Steal::new(unsafe { source() }).submit(&election);
    let _ = submitted.query();
}

fn main() {}
