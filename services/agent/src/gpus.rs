//! GPU discovery: which GPU indices a node agent hands out when none are
//! configured. Through NVML when the agent is built with the `nvml` feature
//! and a driver is present; never required (`--gpus` is always enough).
//!
//! Must never: make a driver a requirement of the agent, or guess indices.

/// The node's GPUs as NVML counts them: indices `0..count` and the first
/// device's name (a flavor hint), or why they cannot be had.
#[cfg(feature = "nvml")]
pub fn discover() -> Result<(Vec<u32>, String), String> {
    let nvml = nvml_wrapper::Nvml::init().map_err(|e| format!("NVML: {e}"))?;
    let count = nvml
        .device_count()
        .map_err(|e| format!("NVML device count: {e}"))?;
    if count == 0 {
        return Err("NVML found no GPU".into());
    }
    let name = nvml
        .device_by_index(0)
        .and_then(|d| d.name())
        .unwrap_or_default();
    Ok(((0..count).collect(), name))
}

/// Without the `nvml` feature there is nothing to ask.
#[cfg(not(feature = "nvml"))]
pub fn discover() -> Result<(Vec<u32>, String), String> {
    Err("this agent was built without GPU discovery (cargo feature `nvml`)".into())
}

/// A flavor name from a device name: `NVIDIA H200` → `nvidia-h200`.
pub fn flavor_from_name(name: &str) -> String {
    name.split_whitespace()
        .map(str::to_ascii_lowercase)
        .collect::<Vec<_>>()
        .join("-")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_names_become_flavors() {
        assert_eq!(flavor_from_name("NVIDIA H200"), "nvidia-h200");
        assert_eq!(
            flavor_from_name("  Tesla  V100-SXM2-16GB "),
            "tesla-v100-sxm2-16gb"
        );
    }
}
