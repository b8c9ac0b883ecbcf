//! KV caches: bytes per token and decode speed of one attention layer with a full
//! multi-head cache (MHA), a grouped one (GQA, 4 query heads per key/value head) and a
//! single shared head (MQA), at the same width and head count.

use burn::tensor::{Distribution, Tensor};
use burn_transformer::attention::{KvCache, MultiHeadAttentionConfig};
use burn_transformer::position::RopeConfig;
use serde::{Deserialize, Serialize};

use super::{Job, Mode, device_named};
use crate::measure::{Runs, finish, time_runs};
use crate::record::Record;

/// A kind of attention cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheKind {
    /// One key/value head per query head.
    Mha,
    /// One key/value head per 4 query heads.
    Gqa,
    /// One key/value head for all.
    Mqa,
}

impl CacheKind {
    /// Every kind, in report order.
    pub const ALL: [CacheKind; 3] = [CacheKind::Mha, CacheKind::Gqa, CacheKind::Mqa];

    /// The name in records.
    pub fn name(self) -> &'static str {
        match self {
            CacheKind::Mha => "mha",
            CacheKind::Gqa => "gqa",
            CacheKind::Mqa => "mqa",
        }
    }

    fn kv_heads(self, heads: usize) -> usize {
        match self {
            CacheKind::Mha => heads,
            CacheKind::Gqa => (heads / 4).max(1),
            CacheKind::Mqa => 1,
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
    /// Sequences decoded together.
    pub batch: usize,
    /// Positions in the cache when a decoding step runs.
    pub context: usize,
    /// Model width.
    pub d_model: usize,
    /// Query heads.
    pub heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// Warm-up and timed runs.
    pub runs: Runs,
}

/// The cases of `mode` on `backend`: every kind at context 128 and 2048.
pub fn jobs(mode: Mode, backend: &str) -> Vec<Job> {
    let mut jobs = Vec::new();
    for context in [128, 2048] {
        for kind in CacheKind::ALL {
            jobs.push(Job::KvCache(Case {
                kind,
                backend: backend.to_string(),
                batch: 1,
                context,
                d_model: 512,
                heads: 8,
                head_dim: 64,
                runs: match mode {
                    Mode::Quick => Runs::new(2, 10),
                    Mode::Full => Runs::new(5, 30),
                },
            }));
        }
    }
    jobs
}

impl Case {
    /// A progress line.
    pub fn describe(&self) -> String {
        format!(
            "kv_cache {} {} context {}",
            self.kind.name(),
            self.backend,
            self.context
        )
    }

    /// The record of this case with no numbers yet.
    pub fn record(&self) -> Record {
        Record {
            batch: self.batch,
            heads: self.heads,
            kv_heads: self.kind.kv_heads(self.heads),
            seq: self.context,
            head_dim: self.head_dim,
            causal: true,
            d_model: Some(self.d_model),
            ..Record::new("kv_cache", self.kind.name(), &self.backend)
        }
    }

    /// Prefills `context` positions, then times single-token decoding steps, each on
    /// a fresh copy of the prefilled cache (so every step sees the same context).
    ///
    /// # Errors
    /// Why the case could not be measured.
    pub fn run(&self) -> Result<Vec<Record>, String> {
        let device = device_named(&self.backend)?;
        let attention = MultiHeadAttentionConfig::new(self.d_model, self.heads)
            .with_n_kv_heads(Some(self.kind.kv_heads(self.heads)))
            .with_head_dim(Some(self.head_dim))
            .with_causal(true)
            .with_rope(Some(
                RopeConfig::new(self.head_dim).with_max_position_embeddings(self.context + 64),
            ))
            .try_init(&device)
            .map_err(|error| error.to_string())?;
        let mut prefilled = KvCache::new();
        let prompt = Tensor::<3>::random(
            [self.batch, self.context, self.d_model],
            Distribution::Normal(0.0, 1.0),
            &device,
        );
        finish(attention.forward_cached(prompt, &mut prefilled, None))?;
        let bytes_per_token = prefilled.bytes() / (self.batch * prefilled.len()).max(1);

        let timing = time_runs(
            &device,
            self.runs,
            || {
                let token = Tensor::<3>::random(
                    [self.batch, 1, self.d_model],
                    Distribution::Normal(0.0, 1.0),
                    &device,
                );
                Ok((token, prefilled.clone()))
            },
            |(token, mut cache)| {
                finish(attention.forward_cached(token, &mut cache, None))?;
                Ok(())
            },
        )?;
        let mut record = self.record().with_timing(&timing);
        record.tokens_per_s = Some(self.batch as f64 / (timing.median_ms / 1e3));
        record.bytes_per_token = Some(bytes_per_token as u64);
        Ok(vec![record])
    }
}
