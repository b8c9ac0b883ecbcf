//! The fused op's entry on CubeCL runtimes: inputs made dense and outputs allocated
//! dense (see `launch.rs`), the kernel family chosen for the call (by rule, or by
//! timing the candidates: `autotune.rs`), and its launch (`launch.rs`).

use burn::backend::TensorMetadata;
use burn::tensor::{DType, Shape};
use burn_cubecl::kernel::into_contiguous;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;

use super::super::{FlashKernel, Problem, ScoreOptions};
use super::autotune;
use super::launch::{
    BackwardTensors, Family, ForwardTensors, backward_stats, backward_with, forward_with,
};
use super::tiling::{
    LARGEST_STAGED_BLOCK, StagedProduct, auto_forward_row_tiles, fragment_row_tiles,
    has_fragment_mma, is_cpu_runtime, plan_fragments, plan_staged,
};

/// How one call's family is decided.
enum Choice {
    /// By rule (the options' family, with its fallbacks).
    Fixed(Box<Family>),
    /// By timing the candidates once per shape class on the device (`autotune.rs`).
    Tuned,
}

/// Resolves the call's [`FlashKernel`] on the tensors' device: [`choose_on`] with the
/// tensors' element type and device.
fn choose(problem: &Problem, options: &ScoreOptions, tensor: &CubeTensor) -> Choice {
    let properties = tensor.client.properties();
    let choice = choose_on(problem, options.kernel, tensor.dtype, properties);
    #[cfg(test)]
    if let (Some(lanes), Choice::Fixed(family)) = (options.forced_lanes, &choice)
        && let Family::RegisterTile(_) = **family
    {
        let tiling = super::tiling::plan_split_rows(problem, properties, lanes)
            .expect("the register tiles take the problem");
        return Choice::Fixed(Box::new(Family::RegisterTile(tiling)));
    }
    choice
}

/// The family of `kernel` for `problem` in `dtype` on a device with `properties`, with
/// its fallbacks: the fragment kernels need their head dims, tiles that fit, and tensor
/// cores for the dtype on GPUs (else the staged kernels); tensor cores need f16/bf16,
/// head dims multiple of 16 and the device's fragments (else the plain product); the
/// staged tiles need the device's shared memory (else register tiles).
///
/// `Auto` takes the fragment kernels on GPUs whose tensor cores multiply the dtype's
/// m16n8k16 fragments: on an H100, in bf16 at head dim 128, they took 3–70 times less
/// time than every other family, forward and backward (docs/benchmarks.md, `cuda`);
/// their forward is the wide one for launches that fill the GPU several times over
/// ([`auto_forward_row_tiles`]).
/// Other calls on GPUs tune among the staged tiles and the register tiles; CPU runtimes
/// take register tiles, as they serve shared memory at the cost of global memory, so
/// the register tiles' reuse is what pays there (see `register_tiles.rs`).
fn choose_on(
    problem: &Problem,
    kernel: FlashKernel,
    dtype: DType,
    properties: &cubecl::ir::DeviceProperties,
) -> Choice {
    let requested = match kernel {
        FlashKernel::Auto => FlashKernel::from_env().unwrap_or(FlashKernel::Auto),
        chosen => chosen,
    };
    let fragments_first = matches!(
        requested,
        FlashKernel::Fragments
            | FlashKernel::WideFragments
            | FlashKernel::FragmentsAtomicDq
            | FlashKernel::FragmentsTf32
            | FlashKernel::FragmentsOverlapped
    ) || (requested == FlashKernel::Auto
        && has_fragment_mma(properties, dtype));
    if fragments_first {
        let row_tiles = match requested {
            FlashKernel::Fragments | FlashKernel::FragmentsTf32 => fragment_row_tiles(false),
            FlashKernel::WideFragments => fragment_row_tiles(true),
            _ => auto_forward_row_tiles(problem, properties),
        };
        let one_pass = requested == FlashKernel::FragmentsAtomicDq;
        let split_tf32 = requested == FlashKernel::FragmentsTf32;
        let overlap = requested == FlashKernel::FragmentsOverlapped;
        let fragments = plan_fragments(
            problem, dtype, properties, row_tiles, one_pass, split_tf32, overlap,
        );
        let staged = plan_staged(
            problem,
            dtype,
            StagedProduct::Plain,
            LARGEST_STAGED_BLOCK,
            properties,
        );
        if let (Some(fragments), Some(staged)) = (fragments, staged) {
            return Choice::Fixed(Box::new(Family::Fragments(fragments, staged)));
        }
    }
    let product = match requested {
        FlashKernel::RegisterTile => None,
        FlashKernel::Staged
        | FlashKernel::Fragments
        | FlashKernel::WideFragments
        | FlashKernel::FragmentsAtomicDq
        | FlashKernel::FragmentsTf32
        | FlashKernel::FragmentsOverlapped => Some(StagedProduct::Plain),
        FlashKernel::StagedTensorCores => Some(StagedProduct::TensorCores),
        FlashKernel::Auto if is_cpu_runtime(properties) => None,
        FlashKernel::Auto | FlashKernel::Autotune => return Choice::Tuned,
    };
    Choice::Fixed(Box::new(Family::staged_or_register(
        problem,
        dtype,
        product,
        LARGEST_STAGED_BLOCK,
        properties,
    )))
}

/// Runs the forward kernel: `(output, lse)`.
///
/// # Shapes
/// See [`FlashAttentionOps::flash_attention_forward`](super::super::FlashAttentionOps::flash_attention_forward).
pub(crate) fn forward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    key_mask: CubeTensor,
    sinks: CubeTensor,
    options: &ScoreOptions,
) -> (CubeTensor, CubeTensor) {
    #[cfg(test)]
    super::super::op::FORWARD_LAUNCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    // The kernel indexes rows directly, so inputs must be dense row-major.
    let q = into_contiguous(q);
    let k = into_contiguous(k);
    let v = into_contiguous(v);
    let key_mask = into_contiguous(key_mask);
    let sinks = into_contiguous(sinks);
    let problem = Problem::from_shapes(&q.shape(), &k.shape(), &v.shape(), options);
    let client = q.client.clone();
    let dtype = q.dtype;

    // Dense outputs (see the module docs).
    let output = empty_device_contiguous_dtype(
        client.clone(),
        q.device.clone(),
        Shape::new([problem.batch, problem.heads, problem.seq_q, problem.d_v]),
        dtype,
    );
    let lse = empty_device_contiguous_dtype(
        client,
        q.device.clone(),
        Shape::new([problem.batch, problem.heads, problem.seq_q]),
        DType::F32,
    );
    let choice = choose(&problem, options, &q);
    let tensors = ForwardTensors {
        q,
        k,
        v,
        key_mask,
        sinks,
        output: output.clone(),
        lse: lse.clone(),
    };
    match choice {
        Choice::Fixed(family) => forward_with(*family, &problem, options, &tensors),
        Choice::Tuned => autotune::forward(problem, *options, tensors),
    }
    (output, lse)
}

/// Runs the backward kernels: `(dq, dk, dv)`.
///
/// # Shapes
/// See [`FlashAttentionOps::flash_attention_backward`](super::super::FlashAttentionOps::flash_attention_backward).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward(
    q: CubeTensor,
    k: CubeTensor,
    v: CubeTensor,
    output: CubeTensor,
    lse: CubeTensor,
    grad_output: CubeTensor,
    key_mask: CubeTensor,
    options: &ScoreOptions,
) -> (CubeTensor, CubeTensor, CubeTensor) {
    let q = into_contiguous(q);
    let k = into_contiguous(k);
    let v = into_contiguous(v);
    let grad_output = into_contiguous(grad_output);
    let key_mask = into_contiguous(key_mask);
    let problem = Problem::from_shapes(&q.shape(), &k.shape(), &v.shape(), options);
    let choice = choose(&problem, options, &q);
    // Autotuning's candidates share one pre-pass: the staged kernels' (their fallback
    // to register tiles reads the same statistics).
    let vector_size = match &choice {
        Choice::Fixed(family) => family.prepass_vector_size(),
        Choice::Tuned => 1,
    };
    // The pre-pass consumes `O` and the log-sum-exp before the gradients are
    // allocated, so that they can take `O`'s memory.
    let stats = backward_stats(
        &problem,
        into_contiguous(output),
        into_contiguous(lse),
        &grad_output,
        vector_size,
    );
    // Dense buffers, as the kernels index them (see the module docs).
    let empty = |shape: Shape| {
        empty_device_contiguous_dtype(q.client.clone(), q.device.clone(), shape, q.dtype)
    };
    let (grad_q, grad_k, grad_v) = (empty(q.shape()), empty(k.shape()), empty(v.shape()));
    let tensors = BackwardTensors {
        q,
        k,
        v,
        stats,
        grad_output,
        key_mask,
        grad_q: grad_q.clone(),
        grad_k: grad_k.clone(),
        grad_v: grad_v.clone(),
    };
    match choice {
        Choice::Fixed(family) => backward_with(*family, &problem, options, &tensors),
        Choice::Tuned => autotune::backward(problem, *options, tensors),
    }
    (grad_q, grad_k, grad_v)
}

#[cfg(test)]
mod tests {
    use super::super::variants::tests::{gpu, gpu_with_fragments, without_tf32};
    use super::*;
    use crate::ops::mask::MaskRule;

    fn problem(d_qk: usize, d_v: usize) -> Problem {
        Problem {
            batch: 2,
            heads: 4,
            kv_heads: 2,
            seq_q: 300,
            seq_k: 300,
            d_qk,
            d_v,
            mask: MaskRule::new(true, None),
            has_key_mask: false,
            has_alibi: false,
        }
    }

    fn is_fragments(choice: &Choice) -> bool {
        matches!(choice, Choice::Fixed(family) if matches!(**family, Family::Fragments(..)))
    }

    /// `Auto` runs the fragment kernels where the GPU's tensor cores take the inputs'
    /// type and the head dims fit them, and tunes the other families otherwise; CPU
    /// runtimes and explicit families keep their own rules.
    #[test]
    fn auto_takes_the_fragment_kernels_on_tensor_core_gpus() {
        if FlashKernel::from_env().is_some() {
            return; // BURN_TRANSFORMER_FLASH_KERNEL replaces `Auto`'s choice
        }
        let tensor_cores = gpu_with_fragments();
        for dtype in [DType::BF16, DType::F16] {
            for (d_qk, d_v) in [(64, 64), (128, 128), (192, 128)] {
                let choice =
                    choose_on(&problem(d_qk, d_v), FlashKernel::Auto, dtype, &tensor_cores);
                assert!(is_fragments(&choice), "{dtype:?} {d_qk}x{d_v}");
            }
            // MLA's absorbed 576/512 holds more than a lane's registers: tuned.
            let choice = choose_on(&problem(576, 512), FlashKernel::Auto, dtype, &tensor_cores);
            assert!(matches!(choice, Choice::Tuned));
        }
        // f32 has no half fragments, and a GPU without the instruction none at all.
        let f32 = choose_on(
            &problem(128, 128),
            FlashKernel::Auto,
            DType::F32,
            &tensor_cores,
        );
        assert!(matches!(f32, Choice::Tuned));
        let plain = choose_on(&problem(128, 128), FlashKernel::Auto, DType::BF16, &gpu());
        assert!(matches!(plain, Choice::Tuned));
        // An explicit family is kept.
        let staged = choose_on(
            &problem(128, 128),
            FlashKernel::Staged,
            DType::BF16,
            &tensor_cores,
        );
        assert!(matches!(staged, Choice::Fixed(family) if matches!(*family, Family::Staged(_))));
    }

    /// `FragmentsTf32` runs the split TF32 products for f32 on GPUs with TF32 fragments
    /// and their emulation on CPU runtimes, the 16-bit products for f16/bf16, and the
    /// staged kernels on GPUs without the instruction; nothing else takes them.
    #[test]
    fn tf32_fragments_run_only_when_asked() {
        use super::super::fragment::FragmentOps;
        let ops = |choice: Choice| match choice {
            Choice::Fixed(family) => match *family {
                Family::Fragments(tiling, _) => Some(tiling.forward.ops),
                _ => None,
            },
            Choice::Tuned => None,
        };
        let tensor_cores = gpu_with_fragments();
        let asked = |dtype, properties| {
            ops(choose_on(
                &problem(128, 128),
                FlashKernel::FragmentsTf32,
                dtype,
                properties,
            ))
        };
        assert_eq!(
            asked(DType::F32, &tensor_cores),
            Some(FragmentOps::SplitTf32)
        );
        assert_eq!(
            asked(DType::BF16, &tensor_cores),
            Some(FragmentOps::TensorCores)
        );
        let mut cpu = tensor_cores.clone();
        cpu.hardware.num_cpu_cores = Some(2);
        assert!(is_cpu_runtime(&cpu));
        cpu.features.matmul.mma.clear();
        assert_eq!(
            asked(DType::F32, &cpu),
            Some(FragmentOps::EmulatedSplitTf32)
        );
        let without = without_tf32(tensor_cores.clone());
        assert_eq!(asked(DType::F32, &without), None);
        // Neither the explicit fragment family nor `Auto` splits f32.
        assert_eq!(
            ops(choose_on(
                &problem(128, 128),
                FlashKernel::Fragments,
                DType::F32,
                &tensor_cores
            )),
            None
        );
        if FlashKernel::from_env().is_none() {
            let auto = choose_on(
                &problem(128, 128),
                FlashKernel::Auto,
                DType::F32,
                &tensor_cores,
            );
            assert!(matches!(auto, Choice::Tuned));
        }
    }

    /// `FragmentsOverlapped` overlaps the tile copies of the forward, dQ and dK/dV with
    /// their computation: with `cp.async` where the device has it and the staging
    /// copies 16-byte vectors, synchronously in the same order elsewhere; its forward is
    /// as wide as `Auto`'s. No other family overlaps.
    #[test]
    fn overlapped_copies_run_only_when_asked() {
        use super::super::fragments::TileCopies;
        let plan = |kernel, problem: &Problem, properties| match choose_on(
            problem,
            kernel,
            DType::BF16,
            properties,
        ) {
            Choice::Fixed(family) => match *family {
                Family::Fragments(tiling, _) => Some(tiling),
                _ => None,
            },
            Choice::Tuned => None,
        };
        let mut cuda = gpu_with_fragments();
        cuda.features.memory_reinterpret = true;
        cuda.features.copy_async = true;
        let mut without_async = cuda.clone();
        without_async.features.copy_async = false;
        let wgpu_like = gpu_with_fragments(); // one element a copy
        let copies = |properties| {
            let tiling = plan(
                FlashKernel::FragmentsOverlapped,
                &problem(128, 128),
                properties,
            )
            .unwrap();
            // The backward overlaps as the forward does (its second buffers fit).
            let (dq, dkdv) = tiling.backward.unwrap();
            assert_eq!(dq.copies, tiling.forward.copies);
            assert_eq!(dkdv.copies, tiling.forward.copies);
            tiling.forward.copies
        };
        assert_eq!(copies(&cuda), TileCopies::Overlapped { asynchronous: true });
        assert_eq!(
            copies(&without_async),
            TileCopies::Overlapped {
                asynchronous: false
            }
        );
        assert_eq!(
            copies(&wgpu_like),
            TileCopies::Overlapped {
                asynchronous: false
            }
        );
        for kernel in [
            FlashKernel::Fragments,
            FlashKernel::WideFragments,
            FlashKernel::FragmentsAtomicDq,
        ] {
            let tiling = plan(kernel, &problem(128, 128), &cuda).unwrap();
            let (dq, dkdv) = tiling.backward.unwrap();
            for copies in [tiling.forward.copies, dq.copies, dkdv.copies] {
                assert_eq!(copies, TileCopies::Together, "{kernel:?}");
            }
        }
        if FlashKernel::from_env().is_none() {
            let auto = plan(FlashKernel::Auto, &problem(128, 128), &cuda).unwrap();
            assert_eq!(auto.forward.copies, TileCopies::Together);
            // A launch that fills the GPU takes the wide forward, overlapped or not.
            let large = Problem {
                batch: 4,
                heads: 16,
                seq_q: 16384,
                seq_k: 16384,
                ..problem(128, 128)
            };
            let rows = |kernel| plan(kernel, &large, &cuda).unwrap().forward.row_tiles;
            assert_eq!(
                rows(FlashKernel::FragmentsOverlapped),
                rows(FlashKernel::Auto)
            );
            assert_eq!(rows(FlashKernel::FragmentsOverlapped), 2);
        }
    }

    /// `Auto`'s fragment forward is the wide one (two row tiles a plane) for launches
    /// of at least 8 wide cubes per multiprocessor at value head dim 128, the narrow one
    /// otherwise; its dQ is always narrow. An explicit family keeps its width.
    #[test]
    fn auto_takes_the_wide_forward_for_launches_that_fill_the_gpu() {
        if FlashKernel::from_env().is_some() {
            return; // BURN_TRANSFORMER_FLASH_KERNEL replaces `Auto`'s choice
        }
        let tensor_cores = gpu_with_fragments();
        // (batch, heads, seq, d_qk, d_v): 132 SMs, so the wide forward from 1056 cubes
        // of 128 rows.
        let cases = [
            ((4, 16, 4096, 128, 128), 2),
            ((4, 16, 16384, 128, 128), 2),
            ((1, 32, 4224, 192, 128), 2),
            ((4, 16, 1024, 128, 128), 1),
            ((1, 32, 4096, 128, 128), 1),
            ((4, 16, 4096, 64, 64), 1),
            ((4, 16, 1, 128, 128), 1),
        ];
        for ((batch, heads, seq, d_qk, d_v), wide) in cases {
            let problem = Problem {
                batch,
                heads,
                kv_heads: heads,
                seq_q: seq,
                seq_k: seq.max(4096),
                ..problem(d_qk, d_v)
            };
            let rows = |kernel| match choose_on(&problem, kernel, DType::BF16, &tensor_cores) {
                Choice::Fixed(family) => match *family {
                    Family::Fragments(tiling, _) => {
                        let (q, _) = tiling.backward.unwrap();
                        assert_eq!(q.row_tiles, 1);
                        tiling.forward.row_tiles
                    }
                    other => panic!("{problem:?}: {other:?}"),
                },
                Choice::Tuned => panic!("{problem:?}: tuned"),
            };
            assert_eq!(rows(FlashKernel::Auto), wide, "{problem:?}");
            assert_eq!(rows(FlashKernel::Fragments), 1, "{problem:?}");
            assert_eq!(rows(FlashKernel::WideFragments), 2, "{problem:?}");
            // With ALiBi the wide forward would spill: `Auto` keeps the narrow one.
            let with_alibi = Problem {
                has_alibi: true,
                ..problem
            };
            assert_eq!(
                super::super::tiling::auto_forward_row_tiles(&with_alibi, &tensor_cores),
                1
            );
        }
        // A runtime that does not report its multiprocessors keeps the narrow forward.
        let mut unknown = tensor_cores.clone();
        unknown.hardware.num_streaming_multiprocessors = None;
        let problem = Problem {
            batch: 4,
            heads: 16,
            kv_heads: 16,
            seq_q: 16384,
            seq_k: 16384,
            ..problem(128, 128)
        };
        assert_eq!(
            super::super::tiling::auto_forward_row_tiles(&problem, &unknown),
            1
        );
    }

    /// The fragment kernels stage rows as 16-byte vectors where the runtime reads a
    /// buffer as vectors of another width (CUDA) and element by element where it
    /// cannot (wgpu), and load their fragments with `ldmatrix` where the device has it
    /// (unless turned off), element by element elsewhere.
    #[test]
    fn fragment_staging_copies_vectors_where_the_runtime_retypes_buffers() {
        use super::super::fragment::FragmentLoads;
        use super::super::tiling::plan_fragments;
        let mut cuda = gpu_with_fragments();
        let f16 = cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::F16);
        let bf16 = cubecl::ir::ElemType::Float(cubecl::ir::FloatKind::BF16);
        cuda.features.matmul.ldmatrix.extend([f16, bf16]);
        let wgpu_like = gpu_with_fragments();
        cuda.features.memory_reinterpret = true;
        for dtype in [DType::BF16, DType::F16] {
            for (d_qk, d_v) in [(64, 64), (128, 128), (192, 128)] {
                let plan =
                    plan_fragments(&problem(d_qk, d_v), dtype, &cuda, 1, false, false, false)
                        .unwrap();
                let (q, kv) = plan.backward.unwrap();
                for config in [plan.forward, q, kv] {
                    // 16 bytes of a 2-byte type.
                    assert_eq!(config.staging, 8, "{dtype:?} {d_qk}x{d_v}");
                    let loads = if crate::ops::flash_attention::matrix_loads_enabled() {
                        FragmentLoads::Matrices
                    } else {
                        FragmentLoads::Elements
                    };
                    assert_eq!(config.loads, loads, "{dtype:?} {d_qk}x{d_v}");
                }
                let plan = plan_fragments(
                    &problem(d_qk, d_v),
                    dtype,
                    &wgpu_like,
                    1,
                    false,
                    false,
                    false,
                )
                .unwrap();
                assert_eq!(plan.forward.staging, 1, "{dtype:?} {d_qk}x{d_v}");
                assert_eq!(plan.forward.loads, FragmentLoads::Elements);
            }
        }
        // Head dims that are odd multiples of 8 still take whole 16-byte vectors.
        let plan =
            plan_fragments(&problem(48, 24), DType::BF16, &cuda, 1, false, false, false).unwrap();
        assert_eq!(plan.forward.staging, 8);
    }

    /// The one-pass backward is planned where it is asked for and the device adds f32
    /// atomically: its dK/dV kernel adds dQ (and stages `dS`, within the device's
    /// shared memory); the forward and the dQ kernel's plan are the two-pass ones.
    #[test]
    fn one_pass_backward_needs_asking_and_f32_atomics() {
        use super::super::tiling::plan_fragments;
        let atomics = gpu_with_fragments();
        let mut none = atomics.clone();
        none.features.types.atomic.clear();
        for (d_qk, d_v) in [(64, 64), (128, 128), (192, 128)] {
            let problem = problem(d_qk, d_v);
            // At 192/128 the one-pass kernel would spill: the two-pass one runs.
            let takes = d_qk <= 128;
            let adds = |properties, one_pass| {
                let plan =
                    plan_fragments(&problem, DType::BF16, properties, 1, one_pass, false, false)
                        .unwrap();
                let (q, kv) = plan.backward.unwrap();
                assert!(!plan.forward.adds_dq && !q.adds_dq);
                assert!(kv.backward_kv_bytes(2) <= atomics.hardware.max_shared_memory_size);
                kv.adds_dq
            };
            assert_eq!(adds(&atomics, true), takes, "{d_qk}x{d_v}");
            assert!(!adds(&atomics, false), "{d_qk}x{d_v}");
            assert!(!adds(&none, true), "{d_qk}x{d_v}");
            let one_pass = match choose_on(
                &problem,
                FlashKernel::FragmentsAtomicDq,
                DType::BF16,
                &atomics,
            ) {
                Choice::Fixed(family) => match *family {
                    Family::Fragments(tiling, _) => tiling.backward.unwrap().1.adds_dq,
                    other => panic!("{other:?}"),
                },
                Choice::Tuned => panic!("tuned"),
            };
            assert_eq!(one_pass, takes, "{d_qk}x{d_v}");
        }
    }

    /// The fragment kernels take `ex2.approx` exponentials where the runtime compiles
    /// PTX (CUDA) and the library's `exp` elsewhere. The wide family plans two row
    /// tiles for the forward only.
    #[test]
    fn fragment_exponentials_are_ex2_on_ptx_runtimes_only() {
        use super::super::softmax::Exponential;
        use super::super::tiling::plan_fragments;
        let mut cuda = gpu_with_fragments();
        cuda.identity.fingerprint = "ptx_sm90".into();
        let other = gpu_with_fragments();
        for (d_qk, d_v) in [(64, 64), (128, 128), (192, 128)] {
            for row_tiles in [1, 2] {
                let plan = plan_fragments(
                    &problem(d_qk, d_v),
                    DType::BF16,
                    &cuda,
                    row_tiles,
                    false,
                    false,
                    false,
                )
                .unwrap();
                let (q, kv) = plan.backward.unwrap();
                assert_eq!(plan.forward.exponential, Exponential::Ex2Approx);
                assert_eq!(q.exponential, Exponential::Ex2Approx);
                assert_eq!(kv.exponential, Exponential::Ex2Approx, "{d_qk}x{d_v}");
                assert_eq!((plan.forward.row_tiles, q.row_tiles), (row_tiles, 1));
                assert_eq!(kv.row_tiles, 1);
                assert_eq!(plan.forward.rows(), 16 * row_tiles * plan.forward.planes);

                let plan = plan_fragments(
                    &problem(d_qk, d_v),
                    DType::BF16,
                    &other,
                    row_tiles,
                    false,
                    false,
                    false,
                )
                .unwrap();
                let (q, kv) = plan.backward.unwrap();
                for config in [plan.forward, q, kv] {
                    assert_eq!(config.exponential, Exponential::Library);
                }
            }
        }
    }
}
