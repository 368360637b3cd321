//! Element types and reductions the kernels are generic over. Adding a (type, op) pair is an
//! impl here, not a new kernel.

/// An element a kernel can move.
pub trait Element: Copy + 'static {}

impl Element for f32 {}

/// A reduction of `T`, applied in a fixed rank order so every rank gets the same bits.
pub trait Reduce<T: Element> {
    /// Combine the running value with the next rank's value.
    fn combine(acc: T, next: T) -> T;
}

/// Sum.
pub struct Sum;

impl Reduce<f32> for Sum {
    #[inline(always)]
    fn combine(acc: f32, next: f32) -> f32 {
        acc + next
    }
}
