// A stolen tile is an obligation: dropping it instead of running it does not compile.
include!("common.rs");

fn kernel() {
    let election = Election::thread_zero();
    match Steal::new(unsafe { source() }).submit(&election).wait().query() {
        Outcome::Stolen(stolen, _ready) => drop(stolen),
        Outcome::Exhausted(_) => {}
    }
}

fn main() {
    kernel();
}
