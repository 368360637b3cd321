//! The simulation's configuration: [`SimConfig`], its defaults and the `SYMM_SIM_*`
//! environment variables that set it.

/// How a simulation runs; every choice that changes an execution is derived from `seed`.
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// The seed of every random choice (`SYMM_SIM_SEED`; printed in every failure report).
    pub seed: u64,
    /// Streaming multiprocessors of each simulated device (`SYMM_SIM_SMS`; default 132, an
    /// H100 SXM). Residency is counted per device.
    pub sms: u32,
    /// Registers per thread assumed for every kernel when computing residency
    /// (`SYMM_SIM_REGS`; default 80).
    pub registers_per_thread: u32,
    /// Model weak memory (`SYMM_SIM_WEAK=1`): relaxed, volatile and plain loads may read
    /// older stores that coherence allows.
    pub weak_memory: bool,
    /// With weak memory, report data races — a plain access and a conflicting access of
    /// another thread not ordered by happens-before — as faults (`SYMM_SIM_RACES`, default
    /// on; `0` turns it off).
    pub races: bool,
    /// Virtual nanoseconds a GPU thread waits for a load (or atomic) from host memory
    /// ([`AddressSpace::map_host`]), a round trip across PCIe (`SYMM_SIM_HOST_READ_NS`;
    /// default 0: free, as every other access).
    ///
    /// [`AddressSpace::map_host`]: crate::AddressSpace::map_host
    pub host_read_ns: u64,
    /// Virtual nanoseconds each such read holds the device's one PCIe link: reads from many
    /// threads queue behind each other (`SYMM_SIM_HOST_READ_GAP_NS`; default 0).
    pub host_read_gap_ns: u64,
}

impl Default for SimConfig {
    /// Seed 0, 132 SMs, 80 registers per thread, sequentially consistent memory.
    fn default() -> SimConfig {
        SimConfig {
            seed: 0,
            sms: 132,
            registers_per_thread: 80,
            weak_memory: false,
            races: true,
            host_read_ns: 0,
            host_read_gap_ns: 0,
        }
    }
}

impl SimConfig {
    /// The configuration from the `SYMM_SIM_*` environment variables (defaults where unset;
    /// a fresh random seed when `SYMM_SIM_SEED` is unset).
    pub fn from_env() -> SimConfig {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.trim().is_empty());
        let num = |v: &str| env_number(v);
        let d = SimConfig::default();
        SimConfig {
            seed: var("SYMM_SIM_SEED")
                .and_then(|v| num(&v))
                .unwrap_or_else(random_seed),
            sms: var("SYMM_SIM_SMS")
                .and_then(|v| num(&v))
                .map_or(d.sms, |v| v.clamp(1, 1 << 16) as u32),
            registers_per_thread: var("SYMM_SIM_REGS")
                .and_then(|v| num(&v))
                .map_or(d.registers_per_thread, |v| v.clamp(1, 255) as u32),
            weak_memory: var("SYMM_SIM_WEAK").is_some_and(|v| {
                matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "1" | "true" | "yes" | "on"
                )
            }),
            races: var("SYMM_SIM_RACES").is_none_or(|v| {
                !matches!(
                    v.trim().to_ascii_lowercase().as_str(),
                    "0" | "false" | "no" | "off"
                )
            }),
            host_read_ns: var("SYMM_SIM_HOST_READ_NS")
                .and_then(|v| num(&v))
                .map_or(d.host_read_ns, |v| v.min(1 << 32)),
            host_read_gap_ns: var("SYMM_SIM_HOST_READ_GAP_NS")
                .and_then(|v| num(&v))
                .map_or(d.host_read_gap_ns, |v| v.min(1 << 32)),
        }
    }
}

/// A number as `SYMM_SIM_*` variables spell it: decimal or `0x` hexadecimal.
fn env_number(v: &str) -> Option<u64> {
    let v = v.trim();
    match v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        Some(h) => u64::from_str_radix(h, 16).ok(),
        None => v.parse().ok(),
    }
}

/// A seed nobody chose: the time, the process id and std's per-process hash keys.
fn random_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos()),
    );
    h.write_u32(std::process::id());
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn environment_numbers_are_decimal_or_hex() {
        assert_eq!(env_number("42"), Some(42));
        assert_eq!(env_number(" 0x2A "), Some(42));
        assert_eq!(env_number("0XfFfF"), Some(0xFFFF));
        assert_eq!(env_number("nope"), None);
        assert_eq!(env_number("18446744073709551615"), Some(u64::MAX));
    }
}
