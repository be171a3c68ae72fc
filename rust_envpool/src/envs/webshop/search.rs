//! The search engine: the analyzer of the original's Lucene index (StandardTokenizer, English
//! possessive, lower case, Lucene's 33 English stop words, Porter stemming), an inverted index in
//! the shop's image, and Lucene 8.11's BM25 (k1 0.9, b 0.4) in its float32 arithmetic with the
//! one-byte document-length encoding (SmallFloat). Hits: the 50 best by score (desc) then ASIN,
//! found by scoring every matching posting ([`Index::search`], the reference) or with dynamic
//! pruning ([`Index::search_top`], block-max MaxScore: the same hits).

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::Arc;

use bytemuck::{Pod, Zeroable};
use unicode_categories::UnicodeCategories;
use unicode_segmentation::UnicodeSegmentation;
use xxhash_rust::xxh3::xxh3_64;

use super::image::{Image, Parts, Sec};
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

/// Postings per block of a term's block-max table (terms with more postings have one).
pub const BLOCK: usize = 32;

/// One term of the index: where its postings are, its document frequency, the largest
/// `tf * inv` of its postings (its best BM25 score for any weight: the score grows with it), and
/// its first block.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct TermRec {
    pub post_off: u64,
    pub post_len: u32,
    pub df: u32,
    pub max_x: f32,
    pub blk: u32,
}

/// [`BLOCK`] postings of a term: the last doc id, where they end (bytes into the term's
/// postings) and their largest `tf * inv`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct Block {
    pub last_doc: u32,
    pub end: u32,
    pub max_x: f32,
}

/// The index's collection statistics.
#[repr(C)]
#[derive(Clone, Copy, Debug, Pod, Zeroable)]
pub struct IndexStats {
    pub num_docs: u64,
    pub sum_total_term_freq: u64,
    /// Docs with at least one term (Lucene's docCount).
    pub doc_count: u32,
    pub avgdl: f32,
}

impl TermRec {
    fn num_blocks(&self) -> usize {
        if self.df as usize > BLOCK {
            (self.df as usize).div_ceil(BLOCK)
        } else {
            0
        }
    }
}

/// The inverted index over the catalogue's documents (internal doc id = product index), in the
/// shop's image ([`super::image`]).
///
/// Compact, for the 1.18 M-product catalogue: one id per distinct term (found through an
/// open-addressing table), per term its document frequency and its postings as bytes (LEB128
/// varints of the gap to the previous doc id and of the term frequency, in doc order), as Lucene
/// stores them, and for long lists a block-max table ([`Block`]). [`IndexBuilder`] takes the
/// documents in chunks as the catalogue streams in, so that neither all document texts nor all
/// their analyses are held at once.
///
/// Two searches give the same hits: [`Index::search`] scores every matching posting (the
/// reference), [`Index::search_top`] skips the documents that cannot reach the top 50
/// (block-max MaxScore).
#[derive(Debug)]
pub struct Index {
    img: Arc<Image>,
    stats: IndexStats,
    /// `1 / (k1 ((1 - b) + b L / avgdl))` per one-byte length norm.
    inv: [f32; 256],
    /// The smallest of those over the docs (the longest doc's).
    inv_min: f32,
    /// The norm bytes the docs have.
    norms: Vec<u8>,
}

/// Documents analyzed at once (bounds the memory of the texts and their analyses).
pub const BUILD_CHUNK: usize = 16_384;

/// Appends `v` as a LEB128 varint.
pub fn put_varint(out: &mut Vec<u8>, mut v: u32) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// Reads the LEB128 varint at `*at` and moves past it.
pub fn get_varint(bytes: &[u8], at: &mut usize) -> u32 {
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

/// Lucene's BM25 term score in its float32 arithmetic, `w - w / (1 + x)` with `w` the query
/// term's weight (count x idf) and `x = tf * inv` the posting's. It never decreases as `x`
/// grows (each rounded operation is monotone), so a term's (a block's) largest `x` gives its
/// largest score exactly.
#[inline]
fn term_score(w: f32, x: f32) -> f32 {
    w - w / (1.0f32 + x)
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
    static WINDOW_SCRATCH: RefCell<Scratch> = const { RefCell::new(Scratch { acc: Vec::new(), live: Vec::new() }) };
}

/// A window's sums and the docs still in the running (a bit set), kept per thread.
struct Scratch {
    acc: Vec<f64>,
    live: Vec<u64>,
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

/// The index's part of an image, as [`IndexBuilder::finish_parts`] leaves it.
pub struct IndexParts {
    stats: [IndexStats; 1],
    recs: Vec<TermRec>,
    hash: Vec<u32>,
    str_off: Vec<u64>,
    strs: Vec<u8>,
    postings: Vec<Vec<u8>>,
    blocks: Vec<Block>,
    norm_inv: Vec<f32>,
    norm_byte: Vec<u8>,
    asin_rank: Vec<u32>,
}

impl IndexParts {
    /// Adds the index's sections to an image.
    pub fn add_to<'a>(&'a self, parts: &mut Parts<'a>) {
        parts.add_pod(Sec::IdxStats, &self.stats);
        parts.add_pod(Sec::TermRecs, &self.recs);
        parts.add_pod(Sec::TermHash, &self.hash);
        parts.add_pod(Sec::TermStrOff, &self.str_off);
        parts.add(Sec::TermStr, &self.strs);
        for p in &self.postings {
            parts.add(Sec::Postings, p);
        }
        parts.add_pod(Sec::Blocks, &self.blocks);
        parts.add_pod(Sec::NormInv, &self.norm_inv);
        parts.add_pod(Sec::AsinRank, &self.asin_rank);
        parts.add(Sec::NormByte, &self.norm_byte);
    }
}

fn term_slot(term: &[u8], mask: usize) -> usize {
    (xxh3_64(term) as usize) & mask
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

    /// The index held in memory; `asins[i]` is document `i`'s ASIN (the tie order).
    pub fn finish(self, asins: Vec<Box<str>>) -> Index {
        assert_eq!(asins.len(), self.lengths.len(), "one ASIN per document");
        let mut order: Vec<u32> = (0..asins.len() as u32).collect();
        order.sort_by(|&a, &b| asins[a as usize].cmp(&asins[b as usize]));
        let mut rank = vec![0u32; asins.len()];
        for (r, &d) in order.iter().enumerate() {
            rank[d as usize] = r as u32;
        }
        let parts = self.finish_parts(rank);
        let mut p = Parts::new();
        parts.add_to(&mut p);
        let img = p.in_memory("").expect("an anonymous map for the index");
        Index::from_image(Arc::new(img)).expect("a fresh index image is valid")
    }

    /// The index's sections; `asin_rank[i]` is document `i`'s rank in ASIN order (the tie order).
    pub fn finish_parts(self, asin_rank: Vec<u32>) -> IndexParts {
        assert_eq!(asin_rank.len(), self.lengths.len(), "one ASIN rank per document");
        let IndexBuilder { terms, lists, lengths } = self;
        let doc_count = lengths.iter().filter(|&&l| l > 0).count() as u32;
        let sum_total_term_freq: u64 = lengths.iter().map(|&l| l as u64).sum();
        let avgdl = if doc_count == 0 {
            1.0
        } else {
            (sum_total_term_freq as f64 / doc_count as f64) as f32
        };
        let norm_byte: Vec<u8> = lengths.iter().map(|&l| int_to_byte4(l)).collect();
        let inv = inv_table(avgdl);
        let norm_inv: Vec<f32> = norm_byte.iter().map(|&b| inv[b as usize]).collect();
        // the terms' texts in id order, and the open-addressing table
        let n_terms = lists.len();
        let mut names: Vec<Box<str>> = vec![Box::from(""); n_terms];
        for (t, id) in terms {
            names[id as usize] = t;
        }
        let mut strs = Vec::new();
        let mut str_off = Vec::with_capacity(n_terms + 1);
        str_off.push(0u64);
        for t in &names {
            strs.extend_from_slice(t.as_bytes());
            str_off.push(strs.len() as u64);
        }
        let cap = (2 * n_terms).next_power_of_two().max(2);
        let mut hash = vec![0u32; cap];
        for (id, t) in names.iter().enumerate() {
            let mut i = term_slot(t.as_bytes(), cap - 1);
            while hash[i] != 0 {
                i = (i + 1) & (cap - 1);
            }
            hash[i] = id as u32 + 1;
        }
        drop(names);
        // per term: its best x and block-max table
        let mut recs = Vec::with_capacity(n_terms);
        let mut blocks = Vec::new();
        let mut postings = Vec::with_capacity(n_terms);
        let mut off = 0u64;
        for (df, _, bytes) in lists {
            let rec_blk = blocks.len() as u32;
            let mut it = Postings {
                bytes: &bytes,
                at: 0,
                doc: 0,
            };
            let (mut max_x, mut blk_x, mut k) = (0f32, 0f32, 0usize);
            while let Some((doc, tf)) = it.next() {
                let x = tf as f32 * norm_inv[doc as usize];
                max_x = max_x.max(x);
                blk_x = blk_x.max(x);
                k += 1;
                if df as usize > BLOCK && (k % BLOCK == 0 || k == df as usize) {
                    blocks.push(Block {
                        last_doc: doc,
                        end: it.at as u32,
                        max_x: blk_x,
                    });
                    blk_x = 0.0;
                }
            }
            recs.push(TermRec {
                post_off: off,
                post_len: bytes.len() as u32,
                df,
                max_x,
                blk: rec_blk,
            });
            off += bytes.len() as u64;
            postings.push(bytes);
        }
        IndexParts {
            stats: [IndexStats {
                num_docs: lengths.len() as u64,
                sum_total_term_freq,
                doc_count,
                avgdl,
            }],
            recs,
            hash,
            str_off,
            strs,
            postings,
            blocks,
            norm_inv,
            norm_byte,
            asin_rank,
        }
    }
}

/// `1 / (k1 * ((1 - b) + b * L / avgdl))` (float32) for each one-byte length norm.
fn inv_table(avgdl: f32) -> [f32; 256] {
    let mut t = [0f32; 256];
    for (b, v) in t.iter_mut().enumerate() {
        let dl = byte4_to_int(b as u8) as f32;
        *v = 1.0f32 / (K1 * ((1.0f32 - B) + B * dl / avgdl));
    }
    t
}

/// The distinct analyzed terms of a query with their counts, in order of first appearance (one
/// SHOULD clause each, boosted by its count).
pub(super) fn query_terms(query: &str) -> Result<Vec<(String, u32)>, SearchError> {
    let mut counts: Vec<(String, u32)> = Vec::new();
    for t in analyze(query) {
        if let Some(slot) = counts.iter_mut().find(|(x, _)| *x == t) {
            slot.1 += 1;
        } else {
            counts.push((t, 1));
        }
    }
    if counts.len() > MAX_CLAUSES {
        return Err(SearchError::TooManyClauses(counts.len()));
    }
    Ok(counts)
}

/// A doc that cannot be among the top 50 is skipped when the sum of its terms' bounds is below
/// the 50th score by more than this fraction: the bounds are summed in another order than the
/// score (float64, each rounding off by 2^-53 at most), then the score is rounded to float32
/// (2^-24); this margin is far above both, so a skipped doc's float32 score is below the 50th,
/// never equal to it (an equal score with a smaller ASIN would enter).
const PRUNE_MARGIN: f64 = 1e-5;

const NO_DOC: u32 = u32::MAX;

/// One query term's postings during [`Index::search_top`].
struct Cursor<'a> {
    bytes: &'a [u8],
    blocks: &'a [Block],
    at: usize,
    /// The current posting's doc ([`NO_DOC`] past the last).
    doc: u32,
    tf: u32,
    /// A block at or before the current posting's block.
    blk: usize,
    w: f32,
    max_x: f32,
    /// The term's position in the query (the order its score is summed in).
    qpos: u32,
}

/// Reads the posting at `*at` of a postings list: `doc` moves on by its gap and `tf` takes its
/// term frequency, or `doc` becomes [`NO_DOC`] at the end of the list.
#[inline(always)]
fn read_posting(bytes: &[u8], at: &mut usize, doc: &mut u32, tf: &mut u32) {
    // most postings are a one-byte gap and a one-byte tf: both read at once
    if let Some(&[g, t]) = bytes.get(*at..*at + 2) {
        if (g | t) < 0x80 {
            *doc += g as u32;
            *tf = t as u32;
            *at += 2;
            return;
        }
    } else if *at >= bytes.len() {
        *doc = NO_DOC;
        return;
    }
    *doc += get_varint(bytes, at);
    *tf = get_varint(bytes, at);
}

impl Cursor<'_> {
    #[inline(always)]
    fn next(&mut self) {
        read_posting(self.bytes, &mut self.at, &mut self.doc, &mut self.tf);
    }

    /// The largest `x` of the block that holds the first posting >= `target` (the whole list's
    /// without blocks); None when no posting is >= `target`.
    fn block_max(&mut self, target: u32) -> Option<f32> {
        if self.doc == NO_DOC {
            return None;
        }
        if self.blocks.is_empty() {
            return Some(self.max_x);
        }
        while self.blk < self.blocks.len() && self.blocks[self.blk].last_doc < target {
            self.blk += 1;
        }
        self.blocks.get(self.blk).map(|b| b.max_x)
    }

    /// Moves to the first posting >= `target`, skipping whole blocks.
    fn advance(&mut self, target: u32) {
        if self.doc >= target {
            return;
        }
        if !self.blocks.is_empty() {
            while self.blk < self.blocks.len() && self.blocks[self.blk].last_doc < target {
                self.blk += 1;
            }
            if self.blk == self.blocks.len() {
                self.doc = NO_DOC;
                self.at = self.bytes.len();
                return;
            }
            if self.blk > 0 {
                let prev = self.blocks[self.blk - 1];
                if self.doc < prev.last_doc {
                    self.at = prev.end as usize;
                    self.doc = prev.last_doc;
                }
            }
        }
        while self.doc < target {
            self.next();
        }
    }
}

/// The smallest sum a doc needs to stay in the running when the terms not yet added can give it
/// `rest` at most and the 50th score is above `theta`: `theta - rest`, and above 0 (a sum of
/// 0: no term met the doc, as every score is > 0 in [`Index::search_top_windowed`]). Comparing a
/// sum with it rather than the sum plus `rest` with `theta` differs by a rounding of float64,
/// far below [`PRUNE_MARGIN`].
#[inline]
fn cut(theta: f64, rest: f64) -> f64 {
    (theta - rest).max(f64::MIN_POSITIVE)
}

/// The bits of the sums in `acc` (64 of them) that are >= `cut` (bit `i`: `acc[i]`); SSE2 on
/// x86-64 (two sums per comparison), else [`at_least_plain`].
#[inline]
fn at_least(acc: &[f64], cut: f64) -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_cmpge_pd, _mm_loadu_pd, _mm_movemask_pd, _mm_set1_pd};
        let acc = &acc[..64];
        let mut keep = 0u64;
        // SAFETY: SSE2 is part of x86-64; each load reads 2 of the 64 f64 that `acc` holds
        // (i + 1 < 64), unaligned loads allowed.
        unsafe {
            let c = _mm_set1_pd(cut);
            for i in (0..64).step_by(2) {
                let v = _mm_loadu_pd(acc.as_ptr().add(i));
                keep |= (_mm_movemask_pd(_mm_cmpge_pd(v, c)) as u64) << i;
            }
        }
        keep
    }
    #[cfg(not(target_arch = "x86_64"))]
    at_least_plain(acc, cut)
}

/// [`at_least`] one sum at a time (the reference).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn at_least_plain(acc: &[f64], cut: f64) -> u64 {
    acc[..64]
        .iter()
        .enumerate()
        .fold(0u64, |keep, (i, &a)| keep | (((a >= cut) as u64) << i))
}

/// Postings below which a query is scored in full rather than pruned.
const SMALL_QUERY: u64 = 16_384;

/// Docs per window of [`Index::search_top`].
const WINDOW: usize = 4096;
/// Term frequencies below this (99.8 % of the postings the full catalogue's searches read) are
/// scored from a per-query table by (tf, length norm), the others directly.
const TF_TABLE: usize = 8;
/// A non-essential term is looked up doc by doc (skipping blocks) rather than read through the
/// window when it has this many times more postings there than docs are left.
const PROBE_RATIO: usize = 16;

/// One query term during [`Index::search_top`].
struct WTerm<'a> {
    cur: Cursor<'a>,
    df: u32,
    /// The first block whose last doc is in or after the current window.
    wblk: usize,
    /// The term's score by `tf * 256 + norm byte` for tf < [`TF_TABLE`] and the norm bytes of
    /// the index.
    table: Vec<f32>,
    /// Its best score in the current window (0: no posting there).
    m: f64,
}

impl WTerm<'_> {
    /// The score of a posting: `term_score(w, tf * inv)` (from the table when it has it).
    #[inline]
    fn score(&self, tf: u32, norm: u8, inv: &[f32; 256]) -> f32 {
        if (tf as usize) < TF_TABLE {
            self.table[tf as usize * 256 + norm as usize]
        } else {
            term_score(self.cur.w, tf as f32 * inv[norm as usize])
        }
    }

    /// Adds the scores of the term's postings in `[lo, hi)` to `acc` (indexed from `lo`; `nbw`:
    /// the window's norm bytes): every posting's, or with `LIVE` only those of the docs in the
    /// set `live`.
    #[inline]
    fn add_window<const LIVE: bool>(
        &mut self,
        lo: u32,
        hi: u32,
        nbw: &[u8],
        inv: &[f32; 256],
        acc: &mut [f64],
        live: &[u64],
    ) {
        let table = &self.table[..];
        debug_assert_eq!(table.len(), TF_TABLE * 256);
        let c = &mut self.cur;
        c.advance(lo);
        let w = c.w;
        // the cursor's state in locals (registers) through the loop
        let bytes = c.bytes;
        let (mut at, mut doc, mut tf) = (c.at, c.doc, c.tf);
        while doc < hi {
            let i = (doc - lo) as usize;
            if !LIVE || live[i >> 6] & (1 << (i & 63)) != 0 {
                let nb = nbw[i];
                let s = if (tf as usize) < TF_TABLE {
                    table[tf as usize * 256 + nb as usize]
                } else {
                    term_score(w, tf as f32 * inv[nb as usize])
                };
                acc[i] += s as f64;
            }
            read_posting(bytes, &mut at, &mut doc, &mut tf);
        }
        c.at = at;
        c.doc = doc;
        c.tf = tf;
    }

    /// The best score of a posting in `[lo, hi)` from the block-max table (0: none there).
    fn window_max(&mut self, lo: u32, hi: u32) -> f64 {
        let c = &mut self.cur;
        if c.blocks.is_empty() {
            c.advance(lo);
            return if c.doc < hi {
                term_score(c.w, c.max_x) as f64
            } else {
                0.0
            };
        }
        while self.wblk < c.blocks.len() && c.blocks[self.wblk].last_doc < lo {
            self.wblk += 1;
        }
        let mut best = -1f32;
        for b in &c.blocks[self.wblk..] {
            best = best.max(b.max_x);
            if b.last_doc >= hi - 1 {
                break;
            }
        }
        if best < 0.0 {
            0.0
        } else {
            term_score(c.w, best) as f64
        }
    }
}

/// A hit in the top-k heap: ordered so that the worst hit is the greatest (lower score, then
/// larger ASIN rank).
#[derive(Clone, Copy, PartialEq)]
struct Hit {
    score: f32,
    rank: u32,
    doc: u32,
}

impl Eq for Hit {}

impl PartialOrd for Hit {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Hit {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        other.score.total_cmp(&self.score).then(self.rank.cmp(&other.rank))
    }
}

/// The best [`SEARCH_RETURN_N`] hits met so far (the worst on top of the heap).
#[derive(Default)]
struct TopHits(std::collections::BinaryHeap<Hit>);

impl TopHits {
    /// Offers a hit; once [`SEARCH_RETURN_N`] are held after taking it, the 50th score.
    fn offer(&mut self, hit: Hit) -> Option<f32> {
        let heap = &mut self.0;
        if heap.len() < SEARCH_RETURN_N {
            heap.push(hit);
        } else if hit < *heap.peek()? {
            heap.pop();
            heap.push(hit);
        } else {
            return None;
        }
        (heap.len() == SEARCH_RETURN_N).then(|| heap.peek().expect("full").score)
    }

    /// The hits (doc, score), best first.
    fn into_hits(self) -> Vec<(u32, f32)> {
        self.0.into_sorted_vec().into_iter().map(|h| (h.doc, h.score)).collect()
    }
}

impl Index {
    /// The index of an image, its sections checked for shape.
    pub fn from_image(img: Arc<Image>) -> Result<Index, String> {
        let stats: &[IndexStats] = img.try_pod(Sec::IdxStats)?;
        let [stats] = stats else {
            return Err(format!("{} index statistics records, expected 1", stats.len()));
        };
        let recs: &[TermRec] = img.try_pod(Sec::TermRecs)?;
        let hash: &[u32] = img.try_pod(Sec::TermHash)?;
        let str_off: &[u64] = img.try_pod(Sec::TermStrOff)?;
        let blocks: &[Block] = img.try_pod(Sec::Blocks)?;
        let norm_inv: &[f32] = img.try_pod(Sec::NormInv)?;
        let rank: &[u32] = img.try_pod(Sec::AsinRank)?;
        let norm_byte = img.bytes(Sec::NormByte);
        let n = recs.len();
        let postings = img.bytes(Sec::Postings).len() as u64;
        let ok = hash.len().is_power_of_two()
            && hash.len() >= 2
            && hash.iter().all(|&h| h as usize <= n)
            && str_off.len() == n + 1
            && str_off.windows(2).all(|w| w[0] <= w[1])
            && str_off[n] as usize == img.bytes(Sec::TermStr).len()
            && norm_inv.len() as u64 == stats.num_docs
            && rank.len() as u64 == stats.num_docs
            && norm_byte.len() as u64 == stats.num_docs
            && recs
                .iter()
                .all(|r| r.post_off + r.post_len as u64 <= postings && r.blk as usize + r.num_blocks() <= blocks.len());
        if !ok {
            return Err("the index's sections do not fit together".into());
        }
        let stats = *stats;
        let inv = inv_table(stats.avgdl);
        let mut present = [false; 256];
        for &b in norm_byte {
            present[b as usize] = true;
        }
        let norms: Vec<u8> = (0..=255u8).filter(|&b| present[b as usize]).collect();
        let inv_min = norms.iter().map(|&b| inv[b as usize]).fold(f32::INFINITY, f32::min);
        Ok(Index {
            img,
            stats,
            inv,
            inv_min,
            norms,
        })
    }

    /// Builds the index over `asins.len()` documents, held in memory; `doc(i)` is the text of
    /// document `i` (made on demand, [`BUILD_CHUNK`] at a time).
    pub fn build<F: Fn(usize) -> String + Sync>(asins: Vec<Box<str>>, doc: F) -> Index {
        use rayon::prelude::*;
        let mut b = IndexBuilder::default();
        for lo in (0..asins.len()).step_by(BUILD_CHUNK) {
            let hi = (lo + BUILD_CHUNK).min(asins.len());
            b.add_chunk((lo..hi).into_par_iter().map(&doc).collect());
        }
        b.finish(asins)
    }

    fn recs(&self) -> &[TermRec] {
        self.img.pod(Sec::TermRecs)
    }

    fn term_text(&self, id: usize) -> &[u8] {
        let off: &[u64] = self.img.pod(Sec::TermStrOff);
        &self.img.bytes(Sec::TermStr)[off[id] as usize..off[id + 1] as usize]
    }

    fn term_id(&self, term: &str) -> Option<usize> {
        let hash: &[u32] = self.img.pod(Sec::TermHash);
        let mask = hash.len() - 1;
        let mut i = term_slot(term.as_bytes(), mask);
        loop {
            let id = hash[i].checked_sub(1)? as usize;
            if self.term_text(id) == term.as_bytes() {
                return Some(id);
            }
            i = (i + 1) & mask;
        }
    }

    fn postings_of(&self, r: &TermRec) -> &[u8] {
        &self.img.bytes(Sec::Postings)[r.post_off as usize..(r.post_off + r.post_len as u64) as usize]
    }

    fn blocks_of(&self, r: &TermRec) -> &[Block] {
        &self.img.pod::<Block>(Sec::Blocks)[r.blk as usize..r.blk as usize + r.num_blocks()]
    }

    fn list(&self, term: &str) -> Option<(u32, Postings<'_>)> {
        let r = &self.recs()[self.term_id(term)?];
        Some((
            r.df,
            Postings {
                bytes: self.postings_of(r),
                at: 0,
                doc: 0,
            },
        ))
    }

    /// Distinct terms in the index.
    pub fn num_terms(&self) -> usize {
        self.recs().len()
    }

    pub fn num_docs(&self) -> usize {
        self.stats.num_docs as usize
    }

    pub fn avgdl(&self) -> f32 {
        self.stats.avgdl
    }

    pub fn sum_total_term_freq(&self) -> u64 {
        self.stats.sum_total_term_freq
    }

    /// The number of docs holding `term` (an analyzed term).
    pub fn doc_freq(&self, term: &str) -> usize {
        self.list(term).map_or(0, |(df, _)| df as usize)
    }

    /// The postings of `term` (an analyzed term): (doc id, term frequency) in doc order.
    pub fn postings(&self, term: &str) -> Vec<(u32, u32)> {
        self.list(term).map_or_else(Vec::new, |(_, p)| p.collect())
    }

    /// A cursor on a term's postings, on its first posting; `count`: the term's count in the
    /// query, `qpos`: its position there.
    fn cursor(&self, r: &TermRec, count: u32, qpos: usize) -> Cursor<'_> {
        let mut c = Cursor {
            bytes: self.postings_of(r),
            blocks: self.blocks_of(r),
            at: 0,
            doc: 0,
            tf: 0,
            blk: 0,
            w: self.weight(r.df, count),
            max_x: r.max_x,
            qpos: qpos as u32,
        };
        c.next();
        c
    }

    /// The weight of a query term (`count * idf`, float32) with document frequency `df`.
    fn weight(&self, df: u32, count: u32) -> f32 {
        let n = self.stats.doc_count as f64;
        let df = df as f64;
        let idf = (1.0 + (n - df + 0.5) / (df + 0.5)).ln() as f32;
        count as f32 * idf
    }

    /// Searches `query` scoring every matching posting (the reference): the hits (doc id,
    /// float32 score) best first, at most [`SEARCH_RETURN_N`], and the number of matching docs.
    pub fn search(&self, query: &str) -> Result<(Vec<(u32, f32)>, usize), SearchError> {
        Ok(self.search_all(&query_terms(query)?))
    }

    /// [`Index::search`] of a query's distinct terms with their counts.
    fn search_all(&self, counts: &[(String, u32)]) -> (Vec<(u32, f32)>, usize) {
        let norm_inv: &[f32] = self.img.pod(Sec::NormInv);
        let rank: &[u32] = self.img.pod(Sec::AsinRank);
        SCRATCH.with(|cell| {
            let mut guard = cell.borrow_mut();
            let (scores, touched) = &mut *guard;
            if scores.len() < self.num_docs() {
                scores.resize(self.num_docs(), f64::NAN);
            }
            for (t, c) in counts {
                let Some((df, list)) = self.list(t) else { continue };
                let weight = self.weight(df, *c);
                for (doc, tf) in list {
                    let inv = norm_inv[doc as usize];
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
                    .then_with(|| rank[a.0 as usize].cmp(&rank[b.0 as usize]))
            };
            if hits.len() > SEARCH_RETURN_N {
                hits.select_nth_unstable_by(SEARCH_RETURN_N - 1, order);
                hits.truncate(SEARCH_RETURN_N);
            }
            hits.sort_by(order);
            (hits, matching)
        })
    }

    /// The hits of [`Index::search`] (the same docs, scores and order, ties included), found
    /// without scoring the docs that cannot reach the top [`SEARCH_RETURN_N`]: block-max
    /// MaxScore, a window of [`WINDOW`] docs at a time.
    ///
    /// Per window, each term's best score there comes from its block-max table; a window whose
    /// terms' best scores sum below the 50th score held is skipped. Otherwise the terms are
    /// taken in order of their best score in the window: the first ones, whose best scores
    /// together with the best term's sum below the 50th ("non-essential"), cannot lift a doc
    /// into the top 50 with one other term; the others' postings in the window are scored into
    /// the docs' sums (term at a time, the sums in a window-sized array). A doc whose sum plus
    /// the non-essential best scores falls below the 50th is dropped; the others take the
    /// non-essential terms' scores, best term first (read through the window, or looked up doc
    /// by doc when few docs are left), and are dropped as soon as they cannot reach the 50th;
    /// what is left is scored in full and competes for the top 50. Scores come from a per-query
    /// table by (tf, length norm) for the long lists.
    ///
    /// Exactness: a doc's score is its terms' float32 scores summed in float64 (query order,
    /// then float32), as Lucene does. Here they are summed in another order, which gives the
    /// same float64 when every partial sum is exact: when every score any term can give is a
    /// multiple of the smallest one's unit in the last place `u` and all of a query's best
    /// scores sum below 2^52 u (checked per query: true for all but queries whose terms are in
    /// nearly every doc); other queries go document at a time in query order
    /// ([`Index::search_top_daat`]).
    ///
    /// Queries whose lists hold fewer than [`SMALL_QUERY`] postings in all are scored in full
    /// ([`Index::search`]'s loop): pruning them would cost more than it saves.
    pub fn search_top(&self, query: &str) -> Result<Vec<(u32, f32)>, SearchError> {
        let counts = query_terms(query)?;
        let recs = self.recs();
        let postings: u64 = counts
            .iter()
            .filter_map(|(t, _)| self.term_id(t))
            .map(|id| recs[id].df as u64)
            .sum();
        if postings < SMALL_QUERY {
            return Ok(self.search_all(&counts).0);
        }
        Ok(self.search_top_windowed(&counts))
    }

    /// [`Index::search_top`]'s pruned search (any query size).
    pub(super) fn search_top_windowed(&self, counts: &[(String, u32)]) -> Vec<(u32, f32)> {
        let recs = self.recs();
        let mut terms: Vec<WTerm<'_>> = Vec::with_capacity(counts.len());
        for (q, (t, c)) in counts.iter().enumerate() {
            let Some(id) = self.term_id(t) else { continue };
            let r = &recs[id];
            let cur = self.cursor(r, *c, q);
            let w = cur.w;
            let mut table = vec![0f32; TF_TABLE * 256];
            for tf in 1..TF_TABLE {
                for &b in &self.norms {
                    table[tf * 256 + b as usize] = term_score(w, tf as f32 * self.inv[b as usize]);
                }
            }
            terms.push(WTerm {
                cur,
                df: r.df,
                wblk: 0,
                table,
                m: 0.0,
            });
        }
        if terms.is_empty() {
            return Vec::new();
        }
        if !self.sums_are_exact(&terms) {
            return self.search_top_daat(counts);
        }
        let nb = self.img.bytes(Sec::NormByte);
        let rank: &[u32] = self.img.pod(Sec::AsinRank);
        let inv = &self.inv;
        let n_docs = self.num_docs();
        let mut top = TopHits::default();
        WINDOW_SCRATCH.with(|cell| {
            let mut guard = cell.borrow_mut();
            let Scratch { acc, live } = &mut *guard;
            if acc.len() < WINDOW {
                acc.resize(WINDOW, 0.0);
                live.resize(WINDOW / 64, 0);
            }
            let mut order: Vec<usize> = (0..terms.len()).collect();
            let mut theta = f64::NEG_INFINITY;
            let mut lo = 0usize;
            while lo < n_docs {
                let hi = (lo + WINDOW).min(n_docs);
                let (lo32, hi32) = (lo as u32, hi as u32);
                let mut total = 0f64;
                for t in terms.iter_mut() {
                    t.m = t.window_max(lo32, hi32);
                    total += t.m;
                }
                if total < theta {
                    lo = hi;
                    continue;
                }
                // non-essential: the terms with the lowest best scores while those scores, with
                // the best term's, sum below the 50th (a doc then needs two essential terms)
                order.sort_unstable_by(|&a, &b| terms[a].m.total_cmp(&terms[b].m));
                let top_m = terms[order[order.len() - 1]].m;
                let (mut k, mut rest) = (0, 0f64);
                while k < order.len() && rest + terms[order[k]].m + top_m < theta {
                    rest += terms[order[k]].m;
                    k += 1;
                }
                // the essential terms' postings in the window
                let nbw = &nb[lo..hi];
                for &j in &order[k..] {
                    terms[j].add_window::<false>(lo32, hi32, nbw, inv, acc, live);
                }
                // the docs met that can still reach the 50th score
                let words = (hi - lo).div_ceil(64);
                let mut n_live = 0usize;
                for w in 0..words {
                    let keep = at_least(&acc[w * 64..w * 64 + 64], cut(theta, rest));
                    live[w] = keep;
                    n_live += keep.count_ones() as usize;
                }
                // the non-essential terms, best first, on those docs
                for &j in order[..k].iter().rev() {
                    if n_live == 0 {
                        break;
                    }
                    let t = &mut terms[j];
                    rest -= t.m;
                    if t.m > 0.0 {
                        let in_window = t.df as usize * (hi - lo) / n_docs;
                        if n_live * PROBE_RATIO < in_window {
                            for w in 0..words {
                                let mut bits = live[w];
                                while bits != 0 {
                                    let b = bits.trailing_zeros() as usize;
                                    bits &= bits - 1;
                                    let d = (lo + w * 64 + b) as u32;
                                    t.cur.advance(d);
                                    if t.cur.doc == d {
                                        acc[w * 64 + b] += t.score(t.cur.tf, nbw[w * 64 + b], inv) as f64;
                                    }
                                }
                            }
                        } else {
                            t.add_window::<true>(lo32, hi32, nbw, inv, acc, live);
                        }
                    }
                    n_live = 0;
                    let c = cut(theta, rest);
                    for (w, word) in live.iter_mut().enumerate().take(words) {
                        let mut bits = *word;
                        while bits != 0 {
                            let b = bits.trailing_zeros() as usize;
                            bits &= bits - 1;
                            if acc[w * 64 + b] < c {
                                *word &= !(1 << b);
                            }
                        }
                        n_live += word.count_ones() as usize;
                    }
                }
                // what is left is scored in full
                for w in 0..words {
                    let mut bits = live[w];
                    while bits != 0 {
                        let b = bits.trailing_zeros() as usize;
                        bits &= bits - 1;
                        let d = lo + w * 64 + b;
                        let hit = Hit {
                            score: acc[w * 64 + b] as f32,
                            rank: rank[d],
                            doc: d as u32,
                        };
                        if let Some(t50) = top.offer(hit) {
                            theta = t50 as f64 * (1.0 - PRUNE_MARGIN);
                        }
                    }
                }
                acc[..hi - lo].fill(0.0);
                live[..words].fill(0);
                lo = hi;
            }
        });
        top.into_hits()
    }

    /// Whether any sum of the query terms' scores is exact in float64, in any order: every score
    /// term `t` can give is at least `term_score(w_t, inv_min)` (tf 1 in the longest doc), hence
    /// a multiple of that value's unit in the last place, itself a multiple of the smallest such
    /// unit `u` (all powers of two); sums of multiples of `u` below 2^52 u are exact.
    fn sums_are_exact(&self, terms: &[WTerm<'_>]) -> bool {
        let mut u = f64::INFINITY;
        let mut total = 0f64;
        for t in terms {
            let lowest = term_score(t.cur.w, self.inv_min);
            if !lowest.is_normal() || lowest < 0.0 {
                return false;
            }
            // the unit in the last place of a normal float32: 2^(exponent - 23)
            let exp = ((lowest.to_bits() >> 23) & 0xff) as i32 - 127;
            u = u.min(2f64.powi(exp - 23));
            total += term_score(t.cur.w, t.cur.max_x) as f64;
        }
        total < 2f64.powi(52) * u
    }

    /// [`Index::search_top`] document at a time (block-max MaxScore), for any query: the terms
    /// in order of their best score; once 50 hits are held, the terms whose best scores sum
    /// below the 50th score are "non-essential": docs holding only them are never visited, and
    /// a visited doc stops being scored as soon as its score so far plus the best scores left
    /// (per block, from the block-max tables) fall below the 50th. A doc scored in full is
    /// scored as the reference does (its terms in query order, summed in float64, then float32).
    pub(super) fn search_top_daat(&self, counts: &[(String, u32)]) -> Vec<(u32, f32)> {
        let recs = self.recs();
        let norm_inv: &[f32] = self.img.pod(Sec::NormInv);
        let rank: &[u32] = self.img.pod(Sec::AsinRank);
        let mut cur: Vec<Cursor<'_>> = Vec::with_capacity(counts.len());
        for (q, (t, c)) in counts.iter().enumerate() {
            let Some(id) = self.term_id(t) else { continue };
            cur.push(self.cursor(&recs[id], *c, q));
        }
        cur.sort_by(|a, b| term_score(a.w, a.max_x).total_cmp(&term_score(b.w, b.max_x)));
        // prefix[i]: the best scores of terms 0..=i summed
        let mut prefix = Vec::with_capacity(cur.len());
        let mut acc = 0f64;
        for c in &cur {
            acc += term_score(c.w, c.max_x) as f64;
            prefix.push(acc);
        }
        let mut top = TopHits::default();
        let mut theta = f64::NEG_INFINITY;
        let mut ess = 0usize;
        let mut parts: Vec<(u32, f32)> = Vec::with_capacity(cur.len());
        loop {
            let d = cur[ess..].iter().map(|c| c.doc).min().unwrap_or(NO_DOC);
            if d == NO_DOC {
                break;
            }
            let inv = norm_inv[d as usize];
            parts.clear();
            let mut partial = 0f64;
            for c in &mut cur[ess..] {
                if c.doc == d {
                    let s = term_score(c.w, c.tf as f32 * inv);
                    parts.push((c.qpos, s));
                    partial += s as f64;
                    c.next();
                }
            }
            let mut pruned = false;
            for i in (0..ess).rev() {
                if partial + prefix[i] < theta {
                    pruned = true;
                    break;
                }
                let c = &mut cur[i];
                let Some(bx) = c.block_max(d) else { continue };
                let below = if i > 0 { prefix[i - 1] } else { 0.0 };
                if partial + term_score(c.w, bx) as f64 + below < theta {
                    pruned = true;
                    break;
                }
                c.advance(d);
                if c.doc == d {
                    let s = term_score(c.w, c.tf as f32 * inv);
                    parts.push((c.qpos, s));
                    partial += s as f64;
                }
            }
            if pruned {
                continue;
            }
            parts.sort_unstable_by_key(|p| p.0);
            let mut sum = 0f64;
            for &(_, s) in &parts {
                sum += s as f64;
            }
            let hit = Hit {
                score: sum as f32,
                rank: rank[d as usize],
                doc: d,
            };
            if let Some(t50) = top.offer(hit) {
                theta = t50 as f64 * (1.0 - PRUNE_MARGIN);
                while ess < cur.len() && prefix[ess] < theta {
                    ess += 1;
                }
            }
        }
        top.into_hits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::Just;

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

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(48))]
        /// The pruned search finds the exhaustive search's hits: the same docs, scores and order,
        /// ties (equal documents, equal lengths) broken by ASIN, on catalogues past one block per
        /// term and queries with repeated, rare, common and missing terms.
        #[test]
        fn pruned_search_equals_the_exhaustive_search(
            seed in 0i128..1_000_000,
            n in 1usize..(2 * WINDOW + 500),
            dup in 1usize..6,
            queries in proptest::collection::vec(proptest::collection::vec(0usize..16, 1..9), 1..12),
        ) {
            let mut rng = crate::envs::webshop::pyrandom::PyRandom::new(seed);
            // Zipf-like vocabulary: word k drawn about 1/(k+1) as often as word 0
            let words = [
                "red", "shoe", "blue", "shirt", "cotton", "wool", "lamp", "desk", "chair", "oak",
                "steel", "glass", "silk", "linen", "jade", "zinc",
            ];
            let draw = |rng: &mut crate::envs::webshop::pyrandom::PyRandom| {
                let mut k = 0;
                while k + 1 < words.len() && rng.randbelow(3) > 0 {
                    k += 1;
                }
                words[k]
            };
            let mut docs: Vec<String> = Vec::new();
            while docs.len() < n {
                // mostly short, some long enough for term frequencies past TF_TABLE
                let len = if rng.randbelow(8) == 0 { 20 + rng.randbelow(40) } else { rng.randbelow(14) } as usize;
                let d: Vec<&str> = (0..len).map(|_| draw(&mut rng)).collect();
                // runs of equal documents: equal scores, ordered by ASIN
                for _ in 0..dup {
                    docs.push(d.join(" "));
                }
            }
            docs.truncate(n);
            // ASINs in an order unrelated to the doc order
            let asins: Vec<Box<str>> = (0..n).map(|i| format!("A{:06}", (i * 7_919) % 1_000_003).into_boxed_str()).collect();
            let idx = Index::build(asins, |i| docs[i].clone());
            for q in &queries {
                let mut text: Vec<&str> = q.iter().map(|&k| words[k]).collect();
                text.push("absent");
                let q = text.join(" ");
                let want = idx.search(&q).unwrap().0;
                proptest::prop_assert_eq!(&idx.search_top(&q).unwrap(), &want, "{}", q);
                let counts = query_terms(&q).unwrap();
                proptest::prop_assert_eq!(&idx.search_top_windowed(&counts), &want, "{}", q);
                // the document-at-a-time path (queries whose sums could depend on their order)
                proptest::prop_assert_eq!(idx.search_top_daat(&counts), want, "{}", q);
            }
        }
    }

    proptest::proptest! {
        /// The SSE2 filter of the window's sums keeps the sums the plain one keeps: random sums,
        /// zeros (docs not met), sums equal to the cut, the smallest cut.
        #[test]
        fn window_filter_equals_the_plain_one(
            sums in proptest::collection::vec(proptest::prop_oneof![
                Just(0.0f64), Just(1.5f64), 0.0f64..4.0, Just(f64::MIN_POSITIVE)
            ], 64),
            cut_at in proptest::prop_oneof![Just(1.5f64), 0.0f64..4.0, Just(f64::MIN_POSITIVE)],
        ) {
            proptest::prop_assert_eq!(at_least(&sums, cut_at), at_least_plain(&sums, cut_at));
        }
    }

    #[test]
    fn window_filter_cut() {
        // before 50 hits: any doc met; after: the sum plus what is left reaches the 50th
        assert_eq!(cut(f64::NEG_INFINITY, 0.0), f64::MIN_POSITIVE);
        assert_eq!(cut(10.0, 4.0), 6.0);
        let mut sums = [0.0f64; 64];
        sums[3] = 0.25;
        sums[63] = 6.0;
        sums[10] = 5.999;
        assert_eq!(
            at_least_plain(&sums, cut(f64::NEG_INFINITY, 0.0)),
            (1 << 3) | (1 << 10) | (1 << 63)
        );
        assert_eq!(at_least_plain(&sums, cut(10.0, 4.0)), 1 << 63);
    }

    #[test]
    fn pruned_search_limits_and_errors() {
        let asins: Vec<Box<str>> = (0..300).map(|i| format!("A{i:04}").into_boxed_str()).collect();
        let idx = Index::build(asins, |i| if i % 2 == 0 { "red shoe".into() } else { "the".into() });
        assert_eq!(idx.search_top("").unwrap(), vec![]);
        assert_eq!(idx.search_top("the and").unwrap(), vec![]);
        assert_eq!(idx.search_top("blue").unwrap(), vec![]);
        let top = idx.search_top("red").unwrap();
        assert_eq!(top.len(), SEARCH_RETURN_N);
        assert!(
            top.iter().enumerate().all(|(k, &(d, _))| d == 2 * k as u32),
            "equal scores: ASIN order"
        );
        let many: Vec<String> = (0..=MAX_CLAUSES).map(|i| format!("w{i}")).collect();
        assert_eq!(
            idx.search_top(&many.join(" ")),
            Err(SearchError::TooManyClauses(MAX_CLAUSES + 1))
        );
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
