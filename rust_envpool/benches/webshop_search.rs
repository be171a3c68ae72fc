//! The search at catalogue scale, without Python: `cargo bench --bench webshop_search -- FOLDER
//! [CACHE] [--check]` loads the catalogue in `FOLDER` (through the index cache in `CACHE`, default
//! the one beside it) and searches the instructions of 1,000 goals of the 1k set in
//! `$WEBSHOP_DATA/data` (the queries `benchmarks/webshop_catalogue.py` uses): the pruned search's
//! and the exhaustive reference's median and p99 (best of 3 passes per query, after an untimed
//! pass); `--check` compares their hits on every query. For profiling, `perf record` the binary.

use std::path::PathBuf;
use std::time::Instant;

use pcsd_envpool::envs::webshop::{CachePolicy, GoalSet, Shop, ShopConfig, ShopFiles, Variant};

fn config(goals: GoalSet) -> ShopConfig {
    ShopConfig {
        goals,
        seed: 0,
        variant: Variant::Upstream,
        show_attrs: false,
        num_products: None,
    }
}

fn pct(v: &[f64], p: f64) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    s[((s.len() - 1) as f64 * p).round() as usize]
}

/// Per query, the best of `passes` timed runs of `f` (µs).
fn best_of(qs: &[String], passes: usize, f: impl Fn(&str)) -> Vec<f64> {
    let mut best = vec![f64::INFINITY; qs.len()];
    for _ in 0..passes {
        for (b, q) in best.iter_mut().zip(qs) {
            let t = Instant::now();
            f(q);
            *b = b.min(t.elapsed().as_secs_f64() * 1e6);
        }
    }
    best
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let check = args.iter().any(|a| a == "--check");
    let pos: Vec<&String> = args.iter().filter(|a| !a.starts_with("--")).collect();
    let Some(root) = std::env::var_os("WEBSHOP_DATA").map(PathBuf::from) else {
        eprintln!("skipped: WEBSHOP_DATA is not set (the shared webshop/ folder)");
        return;
    };
    let Some(folder) = pos.first().map(PathBuf::from) else {
        eprintln!("usage: cargo bench --bench webshop_search -- FOLDER [CACHE] [--check]");
        return;
    };
    let small = Shop::load(
        &ShopFiles::locate(&root.join("data")).unwrap(),
        config(GoalSet::Synthetic),
    )
    .unwrap();
    let step = (small.num_goals() / 1000).max(1);
    let qs: Vec<String> = (0..small.num_goals())
        .step_by(step)
        .take(1000)
        .map(|i| small.goal(i).instruction_text.to_lowercase())
        .collect();
    drop(small);
    let policy = pos
        .get(1)
        .map_or(CachePolicy::Default, |c| CachePolicy::Dir(PathBuf::from(c)));
    let t = Instant::now();
    let files = ShopFiles::locate(&folder.join("data"))
        .or_else(|_| ShopFiles::locate(&folder))
        .unwrap();
    let shop = Shop::open(&files, config(GoalSet::Synthetic), &policy).unwrap();
    println!(
        "{} products, loaded in {:.2} s (cache hit: {})",
        shop.catalog.len(),
        t.elapsed().as_secs_f64(),
        shop.cache.hit
    );
    let top = |q: &str| {
        std::hint::black_box(shop.index.search_top(q).unwrap());
    };
    let all = |q: &str| {
        std::hint::black_box(shop.index.search(q).unwrap());
    };
    if check {
        let differ = qs
            .iter()
            .filter(|q| shop.index.search_top(q).unwrap() != shop.index.search(q).unwrap().0)
            .count();
        println!("{differ} of {} queries differ", qs.len());
    }
    let pruned = best_of(&qs, 3, top);
    let exhaustive = best_of(&qs, if check { 1 } else { 0 }, all);
    println!(
        "pruned p50 {:.0} us p90 {:.0} us p99 {:.0} us mean {:.0} us",
        pct(&pruned, 0.5),
        pct(&pruned, 0.9),
        pct(&pruned, 0.99),
        pruned.iter().sum::<f64>() / pruned.len() as f64
    );
    if check {
        println!(
            "exhaustive p50 {:.0} us p99 {:.0} us",
            pct(&exhaustive, 0.5),
            pct(&exhaustive, 0.99)
        );
    }
}
