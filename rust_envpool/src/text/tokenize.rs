//! Chat-template rendering + tokenisation with the Hugging Face `tokenizers` crate.
//!
//! [`ChatTokenizer::encode_chat_batch`] matches transformers'
//! `tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)`: the
//! rendered text is encoded without adding special tokens (the template already contains them).
//! Batches are processed in parallel with rayon.

use std::path::{Path, PathBuf};

use rayon::prelude::*;
use tokenizers::Tokenizer;

use crate::text::chat::{user_messages, ChatTemplate, Message};
use crate::text::error::PromptError;
use crate::text::piece_cache::{check_supported, word_cuts_supported, PieceCache};

/// Most lines (and as many words) the encoder caches: a few MB.
const PIECE_CACHE_ENTRIES: usize = 1 << 16;

/// A model directory's tokenizer (`tokenizer.json`) and chat template.
pub struct ChatTokenizer {
    tokenizer: Tokenizer,
    template: ChatTemplate,
    dir: PathBuf,
    /// Piece cache when the tokenizer's setup supports cutting (see [`crate::text::piece_cache`]).
    pieces: Option<PieceCache>,
    /// Why the piece cache is off (None when on).
    unsupported: Option<String>,
}

impl std::fmt::Debug for ChatTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTokenizer").field("dir", &self.dir).finish()
    }
}

impl ChatTokenizer {
    /// Load `tokenizer.json` and the chat template from a model directory.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self, PromptError> {
        let dir = dir.as_ref();
        if !dir.is_dir() {
            return Err(PromptError::MissingFile {
                path: dir.to_path_buf(),
                what: "a model/tokenizer directory",
            });
        }
        let tok_path = dir.join("tokenizer.json");
        if !tok_path.is_file() {
            return Err(PromptError::MissingFile {
                path: tok_path,
                what: "tokenizer.json",
            });
        }
        let tokenizer = Tokenizer::from_file(&tok_path)
            .map_err(|e| PromptError::Tokenizer(format!("loading {}: {e}", tok_path.display())))?;
        let template = ChatTemplate::from_dir(dir)?;
        let doc: serde_json::Value = std::fs::read_to_string(&tok_path)
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok())
            .unwrap_or(serde_json::Value::Null);
        let unsupported = check_supported(&doc).err();
        let pieces = unsupported
            .is_none()
            .then(|| PieceCache::new(PIECE_CACHE_ENTRIES, word_cuts_supported(&doc)));
        Ok(ChatTokenizer {
            tokenizer,
            template,
            dir: dir.to_path_buf(),
            pieces,
            unsupported,
        })
    }

    /// Whether [`encode`](Self::encode) uses the piece cache; else why not.
    pub fn piece_cache_status(&self) -> Result<(), &str> {
        match &self.unsupported {
            None => Ok(()),
            Some(why) => Err(why),
        }
    }

    /// See [`ChatTemplate::set_enable_thinking`].
    pub fn set_enable_thinking(&mut self, value: Option<bool>) {
        self.template.set_enable_thinking(value);
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn template(&self) -> &ChatTemplate {
        &self.template
    }

    /// Token ids of plain text (no special tokens added): through the piece cache when the
    /// tokenizer supports it, else [`encode_whole`](Self::encode_whole). Same ids either way.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, PromptError> {
        match &self.pieces {
            Some(cache) => cache.encode(text, |p| self.encode_whole(p)),
            None => self.encode_whole(text),
        }
    }

    /// Plain reference for [`encode`](Self::encode): the whole string through the tokenizer.
    pub fn encode_whole(&self, text: &str) -> Result<Vec<u32>, PromptError> {
        self.tokenizer
            .encode_fast(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| PromptError::Tokenizer(e.to_string()))
    }

    /// Text of token ids (special tokens kept).
    pub fn decode(&self, ids: &[u32]) -> Result<String, PromptError> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| PromptError::Tokenizer(e.to_string()))
    }

    /// Render a conversation with the generation prompt appended.
    pub fn render(&self, messages: &[Message]) -> Result<String, PromptError> {
        self.template.render(messages, true)
    }

    /// Render + encode one conversation.
    pub fn encode_messages(&self, messages: &[Message]) -> Result<Vec<u32>, PromptError> {
        self.encode(&self.render(messages)?)
    }

    /// Render + encode one user prompt (with an optional system message).
    pub fn encode_chat(&self, prompt: &str, system: Option<&str>) -> Result<Vec<u32>, PromptError> {
        self.encode_messages(&user_messages(prompt, system))
    }

    /// [`encode_chat`](Self::encode_chat) over a batch, in parallel; the first error wins.
    pub fn encode_chat_batch<S: AsRef<str> + Sync>(
        &self,
        prompts: &[S],
        system: Option<&str>,
    ) -> Result<Vec<Vec<u32>>, PromptError> {
        prompts
            .par_iter()
            .map(|p| self.encode_chat(p.as_ref(), system))
            .collect()
    }

    /// Sequential reference for [`encode_chat_batch`](Self::encode_chat_batch).
    pub fn encode_chat_batch_sequential<S: AsRef<str>>(
        &self,
        prompts: &[S],
        system: Option<&str>,
    ) -> Result<Vec<Vec<u32>>, PromptError> {
        prompts.iter().map(|p| self.encode_chat(p.as_ref(), system)).collect()
    }

    /// Number of tokens of the chat-formatted prompt (what the budget is measured on).
    pub fn count_chat_tokens(&self, prompt: &str, system: Option<&str>) -> Result<usize, PromptError> {
        Ok(self.encode_chat(prompt, system)?.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn missing_files_are_named() {
        let e = ChatTokenizer::from_dir("/definitely/not/here").unwrap_err();
        assert!(e.to_string().contains("/definitely/not/here"), "{e}");
        let tmp = std::env::temp_dir().join(format!("pcsd_tok_missing_{}", std::process::id()));
        std::fs::create_dir_all(&tmp).unwrap();
        let e = ChatTokenizer::from_dir(&tmp).unwrap_err();
        assert!(matches!(e, PromptError::MissingFile { .. }));
        assert!(e.to_string().contains("tokenizer.json"), "{e}");
        std::fs::remove_dir_all(&tmp).ok();
    }
}

#[cfg(test)]
pub(crate) mod model_dir_tests {
    //! Tests on a real (word-level) tokenizer written to a temporary model directory; the
    //! prompt tests use its `model_dir` too.
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    pub(crate) fn model_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("pcsd_tok_{name}_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let words = [
            "[UNK]",
            "user",
            "assistant",
            "system",
            "go",
            "to",
            "desk",
            "1",
            "look",
            "a",
            "b",
        ];
        let vocab: serde_json::Map<String, serde_json::Value> = words
            .iter()
            .enumerate()
            .map(|(i, w)| (w.to_string(), serde_json::json!(i)))
            .collect();
        let added = |id: usize, content: &str| {
            serde_json::json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                               "rstrip": false, "normalized": false, "special": true})
        };
        let tok = serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [added(11, "<|im_start|>"), added(12, "<|im_end|>")],
            "normalizer": null, "pre_tokenizer": {"type": "Whitespace"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
        });
        std::fs::write(dir.join("tokenizer.json"), tok.to_string()).unwrap();
        let cfg = serde_json::json!({"chat_template": CHATML, "eos_token": "<|im_end|>"});
        std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
        dir
    }

    #[test]
    fn chat_encoding_parallel_equals_sequential_and_keeps_specials() {
        let dir = model_dir("par");
        let t = ChatTokenizer::from_dir(&dir).unwrap();
        let prompts: Vec<String> = (0..64).map(|i| format!("go to desk {}", i % 3)).collect();
        let par = t.encode_chat_batch(&prompts, Some("look")).unwrap();
        let seq = t.encode_chat_batch_sequential(&prompts, Some("look")).unwrap();
        assert_eq!(par, seq);
        let start = t.encode("<|im_start|>").unwrap();
        let end = t.encode("<|im_end|>").unwrap();
        assert_eq!((start.len(), end.len()), (1, 1));
        // <|im_start|> system look <|im_end|> <|im_start|> user go to desk 1 <|im_end|> <|im_start|> assistant
        let ids = t.encode_chat("go to desk 1", Some("look")).unwrap();
        assert_eq!(ids.len(), 13);
        assert_eq!(ids[0], start[0]);
        assert_eq!(ids.iter().filter(|&&i| i == end[0]).count(), 2);
        std::fs::remove_dir_all(&dir).ok();
    }
}

#[cfg(test)]
mod piece_cache_tests {
    //! The piece-cache encoder against whole-string encoding on random texts, with a byte-level
    //! BPE tokenizer set up like Qwen2's (NFC, the Qwen2 split regex, ByteLevel); setups where
    //! the cuts are not provably safe (GPT-2's regex among them) encode whole strings.
    use super::*;
    use crate::text::piece_cache::QWEN2_SPLIT_PATTERN;
    use proptest::prelude::*;
    use serde_json::json;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    /// A byte-level BPE tokenizer.json: the 256 byte symbols plus merges of frequent pairs.
    fn bpe_doc(pre_tokenizer: serde_json::Value, added_rstrip: bool) -> serde_json::Value {
        let mut alphabet: Vec<char> = tokenizers::pre_tokenizers::byte_level::ByteLevel::alphabet()
            .into_iter()
            .collect();
        alphabet.sort();
        let mut vocab: Vec<String> = alphabet.iter().map(|c| c.to_string()).collect();
        let mut merges: Vec<String> = Vec::new();
        let pairs = [
            ("Ġ", "t"),
            ("h", "e"),
            ("Ġt", "he"),
            ("Ċ", "Ċ"),
            ("Ġ", "Ġ"),
            ("ĠĠ", "Ġ"),
            ("i", "n"),
            ("Ġ", "a"),
            ("o", "n"),
            ("Ġ", "'"),
            ("'", "s"),
            ("Ã", "¼"),
            ("g", "o"),
            ("Ġ", "1"),
            ("e", "r"),
            ("Ġ", "Ċ"),
            ("a", "ct"),
            ("c", "t"),
            ("i", "on"),
            ("ĠĠ", "Ċ"),
            ("Ġ", "["),
            (".", "Ċ"),
            ("Ġ", "go"),
        ];
        for (a, b) in pairs {
            let m = format!("{a}{b}");
            if !vocab.contains(&m) {
                vocab.push(m);
            }
            merges.push(format!("{a} {b}"));
        }
        let mut vmap = serde_json::Map::new();
        for (i, t) in vocab.iter().enumerate() {
            vmap.insert(t.clone(), json!(i));
        }
        let n = vocab.len();
        let added = |id: usize, content: &str, special: bool| {
            json!({"id": id, "content": content, "single_word": false, "lstrip": false,
                   "rstrip": added_rstrip && !special, "normalized": false, "special": special})
        };
        json!({
            "version": "1.0", "truncation": null, "padding": null,
            "added_tokens": [added(n, "<|im_start|>", true), added(n + 1, "<|im_end|>", true),
                             added(n + 2, "<think>", false), added(n + 3, "</think>", false)],
            "normalizer": {"type": "NFC"},
            "pre_tokenizer": pre_tokenizer,
            "post_processor": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            "decoder": {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false},
            "model": {"type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
                      "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
                      "ignore_merges": false, "vocab": vmap, "merges": merges},
        })
    }

    fn qwen_pre() -> serde_json::Value {
        json!({"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT_PATTERN}, "behavior": "Isolated", "invert": false},
            {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": false, "use_regex": false}]})
    }

    fn gpt2_pre() -> serde_json::Value {
        json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})
    }

    fn tokenizer(name: &str, doc: &serde_json::Value) -> ChatTokenizer {
        let dir = std::env::temp_dir().join(format!("pcsd_piece_{name}_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer.json"), doc.to_string()).unwrap();
        let cfg = json!({"chat_template": CHATML, "eos_token": "<|im_end|>"});
        std::fs::write(dir.join("tokenizer_config.json"), cfg.to_string()).unwrap();
        let t = ChatTokenizer::from_dir(&dir).unwrap();
        std::fs::remove_dir_all(&dir).ok();
        t
    }

    fn qwen() -> &'static ChatTokenizer {
        static T: std::sync::OnceLock<ChatTokenizer> = std::sync::OnceLock::new();
        T.get_or_init(|| tokenizer("qwen", &bpe_doc(qwen_pre(), false)))
    }

    fn text() -> impl Strategy<Value = String> {
        let piece = prop_oneof![
            4 => prop::sample::select(vec![
                "\n", "\n", "\n\n", " ", "  ", "\n ", " \n", "\r\n", "\r", "\t", "\u{a0}", "\u{2028}", "\u{85}",
                "a", "the", "The", "go to", "'s", "'S", "'ll", "'", "\"", "[", "].", ",", ".", "!?",
                "ü", "u\u{308}", "\u{308}", "e\u{301}\u{323}", "\u{301}", "é", "Å", "A\u{30a}",
                "0", "12", "3.5", "٣", "日本語", "🙂", "👍🏽",
                "<|im_start|>", "<|im_end|>", "<think>", "</think>", "<|im_", "think>",
            ]).prop_map(str::to_string),
            1 => any::<char>().prop_map(|c| c.to_string()),
            1 => "[ a-z]{1,12}",
        ];
        prop::collection::vec(piece, 0..60).prop_map(|v| v.concat())
    }

    #[test]
    fn supported_setups_are_recognised() {
        assert_eq!(qwen().piece_cache_status(), Ok(()));
    }

    #[test]
    fn unsupported_setups_fall_back_to_whole_strings() {
        let word_level = {
            let mut d = bpe_doc(json!({"type": "Whitespace"}), false);
            d["model"] = json!({"type": "WordLevel", "vocab": {"[UNK]": 0, "a": 1}, "unk_token": "[UNK]"});
            d
        };
        let mut dropout = bpe_doc(qwen_pre(), false);
        dropout["model"]["dropout"] = json!(0.1);
        let mut lowercase = bpe_doc(qwen_pre(), false);
        lowercase["normalizer"] = json!({"type": "Lowercase"});
        let mut other_regex = bpe_doc(qwen_pre(), false);
        other_regex["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = json!(r"\s+|\S+");
        let mut newline_token = bpe_doc(qwen_pre(), false);
        newline_token["added_tokens"][2]["content"] = json!("<x>\n");
        let cases = [
            ("gpt2", bpe_doc(gpt2_pre(), false), "pre_tokenizer"),
            ("word_level", word_level, "pre_tokenizer"),
            ("rstrip", bpe_doc(qwen_pre(), true), "rstrip"),
            ("dropout", dropout, "dropout"),
            ("lowercase", lowercase, "normalizer"),
            ("other_regex", other_regex, "pre_tokenizer"),
            ("newline_token", newline_token, "newline"),
        ];
        for (name, doc, why) in cases {
            let t = tokenizer(name, &doc);
            let reason = t.piece_cache_status().unwrap_err();
            assert!(reason.contains(why), "{name}: {reason}");
            if name == "dropout" {
                continue; // random merges: two encodings differ by design
            }
            // "\n\nd": GPT-2's regex splits differently at the end of a piece, so this text
            // shows that the fallback, not luck, makes the ids equal.
            let s = "a\nb <think>\n c\n\nd";
            assert_eq!(t.encode(s).unwrap(), t.encode_whole(s).unwrap(), "{name}");
        }
    }

    #[test]
    fn an_added_token_with_a_space_turns_word_cuts_off() {
        let mut spaced = bpe_doc(qwen_pre(), false);
        spaced["added_tokens"][2]["content"] = json!("<x y>");
        let t = tokenizer("spaced", &spaced);
        assert_eq!(t.piece_cache_status(), Ok(()));
        assert!(!t.pieces.as_ref().unwrap().cuts_words() && qwen().pieces.as_ref().unwrap().cuts_words());
        for s in ["a <x y> b\n", "go <x y>\n <x y> to\n"] {
            for _ in 0..2 {
                assert_eq!(t.encode(s).unwrap(), t.encode_whole(s).unwrap(), "{s:?}");
            }
        }
        // what word cuts would do: "<x" and " y>" encoded apart miss the added token
        let whole = t.encode_whole("a <x y>").unwrap();
        let cut: Vec<u32> = ["a", " <x", " y>"]
            .iter()
            .flat_map(|w| t.encode_whole(w).unwrap())
            .collect();
        assert_ne!(whole, cut);
    }

    #[test]
    fn chat_prompts_equal_whole_string_encoding() {
        let t = qwen();
        let adm: Vec<String> = (1..30).map(|i| format!("'go to cabinet {i}'")).collect();
        for step in 0..5 {
            let p = format!(
                "Step {step}.\nYour admissible actions are: [{}].\n\nNow act.\n",
                adm.join("\n ")
            );
            let text = t.render(&user_messages(&p, Some("sys"))).unwrap();
            // Twice: the second time every piece comes from the cache.
            for _ in 0..2 {
                assert_eq!(t.encode(&text).unwrap(), t.encode_whole(&text).unwrap());
            }
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]
        #[test]
        fn qwen_pieces_equal_whole_string(a in text(), b in text()) {
            let t = qwen();
            // `b` after `a` reuses pieces cached by `a` in a new context.
            for s in [&a, &b, &format!("{a}{b}"), &format!("{b}\n{a}")] {
                prop_assert_eq!(t.encode(s).unwrap(), t.encode_whole(s).unwrap(), "text {:?}", s);
            }
        }
    }
}
