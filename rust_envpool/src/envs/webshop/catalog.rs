//! The product catalogue: `items_shuffle*.json` read as a stream (one product at a time, so the
//! 1.18M-product file is never held as JSON values), cleaned the way the original's
//! `load_products` does (titles, bullet points, prices and price tags, lower-cased options, the
//! attribute / instruction files), plus the per-product price the reward uses
//! (`generate_product_prices`, drawn with CPython's `random`).

use std::collections::HashMap;
use std::fmt;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::pyrandom::PyRandom;
use super::pytext::{py_float_repr, py_lower, py_strip};
use super::WebShopError;

/// Goal options as the data gives them: synthetic goals and some human ones have a dict
/// (name -> value, insertion order), other human goals a list of values.
#[derive(Clone, Debug, PartialEq)]
pub enum GoalOptions {
    Dict(Vec<(String, String)>),
    List(Vec<String>),
}

impl GoalOptions {
    pub fn len(&self) -> usize {
        match self {
            GoalOptions::Dict(d) => d.len(),
            GoalOptions::List(l) => l.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One human instruction of a product (`items_human_ins.json`).
#[derive(Clone, Debug)]
pub struct HumanInstruction {
    pub instruction: String,
    pub instruction_attributes: Vec<String>,
    pub instruction_options: GoalOptions,
}

/// One product after `load_products`.
#[derive(Clone, Debug)]
pub struct Product {
    pub asin: String,
    /// `Title` (= `name`).
    pub title: String,
    /// `Description` (= `full_description`).
    pub description: String,
    pub bullets: Vec<String>,
    pub category: String,
    /// Lower-cased and stripped, as `load_products` leaves it.
    pub query: String,
    pub product_category: String,
    /// One price, or the first two of a range.
    pub pricing: Vec<f64>,
    /// `$x`, `$x to $y` or `$100.0`.
    pub price_tag: String,
    /// Lower-cased option names (dict order) with their values (stripped, `/` -> ` | `, lower).
    pub options: Vec<(String, Vec<String>)>,
    /// `Attributes` from the attribute file (`['DUMMY_ATTR']` when it has none).
    pub attributes: Vec<String>,
    /// Synthetic-goal instruction and its attributes (attribute file).
    pub instruction_text: Option<String>,
    pub instruction_attributes: Option<Vec<String>>,
    /// Human instructions (only loaded for human goals).
    pub human: Option<Vec<HumanInstruction>>,
    /// Lower-cased title, joined bullet points and description (the reward's attribute
    /// search), made on first purchase of the product.
    pub lowered: std::sync::OnceLock<(String, String, String)>,
    /// `Attributes` through thefuzz's `full_process`, made on first purchase.
    pub processed_attributes: std::sync::OnceLock<Vec<String>>,
}

impl Product {
    /// `(Title.lower(), ' '.join(BulletPoints).lower(), Description.lower())`.
    pub fn lowered_texts(&self) -> &(String, String, String) {
        self.lowered
            .get_or_init(|| (py_lower(&self.title), py_lower(&self.bullets.join(" ")), py_lower(&self.description)))
    }

    /// `full_process(a)` of each attribute.
    pub fn processed_attributes(&self) -> &[String] {
        self.processed_attributes.get_or_init(|| self.attributes.iter().map(|a| super::fuzz::full_process(a)).collect())
    }
}

// ----------------------------------------------------------------------------- raw JSON shapes

#[derive(Deserialize)]
struct RawOption {
    value: String,
}

/// `customization_options`: `""` or a dict (order kept) of name -> null | [{value, image}].
struct RawOptions(Vec<(String, Option<Vec<RawOption>>)>);

impl<'de> Deserialize<'de> for RawOptions {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = RawOptions;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a dict of option lists, or a string")
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<RawOptions, E> {
                Ok(RawOptions(Vec::new()))
            }
            fn visit_unit<E: de::Error>(self) -> Result<RawOptions, E> {
                Ok(RawOptions(Vec::new()))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<RawOptions, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, Option<Vec<RawOption>>>()? {
                    out.push((k, v));
                }
                Ok(RawOptions(out))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
#[serde(untagged)]
enum StrOrList {
    Str(String),
    List(Vec<String>),
}

#[derive(Deserialize)]
struct RawProduct {
    asin: String,
    name: String,
    #[serde(default)]
    full_description: Option<String>,
    #[serde(default)]
    small_description: Option<StrOrList>,
    #[serde(default)]
    customization_options: Option<RawOptions>,
    #[serde(default)]
    pricing: Option<String>,
    #[serde(default)]
    category: String,
    #[serde(default)]
    query: String,
    #[serde(default)]
    product_category: String,
}

#[derive(Deserialize, Default)]
struct RawAttrs {
    attributes: Option<Vec<String>>,
    instruction: Option<String>,
    instruction_attributes: Option<Vec<String>>,
}

/// Goal options in the human file: a list of values or a dict (order kept).
impl<'de> Deserialize<'de> for GoalOptions {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = GoalOptions;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a list or dict of options")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<GoalOptions, A::Error> {
                let mut out = Vec::new();
                while let Some(v) = s.next_element::<String>()? {
                    out.push(v);
                }
                Ok(GoalOptions::List(out))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<GoalOptions, A::Error> {
                let mut out: Vec<(String, String)> = Vec::new();
                while let Some((k, v)) = m.next_entry::<String, String>()? {
                    if let Some(slot) = out.iter_mut().find(|(n, _)| *n == k) {
                        slot.1 = v;
                    } else {
                        out.push((k, v));
                    }
                }
                Ok(GoalOptions::Dict(out))
            }
        }
        d.deserialize_any(V)
    }
}

#[derive(Deserialize)]
struct RawHuman {
    instruction: String,
    #[serde(default)]
    instruction_attributes: Vec<String>,
    #[serde(default = "empty_list")]
    instruction_options: GoalOptions,
}

fn empty_list() -> GoalOptions {
    GoalOptions::List(Vec::new())
}

// ----------------------------------------------------------------------------- loading

fn open(path: &Path) -> Result<BufReader<File>, WebShopError> {
    File::open(path)
        .map(|f| BufReader::with_capacity(1 << 20, f))
        .map_err(|e| WebShopError::Load(format!("{}: {e}", path.display())))
}

fn json_err(path: &Path, e: serde_json::Error) -> WebShopError {
    WebShopError::Load(format!("{}: {e}", path.display()))
}

/// Calls `f` on each element of the JSON array in `path`, one at a time.
fn stream_array<T, F>(path: &Path, f: F) -> Result<(), WebShopError>
where
    T: for<'de> Deserialize<'de>,
    F: FnMut(T) -> Result<(), String>,
{
    struct SeqVisitor<T, F>(F, std::marker::PhantomData<T>);
    impl<'de, T: Deserialize<'de>, F: FnMut(T) -> Result<(), String>> Visitor<'de> for SeqVisitor<T, F> {
        type Value = ();
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON array of products")
        }
        fn visit_seq<A: SeqAccess<'de>>(mut self, mut s: A) -> Result<(), A::Error> {
            while let Some(item) = s.next_element::<T>()? {
                (self.0)(item).map_err(de::Error::custom)?;
            }
            Ok(())
        }
    }
    let mut de = serde_json::Deserializer::from_reader(open(path)?);
    de.deserialize_seq(SeqVisitor(f, std::marker::PhantomData))
        .map_err(|e| json_err(path, e))?;
    de.end().map_err(|e| json_err(path, e))
}

/// The original's price parsing: `pricing.split('$')[1:]`, each with everything but digits and
/// `.` removed, read as a decimal.
fn parse_pricing(asin: &str, pricing: &str) -> Result<Vec<f64>, String> {
    let mut out = Vec::new();
    for part in pricing.split('$').skip(1) {
        let cleaned: String = part.chars().filter(|c| c.is_ascii_digit() || *c == '.').collect();
        let v: f64 = cleaned
            .parse()
            .map_err(|_| format!("product {asin}: price {pricing:?} has an unreadable part {part:?}"))?;
        out.push(v);
    }
    Ok(out)
}

/// Where the catalogue's files are.
#[derive(Clone, Debug)]
pub struct CatalogFiles {
    pub products: PathBuf,
    pub attributes: PathBuf,
    pub human_attributes: PathBuf,
}

/// The loaded catalogue.
#[derive(Debug)]
pub struct Catalog {
    pub products: Vec<Product>,
    pub by_asin: HashMap<String, usize>,
}

impl Catalog {
    /// `load_products(file, num_products, human_goals)`.
    pub fn load(files: &CatalogFiles, num_products: Option<usize>, human_goals: bool) -> Result<Self, WebShopError> {
        let attrs: HashMap<String, RawAttrs> = serde_json::from_reader(open(&files.attributes)?)
            .map_err(|e| json_err(&files.attributes, e))?;
        let human: HashMap<String, Vec<RawHuman>> = if human_goals {
            serde_json::from_reader(open(&files.human_attributes)?).map_err(|e| json_err(&files.human_attributes, e))?
        } else {
            HashMap::new()
        };
        let mut products = Vec::new();
        let mut by_asin = HashMap::new();
        let mut seen = 0usize;
        let limit = num_products.unwrap_or(usize::MAX);
        let mut human = human;
        let res = stream_array::<RawProduct, _>(&files.products, |p| {
            if seen >= limit {
                return Ok(());
            }
            seen += 1;
            let asin = p.asin;
            if asin == "nan" || asin.chars().count() > 10 || by_asin.contains_key(&asin) {
                return Ok(());
            }
            let bullets = match p.small_description {
                Some(StrOrList::List(l)) => l,
                Some(StrOrList::Str(s)) => vec![s],
                None => vec![String::new()],
            };
            let (pricing, price_tag) = match p.pricing.as_deref() {
                None | Some("") => (vec![100.0], "$100.0".to_string()),
                Some(s) => {
                    let mut v = parse_pricing(&asin, s)?;
                    match v.len() {
                        0 => return Err(format!("product {asin}: price {s:?} has no '$'")),
                        1 => {
                            let tag = format!("${}", py_float_repr(v[0]));
                            (v, tag)
                        }
                        _ => {
                            v.truncate(2);
                            let tag = format!("${} to ${}", py_float_repr(v[0]), py_float_repr(v[1]));
                            (v, tag)
                        }
                    }
                }
            };
            let mut options: Vec<(String, Vec<String>)> = Vec::new();
            if let Some(RawOptions(opts)) = p.customization_options {
                for (name, contents) in opts {
                    let Some(contents) = contents else { continue };
                    let name = py_lower(&name);
                    let values: Vec<String> = contents
                        .iter()
                        .map(|c| py_lower(&py_strip(&c.value).replace('/', " | ")))
                        .collect();
                    if let Some(slot) = options.iter_mut().find(|(n, _)| *n == name) {
                        slot.1 = values;
                    } else {
                        options.push((name, values));
                    }
                }
            }
            let a = attrs.get(&asin);
            let attributes = match a.and_then(|a| a.attributes.clone()) {
                Some(v) => v,
                None => vec!["DUMMY_ATTR".to_string()],
            };
            let (instruction_text, instruction_attributes, hum) = if human_goals {
                (None, None, human.remove(&asin).map(|v| {
                    v.into_iter()
                        .map(|h| HumanInstruction {
                            instruction: h.instruction,
                            instruction_attributes: h.instruction_attributes,
                            instruction_options: h.instruction_options,
                        })
                        .collect()
                }))
            } else {
                (a.and_then(|a| a.instruction.clone()), a.and_then(|a| a.instruction_attributes.clone()), None)
            };
            by_asin.insert(asin.clone(), products.len());
            products.push(Product {
                asin,
                title: p.name,
                description: p.full_description.unwrap_or_default(),
                bullets,
                category: p.category,
                query: py_strip(&py_lower(&p.query)).to_string(),
                product_category: p.product_category,
                pricing,
                price_tag,
                options,
                attributes,
                instruction_text,
                instruction_attributes,
                human: hum,
                lowered: std::sync::OnceLock::new(),
                processed_attributes: std::sync::OnceLock::new(),
            });
            Ok(())
        });
        res?;
        if products.is_empty() {
            return Err(WebShopError::Load(format!("{}: no products", files.products.display())));
        }
        Ok(Catalog { products, by_asin })
    }

    /// `generate_product_prices`: no price -> 100.0 (the loader already made it `[100.0]`), one
    /// price -> it, a range -> `random.uniform(lo, hi)`, in product order.
    pub fn prices(&self, rng: &mut PyRandom) -> Vec<f64> {
        self.products
            .iter()
            .map(|p| match p.pricing.len() {
                0 => 100.0,
                1 => p.pricing[0],
                _ => rng.uniform(p.pricing[0], p.pricing[1]),
            })
            .collect()
    }

    /// The search document of a product: `lower(Title + ' ' + Description + ' ' +
    /// BulletPoints[0] + ' ' + 'n: v1, v2, and n2: ...')`.
    pub fn document(p: &Product) -> String {
        let opts: Vec<String> = p.options.iter().map(|(n, vs)| format!("{n}: {}", vs.join(", "))).collect();
        let text = [
            p.title.as_str(),
            p.description.as_str(),
            p.bullets.first().map(String::as_str).unwrap_or(""),
            &opts.join(", and "),
        ]
        .join(" ");
        py_lower(&text)
    }
}
