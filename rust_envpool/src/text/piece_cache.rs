//! Encoding by cached pieces: prompts repeat most of their text (instructions, admissible-command
//! lines, history lines, the chat template's frame), so the text is cut at places where the
//! tokenizer provably cuts it too, and each piece's token ids are looked up in a cache; only new
//! pieces go through the tokenizer. The ids equal a whole-string encode (`encode_fast(text,
//! false)`) — tested against it on random texts; tokenizers whose setup is not one where the proof
//! below holds are not supported and encode whole strings.
//!
//! Two levels: the text is cut into lines, and a line the cache does not hold is cut further
//! into words; both are cached (apart: lines that never come back cannot crowd out the words),
//! so a new observation costs a few word look-ups instead of a pass through the tokenizer.
//!
//! Why the cuts are safe. A line cut is placed right after a `'\n'` that is followed by a
//! non-whitespace character, or by one `' '` and then a non-whitespace character. A word cut is
//! placed right before a `' '` that is followed by an ASCII letter or digit (so "go to desk 1"
//! is cut into "go", " to", " desk", " 1"). For the supported setups:
//! - normalizer none or NFC: `'\n'` and `' '` are starters that compose with nothing, and
//!   canonical reordering never moves marks across a starter, so NFC(a + b) = NFC(a) + NFC(b) when
//!   `a` ends with `'\n'` or `b` starts with `' '`;
//! - added tokens: none contains `'\n'` (line cuts) and none strips neighbouring whitespace or
//!   needs word boundaries (`lstrip`/`rstrip`/`single_word` all false), so no added-token match
//!   crosses a cut and the matches on each side are the same as in the whole text. For word cuts
//!   (else the cache cuts lines only) none contains `' '` either and each starts with an ASCII
//!   character other than a letter, digit or space (Qwen's all start with `<`): no match starts
//!   at the letter or digit after a cut, so the text segment that the tokenizer pre-tokenizes on
//!   its own goes on past the cut (before `"  <|im_start|>"` the spaces end a segment, and a cut
//!   there would split `"  "`);
//! - pre-tokenizer: the Qwen2/Qwen2.5/Qwen3 split regex, then byte-level without its own regex.
//!   No alternative matches a newline followed by more text except whitespace runs, and a
//!   whitespace run that holds newlines is matched up to and including its last newline
//!   (`\s*[\r\n]+`, or `[\r\n]*` after punctuation) with no look-ahead, so the pre-tokens end at
//!   the cut and the piece before it splits the same way on its own; the BPE model encodes each
//!   pre-token on its own. (Not so for the GPT-2 regex: its `\s+(?!\S)` splits "\n\n" before a
//!   word into two pre-tokens but keeps it whole at the end of a piece — not supported). Word cuts:
//!   the regex has no look-behind, so matching from the cut is the same in the word as in the
//!   whole text; a match that starts before the cut cannot take the `' '`: the letter and
//!   punctuation alternatives take a space only as their first character, `\s*[\r\n]+` would
//!   need a newline after it, and a whitespace run ending in it is followed by non-whitespace, so
//!   `\s+(?!\S)` gives the run back up to the cut (and so does the word alone, at its end, where
//!   the look-ahead sees no character — in the whole text it sees the `' '`);
//! - no truncation or padding, no BPE dropout (random), nothing the post-processor adds when
//!   special tokens are not added.

use std::collections::HashMap;
use std::sync::Mutex;

/// The Qwen2 / Qwen2.5 / Qwen3 pre-tokenizer split regex, as `tokenizer.json` spells it.
pub const QWEN2_SPLIT_PATTERN: &str =
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const SHARDS: usize = 64;

/// Piece text -> its token ids.
type Shard = HashMap<Box<str>, Box<[u32]>, ahash::RandomState>;

/// Whether word cuts are safe as well as line cuts for a supported setup: no added token holds
/// a `' '`, and each starts with an ASCII character other than a letter, digit or space.
pub fn word_cuts_supported(doc: &serde_json::Value) -> bool {
    let tokens = doc.get("added_tokens").and_then(serde_json::Value::as_array);
    tokens.map(Vec::as_slice).unwrap_or(&[]).iter().all(|t| {
        let content = t.get("content").and_then(serde_json::Value::as_str).unwrap_or("");
        let first = content.bytes().next().unwrap_or(b'a');
        !content.contains(' ') && first.is_ascii() && !first.is_ascii_alphanumeric() && first != b' '
    })
}

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
    memchr::memchr_iter(b'\n', b)
        .filter_map(move |i| {
            let j = i + 1;
            if j >= b.len() {
                return None;
            }
            (starts_text(j) || (b[j] == b' ' && j + 1 < b.len() && starts_text(j + 1))).then_some(j)
        })
        .chain(std::iter::once(b.len()))
}

/// Byte offsets where a line is cut into words: before each `' '` that is followed by an ASCII
/// letter or digit (see the module docs); the last word ends at `line.len()`.
pub fn word_cut_points(line: &str) -> impl Iterator<Item = usize> + '_ {
    let b = line.as_bytes();
    (1..b.len())
        .filter(move |&i| b[i] == b' ' && b.get(i + 1).is_some_and(u8::is_ascii_alphanumeric))
        .chain(std::iter::once(b.len()))
}

/// The pieces of `text` between consecutive `cuts` (empty pieces skipped).
fn split_at<I: Iterator<Item = usize>>(text: &str, cuts: I) -> impl Iterator<Item = &str> {
    let mut start = 0;
    cuts.filter_map(move |end| {
        let piece = &text[start..end];
        start = end;
        (!piece.is_empty()).then_some(piece)
    })
}

/// Piece text -> token ids, in shards behind their own locks so threads rarely wait. Bounded: a
/// shard that grows past its share of `max_entries` is emptied.
struct Shards {
    shards: Vec<Mutex<Shard>>,
    per_shard: usize,
    hasher: ahash::RandomState,
}

impl Shards {
    fn new(max_entries: usize) -> Self {
        Shards {
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::default())).collect(),
            per_shard: max_entries.div_ceil(SHARDS).max(1),
            hasher: ahash::RandomState::new(),
        }
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().map(|m| m.len()).unwrap_or(0)).sum()
    }

    fn shard(&self, piece: &str) -> &Mutex<Shard> {
        &self.shards[(self.hasher.hash_one(piece) as usize) % SHARDS]
    }

    /// Appends the cached ids of `piece` to `out` (copied under the lock: no reference count
    /// for threads to contend on); false when the piece is not cached.
    fn extend(&self, piece: &str, out: &mut Vec<u32>) -> bool {
        let Ok(m) = self.shard(piece).lock() else { return false };
        m.get(piece).map(|ids| out.extend_from_slice(ids)).is_some()
    }

    fn insert(&self, piece: &str, ids: &[u32]) {
        if let Ok(mut m) = self.shard(piece).lock() {
            if m.len() >= self.per_shard {
                m.clear();
            }
            m.insert(piece.into(), ids.into());
        }
    }
}

/// Token ids of lines and words (see the module docs), shared by threads.
pub struct PieceCache {
    lines: Shards,
    /// None: the setup allows line cuts only.
    words: Option<Shards>,
}

impl std::fmt::Debug for PieceCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PieceCache").field("entries", &self.len()).finish()
    }
}

impl PieceCache {
    /// A cache of at most `max_entries` lines and as many words; `words`: cut lines into words
    /// too (only where [`word_cuts_supported`]).
    pub fn new(max_entries: usize, words: bool) -> Self {
        PieceCache {
            lines: Shards::new(max_entries),
            words: words.then(|| Shards::new(max_entries)),
        }
    }

    /// Number of cached pieces (lines and words).
    pub fn len(&self) -> usize {
        self.lines.len() + self.words.as_ref().map_or(0, Shards::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Whether lines are cut into words.
    pub fn cuts_words(&self) -> bool {
        self.words.is_some()
    }

    /// Encodes `text` piece by piece; `encode_piece` encodes a piece the cache does not hold.
    pub fn encode<E>(
        &self,
        text: &str,
        mut encode_piece: impl FnMut(&str) -> Result<Vec<u32>, E>,
    ) -> Result<Vec<u32>, E> {
        let mut out = Vec::with_capacity(text.len() / 3);
        for line in split_at(text, cut_points(text)) {
            if self.lines.extend(line, &mut out) {
                continue;
            }
            let start = out.len();
            match &self.words {
                Some(words) => {
                    for word in split_at(line, word_cut_points(line)) {
                        if !words.extend(word, &mut out) {
                            let ids = encode_piece(word)?;
                            words.insert(word, &ids);
                            out.extend_from_slice(&ids);
                        }
                    }
                }
                None => out.extend_from_slice(&encode_piece(line)?),
            }
            self.lines.insert(line, &out[start..]);
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
        assert_eq!(
            pieces("a\nb\n\nc\n 'd'\n  e\n"),
            vec!["a\n", "b\n\n", "c\n", " 'd'\n  e\n"]
        );
        assert_eq!(pieces(""), vec![""]);
        assert_eq!(pieces("\n\u{a0}x\nü"), vec!["\n\u{a0}x\n", "ü"]);
        assert_eq!(pieces("x\n \n"), vec!["x\n \n"]);
    }

    fn words(t: &str) -> Vec<&str> {
        split_at(t, word_cut_points(t)).collect()
    }

    #[test]
    fn cuts_lines_into_words_before_a_space_and_text() {
        assert_eq!(words("go to desk 1\n"), vec!["go", " to", " desk", " 1\n"]);
        assert_eq!(
            words(" a  b\t c 'd' \u{a0}e 1"),
            vec![" a ", " b\t", " c 'd' \u{a0}e", " 1"]
        );
        assert_eq!(words("x  <|im_start|> é"), vec!["x  <|im_start|> é"]);
        assert_eq!(words(" \n x"), vec![" \n", " x"]);
        assert_eq!(words(""), Vec::<&str>::new());
    }

    #[test]
    fn cache_is_bounded_and_reused() {
        let c = PieceCache::new(SHARDS, false);
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
        let c = PieceCache::new(10_000, false);
        c.encode("a\nb\na\n", enc).unwrap();
        let before = calls.get();
        assert_eq!(
            c.encode("b\na\n", enc).unwrap(),
            "b\na\n".bytes().map(u32::from).collect::<Vec<_>>()
        );
        assert_eq!(calls.get(), before);
    }

    #[test]
    fn new_lines_are_encoded_by_cached_words() {
        let c = PieceCache::new(10_000, true);
        let seen = std::cell::RefCell::new(Vec::new());
        let enc = |p: &str| -> Result<Vec<u32>, ()> {
            seen.borrow_mut().push(p.to_string());
            Ok(p.bytes().map(u32::from).collect())
        };
        let text = "go to desk 1\ngo to desk 2\n";
        assert_eq!(
            c.encode(text, enc).unwrap(),
            text.bytes().map(u32::from).collect::<Vec<_>>()
        );
        assert_eq!(*seen.borrow(), vec!["go", " to", " desk", " 1\n", " 2\n"]);
        seen.borrow_mut().clear();
        c.encode("go to desk 2\ndesk 1\n", enc).unwrap();
        assert_eq!(*seen.borrow(), vec!["desk"]); // the first line is cached whole, " 1\n" as a word
    }
}
