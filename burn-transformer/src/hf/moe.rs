//! The mixture-of-experts keys of a `config.json` (Mixtral, DeepSeek-V2/V3, Qwen-MoE
//! style), mapped to a [`MoeConfig`], the [`MoeLayerPlan`] of which layers are sparse,
//! and the [`SwiGluConfig`] of the dense ones.

use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::activation::deserialize_activation;
use super::error::HfError;
use super::keys::{KeyError, UnreadKeys, read_keys, required};
use super::model_type::ModelType;
use crate::ffn::moe::{GroupScoring, RouterConfig, RouterScoring};
use crate::ffn::{Activation, MoeConfig, MoeLayerPlan, SwiGluConfig};

/// Reads the sparse layers of a Hugging Face `config.json` (already parsed; `path` only
/// names it in errors):
/// - experts: `n_routed_experts`, else `num_local_experts`, else `moe_num_experts`,
///   else `num_experts`; `num_experts_per_tok` (Hunyuan's `moe_topk`, ERNIE's
///   `moe_k`); width `moe_intermediate_size`, else `intermediate_size`;
/// - `n_shared_experts` (default 0), `routed_scaling_factor` (default 1), `n_group`
///   and `topk_group` (default 1), `hidden_act` (default silu);
/// - scoring: `scoring_func` (default softmax); `norm_topk_prob` (default false, true
///   for `deepseek_v3` and the families that route as it);
/// - the correction bias for `topk_method: "noaux_tc"`; group score max for
///   `topk_method: "group_limited_greedy"`.
///
/// For the families transformers implements (`model_type`), the routing is the one its
/// code computes, whatever keys it does not read say:
/// - scores: softmax, but sigmoid for `deepseek_v3` and the families that route as it
///   (GLM-4.5, GLM-4.7-Flash, dots.llm1, Solar-Open) and for MiniMax-M2;
/// - the correction bias: DeepSeek-V3 and those families (with groups), MiniMax-M2 and
///   ERNIE-4.5-MoE (without);
/// - renormalized top-k weights always for Mixtral, gpt-oss, MiniMax-M2, ERNIE-4.5-MoE,
///   Hunyuan-MoE, GraniteMoE(-Shared) and Qwen3.5-MoE, never for DeepSeek-V2;
/// - expert groups and a routed scaling factor only for DeepSeek-V2/V3 and the families
///   that route as V3 (DeepSeek-V2's groups only under `topk_method:
///   "group_limited_greedy"`);
/// - shared experts: DeepSeek's `n_shared_experts` (EXAONE-MoE's
///   `num_shared_experts`); Qwen2-MoE's (Qwen3-Next's, Qwen3.5-MoE's) one of
///   `shared_expert_intermediate_size` behind a sigmoid gate; GraniteMoE-Shared's one of `shared_intermediate_size`;
///   Hunyuan-MoE's one as wide as the routed ones;
///   ERNIE-4.5-MoE's `moe_num_shared_experts` as wide as the routed ones, with biases
///   under `use_bias`.
///
/// # Errors
/// [`HfError::Field`] naming the key that is missing or malformed.
pub fn moe_config(config: &Value, path: impl AsRef<Path>) -> Result<MoeConfig, HfError> {
    read_keys::<MoeKeys>(config, None)
        .and_then(|keys| {
            let family = keys.model_type.clone().unwrap_or_default();
            keys.moe_config(&mut UnreadKeys::new(config, &family))
        })
        .map_err(|error| error.in_file(path.as_ref()))
}

/// Reads which layers are sparse: `first_k_dense_replace` and `moe_layer_freq`
/// (defaults 0 and 1: every layer, as Mixtral), Qwen-MoE's `decoder_sparse_step` and
/// `mlp_only_layers`, GLM-4.7-Flash's and EXAONE-MoE's `mlp_layer_types`, ERNIE-4.5-MoE's
/// `moe_layer_start_index`, `moe_layer_end_index` and `moe_layer_interval`; Solar-Open
/// and Qwen3.5-MoE are sparse on every layer.
///
/// # Errors
/// [`HfError::Field`] naming a value that is not a non-negative integer, or a zero
/// `moe_layer_freq`.
pub fn moe_layer_plan(config: &Value, path: impl AsRef<Path>) -> Result<MoeLayerPlan, HfError> {
    read_keys::<MoeKeys>(config, None)
        .and_then(|keys| keys.moe_layer_plan())
        .map_err(|error| error.in_file(path.as_ref()))
}

/// Reads the dense SwiGLU of a mixture-of-experts model's dense layers: `hidden_size`,
/// `intermediate_size`, `hidden_act` (default silu).
///
/// # Errors
/// [`HfError::Field`] naming the key that is missing or malformed.
pub fn swiglu_config(config: &Value, path: impl AsRef<Path>) -> Result<SwiGluConfig, HfError> {
    read_keys::<MoeKeys>(config, None)
        .and_then(|keys| keys.swiglu_config())
        .map_err(|error| error.in_file(path.as_ref()))
}

/// The mixture-of-experts keys of a `config.json`.
#[derive(Deserialize, Debug)]
pub(crate) struct MoeKeys {
    model_type: Option<String>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    #[serde(default, deserialize_with = "deserialize_same_per_layer")]
    moe_intermediate_size: Option<usize>,
    n_routed_experts: Option<usize>,
    num_local_experts: Option<usize>,
    #[serde(default, deserialize_with = "deserialize_same_per_layer")]
    num_experts: Option<usize>,
    num_experts_per_tok: Option<usize>,
    /// ERNIE-4.5-MoE's switch of every projection's bias (its shared experts' too).
    use_bias: Option<bool>,
    /// ERNIE-4.5-MoE's names of the experts, experts per token and shared experts.
    moe_num_experts: Option<usize>,
    moe_k: Option<usize>,
    moe_num_shared_experts: Option<usize>,
    /// ERNIE-4.5-MoE's sparse layers: every `moe_layer_interval`-th (counting from 1)
    /// from `moe_layer_start_index` to `moe_layer_end_index` (-1: the last layer).
    moe_layer_start_index: Option<usize>,
    moe_layer_end_index: Option<i64>,
    moe_layer_interval: Option<usize>,
    /// Hunyuan's name of `num_experts_per_tok` (a number, or one per layer).
    #[serde(default, deserialize_with = "deserialize_same_per_layer")]
    moe_topk: Option<usize>,
    n_shared_experts: Option<usize>,
    /// EXAONE-MoE's name of `n_shared_experts`.
    num_shared_experts: Option<usize>,
    /// Qwen2-MoE's shared expert's width.
    shared_expert_intermediate_size: Option<usize>,
    /// GraniteMoE-Shared's shared expert's width (0: none).
    shared_intermediate_size: Option<usize>,
    routed_scaling_factor: Option<f64>,
    n_group: Option<usize>,
    topk_group: Option<usize>,
    scoring_func: Option<String>,
    norm_topk_prob: Option<bool>,
    topk_method: Option<String>,
    #[serde(default, deserialize_with = "deserialize_activation")]
    hidden_act: Option<Activation>,
    first_k_dense_replace: Option<usize>,
    moe_layer_freq: Option<usize>,
    decoder_sparse_step: Option<usize>,
    mlp_only_layers: Option<Vec<usize>>,
    /// GLM-4.7-Flash's kind of feed-forward per layer, `"dense"` or `"sparse"`.
    mlp_layer_types: Option<Vec<String>>,
    num_hidden_layers: Option<usize>,
}

/// serde's reader of a size that a file may give once or once per layer (Hunyuan's
/// `moe_topk`, `moe_intermediate_size`): a list must hold one value, repeated, since
/// every sparse layer here has the same shape.
fn deserialize_same_per_layer<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<usize>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum OneOrPerLayer {
        One(usize),
        PerLayer(Vec<usize>),
    }
    match Option::<OneOrPerLayer>::deserialize(deserializer)? {
        None => Ok(None),
        Some(OneOrPerLayer::One(value)) => Ok(Some(value)),
        Some(OneOrPerLayer::PerLayer(values)) => match values.split_first() {
            Some((&first, rest)) if rest.iter().all(|&value| value == first) => Ok(Some(first)),
            Some(_) => Err(serde::de::Error::custom(format!(
                "differs across layers ({values:?}): layers of different sizes are not \
                 supported"
            ))),
            None => Err(serde::de::Error::custom("is an empty list")),
        },
    }
}

/// How a router picks among expert groups.
struct GroupRouting {
    n_group: usize,
    topk_group: usize,
    group_scoring: GroupScoring,
    score_correction_bias: bool,
}

impl GroupRouting {
    /// Every expert in one group, no bias.
    fn ungrouped() -> Self {
        Self {
            n_group: 1,
            topk_group: 1,
            group_scoring: GroupScoring::TopTwoSum,
            score_correction_bias: false,
        }
    }
}

impl MoeKeys {
    /// The sparse layer these keys describe; `unread` notes the keys that the family's
    /// transformers implementation does not read.
    pub(crate) fn moe_config(&self, unread: &mut UnreadKeys) -> Result<MoeConfig, KeyError> {
        let family = self.model_type.as_deref().and_then(ModelType::from_name);
        let scoring = match self.scoring_func.as_deref() {
            Some("softmax") => Some(RouterScoring::Softmax),
            Some("sigmoid") => Some(RouterScoring::Sigmoid),
            Some(other) => {
                return Err(KeyError::new(
                    "scoring_func",
                    format!("expected softmax or sigmoid, got {other}"),
                ));
            }
            None => None,
        };
        let scoring = match family {
            Some(family) if family.routes_as_deepseek_v3() || family == ModelType::MinimaxM2 => {
                unread.fixed(
                    "scoring_func",
                    scoring,
                    RouterScoring::Sigmoid,
                    "sigmoid scores",
                )
            }
            Some(_) => unread.fixed(
                "scoring_func",
                scoring,
                RouterScoring::Softmax,
                "softmax scores",
            ),
            None => scoring.unwrap_or(RouterScoring::Softmax),
        };
        let norm_topk_prob = match family {
            Some(
                ModelType::Mixtral
                | ModelType::GptOss
                | ModelType::MinimaxM2
                | ModelType::GraniteMoe
                | ModelType::GraniteMoeShared
                | ModelType::HunyuanV1Moe
                | ModelType::Ernie45Moe
                | ModelType::Qwen35Moe,
            ) => unread.fixed(
                "norm_topk_prob",
                self.norm_topk_prob,
                true,
                "renormalized top-k weights",
            ),
            Some(ModelType::DeepseekV2) => unread.fixed(
                "norm_topk_prob",
                self.norm_topk_prob,
                false,
                "the top-k scores as weights",
            ),
            Some(family) if family.routes_as_deepseek_v3() => self.norm_topk_prob.unwrap_or(true),
            _ => self.norm_topk_prob.unwrap_or(false),
        };
        if family == Some(ModelType::Qwen35Moe) {
            // Its class has no dense layers (`moe_layer_plan`), nor the keys that would
            // make some.
            let every_layer = "experts on every layer";
            unread.fixed(
                "decoder_sparse_step",
                self.decoder_sparse_step,
                1,
                every_layer,
            );
            unread.fixed(
                "mlp_only_layers",
                self.mlp_only_layers.clone(),
                Vec::new(),
                every_layer,
            );
        }
        let n_experts = self
            .n_routed_experts
            .or(self.num_local_experts)
            .or(self.moe_num_experts)
            .or(self.num_experts)
            .ok_or_else(|| {
                KeyError::new(
                    "n_routed_experts",
                    "missing (also looked for num_local_experts, moe_num_experts and \
                     num_experts)",
                )
            })?;
        // Hunyuan's experts (and its shared expert) are `intermediate_size` wide,
        // whatever `moe_intermediate_size` says.
        let moe_intermediate_size = match family {
            Some(ModelType::HunyuanV1Moe) => None,
            _ => self.moe_intermediate_size,
        };
        let d_ff = moe_intermediate_size
            .or(self.intermediate_size)
            .ok_or_else(|| {
                KeyError::new(
                    "moe_intermediate_size",
                    "missing (also looked for intermediate_size)",
                )
            })?;
        let routing = self.group_routing(family, unread)?;
        let deepseek = matches!(
            family,
            None | Some(ModelType::DeepseekV2 | ModelType::Mistral4)
        ) || family.is_some_and(ModelType::routes_as_deepseek_v3);
        let unscaled = |unread: &mut UnreadKeys| {
            unread.fixed(
                "routed_scaling_factor",
                self.routed_scaling_factor,
                1.0,
                "unscaled expert weights",
            )
        };
        // Qwen2-MoE's and GraniteMoE-Shared's one shared expert has a width of its own
        // (Qwen2-MoE's a gate too).
        let mut shared_d_ff = None;
        // EXAONE-MoE and ERNIE-4.5-MoE count their shared experts (as wide as the routed
        // ones, as one MLP) under a name of their own.
        let own_shared_count = match family {
            Some(ModelType::ExaoneMoe) => Some(("num_shared_experts", self.num_shared_experts)),
            Some(ModelType::Ernie45Moe) => {
                Some(("moe_num_shared_experts", self.moe_num_shared_experts))
            }
            _ => None,
        };
        let (routed_scaling_factor, n_shared_experts) = if let Some((key, count)) = own_shared_count
        {
            let count = count.unwrap_or(0);
            unread.fixed(
                "n_shared_experts",
                self.n_shared_experts,
                count,
                &format!("`{key}`"),
            );
            let scale = match deepseek {
                true => self.routed_scaling_factor.unwrap_or(1.0),
                false => unscaled(unread),
            };
            (scale, count)
        } else if deepseek {
            (
                self.routed_scaling_factor.unwrap_or(1.0),
                self.n_shared_experts.unwrap_or(0),
            )
        } else if family == Some(ModelType::HunyuanV1Moe) {
            // One shared expert (`shared_mlp`) as wide as the routed ones.
            let one = unread.fixed(
                "n_shared_experts",
                self.n_shared_experts,
                1,
                "one shared expert of `intermediate_size`",
            );
            (unscaled(unread), one)
        } else if family == Some(ModelType::GraniteMoeShared) {
            // One shared expert, ungated, unless its width is 0.
            shared_d_ff = self.shared_intermediate_size.filter(|&width| width > 0);
            let shared = unread.fixed(
                "n_shared_experts",
                self.n_shared_experts,
                usize::from(shared_d_ff.is_some()),
                "one shared expert of `shared_intermediate_size` (none when 0)",
            );
            (unscaled(unread), shared)
        } else if family.is_some_and(ModelType::has_gated_shared_expert) {
            shared_d_ff = Some(required(
                self.shared_expert_intermediate_size,
                "shared_expert_intermediate_size",
                "a non-negative integer",
            )?);
            let one = unread.fixed(
                "n_shared_experts",
                self.n_shared_experts,
                1,
                "one shared expert (`shared_expert_intermediate_size` wide)",
            );
            (unscaled(unread), one)
        } else {
            (
                unscaled(unread),
                unread.fixed(
                    "n_shared_experts",
                    self.n_shared_experts,
                    0,
                    "no shared expert",
                ),
            )
        };
        let router = RouterConfig::new(
            required(self.hidden_size, "hidden_size", "a non-negative integer")?,
            n_experts,
            required(
                self.num_experts_per_tok.or(self.moe_topk).or(self.moe_k),
                "num_experts_per_tok",
                "a non-negative integer (also looked for moe_topk and moe_k)",
            )?,
        )
        .with_scoring(scoring)
        .with_norm_topk_prob(norm_topk_prob)
        .with_routed_scaling_factor(routed_scaling_factor)
        .with_n_group(routing.n_group)
        .with_topk_group(routing.topk_group)
        .with_group_scoring(routing.group_scoring)
        .with_score_correction_bias(routing.score_correction_bias);
        Ok(MoeConfig::new(router, d_ff)
            .with_n_shared_experts(n_shared_experts)
            .with_shared_d_ff(shared_d_ff)
            .with_shared_expert_gate(family.is_some_and(ModelType::has_gated_shared_expert))
            .with_shared_expert_bias(
                family == Some(ModelType::Ernie45Moe) && self.use_bias.unwrap_or(false),
            )
            .with_activation(self.hidden_act.unwrap_or(Activation::Silu)))
    }

    /// Expert groups and the correction bias: DeepSeek-V3 and the families that route
    /// as it always route through groups (scored by their two best experts) with the
    /// bias, Mistral-4 through the same groups without it; DeepSeek-V2 through groups (scored by their best expert) under
    /// `topk_method: "group_limited_greedy"` and over all experts under `"greedy"`; the
    /// other families over all experts. Without a family, the keys as written.
    fn group_routing(
        &self,
        family: Option<ModelType>,
        unread: &mut UnreadKeys,
    ) -> Result<GroupRouting, KeyError> {
        let topk_method = self.topk_method.as_deref();
        let groups = || (self.n_group.unwrap_or(1), self.topk_group.unwrap_or(1));
        let ungrouped = |unread: &mut UnreadKeys, what| {
            unread.fixed("n_group", self.n_group, 1, what);
            unread.fixed("topk_group", self.topk_group, 1, what);
            GroupRouting::ungrouped()
        };
        let routing = match family {
            Some(family) if family.routes_as_deepseek_v3() => {
                unread.fixed(
                    "topk_method",
                    topk_method,
                    "noaux_tc",
                    "groups of the two best experts' scores with the correction bias",
                );
                let (n_group, topk_group) = groups();
                GroupRouting {
                    n_group,
                    topk_group,
                    group_scoring: GroupScoring::TopTwoSum,
                    score_correction_bias: true,
                }
            }
            // Mistral-4 routes as DeepSeek-V3 on softmax scores, without the bias.
            Some(ModelType::Mistral4) => {
                let (n_group, topk_group) = groups();
                GroupRouting {
                    n_group,
                    topk_group,
                    group_scoring: GroupScoring::TopTwoSum,
                    score_correction_bias: false,
                }
            }
            Some(ModelType::DeepseekV2) => match topk_method.unwrap_or("greedy") {
                "group_limited_greedy" => {
                    let (n_group, topk_group) = groups();
                    GroupRouting {
                        n_group,
                        topk_group,
                        group_scoring: GroupScoring::Max,
                        score_correction_bias: false,
                    }
                }
                "greedy" => ungrouped(unread, "one group (`topk_method: \"greedy\"`)"),
                other => {
                    return Err(KeyError::new(
                        "topk_method",
                        format!("expected greedy or group_limited_greedy, got {other}"),
                    ));
                }
            },
            // MiniMax-M2 corrects the sigmoid scores with the bias, ERNIE-4.5-MoE the
            // softmax scores, over all experts.
            Some(ModelType::MinimaxM2 | ModelType::Ernie45Moe) => {
                unread.fixed(
                    "topk_method",
                    topk_method,
                    "noaux_tc",
                    "the correction bias",
                );
                GroupRouting {
                    score_correction_bias: true,
                    ..ungrouped(unread, "no expert groups")
                }
            }
            Some(_) => ungrouped(unread, "no expert groups"),
            None => {
                let (n_group, topk_group) = groups();
                GroupRouting {
                    n_group,
                    topk_group,
                    group_scoring: if topk_method == Some("group_limited_greedy") {
                        GroupScoring::Max
                    } else {
                        GroupScoring::TopTwoSum
                    },
                    score_correction_bias: topk_method == Some("noaux_tc"),
                }
            }
        };
        Ok(routing)
    }

    /// Which layers are sparse: GLM-4.7-Flash's and EXAONE-MoE's `mlp_layer_types`, the
    /// other families' counts and lists.
    pub(crate) fn moe_layer_plan(&self) -> Result<MoeLayerPlan, KeyError> {
        let family = self.model_type.as_deref().and_then(ModelType::from_name);
        if matches!(family, Some(ModelType::Glm4MoeLite | ModelType::ExaoneMoe))
            && let Some(kinds) = &self.mlp_layer_types
        {
            return self.listed_layer_plan(kinds);
        }
        if family == Some(ModelType::Ernie45Moe) {
            return self.ernie_layer_plan();
        }
        // Solar-Open's and Qwen3.5-MoE's classes have no dense layers (nor the keys
        // that would make some).
        if matches!(family, Some(ModelType::SolarOpen | ModelType::Qwen35Moe)) {
            return Ok(MoeLayerPlan::all_sparse());
        }
        let plan = MoeLayerPlan::new()
            .with_first_k_dense_replace(self.first_k_dense_replace.unwrap_or(0))
            .with_moe_layer_freq(self.moe_layer_freq.unwrap_or(1))
            .with_decoder_sparse_step(self.decoder_sparse_step.unwrap_or(1))
            .with_dense_layers(self.mlp_only_layers.clone().unwrap_or_default());
        for (key, value) in [
            ("moe_layer_freq", plan.moe_layer_freq),
            ("decoder_sparse_step", plan.decoder_sparse_step),
        ] {
            if value == 0 {
                return Err(KeyError::new(key, "must be greater than 0"));
            }
        }
        Ok(plan)
    }

    /// ERNIE-4.5-MoE's plan: layer `i` is sparse when `(i + 1) % moe_layer_interval == 0`
    /// and `moe_layer_start_index <= i <= moe_layer_end_index` (-1: no end).
    fn ernie_layer_plan(&self) -> Result<MoeLayerPlan, KeyError> {
        let interval = self.moe_layer_interval.unwrap_or(1);
        if interval == 0 {
            return Err(KeyError::new(
                "moe_layer_interval",
                "must be greater than 0",
            ));
        }
        let last = match self.moe_layer_end_index.unwrap_or(-1) {
            -1 => None,
            end => Some(usize::try_from(end).map_err(|_| {
                KeyError::new(
                    "moe_layer_end_index",
                    format!("expected a layer index, or -1 for the last layer, got {end}"),
                )
            })?),
        };
        Ok(MoeLayerPlan::new()
            .with_first_k_dense_replace(self.moe_layer_start_index.unwrap_or(1))
            .with_decoder_sparse_step(interval)
            .with_last_sparse_layer(last))
    }

    /// The plan of `mlp_layer_types`: the layers it calls `"dense"` are.
    fn listed_layer_plan(&self, kinds: &[String]) -> Result<MoeLayerPlan, KeyError> {
        let key = "mlp_layer_types";
        if let Some(layers) = self.num_hidden_layers
            && kinds.len() != layers
        {
            return Err(KeyError::new(
                key,
                format!("has {} entries for {layers} layers", kinds.len()),
            ));
        }
        let mut dense_layers = Vec::new();
        for (layer, kind) in kinds.iter().enumerate() {
            match kind.as_str() {
                "dense" => dense_layers.push(layer),
                "sparse" => {}
                other => {
                    return Err(KeyError::new(
                        key,
                        format!("expected \"dense\" or \"sparse\", got \"{other}\""),
                    ));
                }
            }
        }
        Ok(MoeLayerPlan::new().with_dense_layers(dense_layers))
    }

    /// The dense layers' SwiGLU.
    fn swiglu_config(&self) -> Result<SwiGluConfig, KeyError> {
        let size = |value, key| required(value, key, "a non-negative integer");
        Ok(SwiGluConfig::new(
            size(self.hidden_size, "hidden_size")?,
            size(self.intermediate_size, "intermediate_size")?,
        )
        .with_activation(self.hidden_act.unwrap_or(Activation::Silu)))
    }
}

#[cfg(test)]
mod tests {
    use burn::module::Param;
    use burn::tensor::{Device, Int, Tensor};

    use super::*;
    use crate::ffn::moe::{ExpertDispatch, Experts, Moe};
    use crate::hf::tests::fixture_config;
    use crate::test_utils::{Fixture, assert_close, test_devices};

    /// A layer holding the fixture's weights (fused experts, as transformers 5 stores them).
    fn load(name: &str, model_type: &str, device: &Device) -> (Fixture, Moe) {
        let fixture = Fixture::load(name);
        let mut json = fixture_config(name);
        json["model_type"] = Value::from(model_type);
        let config = moe_config(&json, name).unwrap();
        let mut moe = config.init(device);
        moe.gate.weight = Param::from_tensor(fixture.tensor("gate.weight", device));
        if fixture.contains("gate.e_score_correction_bias") {
            moe.gate.e_score_correction_bias = Some(Param::from_tensor(
                fixture.tensor("gate.e_score_correction_bias", device),
            ));
        }
        moe.experts = Experts::from_fused(
            fixture.tensor("experts.gate_up_proj", device),
            fixture.tensor("experts.down_proj", device),
            config.activation,
        );
        if let Some(shared) = &mut moe.shared_experts {
            shared.gate_proj = fixture.linear("shared_experts.gate_proj", device);
            shared.up_proj = fixture.linear("shared_experts.up_proj", device);
            shared.down_proj = fixture.linear("shared_experts.down_proj", device);
        }
        (fixture, moe)
    }

    /// Each token's chosen experts, sorted.
    fn sorted_rows(indices: Tensor<2, Int>) -> Vec<Vec<i64>> {
        let [_, k] = indices.dims();
        let values = indices
            .into_data()
            .convert::<i64>()
            .try_to_vec::<i64>()
            .unwrap();
        values
            .chunks(k)
            .map(|row| {
                let mut row = row.to_vec();
                row.sort();
                row
            })
            .collect()
    }

    #[test]
    fn matches_hugging_face_moe_layers() {
        for (name, model_type) in [
            ("moe_deepseek_v3", "deepseek_v3"),
            ("moe_deepseek_v3_unnormalized", "deepseek_v3"),
            ("moe_mixtral", "mixtral"),
        ] {
            for device in test_devices() {
                let (fixture, mut moe) = load(name, model_type, &device);
                let x = fixture.tensor::<3>("x", &device);
                let out = moe.forward(x.clone());
                assert_close(
                    out.router_logits.clone(),
                    fixture.tensor("router_logits", &device),
                    1e-5,
                    &format!("{name} logits"),
                );
                let routing = moe.gate.forward(x.clone().reshape([18, 16]));
                assert_eq!(
                    sorted_rows(routing.indices),
                    sorted_rows(Tensor::from_data(fixture.data("topk_indices"), &device)),
                    "{name} choices on {device:?}"
                );
                assert_close(out.output, fixture.tensor("y", &device), 1e-5, name);
                for strategy in [ExpertDispatch::PerExpert, ExpertDispatch::Batched] {
                    moe.set_dispatch(strategy);
                    let y = moe.forward(x.clone()).output;
                    let what = format!("{name} {strategy:?}");
                    assert_close(y, fixture.tensor("y", &device), 1e-5, &what);
                }
                assert_close(
                    moe.forward_dense_reference(x),
                    fixture.tensor("y", &device),
                    1e-5,
                    name,
                );
                if fixture.contains("aux_loss") {
                    assert_close(
                        out.aux_loss,
                        fixture.tensor("aux_loss", &device),
                        1e-5,
                        "aux",
                    );
                    assert_close(out.z_loss, fixture.tensor("z_loss", &device), 1e-4, "z");
                }
            }
        }
    }

    #[test]
    fn reads_hugging_face_configs() {
        let config = moe_config(
            &serde_json::json!({
                "model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336,
                "num_local_experts": 8, "num_experts_per_tok": 2, "hidden_act": "silu"
            }),
            "config.json",
        )
        .unwrap();
        assert_eq!(config.router.n_experts, 8);
        assert!(config.router.norm_topk_prob);
        assert_eq!(config.router.scoring, RouterScoring::Softmax);
        let config = moe_config(
            &serde_json::json!({
                "model_type": "deepseek_v3", "hidden_size": 7168, "moe_intermediate_size": 2048,
                "intermediate_size": 18432, "n_routed_experts": 256, "num_experts_per_tok": 8,
                "n_group": 8, "topk_group": 4, "n_shared_experts": 1, "routed_scaling_factor": 2.5,
                "norm_topk_prob": true, "scoring_func": "sigmoid", "topk_method": "noaux_tc"
            }),
            "config.json",
        )
        .unwrap();
        let reference = MoeConfig::deepseek_v3();
        assert_eq!(config.d_ff, reference.d_ff);
        assert_eq!(config.router.n_group, reference.router.n_group);
        assert!(config.router.score_correction_bias);
        assert_eq!(config.router.scoring, RouterScoring::Sigmoid);
        config.validate().unwrap();
        // DeepSeek-V2: softmax scores, group maximum, no renormalization by default.
        let v2 = moe_config(
            &serde_json::json!({
                "model_type": "deepseek_v2", "hidden_size": 16, "moe_intermediate_size": 8,
                "n_routed_experts": 4, "num_experts_per_tok": 2,
                "topk_method": "group_limited_greedy"
            }),
            "config.json",
        )
        .unwrap();
        assert_eq!(v2.router.scoring, RouterScoring::Softmax);
        assert_eq!(v2.router.group_scoring, GroupScoring::Max);
        assert!(!v2.router.norm_topk_prob && !v2.router.score_correction_bias);
        let error = moe_config(&serde_json::json!({"hidden_size": 8}), "config.json").unwrap_err();
        assert!(
            matches!(&error, HfError::Field { field, .. } if field == "n_routed_experts"),
            "{error}"
        );
        let error = moe_config(
            &serde_json::json!({"hidden_size": 8, "num_experts": 2, "intermediate_size": 4,
                                "num_experts_per_tok": 1, "scoring_func": "relu"}),
            "config.json",
        )
        .unwrap_err();
        assert!(
            matches!(&error, HfError::Field { field, .. } if field == "scoring_func"),
            "{error}"
        );
    }

    #[test]
    fn deepseek_v3_has_three_dense_layers_then_moe() {
        let plan = moe_layer_plan(
            &serde_json::json!({"first_k_dense_replace": 3, "moe_layer_freq": 1}),
            "config.json",
        )
        .unwrap();
        let sparse: Vec<bool> = (0..6).map(|layer| plan.is_moe(layer)).collect();
        assert_eq!(sparse, [false, false, false, true, true, true]);
        assert_eq!(
            moe_layer_plan(&serde_json::json!({}), "config.json").unwrap(),
            MoeLayerPlan::all_sparse()
        );
        assert!(matches!(
            moe_layer_plan(&serde_json::json!({"moe_layer_freq": 0}), "config.json"),
            Err(HfError::Field { field, .. }) if field == "moe_layer_freq"
        ));
        let dense = swiglu_config(
            &serde_json::json!({
                "hidden_size": 16, "intermediate_size": 40, "hidden_act": "silu"
            }),
            "config.json",
        )
        .unwrap();
        assert_eq!((dense.d_model, dense.d_ff), (16, 40));
    }

    /// GLM-4.7-Flash lists each layer's kind; only its family reads the list.
    #[test]
    fn glm4_moe_lite_takes_its_layer_kinds_from_the_list() {
        let read = |config: serde_json::Value| moe_layer_plan(&config, "config.json");
        let plan = read(serde_json::json!({
            "model_type": "glm4_moe_lite", "num_hidden_layers": 3,
            "first_k_dense_replace": 2, "mlp_layer_types": ["sparse", "dense", "sparse"]
        }))
        .unwrap();
        let sparse: Vec<bool> = (0..3).map(|layer| plan.is_moe(layer)).collect();
        assert_eq!(sparse, [true, false, true]);
        let other = read(serde_json::json!({
            "model_type": "deepseek_v3", "mlp_layer_types": ["dense", "dense"]
        }))
        .unwrap();
        assert_eq!(other, MoeLayerPlan::all_sparse());
        for (kinds, reason) in [
            (serde_json::json!(["dense", "mixed"]), "\"mixed\""),
            (serde_json::json!(["dense"]), "1 entries for 2 layers"),
        ] {
            let error = read(serde_json::json!({
                "model_type": "glm4_moe_lite", "num_hidden_layers": 2, "mlp_layer_types": kinds
            }))
            .unwrap_err();
            assert!(
                matches!(&error, HfError::Field { field, .. } if field == "mlp_layer_types")
                    && error.to_string().contains(reason),
                "{error}"
            );
        }
    }

    /// ERNIE-4.5-MoE's sparse layers: every `moe_layer_interval`-th (counting from 1)
    /// from the start index to the end index (-1: the last layer); other families do
    /// not read those keys.
    #[test]
    fn ernie4_5_moe_reads_its_range_and_interval_of_sparse_layers() {
        let read = |model_type: &str, keys: serde_json::Value| {
            let mut config = keys;
            config["model_type"] = Value::from(model_type);
            moe_layer_plan(&config, "config.json")
        };
        let sparse =
            |plan: MoeLayerPlan| (0..8).map(|layer| plan.is_moe(layer)).collect::<Vec<_>>();
        let range = serde_json::json!({
            "moe_layer_start_index": 2, "moe_layer_end_index": 6, "moe_layer_interval": 2
        });
        assert_eq!(
            sparse(read("ernie4_5_moe", range.clone()).unwrap()),
            [false, false, false, true, false, true, false, false]
        );
        assert_eq!(
            sparse(read("deepseek_v3", range).unwrap()),
            sparse(MoeLayerPlan::all_sparse())
        );
        let to_the_end = serde_json::json!({"moe_layer_start_index": 1, "moe_layer_end_index": -1});
        assert_eq!(
            sparse(read("ernie4_5_moe", to_the_end).unwrap()),
            [false, true, true, true, true, true, true, true]
        );
        for (keys, field) in [
            (
                serde_json::json!({"moe_layer_end_index": -2}),
                "moe_layer_end_index",
            ),
            (
                serde_json::json!({"moe_layer_interval": 0}),
                "moe_layer_interval",
            ),
            (
                serde_json::json!({"moe_layer_start_index": [1, 1]}),
                "moe_layer_start_index",
            ),
        ] {
            let error = read("ernie4_5_moe", keys).unwrap_err();
            assert!(
                matches!(&error, HfError::Field { field: named, .. } if named == field),
                "{error}"
            );
        }
    }

    /// GraniteMoE-Shared's shared expert: `shared_intermediate_size` wide, ungated
    /// (Qwen2-MoE's is gated); none at width 0.
    #[test]
    fn granitemoeshared_has_one_ungated_shared_expert_unless_its_width_is_zero() {
        let read = |width: usize| {
            moe_config(
                &serde_json::json!({
                    "model_type": "granitemoeshared", "hidden_size": 16,
                    "intermediate_size": 8, "num_local_experts": 4, "num_experts_per_tok": 2,
                    "shared_intermediate_size": width
                }),
                "config.json",
            )
            .unwrap()
        };
        let shared = read(24);
        assert_eq!(
            (
                shared.n_shared_experts,
                shared.shared_d_ff,
                shared.shared_expert_gate
            ),
            (1, Some(24), false)
        );
        let none = read(0);
        assert_eq!((none.n_shared_experts, none.shared_d_ff), (0, None));
        assert!(none.router.norm_topk_prob);
    }

    /// Hunyuan gives top-k (and widths) once per layer: one repeated value reads as
    /// that value; different values are refused by name.
    #[test]
    fn per_layer_sizes_must_repeat_one_value() {
        let read = |top_k: serde_json::Value| {
            moe_config(
                &serde_json::json!({
                    "model_type": "hunyuan_v1_moe", "hidden_size": 16,
                    "intermediate_size": 8, "moe_intermediate_size": [99, 99],
                    "num_experts": 4, "moe_topk": top_k
                }),
                "config.json",
            )
        };
        let config = read(serde_json::json!([2, 2])).unwrap();
        assert_eq!((config.router.top_k, config.d_ff), (2, 8));
        assert_eq!(config.n_shared_experts, 1);
        let error = read(serde_json::json!([2, 3])).unwrap_err();
        assert!(
            matches!(&error, HfError::Field { field, .. } if field == "moe_topk")
                && error.to_string().contains("differs across layers"),
            "{error}"
        );
    }
}
