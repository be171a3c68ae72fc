//! Goals (`get_synthetic_goals` / `get_human_goals`) and their order: price uppers drawn with
//! `random.sample` of the first four multiples of ten above the price, the list shuffled with
//! CPython's `random.shuffle` (seed 233 upstream, the env seed in the verl-agent copy).

use std::collections::HashMap;

use super::catalog::{Catalog, GoalOptions};
use super::pyrandom::PyRandom;

/// One goal, with the fields of the original's goal dict.
#[derive(Clone, Debug, PartialEq)]
pub struct Goal {
    pub asin: String,
    pub category: String,
    pub query: String,
    pub name: String,
    pub product_category: String,
    pub instruction_text: String,
    pub attributes: Vec<String>,
    pub price_upper: f64,
    /// `price_upper` is the int 1000000 (no price range) rather than a float.
    pub price_upper_is_int: bool,
    pub goal_options: GoalOptions,
    pub weight: f64,
    /// Human goals have the int weight 1.
    pub weight_is_int: bool,
}

/// Which goals a shop plays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GoalSet {
    Synthetic,
    Human,
}

/// `price_range = [p for p in PRICE_RANGE if p > price][:4]`; two of them sampled, the larger
/// is the upper bound; fewer than two -> 1000000 and no price text.
fn price_upper(price: f64, rng: &mut PyRandom) -> (f64, bool, String) {
    let range: Vec<f64> = (1..100).map(|i| 10.0 * i as f64).filter(|&p| p > price).take(4).collect();
    if range.len() >= 2 {
        let idx = rng.sample_indices(range.len(), 2);
        let upper = range[idx[0]].max(range[idx[1]]);
        (upper, false, format!(", and price lower than {upper:.2} dollars"))
    } else {
        (1_000_000.0, true, String::new())
    }
}

/// The goals in the original's pre-shuffle order.
pub fn build_goals(catalog: &Catalog, prices: &[f64], set: GoalSet, rng: &mut PyRandom) -> Vec<Goal> {
    let mut goals = Vec::new();
    match set {
        GoalSet::Synthetic => {
            let mut cnt: HashMap<String, usize> = HashMap::new();
            for (pi, p) in catalog.products.iter().enumerate() {
                let Some(instruction) = &p.instruction_text else { continue };
                let attributes = p.instruction_attributes.clone().unwrap_or_default();
                let (upper, is_int, price_text) = price_upper(prices[pi], rng);
                // options: names sorted, cartesian product of their values
                let mut names: Vec<&(String, Vec<String>)> = p.options.iter().collect();
                names.sort_by(|a, b| a.0.cmp(&b.0));
                let mut combos: Vec<Vec<(String, String)>> = vec![Vec::new()];
                for (name, values) in &names {
                    let mut next = Vec::with_capacity(combos.len() * values.len());
                    for c in &combos {
                        for v in values {
                            let mut c2 = c.clone();
                            c2.push((name.clone(), v.clone()));
                            next.push(c2);
                        }
                    }
                    combos = next;
                }
                for combo in combos {
                    // a dict: a repeated name (impossible after the loader) keeps its first slot
                    let mut opts: Vec<(String, String)> = Vec::new();
                    for (k, v) in combo {
                        if let Some(slot) = opts.iter_mut().find(|(n, _)| *n == k) {
                            slot.1 = v;
                        } else {
                            opts.push((k, v));
                        }
                    }
                    let text: Vec<String> = opts.iter().map(|(k, v)| format!("{k}: {v}")).collect();
                    let option_text = if text.is_empty() { String::new() } else { format!(" with {}", text.join(", and ")) };
                    for a in &attributes {
                        *cnt.entry(a.clone()).or_insert(0) += 1;
                    }
                    goals.push(Goal {
                        asin: p.asin.clone(),
                        category: p.category.clone(),
                        query: p.query.clone(),
                        name: p.title.clone(),
                        product_category: p.product_category.clone(),
                        instruction_text: format!("{instruction}{option_text}{price_text}"),
                        attributes: attributes.clone(),
                        price_upper: upper,
                        price_upper_is_int: is_int,
                        goal_options: GoalOptions::Dict(opts),
                        weight: 0.0,
                        weight_is_int: false,
                    });
                }
            }
            for g in &mut goals {
                let s: f64 = g.attributes.iter().map(|a| 1.0 / cnt[a.as_str()] as f64).sum();
                g.weight = s / g.attributes.len() as f64;
            }
        }
        GoalSet::Human => {
            for (pi, p) in catalog.products.iter().enumerate() {
                let Some(list) = &p.human else { continue };
                for h in list {
                    if h.instruction_attributes.is_empty() {
                        continue;
                    }
                    let (upper, is_int, price_text) = price_upper(prices[pi], rng);
                    goals.push(Goal {
                        asin: p.asin.clone(),
                        category: p.category.clone(),
                        query: p.query.clone(),
                        name: p.title.clone(),
                        product_category: p.product_category.clone(),
                        instruction_text: format!("{}{}", h.instruction.trim_matches('.'), price_text),
                        attributes: h.instruction_attributes.clone(),
                        price_upper: upper,
                        price_upper_is_int: is_int,
                        goal_options: h.instruction_options.clone(),
                        weight: 1.0,
                        weight_is_int: true,
                    });
                }
            }
        }
    }
    goals
}
