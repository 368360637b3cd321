// A kernel's parameters are bytes the host passes: a token, a slot or a reference is not one.
use symm_device::kernel::Block;

symm_device::kernel! {
    fn k(block, forged: Block) {
        let _ = (block, forged);
    }
}

fn main() {}
