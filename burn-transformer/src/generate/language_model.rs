//! What generation needs from a model: logits for new tokens, through a cache.

use burn::tensor::{Bool, Device, Int, Tensor};

use crate::block::StackCache;
use crate::model::{CausalLm, Seq2SeqCache, Transformer};

/// A model that predicts the next token incrementally. Implemented by
/// [`CausalLm`] and by [`Seq2SeqDecoding`] (an encoder-decoder bound to one
/// encoded source batch).
pub trait LanguageModel {
    /// The decoding state (KV caches).
    type Cache;

    /// Number of token ids (the last axis of the logits).
    fn vocab_size(&self) -> usize;

    /// The device the model runs on.
    fn device(&self) -> Device;

    /// An empty cache for a batch of `batch` rows.
    fn new_cache(&self, batch: usize) -> Self::Cache;

    /// Logits of the new positions, attending to the cache, which is then extended.
    ///
    /// # Shapes
    /// - tokens: `[batch, new]`
    /// - key_padding: `[batch, new]`, `true` for padding among the new positions
    /// - output: `[batch, new, vocab_size]`
    fn forward_step(
        &self,
        tokens: Tensor<2, Int>,
        key_padding: Option<Tensor<2, Bool>>,
        cache: &mut Self::Cache,
    ) -> Tensor<3>;

    /// Logits of the last new position only, the cache extended with every new one (a
    /// prefill before sampling). Default: [`forward_step`](Self::forward_step)'s last
    /// position; a model may skip work no later step reads.
    ///
    /// # Shapes
    /// - tokens: `[batch, new]`
    /// - key_padding: `[batch, new]`, `true` for padding among the new positions
    /// - output: `[batch, 1, vocab_size]`
    fn forward_last(
        &self,
        tokens: Tensor<2, Int>,
        key_padding: Option<Tensor<2, Bool>>,
        cache: &mut Self::Cache,
    ) -> Tensor<3> {
        let logits = self.forward_step(tokens, key_padding, cache);
        let [_, new, _] = logits.dims();
        logits.narrow(1, new - 1, 1)
    }

    /// The sequence length past which a cache filled at shorter lengths no longer holds
    /// what a full pass would compute, so that decoding rebuilds it from the tokens once
    /// the sequence grows past it (LongRoPE's original context, as transformers'
    /// Phi-3 does). Default: never.
    fn cache_rebuild_length(&self) -> Option<usize> {
        None
    }

    /// The longest sequence the model can take (a table of learned positions, as
    /// GPT-2's): generation then predicts from at most that many of the latest tokens.
    /// Default: no limit.
    fn max_positions(&self) -> Option<usize> {
        None
    }

    /// Keeps the cache rows `indices`, in that order (beam search reorders beams).
    ///
    /// # Shapes
    /// - indices: `[new_batch]`
    fn select_cache(&self, cache: &mut Self::Cache, indices: Tensor<1, Int>);
}

impl LanguageModel for CausalLm {
    type Cache = StackCache;

    fn vocab_size(&self) -> usize {
        CausalLm::vocab_size(self)
    }

    fn device(&self) -> Device {
        CausalLm::device(self)
    }

    fn new_cache(&self, _batch: usize) -> StackCache {
        CausalLm::new_cache(self)
    }

    fn forward_step(
        &self,
        tokens: Tensor<2, Int>,
        key_padding: Option<Tensor<2, Bool>>,
        cache: &mut StackCache,
    ) -> Tensor<3> {
        self.forward_cached(tokens, cache, key_padding)
    }

    /// Runs the output head, and the layers that reuse earlier layers' keys and
    /// values, on the last position only ([`CausalLm::forward_cached_last`]).
    fn forward_last(
        &self,
        tokens: Tensor<2, Int>,
        key_padding: Option<Tensor<2, Bool>>,
        cache: &mut StackCache,
    ) -> Tensor<3> {
        self.forward_cached_last(tokens, cache, key_padding)
    }

    fn select_cache(&self, cache: &mut StackCache, indices: Tensor<1, Int>) {
        cache.select_batch(indices);
    }

    fn cache_rebuild_length(&self) -> Option<usize> {
        CausalLm::cache_rebuild_length(self)
    }

    fn max_positions(&self) -> Option<usize> {
        CausalLm::max_positions(self)
    }
}

/// A [`Transformer`] bound to one encoded source batch: generation's prompts are then
/// the decoder's start tokens.
///
/// When generation asks for more rows than the memory has (beam search runs
/// `num_beams` rows per source), each source row is repeated for its rows.
#[derive(Debug, Clone)]
pub struct Seq2SeqDecoding<'a> {
    model: &'a Transformer,
    memory: Tensor<3>,
    memory_padding: Option<Tensor<2, Bool>>,
}

impl<'a> Seq2SeqDecoding<'a> {
    /// Binds the encoder's output ([`Transformer::encode`]).
    ///
    /// # Shapes
    /// - memory: `[batch, seq_src, d_model]`, memory_padding: `[batch, seq_src]`
    pub fn new(
        model: &'a Transformer,
        memory: Tensor<3>,
        memory_padding: Option<Tensor<2, Bool>>,
    ) -> Self {
        Self {
            model,
            memory,
            memory_padding,
        }
    }
}

impl LanguageModel for Seq2SeqDecoding<'_> {
    type Cache = Seq2SeqCache;

    fn vocab_size(&self) -> usize {
        self.model.tgt_vocab_size()
    }

    fn device(&self) -> Device {
        self.memory.device()
    }

    /// # Panics
    /// If `batch` is not a multiple of the memory's batch.
    fn new_cache(&self, batch: usize) -> Seq2SeqCache {
        let [sources, _, _] = self.memory.dims();
        assert!(
            sources > 0 && batch.is_multiple_of(sources),
            "Seq2SeqDecoding: {batch} rows cannot share {sources} encoded sources"
        );
        let repeat = batch / sources;
        let mut cache = self
            .model
            .new_cache(self.memory.clone(), self.memory_padding.clone());
        if repeat > 1 {
            let indices: Vec<i64> = (0..batch).map(|row| (row / repeat) as i64).collect();
            let indices = Tensor::<1, Int>::from_data(
                burn::tensor::TensorData::new(indices, [batch]),
                &self.memory.device(),
            );
            cache.select_batch(indices);
        }
        cache
    }

    fn forward_step(
        &self,
        tokens: Tensor<2, Int>,
        key_padding: Option<Tensor<2, Bool>>,
        cache: &mut Seq2SeqCache,
    ) -> Tensor<3> {
        self.model.decode_cached(tokens, cache, key_padding)
    }

    fn select_cache(&self, cache: &mut Seq2SeqCache, indices: Tensor<1, Int>) {
        cache.select_batch(indices);
    }
}
