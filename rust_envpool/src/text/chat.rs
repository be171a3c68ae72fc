//! Hugging Face chat templates rendered with minijinja.
//!
//! The template comes from a model directory: `tokenizer_config.json`'s `chat_template` (a string,
//! or a list of `{name, template}` from which `default` is taken) or a `chat_template.jinja` file
//! beside it, which wins when both exist (as transformers' `from_pretrained` does). The environment is set up the way transformers renders templates: `trim_blocks` and
//! `lstrip_blocks` on, Python string/dict methods (`pycompat`), loop controls, `raise_exception`,
//! `strftime_now` and a `tojson` filter.

use std::path::Path;

use minijinja::{context, Environment, Error as JinjaError, ErrorKind, Value};

use crate::text::error::PromptError;

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// A compiled chat template plus the special-token strings templates may refer to.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    pad_token: Option<String>,
    enable_thinking: Option<bool>,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .finish()
    }
}

fn raise_exception(msg: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

fn strftime_now(fmt: String) -> Result<String, JinjaError> {
    use std::fmt::Write;
    let mut out = String::new();
    write!(out, "{}", chrono::Local::now().format(&fmt))
        .map_err(|_| JinjaError::new(ErrorKind::InvalidOperation, format!("strftime_now: bad format {fmt:?}")))?;
    Ok(out)
}

/// A special token from tokenizer_config.json: a string or an AddedToken dict `{content: ...}`.
fn token_string(v: Option<&serde_json::Value>) -> Option<String> {
    match v? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content").and_then(|c| c.as_str()).map(str::to_string),
        _ => None,
    }
}

impl ChatTemplate {
    /// Compile a template from its source.
    pub fn from_source(
        source: impl Into<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
        pad_token: Option<String>,
    ) -> Result<Self, PromptError> {
        let source = source.into();
        let mut env = Environment::new();
        env.set_syntax(
            minijinja::syntax::SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| PromptError::Template(format!("syntax config: {e}")))?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned("chat", source.clone())
            .map_err(|e| PromptError::Template(format!("compiling chat template: {e:#}")))?;
        Ok(ChatTemplate {
            env,
            source,
            bos_token,
            eos_token,
            pad_token,
            enable_thinking: None,
        })
    }

    /// Load the template of a model directory (see module docs).
    pub fn from_dir(dir: &Path) -> Result<Self, PromptError> {
        let cfg_path = dir.join("tokenizer_config.json");
        let cfg: serde_json::Value = if cfg_path.is_file() {
            let text = std::fs::read_to_string(&cfg_path).map_err(|e| PromptError::Io {
                path: cfg_path.clone(),
                message: e.to_string(),
            })?;
            serde_json::from_str(&text).map_err(|e| PromptError::Io {
                path: cfg_path.clone(),
                message: format!("invalid JSON: {e}"),
            })?
        } else {
            serde_json::Value::Null
        };
        // transformers reads chat_template.jinja over tokenizer_config.json's chat_template
        let jinja_path = dir.join("chat_template.jinja");
        let source = match cfg.get("chat_template") {
            _ if jinja_path.is_file() => std::fs::read_to_string(&jinja_path).map_err(|e| PromptError::Io {
                path: jinja_path.clone(),
                message: e.to_string(),
            })?,
            Some(serde_json::Value::String(s)) => s.clone(),
            Some(serde_json::Value::Array(list)) => list
                .iter()
                .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
                .and_then(|t| t.get("template")?.as_str().map(str::to_string))
                .ok_or_else(|| {
                    PromptError::Template(format!(
                        "{}: chat_template list has no entry named 'default'",
                        cfg_path.display()
                    ))
                })?,
            _ => {
                return Err(PromptError::MissingFile {
                    path: if cfg_path.is_file() { jinja_path } else { cfg_path },
                    what: "a chat template (tokenizer_config.json 'chat_template' or chat_template.jinja)",
                })
            }
        };
        Self::from_source(
            source,
            token_string(cfg.get("bos_token")),
            token_string(cfg.get("eos_token")),
            token_string(cfg.get("pad_token")),
        )
    }

    /// Pass `enable_thinking` to the template (Qwen3: `false` appends an empty think block to the
    /// generation prompt). `None` leaves it undefined, as transformers does by default.
    pub fn set_enable_thinking(&mut self, value: Option<bool>) {
        self.enable_thinking = value;
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Render `messages` as transformers' `apply_chat_template(..., tokenize=False)` does.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String, PromptError> {
        let tmpl = self
            .env
            .get_template("chat")
            .map_err(|e| PromptError::Template(format!("{e:#}")))?;
        let base = context! {
            messages => Value::from(
                messages
                    .iter()
                    .map(|m| context! { role => m.role.as_str(), content => m.content.as_str() })
                    .collect::<Vec<_>>()
            ),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_deref(),
            eos_token => self.eos_token.as_deref(),
            pad_token => self.pad_token.as_deref(),
            tools => Value::from(()),
        };
        let ctx = match self.enable_thinking {
            Some(b) => context! { enable_thinking => b, ..base },
            None => base,
        };
        tmpl.render(ctx).map_err(|e| PromptError::Template(render_message(&e)))
    }
}

/// minijinja's error message, with the `raise_exception` text kept readable.
fn render_message(e: &JinjaError) -> String {
    let mut msg = match e.detail() {
        Some(d) => format!("{}: {d}", e.kind()),
        None => e.to_string(),
    };
    if let (Some(name), Some(line)) = (e.name(), e.line()) {
        msg.push_str(&format!(" (in template {name:?}, line {line})"));
    }
    msg
}

/// Messages for one prompt: an optional system message then the user prompt.
pub fn user_messages(prompt: &str, system: Option<&str>) -> Vec<Message> {
    let mut m = Vec::with_capacity(2);
    if let Some(s) = system {
        m.push(Message::new("system", s));
    }
    m.push(Message::new("user", prompt));
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    const CHATML: &str = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    #[test]
    fn chatml_render() {
        let t = ChatTemplate::from_source(CHATML, None, None, None).unwrap();
        let s = t.render(&user_messages("hi", Some("sys")), true).unwrap();
        assert_eq!(
            s,
            "<|im_start|>system\nsys<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
        let s = t.render(&user_messages("hi", None), false).unwrap();
        assert_eq!(s, "<|im_start|>user\nhi<|im_end|>\n");
    }

    #[test]
    fn raise_exception_is_an_error_with_its_message() {
        let t = ChatTemplate::from_source("{{ raise_exception('only user roles') }}", None, None, None).unwrap();
        let e = t.render(&user_messages("hi", None), true).unwrap_err();
        assert!(e.to_string().contains("only user roles"), "{e}");
    }

    #[test]
    fn pycompat_and_loop_controls() {
        let src = "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}{{ m.content.split('|')[-1].lstrip(' ').upper() }}{% if m.content.startswith('a') %}!{% endif %}{% endfor %}{{ messages[0] | tojson }}";
        let t = ChatTemplate::from_source(src, None, None, None).unwrap();
        let s = t
            .render(&[Message::new("system", "x"), Message::new("user", "a| b")], true)
            .unwrap();
        assert!(s.starts_with("B!"), "{s}");
        assert!(s.contains("\"role\""), "{s}");
    }

    #[test]
    fn syntax_error_reported() {
        let e = ChatTemplate::from_source("{% for %}", None, None, None).unwrap_err();
        assert!(matches!(e, PromptError::Template(_)));
    }

    #[test]
    fn enable_thinking_only_when_set() {
        let src = "{% if enable_thinking is defined %}{{ enable_thinking }}{% else %}undef{% endif %}";
        let mut t = ChatTemplate::from_source(src, None, None, None).unwrap();
        assert_eq!(t.render(&[], true).unwrap(), "undef");
        t.set_enable_thinking(Some(false));
        assert_eq!(t.render(&[], true).unwrap(), "False"); // Python-style, as in Jinja2
    }

    #[test]
    fn chat_template_jinja_wins_over_tokenizer_config() {
        // as transformers' from_pretrained: the .jinja file replaces tokenizer_config's template
        let dir = std::env::temp_dir().join(format!("pcsd-chat-jinja-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("tokenizer_config.json"), r#"{"chat_template": "from-config"}"#).unwrap();
        let from_config = ChatTemplate::from_dir(&dir).unwrap();
        assert_eq!(from_config.render(&[], true).unwrap(), "from-config");
        std::fs::write(dir.join("chat_template.jinja"), "from-jinja").unwrap();
        let t = ChatTemplate::from_dir(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(t.render(&[], true).unwrap(), "from-jinja");
    }

    #[test]
    fn strftime() {
        let t = ChatTemplate::from_source("{{ strftime_now('%Y') }}", None, None, None).unwrap();
        let s = t.render(&[], false).unwrap();
        assert_eq!(s.len(), 4);
    }
}
