//! StableLM's QK-norm with `qk_layernorm` (StableLM-2-12B): one `nn.LayerNorm` per
//! head, stored as `….q_layernorm.norms.{head}.weight` (`[head_dim]` each). Ours is one
//! [`PerHeadNorm`](crate::norm::PerHeadNorm) whose weight `[heads, head_dim]` holds those
//! vectors as its rows, loaded from the stacked key `….q_layernorm.weight` (renamed to
//! ours, `….q_norm.weight`, as Phi's).

/// The parts of the per-head key `key`: the stacked key it is a row of, and the head.
/// `None` for any other key.
pub(crate) fn head_norm_row(key: &str) -> Option<(String, usize)> {
    let (rest, part) = key.rsplit_once('.')?;
    let (rest, head) = rest.rsplit_once('.')?;
    let norm = rest.strip_suffix(".norms")?;
    is_qk_norm_param(norm, part)
        .then(|| Some((format!("{norm}.{part}"), head.parse().ok()?)))
        .flatten()
}

/// The per-head key of row `head` of the stacked key `stacked`
/// (`….q_layernorm.weight`), the inverse of [`head_norm_row`]; `None` for a key that is
/// no QK-norm's.
pub(crate) fn head_norm_key(stacked: &str, head: usize) -> Option<String> {
    let (norm, part) = stacked.rsplit_once('.')?;
    is_qk_norm_param(norm, part).then(|| format!("{norm}.norms.{head}.{part}"))
}

/// Whether `part` of the module `norm` is a parameter of one of StableLM's QK-norms.
fn is_qk_norm_param(norm: &str, part: &str) -> bool {
    (norm.ends_with(".q_layernorm") || norm.ends_with(".k_layernorm"))
        && matches!(part, "weight" | "bias")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_head_norm_key_and_its_stacked_row_are_inverses() {
        let key = "model.layers.3.self_attn.k_layernorm.norms.11.weight";
        let (stacked, head) = head_norm_row(key).unwrap();
        assert_eq!(
            (stacked.as_str(), head),
            ("model.layers.3.self_attn.k_layernorm.weight", 11)
        );
        assert_eq!(head_norm_key(&stacked, head).as_deref(), Some(key));
        for other in [
            "model.layers.3.self_attn.k_layernorm.weight",
            "model.layers.3.input_layernorm.weight",
            "model.layers.3.mlp.norms.1.weight",
            "model.layers.3.self_attn.q_layernorm.norms.x.weight",
        ] {
            assert_eq!(head_norm_row(other), None, "{other}");
        }
        assert_eq!(head_norm_key("model.norm.weight", 0), None);
    }
}
