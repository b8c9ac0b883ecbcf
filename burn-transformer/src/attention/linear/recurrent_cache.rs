//! The decoding state of a linear attention layer: a fixed size whatever the length
//! seen (where a key/value cache grows by a position per token).

use burn::tensor::{Int, Tensor};

/// What a [`GatedDeltaNet`](super::GatedDeltaNet) carries from one call to the next.
#[derive(Clone, Debug, Default)]
pub struct RecurrentCache {
    /// The last `K − 1` inputs of the short convolution, `[batch, K − 1, channels]`;
    /// `None` before the first call.
    pub(crate) conv: Option<Tensor<3>>,
    /// The delta rule's state, `[batch, value_heads, d_k, d_v]`; `None` before the first
    /// call.
    pub(crate) state: Option<Tensor<4>>,
    /// Number of positions seen so far.
    position: usize,
}

impl RecurrentCache {
    /// An empty state: the first call starts from zeros.
    pub fn new() -> Self {
        Self::default()
    }

    /// The absolute position of the next token.
    pub fn position(&self) -> usize {
        self.position
    }

    /// Bytes held by the state tensors.
    pub fn bytes(&self) -> usize {
        let conv = self
            .conv
            .as_ref()
            .map_or(0, |t| t.shape().num_elements() * t.dtype().size());
        let state = self
            .state
            .as_ref()
            .map_or(0, |t| t.shape().num_elements() * t.dtype().size());
        conv + state
    }

    /// Stores the state after `new` more positions.
    pub(crate) fn advance(&mut self, conv: Tensor<3>, state: Tensor<4>, new: usize) {
        self.conv = Some(conv);
        self.state = Some(state);
        self.position += new;
    }

    /// Keeps only the batch rows in `indices`, in that order (beam search).
    ///
    /// # Shapes
    /// - indices: `[new_batch]`
    pub fn select_batch(&mut self, indices: Tensor<1, Int>) {
        self.conv = self.conv.take().map(|t| t.select(0, indices.clone()));
        self.state = self.state.take().map(|t| t.select(0, indices));
    }
}
