// The protocol used correctly compiles (including pipelining and stopping while ready).
include!("common.rs");

fn kernel() {
    let election = Election::thread_zero();
    let ready = Steal::new(unsafe { source() });
    let arrived = ready.submit(&election).wait();
    match arrived.query() {
        Outcome::Stolen(stolen, ready) => {
            stolen.run(run);
            // Two requests in flight before either is observed.
            let two = ready.submit(&election).submit_another(&election);
            match two.wait().query() {
                Outcome::Stolen(stolen, one) => {
                    stolen.run(run);
                    match one.wait().query() {
                        Outcome::Stolen(stolen, ready) => {
                            stolen.run(run);
                            drop(ready); // a policy may stop while ready
                        }
                        Outcome::Exhausted(_) => {}
                    }
                }
                Outcome::Exhausted(_) => {}
            }
        }
        Outcome::Exhausted(_) => {}
    }
}

fn main() {
    let _ = kernel;
}
