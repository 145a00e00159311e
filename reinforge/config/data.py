"""The ``data`` section: the prompt datasets, their chat template and how prompts are read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .fields import Section, opt


@dataclass
class DataConfig(Section):
    name = "data"
    prompt_data: str = opt(
        "reasoning_gym:basic_arithmetic",
        "`reasoning_gym:<task>`, or a `.jsonl` / `.json` / `.parquet` file or saved `datasets` "
        "folder of prompts, slime's or verl's layout ([data.md](data.md)) (slime's `--prompt-data`)",
    )
    task_kwargs: dict[str, Any] = opt(
        {},
        "keyword arguments of `reasoning_gym.create_dataset` "
        "(e.g. `{min_terms: 2, max_digits: 2}`); ignored, with a warning, for a file",
    )
    num_prompts: int = opt(10000, "number of problems generated for a reasoning-gym training source", ge=1)
    eval_prompt_data: str | None = opt(
        None,
        "held-out prompts (a task or a file, as `prompt_data`); `null`: the "
        "training task with `eval_seed` (reasoning-gym), or `n_eval_prompts` rows of "
        "the `prompt_data` file drawn with `eval_seed` and left out of training (when "
        "it has at least twice as many; else no eval, with a warning)",
    )
    n_eval_prompts: int = opt(64, "held-out prompts evaluated (0 disables evaluation)", ge=0)
    eval_seed: int = opt(1_000_003, "seed of the held-out reasoning-gym problems (differs from `seed`)")
    input_key: str = opt(
        "prompt",
        "key of the prompt (a string or a list of chat messages); keys may be dotted paths into nested objects",
    )
    label_key: str | None = opt(
        "label",
        "key of the reference answer (`reward_model.ground_truth` is found in verl "
        "rows without `label`); a key that no row holds is refused; `null`: no labels",
    )
    metadata_key: str = opt("metadata", "key of per-prompt metadata (passed to reward functions)")
    apply_chat_template: bool = opt(True, "render prompts with the tokenizer's chat template and a generation prompt")
    system_prompt: str | None = opt(None, "system message added to prompts that have none")
    rollout_max_prompt_len: int = opt(
        512, "prompts longer than this many tokens are dropped (counted in the log)", ge=1
    )
    rollout_shuffle: bool = opt(True, "shuffle prompts each epoch (seeded: `seed + epoch`)")
    seed: int = opt(42, "shuffling and reasoning-gym generation seed")
