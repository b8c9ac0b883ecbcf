//! The fused op on CubeCL runtimes (wgpu, cuda): the `#[cube]` kernels, their tile
//! sizes per device, and their launches.

mod kernels;
pub(crate) mod launch;
pub(crate) mod tiling;
