//! Native WebShop steps by action kind, without Python: replays every upstream episode of
//! `$WEBSHOP_DATA/traces_public.jsonl.gz` (as `pcsd.bench env --webshop` does through the Python
//! API) and prints the median µs per action kind and per reset. `cargo bench --bench webshop
//! [-- REPEATS]`; for profiling, `perf record` the bench binary.

use std::collections::BTreeMap;
use std::io::BufRead;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

use pcsd_envpool::envs::webshop::{fuzz, reward, GoalSet, Shop, ShopConfig, ShopFiles, Variant};

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

fn main() {
    let repeats: usize = std::env::args().filter_map(|a| a.parse().ok()).next().unwrap_or(5);
    let Some(root) = std::env::var_os("WEBSHOP_DATA").map(PathBuf::from) else {
        eprintln!("skipped: WEBSHOP_DATA is not set (the shared webshop/ folder)");
        return;
    };
    let out = std::process::Command::new("gzip")
        .arg("-dc")
        .arg(root.join("traces_public.jsonl.gz"))
        .output()
        .expect("gzip");
    let eps: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(&l.unwrap()).unwrap())
        .filter(|e: &serde_json::Value| e["env_config"] != "verl")
        .collect();
    let files = ShopFiles::locate(&root.join("data")).unwrap();
    let mut shops: BTreeMap<String, Arc<Shop>> = BTreeMap::new();
    for (name, goals, show_attrs) in [
        ("upstream_synth", GoalSet::Synthetic, false),
        ("upstream_human", GoalSet::Human, false),
        ("upstream_attrs", GoalSet::Synthetic, true),
    ] {
        let config = ShopConfig {
            goals,
            seed: 0,
            variant: Variant::Upstream,
            show_attrs,
            num_products: None,
        };
        shops.insert(name.into(), Arc::new(Shop::load(&files, config).unwrap()));
    }
    // the long texts of every product: through their spans against the whole object parsed
    let cat = &shops["upstream_synth"].catalog;
    for (name, f) in [
        ("cold (spans)", &(|i| cat.cold(i)) as &dyn Fn(usize) -> _),
        ("cold (reference)", &|i| cat.cold_reference(i)),
    ] {
        let mut t = Vec::new();
        for _ in 0..repeats {
            for i in 0..cat.len() {
                let t0 = Instant::now();
                std::hint::black_box(f(i));
                t.push(t0.elapsed().as_secs_f64() * 1e6);
            }
        }
        println!("{name:>16} {:>8} {:>10.2}", cat.len(), median(&mut t));
    }
    // the reward of buying each goal's own product (no options chosen), and its fuzzy matching
    let shop = &shops["upstream_synth"];
    let (mut reward, mut fuzzy) = (Vec::new(), Vec::new());
    for _ in 0..repeats {
        for g in 0..shop.num_goals().min(2000) {
            let goal = shop.goal(g);
            let product = cat.by_asin[goal.asin.as_str()];
            let t0 = Instant::now();
            let r = reward::get_reward(cat, product, &goal, shop.prices[product], &[], &shop.nouns);
            reward.push(t0.elapsed().as_secs_f64() * 1e6);
            std::hint::black_box(r.unwrap());
            let t0 = Instant::now();
            for a in &goal.attributes {
                let pa = fuzz::full_process(a);
                for p in cat.product(product).processed_attributes().iter() {
                    std::hint::black_box(fuzz::token_set_ratio_above(p, &pa, 85));
                }
            }
            fuzzy.push(t0.elapsed().as_secs_f64() * 1e6);
        }
    }
    println!(
        "{:>16} {:>8} {:>10.2}",
        "get_reward",
        reward.len() / repeats,
        median(&mut reward)
    );
    println!(
        "{:>16} {:>8} {:>10.2}",
        "fuzzy attrs",
        fuzzy.len() / repeats,
        median(&mut fuzzy)
    );
    let mut times: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    for _ in 0..repeats {
        for ep in &eps {
            let mut env = shops[ep["env_config"].as_str().unwrap()].env();
            let t0 = Instant::now();
            let r = env.reset(ep["goal_index"].as_u64().unwrap() as usize);
            let dt = t0.elapsed().as_secs_f64() * 1e6;
            r.unwrap();
            times.entry("reset".into()).or_default().push(dt);
            for st in ep["steps"].as_array().unwrap() {
                let t0 = Instant::now();
                let r = env.step(st["action"].as_str().unwrap());
                let dt = t0.elapsed().as_secs_f64() * 1e6;
                if r.is_ok() {
                    times.entry(st["kind"].as_str().unwrap().into()).or_default().push(dt);
                }
            }
        }
    }
    println!("{:>16} {:>8} {:>10} {:>10}", "action", "steps", "median µs", "mean µs");
    for (k, v) in times.iter_mut() {
        let n = v.len() / repeats;
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        println!("{k:>16} {n:>8} {:>10.2} {mean:>10.2}", median(v));
    }
}
