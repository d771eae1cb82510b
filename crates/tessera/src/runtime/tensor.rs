//! Tensor views and stride helpers. The views themselves ([`TensorView`], [`TensorViewMut`])
//! live beside the buffers they borrow (`buffer.rs`) and are re-exported here.

pub use super::buffer::{TensorView, TensorViewMut};

/// Row-major (C-contiguous) strides of a shape, in elements: the last dimension has stride 1,
/// every other one the product of the extents after it.
pub fn contiguous_strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1usize; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contiguous_strides_are_row_major() {
        assert_eq!(contiguous_strides(&[2, 3, 4]), vec![12, 4, 1]);
        assert_eq!(contiguous_strides(&[5]), vec![1]);
        assert_eq!(contiguous_strides(&[]), Vec::<usize>::new());
        assert_eq!(contiguous_strides(&[3, 0, 2]), vec![0, 2, 1]);
    }
}
