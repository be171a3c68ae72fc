"""The teacher's context taken from the group's own successes (``algo.teacher_context=group-success``).

A GRPO group plays one task G times. Once the group has played, each turn's teacher prompt gets,
beside the skills (if any) and the env's privileged text (if any), a successful episode of the same
group: its steps as the student's prompts showed them (observation, then the action taken), at most
``budget`` tokens, never the student's own episode. The peer is chosen deterministically, as the
public SDPO code's ``_get_solution`` with ``dont_reprompt_on_self_success``: the first won episode
of the group (lowest index) other than the student's. A turn whose group has no other success keeps
the other sources; where there are none, the turn has no teacher context
(``RolloutBatch.teacher_context`` False) and no distillation term reads it.
"""

from __future__ import annotations

from typing import Callable, Mapping, Optional, Sequence

__all__ = ["SUCCESS_HEADER", "pick_peers", "success_text", "with_success"]

#: the first line of a peer's success in the teacher's privileged text
SUCCESS_HEADER = "A successful attempt at this same task (another episode of your group):"


def pick_peers(won: Sequence[bool], group_size: int) -> list[Optional[int]]:
    """For each episode ``e`` (episodes ``i*G .. i*G+G-1`` form group ``i``), the first won episode
    of its group other than ``e``; None where there is none."""
    if group_size < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    out: list[Optional[int]] = []
    for e in range(len(won)):
        lo = (e // group_size) * group_size
        peers = [j for j in range(lo, min(lo + group_size, len(won))) if j != e and won[j]]
        out.append(peers[0] if peers else None)
    return out


def success_text(steps: Sequence[tuple[str, str]], count_tokens: Callable[[str], int], budget: int) -> str:
    """A won episode's ``steps`` (``(observation, action)`` in order) as the teacher reads them: whole
    steps from the first while their tokens (``count_tokens`` of each step's text) fit ``budget``,
    then a line saying how many later steps are left out."""
    if budget < 1:
        raise ValueError(f"budget must be >= 1 token, got {budget}")
    lines = [SUCCESS_HEADER]
    used = count_tokens(SUCCESS_HEADER)
    shown = 0
    for k, (obs, action) in enumerate(steps):
        block = f"Step {k + 1} observation: {obs.strip()}\nStep {k + 1} action: {action.strip()}"
        n = count_tokens(block)
        if used + n > budget:
            break
        lines.append(block)
        used += n
        shown += 1
    if shown < len(steps):
        lines.append(f"({len(steps) - shown} later steps of the {len(steps)}-step episode are not shown.)")
    return "\n".join(lines)


def with_success(request: Mapping[str, object], text: Optional[str]) -> dict:
    """``request`` (a teacher prompt request) with ``text`` after its env's privileged text, if any."""
    out = dict(request)
    if text:
        prior = out.get("privileged")
        out["privileged"] = f"{prior}\n\n{text}" if prior else text
    return out
