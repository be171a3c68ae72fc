//! Parsing of the agent's response: `<think>…</think>` followed by `<action>…</action>`.
//!
//! The parser never fails: whatever the text, it returns the best action string to send to the
//! environment together with flags describing what was wrong. Penalties for malformed responses
//! are the caller's business.

pub const THINK_OPEN: &str = "<think>";
pub const THINK_CLOSE: &str = "</think>";
pub const ACTION_OPEN: &str = "<action>";
pub const ACTION_CLOSE: &str = "</action>";

/// Strip whitespace as Python's `str.strip()` does (Unicode White_Space plus the ASCII
/// separators U+001C..U+001F that Python also treats as whitespace).
pub fn py_strip(s: &str) -> &str {
    s.trim_matches(|c: char| c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c))
}

/// Result of [`parse_action`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedAction {
    /// The action (content of the first `<action>` block, stripped). When there is no complete
    /// action block: the text after the last `</think>` (or the whole text), stripped.
    pub action: String,
    /// The reasoning inside the first complete `<think>…</think>` block, if any (stripped).
    pub think: Option<String>,
    /// No complete `<think>…</think>` block ending before the action block.
    pub missing_think: bool,
    /// No complete `<action>…</action>` block.
    pub missing_action_tags: bool,
    /// More than one `<action>` opening tag after the reasoning.
    pub multiple_actions: bool,
    /// The action is not in the admissible list (exact match after strip, case-sensitive).
    /// Always false when no admissible list was given.
    pub not_admissible: bool,
}

impl ParsedAction {
    /// True when the response is well formed and (if checked) admissible.
    pub fn is_valid(&self) -> bool {
        !(self.missing_think || self.missing_action_tags || self.multiple_actions || self.not_admissible)
    }
}

/// Parse a model response. `admissible`: when given, flags actions not in the list.
pub fn parse_action(text: &str, admissible: Option<&[String]>) -> ParsedAction {
    // Reasoning block: first <think> and the first </think> after it.
    let think_span = text.find(THINK_OPEN).and_then(|s| {
        let body = s + THINK_OPEN.len();
        text[body..]
            .find(THINK_CLOSE)
            .map(|e| (body, body + e, body + e + THINK_CLOSE.len()))
    });
    // Actions are searched after the reasoning, so tags quoted inside <think> do not count.
    let search_from = think_span.map(|(_, _, end)| end).unwrap_or(0);
    let rest = &text[search_from..];
    let n_open = rest.matches(ACTION_OPEN).count();
    let first_action = rest.find(ACTION_OPEN).and_then(|s| {
        let body = s + ACTION_OPEN.len();
        rest[body..].find(ACTION_CLOSE).map(|e| (s, &rest[body..body + e]))
    });

    let (action, missing_action_tags) = match first_action {
        Some((_, a)) => (py_strip(a).to_string(), false),
        None => {
            let tail = match text.rfind(THINK_CLOSE) {
                Some(p) => &text[p + THINK_CLOSE.len()..],
                None => text,
            };
            (py_strip(tail).to_string(), true)
        }
    };
    let think = think_span.map(|(b, e, _)| py_strip(&text[b..e]).to_string());
    let missing_think = think_span.is_none();
    let not_admissible = match admissible {
        Some(list) => !list.iter().any(|a| py_strip(a) == action),
        None => false,
    };
    ParsedAction {
        action,
        think,
        missing_think,
        missing_action_tags,
        multiple_actions: n_open > 1,
        not_admissible,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn adm(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn well_formed() {
        let a = adm(&["go to desk 1", "take mug 1 from desk 1"]);
        let p = parse_action(
            "<think>The mug is on the desk.</think>\n<action> take mug 1 from desk 1 </action>",
            Some(&a),
        );
        assert_eq!(p.action, "take mug 1 from desk 1");
        assert_eq!(p.think.as_deref(), Some("The mug is on the desk."));
        assert!(p.is_valid(), "{p:?}");
    }

    #[test]
    fn flags() {
        let a = adm(&["look"]);
        let p = parse_action("<action>look</action>", Some(&a));
        assert!(p.missing_think && !p.missing_action_tags && !p.not_admissible);
        let p = parse_action("<think>x</think> look", Some(&a));
        assert!(p.missing_action_tags && !p.missing_think);
        assert_eq!(p.action, "look");
        let p = parse_action(
            "<think>x</think><action>look</action><action>go to desk 1</action>",
            Some(&a),
        );
        assert!(p.multiple_actions);
        assert_eq!(p.action, "look");
        let p = parse_action("<think>x</think><action>Look</action>", Some(&a));
        assert!(p.not_admissible, "case-sensitive match");
        assert_eq!(p.action, "Look");
        let p = parse_action("<think>x</think><action>look</action>", None);
        assert!(p.is_valid());
        let p = parse_action("<think>x</think><action>look</action>", Some(&[]));
        assert!(p.not_admissible);
    }

    #[test]
    fn tags_inside_think_do_not_count() {
        let p = parse_action(
            "<think>I must answer with <action>...</action> tags.</think><action>look</action>",
            None,
        );
        assert_eq!(p.action, "look");
        assert!(!p.multiple_actions);
    }

    #[test]
    fn unclosed_tags() {
        let p = parse_action("<think>never closed <action>look", None);
        assert!(p.missing_think);
        assert!(p.missing_action_tags);
        let p = parse_action("", None);
        assert_eq!(p.action, "");
        assert!(p.missing_think && p.missing_action_tags);
    }

    proptest! {
        #[test]
        fn never_panics(s in "\\PC*", adm_list in proptest::collection::vec("\\PC{0,12}", 0..4)) {
            let p = parse_action(&s, Some(&adm_list));
            prop_assert_eq!(py_strip(&p.action), p.action.as_str());
        }

        #[test]
        fn never_panics_tag_soup(parts in proptest::collection::vec(
            prop_oneof![Just("<think>".to_string()), Just("</think>".to_string()),
                        Just("<action>".to_string()), Just("</action>".to_string()),
                        "[a-zé ]{0,5}"], 0..12)) {
            let s: String = parts.concat();
            let _ = parse_action(&s, None);
        }

        #[test]
        fn round_trip(think in "[^<>]{0,40}", action in "[a-z0-9 ]{1,30}", sep in "[ \n]{0,3}") {
            let text = format!("<think>{think}</think>{sep}<action>{action}</action>");
            let admissible = vec![py_strip(&action).to_string()];
            let p = parse_action(&text, Some(&admissible));
            prop_assert_eq!(&p.action, py_strip(&action));
            let think_trim = py_strip(&think).to_string();
            prop_assert_eq!(p.think.as_deref(), Some(think_trim.as_str()));
            prop_assert!(p.is_valid());
        }
    }
}
