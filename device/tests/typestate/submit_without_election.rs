// Submission needs the election proof, which cannot be made up.
include!("common.rs");

fn kernel() {
    let fake = Election { leader: true };
    let _ = Steal::new(unsafe { source() }).submit(&fake);
}

fn main() {}
