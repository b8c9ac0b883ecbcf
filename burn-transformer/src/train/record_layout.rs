//! Model records saved in the crate's older module layout, renamed to today's.
//!
//! Records name each parameter by its module path. In the older layout the causal
//! language model had a layer type of its own, so its records differ from today's,
//! where every model is a stack of [`TransformerBlock`](crate::block::TransformerBlock)s:
//!
//! | older path | today |
//! |---|---|
//! | `model.embed_tokens.weight` | `embed_tokens.weight` |
//! | `….layers.N.self_attn.Grouped.…` | `….layers.N.self_attn.MultiHead.…` |
//! | `….layers.N.self_attn.q_proj.…` (encoder-decoder) | `….layers.N.self_attn.MultiHead.q_proj.…` |
//! | `….layers.N.mlp.Dense.gate_proj.…` (likewise `up_proj`, `down_proj`) | `….layers.N.mlp.SwiGlu.gate_proj.…` |
//! | `….layers.N.input_layernorm.weight` (and `post_attention_layernorm`) | `….layers.N.input_layernorm.Rms.weight` |
//! | `model.norm.weight` | `model.norm.Rms.weight` |
//! | `….self_attn.MultiHead.q_norm.weight` (and `k_norm`) | `….self_attn.MultiHead.q_norm.Shared.Rms.weight` |
//!
//! A record is in the older layout when one of its block paths has an older shape (no
//! path of today's layout has one); only then are its paths renamed, so [`upgrade`]
//! can be applied to any model record.

use burn::store::burn_pack::{Reader, Writer};
use burn::tensor::Bytes;

/// The self-attention variants of today's layout.
const ATTENTION_VARIANTS: [&str; 2] = ["MultiHead", "Latent"];
/// The projections of a SwiGLU feed-forward.
const SWIGLU_PROJECTIONS: [&str; 3] = ["gate_proj", "up_proj", "down_proj"];

/// Today's path of a block parameter saved under `path` in the older layout (the
/// rows of the table inside `layers.N`), or `None` when it has no older shape.
fn upgrade_block_path(path: &str) -> Option<String> {
    let mut segments: Vec<&str> = path.split('.').collect();
    let layers = segments.iter().rposition(|s| *s == "layers")?;
    let is_index = |s: &&str| s.parse::<usize>().is_ok();
    if !segments.get(layers + 1).is_some_and(is_index) || layers + 3 >= segments.len() {
        return None;
    }
    let field = layers + 2;
    let next = segments[field + 1];
    match segments[field] {
        "self_attn" if next == "Grouped" => segments[field + 1] = "MultiHead",
        "self_attn" if !ATTENTION_VARIANTS.contains(&next) => {
            segments.insert(field + 1, "MultiHead")
        }
        "mlp"
            if next == "Dense"
                && segments
                    .get(field + 2)
                    .is_some_and(|p| SWIGLU_PROJECTIONS.contains(p)) =>
        {
            segments[field + 1] = "SwiGlu"
        }
        "input_layernorm" | "post_attention_layernorm"
            if next == "weight" && field + 2 == segments.len() =>
        {
            segments.insert(field + 1, "Rms")
        }
        _ => return None,
    }
    Some(segments.join("."))
}

/// Today's path of a QK-norm weight saved when QK-norm was an RMSNorm of its own
/// (`….self_attn[.MultiHead|.Grouped].q_norm.weight`): the norm is now a [`QkNorm`]
/// holding a shared [`Norm`](crate::norm::Norm). `None` for any other path.
///
/// [`QkNorm`]: crate::attention::QkNorm
fn upgrade_qk_norm_path(path: &str) -> Option<String> {
    let mut segments: Vec<&str> = path.split('.').collect();
    let n = segments.len();
    let is_qk_norm = n >= 3
        && matches!(segments[n - 2], "q_norm" | "k_norm")
        && segments[n - 1] == "weight"
        && matches!(segments[n - 3], "self_attn" | "MultiHead" | "Grouped");
    is_qk_norm.then(|| {
        segments.splice(n - 1..n - 1, ["Shared", "Rms"]);
        segments.join(".")
    })
}

/// Today's path of a parameter of an older-layout record: the block rows of the
/// table, QK-norm's weights, and the embedding and final norm of a causal language
/// model.
fn upgrade_path(path: &str) -> String {
    let path = upgrade_qk_norm_path(path).unwrap_or_else(|| path.to_string());
    if let Some(upgraded) = upgrade_block_path(&path) {
        return upgraded;
    }
    let mut segments: Vec<&str> = path.split('.').collect();
    let n = segments.len();
    if n >= 3 && segments[n - 3..] == ["model", "embed_tokens", "weight"] {
        // The embedding left the stack.
        segments.remove(n - 3);
    } else if n >= 3 && segments[n - 3..] == ["model", "norm", "weight"] {
        // The stack's final norm is a `Norm` (RMSNorm here).
        segments.insert(n - 1, "Rms");
    }
    segments.join(".")
}

/// Today's paths of a record's parameters, or `None` when the record is current.
pub(crate) fn upgrade_paths(paths: &[String]) -> Option<Vec<String>> {
    paths
        .iter()
        .any(|path| upgrade_block_path(path).is_some() || upgrade_qk_norm_path(path).is_some())
        .then(|| paths.iter().map(|path| upgrade_path(path)).collect())
}

/// Renames the parameters of a burnpack model record written in the older layout;
/// `None` when every path is current (or the bytes are not a burnpack record, which
/// the caller's own reading then reports).
pub(crate) fn upgrade(bytes: &Bytes) -> Option<Bytes> {
    let reader = Reader::from_bytes(bytes.clone()).ok()?;
    let metadata = reader.metadata().clone();
    let scalars = reader.scalars().clone();
    let mut tensors = reader.into_tensors().ok()?;
    let names: Vec<String> = tensors.iter().map(|tensor| tensor.name.clone()).collect();
    let upgraded = upgrade_paths(&names)?;
    for (tensor, path) in tensors.iter_mut().zip(upgraded) {
        tensor.name = path;
    }
    let mut writer = Writer::new(tensors);
    for (key, value) in &metadata {
        writer = writer.with_metadata(key, value);
    }
    for (key, value) in scalars {
        writer = writer.with_scalar(&key, value);
    }
    writer.into_bytes().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::block::BlockKind;
    use crate::model::TransformerConfig;
    use crate::model::causal_lm_tests::{small, small_latent_moe};
    use crate::test_utils::{Fixture, assert_close, fixture_dir, model_test_devices};
    use crate::train::load_module;
    use burn::tensor::{Device, Int, Tensor};

    #[test]
    fn older_paths_are_renamed_and_current_ones_kept() {
        let older_record: Vec<String> = [
            "model.embed_tokens.weight",
            "model.layers.0.input_layernorm.weight",
            "model.norm.weight",
        ]
        .map(String::from)
        .to_vec();
        assert_eq!(
            upgrade_paths(&older_record).unwrap(),
            [
                "embed_tokens.weight",
                "model.layers.0.input_layernorm.Rms.weight",
                "model.norm.Rms.weight"
            ]
        );
        for (older, today) in [
            ("model.embed_tokens.weight", "embed_tokens.weight"),
            (
                "model.model.embed_tokens.weight",
                "model.embed_tokens.weight",
            ),
            (
                "model.layers.0.self_attn.Grouped.q_proj.weight",
                "model.layers.0.self_attn.MultiHead.q_proj.weight",
            ),
            (
                "decoder.layers.1.self_attn.k_proj.bias",
                "decoder.layers.1.self_attn.MultiHead.k_proj.bias",
            ),
            (
                "model.layers.3.mlp.Dense.down_proj.weight",
                "model.layers.3.mlp.SwiGlu.down_proj.weight",
            ),
            (
                "model.model.layers.1.post_attention_layernorm.weight",
                "model.model.layers.1.post_attention_layernorm.Rms.weight",
            ),
            ("model.norm.weight", "model.norm.Rms.weight"),
            (
                "model.model.layers.1.self_attn.MultiHead.k_norm.weight",
                "model.model.layers.1.self_attn.MultiHead.k_norm.Shared.Rms.weight",
            ),
            (
                "model.layers.0.self_attn.Grouped.q_norm.weight",
                "model.layers.0.self_attn.MultiHead.q_norm.Shared.Rms.weight",
            ),
        ] {
            assert_eq!(upgrade_path(older), today, "{older}");
            assert_eq!(upgrade_block_path(today), None, "{today} is current");
            assert_eq!(upgrade_qk_norm_path(today), None, "{today} is current");
        }
        for current in [
            "model.layers.0.self_attn.Latent.kv_b_proj.weight",
            "encoder.layers.0.mlp.Dense.fc1.weight",
            "model.layers.2.mlp.Moe.gate.weight",
            "encoder.layers.0.input_layernorm.Layer.gamma",
            "model.layers.0.self_attn.Latent.kv_a_layernorm.weight",
            "decoder.layers.0.cross_attn.q_proj.weight",
            "encoder.norm.Layer.beta",
            // An LmTask's record of today: the causal LM under `model`.
            "model.embed_tokens.weight",
            "model.model.norm.Rms.weight",
            "model.layers.0.self_attn.MultiHead.q_norm.PerHead.weight",
            "model.layers.0.self_attn.MultiHead.k_norm.Shared.Layer.bias",
        ] {
            assert_eq!(upgrade_paths(&[current.to_string()]), None, "{current}");
        }
    }

    /// A model with QK-norm saved when the norm was an RMSNorm of its own (its weights
    /// at `….q_norm.weight`) loads into today's model and gives the same logits.
    #[test]
    fn a_record_with_the_older_qk_norm_paths_loads() {
        use crate::attention::QkNormConfig;
        let device = Device::flex();
        let config = small(BlockKind::PreNorm).with_qk_norm(Some(QkNormConfig::new()));
        let model = crate::train::host_init(3, |host| config.try_init(host)).unwrap();
        let dir = tempfile::TempDir::new().unwrap();
        let path = dir.path().join("model.bpk");
        crate::train::save_module(model.clone(), &path).unwrap();
        // The same record in the older layout.
        let bytes = Bytes::from_bytes_vec(std::fs::read(&path).unwrap());
        let reader = Reader::from_bytes(bytes).unwrap();
        let mut tensors = reader.into_tensors().unwrap();
        let mut renamed = 0;
        for tensor in &mut tensors {
            if tensor.name.contains("_norm.Shared.Rms.") {
                tensor.name = tensor.name.replace("_norm.Shared.Rms.", "_norm.");
                renamed += 1;
            }
        }
        assert_eq!(
            renamed,
            2 * config.n_layers,
            "q_norm and k_norm of every layer"
        );
        let older = Writer::new(tensors).into_bytes().unwrap();
        std::fs::write(&path, &older[..]).unwrap();
        let fresh = crate::train::host_init(4, |host| config.try_init(host)).unwrap();
        let loaded = load_module(fresh, &path).unwrap();
        let prompt = Tensor::<2, Int>::from_data([[1i64, 5, 2, 7]], &device);
        assert_close(
            loaded.forward(prompt.clone(), None),
            model.forward(prompt, None),
            1e-6,
            "older QK-norm paths",
        );
    }

    fn tokens(data: burn::tensor::TensorData, device: &Device) -> Tensor<2, Int> {
        Tensor::from_data(data, device)
    }

    /// Records saved in the older layout (tests/fixtures/legacy) load into today's
    /// models and give the logits they gave when saved.
    #[test]
    fn older_records_load_and_give_the_same_logits() {
        let dir = fixture_dir().join("legacy");
        for device in model_test_devices() {
            for (name, config) in [
                // The configurations the records were saved with.
                ("causal_lm_dense", small(BlockKind::PreNorm)),
                (
                    "causal_lm_latent_moe",
                    small_latent_moe().with_tie_word_embeddings(true),
                ),
            ] {
                let fixture = Fixture::load(&format!("legacy/{name}"));
                let model = load_module(config.init(&device), &dir.join(format!("{name}.bpk")))
                    .unwrap_or_else(|error| panic!("{name}: {error}"));
                let logits = model.forward(tokens(fixture.data("tokens"), &device), None);
                assert_close(logits, fixture.tensor("logits", &device), 1e-4, name);
            }
            for (name, kind) in [
                ("transformer_post_norm", BlockKind::PostNorm),
                ("transformer_pre_norm", BlockKind::PreNorm),
            ] {
                let fixture = Fixture::load(&format!("legacy/{name}"));
                let config = TransformerConfig::tiny(20, 24).with_block_kind(kind);
                let model = load_module(config.init(&device), &dir.join(format!("{name}.bpk")))
                    .unwrap_or_else(|error| panic!("{name}: {error}"));
                let logits = model.forward(
                    tokens(fixture.data("source"), &device),
                    tokens(fixture.data("target"), &device),
                    None,
                    None,
                );
                assert_close(logits, fixture.tensor("logits", &device), 1e-4, name);
            }
        }
    }
}
