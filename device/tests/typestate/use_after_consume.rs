// Every transition consumes its handle.
include!("common.rs");

fn kernel() {
    let election = Election::thread_zero();
    let ready = Steal::new(unsafe { source() });
    let submitted = ready.submit(&election);
    let _again = ready.submit(&election);
    let _ = submitted.wait().query();
}

fn main() {}
