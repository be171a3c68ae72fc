//! Student and teacher prompts for ALFWorld and WebShop (paper appendix, "Prompt Templates"), and
//! for any text environment (`EnvKind::Text`: the template of [`crate::text::template`], built in
//! or the user's).
//!
//! All template text lives in the `*_TEMPLATE*` constants below and is rendered with minijinja
//! (single pass, so `{…}` inside observations is never re-interpreted). The first step uses the
//! no-history variant; later steps add the step count and the last `H` observation–action pairs.
//! When a length budget is set (in tokens of the chat-formatted prompt), a prompt over budget falls
//! back to the no-history variant, and if that is still too long an error is returned: prompts are
//! never truncated silently.

use std::sync::Arc;

use minijinja::{context, Environment};

use crate::text::error::PromptError;
use crate::text::skills::{self, EnvKind};
use crate::text::template::{TextContext, TextTemplate, THINK_ACTION_INSTRUCTIONS};
use crate::text::tokenize::ChatTokenizer;

// ---------------------------------------------------------------------------------------------
// Templates (data). Variables: task_description, step_count, history_length, action_history,
// current_step, current_observation, admissible_actions.
// ---------------------------------------------------------------------------------------------

pub const ALFWORLD_TEMPLATE: &str = "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: {{ task_description }}

Prior to this step, you have already taken {{ step_count }} step(s). Below are the most recent {{ history_length }} observations and the corresponding actions you took: {{ action_history }}

You are now at step {{ current_step }} and your current observation is: {{ current_observation }}

Your admissible actions of the current situation are: [{{ admissible_actions }}].

Now it's your turn to take an action.
{{ instructions }}";

pub const ALFWORLD_TEMPLATE_NO_HIS: &str =
    "You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: {{ task_description }}

Your current observation is: {{ current_observation }}

Your admissible actions of the current situation are: [{{ admissible_actions }}].

Now it's your turn to take an action.
{{ instructions }}";

// WebShop: verl-agent's / ZJU-REAL/SDAR's `agent_system/environments/prompts/webshop.py` byte for byte
// (the appendix shows the same text typeset): a leading newline, "e\u{2011}commerce" (a
// non-breaking hyphen), the trailing spaces after "are:" and "tags.", a final newline. The task is
// inserted as the instruction text of the page, the observation and the admissible actions as
// formatted by `pcsd.text.prompts.format_webshop_observation` / `webshop_actions` (FACTS.md,
// "verl-agent / SDAR wrapper"); `tests/test_webshop_wiring.py` compares every recorded verl prompt.
const WEBSHOP_INSTRUCTIONS: &str = "You should first reason step-by-step about the current situation, then think carefully which admissible action best advances the shopping goal. This reasoning process MUST be enclosed within <think> </think> tags. 
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags.
";

pub const WEBSHOP_TEMPLATE: &str = "
You are an expert autonomous agent operating in the WebShop e\u{2011}commerce environment.
Your task is to: {{ task_description }}.
Prior to this step, you have already taken {{ step_count }} step(s). Below are the most recent {{ history_length }} observations and the corresponding actions you took: {{ action_history }}
You are now at step {{ current_step }} and your current observation is: {{ current_observation }}.
Your admissible actions of the current situation are: 
[
{{ admissible_actions }}
].

Now it's your turn to take one action for the current step.
{{ instructions }}";

pub const WEBSHOP_TEMPLATE_NO_HIS: &str = "
You are an expert autonomous agent operating in the WebShop e\u{2011}commerce environment. 
Your task is to: {{ task_description }}.
Your current observation is: {{ current_observation }}.
Your admissible actions of the current situation are: 
[
{{ admissible_actions }}
].

Now it's your turn to take one action for the current step.
{{ instructions }}";

/// verl-agent falls back to the no-history WebShop prompt when the prompt with history is longer
/// than this many characters (Python `len`, i.e. code points).
pub const WEBSHOP_MAX_HISTORY_PROMPT_CHARS: usize = 13000;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistoryEntry {
    pub observation: String,
    pub action: String,
}

impl HistoryEntry {
    pub fn new(observation: impl Into<String>, action: impl Into<String>) -> Self {
        HistoryEntry {
            observation: observation.into(),
            action: action.into(),
        }
    }
}

/// A past step as the templates read it: owned ([`HistoryEntry`]) or borrowed (`(&str, &str)`,
/// observation then action, as [`PromptRequest`] holds it).
pub trait PastStep {
    fn observation(&self) -> &str;
    fn action(&self) -> &str;
}

impl PastStep for HistoryEntry {
    fn observation(&self) -> &str {
        &self.observation
    }
    fn action(&self) -> &str {
        &self.action
    }
}

impl PastStep for (&str, &str) {
    fn observation(&self) -> &str {
        self.0
    }
    fn action(&self) -> &str {
        self.1
    }
}

/// Which prompt variant was produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Variant {
    WithHistory,
    NoHistory,
}

/// Admissible actions as they appear in the prompt. ALFWorld: quoted, joined with "\n ", `help`
/// dropped. WebShop: one quoted action per line, each followed by a comma. Text: as ALFWorld,
/// every action kept.
pub fn format_admissible<A: AsRef<str>>(env: EnvKind, admissible: &[A]) -> String {
    let all = admissible.iter().map(AsRef::as_ref);
    match env {
        EnvKind::Alfworld => all
            .filter(|a| a.trim() != "help")
            .map(|a| format!("'{a}'"))
            .collect::<Vec<_>>()
            .join("\n "),
        EnvKind::Webshop => all.map(|a| format!("'{a}',")).collect::<Vec<_>>().join("\n"),
        EnvKind::Text => all.map(|a| format!("'{a}'")).collect::<Vec<_>>().join("\n "),
    }
}

/// The last `h` history entries as "[Observation k: '…', Action k: '…']" lines, numbered by
/// their absolute step (`step` steps were taken before the current one).
pub fn format_history<P: PastStep>(history: &[P], step: usize, h: usize) -> (String, usize) {
    let recent = &history[history.len().saturating_sub(h)..];
    let first = (step + 1).saturating_sub(recent.len()).max(1);
    let lines: Vec<String> = recent
        .iter()
        .enumerate()
        .map(|(j, e)| {
            let k = first + j;
            format!("[Observation {k}: '{}', Action {k}: '{}']", e.observation(), e.action())
        })
        .collect();
    (lines.join("\n"), recent.len())
}

fn template_env() -> &'static Environment<'static> {
    static ENV: std::sync::OnceLock<Environment<'static>> = std::sync::OnceLock::new();
    ENV.get_or_init(build_template_env)
}

fn build_template_env() -> Environment<'static> {
    let mut env = Environment::new();
    env.add_template("alfworld", ALFWORLD_TEMPLATE).expect("valid template");
    env.add_template("alfworld_no_his", ALFWORLD_TEMPLATE_NO_HIS)
        .expect("valid template");
    env.add_template("webshop", WEBSHOP_TEMPLATE).expect("valid template");
    env.add_template("webshop_no_his", WEBSHOP_TEMPLATE_NO_HIS)
        .expect("valid template");
    env
}

fn check_args(task: &str, history_len: usize, step: usize) -> Result<(), PromptError> {
    if task.trim().is_empty() {
        return Err(PromptError::InvalidArgument {
            name: "task",
            expected: "a non-empty task description".into(),
        });
    }
    check_history_len(history_len, step)
}

/// History holds at most one entry per step already taken.
pub fn check_history_len(history_len: usize, step: usize) -> Result<(), PromptError> {
    if history_len > step {
        return Err(PromptError::InvalidArgument {
            name: "history",
            expected: format!("at most `step` (= {step}) entries, one per step already taken, got {history_len}"),
        });
    }
    Ok(())
}

/// Render one variant without any budget check. `step` = number of steps already taken.
#[allow(clippy::too_many_arguments)] // the template's inputs, spelled out for callers
pub fn render_student<A: AsRef<str>, P: PastStep>(
    env: EnvKind,
    variant: Variant,
    task: &str,
    observation: &str,
    admissible: &[A],
    history: &[P],
    step: usize,
    history_length: usize,
) -> Result<String, PromptError> {
    if env == EnvKind::Text {
        return render_text(
            builtin_text_template(),
            variant,
            task,
            observation,
            admissible,
            history,
            step,
            history_length,
        );
    }
    check_args(task, history.len(), step)?;
    let tenv = template_env();
    let (name, instructions) = match (env, variant) {
        (EnvKind::Alfworld, Variant::WithHistory) => ("alfworld", THINK_ACTION_INSTRUCTIONS),
        (EnvKind::Alfworld, Variant::NoHistory) => ("alfworld_no_his", THINK_ACTION_INSTRUCTIONS),
        (EnvKind::Webshop, Variant::WithHistory) => ("webshop", WEBSHOP_INSTRUCTIONS),
        (EnvKind::Webshop, Variant::NoHistory) => ("webshop_no_his", WEBSHOP_INSTRUCTIONS),
        (EnvKind::Text, _) => unreachable!("rendered above"),
    };
    let (action_history, n_hist) = format_history(history, step, history_length);
    // WebShop: verbatim, as verl-agent inserts them (its task can end with a period)
    let (task, observation) = match env {
        EnvKind::Webshop => (task, observation),
        EnvKind::Alfworld | EnvKind::Text => (task.trim(), observation.trim()),
    };
    tenv.get_template(name)
        .and_then(|t| {
            t.render(context! {
                task_description => task,
                step_count => step,
                history_length => n_hist,
                action_history => action_history,
                current_step => step + 1,
                current_observation => observation,
                admissible_actions => format_admissible(env, admissible),
                instructions => instructions,
            })
        })
        .map_err(|e| PromptError::Template(format!("{e:#}")))
}

fn builtin_text_template() -> &'static TextTemplate {
    static T: std::sync::OnceLock<TextTemplate> = std::sync::OnceLock::new();
    T.get_or_init(TextTemplate::builtin)
}

/// One variant of a text environment's prompt: the template with the last `history_length`
/// pairs (numbered by their absolute step), or with none (the no-history variant). Task and
/// observation go in verbatim.
#[allow(clippy::too_many_arguments)] // the template's inputs, spelled out for callers
pub fn render_text<A: AsRef<str>, P: PastStep>(
    template: &TextTemplate,
    variant: Variant,
    task: &str,
    observation: &str,
    admissible: &[A],
    history: &[P],
    step: usize,
    history_length: usize,
) -> Result<String, PromptError> {
    check_args(task, history.len(), step)?;
    let (action_history, shown) = match variant {
        Variant::WithHistory => format_history(history, step, history_length),
        Variant::NoHistory => (String::new(), 0),
    };
    let recent: Vec<(&str, &str)> = history[history.len() - shown..]
        .iter()
        .map(|h| (h.observation(), h.action()))
        .collect();
    template.render(&TextContext {
        task,
        observation,
        actions: admissible,
        history: &recent,
        first_step: (step + 1).saturating_sub(shown).max(1),
        step,
        action_history: &action_history,
    })
}

/// Builds student and teacher prompts with an optional token budget.
#[derive(Debug, Clone)]
pub struct PromptBuilder {
    pub env: EnvKind,
    pub history_length: usize,
    pub max_prompt_tokens: Option<usize>,
    tokenizer: Option<Arc<ChatTokenizer>>,
    /// `EnvKind::Text` with the user's template (None: the built-in one).
    template: Option<Arc<TextTemplate>>,
}

/// A built prompt and which variant was used.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuiltPrompt {
    pub text: String,
    pub variant: Variant,
    /// Chat-formatted token count of the student prompt, when the budget is enforced.
    pub tokens: Option<usize>,
    /// The chat-formatted token ids (no system message) behind `tokens`.
    pub ids: Option<Vec<u32>>,
}

/// One prompt to build in a batch, borrowing its text (the Python edge lends the `str` data of
/// the caller's objects). `history` may be just the tail the template shows (the last
/// `history_length` entries): `step` numbers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PromptRequest<'a> {
    pub task: &'a str,
    pub observation: &'a str,
    pub admissible: &'a [&'a str],
    pub history: &'a [(&'a str, &'a str)],
    pub step: usize,
}

impl PromptBuilder {
    /// `max_prompt_tokens` is enforced only when a tokenizer is given (it is measured with it).
    pub fn new(
        env: EnvKind,
        history_length: usize,
        max_prompt_tokens: Option<usize>,
        tokenizer: Option<Arc<ChatTokenizer>>,
    ) -> Result<Self, PromptError> {
        if max_prompt_tokens == Some(0) {
            return Err(PromptError::InvalidArgument {
                name: "max_prompt_tokens",
                expected: "a positive number of tokens or None".into(),
            });
        }
        Ok(PromptBuilder {
            env,
            history_length,
            max_prompt_tokens,
            tokenizer,
            template: None,
        })
    }

    /// The same builder with the user's template `source` (Jinja, see [`crate::text::template`]);
    /// only for `EnvKind::Text`: the ALFWorld and WebShop prompts are the paper's, fixed.
    pub fn with_template(mut self, source: &str) -> Result<Self, PromptError> {
        if self.env != EnvKind::Text {
            return Err(PromptError::InvalidArgument {
                name: "template",
                expected: format!(
                    "no template for env '{}' (its prompts are the paper's); templates are for env 'text'",
                    self.env
                ),
            });
        }
        self.template = Some(Arc::new(TextTemplate::new(source)?));
        Ok(self)
    }

    /// The template source of a text builder (the user's or the built-in one); None otherwise.
    pub fn template_source(&self) -> Option<&str> {
        match (&self.template, self.env) {
            (Some(t), _) => Some(t.source()),
            (None, EnvKind::Text) => Some(builtin_text_template().source()),
            _ => None,
        }
    }

    pub fn tokenizer(&self) -> Option<&Arc<ChatTokenizer>> {
        self.tokenizer.as_ref()
    }

    /// True when prompts are measured against `max_prompt_tokens`.
    pub fn budget_enforced(&self) -> bool {
        self.tokenizer.is_some() && self.max_prompt_tokens.is_some()
    }

    /// Chat-formatted token ids of a student prompt, when the budget is enforced.
    fn measure(&self, text: &str) -> Result<Option<Vec<u32>>, PromptError> {
        match (&self.tokenizer, self.max_prompt_tokens) {
            (Some(t), Some(_)) => Ok(Some(t.encode_chat(text, None)?)),
            _ => Ok(None),
        }
    }

    /// The student prompt (see module docs for the history and budget rules).
    pub fn build_detailed<A: AsRef<str>, P: PastStep>(
        &self,
        task: &str,
        observation: &str,
        admissible: &[A],
        history: &[P],
        step: usize,
    ) -> Result<BuiltPrompt, PromptError> {
        let render = |v| match &self.template {
            Some(t) => render_text(t, v, task, observation, admissible, history, step, self.history_length),
            None => render_student(
                self.env,
                v,
                task,
                observation,
                admissible,
                history,
                step,
                self.history_length,
            ),
        };
        let wants_history = step > 0 && self.history_length > 0 && !history.is_empty();
        if wants_history {
            let text = render(Variant::WithHistory)?;
            let too_long = self.env == EnvKind::Webshop && text.chars().count() > WEBSHOP_MAX_HISTORY_PROMPT_CHARS;
            let ids = if too_long { None } else { self.measure(&text)? };
            match (&ids, self.max_prompt_tokens) {
                _ if too_long => {}                         // fall back below (verl-agent's WebShop rule)
                (Some(ids), Some(b)) if ids.len() > b => {} // fall back below
                _ => {
                    let tokens = ids.as_ref().map(Vec::len);
                    return Ok(BuiltPrompt {
                        text,
                        variant: Variant::WithHistory,
                        tokens,
                        ids,
                    });
                }
            }
        }
        let text = render(Variant::NoHistory)?;
        let ids = self.measure(&text)?;
        if let (Some(ids), Some(b)) = (&ids, self.max_prompt_tokens) {
            if ids.len() > b {
                return Err(PromptError::TooLong {
                    tokens: ids.len(),
                    budget: b,
                });
            }
        }
        let tokens = ids.as_ref().map(Vec::len);
        Ok(BuiltPrompt {
            text,
            variant: Variant::NoHistory,
            tokens,
            ids,
        })
    }

    /// The student prompt text.
    pub fn build<A: AsRef<str>, P: PastStep>(
        &self,
        task: &str,
        observation: &str,
        admissible: &[A],
        history: &[P],
        step: usize,
    ) -> Result<String, PromptError> {
        Ok(self.build_detailed(task, observation, admissible, history, step)?.text)
    }

    /// The teacher prompt: the skill block for `task` followed by exactly the student prompt
    /// (same variant as the student, so both see the same interaction context). The skill block
    /// is not counted against the budget.
    pub fn build_teacher<A: AsRef<str>, P: PastStep>(
        &self,
        task: &str,
        observation: &str,
        admissible: &[A],
        history: &[P],
        step: usize,
    ) -> Result<String, PromptError> {
        let student = self.build(task, observation, admissible, history, step)?;
        Ok(teacher_from_student(self.env, task, &student))
    }
}

impl PromptBuilder {
    /// Build (student or teacher) prompts and their chat-formatted token ids for a batch, in
    /// parallel. Needs a tokenizer. Ids already computed for the budget check are reused.
    pub fn build_batch_encoded(
        &self,
        requests: &[PromptRequest<'_>],
        teacher: bool,
        system: Option<&str>,
    ) -> Result<Vec<(String, Vec<u32>)>, PromptError> {
        use rayon::prelude::*;
        let tok = self.tokenizer.as_ref().ok_or_else(|| PromptError::InvalidArgument {
            name: "tokenizer_dir",
            expected: "a tokenizer to encode prompts (build the PromptBuilder with tokenizer_dir)".into(),
        })?;
        requests
            .par_iter()
            .map(|r| {
                let b = self.build_detailed(r.task, r.observation, r.admissible, r.history, r.step)?;
                if teacher {
                    let text = teacher_from_student(self.env, r.task, &b.text);
                    let ids = tok.encode_chat(&text, system)?;
                    Ok((text, ids))
                } else {
                    let ids = match (b.ids, system) {
                        (Some(ids), None) => ids,
                        _ => tok.encode_chat(&b.text, system)?,
                    };
                    Ok((b.text, ids))
                }
            })
            .collect()
    }
}

/// Prepend the retrieved skills for `task` to a student prompt.
pub fn teacher_from_student(env: EnvKind, task: &str, student_prompt: &str) -> String {
    let mut s = skills::skill_block(task, env);
    s.push_str(student_prompt);
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::text::tokenize::model_dir_tests::model_dir;

    fn adm(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    const TASK: &str = "put a clean mug in coffeemachine";
    const NO_HIST: &[HistoryEntry] = &[];
    const NO_ADM: &[String] = &[];

    #[test]
    fn alfworld_first_step_has_no_history() {
        let b = PromptBuilder::new(EnvKind::Alfworld, 2, Some(2048), None).unwrap();
        let p = b
            .build(
                TASK,
                "You are in the middle of a room.",
                &adm(&["go to desk 1", "help", "look"]),
                NO_HIST,
                0,
            )
            .unwrap();
        assert!(p.starts_with("You are an expert agent operating in the ALFRED Embodied Environment. Your task is to: put a clean mug in coffeemachine\n\nYour current observation is: You are in the middle of a room.\n\n"));
        assert!(!p.contains("Prior to this step"));
        assert!(p.contains("are: ['go to desk 1'\n 'look']."), "{p}");
        assert!(!p.contains("'help'"));
        assert!(p.ends_with("present it within <action> </action> tags."));
    }

    #[test]
    fn alfworld_later_step_keeps_last_h_pairs() {
        let b = PromptBuilder::new(EnvKind::Alfworld, 2, None, None).unwrap();
        let hist = vec![
            HistoryEntry::new("obs A", "go to desk 1"),
            HistoryEntry::new("obs B", "take mug 1 from desk 1"),
            HistoryEntry::new("obs C", "go to sinkbasin 1"),
        ];
        let p = b
            .build(
                TASK,
                "You arrive at sinkbasin 1.",
                &adm(&["clean mug 1 with sinkbasin 1"]),
                &hist,
                3,
            )
            .unwrap();
        assert!(p.contains("Prior to this step, you have already taken 3 step(s). Below are the most recent 2 observations and the corresponding actions you took: [Observation 2: 'obs B', Action 2: 'take mug 1 from desk 1']\n[Observation 3: 'obs C', Action 3: 'go to sinkbasin 1']\n\nYou are now at step 4 and your current observation is: You arrive at sinkbasin 1."), "{p}");
        assert!(!p.contains("obs A"));
    }

    #[test]
    fn history_numbering_with_truncated_history() {
        // Caller keeps only the last 2 entries of a 10-step episode.
        let hist = vec![HistoryEntry::new("o9", "a9"), HistoryEntry::new("o10", "a10")];
        let (s, n) = format_history(&hist, 10, 2);
        assert_eq!(n, 2);
        assert_eq!(
            s,
            "[Observation 9: 'o9', Action 9: 'a9']\n[Observation 10: 'o10', Action 10: 'a10']"
        );
    }

    #[test]
    fn webshop_format() {
        let b = PromptBuilder::new(EnvKind::Webshop, 2, None, None).unwrap();
        let p = b
            .build(
                "Find me a red shirt.",
                "'Search'",
                &adm(&["search[<your query>]", "click[search]"]),
                NO_HIST,
                0,
            )
            .unwrap();
        assert!(p.starts_with("\nYou are an expert autonomous agent operating in the WebShop e\u{2011}commerce environment. \nYour task is to: Find me a red shirt..\nYour current observation is: 'Search'.\n"), "{p:?}");
        assert!(
            p.contains("are: \n[\n'search[<your query>]',\n'click[search]',\n].\n"),
            "{p:?}"
        );
        assert!(p.ends_with("within <action> </action> tags.\n"), "{p:?}");
        let hist = vec![HistoryEntry::new("'Search'", "search[red shirt]")];
        let p = b.build("t", "o", &adm(&["click[next >]"]), &hist, 1).unwrap();
        assert!(p.contains("most recent 1 observations and the corresponding actions you took: [Observation 1: ''Search'', Action 1: 'search[red shirt]']\nYou are now at step 2 and your current observation is: o.\n"), "{p:?}");
    }

    #[test]
    fn webshop_long_history_prompt_falls_back() {
        let b = PromptBuilder::new(EnvKind::Webshop, 2, None, None).unwrap();
        let hist = vec![HistoryEntry::new(
            "x".repeat(WEBSHOP_MAX_HISTORY_PROMPT_CHARS),
            "click[a]",
        )];
        let p = b.build_detailed("t", "o", &adm(&["click[a]"]), &hist, 1).unwrap();
        assert_eq!(p.variant, Variant::NoHistory);
        let hist = vec![HistoryEntry::new("x".repeat(100), "click[a]")];
        let p = b.build_detailed("t", "o", &adm(&["click[a]"]), &hist, 1).unwrap();
        assert_eq!(p.variant, Variant::WithHistory);
    }

    #[test]
    fn braces_in_observations_are_not_interpreted() {
        let b = PromptBuilder::new(EnvKind::Alfworld, 2, None, None).unwrap();
        let p = b
            .build(TASK, "{{ task_description }} {% if %}", &adm(&["look"]), NO_HIST, 0)
            .unwrap();
        assert!(p.contains("{{ task_description }} {% if %}"));
    }

    #[test]
    fn bad_arguments() {
        let b = PromptBuilder::new(EnvKind::Alfworld, 2, None, None).unwrap();
        let e = b
            .build(TASK, "o", NO_ADM, &[HistoryEntry::new("a", "b")], 0)
            .unwrap_err();
        assert!(e.to_string().contains("`history`"), "{e}");
        let e = b.build("  ", "o", NO_ADM, NO_HIST, 0).unwrap_err();
        assert!(e.to_string().contains("`task`"), "{e}");
        assert!(PromptBuilder::new(EnvKind::Alfworld, 2, Some(0), None).is_err());
    }

    #[test]
    fn teacher_is_skills_plus_student() {
        let b = PromptBuilder::new(EnvKind::Alfworld, 2, None, None).unwrap();
        let hist = vec![HistoryEntry::new("obs A", "go to desk 1")];
        let s = b.build(TASK, "o", &adm(&["look"]), &hist, 1).unwrap();
        let t = b.build_teacher(TASK, "o", &adm(&["look"]), &hist, 1).unwrap();
        assert!(t.ends_with(&s));
        let block = &t[..t.len() - s.len()];
        assert!(block.starts_with(skills::SKILL_HEADER));
        assert!(block.contains("sink"), "clean skill retrieved");
    }

    #[test]
    fn text_env_builtin_and_user_templates() {
        let b = PromptBuilder::new(EnvKind::Text, 2, None, None).unwrap();
        let hist = vec![
            HistoryEntry::new("o1", "a1"),
            HistoryEntry::new("o2", "a2"),
            HistoryEntry::new("o3", "a3"),
        ];
        let p = b
            .build_detailed("find the key", " o4 ", &adm(&["look"]), &hist, 3)
            .unwrap();
        assert_eq!(p.variant, Variant::WithHistory);
        assert!(
            p.text
                .contains("[Observation 2: 'o2', Action 2: 'a2']\n[Observation 3: 'o3', Action 3: 'a3']"),
            "{}",
            p.text
        );
        assert!(
            p.text.contains("current observation is:  o4 \n"),
            "verbatim: {}",
            p.text
        );
        assert_eq!(b.template_source(), Some(crate::text::template::TEXT_TEMPLATE));
        let u = b
            .clone()
            .with_template("{{ task }}/{% for h in history %}{{ h.step }}{% endfor %}/{{ observation }}")
            .unwrap();
        assert_eq!(u.build("t", "o", &adm(&[]), &hist, 3).unwrap(), "t/23/o");
        assert_eq!(u.build("t", "o", &adm(&[]), NO_HIST, 0).unwrap(), "t//o");
        // the teacher of a text env without a skills folder reads the student's prompt
        assert_eq!(u.build_teacher("t", "o", &adm(&[]), NO_HIST, 0).unwrap(), "t//o");
        let e = PromptBuilder::new(EnvKind::Alfworld, 2, None, None)
            .unwrap()
            .with_template("x")
            .unwrap_err();
        assert!(e.to_string().contains("`template`"), "{e}");
    }

    #[test]
    fn text_env_budget_drops_history_first() {
        let dir = model_dir("text-budget");
        let tok = Arc::new(ChatTokenizer::from_dir(&dir).unwrap());
        let hist = vec![HistoryEntry::new("go to desk 1 ".repeat(30), "look")];
        let big = PromptBuilder::new(EnvKind::Text, 2, Some(100_000), Some(tok.clone())).unwrap();
        let n_full = big.build_detailed("t", "o", NO_ADM, &hist, 1).unwrap().tokens.unwrap();
        let b = PromptBuilder::new(EnvKind::Text, 2, Some(n_full - 1), Some(tok)).unwrap();
        let p = b.build_detailed("t", "o", NO_ADM, &hist, 1).unwrap();
        assert_eq!(p.variant, Variant::NoHistory);
        assert!(!p.text.contains("desk"));
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn history_length_zero_uses_no_history_template() {
        let b = PromptBuilder::new(EnvKind::Alfworld, 0, None, None).unwrap();
        let p = b
            .build_detailed(TASK, "o", NO_ADM, &[HistoryEntry::new("a", "b")], 1)
            .unwrap();
        assert_eq!(p.variant, Variant::NoHistory);
    }

    #[test]
    fn budget_falls_back_then_errors() {
        let dir = model_dir("budget");
        let tok = Arc::new(ChatTokenizer::from_dir(&dir).unwrap());
        let adm = vec!["look".to_string()];
        let hist = vec![HistoryEntry::new("go to desk 1 ".repeat(30), "look")];
        let count = |b: &PromptBuilder, h: &[HistoryEntry], step| {
            b.build_detailed("look", "a", &adm, h, step).unwrap().tokens.unwrap()
        };
        let big = PromptBuilder::new(EnvKind::Alfworld, 2, Some(100_000), Some(tok.clone())).unwrap();
        let n_full = count(&big, &hist, 1);
        let n_short = count(&big, &[], 0);
        assert!(n_short < n_full);
        let b = PromptBuilder::new(EnvKind::Alfworld, 2, Some(n_full - 1), Some(tok.clone())).unwrap();
        let p = b.build_detailed("look", "a", &adm, &hist, 1).unwrap();
        assert_eq!((p.variant, p.tokens), (Variant::NoHistory, Some(n_short)));
        let b = PromptBuilder::new(EnvKind::Alfworld, 2, Some(n_short - 1), Some(tok)).unwrap();
        let e = b.build("look", "a", &adm, &hist, 1).unwrap_err();
        assert!(matches!(e, PromptError::TooLong { .. }), "{e}");
        std::fs::remove_dir_all(&dir).ok();
    }
}
