//! The product catalogue: `items_shuffle*.json` read as a stream (one product at a time, so the
//! 1.18M-product file is never held as JSON values), cleaned the way the original's
//! `load_products` does (titles, bullet points, prices and price tags, lower-cased options, the
//! attribute / instruction files), plus the per-product price the reward uses
//! (`generate_product_prices`, drawn with CPython's `random`).
//!
//! The loaded products live in the shop's image ([`super::image`]): per product a fixed record
//! ([`ProdRec`]: where its fields are, its prices, its synthetic goals' count and weight) and its
//! strings and lists in one byte heap, read through [`Catalog::product`] ([`ProductRef`]). Only
//! the ASINs are also kept as owned strings ([`Catalog::products`]). The long texts — the
//! description and the bullet points, some 1.3 KB of the ~1.9 KB a product holds — are not in the
//! image either: each product keeps where its JSON object is in the file, and [`Catalog::cold`]
//! reads them back (one `pread` and a parse) for the pages and the reward that show or search
//! them. The file stays open for the catalogue's life.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::fs::File;
use std::io::BufReader;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use bytemuck::{Pod, Zeroable};
use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::image::{Image, Parts, Sec};
use super::pyrandom::PyRandom;
use super::pytext::{py_float_repr, py_lower, py_strip};
use super::search::{get_varint, put_varint};
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

/// One product of the catalogue as the engine names it: its ASIN. Its other fields are read
/// from the image through [`Catalog::product`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Product {
    pub asin: String,
}

/// A product's long texts, read back from the file by [`Catalog::cold`].
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Cold {
    /// `Description` (= `full_description`).
    pub description: String,
    /// `BulletPoints` (= `small_description`, a list).
    pub bullets: Vec<String>,
}

/// `(Title.lower(), ' '.join(BulletPoints).lower(), Description.lower())` of a product: what the
/// reward's attribute search looks in.
pub type Lowered = (String, String, String);

// ----------------------------------------------------------------------------- the image's records

/// The fields of a product in its part of the blob, in this order; [`ProdRec::ends`] holds where
/// each ends (relative to [`ProdRec::blob`]).
const F_ASIN: usize = 0;
const F_TITLE: usize = 1;
const F_CATEGORY: usize = 2;
const F_QUERY: usize = 3;
const F_PRODUCT_CATEGORY: usize = 4;
const F_PRICE_TAG: usize = 5;
/// count, then per option: name, values (a list)
const F_OPTIONS: usize = 6;
/// lists: count, then per string its length and bytes
const F_ATTRIBUTES: usize = 7;
const F_PROCESSED_ATTRIBUTES: usize = 8;
const F_INSTRUCTION: usize = 9;
const F_INSTRUCTION_ATTRIBUTES: usize = 10;
/// count, then per instruction: text, attributes (a list), options (0 + pairs | 1 + a list)
const F_HUMAN: usize = 11;
const NUM_FIELDS: usize = 12;

const HAS_INSTRUCTION: u32 = 1;
const HAS_INSTRUCTION_ATTRIBUTES: u32 = 2;
const HAS_HUMAN: u32 = 4;

/// One product's fixed record in the image.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct ProdRec {
    /// Where the product's fields start in the blob.
    pub blob: u64,
    /// Where the product's JSON object is in the products file (offset, length).
    pub raw_off: u64,
    /// `pricing`: one price, or the first two of a range ([`ProdRec::n_prices`] of them).
    pub price_lo: f64,
    pub price_hi: f64,
    /// The weight of its synthetic goals (mean of 1 / count of each instruction attribute).
    pub weight: f64,
    pub raw_len: u32,
    pub n_prices: u32,
    /// Its option combinations (synthetic goals).
    pub combos: u32,
    pub flags: u32,
    pub ends: [u32; NUM_FIELDS],
    /// Where the JSON values of `asin`, `full_description` and `small_description` are inside the
    /// product's JSON object (offset from [`ProdRec::raw_off`], length; length 0: absent or null),
    /// so that [`Catalog::cold`] parses those three values and nothing else.
    pub spans: [[u32; 2]; 3],
}

/// [`ProdRec::spans`]: which value.
const S_ASIN: usize = 0;
const S_DESCRIPTION: usize = 1;
const S_BULLETS: usize = 2;

fn utf8(b: &[u8]) -> &str {
    std::str::from_utf8(b).expect("the image's strings are UTF-8 (its checksum was checked)")
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    put_varint(out, s.len() as u32);
    out.extend_from_slice(s.as_bytes());
}

fn put_list<S: AsRef<str>>(out: &mut Vec<u8>, items: &[S]) {
    put_varint(out, items.len() as u32);
    for s in items {
        put_str(out, s.as_ref());
    }
}

/// Reads the blob's encodings.
#[derive(Clone, Copy, Debug)]
struct Rd<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Rd<'a> {
    fn new(b: &'a [u8]) -> Self {
        Rd { b, at: 0 }
    }

    fn count(&mut self) -> usize {
        get_varint(self.b, &mut self.at) as usize
    }

    fn str(&mut self) -> &'a str {
        let n = self.count();
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        utf8(s)
    }

    fn list(&mut self) -> StrList<'a> {
        let n = self.count();
        let start = self.at;
        for _ in 0..n {
            let len = self.count();
            self.at += len;
        }
        StrList {
            n,
            bytes: &self.b[start..self.at],
        }
    }
}

/// A list of strings in the image.
#[derive(Clone, Copy, Debug)]
pub struct StrList<'a> {
    n: usize,
    bytes: &'a [u8],
}

impl<'a> StrList<'a> {
    pub fn len(&self) -> usize {
        self.n
    }

    pub fn is_empty(&self) -> bool {
        self.n == 0
    }

    pub fn iter(&self) -> StrIter<'a> {
        StrIter {
            rd: Rd::new(self.bytes),
            left: self.n,
        }
    }

    pub fn to_vec(&self) -> Vec<String> {
        self.iter().map(str::to_string).collect()
    }
}

impl<'a> IntoIterator for StrList<'a> {
    type Item = &'a str;
    type IntoIter = StrIter<'a>;
    fn into_iter(self) -> StrIter<'a> {
        self.iter()
    }
}

#[derive(Clone, Debug)]
pub struct StrIter<'a> {
    rd: Rd<'a>,
    left: usize,
}

impl<'a> Iterator for StrIter<'a> {
    type Item = &'a str;
    fn next(&mut self) -> Option<&'a str> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        Some(self.rd.str())
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for StrIter<'_> {}

/// A product's options: (lower-cased name, values), dict order.
#[derive(Clone, Debug)]
pub struct Options<'a> {
    rd: Rd<'a>,
    left: usize,
}

impl<'a> Iterator for Options<'a> {
    type Item = (&'a str, StrList<'a>);
    fn next(&mut self) -> Option<Self::Item> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let name = self.rd.str();
        Some((name, self.rd.list()))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        (self.left, Some(self.left))
    }
}

impl ExactSizeIterator for Options<'_> {}

/// One human instruction of a product (`items_human_ins.json`).
#[derive(Clone, Copy, Debug)]
pub struct HumanRef<'a> {
    pub instruction: &'a str,
    pub instruction_attributes: StrList<'a>,
    options: Rd<'a>,
}

impl HumanRef<'_> {
    /// Its `instruction_options`, as the data gives them.
    pub fn instruction_options(&self) -> GoalOptions {
        let mut rd = self.options;
        match rd.count() {
            0 => {
                let n = rd.count();
                GoalOptions::Dict((0..n).map(|_| (rd.str().to_string(), rd.str().to_string())).collect())
            }
            _ => GoalOptions::List(rd.list().to_vec()),
        }
    }
}

/// A product's human instructions.
#[derive(Clone, Debug)]
pub struct Humans<'a> {
    rd: Rd<'a>,
    left: usize,
}

impl<'a> Iterator for Humans<'a> {
    type Item = HumanRef<'a>;
    fn next(&mut self) -> Option<HumanRef<'a>> {
        if self.left == 0 {
            return None;
        }
        self.left -= 1;
        let instruction = self.rd.str();
        let instruction_attributes = self.rd.list();
        let options = self.rd;
        // skip the options
        if self.rd.count() == 0 {
            let n = self.rd.count();
            for _ in 0..2 * n {
                self.rd.str();
            }
        } else {
            self.rd.list();
        }
        Some(HumanRef {
            instruction,
            instruction_attributes,
            options,
        })
    }
}

/// One product's fields, read from the image.
#[derive(Clone, Copy, Debug)]
pub struct ProductRef<'a> {
    rec: &'a ProdRec,
    blob: &'a [u8],
}

impl<'a> ProductRef<'a> {
    fn field(&self, f: usize) -> &'a [u8] {
        let lo = if f == 0 { 0 } else { self.rec.ends[f - 1] as usize };
        &self.blob[lo..self.rec.ends[f] as usize]
    }

    pub fn asin(&self) -> &'a str {
        utf8(self.field(F_ASIN))
    }

    /// `Title` (= `name`).
    pub fn title(&self) -> &'a str {
        utf8(self.field(F_TITLE))
    }

    pub fn category(&self) -> &'a str {
        utf8(self.field(F_CATEGORY))
    }

    /// Lower-cased and stripped, as `load_products` leaves it.
    pub fn query(&self) -> &'a str {
        utf8(self.field(F_QUERY))
    }

    pub fn product_category(&self) -> &'a str {
        utf8(self.field(F_PRODUCT_CATEGORY))
    }

    /// `$x`, `$x to $y` or `$100.0`.
    pub fn price_tag(&self) -> &'a str {
        utf8(self.field(F_PRICE_TAG))
    }

    /// Lower-cased option names (dict order) with their values (stripped, `/` -> ` | `, lower).
    pub fn options(&self) -> Options<'a> {
        let mut rd = Rd::new(self.field(F_OPTIONS));
        let left = rd.count();
        Options { rd, left }
    }

    /// `Attributes` from the attribute file (`['DUMMY_ATTR']` when it has none).
    pub fn attributes(&self) -> StrList<'a> {
        Rd::new(self.field(F_ATTRIBUTES)).list()
    }

    /// `Attributes` through thefuzz's `full_process`.
    pub fn processed_attributes(&self) -> StrList<'a> {
        Rd::new(self.field(F_PROCESSED_ATTRIBUTES)).list()
    }

    /// The synthetic goals' instruction (attribute file; None for human-goal shops).
    pub fn instruction_text(&self) -> Option<&'a str> {
        (self.rec.flags & HAS_INSTRUCTION != 0).then(|| utf8(self.field(F_INSTRUCTION)))
    }

    pub fn instruction_attributes(&self) -> Option<StrList<'a>> {
        (self.rec.flags & HAS_INSTRUCTION_ATTRIBUTES != 0).then(|| Rd::new(self.field(F_INSTRUCTION_ATTRIBUTES)).list())
    }

    /// Human instructions (only loaded for human goals).
    pub fn human(&self) -> Option<Humans<'a>> {
        (self.rec.flags & HAS_HUMAN != 0).then(|| {
            let mut rd = Rd::new(self.field(F_HUMAN));
            let left = rd.count();
            Humans { rd, left }
        })
    }

    /// Where the product's JSON object is in the products file (offset, length).
    pub fn raw(&self) -> (u64, u32) {
        (self.rec.raw_off, self.rec.raw_len)
    }

    pub fn record(&self) -> &'a ProdRec {
        self.rec
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
struct RawProduct<'a> {
    #[serde(borrow)]
    asin: &'a serde_json::value::RawValue,
    name: String,
    /// Parsed by [`RawProduct::long_texts`]; kept raw for where they are.
    #[serde(default, borrow)]
    full_description: Option<&'a serde_json::value::RawValue>,
    #[serde(default, borrow)]
    small_description: Option<&'a serde_json::value::RawValue>,
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

impl RawProduct<'_> {
    /// The ASIN and the long texts, parsed from their raw values.
    fn long_texts(&self) -> Result<(String, Cold), String> {
        let asin: String = serde_json::from_str(self.asin.get()).map_err(|e| format!("asin: {e}"))?;
        let description: Option<String> = match self.full_description {
            Some(r) => serde_json::from_str(r.get()).map_err(|e| format!("product {asin}: full_description: {e}"))?,
            None => None,
        };
        let bullets: Option<StrOrList> = match self.small_description {
            Some(r) => serde_json::from_str(r.get()).map_err(|e| format!("product {asin}: small_description: {e}"))?,
            None => None,
        };
        Ok((asin, cold_of(description, bullets)))
    }

    /// [`ProdRec::spans`] of this product, whose JSON object is `object`.
    fn spans(&self, object: &[u8]) -> [[u32; 2]; 3] {
        let at = |r: Option<&serde_json::value::RawValue>| match r {
            Some(r) => {
                let off = r.get().as_ptr() as usize - object.as_ptr() as usize;
                [off as u32, r.get().len() as u32]
            }
            None => [0, 0],
        };
        [
            at(Some(self.asin)),
            at(self.full_description),
            at(self.small_description),
        ]
    }
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
    stream_array_raw(path, |bytes, span| {
        let item: T = serde_json::from_slice(bytes).map_err(|e| format!("the element at byte {}: {e}", span.0))?;
        f(item, span)
    })
}

/// [`stream_array`] handing over each element's bytes (`f(bytes, (offset, length))`) instead
/// of a parsed value.
fn stream_array_raw<F>(path: &Path, mut f: F) -> Result<(), WebShopError>
where
    F: FnMut(&[u8], (u64, u32)) -> Result<(), String>,
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
        let len32 = u32::try_from(len).map_err(|_| err(format!("the element at byte {offset} is over 4 GB")))?;
        f(&buf[at..at + len], (offset, len32)).map_err(err)?;
        at += len;
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

/// The catalogue's part of an image, as [`CatalogBuilder::finish`] leaves it.
pub struct CatalogParts {
    recs: Vec<ProdRec>,
    blob: Vec<u8>,
    by_asin: Vec<u64>,
    by_title: Vec<u32>,
}

impl CatalogParts {
    /// Adds the catalogue's sections to an image.
    pub fn add_to<'a>(&'a self, parts: &mut Parts<'a>) {
        parts.add_pod(Sec::ProdRecs, &self.recs);
        parts.add(Sec::ProdBlob, &self.blob);
        parts.add_pod(Sec::ByAsin, &self.by_asin);
        parts.add_pod(Sec::ByTitle, &self.by_title);
    }

    /// Each product's rank in ASIN order (the search's tie order).
    pub fn asin_ranks(&self) -> Vec<u32> {
        let mut rank = vec![0u32; self.recs.len()];
        for (r, &i) in self.by_asin.iter().enumerate() {
            rank[i as usize] = r as u32;
        }
        rank
    }

    /// The products being built (the noun table is read against their titles).
    pub fn view(&self) -> CatalogView<'_> {
        CatalogView {
            recs: &self.recs,
            blob: &self.blob,
            by_title: &self.by_title,
        }
    }
}

/// The products of an image or of a catalogue being built: records, blob, title order.
#[derive(Clone, Copy)]
pub struct CatalogView<'a> {
    recs: &'a [ProdRec],
    blob: &'a [u8],
    by_title: &'a [u32],
}

impl<'a> CatalogView<'a> {
    pub fn len(&self) -> usize {
        self.recs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.recs.is_empty()
    }

    pub fn product(&self, i: usize) -> ProductRef<'a> {
        let rec = &self.recs[i];
        let lo = rec.blob as usize;
        ProductRef {
            rec,
            blob: &self.blob[lo..lo + rec.ends[NUM_FIELDS - 1] as usize],
        }
    }

    /// Indices of the products titled `name` (titles compared as bytes: UTF-8 keeps the order).
    pub fn products_named(&self, name: &str) -> impl Iterator<Item = usize> + 'a {
        let by_title = self.by_title;
        let this = *self;
        let name = name.as_bytes();
        let title = |i: u32| this.product(i as usize).field(F_TITLE);
        let lo = by_title.partition_point(|&i| title(i) < name);
        let hi = lo + by_title[lo..].partition_point(|&i| title(i) <= name);
        by_title[lo..hi].iter().map(|&i| i as usize)
    }
}

/// Builds the catalogue's part of an image from the products handed over in file order
/// ([`CatalogBuilder::stream`]).
pub struct CatalogBuilder {
    recs: Vec<ProdRec>,
    blob: Vec<u8>,
    seen: HashSet<Box<str>>,
}

impl CatalogBuilder {
    /// Streams the files as `load_products(file, num_products, human_goals)` reads them, handing
    /// each kept product's search document to `on_document(index, text)` while its texts are at
    /// hand (the index is built as the file streams by).
    pub fn stream<D: FnMut(usize, String)>(
        files: &CatalogFiles,
        num_products: Option<usize>,
        human_goals: bool,
        mut on_document: D,
    ) -> Result<CatalogParts, WebShopError> {
        let attrs: HashMap<String, RawAttrs> =
            serde_json::from_reader(open(&files.attributes)?).map_err(|e| json_err(&files.attributes, e))?;
        let mut human: HashMap<String, Vec<RawHuman>> = if human_goals {
            serde_json::from_reader(open(&files.human_attributes)?).map_err(|e| json_err(&files.human_attributes, e))?
        } else {
            HashMap::new()
        };
        let mut b = CatalogBuilder {
            recs: Vec::new(),
            blob: Vec::new(),
            seen: HashSet::new(),
        };
        let mut seen = 0usize;
        let limit = num_products.unwrap_or(usize::MAX);
        stream_array_raw(&files.products, |bytes, span| {
            let p: RawProduct =
                serde_json::from_slice(bytes).map_err(|e| format!("the element at byte {}: {e}", span.0))?;
            let (asin, cold) = p
                .long_texts()
                .map_err(|e| format!("the element at byte {}: {e}", span.0))?;
            if seen >= limit {
                return Ok(());
            }
            seen += 1;
            if asin == "nan" || asin.chars().count() > 10 || b.seen.contains(asin.as_str()) {
                return Ok(());
            }
            let spans = p.spans(bytes);
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
            let combos: u64 = options.iter().map(|(_, v)| v.len() as u64).product();
            let combos = u32::try_from(combos)
                .map_err(|_| format!("product {asin}: {combos} option combinations (at most 2^32 - 1)"))?;
            let a = attrs.get(&asin);
            let attributes = match a.and_then(|a| a.attributes.clone()) {
                Some(v) => v,
                None => vec!["DUMMY_ATTR".to_string()],
            };
            let (instruction_text, instruction_attributes, hum) = if human_goals {
                (None, None, human.remove(&asin))
            } else {
                (
                    a.and_then(|a| a.instruction.clone()),
                    a.and_then(|a| a.instruction_attributes.clone()),
                    None,
                )
            };
            let index = b.recs.len();
            on_document(index, document_of(&p.name, &cold, &options));
            // the record and its fields
            let blob_at = b.blob.len();
            let mut ends = [0u32; NUM_FIELDS];
            let mut flags = 0;
            {
                let out = &mut b.blob;
                let mut end = |out: &Vec<u8>, f: usize| -> Result<(), String> {
                    ends[f] = u32::try_from(out.len() - blob_at)
                        .map_err(|_| format!("product {asin}: over 4 GB of fields"))?;
                    Ok(())
                };
                out.extend_from_slice(asin.as_bytes());
                end(out, F_ASIN)?;
                out.extend_from_slice(p.name.as_bytes());
                end(out, F_TITLE)?;
                out.extend_from_slice(p.category.as_bytes());
                end(out, F_CATEGORY)?;
                out.extend_from_slice(py_strip(&py_lower(&p.query)).as_bytes());
                end(out, F_QUERY)?;
                out.extend_from_slice(p.product_category.as_bytes());
                end(out, F_PRODUCT_CATEGORY)?;
                out.extend_from_slice(price_tag.as_bytes());
                end(out, F_PRICE_TAG)?;
                put_varint(out, options.len() as u32);
                for (name, values) in &options {
                    put_str(out, name);
                    put_list(out, values);
                }
                end(out, F_OPTIONS)?;
                put_list(out, &attributes);
                end(out, F_ATTRIBUTES)?;
                let processed: Vec<String> = attributes.iter().map(|a| super::fuzz::full_process(a)).collect();
                put_list(out, &processed);
                end(out, F_PROCESSED_ATTRIBUTES)?;
                if let Some(t) = &instruction_text {
                    flags |= HAS_INSTRUCTION;
                    out.extend_from_slice(t.as_bytes());
                }
                end(out, F_INSTRUCTION)?;
                if let Some(l) = &instruction_attributes {
                    flags |= HAS_INSTRUCTION_ATTRIBUTES;
                    put_list(out, l);
                }
                end(out, F_INSTRUCTION_ATTRIBUTES)?;
                if let Some(list) = &hum {
                    flags |= HAS_HUMAN;
                    put_varint(out, list.len() as u32);
                    for h in list {
                        put_str(out, &h.instruction);
                        put_list(out, &h.instruction_attributes);
                        match &h.instruction_options {
                            GoalOptions::Dict(d) => {
                                put_varint(out, 0);
                                put_varint(out, d.len() as u32);
                                for (k, v) in d {
                                    put_str(out, k);
                                    put_str(out, v);
                                }
                            }
                            GoalOptions::List(l) => {
                                put_varint(out, 1);
                                put_list(out, l);
                            }
                        }
                    }
                }
                end(out, F_HUMAN)?;
            }
            b.recs.push(ProdRec {
                blob: blob_at as u64,
                raw_off: span.0,
                price_lo: pricing[0],
                price_hi: pricing.get(1).copied().unwrap_or(0.0),
                weight: 0.0,
                raw_len: span.1,
                n_prices: pricing.len() as u32,
                combos,
                flags,
                ends,
                spans,
            });
            b.seen.insert(asin.into_boxed_str());
            Ok(())
        })?;
        if b.recs.is_empty() {
            return Err(WebShopError::Load(format!("{}: no products", files.products.display())));
        }
        Ok(b.finish())
    }

    /// The synthetic goals' weights, the ASIN and title orders.
    fn finish(self) -> CatalogParts {
        let CatalogBuilder { mut recs, blob, seen } = self;
        drop(seen);
        let n = recs.len();
        let mut by_asin: Vec<u64> = (0..n as u64).collect();
        let mut by_title: Vec<u32> = (0..n as u32).collect();
        {
            let view = CatalogView {
                recs: &recs,
                blob: &blob,
                by_title: &[],
            };
            by_asin.sort_unstable_by(|&a, &b| view.product(a as usize).asin().cmp(view.product(b as usize).asin()));
            by_title.sort_unstable_by(|&a, &b| view.product(a as usize).title().cmp(view.product(b as usize).title()));
        }
        // get_synthetic_goals' weights: mean of 1 / (goals holding the attribute) over the
        // product's instruction attributes, counted over every goal (option combination)
        let weights: Vec<f64> = {
            let view = CatalogView {
                recs: &recs,
                blob: &blob,
                by_title: &[],
            };
            let attrs_of = |i: usize| -> Vec<&str> {
                let p = view.product(i);
                p.instruction_attributes()
                    .map(|l| l.iter().collect())
                    .unwrap_or_default()
            };
            let has_goals = |i: usize| view.product(i).instruction_text().is_some() && recs[i].combos > 0;
            let mut cnt: HashMap<&str, usize> = HashMap::new();
            for i in (0..n).filter(|&i| has_goals(i)) {
                for a in attrs_of(i) {
                    *cnt.entry(a).or_insert(0) += recs[i].combos as usize;
                }
            }
            (0..n)
                .map(|i| {
                    if !has_goals(i) {
                        return 0.0;
                    }
                    let attributes = attrs_of(i);
                    let s: f64 = attributes.iter().map(|a| 1.0 / cnt[a] as f64).sum();
                    s / attributes.len() as f64
                })
                .collect()
        };
        for (r, w) in recs.iter_mut().zip(weights) {
            r.weight = w;
        }
        CatalogParts {
            recs,
            blob,
            by_asin,
            by_title,
        }
    }
}

/// The products in ASIN order: finds a product by its ASIN (binary search over the image).
#[derive(Debug)]
pub struct AsinIndex {
    img: Arc<Image>,
}

impl AsinIndex {
    fn sorted(&self) -> &[usize] {
        self.img.pod::<usize>(Sec::ByAsin)
    }

    /// Product `i`'s ASIN as bytes (compared as bytes: UTF-8 keeps the order).
    fn asin_of(&self, i: usize) -> &[u8] {
        let recs: &[ProdRec] = self.img.pod(Sec::ProdRecs);
        let rec = &recs[i];
        let lo = rec.blob as usize;
        &self.img.bytes(Sec::ProdBlob)[lo..lo + rec.ends[F_ASIN] as usize]
    }

    /// The index of the product with this ASIN.
    pub fn get(&self, asin: &str) -> Option<&usize> {
        let s = self.sorted();
        let asin = asin.as_bytes();
        let at = s.partition_point(|&i| self.asin_of(i) < asin);
        s.get(at).filter(|&&i| self.asin_of(i) == asin)
    }

    pub fn contains_key(&self, asin: &str) -> bool {
        self.get(asin).is_some()
    }

    pub fn len(&self) -> usize {
        self.sorted().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::ops::Index<&str> for AsinIndex {
    type Output = usize;
    fn index(&self, asin: &str) -> &usize {
        self.get(asin)
            .unwrap_or_else(|| panic!("no product with ASIN {asin:?} in the catalogue"))
    }
}

thread_local! {
    /// [`Catalog::cold`]'s read buffer.
    static COLD_BUF: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Products whose long texts [`Catalog::cold_shared`] keeps; cleared when it holds this many.
const COLD_KEPT: usize = 4096;

/// Products whose long texts the reward read recently (kept: a group of rollouts buys the same
/// products); cleared when it holds this many.
const LOWERED_KEPT: usize = 4096;

/// The loaded catalogue: the products in the image, their ASINs, the products file.
#[derive(Debug)]
pub struct Catalog {
    /// Every product's ASIN, in catalogue order.
    pub products: Vec<Product>,
    pub by_asin: AsinIndex,
    img: Arc<Image>,
    /// The products file, open: the long texts are read back from it ([`Catalog::cold`]).
    file: File,
    path: PathBuf,
    lowered: RwLock<HashMap<u32, Arc<Lowered>>>,
    /// Long texts read recently ([`Catalog::cold_shared`]).
    recent_cold: RwLock<HashMap<u32, Arc<Cold>>>,
}

const _: () = assert!(
    std::mem::size_of::<usize>() == 8,
    "the image stores product indices as u64"
);

impl Catalog {
    /// `load_products(file, num_products, human_goals)`, held in memory.
    pub fn load(files: &CatalogFiles, num_products: Option<usize>, human_goals: bool) -> Result<Self, WebShopError> {
        Self::load_with(files, num_products, human_goals, |_, _| {})
    }

    /// [`Catalog::load`], handing each kept product's search document to `on_document(index,
    /// text)` while the product's texts are at hand.
    pub fn load_with<D: FnMut(usize, String)>(
        files: &CatalogFiles,
        num_products: Option<usize>,
        human_goals: bool,
        on_document: D,
    ) -> Result<Self, WebShopError> {
        let parts = CatalogBuilder::stream(files, num_products, human_goals, on_document)?;
        let mut p = Parts::new();
        parts.add_to(&mut p);
        let img = p
            .in_memory("")
            .map_err(|e| WebShopError::Load(format!("the catalogue's image: {e}")))?;
        Catalog::from_image(Arc::new(img), &files.products)
    }

    /// The catalogue of an image; `products` is the file it was made from (the long texts are
    /// read from it).
    pub fn from_image(img: Arc<Image>, products: &Path) -> Result<Self, WebShopError> {
        let bad = |m: String| WebShopError::Load(format!("the catalogue's image: {m}"));
        let recs: &[ProdRec] = img.try_pod(Sec::ProdRecs).map_err(bad)?;
        let blob = img.bytes(Sec::ProdBlob);
        let n = recs.len();
        let by_asin: &[u64] = img.try_pod(Sec::ByAsin).map_err(bad)?;
        let by_title: &[u32] = img.try_pod(Sec::ByTitle).map_err(bad)?;
        if n == 0 || by_asin.len() != n || by_title.len() != n {
            return Err(bad(format!(
                "{n} products, {} in ASIN order, {} in title order",
                by_asin.len(),
                by_title.len()
            )));
        }
        for (i, r) in recs.iter().enumerate() {
            let ordered = r.ends.windows(2).all(|w| w[0] <= w[1]);
            let inside = (r.blob as usize)
                .checked_add(r.ends[NUM_FIELDS - 1] as usize)
                .is_some_and(|e| e <= blob.len());
            if !ordered || !inside {
                return Err(bad(format!("product {i}'s fields are out of bounds")));
            }
        }
        if by_asin.iter().any(|&i| i as usize >= n) || by_title.iter().any(|&i| i as usize >= n) {
            return Err(bad("a product index is out of range".into()));
        }
        let view = CatalogView { recs, blob, by_title };
        let asins = (0..n)
            .map(|i| {
                let asin = std::str::from_utf8(view.product(i).field(F_ASIN))
                    .map_err(|_| bad(format!("product {i}'s ASIN is not text")))?;
                Ok(Product { asin: asin.to_string() })
            })
            .collect::<Result<Vec<_>, WebShopError>>()?;
        let file = File::open(products).map_err(|e| WebShopError::Load(format!("{}: {e}", products.display())))?;
        Ok(Catalog {
            products: asins,
            by_asin: AsinIndex { img: img.clone() },
            img,
            file,
            path: products.to_path_buf(),
            lowered: RwLock::new(HashMap::new()),
            recent_cold: RwLock::new(HashMap::new()),
        })
    }

    fn view(&self) -> CatalogView<'_> {
        CatalogView {
            recs: self.img.pod(Sec::ProdRecs),
            blob: self.img.bytes(Sec::ProdBlob),
            by_title: self.img.pod(Sec::ByTitle),
        }
    }

    /// The number of products.
    pub fn len(&self) -> usize {
        self.products.len()
    }

    pub fn is_empty(&self) -> bool {
        self.products.is_empty()
    }

    /// Product `i`'s fields. Panics when out of range.
    pub fn product(&self, i: usize) -> ProductRef<'_> {
        self.view().product(i)
    }

    /// Indices of the products titled `name`.
    pub fn products_named<'a>(&'a self, name: &str) -> impl Iterator<Item = usize> + 'a {
        self.view().products_named(name)
    }

    /// Product `i`'s description and bullet points, read back from the products file: one
    /// `pread` of the part of its JSON object that holds them and its ASIN, and a parse of those
    /// three values alone (where they are was kept at load, [`ProdRec::spans`]). Panics when the
    /// file no longer holds the product there (it was changed while the shop was loaded).
    pub fn cold(&self, i: usize) -> Cold {
        use std::os::unix::fs::FileExt;
        let p = self.product(i);
        let rec = p.record();
        let spans = rec.spans;
        let lo = spans.iter().filter(|s| s[1] > 0).map(|s| s[0]).min().unwrap_or(0);
        let hi = spans.iter().map(|s| s[0] + s[1]).max().unwrap_or(0);
        let cold = COLD_BUF.with(|buf| {
            let mut bytes = buf.borrow_mut();
            bytes.clear();
            bytes.resize((hi - lo) as usize, 0);
            self.file
                .read_exact_at(&mut bytes, rec.raw_off + lo as u64)
                .map_err(|e| e.to_string())?;
            let parse = |s: [u32; 2]| (s[1] > 0).then(|| &bytes[(s[0] - lo) as usize..(s[0] + s[1] - lo) as usize]);
            let asin: String =
                serde_json::from_slice(parse(spans[S_ASIN]).unwrap_or(b"")).map_err(|e| e.to_string())?;
            if asin != p.asin() {
                return Err(format!("ASIN {asin}"));
            }
            let description: Option<String> = match parse(spans[S_DESCRIPTION]) {
                Some(b) => serde_json::from_slice(b).map_err(|e| e.to_string())?,
                None => None,
            };
            let bullets: Option<StrOrList> = match parse(spans[S_BULLETS]) {
                Some(b) => serde_json::from_slice(b).map_err(|e| e.to_string())?,
                None => None,
            };
            Ok::<Cold, String>(cold_of(description, bullets))
        });
        cold.unwrap_or_else(|_| {
            panic!(
                "{}: product {} is no longer at byte {}: the catalogue file changed while the shop was loaded",
                self.path.display(),
                p.asin(),
                rec.raw_off
            )
        })
    }

    /// [`Catalog::cold`], kept for the products whose texts were read recently: the envs of a
    /// group play the same goal and open the same products' pages (at most [`COLD_KEPT`]
    /// products, about 1.3 KB each, then cleared).
    pub fn cold_shared(&self, i: usize) -> Arc<Cold> {
        if let Some(c) = self.recent_cold.read().expect("not poisoned").get(&(i as u32)) {
            return c.clone();
        }
        let c = Arc::new(self.cold(i));
        let mut kept = self.recent_cold.write().expect("not poisoned");
        if kept.len() >= COLD_KEPT {
            kept.clear();
        }
        kept.insert(i as u32, c.clone());
        c
    }

    /// [`Catalog::cold`] as first written: the product's whole JSON object read back and parsed
    /// (the plain reference of the spans).
    pub fn cold_reference(&self, i: usize) -> Cold {
        use std::os::unix::fs::FileExt;
        #[derive(Deserialize)]
        struct Raw {
            asin: String,
            #[serde(default)]
            full_description: Option<String>,
            #[serde(default)]
            small_description: Option<StrOrList>,
        }
        let p = self.product(i);
        let (offset, len) = p.raw();
        let mut bytes = vec![0u8; len as usize];
        let raw: Result<Raw, String> = self
            .file
            .read_exact_at(&mut bytes, offset)
            .map_err(|e| e.to_string())
            .and_then(|_| serde_json::from_slice(&bytes).map_err(|e| e.to_string()));
        match raw {
            Ok(r) if r.asin == p.asin() => cold_of(r.full_description, r.small_description),
            _ => panic!(
                "{}: product {} is no longer at byte {offset}: the catalogue file changed while the shop was loaded",
                self.path.display(),
                p.asin()
            ),
        }
    }

    /// `(Title.lower(), ' '.join(BulletPoints).lower(), Description.lower())` of product `i`,
    /// kept for the products bought recently.
    pub fn lowered_texts(&self, i: usize) -> Arc<Lowered> {
        if let Some(l) = self.lowered.read().expect("not poisoned").get(&(i as u32)) {
            return l.clone();
        }
        let c = self.cold_shared(i);
        let l = Arc::new((
            py_lower(self.product(i).title()),
            py_lower(&c.bullets.join(" ")),
            py_lower(&c.description),
        ));
        let mut kept = self.lowered.write().expect("not poisoned");
        if kept.len() >= LOWERED_KEPT {
            kept.clear();
        }
        kept.insert(i as u32, l.clone());
        l
    }

    /// The search document of product `i` (what the index holds for it).
    pub fn document(&self, i: usize) -> String {
        let p = self.product(i);
        let options: Vec<(String, Vec<String>)> = p.options().map(|(n, v)| (n.to_string(), v.to_vec())).collect();
        document_of(p.title(), &self.cold(i), &options)
    }

    /// `generate_product_prices`: no price -> 100.0 (the loader already made it `[100.0]`), one
    /// price -> it, a range -> `random.uniform(lo, hi)`, in product order.
    pub fn prices(&self, rng: &mut PyRandom) -> Vec<f64> {
        let recs: &[ProdRec] = self.img.pod(Sec::ProdRecs);
        recs.iter()
            .map(|r| match r.n_prices {
                0 => 100.0,
                1 => r.price_lo,
                _ => rng.uniform(r.price_lo, r.price_hi),
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
