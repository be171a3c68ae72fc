//! PyO3 wrappers for prompts, chat templates, tokenisation, action parsing and skills.
//! Typed Python API: `pcsd/text/prompts.py`.

use std::path::PathBuf;
use std::sync::Arc;

use pyo3::create_exception;
use pyo3::exceptions::{PyFileNotFoundError, PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList, PyString};

use super::requests::{IntCache, Requests};

use crate::text::chat::Message;
use crate::text::error::PromptError;
use crate::text::parse;
use crate::text::prompt::{self, HistoryEntry, Variant};
use crate::text::skills::{self, EnvKind};
use crate::text::tokenize::ChatTokenizer;

create_exception!(
    _envpool,
    PromptTooLongError,
    PyValueError,
    "The prompt exceeds max_prompt_tokens even without interaction history."
);

fn to_py(e: PromptError) -> PyErr {
    match e {
        PromptError::MissingFile { .. } => PyFileNotFoundError::new_err(e.to_string()),
        PromptError::Io { .. } => PyOSError::new_err(e.to_string()),
        PromptError::TooLong { .. } => PromptTooLongError::new_err(e.to_string()),
        PromptError::InvalidArgument { .. } | PromptError::Template(_) | PromptError::Tokenizer(_) => {
            PyValueError::new_err(e.to_string())
        }
    }
}

fn env_kind(env: &str) -> PyResult<EnvKind> {
    env.parse::<EnvKind>().map_err(to_py)
}

fn history_entries(history: Vec<(String, String)>) -> Vec<HistoryEntry> {
    history.into_iter().map(|(o, a)| HistoryEntry::new(o, a)).collect()
}

fn to_messages(conv: Vec<(String, String)>) -> Vec<Message> {
    conv.into_iter().map(|(r, c)| Message::new(r, c)).collect()
}

/// Tokenizer + chat template of a model directory.
#[pyclass(name = "ChatTokenizer", module = "pcsd._envpool", frozen)]
pub struct PyChatTokenizer {
    inner: Arc<ChatTokenizer>,
}

#[pymethods]
impl PyChatTokenizer {
    #[new]
    #[pyo3(signature = (tokenizer_dir, enable_thinking=None))]
    fn new(py: Python<'_>, tokenizer_dir: PathBuf, enable_thinking: Option<bool>) -> PyResult<Self> {
        let mut inner = py.detach(|| ChatTokenizer::from_dir(&tokenizer_dir)).map_err(to_py)?;
        inner.set_enable_thinking(enable_thinking);
        Ok(PyChatTokenizer { inner: Arc::new(inner) })
    }

    /// Render `[(role, content), ...]` with the chat template.
    #[pyo3(signature = (messages, add_generation_prompt=true))]
    fn render(&self, messages: Vec<(String, String)>, add_generation_prompt: bool) -> PyResult<String> {
        self.inner
            .template()
            .render(&to_messages(messages), add_generation_prompt)
            .map_err(to_py)
    }

    /// Render (with generation prompt) and tokenise each conversation, in parallel, GIL released.
    fn encode_conversations(
        &self,
        py: Python<'_>,
        conversations: Vec<Vec<(String, String)>>,
    ) -> PyResult<Vec<Vec<u32>>> {
        use rayon::prelude::*;
        let convs: Vec<Vec<Message>> = conversations.into_iter().map(to_messages).collect();
        py.detach(|| {
            convs
                .par_iter()
                .map(|c| self.inner.encode_messages(c))
                .collect::<Result<Vec<_>, _>>()
        })
        .map_err(to_py)
    }

    /// Chat-format and tokenise user prompts (optional system message), in parallel.
    #[pyo3(signature = (prompts, system=None))]
    fn encode_chat(&self, py: Python<'_>, prompts: Vec<String>, system: Option<String>) -> PyResult<Vec<Vec<u32>>> {
        py.detach(|| self.inner.encode_chat_batch(&prompts, system.as_deref()))
            .map_err(to_py)
    }

    /// Sequential reference of `encode_chat`.
    #[pyo3(signature = (prompts, system=None))]
    fn encode_chat_sequential(
        &self,
        py: Python<'_>,
        prompts: Vec<String>,
        system: Option<String>,
    ) -> PyResult<Vec<Vec<u32>>> {
        py.detach(|| self.inner.encode_chat_batch_sequential(&prompts, system.as_deref()))
            .map_err(to_py)
    }

    /// Token ids of plain text (no special tokens added); through the piece cache when the
    /// tokenizer supports it (`piece_cache_status`), same ids as `encode_whole`.
    fn encode(&self, text: &str) -> PyResult<Vec<u32>> {
        self.inner.encode(text).map_err(to_py)
    }

    /// Plain reference of `encode`: the whole string through the tokenizer.
    fn encode_whole(&self, text: &str) -> PyResult<Vec<u32>> {
        self.inner.encode_whole(text).map_err(to_py)
    }

    /// None when `encode` uses the piece cache, else why it encodes whole strings.
    #[getter]
    fn piece_cache_unsupported(&self) -> Option<String> {
        self.inner.piece_cache_status().err().map(str::to_string)
    }

    fn decode(&self, ids: Vec<u32>) -> PyResult<String> {
        self.inner.decode(&ids).map_err(to_py)
    }

    #[getter]
    fn tokenizer_dir(&self) -> PathBuf {
        self.inner.dir().to_path_buf()
    }
}

/// Student/teacher prompt builder.
#[pyclass(name = "PromptBuilder", module = "pcsd._envpool", frozen)]
pub struct PyPromptBuilder {
    inner: prompt::PromptBuilder,
    /// `build_batch`'s own threads; None: rayon's global pool (one thread per core).
    threads: Option<rayon::ThreadPool>,
    /// Shared `int`s of the token ids handed out.
    ints: IntCache,
}

#[pymethods]
impl PyPromptBuilder {
    #[new]
    /// num_threads: threads of `build_batch`; 0 shares rayon's global pool (one per core).
    /// template: the Jinja source of a text environment's prompt (env "text"; None: the built-in one).
    #[pyo3(signature = (env, history_length=2, max_prompt_tokens=Some(2048), tokenizer=None, num_threads=0, template=None))]
    fn new(
        env: &str,
        history_length: usize,
        max_prompt_tokens: Option<usize>,
        tokenizer: Option<PyRef<'_, PyChatTokenizer>>,
        num_threads: usize,
        template: Option<&str>,
    ) -> PyResult<Self> {
        let tok = tokenizer.map(|t| t.inner.clone());
        let mut inner =
            prompt::PromptBuilder::new(env_kind(env)?, history_length, max_prompt_tokens, tok).map_err(to_py)?;
        if let Some(src) = template {
            inner = inner.with_template(src).map_err(to_py)?;
        }
        let threads = match num_threads {
            0 => None,
            n => Some(
                rayon::ThreadPoolBuilder::new()
                    .num_threads(n)
                    .thread_name(|i| format!("pcsd-prompts-{i}"))
                    .build()
                    .map_err(|e| PyOSError::new_err(format!("num_threads: could not start {n} threads: {e}")))?,
            ),
        };
        Ok(PyPromptBuilder {
            inner,
            threads,
            ints: IntCache::default(),
        })
    }

    /// Returns (text, variant, tokens) with variant "history" or "no_history".
    fn build_detailed(
        &self,
        py: Python<'_>,
        task: String,
        observation: String,
        admissible: Vec<String>,
        history: Vec<(String, String)>,
        step: usize,
    ) -> PyResult<(String, &'static str, Option<usize>)> {
        let h = history_entries(history);
        let b = py
            .detach(|| self.inner.build_detailed(&task, &observation, &admissible, &h, step))
            .map_err(to_py)?;
        let v = match b.variant {
            Variant::WithHistory => "history",
            Variant::NoHistory => "no_history",
        };
        Ok((b.text, v, b.tokens))
    }

    fn build_teacher(
        &self,
        py: Python<'_>,
        task: String,
        observation: String,
        admissible: Vec<String>,
        history: Vec<(String, String)>,
        step: usize,
    ) -> PyResult<String> {
        let h = history_entries(history);
        py.detach(|| self.inner.build_teacher(&task, &observation, &admissible, &h, step))
            .map_err(to_py)
    }

    /// Build prompts for `requests` (mappings: task, observation, admissible, optional history
    /// and step) and chat-encode them, in parallel with the GIL released. Returns
    /// [(text, ids), ...], or [ids, ...] when `with_text` is false.
    #[pyo3(signature = (requests, teacher=false, system=None, with_text=true))]
    fn build_batch<'py>(
        &self,
        py: Python<'py>,
        requests: &Bound<'py, PyAny>,
        teacher: bool,
        system: Option<String>,
        with_text: bool,
    ) -> PyResult<Bound<'py, PyList>> {
        let reqs = Requests::read(requests, self.inner.history_length)?;
        let built = reqs
            .with_requests(|reqs| {
                let build = || self.inner.build_batch_encoded(reqs, teacher, system.as_deref());
                py.detach(|| match &self.threads {
                    Some(pool) => pool.install(build),
                    None => build(),
                })
            })?
            .map_err(to_py)?;
        drop(reqs);
        let ids = self.ints.lists(py, built.iter().map(|(_, ids)| ids.as_slice()))?;
        if with_text {
            PyList::new(
                py,
                built
                    .iter()
                    .zip(ids)
                    .map(|((text, _), ids)| (PyString::new(py, text), ids)),
            )
        } else {
            PyList::new(py, ids)
        }
    }

    #[getter]
    fn budget_enforced(&self) -> bool {
        self.inner.budget_enforced()
    }

    /// The template source of a text builder (the user's or the built-in one); None otherwise.
    #[getter]
    fn template(&self) -> Option<String> {
        self.inner.template_source().map(str::to_string)
    }
}

/// Parse a response; returns a dict with action, think and the flags.
#[pyfunction]
#[pyo3(signature = (text, admissible=None))]
fn parse_action<'py>(py: Python<'py>, text: &str, admissible: Option<Vec<String>>) -> PyResult<Bound<'py, PyDict>> {
    let p = parse::parse_action(text, admissible.as_deref());
    let d = PyDict::new(py);
    d.set_item("action", p.action)?;
    d.set_item("think", p.think)?;
    d.set_item("missing_think", p.missing_think)?;
    d.set_item("missing_action_tags", p.missing_action_tags)?;
    d.set_item("multiple_actions", p.multiple_actions)?;
    d.set_item("not_admissible", p.not_admissible)?;
    Ok(d)
}

/// Retrieved skills (general + task type) as text, without header/footer.
#[pyfunction]
#[pyo3(signature = (task, env="alfworld"))]
fn retrieve_skills(task: &str, env: &str) -> PyResult<String> {
    Ok(skills::retrieve_text(task, env_kind(env)?))
}

/// Names of the retrieved skills, general first.
#[pyfunction]
#[pyo3(signature = (task, env="alfworld"))]
fn retrieve_skill_names(task: &str, env: &str) -> PyResult<Vec<&'static str>> {
    Ok(skills::retrieve(task, env_kind(env)?)
        .into_iter()
        .map(|s| s.name)
        .collect())
}

/// ALFWorld task type name of a task description, or None when no task type's keywords match.
#[pyfunction]
fn classify_alfworld_task(task: &str) -> Option<&'static str> {
    skills::classify_alfworld_task(task).map(|t| t.name())
}

/// Teacher prompt from an already built student prompt.
#[pyfunction]
#[pyo3(signature = (task, student_prompt, env="alfworld"))]
fn teacher_from_student(task: &str, student_prompt: &str, env: &str) -> PyResult<String> {
    Ok(prompt::teacher_from_student(env_kind(env)?, task, student_prompt))
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyChatTokenizer>()?;
    m.add_class::<PyPromptBuilder>()?;
    m.add("PromptTooLongError", m.py().get_type::<PromptTooLongError>())?;
    m.add("SKILL_HEADER", skills::SKILL_HEADER)?;
    m.add("SKILL_FOOTER", skills::SKILL_FOOTER)?;
    m.add("TEXT_TEMPLATE", crate::text::template::TEXT_TEMPLATE)?;
    m.add(
        "TEXT_TEMPLATE_VARIABLES",
        crate::text::template::TEXT_VARIABLES.to_vec(),
    )?;
    m.add_function(wrap_pyfunction!(parse_action, m)?)?;
    m.add_function(wrap_pyfunction!(retrieve_skills, m)?)?;
    m.add_function(wrap_pyfunction!(retrieve_skill_names, m)?)?;
    m.add_function(wrap_pyfunction!(classify_alfworld_task, m)?)?;
    m.add_function(wrap_pyfunction!(teacher_from_student, m)?)?;
    Ok(())
}
