//! The purchase reward (`goal.get_reward`): attributes, options, price and the type factor from
//! the product names' nouns (a table made with spaCy on the original, shipped as data).

use std::collections::{HashMap, HashSet};

use super::catalog::{GoalOptions, Product};
use super::fuzz::{full_process, token_set_ratio_args, token_set_ratio_processed, FuzzArg};
use super::goals::Goal;
use super::pytext::py_strip;

/// `normalize.COLOR_SET`, in its order (the first contained colour wins).
pub const COLOR_SET: &[&str] = &[
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure", "banana", "beige", "black", "blue", "blush",
    "bordeaux", "bronze", "brown", "burgundy", "camel", "camo", "caramel", "champagne", "charcoal", "cheetah",
    "chestnut", "chocolate", "christmas", "coffee", "cognac", "copper", "coral", "cranberry", "cream",
    "crystal", "dark", "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite", "grape",
    "graphite", "grass", "gray", "green", "grey", "heather", "indigo", "ivory", "ivy", "khaki", "lavender",
    "lemon", "leopard", "light", "lilac", "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint",
    "mocha", "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive", "orange", "peach",
    "pewter", "pink", "plum", "purple", "rainbow", "red", "rose", "royal", "rust", "sand", "sapphire",
    "seashell", "silver", "skull", "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe",
    "teal", "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
];

/// `normalize_color` on a string (substring test) or a tuple (element test).
fn normalize_color<'a>(x: FuzzArg<'a>) -> FuzzArg<'a> {
    for c in COLOR_SET {
        let hit = match &x {
            FuzzArg::Str(s) => s.contains(*c),
            FuzzArg::Pair(a, b) => a == c || b == c,
        };
        if hit {
            return FuzzArg::Str(c);
        }
    }
    x
}

/// The nouns of product names (`[t.text.lower() for t in nlp(name) if t.pos_ in (PNOUN, NOUN,
/// PROPN)]`), by name.
pub type NounTable = HashMap<String, Vec<String>>;

/// What `get_reward(..., verbose=True)` reports.
#[derive(Clone, Debug, PartialEq)]
pub struct RewardInfo {
    pub reward: f64,
    pub r_type: f64,
    pub r_att: f64,
    pub w_att: f64,
    pub query_match: bool,
    pub category_match: bool,
    pub title_score: f64,
    pub r_option: Option<f64>,
    pub w_option: Option<f64>,
    pub r_price: bool,
    pub w_price: f64,
}

/// A name missing from the noun table.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MissingNouns(pub String);

fn type_reward(
    purchased: &Product,
    goal: &Goal,
    nouns: &NounTable,
) -> Result<(f64, bool, bool, f64), MissingNouns> {
    let query_match = purchased.query == goal.query;
    let split = |s: &str| -> HashSet<String> { s.split('›').map(|x| py_strip(x).to_string()).collect() };
    let pc = split(&purchased.product_category);
    let gc = split(&goal.product_category);
    let category_match = pc.intersection(&gc).count() >= 2;
    let p_nouns = nouns.get(&purchased.title).ok_or_else(|| MissingNouns(purchased.title.clone()))?;
    let g_nouns = nouns.get(&goal.name).ok_or_else(|| MissingNouns(goal.name.clone()))?;
    let ps: HashSet<&String> = p_nouns.iter().collect();
    let gs: HashSet<&String> = g_nouns.iter().collect();
    let n_inter = ps.intersection(&gs).count();
    let title_score = if g_nouns.is_empty() { 0.2 } else { n_inter as f64 / g_nouns.len() as f64 };
    let mut r_type = 1.0;
    if !(query_match || category_match || title_score > 0.2) {
        r_type = 0.5;
    }
    if title_score < 0.1 {
        r_type = 0.1;
    }
    if title_score == 0.0 {
        r_type = 0.0;
    }
    Ok((r_type, query_match, category_match, title_score))
}

fn attribute_matches(purchased: &Product, goal: &Goal) -> usize {
    let (title, bullets, desc) = purchased.lowered_texts();
    let mut n = 0;
    let processed = purchased.processed_attributes();
    for g in &goal.attributes {
        let pg = full_process(g);
        let matched = processed.iter().any(|p| token_set_ratio_processed(p, &pg) > 85);
        if matched || title.contains(g.as_str()) || bullets.contains(g.as_str()) || desc.contains(g.as_str()) {
            n += 1;
        }
    }
    n
}

fn option_matches(chosen: &[(String, String)], goal: &GoalOptions) -> usize {
    let purchased: Vec<FuzzArg<'_>> = chosen.iter().map(|(_, v)| normalize_color(FuzzArg::Str(v))).collect();
    let goal_opts: Vec<FuzzArg<'_>> = match goal {
        GoalOptions::Dict(d) => d.iter().map(|(k, v)| normalize_color(FuzzArg::Pair(k, v))).collect(),
        GoalOptions::List(l) => l.iter().map(|v| normalize_color(FuzzArg::Str(v))).collect(),
    };
    goal_opts
        .iter()
        .filter(|g| purchased.iter().any(|p| token_set_ratio_args(p, g) > 85))
        .count()
}

/// `get_reward(purchased_product, goal, price, options, verbose=True)`.
pub fn get_reward(
    purchased: &Product,
    goal: &Goal,
    price: f64,
    options: &[(String, String)],
    nouns: &NounTable,
) -> Result<RewardInfo, MissingNouns> {
    let (r_type, query_match, category_match, title_score) = type_reward(purchased, goal, nouns)?;
    let r_price = price <= goal.price_upper;
    let n_att = attribute_matches(purchased, goal);
    let n_opt = option_matches(options, &goal.goal_options);
    let n_goal_att = goal.attributes.len();
    let n_goal_opt = goal.goal_options.len();
    let denom = (n_goal_att + n_goal_opt + 1) as f64;
    let total = (n_att + n_opt + r_price as usize) as f64 / denom * r_type;
    Ok(RewardInfo {
        reward: total,
        r_type,
        r_att: n_att as f64 / n_goal_att as f64,
        w_att: n_goal_att as f64 / denom,
        query_match,
        category_match,
        title_score,
        r_option: (n_goal_opt > 0).then(|| n_opt as f64 / n_goal_opt as f64),
        w_option: (n_goal_opt > 0).then(|| n_goal_opt as f64 / denom),
        r_price,
        w_price: 1.0 / denom,
    })
}
