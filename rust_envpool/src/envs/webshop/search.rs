//! The search engine: the analyzer of the original's Lucene index (StandardTokenizer, English
//! possessive, lower case, Lucene's 33 English stop words, Porter stemming), an in-memory
//! inverted index, and Lucene 8.11's BM25 (k1 0.9, b 0.4) in its float32 arithmetic with the
//! one-byte document-length encoding (SmallFloat). Hits: the 50 best by score (desc) then ASIN.

use std::cell::RefCell;
use std::collections::HashMap;

use unicode_categories::UnicodeCategories;
use unicode_segmentation::UnicodeSegmentation;

use super::porter::stem;

/// Hits per search (`SEARCH_RETURN_N`).
pub const SEARCH_RETURN_N: usize = 50;
/// Lucene's `BooleanQuery.maxClauseCount`.
pub const MAX_CLAUSES: usize = 1024;
/// StandardTokenizer's default maximum token length (UTF-16 units); longer tokens are split.
pub const MAX_TOKEN_LENGTH: usize = 255;

const K1: f32 = 0.9;
const B: f32 = 0.4;

/// `EnglishAnalyzer.ENGLISH_STOP_WORDS_SET`.
pub const STOP_WORDS: [&str; 33] = [
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no", "not", "of",
    "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this", "to", "was", "will", "with",
];

/// Unicode Extended_Pictographic (the emoji StandardTokenizer keeps as tokens).
fn is_ext_pict(c: char) -> bool {
    let u = c as u32;
    matches!(u,
        0xA9 | 0xAE | 0x203C | 0x2049 | 0x2122 | 0x2139 | 0x2194..=0x2199 | 0x21A9..=0x21AA
        | 0x231A..=0x231B | 0x2328 | 0x2388 | 0x23CF | 0x23E9..=0x23F3 | 0x23F8..=0x23FA | 0x24C2
        | 0x25AA..=0x25AB | 0x25B6 | 0x25C0 | 0x25FB..=0x25FE | 0x2600..=0x2605 | 0x2607..=0x2612
        | 0x2614..=0x2685 | 0x2690..=0x2705 | 0x2708..=0x2712 | 0x2714 | 0x2716 | 0x271D | 0x2721
        | 0x2728 | 0x2733..=0x2734 | 0x2744 | 0x2747 | 0x274C | 0x274E | 0x2753..=0x2755 | 0x2757
        | 0x2763..=0x2767 | 0x2795..=0x2797 | 0x27A1 | 0x27B0 | 0x27BF | 0x2934..=0x2935
        | 0x2B05..=0x2B07 | 0x2B1B..=0x2B1C | 0x2B50 | 0x2B55 | 0x3030 | 0x303D | 0x3297 | 0x3299
        | 0x1F000..=0x1F0FF | 0x1F10D..=0x1F10F | 0x1F12F | 0x1F16C..=0x1F171 | 0x1F17E..=0x1F17F
        | 0x1F18E | 0x1F191..=0x1F19A | 0x1F1AD..=0x1F1E5 | 0x1F201..=0x1F20F | 0x1F21A | 0x1F22F
        | 0x1F232..=0x1F23A | 0x1F23C..=0x1F23F | 0x1F249..=0x1F3FA | 0x1F400..=0x1F53D
        | 0x1F546..=0x1F64F | 0x1F680..=0x1F6FF | 0x1F774..=0x1F77F | 0x1F7D5..=0x1F7FF
        | 0x1F80C..=0x1F80F | 0x1F848..=0x1F84F | 0x1F85A..=0x1F85F | 0x1F888..=0x1F88F
        | 0x1F8AE..=0x1F8FF | 0x1F90C..=0x1F93A | 0x1F93C..=0x1F945 | 0x1F947..=0x1FAFF
        | 0x1FC00..=0x1FFFD)
}

/// Whether a UAX #29 word segment is a token for StandardTokenizer: it starts with a letter, a
/// decimal digit or an emoji (punctuation, symbols and spaces are skipped, also when extending
/// characters such as U+FF9F attach to them).
fn is_token(seg: &str) -> bool {
    seg.chars()
        .next()
        .is_some_and(|c| c.is_alphabetic() || c.is_number_decimal_digit() || is_ext_pict(c))
}

/// Java's `Character.toLowerCase(int)` (simple case mapping).
fn java_lower(c: char) -> char {
    if c == '\u{130}' {
        return 'i';
    }
    let mut it = c.to_lowercase();
    match (it.next(), it.next()) {
        (Some(l), None) => l,
        _ => c,
    }
}

/// Analyzes `text` as the index and the queries are analyzed: the terms in order.
pub fn analyze(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for seg in text.split_word_bounds() {
        if !is_token(seg) {
            continue;
        }
        // split tokens longer than MAX_TOKEN_LENGTH UTF-16 units
        let mut start = 0;
        let mut units = 0;
        let mut pieces = Vec::new();
        for (i, c) in seg.char_indices() {
            if units + c.len_utf16() > MAX_TOKEN_LENGTH {
                pieces.push(&seg[start..i]);
                start = i;
                units = 0;
            }
            units += c.len_utf16();
        }
        pieces.push(&seg[start..]);
        for piece in pieces {
            // English possessive: drop a trailing 's / ’s / ＇s
            let mut chars: Vec<char> = piece.chars().collect();
            let n = chars.len();
            if n >= 2 && matches!(chars[n - 2], '\'' | '\u{2019}' | '\u{ff07}') && matches!(chars[n - 1], 's' | 'S') {
                chars.truncate(n - 2);
            }
            let lower: String = chars.into_iter().map(java_lower).collect();
            if STOP_WORDS.contains(&lower.as_str()) {
                continue;
            }
            out.push(stem(&lower));
        }
    }
    out
}

/// SmallFloat.intToByte4.
pub fn int_to_byte4(i: u32) -> u8 {
    const NUM_FREE_VALUES: u32 = 24;
    fn long_to_int4(i: u64) -> u32 {
        let num_bits = 64 - i.leading_zeros();
        if num_bits < 4 {
            i as u32
        } else {
            let shift = num_bits - 4;
            let mut encoded = (i >> shift) as u32;
            encoded &= 0x07;
            encoded |= (shift + 1) << 3;
            encoded
        }
    }
    if i < NUM_FREE_VALUES {
        i as u8
    } else {
        (NUM_FREE_VALUES + long_to_int4((i - NUM_FREE_VALUES) as u64)) as u8
    }
}

/// SmallFloat.byte4ToInt.
pub fn byte4_to_int(b: u8) -> u32 {
    const NUM_FREE_VALUES: u32 = 24;
    let i = b as u32;
    if i < NUM_FREE_VALUES {
        return i;
    }
    let j = i - NUM_FREE_VALUES;
    let bits = (j & 0x07) as u64;
    let shift = (j >> 3) as i32 - 1;
    let decoded = if shift == -1 { bits } else { (bits | 0x08) << shift };
    (NUM_FREE_VALUES as u64 + decoded) as u32
}

/// Why a search could not run (the original raises).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SearchError {
    /// More distinct query terms than Lucene's BooleanQuery allows.
    TooManyClauses(usize),
}

/// The inverted index over the catalogue's documents (internal doc id = product index).
///
/// Compact, for the 1.18 M-product catalogue: one id per distinct term, and per term its
/// document frequency and its postings as bytes (LEB128 varints of the gap to the previous doc
/// id and of the term frequency, in doc order), as Lucene stores them. [`IndexBuilder`] takes the
/// documents in chunks as the catalogue streams in, so that neither all document texts nor all
/// their analyses are held at once.
#[derive(Debug)]
pub struct Index {
    terms: HashMap<Box<str>, u32>,
    /// Per term id: (document frequency, postings bytes).
    postings: Vec<(u32, Box<[u8]>)>,
    /// Per doc: 1 / (k1 * ((1 - b) + b * L / avgdl)) for its encoded length L (float32).
    norm_inv: Vec<f32>,
    /// Docs with at least one term (Lucene's docCount).
    doc_count: u32,
    sum_total_term_freq: u64,
    avgdl: f32,
    /// Per doc: its ASIN (for the tie order).
    asins: Vec<Box<str>>,
}

/// Documents analyzed at once (bounds the memory of the texts and their analyses).
pub const BUILD_CHUNK: usize = 16_384;

fn put_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn get_varint(bytes: &[u8], at: &mut usize) -> u32 {
    let mut v = 0u32;
    let mut shift = 0;
    loop {
        let b = bytes[*at];
        *at += 1;
        v |= ((b & 0x7f) as u32) << shift;
        if b < 0x80 {
            return v;
        }
        shift += 7;
    }
}

/// Iterates a term's postings: (doc id, term frequency) in doc order.
struct Postings<'a> {
    bytes: &'a [u8],
    at: usize,
    doc: u32,
}

impl Iterator for Postings<'_> {
    type Item = (u32, u32);
    fn next(&mut self) -> Option<(u32, u32)> {
        if self.at >= self.bytes.len() {
            return None;
        }
        self.doc += get_varint(self.bytes, &mut self.at);
        let tf = get_varint(self.bytes, &mut self.at);
        Some((self.doc, tf))
    }
}

thread_local! {
    static SCRATCH: RefCell<(Vec<f64>, Vec<u32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// Builds an [`Index`] from documents handed over in doc order, a chunk at a time (each chunk
/// analyzed in parallel, its postings merged in doc order).
#[derive(Default)]
pub struct IndexBuilder {
    terms: HashMap<Box<str>, u32>,
    /// per term id: df, last doc id, postings bytes
    lists: Vec<(u32, u32, Vec<u8>)>,
    lengths: Vec<u32>,
}

impl IndexBuilder {
    /// Adds the next documents (doc ids continue from the last chunk).
    pub fn add_chunk(&mut self, docs: Vec<String>) {
        use rayon::prelude::*;
        let lo = self.lengths.len() as u32;
        let analyzed: Vec<(u32, Vec<(String, u32)>)> = docs
            .par_iter()
            .map(|text| {
                let terms = analyze(text);
                let len = terms.len() as u32;
                let mut tf: Vec<(String, u32)> = Vec::new();
                let mut at: HashMap<&str, usize> = HashMap::new();
                for t in &terms {
                    match at.get(t.as_str()) {
                        Some(&j) => tf[j].1 += 1,
                        None => {
                            at.insert(t.as_str(), tf.len());
                            tf.push((t.clone(), 1));
                        }
                    }
                }
                (len, tf)
            })
            .collect();
        drop(docs);
        for (off, (len, tf)) in analyzed.into_iter().enumerate() {
            let d = lo + off as u32;
            self.lengths.push(len);
            for (t, c) in tf {
                let id = match self.terms.get(t.as_str()) {
                    Some(&id) => id,
                    None => {
                        let id = self.lists.len() as u32;
                        self.terms.insert(t.into_boxed_str(), id);
                        self.lists.push((0, 0, Vec::new()));
                        id
                    }
                };
                let (df, last, bytes) = &mut self.lists[id as usize];
                let prev = if *df == 0 { 0 } else { *last };
                put_varint(bytes, d - prev);
                put_varint(bytes, c);
                *df += 1;
                *last = d;
            }
        }
    }

    /// The documents added so far.
    pub fn len(&self) -> usize {
        self.lengths.len()
    }

    pub fn is_empty(&self) -> bool {
        self.lengths.is_empty()
    }

    /// The index; `asins[i]` is document `i`'s ASIN (the tie order).
    pub fn finish(self, asins: Vec<Box<str>>) -> Index {
        assert_eq!(asins.len(), self.lengths.len(), "one ASIN per document");
        let IndexBuilder {
            mut terms,
            lists,
            lengths,
        } = self;
        let postings: Vec<(u32, Box<[u8]>)> = lists.into_iter().map(|(df, _, b)| (df, b.into_boxed_slice())).collect();
        terms.shrink_to_fit();
        let doc_count = lengths.iter().filter(|&&l| l > 0).count() as u32;
        let sum_total_term_freq: u64 = lengths.iter().map(|&l| l as u64).sum();
        let avgdl = if doc_count == 0 {
            1.0
        } else {
            (sum_total_term_freq as f64 / doc_count as f64) as f32
        };
        let norm_inv = lengths
            .iter()
            .map(|&l| {
                let dl = byte4_to_int(int_to_byte4(l)) as f32;
                1.0f32 / (K1 * ((1.0f32 - B) + B * dl / avgdl))
            })
            .collect();
        Index {
            terms,
            postings,
            norm_inv,
            doc_count,
            sum_total_term_freq,
            avgdl,
            asins,
        }
    }
}

impl Index {
    /// Builds the index over `asins.len()` documents; `doc(i)` is the text of document `i`
    /// (made on demand, [`BUILD_CHUNK`] at a time).
    pub fn build<F: Fn(usize) -> String + Sync>(asins: Vec<Box<str>>, doc: F) -> Index {
        use rayon::prelude::*;
        let mut b = IndexBuilder::default();
        for lo in (0..asins.len()).step_by(BUILD_CHUNK) {
            let hi = (lo + BUILD_CHUNK).min(asins.len());
            b.add_chunk((lo..hi).into_par_iter().map(&doc).collect());
        }
        b.finish(asins)
    }

    fn list(&self, term: &str) -> Option<(u32, Postings<'_>)> {
        let &id = self.terms.get(term)?;
        let (df, bytes) = &self.postings[id as usize];
        Some((*df, Postings { bytes, at: 0, doc: 0 }))
    }

    /// Distinct terms in the index.
    pub fn num_terms(&self) -> usize {
        self.terms.len()
    }

    pub fn num_docs(&self) -> usize {
        self.asins.len()
    }

    pub fn avgdl(&self) -> f32 {
        self.avgdl
    }

    pub fn sum_total_term_freq(&self) -> u64 {
        self.sum_total_term_freq
    }

    /// The number of docs holding `term` (an analyzed term).
    pub fn doc_freq(&self, term: &str) -> usize {
        self.list(term).map_or(0, |(df, _)| df as usize)
    }

    /// The postings of `term` (an analyzed term): (doc id, term frequency) in doc order.
    pub fn postings(&self, term: &str) -> Vec<(u32, u32)> {
        self.list(term).map_or_else(Vec::new, |(_, p)| p.collect())
    }

    /// Searches `query`: the hits (doc id, float32 score) best first, at most
    /// [`SEARCH_RETURN_N`], and the number of matching docs.
    pub fn search(&self, query: &str) -> Result<(Vec<(u32, f32)>, usize), SearchError> {
        let terms = analyze(query);
        let mut counts: Vec<(String, u32)> = Vec::new();
        for t in terms {
            if let Some(slot) = counts.iter_mut().find(|(x, _)| *x == t) {
                slot.1 += 1;
            } else {
                counts.push((t, 1));
            }
        }
        if counts.len() > MAX_CLAUSES {
            return Err(SearchError::TooManyClauses(counts.len()));
        }
        let n = self.doc_count as f64;
        SCRATCH.with(|cell| {
            let mut guard = cell.borrow_mut();
            let (scores, touched) = &mut *guard;
            if scores.len() < self.asins.len() {
                scores.resize(self.asins.len(), f64::NAN);
            }
            for (t, c) in &counts {
                let Some((df, list)) = self.list(t) else { continue };
                let df = df as f64;
                let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln() as f32;
                let weight = *c as f32 * idf;
                for (doc, tf) in list {
                    let inv = self.norm_inv[doc as usize];
                    let s = weight - weight / (1.0f32 + tf as f32 * inv);
                    let slot = &mut scores[doc as usize];
                    if slot.is_nan() {
                        *slot = 0.0;
                        touched.push(doc);
                    }
                    *slot += s as f64;
                }
            }
            let mut hits: Vec<(u32, f32)> = touched.iter().map(|&d| (d, scores[d as usize] as f32)).collect();
            for &d in touched.iter() {
                scores[d as usize] = f64::NAN;
            }
            touched.clear();
            let matching = hits.len();
            let order = |a: &(u32, f32), b: &(u32, f32)| {
                b.1.total_cmp(&a.1)
                    .then_with(|| self.asins[a.0 as usize].cmp(&self.asins[b.0 as usize]))
            };
            if hits.len() > SEARCH_RETURN_N {
                hits.select_nth_unstable_by(SEARCH_RETURN_N - 1, order);
                hits.truncate(SEARCH_RETURN_N);
            }
            hits.sort_by(order);
            Ok((hits, matching))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_float_round_trip() {
        for i in 0..24 {
            assert_eq!(byte4_to_int(int_to_byte4(i)), i);
        }
        // lengths above 39 lose precision: 41 -> 40, 107 -> 104 (Lucene's table)
        assert_eq!(byte4_to_int(int_to_byte4(41)), 40);
        assert_eq!(byte4_to_int(int_to_byte4(107)), 104);
        // the encoding is monotone
        let mut prev = 0;
        for i in 0..100_000u32 {
            let d = byte4_to_int(int_to_byte4(i));
            assert!(d <= i && d >= prev);
            prev = d;
        }
    }

    #[test]
    fn compact_postings_equal_a_plain_inverted_index() {
        // random documents over a small vocabulary, several build chunks, gaps past one varint byte
        let mut rng = crate::envs::webshop::pyrandom::PyRandom::new(7);
        let words = [
            "red", "shoe", "blue", "shirt", "cotton", "wool", "lamp", "desk", "chair", "oak",
        ];
        let n = BUILD_CHUNK * 2 + 300;
        let docs: Vec<String> = (0..n)
            .map(|i| {
                let k = if i % 97 == 0 { 0 } else { 1 + rng.randbelow(12) as usize };
                (0..k)
                    .map(|_| words[rng.randbelow(words.len() as u64) as usize])
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .collect();
        let asins: Vec<Box<str>> = (0..n).map(|i| format!("A{i:09}").into_boxed_str()).collect();
        let idx = Index::build(asins, |i| docs[i].clone());
        let mut plain: HashMap<String, Vec<(u32, u32)>> = HashMap::new();
        for (d, text) in docs.iter().enumerate() {
            let mut tf: Vec<(String, u32)> = Vec::new();
            for t in analyze(text) {
                match tf.iter_mut().find(|(x, _)| *x == t) {
                    Some(slot) => slot.1 += 1,
                    None => tf.push((t, 1)),
                }
            }
            for (t, c) in tf {
                plain.entry(t).or_default().push((d as u32, c));
            }
        }
        assert_eq!(idx.num_terms(), plain.len());
        for (t, list) in &plain {
            assert_eq!(&idx.postings(t), list, "{t}");
            assert_eq!(idx.doc_freq(t), list.len());
        }
        assert_eq!(idx.doc_freq("nothing"), 0);
        let mut buf = Vec::new();
        for v in [0u32, 1, 127, 128, 16_383, 16_384, u32::MAX] {
            buf.clear();
            put_varint(&mut buf, v);
            let mut at = 0;
            assert_eq!((get_varint(&buf, &mut at), at), (v, buf.len()));
        }
    }

    #[test]
    fn analyzer_basics() {
        assert_eq!(
            analyze("Men's Running Shoes, the BEST!"),
            vec!["men", "run", "shoe", "best"]
        );
        assert_eq!(analyze("3.5mm wi-fi ★ ❄️"), vec!["3.5mm", "wi", "fi", "★", "❄️"]);
        assert_eq!(analyze(&"a".repeat(300)), vec!["a".repeat(255), "a".repeat(45)]);
        assert!(analyze("the and of").is_empty());
    }
}
