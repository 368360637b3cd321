// After an observed failure there is no handle left to submit with.
include!("common.rs");

fn kernel() {
    let election = Election::thread_zero();
    let ready = Steal::new(unsafe { source() });
    match ready.submit(&election).wait().query() {
        Outcome::Stolen(stolen, _ready) => stolen.run(run),
        Outcome::Exhausted(exhausted) => {
            let _ = exhausted.submit(&election);
        }
    }
}

fn main() {}
