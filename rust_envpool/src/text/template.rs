//! Prompts of any text environment (`env = "text"`): one Jinja template, the built-in
//! [`TEXT_TEMPLATE`] or the user's, rendered with minijinja.
//!
//! The built-in template follows the structure of the paper's appendix prompts: the task, the step
//! count and the last `H` observation-action pairs (after the first step), the current
//! observation, the admissible actions when the environment lists them, and the
//! `<think>`/`<action>` instructions. The same template renders both variants of the budget rule
//! (see [`super::prompt`]): the no-history variant is the template with an empty `history`.
//!
//! Syntax: Jinja as Python's `jinja2` with `trim_blocks=True, lstrip_blocks=True` (a block tag on
//! its own line leaves no blank line; Hugging Face chat templates use the same settings),
//! Python's string methods (`pycompat`), strict undefined variables (a misspelt name is an
//! error, not an empty string), and, as in `jinja2`, one trailing newline of the source dropped.
//! Values are inserted once: `{{ … }}` inside an observation is text, never re-interpreted.
//!
//! Variables ([`TEXT_VARIABLES`]; `pcsd.text.prompts.TEXT_TEMPLATE_VARIABLES` documents them):
//! `task`, `observation`, `actions` (list of str, empty when the env gives none), `history`
//! (list of `{step, observation, action}`, the last `H` steps, empty at the first step and in the
//! no-history variant), `step` (steps already taken), `current_step` (`step + 1`),
//! `admissible_actions` (the actions quoted and joined as the appendix prompts list them),
//! `action_history` (the history as the appendix's `[Observation k: '…', Action k: '…']` lines)
//! and `instructions` (the `<think>`/`<action>` format), plus the built-in templates' names
//! `task_description`, `current_observation`, `step_count` and `history_length`.

use minijinja::syntax::SyntaxConfig;
use minijinja::{context, Environment, UndefinedBehavior, Value};

use crate::text::error::PromptError;

/// The format instructions at the end of the prompts (the appendix's ALFWorld wording).
pub const THINK_ACTION_INSTRUCTIONS: &str = "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed within <think> </think> tags.
Once you've finished your reasoning, you should choose an admissible action for current step and present it within <action> </action> tags.";

/// The instructions when the environment lists no actions (any text is an action).
pub const THINK_ACTION_INSTRUCTIONS_FREE: &str = "You should first reason step-by-step about the current situation. This reasoning process MUST be enclosed within <think> </think> tags.
Once you've finished your reasoning, you should choose an action for current step and present it within <action> </action> tags.";

/// The built-in template of `env = "text"`.
pub const TEXT_TEMPLATE: &str = "You are an expert agent operating in a text environment. Your task is to: {{ task }}

{% if history %}
Prior to this step, you have already taken {{ step }} step(s). Below are the most recent {{ history | length }} observations and the corresponding actions you took: {{ action_history }}

You are now at step {{ current_step }} and your current observation is: {{ observation }}
{% else %}
Your current observation is: {{ observation }}
{% endif %}

{% if actions %}
Your admissible actions of the current situation are: [{{ admissible_actions }}].

{% endif %}
Now it's your turn to take an action.
{{ instructions }}
";

/// Every variable a text template may read.
pub const TEXT_VARIABLES: &[&str] = &[
    "task",
    "observation",
    "actions",
    "history",
    "step",
    "current_step",
    "admissible_actions",
    "action_history",
    "instructions",
    "task_description",
    "current_observation",
    "step_count",
    "history_length",
];

/// One compiled text template.
#[derive(Debug)]
pub struct TextTemplate {
    env: Environment<'static>,
    source: String,
}

/// What one prompt shows: `history` is already the tail the prompt shows (at most `H` entries,
/// none in the no-history variant), numbered from `first_step`.
pub struct TextContext<'a, A: AsRef<str>> {
    pub task: &'a str,
    pub observation: &'a str,
    pub actions: &'a [A],
    pub history: &'a [(&'a str, &'a str)],
    pub first_step: usize,
    pub step: usize,
    pub action_history: &'a str,
}

impl TextTemplate {
    /// Compiles `source`; a syntax error is [`PromptError::Template`] with minijinja's message
    /// (line and what was expected).
    pub fn new(source: impl Into<String>) -> Result<Self, PromptError> {
        let source = source.into();
        let mut env = Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()
                .map_err(|e| PromptError::Template(format!("syntax config: {e}")))?,
        );
        env.set_undefined_behavior(UndefinedBehavior::Strict);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_template_owned("text", source.clone())
            .map_err(|e| PromptError::Template(format!("compiling the environment's prompt template: {e:#}")))?;
        Ok(TextTemplate { env, source })
    }

    /// The built-in template.
    pub fn builtin() -> Self {
        TextTemplate::new(TEXT_TEMPLATE).expect("the built-in text template compiles")
    }

    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders one prompt.
    pub fn render<A: AsRef<str>>(&self, c: &TextContext<'_, A>) -> Result<String, PromptError> {
        let actions: Vec<String> = c.actions.iter().map(|a| a.as_ref().to_string()).collect();
        let history: Vec<Value> = c
            .history
            .iter()
            .enumerate()
            .map(|(j, (o, a))| context! { step => c.first_step + j, observation => o.to_string(), action => a.to_string() })
            .collect();
        let admissible = actions.iter().map(|a| format!("'{a}'")).collect::<Vec<_>>().join("\n ");
        let instructions = if actions.is_empty() {
            THINK_ACTION_INSTRUCTIONS_FREE
        } else {
            THINK_ACTION_INSTRUCTIONS
        };
        let n_hist = history.len();
        let (task, observation, action_history) = (
            c.task.to_string(),
            c.observation.to_string(),
            c.action_history.to_string(),
        );
        self.env
            .get_template("text")
            .and_then(|t| {
                t.render(context! {
                    task => task.clone(),
                    observation => observation.clone(),
                    actions => actions,
                    history => history,
                    step => c.step,
                    current_step => c.step + 1,
                    admissible_actions => admissible,
                    action_history => action_history,
                    instructions => instructions,
                    task_description => task,
                    current_observation => observation,
                    step_count => c.step,
                    history_length => n_hist,
                })
            })
            .map_err(|e| PromptError::Template(format!("rendering the environment's prompt template: {e:#}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ctx<'a>(
        actions: &'a [&'a str],
        history: &'a [(&'a str, &'a str)],
        step: usize,
        ah: &'a str,
    ) -> TextContext<'a, &'a str> {
        TextContext {
            task: "open the red door",
            observation: "You see a red door.",
            actions,
            history,
            first_step: step + 1 - history.len(),
            step,
            action_history: ah,
        }
    }

    #[test]
    fn builtin_first_step() {
        let t = TextTemplate::builtin();
        let p = t.render(&ctx(&["take red key", "open red door"], &[], 0, "")).unwrap();
        assert_eq!(
            p,
            "You are an expert agent operating in a text environment. Your task is to: open the red door\n\n\
             Your current observation is: You see a red door.\n\n\
             Your admissible actions of the current situation are: ['take red key'\n 'open red door'].\n\n\
             Now it's your turn to take an action.\n"
                .to_string()
                + THINK_ACTION_INSTRUCTIONS
        );
    }

    #[test]
    fn builtin_with_history_and_no_actions() {
        let t = TextTemplate::builtin();
        let h = [("o1", "a1")];
        let p = t
            .render(&ctx(&[], &h, 1, "[Observation 1: 'o1', Action 1: 'a1']"))
            .unwrap();
        assert!(
            p.contains(
                "taken 1 step(s). Below are the most recent 1 observations and the corresponding actions \
                            you took: [Observation 1: 'o1', Action 1: 'a1']\n\nYou are now at step 2 and your current \
                            observation is: You see a red door.\n\nNow it's your turn"
            ),
            "{p}"
        );
        assert!(!p.contains("admissible"));
        assert!(p.ends_with(THINK_ACTION_INSTRUCTIONS_FREE));
    }

    #[test]
    fn user_template_sees_structured_values() {
        let t = TextTemplate::new(
            "{{ task | upper }}|{% for h in history %}{{ h.step }}:{{ h.action }};{% endfor %}|{{ actions | join(',') }}|{{ current_step }}\n",
        )
        .unwrap();
        let h = [("o2", "a2"), ("o3", "a3")];
        assert_eq!(
            t.render(&ctx(&["x", "y"], &h, 3, "")).unwrap(),
            "OPEN THE RED DOOR|2:a2;3:a3;|x,y|4"
        );
    }

    #[test]
    fn values_are_not_reinterpreted() {
        let t = TextTemplate::builtin();
        let c = TextContext {
            task: "{{ step }}",
            observation: "{% if %}",
            actions: &["{{ x }}"],
            history: &[],
            first_step: 1,
            step: 0,
            action_history: "",
        };
        let p = t.render(&c).unwrap();
        assert!(
            p.contains("to: {{ step }}") && p.contains("is: {% if %}") && p.contains("['{{ x }}']"),
            "{p}"
        );
    }

    #[test]
    fn errors_name_the_problem() {
        let e = TextTemplate::new("{% if task %}never closed").unwrap_err();
        assert!(
            e.to_string().contains("compiling the environment's prompt template"),
            "{e}"
        );
        let t = TextTemplate::new("{{ taks }}").unwrap();
        let e = t.render(&ctx(&[], &[], 0, "")).unwrap_err();
        assert!(e.to_string().contains("undefined"), "{e}");
    }
}
