"""Prompt assembly, chat templating, tokenisation, action parsing and skill retrieval.

Thin typed layer over the Rust implementation in ``pcsd._envpool`` (``rust_envpool/src/
{prompt,chat,tokenize,parse,skills}.rs``):

* :class:`PromptBuilder` builds the student prompt of the paper's appendix (first step without
  history, later steps with the step count and the last ``history_length`` observation-action
  pairs), the teacher prompt (retrieved skills prepended), and chat-formats and tokenises batches
  of prompts in parallel with the GIL released.
* :func:`parse_action` splits a response into reasoning and action with validity flags.
* :func:`retrieve_skills` returns the keyword-retrieved privileged skills for a task.
* An environment's own privileged text (a Python env's ``info["privileged"]``: a request's
  ``privileged`` key) goes into the teacher prompt only, in its own block
  (:data:`PRIVILEGED_HEADER` ... :data:`PRIVILEGED_FOOTER`) after the skills and before the student
  prompt; a student prompt never shows it.

Three prompt families (``env``): ``alfworld`` and ``webshop`` (the paper's appendix templates,
fixed) and ``text`` (any other text environment: a Jinja template, the built-in
:data:`TEXT_TEMPLATE` or the user's, rendered on the native side like the others; its variables
are :data:`TEXT_TEMPLATE_VARIABLES`). :mod:`pcsd.text.formats` holds what else differs per family
(the task, the observation and actions the prompt shows, how a response becomes an action).

Example::

    pb = PromptBuilder("alfworld", tokenizer_dir="/models/Qwen2.5-3B-Instruct")
    text = pb.build(task, obs, admissible, history=[], step=0)
    ids = pb.encode_chat([text])[0]
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Optional, Union, cast

from pcsd import _native

if TYPE_CHECKING:  # bound on first use by __getattr__ (the native module loads lazily)
    from pcsd._envpool import TEXT_TEMPLATE, PromptTooLongError

    TEXT_TEMPLATE_VARIABLES: tuple[str, ...]

__all__ = [
    "DEFAULT_MAX_PRIVILEGED_TOKENS",
    "PRIVILEGED_CUT",
    "PRIVILEGED_FOOTER",
    "PRIVILEGED_HEADER",
    "ChatTokenizer",
    "HistoryItem",
    "ParsedAction",
    "PromptBuilder",
    "PromptTooLongError",
    "SkillRepository",
    "TEXT_TEMPLATE",
    "TEXT_TEMPLATE_VARIABLES",
    "classify_alfworld_task",
    "format_webshop_observation",
    "parse_action",
    "project_webshop_action",
    "retrieve_skills",
    "webshop_actions",
    "webshop_task",
]

EnvName = Literal["alfworld", "webshop", "text"]
ENV_NAMES = ("alfworld", "webshop", "text")
#: Around an environment's privileged text in a teacher prompt (after the skills, before the student prompt).
PRIVILEGED_HEADER = "[Privileged Environment Information]"
PRIVILEGED_FOOTER = "[End of Environment Information]"
#: What ends an env's privileged text cut to ``max_privileged_tokens`` in a teacher prompt.
PRIVILEGED_CUT = " [...]"
#: The default budget of an env's privileged text in a teacher prompt (``rollout.max_privileged_tokens``).
DEFAULT_MAX_PRIVILEGED_TOKENS = 1024
# at most this many characters of a privileged text are tokenized to cut it (a token is rarely longer)
_CHARS_PER_TOKEN = 32
#: One past step: ``(observation, action)`` or a mapping with ``observation`` and ``action`` keys.
HistoryItem = Union[tuple[str, str], Mapping[str, str]]


def _mod():
    return _native.require("_envpool")


def __getattr__(name: str):
    if name in ("PromptTooLongError", "TEXT_TEMPLATE"):
        return getattr(_mod(), name)
    if name == "TEXT_TEMPLATE_VARIABLES":
        return tuple(_mod().TEXT_TEMPLATE_VARIABLES)
    raise AttributeError(name)


def _check_env(env: str) -> EnvName:
    name = env.strip().lower() if isinstance(env, str) else None
    if name in ENV_NAMES:
        return cast(EnvName, name)
    raise ValueError(f"env: expected 'alfworld', 'webshop' or 'text', got {env!r}")


def _str_list(name: str, value: Sequence[str]) -> list[str]:
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise ValueError(f"{name}: expected a list of strings, got {type(value).__name__}")
    out = list(value)
    for i, v in enumerate(out):
        if not isinstance(v, str):
            raise ValueError(f"{name}[{i}]: expected str, got {type(v).__name__}")
    return out


def _history(history: Sequence[HistoryItem]) -> list[tuple[str, str]]:
    if isinstance(history, str) or not isinstance(history, Sequence):
        raise ValueError(f"history: expected a list of (observation, action) pairs, got {type(history).__name__}")
    out: list[tuple[str, str]] = []
    for i, h in enumerate(history):
        if isinstance(h, Mapping):
            try:
                obs, act = h["observation"], h["action"]
            except KeyError as exc:
                raise ValueError(f"history[{i}]: expected keys 'observation' and 'action', missing {exc}") from None
        elif isinstance(h, Sequence) and not isinstance(h, str) and len(h) == 2:
            obs, act = h[0], h[1]
        else:
            raise ValueError(f"history[{i}]: expected an (observation, action) pair, got {h!r}")
        if not isinstance(obs, str) or not isinstance(act, str):
            raise ValueError(f"history[{i}]: observation and action must be str")
        out.append((obs, act))
    return out


def _step(step: int) -> int:
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step: expected a non-negative int (steps already taken), got {step!r}")
    return step


class ChatTokenizer:
    """A model directory's ``tokenizer.json`` plus its chat template, rendered in Rust.

    Raises:
        FileNotFoundError: the directory or ``tokenizer.json`` or the chat template is missing.
        ValueError: the chat template does not compile.
    """

    def __init__(self, tokenizer_dir: str | os.PathLike[str], enable_thinking: bool | None = None) -> None:
        """``enable_thinking`` is passed to the template when not None (Qwen3: ``False`` appends an
        empty ``<think>`` block to the generation prompt), like
        ``apply_chat_template(..., enable_thinking=...)``."""
        if enable_thinking is not None and not isinstance(enable_thinking, bool):
            raise ValueError(f"enable_thinking: expected bool or None, got {enable_thinking!r}")
        self._inner = _mod().ChatTokenizer(os.fspath(tokenizer_dir), enable_thinking)

    @property
    def tokenizer_dir(self) -> Path:
        return Path(self._inner.tokenizer_dir)

    def render(self, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool = True) -> str:
        """The chat-template text for ``[{"role": ..., "content": ...}, ...]``."""
        return self._inner.render(_messages(messages), add_generation_prompt)

    def encode_conversations(self, conversations: Sequence[Sequence[Mapping[str, str]]]) -> list[list[int]]:
        """``apply_chat_template(conv, add_generation_prompt=True, tokenize=True)`` per conversation."""
        return self._inner.encode_conversations([_messages(c) for c in conversations])

    def encode_chat(self, prompts: Sequence[str], system: str | None = None) -> list[list[int]]:
        """Chat-format each prompt as one user turn (after ``system`` if given) and tokenise."""
        return self._inner.encode_chat(_str_list("prompts", prompts), system)

    def encode(self, text: str) -> list[int]:
        """Token ids of plain text, without adding special tokens."""
        return self._inner.encode(text)

    def decode(self, ids: Sequence[int]) -> str:
        return self._inner.decode(list(ids))


def _messages(messages: Sequence[Mapping[str, str]]) -> list[tuple[str, str]]:
    out = []
    for i, m in enumerate(messages):
        try:
            role, content = m["role"], m["content"]
        except (KeyError, TypeError):
            raise ValueError(f"messages[{i}]: expected a mapping with 'role' and 'content', got {m!r}") from None
        if not isinstance(role, str) or not isinstance(content, str):
            raise ValueError(f"messages[{i}]: 'role' and 'content' must be str")
        out.append((role, content))
    return out


ALFWORLD_TASK_TYPES = (
    "pick_and_place_simple",
    "look_at_obj_in_light",
    "pick_clean_then_place_in_recep",
    "pick_heat_then_place_in_recep",
    "pick_cool_then_place_in_recep",
    "pick_two_obj_and_place",
)
_KEYWORD = re.compile(r"^[a-z0-9]+$")


class SkillRepository:
    """A skills folder that replaces the built-in skill repository in the teacher prompt.

    Layout (every file optional, at least one present; markdown, UTF-8):

    * ``general.md``: always retrieved;
    * ``<task_type>.md``: retrieved for tasks of that type. ALFWorld: the six task types' names,
      the type from the same keyword classification as the built-in skills; text environments
      (``env="text"``): any name (letters, digits, ``_``, ``-``, ``.``), the type the env reports
      (``info["task_type"]``); WebShop: none;
    * ``keywords/<word>.md`` (``word``: lower-case letters and digits): retrieved when ``word`` is
      a whole word of the task description (case-insensitive), in the files' sorted order.

    The retrieved texts are joined like the built-in ones and wrapped in the same header and
    footer. Like the built-in skills they should hold task-level knowledge, not instance answers.

    Raises:
        FileNotFoundError: ``folder`` does not exist or is not a folder.
        ValueError: a ``.md`` file the layout does not know, a task-type file for WebShop, or a
            folder with no skill file; the message names the file.
    """

    _TEXT_TASK_TYPE = re.compile(r"^[A-Za-z0-9_.-]+$")

    def __init__(self, folder: str | os.PathLike[str], env: EnvName = "alfworld") -> None:
        self.env = _check_env(env)
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise FileNotFoundError(f"skills folder {str(self.folder)!r} does not exist or is not a folder")
        self.general: str | None = None
        self.task_types: dict[str, str] = {}
        self.keywords: dict[str, str] = {}
        for f in sorted(self.folder.rglob("*.md")):
            rel = f.relative_to(self.folder)
            text = f.read_text(encoding="utf-8").strip()
            if rel.parts == ("general.md",):
                self.general = text
            elif len(rel.parts) == 1 and f.stem in ALFWORLD_TASK_TYPES and self.env == "alfworld":
                self.task_types[f.stem] = text
            elif len(rel.parts) == 1 and self.env == "text" and self._TEXT_TASK_TYPE.match(f.stem):
                self.task_types[f.stem] = text
            elif len(rel.parts) == 2 and rel.parts[0] == "keywords" and _KEYWORD.match(f.stem):
                self.keywords[f.stem] = text
            else:
                raise ValueError(
                    f"skills folder {str(self.folder)!r}: unexpected file {str(rel)!r}; expected general.md, "
                    + (
                        "<task_type>.md (" + ", ".join(ALFWORLD_TASK_TYPES) + "), "
                        if self.env == "alfworld"
                        else "<task_type>.md (letters, digits, _ - .), "
                        if self.env == "text"
                        else ""
                    )
                    + "or keywords/<word>.md (word: lower-case letters and digits)"
                )
        if self.general is None and not self.task_types and not self.keywords:
            raise ValueError(f"skills folder {str(self.folder)!r} holds no skill file (*.md)")

    def retrieve(self, task: str, task_type: str | None = None) -> str:
        """The skills for ``task``: general, task type, keywords (in that order), joined. The task
        type is ``task_type`` for text environments (the env's ``info["task_type"]``), ALFWorld's
        keyword classification of the task otherwise."""
        parts = [self.general] if self.general else []
        if self.task_types:
            tt = task_type if self.env == "text" else classify_alfworld_task(task)
            if tt in self.task_types:
                parts.append(self.task_types[tt])
        words = set(re.findall(r"[a-z0-9]+", task.lower()))
        parts += [t for w, t in sorted(self.keywords.items()) if w in words]
        return "\n\n".join(p for p in parts if p)

    def block(self, task: str, task_type: str | None = None) -> str:
        """The skill block of the teacher prompt (header, skills, footer, blank line)."""
        m = _mod()
        return f"{m.SKILL_HEADER}\n{self.retrieve(task, task_type)}\n{m.SKILL_FOOTER}\n\n"

    def save(self, folder: str | os.PathLike[str]) -> Path:
        """Writes the skills as read (one file each, in the layout above) to ``folder``, which must
        not exist yet; a repository loaded from it retrieves the same texts. The trainer keeps such
        a copy in the run directory (``skills/``), so that the run's evaluation with skills reads
        what its teacher read."""
        dest = Path(folder)
        if dest.exists():
            raise FileExistsError(f"skills folder {str(dest)!r} exists already: save writes a new folder")
        (dest / "keywords").mkdir(parents=True)
        if self.general is not None:
            (dest / "general.md").write_text(self.general + "\n", encoding="utf-8")
        for name, text in self.task_types.items():
            (dest / f"{name}.md").write_text(text + "\n", encoding="utf-8")
        for word, text in self.keywords.items():
            (dest / "keywords" / f"{word}.md").write_text(text + "\n", encoding="utf-8")
        return dest


class PromptBuilder:
    """Builds student and teacher prompts for one environment.

    Args:
        env: ``"alfworld"``, ``"webshop"`` or ``"text"``. WebShop: verl-agent's template byte for
            byte, and a prompt with history longer than 13,000 characters uses the no-history
            template (verl-agent's rule); pass the task, observation and actions formatted by
            :func:`webshop_task`, :func:`format_webshop_observation` and :func:`webshop_actions`.
            Text: the ``template`` (the no-history variant is the template with an empty history).
        history_length: ``H``, the number of most recent observation-action pairs shown after the
            first step (0 disables history).
        max_prompt_tokens: budget on the chat-formatted student prompt (measured with the
            tokenizer). Over budget, the no-history prompt is used; if that is still over budget
            :class:`PromptTooLongError` (a ``ValueError``) is raised. ``None`` disables the budget.
            The budget can only be measured with a tokenizer: without ``tokenizer_dir`` it is not
            enforced (see :attr:`budget_enforced`).
        tokenizer_dir: model directory with ``tokenizer.json`` and a chat template
            (``tokenizer_config.json`` ``chat_template`` or ``chat_template.jinja``).
        enable_thinking: passed to the chat template when not None (see :class:`ChatTokenizer`).
        num_threads: threads :meth:`build_batch` runs on; 0 (default) shares one pool of one
            thread per core with the other native batch calls.
        skills: a :class:`SkillRepository` or its folder: the teacher prompts' skills come from it
            instead of the built-in repository (None: the built-in skills; none for ``text``, whose
            teacher prompt is then the student prompt).
        max_privileged_tokens: budget on the env's privileged text in a teacher prompt (measured
            with the tokenizer, like ``max_prompt_tokens``): a longer text keeps its first
            ``max_privileged_tokens`` tokens and ends with :data:`PRIVILEGED_CUT`; the first cut says
            so in one line on stderr (:attr:`privileged_cuts` counts them). ``None``: no budget.
        template: ``env="text"`` only: the Jinja source of the prompt (None: :data:`TEXT_TEMPLATE`).
            Syntax and variables: ``rust_envpool/src/text/template.rs`` and
            ``docs/environments.md``; a syntax error is a ValueError here, an unknown variable a
            ValueError at the first build.

    Raises:
        ValueError: bad ``env``/``history_length``/``max_prompt_tokens``, a chat template or a
            ``template`` that does not compile.
        FileNotFoundError: ``tokenizer_dir`` or a file in it is missing.
    """

    def __init__(
        self,
        env: EnvName = "alfworld",
        history_length: int = 2,
        max_prompt_tokens: int | None = 2048,
        tokenizer_dir: str | os.PathLike[str] | None = None,
        enable_thinking: bool | None = None,
        num_threads: int = 0,
        skills: SkillRepository | str | os.PathLike[str] | None = None,
        template: str | None = None,
        max_privileged_tokens: int | None = DEFAULT_MAX_PRIVILEGED_TOKENS,
    ) -> None:
        self.env: str = _check_env(env)
        if template is not None and not isinstance(template, str):
            raise ValueError(
                f"template: expected the template's source text (str) or None, got {type(template).__name__}"
            )
        self.skills: SkillRepository | None = (
            skills if isinstance(skills, SkillRepository) or skills is None else SkillRepository(skills, self.env)
        )
        if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 0:
            raise ValueError(f"num_threads: expected a non-negative int, got {num_threads!r}")
        if isinstance(history_length, bool) or not isinstance(history_length, int) or history_length < 0:
            raise ValueError(f"history_length: expected a non-negative int, got {history_length!r}")
        if max_prompt_tokens is not None and (
            isinstance(max_prompt_tokens, bool) or not isinstance(max_prompt_tokens, int) or max_prompt_tokens <= 0
        ):
            raise ValueError(f"max_prompt_tokens: expected a positive int or None, got {max_prompt_tokens!r}")
        if max_privileged_tokens is not None and (
            isinstance(max_privileged_tokens, bool)
            or not isinstance(max_privileged_tokens, int)
            or max_privileged_tokens <= 0
        ):
            raise ValueError(f"max_privileged_tokens: expected a positive int or None, got {max_privileged_tokens!r}")
        self.history_length = history_length
        self.max_prompt_tokens = max_prompt_tokens
        self.max_privileged_tokens = max_privileged_tokens
        self.privileged_cuts = 0  # privileged texts cut to max_privileged_tokens so far
        self._cut_cache: dict[str, str] = {}
        self.tokenizer: ChatTokenizer | None = (
            ChatTokenizer(tokenizer_dir, enable_thinking) if tokenizer_dir is not None else None
        )
        self._inner = _mod().PromptBuilder(
            self.env,
            history_length,
            max_prompt_tokens,
            self.tokenizer._inner if self.tokenizer is not None else None,
            num_threads,
            template,
        )

    @property
    def template(self) -> str | None:
        """The prompt template's source (``env="text"``: the user's or the built-in one; else None)."""
        return self._inner.template

    @property
    def budget_enforced(self) -> bool:
        """Whether prompts are checked against ``max_prompt_tokens`` (needs a tokenizer)."""
        return bool(self._inner.budget_enforced)

    def min_prompt_tokens(self, system: str | None = None) -> int | None:
        """Tokens of the smallest student prompt the template can give: no history, a one-character
        task, an empty observation and no admissible actions, chat-formatted. A ``max_prompt_tokens``
        below it fits no prompt at all. None without a tokenizer."""
        if self.tokenizer is None:
            return None
        bare = _mod().PromptBuilder(self.env, 0, None, None, 1)  # no budget, no history
        text = bare.build_detailed("x", "", [], [], 0)[0]
        return len(self.tokenizer.encode_chat([text], system)[0])

    def build_detailed(
        self,
        task: str,
        observation: str,
        admissible: Sequence[str],
        history: Sequence[HistoryItem] = (),
        step: int = 0,
    ) -> tuple[str, Literal["history", "no_history"], int | None]:
        """Like :meth:`build`, also returning the variant used and the token count (or None)."""
        return self._inner.build_detailed(
            task, observation, _str_list("admissible", admissible), _history(history), _step(step)
        )

    def build(
        self,
        task: str,
        observation: str,
        admissible: Sequence[str],
        history: Sequence[HistoryItem] = (),
        step: int = 0,
    ) -> str:
        """The student prompt.

        Args:
            task: the task description (ALFWorld: after "Your task is to: ").
            observation: the current observation.
            admissible: the admissible actions (ALFWorld's ``help`` is left out of the prompt).
            history: past ``(observation, action)`` pairs, oldest first; the full history or its
                tail. At most ``step`` entries.
            step: number of steps already taken (0 at the first step).
        """
        return self.build_detailed(task, observation, admissible, history, step)[0]

    def build_teacher(
        self,
        task: str,
        observation: str,
        admissible: Sequence[str],
        history: Sequence[HistoryItem] = (),
        step: int = 0,
        task_type: str | None = None,
        privileged: str | None = None,
    ) -> str:
        """The teacher prompt: retrieved skills, the env's ``privileged`` text (when given), then
        exactly the student prompt (``task_type``: a text env's type, for the skills folder's
        ``<task_type>.md``)."""
        student = self.build(task, observation, admissible, history, step)
        if self.skills is not None:
            block = self.skills.block(task, task_type)
        else:
            full = self._inner.build_teacher(
                task, observation, _str_list("admissible", admissible), _history(history), _step(step)
            )
            block = full[: len(full) - len(student)]
        return block + privileged_block(self.within_budget(privileged)) + student

    def within_budget(self, privileged: str | None) -> str | None:
        """The env's privileged text as a teacher prompt holds it: its first ``max_privileged_tokens``
        tokens and :data:`PRIVILEGED_CUT` when it is longer (unchanged without a budget or a
        tokenizer). Only a prefix of a huge text is tokenized (``_CHARS_PER_TOKEN`` characters a
        token), and the same text is cut once."""
        budget = self.max_privileged_tokens
        if not privileged or budget is None or self.tokenizer is None or len(privileged) <= budget // 4:
            return privileged  # a character is at most 4 bytes and a token at least 1: this text fits
        cut = self._cut_cache.get(privileged)
        if cut is not None:
            return cut
        head = privileged[: budget * _CHARS_PER_TOKEN]
        ids = self.tokenizer.encode(head)
        if len(ids) <= budget and len(head) == len(privileged):
            out = privileged
        else:
            out = self.tokenizer.decode(ids[:budget]).rstrip() + PRIVILEGED_CUT
            self.privileged_cuts += 1
            if self.privileged_cuts == 1:
                size = f"{len(ids)}+" if len(head) < len(privileged) else str(len(ids))
                print(
                    f"[pcsd] warning: an env's info['privileged'] is {size} tokens ({len(privileged):,} characters): "
                    f"teacher prompts keep its first {budget} (rollout.max_privileged_tokens); later cuts are "
                    "not reported",
                    file=sys.stderr,
                    flush=True,
                )
        if len(self._cut_cache) >= 256:
            self._cut_cache.clear()
        self._cut_cache[privileged] = out
        return out

    def build_batch(
        self,
        requests: Sequence[Mapping[str, object]],
        *,
        teacher: bool = False,
        system: str | None = None,
    ) -> list[tuple[str, list[int]]]:
        """Build and chat-encode many prompts in parallel (GIL released); needs ``tokenizer_dir``.

        Args:
            requests: mappings with keys ``task``, ``observation``, ``admissible`` and optionally
                ``history`` (default empty), ``step`` (default 0) and ``task_type`` (a text env's,
                for the skills folder's task-type files) and ``privileged`` (the env's privileged
                text: teacher prompts show it after the skills, student prompts never), as for
                :meth:`build`. Only
                the last ``history_length`` history entries are read (the prompt shows no more);
                the history's length is still checked against ``step``.
            teacher: build teacher prompts (skills prepended) instead of student prompts.
            system: optional system message for the chat template.

        Returns:
            ``[(prompt_text, token_ids), ...]`` in request order; ``token_ids`` equal
            :meth:`encode_chat` of the text.

        Raises:
            ValueError: no tokenizer, or a bad request (the message names the request and key).
        """
        return self._batch(requests, teacher, system, True)

    def encode_batch(
        self,
        requests: Sequence[Mapping[str, object]],
        *,
        teacher: bool = False,
        system: str | None = None,
    ) -> list[list[int]]:
        """The token ids of :meth:`build_batch` without the texts (what the rollout needs)."""
        return self._batch(requests, teacher, system, False)

    def _batch(self, requests, teacher: bool, system: str | None, with_text: bool) -> list:
        if self.tokenizer is None:
            raise ValueError("tokenizer_dir: build_batch needs a PromptBuilder built with tokenizer_dir")
        if system is not None and not isinstance(system, str):
            raise ValueError(f"system: expected str or None, got {type(system).__name__}")
        secrets = _privileged(requests) if teacher else None
        if teacher and (self.skills is not None or secrets is not None):
            # the student prompts, each after its task's skill block (from the user's folder, else the
            # built-in one: the native teacher prompt minus the student prompt) and the env's privileged text
            students = self._inner.build_batch(requests, False, system, True)
            if self.skills is not None:
                blocks = [self.skills.block(str(r["task"]), r.get("task_type")) for r in requests]
            else:
                teachers = self._inner.build_batch(requests, True, system, True)
                blocks = [t[: len(t) - len(s)] for (t, _), (s, _) in zip(teachers, students)]
            texts = [
                b + privileged_block(self.within_budget(p)) + text
                for b, p, (text, _) in zip(blocks, secrets or [None] * len(blocks), students)
            ]
            ids = self.encode_chat(texts, system)
            return list(zip(texts, ids)) if with_text else ids
        return self._inner.build_batch(requests, bool(teacher), system, with_text)

    def encode_chat(self, prompts: Sequence[str], system: str | None = None) -> list[list[int]]:
        """Chat-template and tokenise prompts in parallel (GIL released).

        Each prompt becomes one user turn (after a ``system`` turn when given) with the generation
        prompt appended; ids equal ``tokenizer.apply_chat_template(messages,
        add_generation_prompt=True, tokenize=True)``.

        Raises:
            ValueError: no ``tokenizer_dir`` was given, or the template fails to render.
        """
        if self.tokenizer is None:
            raise ValueError("tokenizer_dir: encode_chat needs a PromptBuilder built with tokenizer_dir")
        return self.tokenizer.encode_chat(prompts, system)


def privileged_block(text: str | None) -> str:
    """An environment's privileged text as the teacher prompt shows it ("" for none)."""
    if not text:
        return ""
    return f"{PRIVILEGED_HEADER}\n{text.strip()}\n{PRIVILEGED_FOOTER}\n\n"


def _privileged(requests: Sequence[Mapping[str, object]]) -> list[str | None] | None:
    """Each request's ``privileged`` text (checked), or None when no request has one."""
    out: list[str | None] = []
    any_text = False
    for i, r in enumerate(requests):
        p = r.get("privileged") if isinstance(r, Mapping) else None
        if p is not None and not isinstance(p, str):
            raise ValueError(f"requests[{i}]['privileged']: expected str or None, got {type(p).__name__}")
        any_text = any_text or bool(p)
        out.append(p)
    return out if any_text else None


@dataclass(frozen=True)
class ParsedAction:
    """A parsed response. ``action`` is always set (an invalid action is still sent to the env)."""

    action: str
    think: str | None
    missing_think: bool
    missing_action_tags: bool
    multiple_actions: bool
    not_admissible: bool
    #: a CJK ideograph (U+4E00..U+9FFF) in the response (the WebShop projection's third rule)
    cjk: bool = False

    @property
    def is_valid(self) -> bool:
        """Well formed and admissible."""
        return not (
            self.missing_think or self.missing_action_tags or self.multiple_actions or self.not_admissible or self.cjk
        )


def parse_action(text: str, admissible: Sequence[str] | None = None) -> ParsedAction:
    """Parse ``<think>...</think><action>...</action>``.

    Args:
        text: the model response.
        admissible: when given, ``not_admissible`` is set if the stripped action is not in it
            (exact, case-sensitive).
    """
    if not isinstance(text, str):
        raise ValueError(f"text: expected str, got {type(text).__name__}")
    adm = None if admissible is None else [_lossy(a) for a in _str_list("admissible", admissible)]
    return ParsedAction(**_mod().parse_action(_lossy(text), adm))


def _lossy(s: str) -> str:
    """``s`` with lone surrogates (not encodable as UTF-8) replaced by U+FFFD, as the engine reads
    a command: such text can never be an admissible action."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "surrogatepass").decode("utf-8", "replace")


def retrieve_skills(task: str, env: EnvName = "alfworld") -> str:
    """General plus task-type skills for ``task`` (keyword matching on the task only); the general
    skills only when no task type's keywords match (the paper's appendix)."""
    return _mod().retrieve_skills(task, _check_env(env))


def classify_alfworld_task(task: str) -> Optional[str]:
    """The ALFWorld task type (e.g. ``"pick_heat_then_place_in_recep"``) of a task description, by
    whole-word keywords (look > heat > cool > clean > two > pick-and-place: "put", "place",
    "move"); None when no task type's keywords occur."""
    return _mod().classify_alfworld_task(task)


# ----------------------------------------------------------------------------- WebShop agent text
# verl-agent's / ZJU-REAL/SDAR's WebShop wrapper (WebshopEnvironmentManager and
# env_package/webshop/projection.py), as FACTS.md ("verl-agent / SDAR wrapper") records it:
# the page text from the env is reformatted before it enters the prompt, and the response is
# projected to an env action. tests/test_webshop_wiring.py checks both on every recorded verl step.

_WEBSHOP_SEP = " [SEP] "


def webshop_task(reset_observation: str) -> str:
    """The task of a WebShop episode: the instruction, ``obs.split(' [SEP] ')[2]`` of the search
    page ``reset`` returns (``WebShop [SEP] Instruction: [SEP] {instruction} [SEP] Search``)."""
    if not isinstance(reset_observation, str):
        raise ValueError(f"reset_observation: expected str, got {type(reset_observation).__name__}")
    parts = reset_observation.split(_WEBSHOP_SEP)
    if len(parts) < 3 or parts[1] != "Instruction:":
        raise ValueError(
            "reset_observation: expected the search page of a reset ('WebShop [SEP] Instruction: [SEP] "
            f"... [SEP] Search'), got {reset_observation[:80]!r}"
        )
    return parts[2]


def format_webshop_observation(observation: str, task: str) -> str:
    """The observation as the agent sees it: the page's ``' [SEP] '`` parts after the first part
    equal to ``task``, each in single quotes, joined with ``' [SEP] '``; a page without that part
    (the done page) verbatim."""
    if not isinstance(observation, str) or not isinstance(task, str):
        raise ValueError("observation and task: expected str")
    parts = observation.split(_WEBSHOP_SEP)
    try:
        i = parts.index(task)
    except ValueError:
        return observation
    return _WEBSHOP_SEP.join(f"'{p}'" for p in parts[i + 1 :])


def webshop_actions(has_search_bar: bool, clickables: Sequence[str]) -> list[str]:
    """The admissible actions of a page: ``search[<your query>]`` when it has a search bar, then
    ``click[x]`` for every clickable (``click[search]`` included, as verl-agent lists it)."""
    out = ["search[<your query>]"] if has_search_bar else []
    out += [f"click[{c}]" for c in _str_list("clickables", clickables)]
    return out


def project_webshop_action(text: str) -> ParsedAction:
    """verl-agent's WebShop action projection of one response: the whole response lower-cased,
    the action the text between the first ``<action>`` and the first ``</action>`` (stripped), or
    the last 20 characters when a tag is missing. Valid unless a tag is missing, the response has
    no ``<think>`` or no ``</think>`` (case-sensitive), or it holds a CJK ideograph. Admissibility
    is not checked (an inadmissible action is a no-op of the page)."""
    if not isinstance(text, str):
        raise ValueError(f"text: expected str, got {type(text).__name__}")
    low = text.lower()
    s, e = low.find("<action>"), low.find("</action>")
    if s == -1 or e == -1:
        action, missing_tags = low[-20:], True
    else:
        action, missing_tags = low[s + len("<action>") : e].strip(), False
    t0, t1 = text.find("<think>"), text.find("</think>")
    think = text[t0 + len("<think>") : t1].strip() if 0 <= t0 < t1 else None
    return ParsedAction(
        action=_lossy(action),
        think=think,
        missing_think=t0 == -1 or t1 == -1,
        missing_action_tags=missing_tags,
        multiple_actions=False,
        not_admissible=False,
        cjk=any("\u4e00" <= ch <= "\u9fff" for ch in text),
    )
