//! CodeGen's checkpoint layout: GPT-J's names ([`NAMES`]) with q, k and v fused in
//! `attn.qkv_proj`, stored in [`FUSED_BLOCKS`] blocks (its model-parallel shards), each
//! a quarter of the query rows, then of the value rows, then of the key rows
//! ([`FusedLayout::Blocks`](super::fused_heads::FusedLayout::Blocks)).

use super::gptj;
use super::own_names::OwnNames;

/// CodeGen's names: GPT-J's, with the fused projection.
pub(crate) const NAMES: OwnNames = OwnNames {
    fused_qkv: Some("attn.qkv_proj"),
    ..gptj::NAMES
};

/// The blocks of `qkv_proj`'s rows (transformers' `mp_num`, fixed at 4).
pub(crate) const FUSED_BLOCKS: usize = 4;

/// `qkv_proj`'s weight holds q, k and v: the fused key's suffix and its blocks'
/// suffixes, in our order.
pub(crate) const FUSED_QKV: [(&str, [&str; 3]); 1] = [(
    "attn.qkv_proj.weight",
    [
        "attn.q_proj.weight",
        "attn.k_proj.weight",
        "attn.v_proj.weight",
    ],
)];
