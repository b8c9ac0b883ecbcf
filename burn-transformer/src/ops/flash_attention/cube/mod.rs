//! The fused op on CubeCL runtimes (wgpu, cuda): the `#[cube]` kernels of three
//! families (register tiles; staged shared-memory tiles over one tile product; the
//! fragment kernels, whose scores, outputs and gradients stay in a plane's registers,
//! 16 or 32 query rows a plane), their tile sizes per device, the timing that picks
//! among them, their launches, and the list of every kernel a device compiles.

pub(crate) mod autotune;
pub(crate) mod dispatch;
mod fragment;
mod fragments;
mod launch;
mod register_tiles;
mod row_stats;
mod sizes;
mod softmax;
mod staged;
mod tile_product;
pub(crate) mod tiling;
mod variants;

pub use variants::{
    AttentionKernel, KernelFamily, KernelVariant, VARIANT_DTYPES, VARIANT_HEAD_DIMS,
    VARIANT_SEQ_LEN, kernel_variants,
};
