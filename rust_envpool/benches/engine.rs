//! Native ALFWorld engine steps per CPU second without Python or the pool: the fast path against the plain
//! reference path (`AlfworldEnv::new_reference`) on the same games and command streams, and the
//! fast path over 128 and 1,024 envs stepped round-robin on one thread (the per-env working set
//! against the caches). `cargo bench --bench engine [-- SECONDS]`.
//!
//! Games: procedural games of the 6 task types (no data needed); with ALFWORLD_DATA set, the first
//! 64 shared games as well. Commands: seeded random admissible commands, one in eight hostile.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use pcsd_envpool::envs::alfworld::{AlfworldEnv, GameSpec};
use pcsd_envpool::envs::alfworld_gen::{generate, GenConfig, TaskType};
use pcsd_envpool::envs::TextEnv;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

fn procedural(n: usize) -> Vec<Arc<GameSpec>> {
    (0..n)
        .map(|i| {
            let text = generate(TaskType::ALL[i % 6], i as u64, &GenConfig::default()).unwrap();
            Arc::new(GameSpec::from_json_str(&text, &format!("gen{i}")).unwrap())
        })
        .collect()
}

fn shared(n: usize) -> Vec<Arc<GameSpec>> {
    let Some(root) = std::env::var_os("ALFWORLD_DATA").map(PathBuf::from) else {
        return vec![];
    };
    let Ok(manifest) = std::fs::read_to_string(root.join("MANIFEST.tsv")) else {
        return vec![];
    };
    manifest
        .lines()
        .skip(1)
        .filter_map(|l| l.split('\t').nth(2).map(|p| root.join("json_2.1.1").join(p)))
        .take(n)
        .map(|p| Arc::new(GameSpec::from_path(&p).unwrap()))
        .collect()
}

/// CPU seconds this thread has used (Linux `/proc/thread-self/stat`; wall time elsewhere), so
/// that a loaded machine changes the figures less.
fn cpu_seconds(wall: Instant) -> f64 {
    let ticks = std::fs::read_to_string("/proc/thread-self/stat").ok().and_then(|s| {
        let rest = &s[s.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split(' ').collect();
        Some(f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?)
    });
    match ticks {
        Some(t) => t / 100.0,
        None => wall.elapsed().as_secs_f64(),
    }
}

/// Steps per CPU second of `envs` played round-robin with random commands for `secs`.
fn rate(envs: &mut [AlfworldEnv], secs: f64, seed: u64) -> f64 {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut adm: Vec<Vec<String>> = envs.iter_mut().map(|e| e.reset().admissible).collect();
    let mut steps = 0usize;
    let t0 = Instant::now();
    let c0 = cpu_seconds(t0);
    while !steps.is_multiple_of(1024) || cpu_seconds(t0) - c0 < secs {
        for (e, a) in envs.iter_mut().zip(adm.iter_mut()) {
            let cmd = if rng.gen_ratio(1, 8) || a.is_empty() {
                "take the moon".to_string()
            } else {
                a[rng.gen_range(0..a.len())].clone()
            };
            let s = e.step(&cmd);
            *a = if s.done { e.reset().admissible } else { s.admissible };
            steps += 1;
        }
    }
    steps as f64 / (cpu_seconds(t0) - c0)
}

fn main() {
    let secs: f64 = std::env::args().filter_map(|a| a.parse().ok()).next().unwrap_or(2.0);
    // ENGINE_BENCH_ONLY_FAST=1: the fast path only (for profiling).
    let only_fast = std::env::var_os("ENGINE_BENCH_ONLY_FAST").is_some();
    let mut sets = vec![("procedural", procedural(36))];
    let s = shared(64);
    if !s.is_empty() {
        sets.push(("shared", s));
    }
    println!(
        "{:>10} {:>6} {:>14} {:>14} {:>8}",
        "games", "envs", "ref/cpu-s", "fast/cpu-s", "fast/ref"
    );
    for (name, specs) in &sets {
        for n in [128usize, 1024] {
            let mut fast: Vec<AlfworldEnv> = (0..n)
                .map(|i| AlfworldEnv::new(specs[i % specs.len()].clone(), 50))
                .collect();
            let r_fast = rate(&mut fast, secs, 1);
            drop(fast);
            if only_fast {
                println!("{name:>10} {n:>6} {:>14} {r_fast:>14.0}", "-");
                continue;
            }
            let mut reference: Vec<AlfworldEnv> = (0..n)
                .map(|i| AlfworldEnv::new_reference(specs[i % specs.len()].clone(), 50))
                .collect();
            let r_ref = rate(&mut reference, secs, 1);
            println!("{name:>10} {n:>6} {r_ref:>14.0} {r_fast:>14.0} {:>8.2}", r_fast / r_ref);
        }
    }
}
