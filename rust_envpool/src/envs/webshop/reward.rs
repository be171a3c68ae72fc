//! The purchase reward (`goal.get_reward`): attributes, options, price and the type factor from
//! the product names' nouns (a table made with spaCy, `pcsd-data webshop` builds it).

use std::path::Path;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, Visitor};
use serde::Deserialize;

use super::catalog::{Catalog, CatalogView, GoalOptions, ProductRef};
use super::fuzz::{full_process, token_set_ratio_above, token_set_ratio_above_prepared, FuzzArg, Prepared};
use super::goals::Goal;
use super::image::{Image, Parts, Sec};
use super::pytext::py_strip;

/// `normalize.COLOR_SET`, in its order (the first contained colour wins).
pub const COLOR_SET: &[&str] = &[
    "alabaster",
    "apricot",
    "aqua",
    "ash",
    "asphalt",
    "azure",
    "banana",
    "beige",
    "black",
    "blue",
    "blush",
    "bordeaux",
    "bronze",
    "brown",
    "burgundy",
    "camel",
    "camo",
    "caramel",
    "champagne",
    "charcoal",
    "cheetah",
    "chestnut",
    "chocolate",
    "christmas",
    "coffee",
    "cognac",
    "copper",
    "coral",
    "cranberry",
    "cream",
    "crystal",
    "dark",
    "denim",
    "eggplant",
    "elephant",
    "espresso",
    "fuchsia",
    "gold",
    "granite",
    "grape",
    "graphite",
    "grass",
    "gray",
    "green",
    "grey",
    "heather",
    "indigo",
    "ivory",
    "ivy",
    "khaki",
    "lavender",
    "lemon",
    "leopard",
    "light",
    "lilac",
    "lime",
    "magenta",
    "maroon",
    "mauve",
    "merlot",
    "midnight",
    "mint",
    "mocha",
    "multicolor",
    "mushroom",
    "mustard",
    "natural",
    "navy",
    "nude",
    "olive",
    "orange",
    "peach",
    "pewter",
    "pink",
    "plum",
    "purple",
    "rainbow",
    "red",
    "rose",
    "royal",
    "rust",
    "sand",
    "sapphire",
    "seashell",
    "silver",
    "skull",
    "slate",
    "steel",
    "stone",
    "stonewash",
    "sunflower",
    "tan",
    "taupe",
    "teal",
    "tiger",
    "turquoise",
    "violet",
    "walnut",
    "wheat",
    "white",
    "wine",
    "yellow",
];

/// The ASCII letters of a string as bits (a to z; other bytes set bit 26).
const fn letter_mask(s: &str) -> u32 {
    let b = s.as_bytes();
    let (mut m, mut i) = (0u32, 0);
    while i < b.len() {
        m |= if b[i].is_ascii_lowercase() {
            1 << (b[i] - b'a')
        } else {
            1 << 26
        };
        i += 1;
    }
    m
}

/// [`letter_mask`] of each colour of [`COLOR_SET`].
static COLOR_MASKS: [u32; COLOR_SET.len()] = {
    let mut out = [0u32; COLOR_SET.len()];
    let mut i = 0;
    while i < COLOR_SET.len() {
        out[i] = letter_mask(COLOR_SET[i]);
        i += 1;
    }
    out
};

/// `normalize_color`: [`normalize_color_reference`] with the colours whose letters a string
/// lacks passed over (a colour holds only a to z, so it cannot be a substring of such a string).
fn normalize_color<'a>(x: FuzzArg<'a>) -> FuzzArg<'a> {
    let FuzzArg::Str(s) = x else {
        return normalize_color_reference(x);
    };
    let have = letter_mask(s);
    for (c, m) in COLOR_SET.iter().zip(COLOR_MASKS) {
        if m & !have == 0 && s.contains(*c) {
            return FuzzArg::Str(c);
        }
    }
    x
}

/// `normalize_color` on a string (substring test) or a tuple (element test), as written.
fn normalize_color_reference<'a>(x: FuzzArg<'a>) -> FuzzArg<'a> {
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

/// One product's nouns in the image: where its name's nouns (joined by `\n`) are in the noun
/// blob, and whether the table had the name.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, Pod, Zeroable)]
pub struct NounSpan {
    pub off: u64,
    pub len: u32,
    pub present: u32,
}

/// The nouns of product names (`[t.text.lower() for t in nlp(name) if t.pos_ in (PNOUN, NOUN,
/// PROPN)]`), kept per product of the catalogue in the shop's image and found by name through
/// the products sorted by title.
#[derive(Debug)]
pub struct NounTable {
    img: Arc<Image>,
}

/// The noun table's part of an image, as [`NounTable::load_parts`] leaves it.
pub struct NounParts {
    spans: Vec<NounSpan>,
    blob: Vec<u8>,
}

impl NounParts {
    /// Adds the noun table's sections to an image.
    pub fn add_to<'a>(&'a self, parts: &mut Parts<'a>) {
        parts.add_pod(Sec::NounSpans, &self.spans);
        parts.add(Sec::NounBlob, &self.blob);
    }
}

impl NounTable {
    /// Streams a `spacy_nouns*.json` table (`{"by_name": {name: {"nouns": [...]}}}`) and keeps the
    /// nouns of the names the catalogue holds.
    pub fn load_parts(path: &Path, catalog: CatalogView<'_>) -> Result<NounParts, String> {
        let mut parts = NounParts {
            spans: vec![NounSpan::default(); catalog.len()],
            blob: Vec::new(),
        };
        let f = std::fs::File::open(path).map_err(|e| format!("{e}"))?;
        let mut de = serde_json::Deserializer::from_reader(std::io::BufReader::with_capacity(1 << 20, f));
        let found = de
            .deserialize_map(Top {
                catalog,
                parts: &mut parts,
            })
            .map_err(|e| e.to_string())?;
        de.end().map_err(|e| e.to_string())?;
        if !found {
            return Err("no \"by_name\" object (expected {\"by_name\": {name: {\"nouns\": [...]}}})".into());
        }
        Ok(parts)
    }

    /// The noun table of an image.
    pub fn from_image(img: Arc<Image>) -> Result<NounTable, String> {
        let spans: &[NounSpan] = img.try_pod(Sec::NounSpans)?;
        let blob = img.bytes(Sec::NounBlob).len() as u64;
        if spans.iter().any(|s| s.off + s.len as u64 > blob) {
            return Err("a noun span is out of bounds".into());
        }
        Ok(NounTable { img })
    }

    /// The nouns of `name` (a product's title), or None when the table had none for it.
    pub fn get<'a>(&'a self, catalog: &Catalog, name: &str) -> Option<Vec<&'a str>> {
        self.of_product(catalog.products_named(name).next()?)
    }

    /// The nouns of product `i`'s title: [`NounTable::get`] of that title without looking it up
    /// (the table keeps the same nouns for every product of a title).
    pub fn of_product(&self, i: usize) -> Option<Vec<&str>> {
        let span = self.img.pod::<NounSpan>(Sec::NounSpans)[i];
        if span.present == 0 {
            return None;
        }
        let bytes = &self.img.bytes(Sec::NounBlob)[span.off as usize..span.off as usize + span.len as usize];
        let joined = std::str::from_utf8(bytes).expect("the image's strings are UTF-8 (its checksum was checked)");
        Some(if joined.is_empty() {
            Vec::new()
        } else {
            joined.split('\n').collect()
        })
    }
}

struct Top<'a, 'c> {
    catalog: CatalogView<'c>,
    parts: &'a mut NounParts,
}

impl<'de> Visitor<'de> for Top<'_, '_> {
    type Value = bool;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a noun table object")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<bool, A::Error> {
        let mut found = false;
        while let Some(key) = m.next_key::<String>()? {
            if key == "by_name" {
                m.next_value_seed(ByName {
                    catalog: self.catalog,
                    parts: &mut *self.parts,
                })?;
                found = true;
            } else {
                m.next_value::<de::IgnoredAny>()?;
            }
        }
        Ok(found)
    }
}

struct ByName<'a, 'c> {
    catalog: CatalogView<'c>,
    parts: &'a mut NounParts,
}

impl<'de> DeserializeSeed<'de> for ByName<'_, '_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ByName<'_, '_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("an object of name -> {\"nouns\": [...]}")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<(), A::Error> {
        #[derive(Deserialize)]
        struct Entry {
            nouns: Vec<String>,
        }
        while let Some(name) = m.next_key::<String>()? {
            let e: Entry = m.next_value()?;
            let mut hits = self.catalog.products_named(&name).peekable();
            if hits.peek().is_none() {
                continue;
            }
            if let Some(bad) = e.nouns.iter().find(|n| n.contains('\n') || n.is_empty()) {
                return Err(de::Error::custom(format!(
                    "the nouns of {name:?} hold {bad:?} (empty or with a newline)"
                )));
            }
            let joined = e.nouns.join("\n");
            let span = NounSpan {
                off: self.parts.blob.len() as u64,
                len: u32::try_from(joined.len()).map_err(|_| de::Error::custom("nouns over 4 GB"))?,
                present: 1,
            };
            self.parts.blob.extend_from_slice(joined.as_bytes());
            for i in hits {
                self.parts.spans[i] = span;
            }
        }
        Ok(())
    }
}

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

/// The distinct strings of a list, sorted (a set).
fn distinct(mut v: Vec<&str>) -> Vec<&str> {
    v.sort_unstable();
    v.dedup();
    v
}

/// How many strings two sorted sets share.
fn common(a: &[&str], b: &[&str]) -> usize {
    let (mut i, mut j, mut n) = (0, 0, 0);
    while i < a.len() && j < b.len() {
        match a[i].cmp(b[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                n += 1;
                i += 1;
                j += 1;
            }
        }
    }
    n
}

fn type_reward(
    purchased: ProductRef<'_>,
    goal: &Goal,
    p_nouns: Option<Vec<&str>>,
    g_nouns: Option<Vec<&str>>,
) -> Result<(f64, bool, bool, f64), MissingNouns> {
    let query_match = purchased.query() == goal.query;
    let pc = distinct(purchased.product_category().split('›').map(py_strip).collect());
    let gc = distinct(goal.product_category.split('›').map(py_strip).collect());
    let category_match = common(&pc, &gc) >= 2;
    let p_nouns = p_nouns.ok_or_else(|| MissingNouns(purchased.title().to_string()))?;
    let g_nouns = g_nouns.ok_or_else(|| MissingNouns(goal.name.clone()))?;
    let n_inter = common(&distinct(p_nouns.clone()), &distinct(g_nouns.clone()));
    let title_score = if g_nouns.is_empty() {
        0.2
    } else {
        n_inter as f64 / g_nouns.len() as f64
    };
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

/// Whether goal attribute `g` is in the product's lowered title, bullets or description (read
/// once, into `lowered`, when an attribute first needs them).
fn in_long_texts(
    catalog: &Catalog,
    product: usize,
    lowered: &mut Option<Arc<super::catalog::Lowered>>,
    g: &str,
) -> bool {
    let l = lowered.get_or_insert_with(|| catalog.lowered_texts(product));
    let (title, bullets, desc) = &**l;
    title.contains(g) || bullets.contains(g) || desc.contains(g)
}

/// How many goal attributes the product matches: [`attribute_matches_reference`] with each
/// string split and counted once ([`Prepared`]) rather than once per pair.
fn attribute_matches(catalog: &Catalog, product: usize, goal: &Goal) -> usize {
    // the long texts are read only when an attribute has no fuzzy match
    let mut lowered = None;
    let mut n = 0;
    let processed: Vec<Prepared<'_>> = catalog
        .product(product)
        .processed_attributes()
        .iter()
        .map(Prepared::new)
        .collect();
    for g in &goal.attributes {
        let pg = full_process(g);
        let pg = Prepared::new(&pg);
        let matched = processed.iter().any(|p| token_set_ratio_above_prepared(p, &pg, 85))
            || in_long_texts(catalog, product, &mut lowered, g);
        n += usize::from(matched);
    }
    n
}

/// `sum(any(token_set_ratio(p, g) > 85 for p in product attributes) or g in the title, the
/// bullets or the description, for g in the goal's attributes)`, pair by pair.
fn attribute_matches_reference(catalog: &Catalog, product: usize, goal: &Goal) -> usize {
    let mut lowered = None;
    let mut n = 0;
    let processed = catalog.product(product).processed_attributes();
    for g in &goal.attributes {
        let pg = full_process(g);
        let matched = processed.iter().any(|p| token_set_ratio_above(p, &pg, 85))
            || in_long_texts(catalog, product, &mut lowered, g);
        n += usize::from(matched);
    }
    n
}

fn option_matches(chosen: &[(String, String)], goal: &GoalOptions) -> usize {
    // thefuzz's token_set_ratio of the values as given (strings, str() of tuples), each
    // processed once
    let processed = |a: FuzzArg<'_>| full_process(&normalize_color(a).text());
    let purchased: Vec<String> = chosen.iter().map(|(_, v)| processed(FuzzArg::Str(v))).collect();
    let goal_opts: Vec<String> = match goal {
        GoalOptions::Dict(d) => d.iter().map(|(k, v)| processed(FuzzArg::Pair(k, v))).collect(),
        GoalOptions::List(l) => l.iter().map(|v| processed(FuzzArg::Str(v))).collect(),
    };
    goal_opts
        .iter()
        .filter(|g| purchased.iter().any(|p| token_set_ratio_above(p, g, 85)))
        .count()
}

/// `get_reward(purchased_product, goal, price, options, verbose=True)` for the catalogue's product
/// `product` (the nouns found by the titles, the attributes compared pair by pair: the plain
/// reference of [`get_reward_of`] and [`super::Shop::reward`]).
pub fn get_reward(
    catalog: &Catalog,
    product: usize,
    goal: &Goal,
    price: f64,
    options: &[(String, String)],
    nouns: &NounTable,
) -> Result<RewardInfo, MissingNouns> {
    let p_nouns = nouns.get(catalog, catalog.product(product).title());
    let g_nouns = nouns.get(catalog, &goal.name);
    let (r_type, query_match, category_match, title_score) =
        type_reward(catalog.product(product), goal, p_nouns, g_nouns)?;
    let parts = GoalProductParts {
        r_type,
        query_match,
        category_match,
        title_score,
        n_att: attribute_matches_reference(catalog, product, goal),
    };
    Ok(reward_from(&parts, goal, price, options))
}

/// [`get_reward`] for a goal made from the catalogue's product `goal_product` (its `name` is
/// that product's title): the nouns of both products read by index, not looked up by title.
pub fn get_reward_of(
    catalog: &Catalog,
    product: usize,
    goal: &Goal,
    goal_product: usize,
    price: f64,
    options: &[(String, String)],
    nouns: &NounTable,
) -> Result<RewardInfo, MissingNouns> {
    let parts = goal_product_parts_of(catalog, product, goal, goal_product, nouns)?;
    Ok(reward_from(&parts, goal, price, options))
}

/// The parts of `get_reward` that depend only on the goal and the product bought (not on the
/// options chosen): the type score and how many goal attributes the product matches. A shop
/// keeps them for the pairs bought recently ([`super::Shop::reward`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GoalProductParts {
    pub r_type: f64,
    pub query_match: bool,
    pub category_match: bool,
    pub title_score: f64,
    /// Goal attributes matched.
    pub n_att: usize,
}

/// [`GoalProductParts`] of buying the catalogue's product `product` for `goal` (the nouns of
/// both names given).
pub fn goal_product_parts(
    catalog: &Catalog,
    product: usize,
    goal: &Goal,
    p_nouns: Option<Vec<&str>>,
    g_nouns: Option<Vec<&str>>,
) -> Result<GoalProductParts, MissingNouns> {
    let purchased = catalog.product(product);
    let (r_type, query_match, category_match, title_score) = type_reward(purchased, goal, p_nouns, g_nouns)?;
    Ok(GoalProductParts {
        r_type,
        query_match,
        category_match,
        title_score,
        n_att: attribute_matches(catalog, product, goal),
    })
}

/// [`GoalProductParts`] for a goal made from the catalogue's product `goal_product` (its nouns
/// read by index, as [`get_reward_of`]).
pub fn goal_product_parts_of(
    catalog: &Catalog,
    product: usize,
    goal: &Goal,
    goal_product: usize,
    nouns: &NounTable,
) -> Result<GoalProductParts, MissingNouns> {
    debug_assert_eq!(catalog.product(goal_product).title(), goal.name);
    goal_product_parts(
        catalog,
        product,
        goal,
        nouns.of_product(product),
        nouns.of_product(goal_product),
    )
}

/// `get_reward` from its goal-and-product parts: the price, the options chosen and the total.
pub fn reward_from(parts: &GoalProductParts, goal: &Goal, price: f64, options: &[(String, String)]) -> RewardInfo {
    reward_from_counts(parts, goal, price, option_matches(options, &goal.goal_options))
}

/// How many of the goal's options the options chosen match (`get_option_reward`'s count).
pub fn goal_options_matched(goal: &Goal, options: &[(String, String)]) -> usize {
    option_matches(options, &goal.goal_options)
}

/// [`reward_from`] with the goal options matched counted (`n_opt`, [`goal_options_matched`]).
pub fn reward_from_counts(parts: &GoalProductParts, goal: &Goal, price: f64, n_opt: usize) -> RewardInfo {
    let GoalProductParts {
        r_type,
        query_match,
        category_match,
        title_score,
        n_att,
    } = *parts;
    let r_price = price <= goal.price_upper;
    let n_goal_att = goal.attributes.len();
    let n_goal_opt = goal.goal_options.len();
    let denom = (n_goal_att + n_goal_opt + 1) as f64;
    let total = (n_att + n_opt + r_price as usize) as f64 / denom * r_type;
    RewardInfo {
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
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Passing over the colours whose letters are missing finds the reference's colour.
        #[test]
        fn normalize_color_equals_the_reference(s in "[a-z éB|]{0,24}", k in 0usize..104, at in 0usize..25) {
            // often holding a colour, somewhere
            let mut s = s;
            if k < COLOR_SET.len() {
                let at = s.char_indices().map(|(i, _)| i).nth(at).unwrap_or(s.len());
                s.insert_str(at, COLOR_SET[k]);
            }
            prop_assert_eq!(normalize_color(FuzzArg::Str(&s)), normalize_color_reference(FuzzArg::Str(&s)));
            prop_assert_eq!(
                normalize_color(FuzzArg::Pair("color", &s)),
                normalize_color_reference(FuzzArg::Pair("color", &s))
            );
        }
    }
}
