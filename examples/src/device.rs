//! Picking the `--device` of a program, with a clear message instead of a panic
//! when the backend cannot run here.

use burn::tensor::{Device, Tensor};
use burn_transformer::device::parse_device;

/// Parses `name` (`flex`, `ndarray`, `wgpu`, `cuda`), makes its backend the
/// process's default device, and checks that the device runs a tiny computation; GPU
/// runtimes panic when no adapter exists, which is turned into an error naming the
/// device.
///
/// Burn puts some tensors on the default device before moving them where they
/// belong (a resumed optimizer state is read there); with the chosen backend as the
/// default, a run on one backend never starts another one's driver.
///
/// Call it before the program starts any thread (it sets `BURN_DEVICE`).
///
/// # Errors
/// A message for an unknown name, a backend this build lacks, or a device that
/// does not work on this machine.
pub fn open_device(name: &str) -> Result<Device, String> {
    let device = parse_device(name).map_err(|error| error.to_string())?;
    // Burn's name of the backend (our `cpu` is flex, our `vulkan` is wgpu).
    let backend = match name.trim().to_ascii_lowercase().split(':').next() {
        Some("flex" | "cpu") => "flex",
        Some("wgpu" | "vulkan") => "wgpu",
        Some("ndarray") => "ndarray",
        _ => "cuda",
    };
    // SAFETY: the programs open their device before any thread exists, so nothing
    // reads the environment concurrently.
    unsafe { std::env::set_var("BURN_DEVICE", backend) };
    let probe = device.clone();
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(move || {
        Tensor::<1>::from_floats([1.0, 2.0], &probe)
            .sum()
            .into_scalar::<f32>()
    });
    std::panic::set_hook(previous);
    match result {
        Ok(sum) if (sum - 3.0).abs() < 1e-6 => Ok(device),
        Ok(sum) => Err(format!("device `{name}` computed 1 + 2 = {sum}")),
        Err(panic) => {
            let reason = panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown failure".into());
            Err(format!(
                "device `{name}` does not work on this machine: {reason}"
            ))
        }
    }
}

/// The devices of a run: `--device` alone, or the `--devices` list (its first is the
/// main device, where validation and the optimizer run; the rest share each training
/// step). Each is opened and checked as [`open_device`] does.
///
/// # Errors
/// As [`open_device`], naming the device; a list that mixes backends.
pub fn open_devices(device: &str, devices: &[String]) -> Result<(Device, Vec<Device>), String> {
    let Some((first, rest)) = devices.split_first() else {
        return Ok((open_device(device)?, Vec::new()));
    };
    let backend = |name: &str| {
        name.trim()
            .to_ascii_lowercase()
            .split(':')
            .next()
            .map(str::to_string)
    };
    if let Some(other) = rest.iter().find(|name| backend(name) != backend(first)) {
        return Err(format!(
            "--devices {}: `{other}` is another backend than `{first}`: the devices of a run \
             share one backend",
            devices.join(",")
        ));
    }
    let main = open_device(first)?;
    let extra = rest
        .iter()
        .map(|name| open_device(name))
        .collect::<Result<Vec<_>, _>>()?;
    Ok((main, extra))
}
