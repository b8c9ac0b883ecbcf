//! The machine a run was measured on: what the report prints above every table.

use serde::{Deserialize, Serialize};

use burn::tensor::Device;

/// A description of the machine, the build and the moment of a run.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Machine {
    /// CPU model as the OS names it.
    pub cpu: String,
    /// Logical cores available to this process.
    pub cores: usize,
    /// Physical memory, GiB.
    pub memory_gib: f64,
    /// Operating system.
    pub os: String,
    /// 1-, 5- and 15-minute load averages when the run started (other processes
    /// competing for the cores slow every number down alike).
    pub load_average: String,
    /// Start of the run, UTC, `YYYY-MM-DD HH:MM`.
    pub date_utc: String,
    /// `git describe` of the measured source tree, when known.
    pub commit: Option<String>,
    /// The adapter behind each GPU backend, e.g. `wgpu: llvmpipe (LLVM 15.0.7, 256 bits)`.
    pub adapters: Vec<String>,
    /// `quick` or `full`.
    pub mode: String,
}

impl Machine {
    /// Reads what the OS tells about this machine (Linux `/proc`; fields stay empty
    /// elsewhere). Adapters are added by the caller, which probes them in child
    /// processes.
    pub fn detect(mode: &str) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu = cpuinfo
            .lines()
            .find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == "model name").then(|| value.trim().to_string())
            })
            .unwrap_or_else(|| std::env::consts::ARCH.to_string());
        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
        let memory_kib: f64 = meminfo
            .lines()
            .find(|line| line.starts_with("MemTotal:"))
            .and_then(|line| line.split_whitespace().nth(1))
            .and_then(|kib| kib.parse().ok())
            .unwrap_or(0.0);
        let os = std::fs::read_to_string("/etc/os-release")
            .ok()
            .and_then(|text| {
                text.lines().find_map(|line| {
                    line.strip_prefix("PRETTY_NAME=")
                        .map(|name| name.trim_matches('"').to_string())
                })
            })
            .unwrap_or_else(|| std::env::consts::OS.to_string());
        let load_average = std::fs::read_to_string("/proc/loadavg")
            .map(|text| {
                text.split_whitespace()
                    .take(3)
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
        let commit = std::process::Command::new("git")
            .args(["describe", "--always", "--dirty"])
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).trim().to_string());
        Self {
            cpu,
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
            memory_gib: memory_kib / (1024.0 * 1024.0),
            os,
            load_average,
            date_utc: utc_now(),
            commit,
            adapters: Vec::new(),
            mode: mode.to_string(),
        }
    }

    /// What a record measured on `backend` by this machine names as its machine: the
    /// CPU, and the adapter for a GPU backend.
    pub fn label(&self, backend: &str) -> String {
        let cpu = format!("{}, {} cores", self.cpu, self.cores);
        let prefix = format!("{backend}: ");
        match self
            .adapters
            .iter()
            .find_map(|adapter| adapter.strip_prefix(&prefix))
        {
            Some(adapter) => format!("{adapter} on {cpu}"),
            None => cpu,
        }
    }

    /// A Markdown list of the fields.
    pub fn markdown(&self) -> String {
        let mut text = format!(
            "- CPU: {} ({} logical cores available), {:.0} GiB memory, {}\n",
            self.cpu, self.cores, self.memory_gib, self.os
        );
        for adapter in &self.adapters {
            text.push_str(&format!("- GPU backend adapter: {adapter}\n"));
        }
        text.push_str(&format!(
            "- Load average at start: {} (other processes share these cores)\n",
            self.load_average
        ));
        text.push_str(&format!(
            "- Run: {} mode, {} UTC{}, Burn 0.22.1\n",
            self.mode,
            self.date_utc,
            self.commit
                .as_ref()
                .map(|commit| format!(", source `{commit}`"))
                .unwrap_or_default()
        ));
        text
    }
}

/// The adapter a CubeCL device runs on (`llvmpipe (…)` for Mesa's software Vulkan
/// driver), initializing the device if needed; `None` for CPU backends.
pub fn adapter_name(device: &Device) -> Option<String> {
    #[cfg(any(feature = "wgpu", feature = "cuda"))]
    if let burn::backend::DispatchDevice::Cube(cube) = device.as_dispatch() {
        let client = cube.client();
        let identity = &client.properties().identity;
        return Some(format!("{} ({})", identity.name, client.name()));
    }
    let _ = device;
    None
}

/// Whether `adapter` (as [`adapter_name`] gives it) is a GPU emulated on the CPU: Mesa's
/// software Vulkan drivers, lavapipe and llvmpipe. Whole-model cells take seconds a run
/// there, so the quick modes leave out their largest sizes on such adapters.
pub fn emulates_gpu_on_cpu(adapter: &str) -> bool {
    let adapter = adapter.to_ascii_lowercase();
    adapter.contains("llvmpipe") || adapter.contains("lavapipe")
}

/// Now, UTC, as `YYYY-MM-DD HH:MM` (civil date from the Unix day count).
fn utc_now() -> String {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let (days, rest) = ((seconds / 86_400) as i64, seconds % 86_400);
    // Howard Hinnant's days-to-civil algorithm.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}",
        rest / 3600,
        (rest % 3600) / 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_something_printable() {
        let machine = Machine::detect("quick");
        assert!(machine.cores >= 1);
        assert_eq!(machine.date_utc.len(), "2026-01-01 00:00".len());
        assert!(machine.markdown().contains("quick mode"));
    }

    #[test]
    fn records_name_the_cpu_and_the_adapter_of_their_backend() {
        let machine = Machine {
            cpu: "Xeon".into(),
            cores: 2,
            adapters: vec!["cuda: NVIDIA H200 (cuda)".into()],
            ..Machine::default()
        };
        assert_eq!(machine.label("cuda"), "NVIDIA H200 (cuda) on Xeon, 2 cores");
        assert_eq!(machine.label("flex"), "Xeon, 2 cores");
    }

    #[test]
    fn mesa_software_drivers_are_emulated_gpus() {
        assert!(emulates_gpu_on_cpu(
            "llvmpipe (LLVM 15.0.6, 256 bits) (wgpu<wgsl>)"
        ));
        assert!(emulates_gpu_on_cpu("Lavapipe (vulkan)"));
        assert!(!emulates_gpu_on_cpu("NVIDIA H100 80GB HBM3 (cuda)"));
        assert!(!emulates_gpu_on_cpu(
            "AMD Radeon RX 7900 XTX (RADV NAVI31) (wgpu<wgsl>)"
        ));
    }
}
