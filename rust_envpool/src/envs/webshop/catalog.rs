//! The product catalogue: `items_shuffle*.json` read as a stream (one product at a time, so the
//! 1.18M-product file is never held as JSON values), cleaned the way the original's
//! `load_products` does (titles, bullet points, prices and price tags, lower-cased options, the
//! attribute / instruction files), plus the per-product price the reward uses
//! (`generate_product_prices`, drawn with CPython's `random`).
//!
//! For the full catalogue's sake the long texts — the description and the bullet points, some
//! 1.3 KB of the ~1.9 KB a product holds — are not kept: each [`Product`] keeps where its JSON
//! object is in the file, and [`Catalog::cold`] reads them back (one `pread` and a parse) for the
//! pages and the reward that show or search them. The file stays open for the catalogue's life.

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
    /// Where the product's JSON object is in the products file (offset, length): its
    /// `Description` and `BulletPoints` are read from there ([`Catalog::cold`]).
    pub raw: (u64, u32),
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
    /// search), made on first purchase of the product ([`Catalog::lowered_texts`]).
    pub lowered: std::sync::OnceLock<(String, String, String)>,
    /// `Attributes` through thefuzz's `full_process`, made on first purchase.
    pub processed_attributes: std::sync::OnceLock<Vec<String>>,
}

/// A product's long texts, read back from the file by [`Catalog::cold`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cold {
    /// `Description` (= `full_description`).
    pub description: String,
    /// `BulletPoints` (= `small_description`, a list).
    pub bullets: Vec<String>,
}

impl Product {
    /// `full_process(a)` of each attribute.
    pub fn processed_attributes(&self) -> &[String] {
        self.processed_attributes
            .get_or_init(|| self.attributes.iter().map(|a| super::fuzz::full_process(a)).collect())
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

/// The byte length of the JSON value that starts `bytes` (an object, array, string or scalar),
/// or None when `bytes` ends inside it. Strings are skipped with their escapes; nothing else is
/// checked here (serde_json parses the value afterwards).
fn value_len(bytes: &[u8]) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = 0;
    match bytes.first()? {
        b'{' | b'[' | b'"' => {}
        _ => {
            // a scalar: up to the next delimiter
            let end = bytes
                .iter()
                .position(|&b| matches!(b, b',' | b']' | b'}' | b' ' | b'\n' | b'\r' | b'\t'))?;
            return Some(end);
        }
    }
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                i += 1;
                loop {
                    let j = i + memchr::memchr2(b'"', b'\\', bytes.get(i..)?)?;
                    if bytes[j] == b'\\' {
                        i = j + 2;
                        if i > bytes.len() {
                            return None;
                        }
                    } else {
                        i = j + 1;
                        break;
                    }
                }
                if depth == 0 {
                    return Some(i);
                }
                continue;
            }
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Calls `f(element, (offset, length))` on each element of the JSON array in `path`, one at a
/// time, with where the element is in the file. The file is read in blocks; each element's bytes
/// are found by [`value_len`] and parsed with serde_json, so neither the file nor its values are
/// ever held whole.
fn stream_array<T, F>(path: &Path, mut f: F) -> Result<(), WebShopError>
where
    T: for<'de> Deserialize<'de>,
    F: FnMut(T, (u64, u32)) -> Result<(), String>,
{
    use std::io::Read;
    const BLOCK: usize = 8 << 20;
    let err = |msg: String| WebShopError::Load(format!("{}: {msg}", path.display()));
    let mut file = File::open(path).map_err(|e| err(e.to_string()))?;
    let mut buf: Vec<u8> = Vec::new();
    let mut base = 0u64; // file offset of buf[0]
    let mut at = 0usize;
    let mut eof = false;
    // more bytes: drops what was used, appends a block; false at the end of the file
    let mut fill = |buf: &mut Vec<u8>, at: &mut usize, base: &mut u64, eof: &mut bool| -> Result<bool, WebShopError> {
        if *eof {
            return Ok(false);
        }
        buf.drain(..*at);
        *base += *at as u64;
        *at = 0;
        let old = buf.len();
        buf.resize(old + BLOCK, 0);
        let n = file.read(&mut buf[old..]).map_err(|e| err(e.to_string()))?;
        buf.truncate(old + n);
        *eof = n == 0;
        Ok(n > 0)
    };
    // the next byte that is not white space (None at the end of the file)
    macro_rules! next_token {
        () => {
            loop {
                match buf[at..]
                    .iter()
                    .position(|b| !matches!(b, b' ' | b'\n' | b'\r' | b'\t'))
                {
                    Some(k) => {
                        at += k;
                        break Some(buf[at]);
                    }
                    None => {
                        at = buf.len();
                        if !fill(&mut buf, &mut at, &mut base, &mut eof)? {
                            break None;
                        }
                    }
                }
            }
        };
    }
    let where_ = |base: u64, at: usize| format!("at byte {}", base + at as u64);
    if next_token!() != Some(b'[') {
        return Err(err(format!("expected a JSON array of products {}", where_(base, at))));
    }
    at += 1;
    let mut first = true;
    loop {
        match next_token!() {
            Some(b']') => {
                at += 1;
                break;
            }
            Some(b',') if !first => {
                at += 1;
                if next_token!().is_none() {
                    return Err(err("EOF while parsing a list".into()));
                }
            }
            Some(_) if first => {}
            Some(b) => {
                return Err(err(format!(
                    "expected `,` or `]` {}, found {:?}",
                    where_(base, at),
                    b as char
                )))
            }
            None => return Err(err("EOF while parsing a list".into())),
        }
        first = false;
        let len = loop {
            match value_len(&buf[at..]) {
                Some(n) if at + n < buf.len() || eof => break n,
                _ => {
                    if !fill(&mut buf, &mut at, &mut base, &mut eof)? {
                        match value_len(&buf[at..]) {
                            Some(n) => break n,
                            None => return Err(err(format!("EOF while parsing the element {}", where_(base, at)))),
                        }
                    }
                }
            }
        };
        let offset = base + at as u64;
        let item: T = serde_json::from_slice(&buf[at..at + len])
            .map_err(|e| err(format!("the element at byte {offset}: {e}")))?;
        at += len;
        let len32 = u32::try_from(len).map_err(|_| err(format!("the element at byte {offset} is over 4 GB")))?;
        f(item, (offset, len32)).map_err(err)?;
    }
    if next_token!().is_some() {
        return Err(err(format!("trailing characters {}", where_(base, at))));
    }
    Ok(())
}

/// A product's long texts as `load_products` leaves them.
fn cold_of(full_description: Option<String>, small_description: Option<StrOrList>) -> Cold {
    let bullets = match small_description {
        Some(StrOrList::List(l)) => l,
        Some(StrOrList::Str(s)) => vec![s],
        None => vec![String::new()],
    };
    Cold {
        description: full_description.unwrap_or_default(),
        bullets,
    }
}

/// The search document of a product: `lower(Title + ' ' + Description + ' ' +
/// BulletPoints[0] + ' ' + 'n: v1, v2, and n2: ...')`.
fn document_of(title: &str, cold: &Cold, options: &[(String, Vec<String>)]) -> String {
    let opts: Vec<String> = options
        .iter()
        .map(|(n, vs)| format!("{n}: {}", vs.join(", ")))
        .collect();
    let text = [
        title,
        cold.description.as_str(),
        cold.bullets.first().map(String::as_str).unwrap_or(""),
        &opts.join(", and "),
    ]
    .join(" ");
    py_lower(&text)
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
    /// The products file, open: the long texts are read back from it ([`Catalog::cold`]).
    file: File,
    path: PathBuf,
}

impl Catalog {
    /// `load_products(file, num_products, human_goals)`.
    pub fn load(files: &CatalogFiles, num_products: Option<usize>, human_goals: bool) -> Result<Self, WebShopError> {
        Self::load_with(files, num_products, human_goals, |_, _| {})
    }

    /// [`Catalog::load`], handing each kept product's search document to `on_document(index,
    /// text)` while the product's texts are at hand (the index is built as the file streams by).
    pub fn load_with<D: FnMut(usize, String)>(
        files: &CatalogFiles,
        num_products: Option<usize>,
        human_goals: bool,
        mut on_document: D,
    ) -> Result<Self, WebShopError> {
        let attrs: HashMap<String, RawAttrs> =
            serde_json::from_reader(open(&files.attributes)?).map_err(|e| json_err(&files.attributes, e))?;
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
        let res = stream_array::<RawProduct, _>(&files.products, |p, span| {
            if seen >= limit {
                return Ok(());
            }
            seen += 1;
            let asin = p.asin;
            if asin == "nan" || asin.chars().count() > 10 || by_asin.contains_key(&asin) {
                return Ok(());
            }
            let cold = cold_of(p.full_description, p.small_description);
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
                (
                    None,
                    None,
                    human.remove(&asin).map(|v| {
                        v.into_iter()
                            .map(|h| HumanInstruction {
                                instruction: h.instruction,
                                instruction_attributes: h.instruction_attributes,
                                instruction_options: h.instruction_options,
                            })
                            .collect()
                    }),
                )
            } else {
                (
                    a.and_then(|a| a.instruction.clone()),
                    a.and_then(|a| a.instruction_attributes.clone()),
                    None,
                )
            };
            by_asin.insert(asin.clone(), products.len());
            on_document(products.len(), document_of(&p.name, &cold, &options));
            products.push(Product {
                asin,
                title: p.name,
                raw: span,
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
        let file = File::open(&files.products)
            .map_err(|e| WebShopError::Load(format!("{}: {e}", files.products.display())))?;
        Ok(Catalog {
            products,
            by_asin,
            file,
            path: files.products.clone(),
        })
    }

    /// Product `i`'s description and bullet points, read back from the products file. Panics
    /// when the file no longer holds the product there (it was changed while the shop was loaded).
    pub fn cold(&self, i: usize) -> Cold {
        use std::os::unix::fs::FileExt;
        #[derive(Deserialize)]
        struct Raw {
            asin: String,
            #[serde(default)]
            full_description: Option<String>,
            #[serde(default)]
            small_description: Option<StrOrList>,
        }
        let p = &self.products[i];
        let (offset, len) = p.raw;
        let mut bytes = vec![0u8; len as usize];
        let raw: Result<Raw, String> = self
            .file
            .read_exact_at(&mut bytes, offset)
            .map_err(|e| e.to_string())
            .and_then(|_| serde_json::from_slice(&bytes).map_err(|e| e.to_string()));
        match raw {
            Ok(r) if r.asin == p.asin => cold_of(r.full_description, r.small_description),
            _ => panic!(
                "{}: product {} is no longer at byte {offset}: the catalogue file changed while the shop was loaded",
                self.path.display(),
                p.asin
            ),
        }
    }

    /// `(Title.lower(), ' '.join(BulletPoints).lower(), Description.lower())` of product `i`,
    /// made on its first purchase and kept.
    pub fn lowered_texts(&self, i: usize) -> &(String, String, String) {
        let p = &self.products[i];
        p.lowered.get_or_init(|| {
            let c = self.cold(i);
            (
                py_lower(&p.title),
                py_lower(&c.bullets.join(" ")),
                py_lower(&c.description),
            )
        })
    }

    /// The search document of product `i` (what the index holds for it).
    pub fn document(&self, i: usize) -> String {
        let p = &self.products[i];
        document_of(&p.title, &self.cold(i), &p.options)
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
}

/// A product file read for its checks alone (`pcsd-data webshop`): the number of entries of the
/// JSON array and the distinct `name`s in file order, streamed (the 1.18 M-product file is never
/// held as JSON values).
pub fn scan_products(path: &Path) -> Result<(usize, Vec<String>), WebShopError> {
    #[derive(Deserialize)]
    struct NameOnly {
        #[serde(default)]
        name: Option<String>,
    }
    let mut entries = 0usize;
    let mut seen = std::collections::HashSet::new();
    let mut names = Vec::new();
    stream_array::<NameOnly, _>(path, |p, _| {
        entries += 1;
        if let Some(n) = p.name {
            if !seen.contains(&n) {
                seen.insert(n.clone());
                names.push(n);
            }
        }
        Ok(())
    })?;
    Ok((entries, names))
}

/// The number of entries of the JSON array or object in `path` (streamed, values skipped).
pub fn json_len(path: &Path) -> Result<usize, WebShopError> {
    struct Count;
    impl<'de> Visitor<'de> for Count {
        type Value = usize;
        fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
            f.write_str("a JSON array or object")
        }
        fn visit_seq<A: SeqAccess<'de>>(self, mut s: A) -> Result<usize, A::Error> {
            let mut n = 0;
            while s.next_element::<de::IgnoredAny>()?.is_some() {
                n += 1;
            }
            Ok(n)
        }
        fn visit_map<A: MapAccess<'de>>(self, mut m: A) -> Result<usize, A::Error> {
            let mut n = 0;
            while m.next_entry::<de::IgnoredAny, de::IgnoredAny>()?.is_some() {
                n += 1;
            }
            Ok(n)
        }
    }
    let mut de = serde_json::Deserializer::from_reader(open(path)?);
    let n = de.deserialize_any(Count).map_err(|e| json_err(path, e))?;
    de.end().map_err(|e| json_err(path, e))?;
    Ok(n)
}
