// The element types are the crate's own (sealed): a user's type could break the sizes and
// alignments the accesses rely on.
use symm_device::DataType;
use symm_device::kernel::Element;

#[derive(Clone, Copy)]
struct Tri([u8; 3]);

impl Element for Tri {
    type Acc = i64;
    const DTYPE: DataType = DataType::Int8;
    fn widen(self) -> i64 {
        0
    }
    fn narrow(_: i64) -> Self {
        Tri([0; 3])
    }
    fn to_bits(self) -> u64 {
        0
    }
    fn from_bits(_: u64) -> Self {
        Tri([0; 3])
    }
}

fn main() {}
