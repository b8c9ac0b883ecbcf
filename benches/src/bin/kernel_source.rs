//! The flash-attention kernels as CUDA C++, compiled for an H100 (sm_90) without a GPU.
//!
//! ```text
//! cargo run --release -p benches --features kernel-source --bin kernel_source -- --out DIR
//! ```
//!
//! A CUDA device compiles each CubeCL kernel at its first launch: CubeCL's CUDA runtime
//! defines the kernel for the device's properties, turns it into CUDA C++ with CubeCL's
//! C++ backend, and hands that to NVRTC. This program does the first two steps without
//! the device, for every kernel the fused attention would launch
//! (`burn_transformer::ops::flash_attention::kernel_variants`: for each kernel family,
//! forward, flash-decoding's merge, backward pre-pass, dQ, dK/dV; f32, f16, bf16; the
//! head dims of `VARIANT_HEAD_DIMS`; tiles for a 4096-token sequence), with the properties and compiler options the runtime
//! builds for an H100 (compute capability 9.0, CUDA 12.8 or later). It writes
//! `DIR/<kernel>-<variant>-<dtype>-<d_qk>x<d_v>[-<rows>x<block>].cu` (the tile where a
//! family has several kernels of one kind), one translation unit per kernel,
//! and `DIR/variants.json`, which names each file's kernel, dims, units per cube, entry
//! point and the dynamic shared memory its launch requests.
//!
//! `tools/kernel_resources.py` takes the folder from there: NVRTC to PTX, `ptxas -v`,
//! registers, spills, shared memory and occupancy (docs/flash-attention.md).

use std::fs;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use benches::record::dtype_name;
use burn_transformer::ops::flash_attention::{
    KernelFamily, KernelVariant, VARIANT_SEQ_LEN, kernel_variants,
};
use clap::Parser;
use cubecl::Compiler;
use cubecl::cmma::MatrixLayout;
use cubecl::features::{Plane, Tma};
use cubecl::ir::{
    ContiguousElements, DeviceIdentity, DeviceProperties, ElemType, FloatKind, HardwareProperties,
    MemoryDeviceProperties, MmaProperties, OpaqueType, PciVendor, PhysicalDevice, TargetProperties,
    VectorSize,
};
use cubecl::profile::TimingMethod;
use cubecl_cpp::cuda::arch::CudaArchitecture;
use cubecl_cpp::cuda::mma::CudaCmmaCompiler;
use cubecl_cpp::cuda::mma::manual::contiguous_elements_cuda;
use cubecl_cpp::shared::{
    CompilationOptions, CppCompiler, CppSupportedFeatures, register_mma_features,
    register_scaled_mma_features, register_wmma_features,
};
use cubecl_cpp::target::Cuda;
use cubecl_cpp::{cuda, register_supported_types};
use serde_json::{Value, json};

/// Compute capability the sources are compiled for (H100).
const ARCH_VERSION: u32 = 90;
/// The architecture's name in the output.
const ARCH: &str = "sm_90";
/// Threads per warp on every NVIDIA GPU.
const WARP_SIZE: u32 = 32;
/// `CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN` of compute capability 9.0:
/// 227 KiB, what CubeCL's CUDA runtime reports as the cube's shared memory limit.
const MAX_SHARED_PER_BLOCK: usize = 227 * 1024;
/// Streaming multiprocessors of an H100 SXM5 (the PCIe card has 114; nothing here
/// depends on the count).
const H100_SMS: u32 = 132;
/// Memory of an H100 80 GB (nothing here depends on it).
const H100_MEMORY: u64 = 80 << 30;
/// Bindings per kernel CubeCL's CUDA runtime allows (a parameter count, not a table).
const CUDA_MAX_BINDINGS: u32 = 1024;
/// Alignment CubeCL's CUDA runtime gives allocations (`cuMemAllocPitch`'s).
const MEMORY_ALIGNMENT: u64 = 512;

/// Writes the CUDA C++ source of every flash-attention kernel, compiled by CubeCL's
/// C++ backend for an H100 (sm_90), plus `variants.json`; no GPU needed.
#[derive(Parser)]
#[command(
    about,
    after_help = "Then measure them: python3 tools/kernel_resources.py --sources DIR \
                  (see tools/README.md)."
)]
struct Args {
    /// Folder to write the `.cu` files and `variants.json` into (created if missing).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// Only the kernels of these families (repeatable: `register_tile`, `staged`,
    /// `staged_tensor_cores`, `fragments`, `wide_fragments`, `fragments_atomic_dq`,
    /// `fragments_tf32`); every family by default.
    #[arg(long = "family", value_name = "NAME", value_parser = parse_family)]
    families: Vec<KernelFamily>,
    /// The kernels as calls with ALiBi compile them (its bias in every score): the
    /// forward, dQ and dK/dV kernels, each file named with an `-alibi` suffix.
    #[arg(long)]
    alibi: bool,
}

/// A family named as tools name it.
fn parse_family(name: &str) -> Result<KernelFamily, String> {
    KernelFamily::ALL
        .into_iter()
        .find(|family| family.name() == name)
        .ok_or_else(|| {
            let names: Vec<&str> = KernelFamily::ALL.iter().map(|f| f.name()).collect();
            format!("`{name}` is not one of {}", names.join(", "))
        })
}

fn main() -> ExitCode {
    let args = Args::parse();
    match run(&args.out, &args.families, args.alibi) {
        Ok(count) => {
            eprintln!(
                "wrote {count} kernels and variants.json to {}",
                args.out.display()
            );
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

fn run(out: &Path, families: &[KernelFamily], alibi: bool) -> Result<usize, String> {
    if let Ok(tile) = std::env::var("BURN_TRANSFORMER_FLASH_TILE") {
        eprintln!(
            "note: BURN_TRANSFORMER_FLASH_TILE={tile} overrides the tiles of every kernel \
             (unset it for the tiles launches pick)"
        );
    }
    fs::create_dir_all(out)
        .map_err(|err| format!("cannot create the output folder {}: {err}", out.display()))?;
    let (properties, options) = h100();
    let mut variants = kernel_variants(&properties, &cuda_target(), alibi)
        .map_err(|reason| format!("the fused attention does not take these problems: {reason}"))?;
    if !families.is_empty() {
        variants.retain(|variant| families.contains(&variant.family));
    }
    // The kernels without scores are the same with ALiBi.
    variants.retain(|variant| variant.alibi == alibi);
    let mut entries = Vec::with_capacity(variants.len());
    for (index, variant) in variants.iter().enumerate() {
        // The staged family has one kernel per tile size autotuning compares, the
        // overlapped family a narrow and a wide forward.
        let tile = match (variant.family, variant.tile) {
            (KernelFamily::Staged | KernelFamily::FragmentsOverlapped, Some((rows, block))) => {
                format!("-{rows}x{block}")
            }
            _ => String::new(),
        };
        let suffix = if alibi { "-alibi" } else { "" };
        let file = format!(
            "{}-{}-{}-{}x{}{tile}{suffix}.cu",
            variant.kernel,
            variant.family,
            dtype_name(variant.dtype),
            variant.d_qk,
            variant.d_v
        );
        eprintln!("[{}/{}] {file}", index + 1, variants.len());
        let (entry_point, source, dynamic_shared) = compile(variant, &options)
            .map_err(|err| format!("{file}: CubeCL's C++ backend failed: {err}"))?;
        let path = out.join(&file);
        fs::write(&path, source)
            .map_err(|err| format!("cannot write {}: {err}", path.display()))?;
        let (rows, block) = match variant.tile {
            Some((rows, block)) => (json!(rows), json!(block)),
            None => (Value::Null, Value::Null),
        };
        entries.push(json!({
            "kernel": variant.kernel.name(),
            "variant": variant.family.name(),
            "dtype": dtype_name(variant.dtype),
            "d_qk": variant.d_qk,
            "d_v": variant.d_v,
            "units_per_cube": variant.units_per_cube,
            "vector_size": variant.vector_size,
            "rows_per_unit": rows,
            "block": block,
            "lanes": variant.lanes,
            "alibi": variant.alibi,
            "entry_point": entry_point,
            "dynamic_shared_bytes": dynamic_shared,
            "file": file,
        }));
    }
    let manifest = json!({
        "arch": ARCH,
        "device": "NVIDIA H100 (compute capability 9.0), as CubeCL's CUDA runtime describes it",
        "seq_len": VARIANT_SEQ_LEN,
        "variants": entries,
    });
    let path = out.join("variants.json");
    let text = serde_json::to_string_pretty(&manifest).map_err(|err| err.to_string())?;
    fs::write(&path, text + "\n")
        .map_err(|err| format!("cannot write {}: {err}", path.display()))?;
    Ok(variants.len())
}

/// Defines and compiles one kernel: its entry point, CUDA C++ source, and the dynamic
/// shared memory its launch requests (bytes).
fn compile(
    variant: &KernelVariant,
    options: &CompilationOptions,
) -> Result<(String, String, usize), String> {
    let definition = variant.define().map_err(|err| err.to_string())?;
    let entry_point = definition.settings.kernel_name.clone();
    let kernel = CppCompiler::<Cuda>::default()
        .compile(definition, options)
        .map_err(|err| err.to_string())?;
    Ok((entry_point, kernel.source, kernel.shared_memory_size))
}

/// The device properties and C++ compiler options CubeCL's CUDA runtime builds for an
/// H100 with a CUDA 12.8+ toolkit, from the values its driver reports (compute
/// capability 9.0, warp 32, 1024 threads and 227 KiB of shared memory per block, block
/// dims 1024 × 1024 × 64, grid 2³¹−1 × 65535 × 65535).
///
/// What the flash-attention launches read of them is the hardware limits (units per
/// cube, cube dims and counts, vector width): the tiles follow from those. The type,
/// plane, matrix and TMA features are registered as the runtime registers them, so a
/// kernel that asks for them compiles as it would on the device, and so are atomic
/// adds of f32 pairs; the runtime's other extra atomic and complex types are not (no
/// kernel here uses them).
fn h100() -> (DeviceProperties, CompilationOptions) {
    let arch = CudaArchitecture {
        version: ARCH_VERSION,
        tensor_cores: true,
    };
    let supported_cmma = CudaCmmaCompiler::Cpp.supported_cmma_combinations(&arch);
    let hardware = HardwareProperties {
        load_width: 128,
        vector_register_count: None,
        plane_size_min: WARP_SIZE,
        plane_size_max: WARP_SIZE,
        max_bindings: CUDA_MAX_BINDINGS,
        max_shared_memory_size: MAX_SHARED_PER_BLOCK,
        max_cube_count: (i32::MAX as u32, 65535, 65535),
        max_units_per_cube: 1024,
        max_cube_dim: (1024, 1024, 64),
        num_streaming_multiprocessors: Some(H100_SMS),
        num_tensor_cores: Some(4),
        min_tensor_cores_dim: (!supported_cmma.is_empty()).then_some(8),
        num_cpu_cores: None,
        last_level_cache_size: None,
        max_vector_size: VectorSize::MAX,
        cube_mma_reserved_shared_memory: 0,
    };
    let mut physical = PhysicalDevice::default();
    physical.vendor = Some(PciVendor::Nvidia);
    let mut properties = DeviceProperties::new(
        Default::default(),
        MemoryDeviceProperties::new(H100_MEMORY / 4, MEMORY_ALIGNMENT).with_max_memory(H100_MEMORY),
        hardware,
        TimingMethod::Device,
        DeviceIdentity {
            name: "NVIDIA H100 80GB HBM3".to_string(),
            fingerprint: format!("ptx_sm{ARCH_VERSION}"),
            physical: Some(physical),
        },
    );
    register_supported_types(&mut properties);
    // Pairs of f32 added atomically, as the runtime registers them on sm_90 (CUDA 12.9
    // and later): the one-pass backward adds dQ two columns at a time with them.
    properties.register_atomic_type_usage(
        cubecl::ir::Type::atomic(
            cubecl::ir::Type::new(ElemType::Float(FloatKind::F32)).with_vector_size(2),
        ),
        cubecl::ir::features::AtomicUsage::Add,
    );
    let features = &mut properties.features;
    features.plane = Plane::Ops | Plane::Sync | Plane::NonUniformControlFlow;
    features.memory_reinterpret = true;
    features.alignment = true;
    features.device_memory_scope = true;
    features.copy_async = true;
    features.cube_cluster = true;
    features.tma.insert(Tma::Base);
    for half in [FloatKind::F16, FloatKind::BF16] {
        features.matmul.ldmatrix.insert(ElemType::Float(half));
        features.matmul.stmatrix.insert(ElemType::Float(half));
    }
    properties.register_opaque_type(OpaqueType::Barrier);
    properties.register_opaque_type(OpaqueType::TensorMap);
    register_wmma_features(supported_cmma, &mut properties);
    register_mma_features(cuda::supported_mma_combinations(&arch), &mut properties);
    register_scaled_mma_features(
        cuda::supported_scaled_mma_combinations(&arch),
        &mut properties,
    );

    let options = CompilationOptions {
        warp_size: WARP_SIZE as usize,
        supports_features: CppSupportedFeatures {
            grid_constants: true,
            clusters: true,
            fast_math: true,
            // `htanh` and `h2tanh` exist from CUDA 12.8.
            fast_tanh: true,
            elect_sync: true,
            dp4a: true,
        },
        amd_wmma: None,
    };
    (properties, options)
}

/// The target properties of CubeCL's CUDA runtime: the register layouts of its
/// matrix-multiply fragments.
fn cuda_target() -> TargetProperties {
    TargetProperties {
        mma: MmaProperties {
            register_size_bits: 32,
            const_plane_size: WARP_SIZE,
            register_layout_a: MatrixLayout::RowMajor,
            register_layout_b: MatrixLayout::ColMajor,
            register_layout_acc: MatrixLayout::RowMajor,
            register_duplication_a: 1,
            register_duplication_b: 1,
            register_duplication_acc: 1,
            contiguous_elements: ContiguousElements::new(contiguous_elements_cuda),
        },
    }
}
