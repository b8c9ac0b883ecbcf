//! Low-rank adapters attached to the weights of a built model through Burn's parameter
//! reparameterization: a targeted linear weight's value becomes `W + scale · A·B`, so
//! every module keeps its code and the adapters follow the model through autodiff,
//! records (`….weight.lora.a`, `….weight.lora.b`), devices and
//! [`Module::materialize`] (which merges them into `W`).

use burn::module::{Module, ModuleMapper, Param, Reparameterization, Reparameterizer};
use burn::tensor::{Distribution, Tensor};

use super::config::LoraConfig;
use crate::error::ConfigError;
use crate::module_path::ParamPath;

/// The adapter of one weight `[d_in, d_out]`: its value is `W + scale · A·B`.
#[derive(Module, Debug)]
pub struct LowRankAdapter {
    /// `A`: `[d_in, rank]`, PEFT's `lora_A.weight` transposed. Initialized as PEFT
    /// does: uniform in `±1/sqrt(d_in)` (Kaiming-uniform with `a = sqrt(5)`).
    pub a: Param<Tensor<2>>,
    /// `B`: `[rank, d_out]`, PEFT's `lora_B.weight` transposed. Initialized to zero, so
    /// a new adapter leaves the model's outputs unchanged.
    pub b: Param<Tensor<2>>,
    /// The factor of `A·B` ([`LoraConfig::scale`]).
    pub scale: f64,
    /// Dropout probability on the rows of `A` while training ([`LoraConfig::dropout`]).
    pub dropout: f64,
}

impl Reparameterization for LowRankAdapter {
    const NAME: &'static str = "lora";

    fn apply<const D: usize>(&self, base: Tensor<D>) -> Tensor<D> {
        let delta = self.delta().reshape(base.shape());
        let delta = match delta.dtype() == base.dtype() {
            true => delta,
            false => delta.cast(base.dtype()),
        };
        base + delta
    }
}

impl LowRankAdapter {
    /// `scale · A·B`, `[d_in, d_out]`. While training (the factors track gradients)
    /// with a dropout, each input feature's row of `A` is dropped with probability
    /// `dropout` and the kept ones scaled by `1/(1-dropout)`.
    pub fn delta(&self) -> Tensor<2> {
        let a = self.a.val();
        let a = if self.dropout > 0.0 && a.is_require_grad() {
            let [d_in, _] = a.dims();
            let keep = Tensor::<2>::random(
                [d_in, 1],
                Distribution::Bernoulli(1.0 - self.dropout),
                &a.device(),
            )
            .cast(a.dtype());
            a * keep.div_scalar(1.0 - self.dropout)
        } else {
            a
        };
        a.matmul(self.b.val()).mul_scalar(self.scale)
    }
}

/// What [`attach_lora`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraSummary {
    /// The adapted weights, by parameter path (`model.layers.0.self_attn.q_proj.weight`;
    /// enum variants are not part of paths).
    pub adapted: Vec<String>,
    /// Trainable parameters after attaching (the adapters' elements).
    pub trainable: usize,
    /// Every parameter of the model, adapters included.
    pub total: usize,
}

/// Attaches adapters of `config` to every 2-D weight of a linear layer that `config`
/// targets by name, and freezes every other parameter, so that only the adapters
/// train. Adapter `A`s are drawn from the device's generator (seed it for
/// reproducible runs).
///
/// # Errors
/// The [`ConfigError`] of [`LoraConfig::validate`], or one saying that no linear layer
/// of the model has a targeted name (with the names it has).
pub fn attach_lora<M: Module>(
    module: M,
    config: &LoraConfig,
) -> Result<(M, LoraSummary), ConfigError> {
    config.validate()?;
    let mut layers = LinearLayers::default();
    module.visit(&mut layers);
    let adapted: Vec<String> = layers
        .weights
        .iter()
        .filter(|(_, name)| config.targets(name))
        .map(|(path, _)| path.clone())
        .collect();
    if adapted.is_empty() {
        let mut names: Vec<&str> = layers.weights.iter().map(|(_, n)| n.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        return Err(ConfigError::Invalid {
            module: "LoraConfig",
            field: "targets",
            reason: format!(
                "no linear layer of this model is named {} (its linear layers: {})",
                config.targets.join(" or "),
                names.join(", ")
            ),
        });
    }
    let module = module.apply_reparameterization(Attach {
        config,
        adapted: &adapted,
    });
    // Counted from shapes: whether a parameter trains is only observable on an
    // autodiff device.
    let trainable = layers
        .weights
        .iter()
        .zip(&layers.shapes)
        .filter(|((_, name), _)| config.targets(name))
        .map(|(_, [d_in, d_out])| config.rank * (d_in + d_out))
        .sum();
    Ok((
        module,
        LoraSummary {
            adapted,
            trainable,
            total: layers.total + trainable,
        },
    ))
}

/// The [`Reparameterizer`] of [`attach_lora`]: paths come with enum variants
/// (`self_attn.MultiHead.q_proj.weight`), the adapted list without, so both are
/// compared without them.
struct Attach<'a> {
    config: &'a LoraConfig,
    adapted: &'a [String],
}

impl Reparameterizer for Attach<'_> {
    type Reparam = LowRankAdapter;

    fn reparameterize<const D: usize>(
        &mut self,
        path: &str,
        param: Param<Tensor<D>>,
    ) -> (Param<Tensor<D>>, Option<LowRankAdapter>) {
        let param = param.set_require_grad(false);
        let targeted = D == 2 && self.adapted.iter().any(|p| same_path(p, path));
        if !targeted {
            return (param, None);
        }
        let base = param.base();
        let [d_in, d_out] = [base.dims()[0], base.dims()[1]];
        let device = base.device();
        let bound = 1.0 / (d_in as f64).sqrt();
        let rank = self.config.rank;
        let a = Tensor::<2>::random([d_in, rank], Distribution::Uniform(-bound, bound), &device)
            .cast(base.dtype());
        let b = Tensor::<2>::zeros([rank, d_out], (&device, base.dtype()));
        let adapter = LowRankAdapter {
            a: Param::from_tensor(a),
            b: Param::from_tensor(b),
            scale: self.config.scale(),
            dropout: self.config.dropout,
        };
        (param, Some(adapter))
    }
}

/// Whether `ours` (no enum variants) names the same parameter as `burns` (with them).
fn same_path(ours: &str, burns: &str) -> bool {
    let mut wanted = ours.split('.');
    let mut next = wanted.next();
    for segment in burns.split('.') {
        match next {
            Some(want) if want == segment => next = wanted.next(),
            // An enum variant (a capitalized segment) is skipped.
            _ if segment.starts_with(|c: char| c.is_ascii_uppercase()) => {}
            _ => return false,
        }
    }
    next.is_none()
}

/// Lists the weights of linear layers (`Linear`): path (without enum variants) and
/// the layer's name.
#[derive(Default)]
struct LinearLayers {
    path: ParamPath,
    weights: Vec<(String, String)>,
    /// `[d_in, d_out]` of each weight.
    shapes: Vec<[usize; 2]>,
    /// Elements of every parameter.
    total: usize,
}

impl burn::module::ModuleVisitor for LinearLayers {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.path.enter(name, container_type);
    }

    fn exit_module(&mut self, _name: &str, container_type: &str) {
        self.path.exit(container_type);
    }

    fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
        let shape = param.lazy_shape();
        self.total += shape.num_elements();
        if D == 2
            && self.path.is_linear_weight()
            && let Some(name) = self.path.layer_name()
        {
            self.weights.push((self.path.joined(), name.to_string()));
            self.shapes.push([shape[0], shape[1]]);
        }
    }
}

/// Freezes the parameters whose name matches one of `patterns` (globs: `*` is any run
/// of characters, e.g. `model.layers.0.*` or `*.embed_tokens.weight`). A parameter's
/// name is `name_of(path)` of its path (enum variants left out), so callers can match
/// checkpoint keys. Returns the names frozen and their elements.
///
/// # Errors
/// A message naming the first pattern that matches no parameter, with a few names
/// the model has.
pub fn freeze_matching<M: Module>(
    module: M,
    patterns: &[String],
    name_of: impl Fn(&str) -> String,
) -> Result<(M, Vec<String>, usize), String> {
    let mut mapper = Freeze {
        patterns,
        name_of: &name_of,
        path: ParamPath::default(),
        matched: vec![false; patterns.len()],
        frozen: Vec::new(),
        frozen_elements: 0,
        names: Vec::new(),
    };
    let module = module.map(&mut mapper);
    if let Some(index) = mapper.matched.iter().position(|m| !m) {
        let examples: Vec<&str> = mapper.names.iter().take(4).map(String::as_str).collect();
        return Err(format!(
            "--freeze pattern `{}` matches no parameter (names look like: {}, …)",
            patterns[index],
            examples.join(", ")
        ));
    }
    Ok((module, mapper.frozen, mapper.frozen_elements))
}

struct Freeze<'a, F> {
    patterns: &'a [String],
    name_of: &'a F,
    path: ParamPath,
    matched: Vec<bool>,
    frozen: Vec<String>,
    frozen_elements: usize,
    names: Vec<String>,
}

impl<F: Fn(&str) -> String> ModuleMapper for Freeze<'_, F> {
    fn enter_module(&mut self, name: &str, container_type: &str) {
        self.path.enter(name, container_type);
    }

    fn exit_module(&mut self, _name: &str, container_type: &str) {
        self.path.exit(container_type);
    }

    fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
        let name = (self.name_of)(&self.path.joined());
        let mut hit = false;
        for (pattern, matched) in self.patterns.iter().zip(self.matched.iter_mut()) {
            if glob_matches(pattern, &name) {
                *matched = true;
                hit = true;
            }
        }
        self.names.push(name.clone());
        if hit {
            self.frozen.push(name);
            self.frozen_elements += param.lazy_shape().num_elements();
            param.set_require_grad(false)
        } else {
            param
        }
    }
}

/// Whether `text` matches `pattern`, where `*` matches any run of characters.
fn glob_matches(pattern: &str, text: &str) -> bool {
    let parts: Vec<&str> = pattern.split('*').collect();
    if parts.len() == 1 {
        return pattern == text;
    }
    let (first, last) = (parts[0], parts[parts.len() - 1]);
    if !text.starts_with(first) || text.len() < first.len() + last.len() || !text.ends_with(last) {
        return false;
    }
    let mut rest = &text[first.len()..text.len() - last.len()];
    for part in &parts[1..parts.len() - 1] {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    true
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::block::BlockKind;
    use crate::model::causal_lm_tests::{small, small_latent_moe};
    use crate::test_utils::{max_abs_diff, model_test_devices, tokens};
    use burn::module::ModuleVisitor;
    use burn::tensor::{Device, Int};

    fn prompt(device: &Device) -> Tensor<2, Int> {
        tokens(&[&[1, 5, 9, 13, 17, 21], &[2, 4, 6, 8, 10, 12]], device)
    }

    /// Every float parameter by path, as Burn's traversal names it (adapters under
    /// `….weight.lora.a` and `.b`).
    #[derive(Default)]
    struct Parameters {
        path: ParamPath,
        values: BTreeMap<String, Tensor<2>>,
    }

    impl ModuleVisitor for Parameters {
        fn enter_module(&mut self, name: &str, container_type: &str) {
            self.path.enter(name, container_type);
        }
        fn exit_module(&mut self, _name: &str, container_type: &str) {
            self.path.exit(container_type);
        }
        fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
            let value = param.val();
            let columns = value.dims().last().copied().unwrap_or(1);
            self.values
                .insert(self.path.joined(), value.reshape([-1, columns as i32]));
        }
    }

    fn parameters<M: Module>(module: &M) -> BTreeMap<String, Tensor<2>> {
        let mut collect = Parameters::default();
        module.visit(&mut collect);
        collect.values
    }

    /// Draws every adapter factor (both `A` and `B`) anew, so adapters change outputs.
    struct RandomFactors {
        inside_adapter: usize,
    }

    impl ModuleMapper for RandomFactors {
        fn enter_module(&mut self, name: &str, _container_type: &str) {
            if name == "lora" {
                self.inside_adapter += 1;
            }
        }
        fn exit_module(&mut self, name: &str, _container_type: &str) {
            if name == "lora" {
                self.inside_adapter -= 1;
            }
        }
        fn map_float<const D: usize>(&mut self, param: Param<Tensor<D>>) -> Param<Tensor<D>> {
            if self.inside_adapter == 0 {
                return param;
            }
            param.map(|value| {
                let random = Tensor::random(
                    value.shape(),
                    Distribution::Normal(0.0, 0.5),
                    &value.device(),
                );
                random.set_require_grad(value.is_require_grad())
            })
        }
    }

    #[test]
    fn new_adapters_leave_outputs_unchanged_and_merge_into_base_plus_scaled_product() {
        for device in model_test_devices() {
            for (config, adapted_layers) in
                [(small(BlockKind::PreNorm), 14), (small_latent_moe(), 16)]
            {
                let model = config.init(&device);
                let before = model.forward(prompt(&device), None);
                let lora = LoraConfig::new(2, 6.0);
                let (adapted, summary) = attach_lora(model.clone(), &lora).unwrap();
                assert_eq!(
                    summary.adapted.len(),
                    adapted_layers,
                    "{:?}",
                    summary.adapted
                );
                assert!(
                    summary
                        .adapted
                        .contains(&"model.layers.0.self_attn.o_proj.weight".into())
                );
                let after = adapted.forward(prompt(&device), None);
                // B = 0: only rounding (the product runs on another buffer).
                assert!(max_abs_diff(before, after.clone()) < 1e-5);

                let adapted = adapted.map(&mut RandomFactors { inside_adapter: 0 });
                let with_adapters = adapted.forward(prompt(&device), None);
                assert!(max_abs_diff(after, with_adapters.clone()) > 1e-3);
                let merged = adapted.clone().materialize();
                let factors = parameters(&adapted);
                let merged_weights = parameters(&merged);
                assert_eq!(
                    merged_weights.len(),
                    parameters(&model).len(),
                    "no adapters left"
                );
                for path in &summary.adapted {
                    let (a, b) = (
                        &factors[&format!("{path}.lora.a")],
                        &factors[&format!("{path}.lora.b")],
                    );
                    let expected =
                        factors[path].clone() + a.clone().matmul(b.clone()) * lora.scale();
                    let error = max_abs_diff(merged_weights[path].clone(), expected);
                    assert!(error < 1e-5, "{path}: {error}");
                }
                let merged_output = merged.forward(prompt(&device), None);
                assert!(max_abs_diff(with_adapters, merged_output) < 1e-4);
            }
        }
    }

    // It puts the model on a training device through `crate::train` (the `train` feature).
    #[cfg(feature = "train")]
    #[test]
    fn only_adapter_factors_receive_gradients() {
        for device in model_test_devices() {
            let model = small_latent_moe().init(&device);
            let (model, summary) = attach_lora(model, &LoraConfig::new(2, 4.0)).unwrap();
            let model = crate::train::to_training_device(model, &device);
            let loss = model.forward(prompt(&device), None).square().mean();
            let grads = loss.backward();

            struct Check<'a> {
                grads: &'a burn::tensor::Gradients,
                path: Vec<String>,
                with_gradient: Vec<String>,
                without: usize,
            }
            impl ModuleVisitor for Check<'_> {
                fn enter_module(&mut self, name: &str, _: &str) {
                    self.path.push(name.to_string());
                }
                fn exit_module(&mut self, _: &str, _: &str) {
                    self.path.pop();
                }
                fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                    match param.val().grad(self.grads) {
                        Some(_) => self.with_gradient.push(self.path.join(".")),
                        None => self.without += 1,
                    }
                }
            }
            let mut check = Check {
                grads: &grads,
                path: Vec::new(),
                with_gradient: Vec::new(),
                without: 0,
            };
            model.visit(&mut check);
            assert_eq!(check.with_gradient.len(), 2 * summary.adapted.len());
            assert!(
                check
                    .with_gradient
                    .iter()
                    .all(|p| p.ends_with(".lora.a") || p.ends_with(".lora.b"))
            );
            assert!(check.without > 0);
            let adapter_elements: usize = parameters(&model)
                .iter()
                .filter(|(path, _)| path.contains(".lora."))
                .map(|(_, t)| t.shape().num_elements())
                .sum();
            assert_eq!(summary.trainable, adapter_elements);
            assert!(summary.trainable * 5 < summary.total);
        }
    }

    #[test]
    fn dropout_drops_whole_input_rows_while_training_only() {
        let device = Device::flex().autodiff();
        let adapter = |dropout| LowRankAdapter {
            a: Param::from_tensor(Tensor::random(
                [64, 3],
                Distribution::Normal(0.0, 1.0),
                &device,
            )),
            b: Param::from_tensor(Tensor::random(
                [3, 5],
                Distribution::Normal(0.0, 1.0),
                &device,
            )),
            scale: 2.0,
            dropout,
        };
        let plain = adapter(0.0);
        let dropped = LowRankAdapter {
            dropout: 0.5,
            ..plain.clone()
        };
        let full: Vec<f32> = plain.delta().into_data().try_to_vec::<f32>().unwrap();
        let masked: Vec<f32> = dropped.delta().into_data().try_to_vec::<f32>().unwrap();
        let (mut kept, mut zeroed) = (0, 0);
        for (row, masked) in full.chunks(5).zip(masked.chunks(5)) {
            if masked.iter().all(|v| *v == 0.0) {
                zeroed += 1;
            } else {
                kept += 1;
                for (f, m) in row.iter().zip(masked) {
                    assert!((2.0 * f - m).abs() < 1e-4 * (1.0 + f.abs()));
                }
            }
        }
        assert!(kept > 10 && zeroed > 10, "{kept} kept, {zeroed} dropped");
        let inference = dropped.valid();
        let same: Vec<f32> = inference.delta().into_data().try_to_vec::<f32>().unwrap();
        assert_eq!(same, full, "no dropout outside training");
    }

    // It puts the model on a training device through `crate::train` (the `train` feature).
    #[cfg(feature = "train")]
    #[test]
    fn freeze_matching_freezes_by_glob_and_names_a_pattern_that_matches_nothing() {
        let device = Device::flex();
        let model = small(BlockKind::PreNorm).init(&device);
        let patterns = vec![
            "model.layers.0.*".to_string(),
            "embed_tokens.weight".to_string(),
        ];
        let (frozen, names, elements) = freeze_matching(model, &patterns, str::to_string).unwrap();
        assert!(names.contains(&"embed_tokens.weight".to_string()));
        assert!(
            names
                .iter()
                .skip(1)
                .all(|n| n.starts_with("model.layers.0.")),
            "{names:?}"
        );
        let sizes = parameters(&frozen);
        assert_eq!(
            elements,
            names
                .iter()
                .map(|n| sizes[n].shape().num_elements())
                .sum::<usize>()
        );
        // On an autodiff device the frozen parameters get no gradient, the others do.
        let frozen = crate::train::to_training_device(frozen, &device);
        let grads = frozen
            .forward(prompt(&device), None)
            .square()
            .mean()
            .backward();
        struct Check<'a>(&'a burn::tensor::Gradients, ParamPath, Vec<(String, bool)>);
        impl ModuleVisitor for Check<'_> {
            fn enter_module(&mut self, name: &str, container: &str) {
                self.1.enter(name, container);
            }
            fn exit_module(&mut self, _: &str, container: &str) {
                self.1.exit(container);
            }
            fn visit_float<const D: usize>(&mut self, param: &Param<Tensor<D>>) {
                self.2
                    .push((self.1.joined(), param.val().grad(self.0).is_some()));
            }
        }
        let mut check = Check(&grads, ParamPath::default(), Vec::new());
        frozen.visit(&mut check);
        for (path, has_gradient) in check.2 {
            assert_eq!(has_gradient, !names.contains(&path), "{path}");
        }

        let typo = vec!["model.layer.0.*".to_string()];
        let error = freeze_matching(
            small(BlockKind::PreNorm).init(&device),
            &typo,
            str::to_string,
        )
        .unwrap_err();
        assert!(
            error.contains("`model.layer.0.*` matches no parameter"),
            "{error}"
        );
        assert!(glob_matches(
            "*.q_proj.*",
            "model.layers.3.self_attn.q_proj.weight"
        ));
        assert!(!glob_matches(
            "*.q_proj",
            "model.layers.3.self_attn.q_proj.weight"
        ));
        assert!(same_path(
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.MultiHead.q_proj.weight"
        ));
        assert!(!same_path(
            "model.layers.0.self_attn.q_proj.weight",
            "model.layers.0.self_attn.MultiHead.k_proj.weight"
        ));
    }

    #[test]
    fn a_target_no_layer_has_is_named() {
        let model = small(BlockKind::PreNorm).init(&Device::flex());
        let lora = LoraConfig::new(2, 4.0).with_targets(vec!["kv_b_proj".into()]);
        let error = attach_lora(model, &lora).unwrap_err().to_string();
        assert!(
            error.contains("no linear layer of this model is named kv_b_proj"),
            "{error}"
        );
        assert!(error.contains("q_proj"), "{error}");
    }
}
