//! Checkpoints that name every part their own way (GPT-2's `transformer.h.N.attn`,
//! GPT-NeoX's `gpt_neox.layers.N.attention`; GPT-J, OPT, Falcon, BLOOM, MPT): each key is
//! translated whole to the LLaMA-style key that the loader reads for every other family
//! (`model.layers.N.self_attn.…`, [`OwnNames::our_key`]), and back when saving
//! ([`OwnNames::checkpoint_key`]); PEFT's targets, which are the family's names, are
//! read and written the same way. A family's file gives its table.

/// A family's names of the model's parts.
#[derive(Debug)]
pub(crate) struct OwnNames {
    /// The prefix of every key but the head's (`transformer.`, `gpt_neox.`); the
    /// checkpoints of a bare model (`GPT2Model`) lack it, and load too.
    pub prefix: &'static str,
    /// The prefixes of a bare model's checkpoints where it has one (OPT's `decoder.`
    /// for `model.decoder.`).
    pub bare_prefixes: &'static [&'static str],
    /// The name of the layer list (`h.`, `layers.`), followed by the layer's index.
    pub layers: &'static str,
    /// The names of a layer's parts and ours, matched at the start of what follows
    /// the layer's index (the first that matches wins).
    pub layer_names: &'static [(&'static str, &'static str)],
    /// The names of the parts outside the layers and ours.
    pub model_names: &'static [(&'static str, &'static str)],
    /// The suffixes of buffers that old checkpoints store and transformers ignores
    /// (causal masks, rotary frequencies).
    pub buffers: &'static [&'static str],
    /// The output head's name (`lm_head.`, GPT-NeoX's `embed_out.`); transformers'
    /// own `lm_head.` loads too.
    pub head: &'static str,
    /// The layer that holds q, k and v fused (GPT-2's `attn.c_attn`, GPT-NeoX's
    /// `attention.query_key_value`), if any.
    pub fused_qkv: Option<&'static str>,
}

impl OwnNames {
    /// The LLaMA-style key that the family's `key` loads as
    /// (`transformer.h.0.ln_1.weight` → `model.layers.0.input_layernorm.weight`); a key
    /// of no known part comes back without its prefix, so that an error names it as
    /// unexpected. `None` for the ignored buffers.
    pub(crate) fn our_key(&self, key: &str) -> Option<String> {
        if let Some(rest) = key.strip_prefix(self.head) {
            return Some(format!("lm_head.{rest}"));
        }
        if key.starts_with("lm_head.") {
            return Some(key.to_string());
        }
        let key = self.without_prefix(key);
        if self.buffers.iter().any(|buffer| key.ends_with(buffer)) {
            return None;
        }
        if let Some((layer, rest)) = key
            .strip_prefix(self.layers)
            .and_then(|rest| rest.split_once('.'))
        {
            let rest = rename_start(rest, self.layer_names.iter().copied());
            return Some(format!("model.layers.{layer}.{rest}"));
        }
        Some(rename_start(key, self.model_names.iter().copied()))
    }

    /// The family's key of the LLaMA-style `key` (the inverse of
    /// [`our_key`](Self::our_key)).
    pub(crate) fn checkpoint_key(&self, key: &str) -> String {
        let flipped = |names: &'static [(&'static str, &'static str)]| {
            names.iter().map(|&(theirs, ours)| (ours, theirs))
        };
        if let Some(rest) = key.strip_prefix("lm_head.") {
            return format!("{}{rest}", self.head);
        }
        if let Some((layer, rest)) = key
            .strip_prefix("model.layers.")
            .and_then(|rest| rest.split_once('.'))
        {
            let rest = rename_start(rest, flipped(self.layer_names));
            return format!("{}{}{layer}.{rest}", self.prefix, self.layers);
        }
        format!(
            "{}{}",
            self.prefix,
            rename_start(key, flipped(self.model_names))
        )
    }

    /// Our layers that a PEFT `target_modules` entry adapts: PEFT adapts every module
    /// whose path ends with the target, so GPT-2's bare `c_proj` is both the
    /// attention's output projection and the feed-forward's second layer, and
    /// `attn.c_proj` one of them; a fused layer is the projections it holds. Empty for
    /// a target the table does not name (it is then taken as our own name).
    pub(crate) fn adapted_layers(&self, target: &str) -> Vec<&'static str> {
        let named = |path: &str| {
            path == target
                || path.ends_with(&format!(".{target}"))
                || target.ends_with(&format!(".{path}"))
        };
        if self.fused_qkv.is_some_and(named) {
            return vec!["q_proj", "k_proj", "v_proj"];
        }
        self.layer_names
            .iter()
            .filter(|(theirs, _)| named(theirs.trim_end_matches('.')))
            .filter_map(|(_, ours)| ours.trim_end_matches('.').rsplit('.').next())
            .collect()
    }

    /// The `target_modules` entry that names the layer `layer` (a checkpoint key
    /// without `.weight`) of every block and nothing else: its path within the block
    /// (GPT-2's `mlp.c_proj`, OPT's `fc1`).
    pub(crate) fn peft_target(&self, layer: &str) -> String {
        self.without_prefix(layer)
            .strip_prefix(self.layers)
            .and_then(|rest| rest.split_once('.'))
            .map_or_else(|| layer.to_string(), |(_, path)| path.to_string())
    }

    /// `key` without the model's prefix (or a bare model's), if it has one.
    fn without_prefix<'a>(&self, key: &'a str) -> &'a str {
        std::iter::once(self.prefix)
            .chain(self.bare_prefixes.iter().copied())
            .find_map(|prefix| key.strip_prefix(prefix))
            .unwrap_or(key)
    }
}

/// Checks that each `(theirs, ours)` pair maps both ways through `names`.
#[cfg(test)]
pub(crate) fn assert_maps_both_ways(names: &OwnNames, pairs: &[(&str, &str)]) {
    for &(theirs, ours) in pairs {
        assert_eq!(names.our_key(theirs).as_deref(), Some(ours), "{theirs}");
        assert_eq!(names.checkpoint_key(ours), theirs, "{ours}");
    }
}

/// `key` with the first of `names`' prefixes it starts with replaced.
fn rename_start(
    key: &str,
    names: impl IntoIterator<Item = (&'static str, &'static str)>,
) -> String {
    names
        .into_iter()
        .find_map(|(from, to)| key.strip_prefix(from).map(|rest| format!("{to}{rest}")))
        .unwrap_or_else(|| key.to_string())
}
