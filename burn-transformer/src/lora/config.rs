//! What a LoRA fine-tuning adapts: rank, scale, dropout and the linear layers, named as
//! in Hugging Face checkpoints (PEFT's `target_modules`).

use burn::config::Config;

use crate::error::ConfigError;

/// The linear layers an adapter can target, by the name of the layer in the model (the
/// Hugging Face name where a checkpoint exists).
pub const LORA_TARGETS: [&str; 20] = [
    "q_proj",
    "k_proj",
    "v_proj",
    "o_proj",
    "gate_proj",
    "up_proj",
    "down_proj",
    "q_a_proj",
    "q_b_proj",
    "kv_a_proj_with_mqa",
    "kv_b_proj",
    "in_proj_qkv",
    "in_proj_z",
    "in_proj_b",
    "in_proj_a",
    "out_proj",
    "fc1",
    "fc2",
    "eh_proj",
    "lm_head",
];

/// The default targets (PEFT's `all-linear`): every projection of attention (grouped,
/// latent and linear: the Gated DeltaNet's `in_proj_*` and `out_proj`) and of the dense
/// feed-forwards, including MoE shared experts. Routed experts are stacked 3-D tensors,
/// not linear layers, and are never adapted (as PEFT with transformers 5).
pub fn default_lora_targets() -> Vec<String> {
    LORA_TARGETS[..18]
        .iter()
        .map(|name| name.to_string())
        .collect()
}

/// Configuration of low-rank adapters (Hu et al., 2021, "LoRA"): each targeted weight
/// `W` `[d_in, d_out]` becomes `W + scale · A·B` with trainable `A` `[d_in, rank]` and
/// `B` `[rank, d_out]`; everything else is frozen.
#[derive(Config, Debug, PartialEq)]
pub struct LoraConfig {
    /// Rank `r` of the adapters.
    pub rank: usize,
    /// `alpha`: the update is scaled by `alpha / rank` (`alpha / sqrt(rank)` with
    /// `rslora`). PEFT's `lora_alpha`.
    pub alpha: f64,
    /// Dropout on the adapter's input features during training: each step drops rows of
    /// `A` with this probability (one mask per layer and step, scaled by `1/(1-p)`).
    /// PEFT's `lora_dropout`. Default: 0.
    #[config(default = 0.0)]
    pub dropout: f64,
    /// The linear layers to adapt, by name (see [`LORA_TARGETS`]). Default:
    /// [`default_lora_targets`].
    #[config(default = "default_lora_targets()")]
    pub targets: Vec<String>,
    /// Rank-stabilized scaling `alpha / sqrt(rank)` (Kalajdzievski, 2023; PEFT's
    /// `use_rslora`). Default: false.
    #[config(default = false)]
    pub rslora: bool,
}

impl LoraConfig {
    /// The factor of `A·B`: `alpha / rank`, or `alpha / sqrt(rank)` with `rslora`.
    pub fn scale(&self) -> f64 {
        match self.rslora {
            true => self.alpha / (self.rank as f64).sqrt(),
            false => self.alpha / self.rank as f64,
        }
    }

    /// Whether the linear layer named `name` is adapted.
    pub fn targets(&self, name: &str) -> bool {
        self.targets.iter().any(|target| target == name)
    }

    /// Checks the configuration.
    ///
    /// # Errors
    /// A [`ConfigError`] naming the field: a zero rank, an alpha that is not a positive
    /// number, a dropout outside `[0, 1)`, no targets, or a target that names no linear
    /// layer of our models (the message lists the names).
    pub fn validate(&self) -> Result<(), ConfigError> {
        const MODULE: &str = "LoraConfig";
        ConfigError::check_positive(MODULE, "rank", self.rank)?;
        ConfigError::check_positive_real(MODULE, "alpha", self.alpha)?;
        ConfigError::check_probability(MODULE, "dropout", self.dropout)?;
        if self.targets.is_empty() {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "targets",
                reason: format!(
                    "name at least one linear layer ({})",
                    LORA_TARGETS.join(", ")
                ),
            });
        }
        if let Some(unknown) = self
            .targets
            .iter()
            .find(|t| !LORA_TARGETS.contains(&t.as_str()))
        {
            return Err(ConfigError::Invalid {
                module: MODULE,
                field: "targets",
                reason: format!(
                    "`{unknown}` is not a linear layer of these models (they are: {})",
                    LORA_TARGETS.join(", ")
                ),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_is_alpha_over_rank_or_its_square_root() {
        let config = LoraConfig::new(4, 8.0);
        assert_eq!(config.scale(), 2.0);
        assert_eq!(config.with_rslora(true).scale(), 4.0);
    }

    #[test]
    fn bad_settings_name_the_field() {
        let field = |config: LoraConfig| match config.validate() {
            Err(ConfigError::Invalid { field, .. })
            | Err(ConfigError::Zero { field, .. })
            | Err(ConfigError::Probability { field, .. }) => field,
            other => panic!("expected an error, got {other:?}"),
        };
        assert_eq!(field(LoraConfig::new(0, 8.0)), "rank");
        assert_eq!(field(LoraConfig::new(4, 0.0)), "alpha");
        assert_eq!(field(LoraConfig::new(4, 8.0).with_dropout(1.0)), "dropout");
        assert_eq!(
            field(LoraConfig::new(4, 8.0).with_targets(vec![])),
            "targets"
        );
        let typo = LoraConfig::new(4, 8.0).with_targets(vec!["qproj".into()]);
        assert!(typo.validate().unwrap_err().to_string().contains("`qproj`"));
        assert!(LoraConfig::new(4, 8.0).validate().is_ok());
    }
}
