// A kernel's body is a safe function: a second block token needs `unsafe` there too.
use symm_device::kernel::Block;

symm_device::kernel! {
    fn k(block) {
        let _ = block;
        let _second = Block::enter();
    }
}

fn main() {}
