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
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "if", "in", "into", "is", "it", "no",
    "not", "of", "on", "or", "such", "that", "the", "their", "then", "there", "these", "they", "this",
    "to", "was", "will", "with",
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
    seg.chars().next().is_some_and(|c| c.is_alphabetic() || c.is_number_decimal_digit() || is_ext_pict(c))
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
            if n >= 2
                && matches!(chars[n - 2], '\'' | '\u{2019}' | '\u{ff07}')
                && matches!(chars[n - 1], 's' | 'S')
            {
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
#[derive(Debug)]
pub struct Index {
    postings: HashMap<String, Vec<(u32, u32)>>,
    /// Per doc: 1 / (k1 * ((1 - b) + b * L / avgdl)) for its encoded length L (float32).
    norm_inv: Vec<f32>,
    /// Docs with at least one term (Lucene's docCount).
    doc_count: u32,
    sum_total_term_freq: u64,
    avgdl: f32,
    /// Per doc: its ASIN (for the tie order).
    asins: Vec<String>,
}

thread_local! {
    static SCRATCH: RefCell<(Vec<f64>, Vec<u32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

impl Index {
    /// Builds the index from `(asin, document text)` pairs in catalogue order (documents are
    /// analyzed in parallel, postings merged in doc order).
    pub fn build<'a>(docs: impl Iterator<Item = (&'a str, String)>) -> Index {
        use rayon::prelude::*;
        let docs: Vec<(&str, String)> = docs.collect();
        let analyzed: Vec<(u32, Vec<(String, u32)>)> = docs
            .par_iter()
            .map(|(_, text)| {
                let terms = analyze(text);
                let len = terms.len() as u32;
                let mut tf: Vec<(String, u32)> = Vec::new();
                let mut at: HashMap<String, usize> = HashMap::new();
                for t in terms {
                    match at.get(&t) {
                        Some(&i) => tf[i].1 += 1,
                        None => {
                            at.insert(t.clone(), tf.len());
                            tf.push((t, 1));
                        }
                    }
                }
                (len, tf)
            })
            .collect();
        let mut postings: HashMap<String, Vec<(u32, u32)>> = HashMap::new();
        let mut lengths = Vec::with_capacity(docs.len());
        let asins: Vec<String> = docs.iter().map(|(a, _)| a.to_string()).collect();
        drop(docs);
        for (doc, (len, tf)) in analyzed.into_iter().enumerate() {
            lengths.push(len);
            for (t, n) in tf {
                postings.entry(t).or_default().push((doc as u32, n));
            }
        }
        for list in postings.values_mut() {
            list.sort_unstable_by_key(|p| p.0);
        }
        let doc_count = lengths.iter().filter(|&&l| l > 0).count() as u32;
        let sum_total_term_freq: u64 = lengths.iter().map(|&l| l as u64).sum();
        let avgdl = if doc_count == 0 { 1.0 } else { (sum_total_term_freq as f64 / doc_count as f64) as f32 };
        let norm_inv = lengths
            .iter()
            .map(|&l| {
                let dl = byte4_to_int(int_to_byte4(l)) as f32;
                1.0f32 / (K1 * ((1.0f32 - B) + B * dl / avgdl))
            })
            .collect();
        Index { postings, norm_inv, doc_count, sum_total_term_freq, avgdl, asins }
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

    /// Term frequencies and length of a doc, recomputed from the postings (tests).
    pub fn doc_freq(&self, term: &str) -> usize {
        self.postings.get(term).map_or(0, Vec::len)
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
                let Some(list) = self.postings.get(t) else { continue };
                let df = list.len() as f64;
                let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln() as f32;
                let weight = *c as f32 * idf;
                for &(doc, tf) in list {
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
                b.1.total_cmp(&a.1).then_with(|| self.asins[a.0 as usize].cmp(&self.asins[b.0 as usize]))
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
    fn analyzer_basics() {
        assert_eq!(analyze("Men's Running Shoes, the BEST!"), vec!["men", "run", "shoe", "best"]);
        assert_eq!(analyze("3.5mm wi-fi ★ ❄️"), vec!["3.5mm", "wi", "fi", "★", "❄️"]);
        assert_eq!(analyze(&"a".repeat(300)), vec!["a".repeat(255), "a".repeat(45)]);
        assert!(analyze("the and of").is_empty());
    }
}
