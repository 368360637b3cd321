//! `symm-perf clc`: the work-stealing benchmark. For each imbalance, the fixed grid, then
//! stealing with the software source for every policy, then (on an sm_100 GPU) hardware CLC
//! for every policy: median time, speed-up over the fixed grid, tiles per block
//! (min/median/max over blocks that ran any), steals, and the exactly-once check.

use symm_device::scheduler::workload::{LINEAR_SKEW, ONE_HEAVY_IN_64, POLICIES, UNIFORM};
use symm_perf::work_stealing::{self, Config, Variant};

pub const USAGE: &str = "usage: symm-perf clc [-t tiles] [-i uniform|skew|heavy|all] \
[-p policy|all] [-n iters] [-k work-iterations] [-r prologue-iterations] [-x threads] [-d device] \
[-c cluster-size (hardware clustered greedy; 1: skip)]";

/// Run the benchmark; `Ok(false)` when a tile did not run exactly once.
pub fn main(args: &[String]) -> Result<bool, String> {
    let mut config = Config {
        tiles: 4096,
        imbalance: UNIFORM,
        work_iterations: 2000,
        prologue_iterations: 20_000,
        threads: 128,
        iterations: 10,
        device: 0,
    };
    let mut imbalances = vec![UNIFORM, LINEAR_SKEW, ONE_HEAVY_IN_64];
    let mut cluster = 2;
    let mut policies: Vec<&'static str> = POLICIES.to_vec();
    let mut rest = args.iter();
    while let Some(flag) = rest.next() {
        let value = rest
            .next()
            .ok_or_else(|| format!("{flag} needs a value\n{USAGE}"))?;
        let number = || {
            value
                .parse::<u32>()
                .map_err(|_| format!("bad value {value:?} for {flag}"))
        };
        match flag.as_str() {
            "-t" => config.tiles = number()?,
            "-n" => config.iterations = number()? as usize,
            "-k" => config.work_iterations = number()?,
            "-r" => config.prologue_iterations = number()?,
            "-x" => config.threads = number()?,
            "-d" => config.device = number()? as i32,
            "-c" => cluster = number()?,
            "-i" => {
                imbalances = match value.as_str() {
                    "uniform" => vec![UNIFORM],
                    "skew" => vec![LINEAR_SKEW],
                    "heavy" => vec![ONE_HEAVY_IN_64],
                    "all" => imbalances,
                    _ => return Err(format!("unknown imbalance {value:?}\n{USAGE}")),
                }
            }
            "-p" => {
                policies = match POLICIES.iter().find(|p| **p == value.as_str()) {
                    Some(p) => vec![*p],
                    None if value == "all" => policies,
                    None => {
                        return Err(format!("unknown policy {value:?}; policies: {POLICIES:?}"));
                    }
                }
            }
            _ => return Err(format!("unknown option {flag}\n{USAGE}")),
        }
    }
    let backend = symm::internals::select_backend().map_err(|e| e.message)?;
    println!(
        "# symm-perf clc: {} tiles x {} threads, work {} iterations/unit, prologue {} iterations, backend {}, median of {} launches",
        config.tiles,
        config.threads,
        config.work_iterations,
        config.prologue_iterations,
        backend.kind().name(),
        config.iterations
    );
    let mut all_once = true;
    for imbalance in imbalances {
        config.imbalance = imbalance;
        let name = ["uniform", "linear skew", "one heavy in 64"][imbalance as usize];
        println!("# imbalance: {name}");
        println!(
            "# {:<46} {:>12} {:>9} {:>18} {:>8} {:>6}",
            "variant", "time(us)", "vs fixed", "tiles/block", "steals", "once"
        );
        let mut fixed_us = None;
        let variants = std::iter::once(Variant::FixedGrid)
            .chain(policies.iter().map(|p| Variant::Software(p)))
            .chain(policies.iter().map(|p| Variant::Hardware(p)))
            .chain(
                (cluster > 1 && policies.contains(&"greedy"))
                    .then_some(Variant::HardwareClustered { cluster }),
            );
        for variant in variants {
            match work_stealing::run(&backend, variant, &config) {
                Ok(report) => {
                    let mut tiles = report.tiles_per_block.clone();
                    tiles.sort_unstable();
                    let spread = format!(
                        "{}/{}/{}",
                        tiles.first().unwrap_or(&0),
                        tiles.get(tiles.len() / 2).unwrap_or(&0),
                        tiles.last().unwrap_or(&0)
                    );
                    let base = *fixed_us.get_or_insert(report.time_us);
                    all_once &= report.exactly_once;
                    println!(
                        "  {:<46} {:>12.1} {:>8.2}x {:>18} {:>8} {:>6}",
                        variant.ptx_name(),
                        report.time_us,
                        base / report.time_us,
                        spread,
                        report.steals,
                        if report.exactly_once { "yes" } else { "NO" }
                    );
                }
                Err(e) if work_stealing::is_unsupported(&e) => {
                    println!("  {:<46} unsupported: {}", variant.ptx_name(), e.message);
                    if variant.is_hardware() {
                        break;
                    }
                }
                Err(e) => return Err(format!("{}: {}", variant.ptx_name(), e.message)),
            }
        }
    }
    Ok(all_once)
}
