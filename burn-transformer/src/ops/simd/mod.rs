//! Building blocks of the fused CPU ops on flex: parallel loops over rows on Burn's
//! rayon pool, a macro that compiles one loop body for AVX-512, AVX2 or the baseline
//! (picked at run time), vectorizable row reductions ([`lanes`]) and a vectorizable
//! `exp` ([`exp`]).
//!
//! Burn composes activations such as `silu(gate)·up` from primitive ops: each is a
//! pass over memory and an allocation, and under autodiff each adds a backward node
//! with passes of its own. On the training step of a small model on two cores these
//! elementwise passes cost as much as the matrix products. The fused ops of
//! [`crate::ops`] do the same math in one pass forward and one pass backward, in plain
//! Rust loops written with these helpers.

pub(crate) mod exp;
pub(crate) mod lanes;

#[cfg(feature = "flex")]
use std::mem::MaybeUninit;

use burn::tensor::{DType, Device};

/// Whether the fused CPU ops take tensors of `dtype` on `device`: f32 on flex.
pub(crate) fn runs_fused_on_cpu(device: &Device, dtype: DType) -> bool {
    #[cfg(feature = "flex")]
    {
        use burn::backend::DispatchDevice;
        dtype == DType::F32
            && matches!(
                device.clone().inner().as_dispatch(),
                DispatchDevice::Flex(_)
            )
    }
    #[cfg(not(feature = "flex"))]
    {
        let _ = (device, dtype);
        false
    }
}

/// Elements per parallel task: large enough that a task outweighs its hand-off.
#[cfg(feature = "flex")]
pub(crate) const PARALLEL_CHUNK: usize = 1 << 15;

/// A contiguous f32 view of a flex tensor (callers made it contiguous).
///
/// # Panics
/// If the tensor is not f32 or not contiguous: the public functions check the dtype,
/// and the ops call `to_contiguous` first.
#[cfg(feature = "flex")]
pub(crate) fn flex_values(tensor: &burn::backend::flex::FlexTensor) -> &[f32] {
    assert_eq!(
        tensor.dtype(),
        DType::F32,
        "fused CPU ops take f32 (callers check)"
    );
    tensor
        .as_slice::<f32>()
        .expect("contiguous after to_contiguous")
}

/// A flex tensor of `values` shaped like `like`.
#[cfg(feature = "flex")]
pub(crate) fn flex_like(
    like: &burn::backend::flex::FlexTensor,
    values: Vec<f32>,
) -> burn::backend::flex::FlexTensor {
    burn::backend::flex::FlexTensor::from_data(burn::tensor::TensorData::new(
        values,
        like.layout().shape().clone(),
    ))
}

/// Runs `kernel` over matching chunks of the inputs (each of `len` values) and
/// returns its `M` outputs of `len` values: [`map_rows`] with rows of one element.
///
/// # Safety
/// As [`map_rows`]: `kernel` writes every element of its output chunks.
#[cfg(feature = "flex")]
pub(crate) unsafe fn for_chunks<const N: usize, const M: usize>(
    len: usize,
    inputs: [&[f32]; N],
    kernel: impl Fn([&[f32]; N], [&mut [MaybeUninit<f32>]; M]) + Sync,
) -> [Vec<f32>; M] {
    // SAFETY: the caller's promise, passed on.
    let (outputs, _) =
        unsafe { map_rows(1, len, inputs, |_, inputs, outputs| kernel(inputs, outputs)) };
    outputs
}

/// Runs `kernel` on groups of whole rows (`row_len` values each) of the inputs and
/// returns its `M` outputs of `len` values; `kernel` gets the index of its first
/// row. As [`map_rows`].
///
/// # Safety
/// As [`map_rows`]: `kernel` writes every element of its output rows.
#[cfg(feature = "flex")]
pub(crate) unsafe fn for_rows<const N: usize, const M: usize>(
    row_len: usize,
    len: usize,
    inputs: [&[f32]; N],
    kernel: impl Fn(usize, [&[f32]; N], [&mut [MaybeUninit<f32>]; M]) + Sync,
) -> [Vec<f32>; M] {
    // SAFETY: the caller's promise, passed on.
    let (outputs, _) = unsafe { map_rows(row_len, len, inputs, kernel) };
    outputs
}

/// Runs `kernel` on groups of whole rows (`row_len` values each) of the inputs (each
/// of `len` values, a multiple of `row_len`), in parallel when there are several
/// groups, and returns its `M` outputs of `len` values and what each task returned (a
/// partial sum over its rows, say), in the order of their rows. Each task writes only
/// its own rows of the outputs.
///
/// The outputs are new buffers that nothing initializes but `kernel`: zeroing them
/// first would be one more pass over memory per op (about 3% of a small model's
/// training step on flex).
///
/// # Safety
/// `kernel` must write every element of the output slices it is given (it may read
/// an element only after writing it). The outputs are read as `f32` values once the
/// tasks have run.
#[cfg(feature = "flex")]
pub(crate) unsafe fn map_rows<const N: usize, const M: usize, R: Send>(
    row_len: usize,
    len: usize,
    inputs: [&[f32]; N],
    kernel: impl Fn(usize, [&[f32]; N], [&mut [MaybeUninit<f32>]; M]) -> R + Sync,
) -> ([Vec<f32>; M], Vec<R>) {
    use rayon::prelude::*;
    assert!(
        inputs.iter().all(|input| input.len() == len),
        "map_rows: every input has {len} values"
    );
    let mut buffers: [Vec<f32>; M] = std::array::from_fn(|_| Vec::with_capacity(len));
    let results = {
        let outputs = buffers
            .each_mut()
            .map(|buffer| &mut buffer.spare_capacity_mut()[..len]);
        if row_len == 0 || len <= PARALLEL_CHUNK {
            vec![kernel(0, inputs, outputs)]
        } else {
            let rows_per_task = (PARALLEL_CHUNK / row_len).max(1);
            let task_len = rows_per_task * row_len;
            let tasks = len.div_ceil(task_len);
            let mut per_output = outputs.map(|output| output.chunks_mut(task_len));
            let tasks: Vec<[&mut [MaybeUninit<f32>]; M]> = (0..tasks)
                .map(|_| {
                    std::array::from_fn(|output| {
                        per_output[output]
                            .next()
                            .expect("every output has the same number of rows")
                    })
                })
                .collect();
            tasks
                .into_par_iter()
                .enumerate()
                .map(|(index, chunk)| {
                    let start = index * task_len;
                    let range = start..(start + task_len).min(len);
                    kernel(
                        index * rows_per_task,
                        inputs.map(|input| &input[range.clone()]),
                        chunk,
                    )
                })
                .collect()
        }
    };
    for buffer in &mut buffers {
        // SAFETY: the tasks cover all `len` values of every output, and the caller
        // promises that each writes all of its values.
        unsafe { buffer.set_len(len) };
    }
    (buffers, results)
}

/// `values` as initialized `f32`s.
///
/// # Safety
/// Every element of `values` has been written.
#[cfg(feature = "flex")]
#[inline(always)]
pub(crate) unsafe fn assume_written(values: &mut [MaybeUninit<f32>]) -> &mut [f32] {
    // SAFETY: `MaybeUninit<f32>` has the layout of `f32`, and every element is
    // initialized (the caller's promise).
    unsafe { &mut *(values as *mut [MaybeUninit<f32>] as *mut [f32]) }
}

/// The variable that caps the instruction set of the fused CPU kernels.
#[cfg(all(feature = "flex", target_arch = "x86_64"))]
const CPU_ISA_ENV: &str = "BURN_TRANSFORMER_CPU_ISA";

/// Whether the fused CPU kernels use AVX-512: when the CPU has it, unless
/// `BURN_TRANSFORMER_CPU_ISA=avx2` keeps them on AVX2 (to measure what an AVX2-only
/// machine runs, on one that has both). Read once.
#[cfg(all(feature = "flex", target_arch = "x86_64"))]
pub(crate) fn use_avx512() -> bool {
    static USE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USE.get_or_init(|| avx512_allowed() && std::arch::is_x86_feature_detected!("avx512f"))
}

/// What `BURN_TRANSFORMER_CPU_ISA` says of AVX-512.
#[cfg(all(feature = "flex", target_arch = "x86_64"))]
fn avx512_allowed() -> bool {
    match std::env::var(CPU_ISA_ENV) {
        Err(_) => true,
        Ok(value) => match value.trim().to_ascii_lowercase().as_str() {
            "" | "auto" | "avx512" => true,
            "avx2" => false,
            other => {
                log::warn!("{CPU_ISA_ENV}={other:?} is not one of auto, avx512, avx2; using auto");
                true
            }
        },
    }
}

/// Defines `fn $name(args)` that runs `$body` compiled for AVX-512, for AVX2 + FMA or
/// for the baseline, whichever the CPU has (checked at run time; see [`use_avx512`]).
/// The body is written once as plain loops; each copy is vectorized for its
/// instruction set.
#[cfg(feature = "flex")]
macro_rules! simd_kernel {
    ($(#[$meta:meta])* $vis:vis fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$meta])*
        $vis fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn generic($($arg: $ty),*) $body

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f")]
            fn avx512($($arg: $ty),*) {
                generic($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            fn avx2($($arg: $ty),*) {
                generic($($arg),*)
            }

            #[cfg(target_arch = "x86_64")]
            {
                if $crate::ops::simd::use_avx512() {
                    // SAFETY: the CPU has the instructions `avx512` was compiled for.
                    return unsafe { avx512($($arg),*) };
                }
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    // SAFETY: the CPU has the instructions `avx2` was compiled for.
                    return unsafe { avx2($($arg),*) };
                }
            }
            generic($($arg),*)
        }
    };
}
#[cfg(feature = "flex")]
pub(crate) use simd_kernel;
