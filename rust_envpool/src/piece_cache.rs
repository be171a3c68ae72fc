//! Encoding by cached pieces: prompts repeat most of their text (instructions, admissible-command
//! lines, history lines, the chat template's frame), so the text is cut at places where the
//! tokenizer provably cuts it too, and each piece's token ids are looked up in a cache; only new
//! pieces go through the tokenizer. The ids equal a whole-string encode (`encode_fast(text,
//! false)`) — tested against it on random texts; tokenizers whose setup is not one where the proof
//! below holds are not supported and encode whole strings.
//!
//! Why the cuts are safe. A cut is placed right after a `'\n'` that is followed by a non-whitespace
//! character, or by one `' '` and then a non-whitespace character. For the supported setups:
//! - normalizer none or NFC: `'\n'` is a starter that composes with nothing, and canonical
//!   reordering never moves marks across a starter, so NFC(a + b) = NFC(a) + NFC(b) when `a` ends
//!   with `'\n'`;
//! - added tokens: none contains `'\n'` and none strips neighbouring whitespace or needs word
//!   boundaries (`lstrip`/`rstrip`/`single_word` all false), so no added-token match crosses a cut
//!   and the matches on each side are the same as in the whole text;
//! - pre-tokenizer: the Qwen2/Qwen2.5/Qwen3 split regex, then byte-level without its own regex.
//!   No alternative matches a newline followed by more text except whitespace runs, and a
//!   whitespace run that holds newlines is matched up to and including its last newline
//!   (`\s*[\r\n]+`, or `[\r\n]*` after punctuation) with no look-ahead, so the pre-tokens end at
//!   the cut and the piece before it splits the same way on its own; the BPE model encodes each
//!   pre-token on its own. (Not so for the GPT-2 regex: its `\s+(?!\S)` splits "\n\n" before a
//!   word into two pre-tokens but keeps it whole at the end of a piece — not supported);
//! - no truncation or padding, no BPE dropout (random), nothing the post-processor adds when
//!   special tokens are not added.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};

/// The Qwen2 / Qwen2.5 / Qwen3 pre-tokenizer split regex, as `tokenizer.json` spells it.
pub const QWEN2_SPLIT_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const SHARDS: usize = 64;

/// Piece text -> its token ids.
type Shard = HashMap<Box<str>, Arc<[u32]>>;

/// Why a tokenizer setup is not supported (`Err`), checked on the `tokenizer.json` document.
pub fn check_supported(doc: &serde_json::Value) -> Result<(), String> {
    use serde_json::Value;
    let field = |v: &Value, k: &str| v.get(k).cloned().unwrap_or(Value::Null);
    let is_false = |v: &Value, k: &str| matches!(v.get(k), None | Some(Value::Bool(false)) | Some(Value::Null));
    for k in ["truncation", "padding"] {
        if !field(doc, k).is_null() {
            return Err(format!("{k} is set"));
        }
    }
    match field(doc, "normalizer") {
        Value::Null => {}
        n if n.get("type").and_then(Value::as_str) == Some("NFC") => {}
        n => return Err(format!("normalizer {n} (supported: none, NFC)")),
    }
    let pre = field(doc, "pre_tokenizer");
    let byte_level = |p: &Value, use_regex: bool| {
        p.get("type").and_then(Value::as_str) == Some("ByteLevel")
            && is_false(p, "add_prefix_space")
            && p.get("use_regex").and_then(Value::as_bool).unwrap_or(true) == use_regex
    };
    let qwen_split = |p: &Value| {
        p.get("type").and_then(Value::as_str) == Some("Split")
            && p.get("pattern").and_then(|x| x.get("Regex")).and_then(Value::as_str) == Some(QWEN2_SPLIT_PATTERN)
            && p.get("behavior").and_then(Value::as_str) == Some("Isolated")
            && is_false(p, "invert")
    };
    let pre_ok = pre.get("type").and_then(Value::as_str) == Some("Sequence")
        && matches!(pre.get("pretokenizers").and_then(Value::as_array).map(Vec::as_slice),
                    Some([a, b]) if qwen_split(a) && byte_level(b, false));
    if !pre_ok {
        return Err(format!(
            "pre_tokenizer {pre} (supported: the Qwen2 split regex + ByteLevel without its regex)"
        ));
    }
    let model = field(doc, "model");
    if model.get("type").and_then(Value::as_str) != Some("BPE") {
        return Err("model is not BPE".into());
    }
    if !field(&model, "dropout").is_null() {
        return Err("BPE dropout is set".into());
    }
    for t in field(doc, "added_tokens").as_array().map(Vec::as_slice).unwrap_or(&[]) {
        let content = t.get("content").and_then(Value::as_str).unwrap_or("");
        if content.contains(['\n', '\r']) || content.is_empty() {
            return Err(format!("added token {content:?} holds a newline"));
        }
        for k in ["lstrip", "rstrip", "single_word"] {
            if !is_false(t, k) {
                return Err(format!("added token {content:?} has {k}"));
            }
        }
    }
    Ok(())
}

/// Byte offsets where `text` is cut into pieces (see the module docs); the last piece ends at
/// `text.len()`.
pub fn cut_points(text: &str) -> impl Iterator<Item = usize> + '_ {
    let b = text.as_bytes();
    let starts_text = |i: usize| -> bool {
        // A non-whitespace character starts at byte i.
        text[i..].chars().next().is_some_and(|c| !c.is_whitespace())
    };
    b.iter()
        .enumerate()
        .filter_map(move |(i, &c)| {
            if c != b'\n' || i + 1 >= b.len() {
                return None;
            }
            let j = i + 1;
            (starts_text(j) || (b[j] == b' ' && j + 1 < b.len() && starts_text(j + 1))).then_some(j)
        })
        .chain(std::iter::once(b.len()))
}

/// Token ids of text pieces, shared by threads (sharded locks). Bounded: a shard that grows past
/// its share of `max_entries` is emptied.
pub struct PieceCache {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
}

impl std::fmt::Debug for PieceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PieceCache").field("entries", &self.len()).finish()
    }
}

impl PieceCache {
    pub fn new(max_entries: usize) -> Self {
        PieceCache {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
            per_shard: max_entries.div_ceil(SHARDS).max(1),
        }
    }

    /// Number of cached pieces.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map(|m| m.len()).unwrap_or(0)).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Encodes `text` piece by piece; `encode_piece` encodes a piece the cache does not hold.
    pub fn encode<E>(&self, text: &str, mut encode_piece: impl FnMut(&str) -> Result<Vec<u32>, E>) -> Result<Vec<u32>, E> {
        let mut out = Vec::with_capacity(text.len() / 3);
        let mut start = 0;
        for end in cut_points(text) {
            if end == start {
                continue;
            }
            let piece = &text[start..end];
            start = end;
            let mut h = DefaultHasher::new();
            piece.hash(&mut h);
            let shard = &self.shards[(h.finish() as usize) % SHARDS];
            let hit = shard.lock().ok().and_then(|m| m.get(piece).cloned());
            match hit {
                Some(ids) => out.extend_from_slice(&ids),
                None => {
                    let ids = encode_piece(piece)?;
                    out.extend_from_slice(&ids);
                    if let Ok(mut m) = shard.lock() {
                        if m.len() >= self.per_shard {
                            m.clear();
                        }
                        m.insert(piece.into(), ids.into());
                    }
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pieces(t: &str) -> Vec<&str> {
        let mut s = 0;
        cut_points(t)
            .map(|e| {
                let p = &t[s..e];
                s = e;
                p
            })
            .collect()
    }

    #[test]
    fn cuts_after_newline_before_text() {
        assert_eq!(pieces("a\nb\n\nc\n 'd'\n  e\n"), vec!["a\n", "b\n\n", "c\n", " 'd'\n  e\n"]);
        assert_eq!(pieces(""), vec![""]);
        assert_eq!(pieces("\n\u{a0}x\nü"), vec!["\n\u{a0}x\n", "ü"]);
        assert_eq!(pieces("x\n \n"), vec!["x\n \n"]);
    }

    #[test]
    fn cache_is_bounded_and_reused() {
        let c = PieceCache::new(SHARDS);
        let calls = std::cell::Cell::new(0);
        let enc = |p: &str| -> Result<Vec<u32>, ()> {
            calls.set(calls.get() + 1);
            Ok(p.bytes().map(u32::from).collect())
        };
        let text: String = (0..500).map(|i| format!("line {i}\n")).collect();
        let ids = c.encode(&text, enc).unwrap();
        assert_eq!(ids, text.bytes().map(u32::from).collect::<Vec<_>>());
        assert_eq!(calls.get(), 500);
        assert!(c.len() <= SHARDS, "{}", c.len());
        let c = PieceCache::new(10_000);
        c.encode("a\nb\na\n", enc).unwrap();
        let before = calls.get();
        assert_eq!(c.encode("b\na\n", enc).unwrap(), "b\na\n".bytes().map(u32::from).collect::<Vec<_>>());
        assert_eq!(calls.get(), before);
    }
}
