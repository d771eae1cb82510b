//! The device library's place in the [registry](crate::registry): its unit tests run by
//! `tessera verify devicelib`; it has no benchmark and no baselines.

use super::verify::{cases, verify_case};
use crate::error::Result;
use crate::harness::{BenchJob, VerifyJob};
use crate::registry::Operator;
use crate::runtime::{Arch, KernelSpec};

pub struct DeviceLibrary;

/// The registry entry.
pub static OPERATOR: DeviceLibrary = DeviceLibrary;

impl Operator for DeviceLibrary {
    fn name(&self) -> &'static str {
        "devicelib"
    }
    fn verify_jobs(&self, quick: bool) -> Vec<VerifyJob> {
        cases(quick)
            .into_iter()
            .map(|c| VerifyJob::new(c.name(), c, verify_case))
            .collect()
    }
    fn bench_jobs(&self, _quick: bool) -> Vec<BenchJob> {
        Vec::new()
    }
    fn kernel_specs(&self, arch: Arch) -> Vec<KernelSpec> {
        super::ci_specs_for(arch)
    }
    fn cpu_demo(&self, _seed: u64) -> Result<bool> {
        use super::reference::{e5m2_is_nan, e5m2_to_f32, f32_to_e5m2};
        // every finite e5m2 code decodes to a value that encodes back to the same code
        // (infinities saturate to the largest finite code by design, NaNs stay NaN)
        let round_trip = (0..=255u8)
            .filter(|&c| !e5m2_is_nan(c) && e5m2_to_f32(c).is_finite())
            .all(|c| f32_to_e5m2(e5m2_to_f32(c)) == c);
        println!(
            "\ndevicelib (CPU references of the device library's conversions): every finite e5m2 code round-trips: \
             {round_trip}; the GPU unit tests run with `tessera verify devicelib`"
        );
        Ok(round_trip)
    }
}
