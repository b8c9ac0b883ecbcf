//! Generation with the KV cache: prefill tokens/s (the whole prompt in one cached
//! forward) and decode tokens/s (one new token over the prefilled cache) of a
//! [`CausalLm`] at context 128 and 2048, with three attention caches of the same model
//! width and head count: multi-head (MHA), grouped (GQA, 4 query heads per key/value
//! head) and multi-head latent attention (MLA, DeepSeek's compressed latent cache
//! decoded with absorbed projections). Also the cache's bytes per token.

use burn::tensor::{Int, Tensor, TensorData};
use burn_transformer::attention::LatentAttentionConfig;
use burn_transformer::model::{CausalLm, CausalLmConfig};
use burn_transformer::position::RopeConfig;
use serde::{Deserialize, Serialize};

use super::{Job, Mode, device_named};
use crate::measure::{Runs, finish, time_runs};
use crate::record::Record;

/// Width, layers, query heads, head width and vocabulary of the suite's model.
const D_MODEL: usize = 256;
const LAYERS: usize = 4;
const HEADS: usize = 8;
const HEAD_DIM: usize = 32;
const VOCAB: usize = 512;
/// MLA: latent rank and the shared rotary key width (DeepSeek's ratios: rank 4×
/// the nope head width, rope half of it).
const KV_LORA_RANK: usize = 128;
const ROPE_DIM: usize = 16;

/// An attention cache kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheKind {
    /// 8 key/value heads.
    Mha,
    /// 2 key/value heads.
    Gqa,
    /// One latent of width 128 plus a 16-wide rotary key per token.
    Mla,
}

impl CacheKind {
    /// Every kind, in report order.
    pub const ALL: [CacheKind; 3] = [CacheKind::Mha, CacheKind::Gqa, CacheKind::Mla];

    /// The name in records.
    pub fn name(self) -> &'static str {
        match self {
            CacheKind::Mha => "mha",
            CacheKind::Gqa => "gqa",
            CacheKind::Mla => "mla",
        }
    }

    fn kv_heads(self) -> usize {
        match self {
            CacheKind::Mha => HEADS,
            CacheKind::Gqa => HEADS / 4,
            CacheKind::Mla => 1,
        }
    }

    fn config(self, context: usize) -> CausalLmConfig {
        let rope = RopeConfig::new(HEAD_DIM).with_max_position_embeddings(context + 64);
        let config = CausalLmConfig::new(VOCAB, D_MODEL, LAYERS, HEADS, 4 * D_MODEL, rope)
            .with_head_dim(Some(HEAD_DIM))
            .with_norm_eps(1e-5);
        match self {
            CacheKind::Mha | CacheKind::Gqa => config.with_n_kv_heads(Some(self.kv_heads())),
            CacheKind::Mla => config.with_latent(Some(
                LatentAttentionConfig::new(
                    D_MODEL,
                    HEADS,
                    KV_LORA_RANK,
                    HEAD_DIM,
                    ROPE_DIM,
                    HEAD_DIM,
                )
                .with_rope(Some(
                    RopeConfig::new(ROPE_DIM).with_max_position_embeddings(context + 64),
                )),
            )),
        }
    }
}

/// One cache kind at one context length on one backend.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Case {
    /// The cache kind.
    pub kind: CacheKind,
    /// The backend name.
    pub backend: String,
    /// Prompt length before decoding.
    pub context: usize,
    /// Warm-up and timed runs.
    pub runs: Runs,
}

/// The cases of `mode` on `backend`: every kind at context 128 and 2048.
pub fn jobs(mode: Mode, backend: &str) -> Vec<Job> {
    let runs = mode.model_runs();
    let mut jobs = Vec::new();
    for context in [128, 2048] {
        for kind in CacheKind::ALL {
            jobs.push(Job::Generation(Case {
                kind,
                backend: backend.to_string(),
                context,
                runs,
            }));
        }
    }
    jobs
}

impl Case {
    /// A progress line.
    pub fn describe(&self) -> String {
        format!(
            "generation {} {} context {}",
            self.kind.name(),
            self.backend,
            self.context
        )
    }

    /// The prefill and decode records with no numbers yet.
    pub fn records(&self) -> Vec<Record> {
        ["prefill", "decode"]
            .into_iter()
            .map(|bench| Record {
                batch: 1,
                heads: HEADS,
                kv_heads: self.kind.kv_heads(),
                seq: self.context,
                head_dim: HEAD_DIM,
                causal: true,
                d_model: Some(D_MODEL),
                ..Record::new(bench, self.kind.name(), &self.backend)
            })
            .collect()
    }

    /// Times the prefill of `context` tokens into an empty cache, then single-token
    /// decoding steps, each on a fresh copy of one prefilled cache (so every step
    /// sees the same context).
    ///
    /// # Errors
    /// Why the case could not be measured.
    pub fn run(&self) -> Result<Vec<Record>, String> {
        let device = device_named(&self.backend)?;
        let model: CausalLm = self
            .kind
            .config(self.context)
            .try_init(&device)
            .map_err(|error| error.to_string())?;
        let params = burn::module::Module::num_params(&model);
        let tokens = |count: usize, offset: usize| {
            let ids: Vec<i64> = (0..count)
                .map(|i| ((i + offset) * 7919 % VOCAB) as i64)
                .collect();
            Tensor::<2, Int>::from_data(TensorData::new(ids, [1, count]), &device)
        };

        let prefill = time_runs(
            &device,
            self.runs,
            || Ok((tokens(self.context, 0), model.new_cache())),
            |(prompt, mut cache)| {
                finish(model.forward_cached(prompt, &mut cache, None))?;
                Ok(())
            },
        )?;

        let mut prefilled = model.new_cache();
        finish(model.forward_cached(tokens(self.context, 0), &mut prefilled, None))?;
        let bytes_per_token = prefilled.bytes() / self.context.max(1);
        let mut step = 0;
        let decode = time_runs(
            &device,
            self.runs,
            || {
                step += 1;
                Ok((tokens(1, step), prefilled.clone()))
            },
            |(token, mut cache)| {
                finish(model.forward_cached(token, &mut cache, None))?;
                Ok(())
            },
        )?;

        let mut records = self.records();
        for (record, (timing, tokens)) in records
            .iter_mut()
            .zip([(&prefill, self.context), (&decode, 1)])
        {
            *record = record.clone().with_timing(timing);
            record.tokens_per_s = Some(tokens as f64 / (timing.median_ms / 1e3));
            record.bytes_per_token = Some(bytes_per_token as u64);
            record.params = Some(params);
        }
        Ok(records)
    }
}
