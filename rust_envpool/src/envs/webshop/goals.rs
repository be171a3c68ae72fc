//! Goals (`get_synthetic_goals` / `get_human_goals`) and their order: price uppers drawn with
//! `random.sample` of the first four multiples of ten above the price, the list shuffled with
//! CPython's `random.shuffle` (seed 233 upstream, the env seed in the verl-agent copy).
//!
//! A shop keeps each goal as a [`GoalRef`] (its product, which option combination or human
//! instruction, the price bound and the weight: 32 bytes) and makes the [`Goal`] with its texts
//! when an env starts it ([`GoalRef::goal`]): the full catalogue has some 8 M synthetic goals,
//! whose texts would take several GB.

use super::catalog::{Catalog, GoalOptions, ProductRef, StrList};
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
fn price_upper(price: f64, rng: &mut PyRandom) -> (f64, bool) {
    let range: Vec<f64> = (1..100)
        .map(|i| 10.0 * i as f64)
        .filter(|&p| p > price)
        .take(4)
        .collect();
    if range.len() >= 2 {
        let idx = rng.sample_indices(range.len(), 2);
        (range[idx[0]].max(range[idx[1]]), false)
    } else {
        (1_000_000.0, true)
    }
}

/// One goal as a shop keeps it; [`GoalRef::goal`] makes the full [`Goal`].
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GoalRef {
    /// The product's index in the catalogue.
    pub product: u32,
    /// Synthetic: the option combination (mixed radix over the option names sorted, the last
    /// varying fastest, as `itertools.product` orders them); human: the instruction's index.
    pub sub: u32,
    pub price_upper: f64,
    pub weight: f64,
    pub human: bool,
    pub price_upper_is_int: bool,
}

/// A product's options with their names sorted (the goals' order).
fn sorted_options(p: ProductRef<'_>) -> Vec<(&str, StrList<'_>)> {
    let mut names: Vec<(&str, StrList<'_>)> = p.options().collect();
    names.sort_by(|a, b| a.0.cmp(b.0));
    names
}

fn price_text(upper: f64, is_int: bool) -> String {
    if is_int {
        String::new()
    } else if upper.fract() == 0.0 && upper.abs() < 1e15 {
        // the bounds are multiples of ten: `{:.2}` of a whole number, without float formatting
        format!(", and price lower than {}.00 dollars", upper as i64)
    } else {
        format!(", and price lower than {upper:.2} dollars")
    }
}

impl GoalRef {
    /// The goal with the fields of the original's goal dict.
    pub fn goal(&self, catalog: &Catalog) -> Goal {
        let p = catalog.product(self.product as usize);
        let (instruction_text, attributes, goal_options, weight_is_int) = if self.human {
            let h = p
                .human()
                .and_then(|mut list| list.nth(self.sub as usize))
                .expect("a human goal's product has that human instruction");
            let text = format!(
                "{}{}",
                h.instruction.trim_matches('.'),
                price_text(self.price_upper, self.price_upper_is_int)
            );
            (text, h.instruction_attributes.to_vec(), h.instruction_options(), true)
        } else {
            let names = sorted_options(p);
            let mut k = self.sub as usize;
            let mut picked: Vec<(String, String)> = vec![(String::new(), String::new()); names.len()];
            for (slot, (name, values)) in picked.iter_mut().zip(&names).rev() {
                let v = values.iter().nth(k % values.len()).expect("a value of the combination");
                *slot = (name.to_string(), v.to_string());
                k /= values.len();
            }
            // a dict: a repeated name (impossible after the loader) keeps its first slot
            let mut opts: Vec<(String, String)> = Vec::new();
            for (k, v) in picked {
                if let Some(slot) = opts.iter_mut().find(|(n, _)| *n == k) {
                    slot.1 = v;
                } else {
                    opts.push((k, v));
                }
            }
            let text: Vec<String> = opts.iter().map(|(k, v)| format!("{k}: {v}")).collect();
            let option_text = if text.is_empty() {
                String::new()
            } else {
                format!(" with {}", text.join(", and "))
            };
            let instruction = p.instruction_text().unwrap_or("");
            let text = format!(
                "{instruction}{option_text}{}",
                price_text(self.price_upper, self.price_upper_is_int)
            );
            (
                text,
                p.instruction_attributes().map(|l| l.to_vec()).unwrap_or_default(),
                GoalOptions::Dict(opts),
                false,
            )
        };
        Goal {
            asin: p.asin().to_string(),
            category: p.category().to_string(),
            query: p.query().to_string(),
            name: p.title().to_string(),
            product_category: p.product_category().to_string(),
            instruction_text,
            attributes,
            price_upper: self.price_upper,
            price_upper_is_int: self.price_upper_is_int,
            goal_options,
            weight: self.weight,
            weight_is_int,
        }
    }
}

/// The goals in the original's pre-shuffle order: one price bound drawn per product (with an
/// instruction / per kept human instruction), in product order; a synthetic goal per option
/// combination, weighted as the catalogue computed ([`super::catalog::ProdRec::weight`]).
pub fn build_goals(catalog: &Catalog, prices: &[f64], set: GoalSet, rng: &mut PyRandom) -> Vec<GoalRef> {
    let mut goals = Vec::new();
    for (pi, &price) in prices.iter().enumerate().take(catalog.len()) {
        let p = catalog.product(pi);
        match set {
            GoalSet::Synthetic => {
                if p.instruction_text().is_none() {
                    continue;
                }
                let (upper, is_int) = price_upper(price, rng);
                let rec = p.record();
                for combo in 0..rec.combos {
                    goals.push(GoalRef {
                        product: pi as u32,
                        sub: combo,
                        price_upper: upper,
                        weight: rec.weight,
                        human: false,
                        price_upper_is_int: is_int,
                    });
                }
            }
            GoalSet::Human => {
                let Some(list) = p.human() else { continue };
                for (hi, h) in list.enumerate() {
                    if h.instruction_attributes.is_empty() {
                        continue;
                    }
                    let (upper, is_int) = price_upper(price, rng);
                    goals.push(GoalRef {
                        product: pi as u32,
                        sub: hi as u32,
                        price_upper: upper,
                        weight: 1.0,
                        human: true,
                        price_upper_is_int: is_int,
                    });
                }
            }
        }
    }
    goals
}
