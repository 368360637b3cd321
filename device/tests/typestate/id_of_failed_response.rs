// A failed response carries no block id.
include!("common.rs");

fn kernel() {
    let election = Election::thread_zero();
    match Steal::new(unsafe { source() }).submit(&election).wait().query() {
        Outcome::Stolen(stolen, _ready) => stolen.run(run),
        Outcome::Exhausted(exhausted) => {
            let _tile: TileId = exhausted.tile();
        }
    }
}

fn main() {}
