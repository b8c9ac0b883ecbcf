//! Mixed-precision training: the parameters and the optimizer state stay in f32 (the
//! master weights); each step casts the parameters to bf16 or f16 inside the autodiff
//! graph, so the forward and backward passes (the fused attention included) run in
//! the low precision, and the gradients flow back through the casts to the f32
//! parameters, where the optimizer updates them. The loss is computed from f32
//! logits.
//!
//! f16 has 5 exponent bits: small gradients underflow to zero. Its steps scale the loss
//! by a dynamic factor (PyTorch's `GradScaler` rule): the gradients are divided by it
//! again before clipping; a step whose gradients are not finite is skipped and the
//! factor halved; after `GROWTH_INTERVAL` good steps in a row it is doubled. bf16 has
//! f32's exponent range and needs no scaling.

use std::sync::{Arc, Mutex};

use burn::module::{Module, ModuleMapper, Param};
use burn::tensor::{DType, Tensor};
use serde::{Deserialize, Serialize};

/// The floating-point type of the forward and backward passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    /// Everything in f32.
    #[default]
    F32,
    /// bf16 passes, f32 master weights.
    Bf16,
    /// f16 passes with dynamic loss scaling, f32 master weights.
    F16,
}

impl Precision {
    /// Parses `f32`, `bf16` or `f16`.
    pub fn parse(name: &str) -> Option<Self> {
        match name.trim().to_ascii_lowercase().as_str() {
            "f32" | "fp32" => Some(Self::F32),
            "bf16" => Some(Self::Bf16),
            "f16" | "fp16" => Some(Self::F16),
            _ => None,
        }
    }

    /// The name `parse` reads.
    pub fn name(self) -> &'static str {
        match self {
            Self::F32 => "f32",
            Self::Bf16 => "bf16",
            Self::F16 => "f16",
        }
    }

    /// The type of the passes, `None` for f32.
    pub(crate) fn low(self) -> Option<DType> {
        match self {
            Self::F32 => None,
            Self::Bf16 => Some(DType::BF16),
            Self::F16 => Some(DType::F16),
        }
    }
}

/// `module` with every float parameter cast to `dtype` inside the autodiff graph (the
/// parameter ids are kept, so gradients reach the f32 originals through the casts).
pub(crate) fn cast_parameters<M: Module>(module: M, dtype: DType) -> M {
    struct Cast(DType);
    impl ModuleMapper for Cast {
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            let dtype = self.0;
            param.map(|tensor| tensor.cast(dtype))
        }
    }
    module.map(&mut Cast(dtype))
}

/// Good steps in a row after which the loss scale doubles.
pub(crate) const GROWTH_INTERVAL: usize = 2000;
/// The first loss scale, 2¹⁶ (PyTorch's).
pub(crate) const INITIAL_SCALE: f64 = 65_536.0;

#[derive(Debug)]
struct ScaleState {
    scale: f64,
    good_steps: usize,
}

/// The dynamic loss scale of f16 training, shared by the copies of a task.
#[derive(Debug, Clone)]
pub(crate) struct LossScaler {
    state: Arc<Mutex<ScaleState>>,
}

impl LossScaler {
    pub(crate) fn new() -> Self {
        Self {
            state: Arc::new(Mutex::new(ScaleState {
                scale: INITIAL_SCALE,
                good_steps: 0,
            })),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ScaleState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The factor the loss is multiplied by.
    pub(crate) fn scale(&self) -> f64 {
        self.lock().scale
    }

    /// Records a step's outcome: a step with non-finite gradients halves the scale; a
    /// run of `GROWTH_INTERVAL` good ones doubles it.
    pub(crate) fn update(&self, finite: bool) {
        let mut state = self.lock();
        if finite {
            state.good_steps += 1;
            if state.good_steps >= GROWTH_INTERVAL {
                state.scale *= 2.0;
                state.good_steps = 0;
            }
        } else {
            state.scale = (state.scale / 2.0).max(1.0);
            state.good_steps = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scale_halves_on_overflow_and_doubles_after_good_steps() {
        let scaler = LossScaler::new();
        assert_eq!(scaler.scale(), INITIAL_SCALE);
        scaler.update(false);
        assert_eq!(scaler.scale(), INITIAL_SCALE / 2.0);
        for _ in 0..GROWTH_INTERVAL - 1 {
            scaler.update(true);
        }
        assert_eq!(scaler.scale(), INITIAL_SCALE / 2.0);
        scaler.update(true);
        assert_eq!(scaler.scale(), INITIAL_SCALE);
        assert_eq!(Precision::parse("BF16"), Some(Precision::Bf16));
        assert_eq!(Precision::parse("f8"), None);
    }
}
