//! Native pool throughput without Python: the threaded `EnvPool` (sync and async) against the
//! sequential reference on the dummy env. `cargo bench --bench pool [-- SECONDS]`.
//! (A plain harness: the pool's calls take milliseconds, so no statistics crate is needed.)

use std::time::Instant;

use pcsd_envpool::envs::dummy::{DummyConfig, DummyEnv};
use pcsd_envpool::envs::TextEnv;
use pcsd_envpool::pool::reference::SequentialPool;
use pcsd_envpool::pool::{EnvFactory, EnvPool, PoolConfig};

fn factories(n: usize, busy_iters: u64) -> Vec<EnvFactory> {
    (0..n)
        .map(|g| {
            let cfg = DummyConfig {
                seed: g as u64,
                episode_len: 20,
                busy_iters,
                panic_at_step: None,
            };
            Box::new(move || Box::new(DummyEnv::new(cfg.clone())) as Box<dyn TextEnv>) as EnvFactory
        })
        .collect()
}

/// Env steps per second of `f` (returns the env steps it made), run for `secs`.
fn rate(secs: f64, mut f: impl FnMut() -> usize) -> f64 {
    f();
    let t0 = Instant::now();
    let mut steps = 0;
    while t0.elapsed().as_secs_f64() < secs {
        steps += f();
    }
    steps as f64 / t0.elapsed().as_secs_f64()
}

fn main() {
    let secs: f64 = std::env::args().filter_map(|a| a.parse().ok()).next().unwrap_or(1.0);
    println!(
        "{:>6} {:>6} {:>4} {:>14} {:>14} {:>14}",
        "busy", "envs", "thr", "reference/s", "sync/s", "async/s"
    );
    for busy in [0u64, 5000] {
        for n in [128usize, 1024, 4096] {
            let ids: Vec<i64> = (0..n as i64).collect();
            let acts = vec!["go north".to_string(); n];
            let cfg = |t| PoolConfig {
                num_threads: t,
                group_size: 1,
                max_steps: 0,
                auto_reset: true,
                string_ids: false,
            };
            let mut seq = SequentialPool::new(factories(n, busy), cfg(1)).unwrap();
            let r_ref = rate(secs, || seq.step(acts.clone(), &ids).unwrap().len());
            for t in [1usize, 2] {
                let mut pool = EnvPool::new(factories(n, busy), cfg(t)).unwrap();
                let r_sync = rate(secs, || pool.step(acts.clone(), &ids).unwrap().len());
                pool.send_reset(&ids).unwrap();
                let half = (n / 2).max(1);
                let r_async = rate(secs, || {
                    let mut done = 0;
                    while done < n {
                        let b = pool.recv(half).unwrap();
                        let got: Vec<i64> = b.iter().map(|r| r.env_id).collect();
                        pool.send(vec!["go north".to_string(); got.len()], &got).unwrap();
                        done += got.len();
                    }
                    done
                });
                println!("{busy:>6} {n:>6} {t:>4} {r_ref:>14.0} {r_sync:>14.0} {r_async:>14.0}");
            }
        }
    }
}
