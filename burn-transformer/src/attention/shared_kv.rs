//! Keys and values shared between the self-attention layers of one stack (Gemma-4's
//! `num_kv_shared_layers`, cross-layer attention): a layer publishes what it attended
//! over, and later layers attend over it with queries of their own instead of
//! projecting keys and values. Their parameters and decoding caches are saved.

use burn::config::Config;
use burn::tensor::{Bool, Tensor};

/// How a self-attention layer takes part in sharing keys and values.
#[derive(Config, Debug, Copy, PartialEq, Eq)]
pub enum KvSharing {
    /// Publishes the keys and values it attends over (its cache's, when decoding)
    /// under `slot`, for the later layers that reuse them.
    Publish {
        /// The slot later layers read.
        slot: usize,
    },
    /// Projects no keys or values (no `k_proj`, `v_proj` nor their norms): attends over
    /// those an earlier layer of the same pass published under `slot`, which must have
    /// the same key/value heads, head width and window.
    Reuse {
        /// The slot an earlier layer published.
        slot: usize,
    },
}

/// The keys and values one self-attention call attended over.
#[derive(Clone, Debug)]
pub struct AttendedKv {
    /// `[batch, n_kv_heads, keys, head_dim]`, rotated.
    pub keys: Tensor<4>,
    /// `[batch, n_kv_heads, keys, head_dim]`
    pub values: Tensor<4>,
    /// `[batch, keys]`, `true` = padded; `None` when nothing is.
    pub padding: Option<Tensor<2, Bool>>,
    /// The absolute position of the call's first query (the cache's length before a
    /// decoding step; 0 over a whole sequence): where a reusing layer rotates its own.
    pub query_offset: usize,
}

/// The keys and values published so far in one pass through a stack, by slot.
#[derive(Clone, Debug, Default)]
pub struct SharedKv {
    slots: Vec<(usize, AttendedKv)>,
}

impl SharedKv {
    /// Publishes `attended` under `slot`, replacing what was there.
    pub fn publish(&mut self, slot: usize, attended: AttendedKv) {
        self.slots.retain(|(published, _)| *published != slot);
        self.slots.push((slot, attended));
    }

    /// Moves every published call's queries `dropped` positions on: the later layers
    /// of the pass run on the last positions only.
    pub fn skip_queries(&mut self, dropped: usize) {
        for (_, attended) in &mut self.slots {
            attended.query_offset += dropped;
        }
    }

    /// What was published under `slot`, if anything.
    pub fn get(&self, slot: usize) -> Option<&AttendedKv> {
        self.slots
            .iter()
            .find(|(published, _)| *published == slot)
            .map(|(_, attended)| attended)
    }
}
