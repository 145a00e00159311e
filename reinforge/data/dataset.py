"""Tokenized prompt datasets with resumable, seeded iteration."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from .files import DataError
from .sources import PromptRecord, is_reasoning_gym, load_source

if TYPE_CHECKING:
    from ..config import DataConfig, RewardConfig

log = logging.getLogger(__name__)


@dataclass
class Prompt:
    """A prompt ready for the engine."""

    prompt: str | list[dict[str, Any]]  # as in the source
    text: str  # rendered (chat template applied)
    prompt_ids: list[int]
    label: Any = None
    metadata: dict[str, Any] = field(default_factory=dict)
    index: int = 0  # position in the dataset


def render_prompt(
    tokenizer: Any,
    prompt: str | list[dict],
    apply_chat_template: bool,
    system_prompt: str | None,
    tools: list[dict[str, Any]] | None = None,
    tools_text: str | None = None,
) -> str:
    """The text the model sees: the chat template with a generation prompt, or the raw string.

    Args:
        system_prompt: a system message for prompts that have none.
        tools: function schemas passed to the chat template as ``tools=`` (agent rollouts).
        tools_text: text describing the tools, appended to the system message (added when the
            prompt has none), for templates that do not render ``tools=``.
    """
    if not apply_chat_template:
        if not isinstance(prompt, str):
            raise ValueError("data.apply_chat_template=false needs string prompts, got chat messages")
        if tools or tools_text:
            raise ValueError("agent tools in the prompt need data.apply_chat_template=true")
        return prompt
    messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else [dict(m) for m in prompt]
    if system_prompt and messages[0]["role"] != "system":
        messages = [{"role": "system", "content": system_prompt}] + messages
    if tools_text:
        if messages[0]["role"] == "system":
            messages[0]["content"] = f"{messages[0]['content']}\n\n{tools_text}"
        else:
            messages = [{"role": "system", "content": tools_text}] + messages
    extra = {"tools": tools} if tools else {}
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **extra)


class PromptDataset:
    """Prompts tokenized up front; prompts longer than ``max_prompt_len`` tokens are dropped.

    Iteration is an endless sequence of epochs; each epoch is a permutation drawn from
    ``seed + epoch`` (or the file order with ``shuffle=False``). ``state_dict()`` is the
    position (epoch, offset), so a resumed run gets exactly the prompts it would have got.
    """

    def __init__(
        self,
        records: list[PromptRecord],
        tokenizer: Any,
        *,
        apply_chat_template: bool = True,
        system_prompt: str | None = None,
        max_prompt_len: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        name: str = "prompts",
        tools: list[dict[str, Any]] | None = None,
        tools_text: str | None = None,
    ):
        texts = [
            render_prompt(tokenizer, r.prompt, apply_chat_template, system_prompt, tools, tools_text) for r in records
        ]
        ids = tokenizer(texts, add_special_tokens=not apply_chat_template)["input_ids"]
        self.prompts: list[Prompt] = []
        self.num_dropped = 0
        for i, (r, t, p) in enumerate(zip(records, texts, ids)):
            if max_prompt_len is not None and len(p) > max_prompt_len:
                self.num_dropped += 1
                continue
            self.prompts.append(Prompt(r.prompt, t, list(p), r.label, r.metadata, i))
        if self.num_dropped:
            log.warning(
                "%s: dropped %d of %d prompts longer than %s tokens (data.rollout_max_prompt_len)",
                name,
                self.num_dropped,
                len(records),
                max_prompt_len,
            )
        if not self.prompts:
            raise ValueError(
                f"{name}: no prompt is at most {max_prompt_len} tokens long (raise data.rollout_max_prompt_len)"
            )
        self.shuffle, self.seed = shuffle, seed
        self.epoch, self.offset = 0, 0
        self._order = self._permutation(0)

    def __len__(self) -> int:
        return len(self.prompts)

    @property
    def max_prompt_tokens(self) -> int:
        return max(len(p.prompt_ids) for p in self.prompts)

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(len(self.prompts))
        return np.random.default_rng(self.seed + epoch).permutation(len(self.prompts))

    def next_batch(self, n: int) -> list[Prompt]:
        """The next ``n`` prompts, continuing into the next epoch when this one runs out."""
        out = []
        while len(out) < n:
            if self.offset >= len(self._order):
                self.epoch += 1
                self.offset = 0
                self._order = self._permutation(self.epoch)
            take = min(n - len(out), len(self._order) - self.offset)
            out.extend(self.prompts[i] for i in self._order[self.offset : self.offset + take])
            self.offset += take
        return out

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "offset": self.offset, "size": len(self.prompts)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        if state.get("size", len(self.prompts)) != len(self.prompts):
            raise ValueError(
                f"checkpoint's dataset had {state['size']} prompts, this one has {len(self.prompts)}: "
                f"resume with the same data settings"
            )
        self.epoch, self.offset = int(state["epoch"]), int(state["offset"])
        self._order = self._permutation(self.epoch)


def load_datasets(
    d: DataConfig,
    tokenizer: Any,
    tools: list[dict[str, Any]] | None = None,
    tools_text: str | None = None,
    reward: RewardConfig | None = None,
) -> tuple[PromptDataset, PromptDataset | None]:
    """The training prompts and the held-out prompts (None when there are none) of the ``data``
    section. Held-out prompts come from ``data.eval_prompt_data`` when set; otherwise a
    reasoning-gym task's held-out split is drawn with ``eval_seed``, and a file gives
    ``n_eval_prompts`` of its rows (drawn with ``eval_seed``, logged, left out of training) when it
    has at least twice as many; a smaller file gets no evaluation, with a warning saying why.
    ``tools`` / ``tools_text`` present the agent's tools in every prompt (:func:`render_prompt`).
    With ``reward`` (the ``reward`` section), prompts the reward cannot score are refused.

    Raises:
        DataError: unreadable data (:func:`~reinforge.data.sources.load_source`), or prompts that
            ``reward.type`` cannot score (reasoning-gym scorer without reasoning-gym prompts, a
            label-comparing reward without labels).
        ValueError: no prompt fits ``data.rollout_max_prompt_len``.
    """
    common = dict(
        apply_chat_template=d.apply_chat_template,
        system_prompt=d.system_prompt,
        max_prompt_len=d.rollout_max_prompt_len,
        tools=tools,
        tools_text=tools_text,
    )
    records = load_source(
        d.prompt_data,
        input_key=d.input_key,
        label_key=d.label_key,
        metadata_key=d.metadata_key,
        size=d.num_prompts,
        seed=d.seed,
        task_kwargs=d.task_kwargs,
    )
    eval_records, eval_source = None, d.eval_prompt_data
    if d.n_eval_prompts > 0 and eval_source is None and not is_reasoning_gym(d.prompt_data):
        records, eval_records = hold_out(records, d.n_eval_prompts, d.eval_seed, d.prompt_data)
        eval_source = f"{d.prompt_data} (held out)" if eval_records else None
    check_reward_fits(reward, records, d.prompt_data, d.label_key)
    train = PromptDataset(records, tokenizer, shuffle=d.rollout_shuffle, seed=d.seed, name=d.prompt_data, **common)
    if eval_records is None and d.n_eval_prompts > 0:
        eval_source = eval_source or (d.prompt_data if is_reasoning_gym(d.prompt_data) else None)
        if eval_source:
            kwargs = d.task_kwargs if is_reasoning_gym(eval_source) else None
            eval_records = load_source(
                eval_source,
                input_key=d.input_key,
                label_key=d.label_key,
                metadata_key=d.metadata_key,
                size=d.n_eval_prompts,
                seed=d.eval_seed,
                task_kwargs=kwargs,
            )[: d.n_eval_prompts]
    evalset = None
    if eval_records:
        check_reward_fits(reward, eval_records, eval_source, d.label_key)
        evalset = PromptDataset(eval_records, tokenizer, shuffle=False, name=eval_source, **common)
    return train, evalset


def hold_out(
    records: list[PromptRecord], n: int, seed: int, source: str
) -> tuple[list[PromptRecord], list[PromptRecord] | None]:
    """``(training rows, n held-out rows)`` of a prompt file: ``n`` rows drawn with ``seed``, in file
    order, when the file has at least ``2 n`` rows; else ``(records, None)`` with a warning."""
    if len(records) < 2 * n:
        log.warning(
            "no evaluation: %s has %d prompts, too few to hold out data.n_eval_prompts=%d of them (at most "
            "half are); set data.eval_prompt_data to a file of held-out prompts, or data.n_eval_prompts to "
            "at most %d (0: no evaluation, no warning)",
            source,
            len(records),
            n,
            len(records) // 2,
        )
        return records, None
    held = set(np.random.default_rng(seed).choice(len(records), n, replace=False).tolist())
    log.info(
        "%s: %d of its %d prompts held out for evaluation (drawn with data.eval_seed=%d; left out of training). "
        "data.eval_prompt_data=FILE evaluates on another file instead, data.n_eval_prompts=0 keeps them all "
        "for training",
        source,
        n,
        len(records),
        seed,
    )
    return ([r for i, r in enumerate(records) if i not in held], [r for i, r in enumerate(records) if i in held])


def check_reward_fits(
    reward: RewardConfig | None, records: list[PromptRecord], source: str | None, label_key: str | None
) -> None:
    """Refuse prompts that ``reward.type`` cannot score (every sample would score 0).

    Raises:
        DataError: ``reasoning_gym`` with prompts that do not come from a reasoning-gym task, or
            ``math`` / ``exact_match`` / ``auto`` (on non-reasoning-gym prompts) with no label at all.
    """
    if reward is None or reward.function_path:
        return
    kind = reward.properties  # reinforge.reward.registry:REWARDS
    gym = sum(bool(r.metadata.get("reasoning_gym")) for r in records)
    if kind.get("reasoning_gym_only") and gym < len(records):
        raise DataError(
            f"reward.type=reasoning_gym scores with a reasoning-gym task's own scorer, but "
            f"{len(records) - gym} of the {len(records)} prompts of {source} do not come from a "
            f"reasoning-gym task (no metadata.reasoning_gym): every sample would score 0. Use "
            f"reward.type=auto (math-verify against each prompt's label), math or exact_match, or a "
            f"custom reward (reward.function_path)"
        )
    label = kind.get("label")
    needs_label = [r for r in records if not (label == "unless_reasoning_gym" and r.metadata.get("reasoning_gym"))]
    if label and needs_label and all(r.label is None for r in needs_label):
        how = kind.get("how", "comparison")
        raise DataError(
            f"reward.type={reward.type} scores by comparing each response with the prompt's label "
            f"({how}), but no prompt of {source} has one (data.label_key={label_key}): every sample "
            f"would score 0. Set data.label_key to the reference answer's key, or use a custom reward "
            f"(reward.function_path) or a reward model (reward.type=model)"
        )
