"""Map cached TransferQueue trajectories onto the prompts of a new batch.

A cached ``rollout_tq`` step holds trajectory keys ``{uid}_{session}_{index}``
with one tag dict per key.  Replaying it in a later run means giving every
*new* prompt uid ``n`` trajectories taken from one cached prompt group (so GRPO
groups stay intact), under fresh keys ``{new_uid}_{session}_0`` and tags whose
step fields point at the current step.  Everything here is pure Python.
"""

from __future__ import annotations

import copy
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from zarr_skip.errors import GroupMismatchError, KeyFormatError, RemapError, SampleIdError

logger = logging.getLogger(__name__)

__all__ = [
    "GroupMismatch",
    "GroupMismatchError",
    "KeyFormatError",
    "Remap",
    "RemapError",
    "SampleIdError",
    "group_by_uid",
    "parse_key",
    "parse_sample_step",
    "remap",
]

_SAMPLE_ID = re.compile(r"(?:uid_)?sample_([0-9]+)_([0-9]+)")
# Greedy uid: the last two ``_``-separated fields are session and index.
_KEY = re.compile(r"(.+)_([0-9]+)_([0-9]+)", re.DOTALL)
_STEP_TAGS = ("global_steps", "min_global_steps", "max_global_steps")
POLICIES: tuple[str, ...] = ("cycle", "error")


@dataclass(frozen=True, slots=True)
class GroupMismatch:
    """Number of cached prompt groups versus prompts of the current batch.

    Attributes
    ----------
    cached_groups : int
        Prompt groups found in the cached step.
    prompts : int
        Prompts in the current batch.
    step : int
        Current step.
    source_step : int
        Step the cached data was written for (differs from ``step`` under ``repeat``).
    """

    cached_groups: int
    prompts: int
    step: int
    source_step: int

    def describe(self) -> str:
        """Return a one-line, human readable description."""
        source = "" if self.source_step == self.step else f" (cached step {self.source_step})"
        if self.cached_groups < self.prompts:
            how = "groups are reused cyclically"
        else:
            how = f"only the first {self.prompts} groups are used"
        return (
            f"step {self.step}{source}: the cache holds {self.cached_groups} prompt groups "
            f"but the batch has {self.prompts} prompts; {how}"
        )


@dataclass(frozen=True, slots=True)
class Remap:
    """Result of :func:`remap`.

    Attributes
    ----------
    indices : tuple of int
        Rows of the cached batch to select, one per new trajectory key.
    keys : tuple of str
        New trajectory keys ``{new_uid}_{session}_0``.
    tags : tuple of dict
        New trajectory tags (deep copies with the step fields set, ``is_prompt`` dropped).
    prompt_keys : tuple of str
        The new prompt uids.
    prompt_tags : tuple of dict
        ``{"is_prompt": True, "status": "finished", "global_steps": step}`` per prompt.
    groups : tuple of int
        For each new prompt, the index of the cached group it was given.
    mismatch : GroupMismatch or None
        Set when the cached group count differs from the prompt count.
    short_groups : int
        Cached groups used that hold fewer than ``n`` trajectories (cycled within).
    """

    indices: tuple[int, ...]
    keys: tuple[str, ...]
    tags: tuple[dict[str, Any], ...]
    prompt_keys: tuple[str, ...]
    prompt_tags: tuple[dict[str, Any], ...]
    groups: tuple[int, ...]
    mismatch: GroupMismatch | None
    short_groups: int = 0


def parse_sample_step(uid: str) -> int:
    """Return the feed index of an async-rollout sample uid.

    Parameters
    ----------
    uid : str
        ``sample_{epoch}_{index}`` or ``uid_sample_{epoch}_{index}``, both
        non-negative decimal integers.

    Returns
    -------
    int
        ``index``: the rollouter's feed order, used as the async_rollout step.

    Raises
    ------
    SampleIdError
        If ``uid`` has any other form.
    """
    match = _SAMPLE_ID.fullmatch(uid) if isinstance(uid, str) else None
    if match is None:
        raise SampleIdError(
            f"invalid async rollout sample uid {uid!r}: expected 'sample_<epoch>_<index>' "
            "or 'uid_sample_<epoch>_<index>'"
        )
    return int(match.group(2))


def parse_key(key: str) -> tuple[str, int, int]:
    """Split a trajectory key ``{uid}_{session}_{index}`` from the right.

    Parameters
    ----------
    key : str
        Trajectory key; the uid may itself contain ``_``.

    Returns
    -------
    tuple of (str, int, int)
        ``(uid, session, index)``.

    Raises
    ------
    KeyFormatError
        If the key does not end in two ``_``-separated integers after a non-empty uid.
    """
    match = _KEY.fullmatch(key) if isinstance(key, str) else None
    if match is None:
        raise KeyFormatError(f"invalid trajectory key {key!r}: expected '<uid>_<session>_<index>'")
    return match.group(1), int(match.group(2)), int(match.group(3))


def group_by_uid(keys: Iterable[str]) -> list[list[int]]:
    """Group trajectory positions by their prompt uid.

    Parameters
    ----------
    keys : iterable of str
        Trajectory keys ``{uid}_{session}_{index}`` in any order.

    Returns
    -------
    list of list of int
        Positions into ``keys``, one list per uid, uids in first-seen order and
        positions ascending within a group.

    Raises
    ------
    KeyFormatError
        If a key is malformed.
    """
    groups: dict[str, list[int]] = {}
    for position, key in enumerate(keys):
        uid, _, _ = parse_key(key)
        groups.setdefault(uid, []).append(position)
    return list(groups.values())


def _tag_copy(tag: Any, position: int) -> dict[str, Any]:
    if tag is None:
        return {}
    if not isinstance(tag, Mapping):
        raise RemapError(f"cached tag at row {position} is {type(tag).__name__}, expected a mapping")
    return copy.deepcopy(dict(tag))


def remap(
    old_keys: Sequence[str],
    old_tags: Sequence[Mapping[str, Any] | None],
    new_prompt_uids: Sequence[str],
    n: int,
    step: int,
    policy: str = "cycle",
    *,
    source_step: int | None = None,
) -> Remap:
    """Assign cached trajectory groups to new prompt uids.

    New prompt ``i`` gets cached group ``i mod groups``; its sessions
    ``0 .. n-1`` take the group's trajectories in order, cycling when the group
    holds fewer than ``n``.

    Parameters
    ----------
    old_keys : sequence of str
        Cached trajectory keys ``{uid}_{session}_{index}``.
    old_tags : sequence of mapping
        Cached tags, one per key (never modified).
    new_prompt_uids : sequence of str
        Prompt uids of the current batch (must be unique).
    n : int
        Trajectories per prompt (``actor_rollout_ref.rollout.n``), at least 1.
    step : int
        Current step, written to ``global_steps``, ``min_global_steps`` and
        ``max_global_steps`` of every new tag.
    policy : {"cycle", "error"}
        What to do when the cached group count differs from the prompt count:
        ``"cycle"`` logs a warning and proceeds (verl's behaviour), ``"error"``
        raises :class:`GroupMismatchError`.
    source_step : int, optional
        Step the cache was written for, used in messages (default ``step``).

    Returns
    -------
    Remap
        Row indices, new keys and tags, prompt keys and tags.

    Raises
    ------
    RemapError
        If the cache holds no groups, lengths disagree, uids repeat or ``n`` is invalid.
    GroupMismatchError
        With ``policy="error"`` when the group count differs from the prompt count.
    KeyFormatError
        If a cached key is malformed.
    """
    source = step if source_step is None else source_step
    prompt_keys = _checked_prompts(old_keys, old_tags, new_prompt_uids, n, step, source, policy)
    groups = group_by_uid(old_keys)
    if not groups:
        raise RemapError(
            f"cached step {source} holds no trajectory groups ({len(old_keys)} keys); cannot replay step {step}"
        )
    mismatch = _group_mismatch(len(groups), len(prompt_keys), step, source, policy)
    indices, keys, tags, chosen, short = _assign(groups, prompt_keys, old_tags, n, step)
    if short:
        logger.info(
            "step %d: %d cached prompt group(s) hold fewer than n=%d trajectories; their trajectories are repeated",
            step,
            len(short),
            n,
        )
    prompt_tags = tuple({"is_prompt": True, "status": "finished", "global_steps": step} for _ in prompt_keys)
    return Remap(
        indices=tuple(indices),
        keys=tuple(keys),
        tags=tuple(tags),
        prompt_keys=prompt_keys,
        prompt_tags=prompt_tags,
        groups=tuple(chosen),
        mismatch=mismatch,
        short_groups=len(short),
    )


def _checked_prompts(
    old_keys: Sequence[str],
    old_tags: Sequence[Mapping[str, Any] | None],
    new_prompt_uids: Sequence[str],
    n: int,
    step: int,
    source: int,
    policy: str,
) -> tuple[str, ...]:
    """The new prompt uids as keys, once the arguments of :func:`remap` are checked."""
    if policy not in POLICIES:
        raise ValueError(f"policy: expected 'cycle' or 'error', got {policy!r}")
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise RemapError(f"n (trajectories per prompt) must be a positive integer, got {n!r}")
    if len(old_keys) != len(old_tags):
        raise RemapError(
            f"cached step {source}: {len(old_keys)} keys but {len(old_tags)} tags; the cache entry is inconsistent"
        )
    prompt_keys = tuple(str(uid) for uid in new_prompt_uids)
    seen: set[str] = set()
    for uid in prompt_keys:
        if uid in seen:
            raise RemapError(f"step {step}: new prompt uid {uid!r} occurs more than once")
        seen.add(uid)
    return prompt_keys


def _group_mismatch(groups: int, prompts: int, step: int, source: int, policy: str) -> GroupMismatch | None:
    """None when the cache holds one group per prompt; else the mismatch (logged), or
    :class:`GroupMismatchError` under ``policy="error"``."""
    if groups == prompts:
        return None
    mismatch = GroupMismatch(cached_groups=groups, prompts=prompts, step=step, source_step=source)
    if policy == "error":
        raise GroupMismatchError(
            f"step {step}: the cache{'' if source == step else f' (step {source})'} holds "
            f"{groups} prompt groups but the batch has {prompts} prompts "
            "(skip.rollout_tq.on_group_mismatch=error)"
        )
    logger.warning("group count mismatch at %s", mismatch.describe())
    return mismatch


def _assign(
    groups: Sequence[Sequence[int]],
    prompt_keys: Sequence[str],
    old_tags: Sequence[Mapping[str, Any] | None],
    n: int,
    step: int,
) -> tuple[list[int], list[str], list[dict[str, Any]], list[int], set[int]]:
    """Prompt ``i`` takes group ``i mod groups``, its ``n`` sessions the group's rows in turn:
    (rows, new keys, new tags, the group of each prompt, the groups holding fewer than ``n``)."""
    indices: list[int] = []
    keys: list[str] = []
    tags: list[dict[str, Any]] = []
    chosen: list[int] = []
    short: set[int] = set()
    for prompt_idx, uid in enumerate(prompt_keys):
        group_idx = prompt_idx % len(groups)
        group = groups[group_idx]
        chosen.append(group_idx)
        if len(group) < n:
            short.add(group_idx)
        for session in range(n):
            row = group[session % len(group)]
            indices.append(row)
            keys.append(f"{uid}_{session}_0")
            tag = _tag_copy(old_tags[row], row)
            tag.pop("is_prompt", None)
            for name in _STEP_TAGS:
                tag[name] = step
            tags.append(tag)
    return indices, keys, tags, chosen, short
