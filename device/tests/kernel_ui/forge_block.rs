// The block's token is made only by the kernel's entry: `Block::enter` is `unsafe`.
use symm_device::kernel::Block;

fn main() {
    let _block = Block::enter();
}
