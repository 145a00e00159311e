"""Prompt data: sources (data files in slime's and verl's layouts, reasoning-gym) and tokenized, resumable datasets."""

from .dataset import Prompt, PromptDataset, load_datasets, render_prompt
from .sources import (
    DataError,
    PromptRecord,
    is_reasoning_gym,
    load_jsonl,
    load_prompt_file,
    load_reasoning_gym,
    load_source,
)

__all__ = [
    "DataError",
    "Prompt",
    "PromptDataset",
    "PromptRecord",
    "is_reasoning_gym",
    "load_datasets",
    "load_jsonl",
    "load_prompt_file",
    "load_reasoning_gym",
    "load_source",
    "render_prompt",
]
