// A request in flight must be waited for and queried: dropping it does not compile.
include!("common.rs");

fn kernel() {
    let election = Election::thread_zero();
    let submitted = Steal::new(unsafe { source() }).submit(&election);
    drop(submitted);
}

fn main() {
    kernel();
}
