//! Picking the `--device` of a program, with a clear message instead of a panic
//! when the backend cannot run here.

use burn::tensor::{Device, Tensor};
use burn_transformer::device::parse_device;

/// Parses `name` (`flex`, `ndarray`, `wgpu`, `cuda`) and checks that the device
/// runs a tiny computation; GPU runtimes panic when no adapter exists, which is
/// turned into an error naming the device.
///
/// # Errors
/// A message for an unknown name, a backend this build lacks, or a device that
/// does not work on this machine.
pub fn open_device(name: &str) -> Result<Device, String> {
    let device = parse_device(name).map_err(|error| error.to_string())?;
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
