"""What differs between the prompt families besides the template: the task a prompt states, the
observation and actions it shows, and how a response becomes an action (one object per family,
so that the rollout loop has no branch on the environment).

* ``alfworld``: the task and the page as the env gives them; ``<action>…</action>`` parsed with
  the admissible list (an action outside it is invalid).
* ``webshop``: verl-agent's agent text (:func:`pcsd.text.prompts.webshop_task`,
  :func:`~pcsd.text.prompts.format_webshop_observation`, :func:`~pcsd.text.prompts.webshop_actions`)
  and its projection of the response (:func:`~pcsd.text.prompts.project_webshop_action`).
* ``text``: as ALFWorld, except that an env listing no admissible actions takes any action
  (the action is still read from ``<action>…</action>``, the format still checked).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pcsd.text.prompts import (
    ENV_NAMES,
    ParsedAction,
    format_webshop_observation,
    parse_action,
    project_webshop_action,
    webshop_actions,
    webshop_task,
)

__all__ = ["TextFormat", "text_format"]


class TextFormat:
    """One prompt family's view of an environment (the ALFWorld behaviour; the others override)."""

    name = "alfworld"

    def task(self, task: str, first_observation: str) -> str:
        """The task the prompts state, from the env's task and its first observation."""
        return task

    def view(
        self, page: str, admissible: Sequence[str], task: str, has_search_bar: Any = False
    ) -> tuple[str, list[str]]:
        """The observation and the admissible actions a prompt shows for an env's page."""
        return page, list(admissible)

    def parse(self, text: str, admissible: Sequence[str]) -> ParsedAction:
        """The action a response sends to the env, with its validity flags."""
        return parse_action(text, admissible)

    def action_list(self, admissible: Sequence[str]) -> str:
        """The admissible actions written as the prompts list them (tokenizer text)."""
        return "[" + "\n ".join(f"'{c}'" for c in admissible) + "]"

    def skill_key(self, task: str, task_type: str) -> str:
        """What the built-in skills are retrieved by: one block per key (ALFWorld: the task type)."""
        return task_type

    def __repr__(self) -> str:
        return f"text_format({self.name!r})"


class _WebShop(TextFormat):
    name = "webshop"

    def task(self, task: str, first_observation: str) -> str:
        return webshop_task(first_observation)

    def view(
        self, page: str, admissible: Sequence[str], task: str, has_search_bar: Any = False
    ) -> tuple[str, list[str]]:
        return format_webshop_observation(page, task), webshop_actions(bool(has_search_bar), admissible)

    def parse(self, text: str, admissible: Sequence[str]) -> ParsedAction:
        return project_webshop_action(text)

    def action_list(self, admissible: Sequence[str]) -> str:
        return "[\n" + "\n".join(f"'{c}'," for c in admissible) + "\n]"

    def skill_key(self, task: str, task_type: str) -> str:
        return task  # WebShop's skills: per product category, from the task text


class _Text(TextFormat):
    name = "text"

    def parse(self, text: str, admissible: Sequence[str]) -> ParsedAction:
        return parse_action(text, admissible if admissible else None)

    def skill_key(self, task: str, task_type: str) -> str:
        return task


_FORMATS: dict[str, TextFormat] = {f.name: f for f in (TextFormat(), _WebShop(), _Text())}
assert set(_FORMATS) == set(ENV_NAMES)


def text_format(env: str) -> TextFormat:
    """The :class:`TextFormat` of a prompt family (``alfworld``, ``webshop`` or ``text``)."""
    try:
        return _FORMATS[env]
    except KeyError:
        raise ValueError(f"env: expected one of {', '.join(ENV_NAMES)}, got {env!r}") from None
