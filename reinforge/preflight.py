"""Checks before any engine or trainer is built: lengths, token budgets, engine slots, KV-cache memory.

Each check compares numbers the configuration fixes with what the model or the machine holds and, where the run
would fail later (an ``IndexError`` in the RoPE table, a device-side assert, the allocator's raw error, a first
rollout that never ends), refuses now in words (:class:`PreflightError`) naming the keys to change, their values and
the limit:

* **context window** (:func:`reinforge.models.context.context_window`: ``max_position_embeddings``, RoPE scaling
  such as YaRN counted): the longest prompt + ``rollout.rollout_max_response_len`` (training), + the evaluation
  response (``eval.eval_max_response_len``, else the rollout's), + ``--max-new-tokens`` (``reinforge generate``);
  the longest example (``reinforge offline``);
* **parallel layout** (the rules: :mod:`reinforge.parallel_layout`): ``train.pipeline_model_parallel_size`` x
  ``train.tensor_model_parallel_size`` x ``train.context_parallel_size`` must divide the trainer ranks, the model
  must be reinforge's own and its heads, MLP columns and decoder layers divisible by them;
  ``train.expert_model_parallel_size`` must divide the data-parallel ranks and the model's ``num_experts`` (a
  mixture-of-experts model) (:func:`parallel_problems`);
* **token budgets**: ``train.max_tokens_per_gpu`` must hold one whole training sequence (a micro-batch never splits
  a sequence; verl refuses the same in its dynamic batching). ``engine.max_prefill_tokens`` and
  ``train.log_prob_chunk_size`` need not: a longer prompt is prefilled in chunks, log-probs are computed in chunks;
* **engine slots** (embedded engine): a prompt's samples are decoded together, so ``rollout.n_samples_per_prompt``
  and ``eval.n_samples_per_eval_prompt`` must not exceed its slots; ``engine.num_kv_blocks`` must hold one sequence;
* **training memory** (a GPU the planner knows, :mod:`reinforge.plan`): the training step's peak (weights,
  gradients, AdamW, a micro-batch's activations and logits, the engine beside it) against the GPU's memory, naming
  the ``train.max_tokens_per_gpu`` and ``model.recompute_num_layers`` that fit
  (:func:`reinforge.plan.training_problems`);
* **the python tool's sandbox** (``python`` in ``agent.tools`` or the ``swe`` environment): a trial sandbox runs
  (:func:`reinforge.sandbox.sandbox_problems`);
* **KV-cache memory** (embedded engine, which allocates its whole cache when it is built, shape ``[layers, blocks +
  1, kv_heads, block_size, head_dim]`` twice, for keys and values): on a CPU, its slots (``engine.max_num_seqs``
  capped at the sequences the run holds at once, :func:`reinforge.plan.sequences.run_max_seqs`; ``--n`` for
  ``reinforge generate``) x ``max_model_len`` tokens x (2 x layers x kv_heads x head_dim x dtype bytes), plus the
  engine's weights, against the available memory (/proc/meminfo MemAvailable); on a GPU, one sequence's cache
  against ``engine.kv_cache_memory_fraction`` of the free memory (``torch.cuda.mem_get_info``; the engine then takes
  as many slots as that share holds). The Ray placements' memory is estimated by :mod:`reinforge.cluster.resources`.
* **device and output directory**: ``train.device`` must name a device this machine has (``tpu``, ``cuda`` without a
  visible GPU, ``cuda:7`` on a one-GPU machine are refused, naming the devices there:
  :func:`reinforge.utils.device.device_problems`); ``run.output_dir`` (or the folder it would be created in) must be
  writable (:func:`reinforge.run_dir.output_dir_problems`).

Where the prompts are not loaded yet (the CLI's check, :func:`check_rl`), the longest prompt counts as one token:
only what fails for every prompt is refused, in a second. The checks that depend on the prompts run again once the
datasets are loaded (:func:`check_lengths`, from :class:`reinforge.loop.RLLoop`), before the trainer and the engine
are built. The ``auto`` keys are resolved once: ``reinforge train`` hands the plan it checked to the run.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .config.fields import ConfigError, unplanned
from .models.context import ContextWindow, context_window
from .plan.kv import kv_cache_words, pool_fit
from .plan.kv_plan import KVCachePlan
from .reward.judge_engine import judge_problems

if TYPE_CHECKING:
    from .config import Config
    from .plan.hardware import GPU
    from .plan.planner import Plan

GIB = 1 << 30
MIB = 1 << 20


class PreflightError(ConfigError):
    """The configuration cannot run on this model or machine; the message names the keys, their
    values and the limit. A usage error: ``reinforge`` exits with status 2 (no traceback) and the
    supervisor does not relaunch."""


@dataclass
class Lengths:
    """Tokens a run puts in one sequence.

    Attributes:
        prompt: the longest prompt, in tokens (1 when the prompts are not loaded yet).
        prompt_known: whether ``prompt`` was measured on the datasets (else a lower bound).
        train_response: ``rollout.rollout_max_response_len`` when the run trains, else None.
        eval_response: the evaluation's response limit when the run evaluates, else None.
        engine_response: the longest response the engine is sized for (the loop's
            ``max_model_len`` is ``prompt + engine_response``).
    """

    prompt: int
    prompt_known: bool
    train_response: int | None
    eval_response: int | None
    engine_response: int

    @property
    def max_model_len(self) -> int:
        return self.prompt + self.engine_response


def rl_lengths(cfg: Config, max_prompt_tokens: int | None = None) -> Lengths:
    """The lengths of an RL run (``reinforge train`` / ``reinforge eval``); ``max_prompt_tokens``
    None: prompts not loaded yet (a lower bound of 1 token)."""
    r, e = cfg.rollout, cfg.eval
    eval_response = e.eval_max_response_len or r.rollout_max_response_len
    return Lengths(
        prompt=max(1, max_prompt_tokens or 1),
        prompt_known=max_prompt_tokens is not None,
        train_response=r.rollout_max_response_len if cfg.train.num_rollout > 0 else None,
        eval_response=eval_response if cfg.data.n_eval_prompts > 0 else None,
        engine_response=max(r.rollout_max_response_len, e.eval_max_response_len or 0),
    )


def prompt_tokens_of(cfg: Config, max_model_len: int) -> int:
    """The longest prompt behind an engine length the loop computed (``RLLoop._max_model_len``:
    longest prompt + the longer of the training and evaluation response limits)."""
    return max(1, max_model_len - max(cfg.rollout.rollout_max_response_len, cfg.eval.eval_max_response_len or 0))


def read_model_config(folder: Path) -> dict[str, Any]:
    """``config.json`` of a Hugging Face folder.

    Raises:
        FileNotFoundError: ``folder`` has no config.json.
    """
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise FileNotFoundError(f"{folder}: no config.json (model.path must be a Hugging Face folder)")
    return json.loads(path.read_text())


def is_native_config(model_config: dict[str, Any]) -> bool:
    """Whether the embedded engine runs the model itself (a registered family,
    :mod:`reinforge.models.families`), not transformers."""
    from .models.families import is_native_type

    return is_native_type(model_config.get("model_type"))


def _engine_dtype(cfg: Config, device: torch.device) -> torch.dtype:
    from .rollout.backends import engine_dtype

    return engine_dtype(cfg.engine.dtype, device)


def kv_cache_plan(
    cfg: Config, folder: Path, max_model_len: int, device: torch.device, max_seqs: int | None = None
) -> KVCachePlan:
    """The embedded engine's KV cache for ``max_model_len`` tokens per sequence on ``device``.

    Its slots are those the engine is built with: ``engine.max_num_seqs`` capped at what the run
    holds at once (``max_seqs``, default :func:`reinforge.plan.sequences.run_max_seqs`).
    On a GPU the blocks are not fixed here (the engine takes what ``engine.kv_cache_memory_fraction``
    of the free memory holds): ``blocks`` is then what the slots' full sequences take.
    """
    from .engine import kv_cache as kv
    from .engine.fp8 import check_quantization
    from .models.shape import model_shape
    from .rollout.backends import engine_config_for

    shape = model_shape(folder)
    weight_dtype = _engine_dtype(cfg, device)
    try:
        kv.kv_cache_dtype(cfg.engine.kv_cache_dtype, weight_dtype, device)
        check_quantization(cfg.engine.quantization, device)  # fp8 weights: compute capability 8.9+
    except ValueError as e:
        raise PreflightError(f"this run cannot start: {e}") from None
    # the engine's own planning, without its free-memory cap (checked in words by memory_problems)
    return kv.kv_cache_plan(shape, engine_config_for(cfg, max_seqs), max_model_len, device, weight_dtype)


def _size(b: float) -> str:
    return f"{b / GIB:.1f} GiB" if b >= GIB else f"{b / MIB:.0f} MiB"


def _prompt_words(n: Lengths) -> str:
    return f"the longest prompt ({n.prompt} tokens)" if n.prompt_known else "a prompt of at least 1 token"


def _window_fix(window: ContextWindow, n: Lengths, key: str, set_key: str | None = None) -> str:
    room = window.tokens - n.prompt
    fix = f"set {set_key or key} to at most {room}" if room > 0 else f"lower {key}"
    if n.prompt_known:
        fix += f", or lower data.rollout_max_prompt_len below {n.prompt} (longer prompts are dropped)"
    return fix + ", or use a model with a longer context window (RoPE scaling such as YaRN in its config.json counts)"


def context_problems(cfg: Config, window: ContextWindow | None, n: Lengths, model: str) -> list[str]:
    """Training and evaluation sequences against the model's context window."""
    if window is None:
        return []
    out = []
    r, e = cfg.rollout, cfg.eval
    holds = f"the model {model} holds {window.tokens} positions ({window.source})"
    if n.train_response is not None and n.prompt + n.train_response > window.tokens:
        key = "rollout.rollout_max_response_len"
        out.append(
            f"training sequences reach {n.prompt + n.train_response} tokens ({_prompt_words(n)} + {key}="
            f"{n.train_response}) but {holds}: {_window_fix(window, n, key)}"
        )
    same = e.eval_max_response_len is None and n.train_response is not None
    if n.eval_response is not None and not same and n.prompt + n.eval_response > window.tokens:
        key = (
            f"eval.eval_max_response_len={e.eval_max_response_len}"
            if e.eval_max_response_len
            else f"rollout.rollout_max_response_len={r.rollout_max_response_len} (eval.eval_max_response_len is null)"
        )
        out.append(
            f"evaluation sequences reach {n.prompt + n.eval_response} tokens ({_prompt_words(n)} + {key}) "
            f"but {holds}: {_window_fix(window, n, key, 'eval.eval_max_response_len')}"
        )
    return out


def budget_problems(cfg: Config, n: Lengths) -> list[str]:
    """``train.max_tokens_per_gpu`` against one whole training sequence."""
    budget = unplanned(cfg.train).max_tokens_per_gpu
    if n.train_response is None or budget >= n.prompt + n.train_response:
        return []
    need = n.prompt + n.train_response
    return [
        f"train.max_tokens_per_gpu={budget} cannot hold one training sequence of {need} tokens "
        f"({_prompt_words(n)} + rollout.rollout_max_response_len={n.train_response}); a micro-batch holds whole "
        f"sequences: raise train.max_tokens_per_gpu to at least {need} or lower rollout.rollout_max_response_len"
    ]


def slot_problems(cfg: Config, plan: KVCachePlan, n: Lengths, device: torch.device) -> list[str]:
    """A prompt's samples against the engine's slots, and ``engine.num_kv_blocks`` against one sequence."""
    r, out = unplanned(cfg.engine), []
    if r.num_kv_blocks and r.num_kv_blocks < plan.blocks_per_seq:
        out.append(
            f"engine.num_kv_blocks={r.num_kv_blocks} holds less than one sequence of {n.max_model_len} "
            f"tokens ({plan.blocks_per_seq} blocks of {plan.block_size}): raise engine.num_kv_blocks to at "
            f"least {plan.blocks_per_seq} (or 0: no cap)"
        )
        return out
    if cfg.rollout.custom_generate_function_path or cfg.rollout.rollout_function_path:
        return out  # custom generation: requests of its own making
    slots = (
        f"engine.num_kv_blocks={r.num_kv_blocks} (one block per sequence on {device.type})"
        if r.num_kv_blocks and plan.slots < r.max_num_seqs
        else f"engine.max_num_seqs={r.max_num_seqs}"
    )
    asks = []
    if n.train_response is not None:
        asks.append(("rollout.n_samples_per_prompt", cfg.rollout.n_samples_per_prompt))
    if n.eval_response is not None:
        asks.append(("eval.n_samples_per_eval_prompt", cfg.eval.n_samples_per_eval_prompt))
    for key, want in asks:
        if want > plan.slots:
            out.append(
                f"{key}={want} exceeds the engine's {plan.slots} slots ({slots}): a prompt's samples are "
                f"decoded together; raise engine.max_num_seqs (and engine.num_kv_blocks, if set) to at "
                f"least {want}, or lower {key}"
            )
    return out


def available_memory() -> float:
    """Bytes this machine can still allocate (/proc/meminfo MemAvailable; total memory elsewhere)."""
    from .utils.machine import machine_resources

    return machine_resources()["memory"]


def memory_problems(
    cfg: Config,
    plan: KVCachePlan,
    n: Lengths,
    device: torch.device,
    memory: float | None = None,
    response_key: str = "rollout.rollout_max_response_len",
) -> list[str]:
    """The embedded engine's KV cache against the memory of ``device`` (see the module doc)."""
    r = unplanned(cfg.engine)
    per_token = (
        f"{plan.bytes_per_token} bytes per token ({kv_cache_words(plan)} x {plan.elem_bytes} bytes, {plan.kv_dtype}; "
        f"engine.dtype={r.dtype}, engine.kv_cache_dtype={r.kv_cache_dtype})"
    )
    length = f"{n.max_model_len} tokens ({_prompt_words(n)} + the longest response {n.engine_response})"
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        share = int(free * r.kv_cache_memory_fraction)
        _, fit = pool_fit(share, plan.block_bytes, plan.ring_bytes, plan.slots, plan.state_bytes_per_slot)
        if fit >= plan.blocks_per_seq:
            return []
        need = plan.bytes_per_slot + plan.block_size * plan.bytes_per_token
        return [
            f"the KV cache of one sequence of {length} and the engine's spare block of {plan.block_size} tokens "
            f"needs {_size(need)} at {per_token}, but "
            f"engine.kv_cache_memory_fraction={r.kv_cache_memory_fraction:g} of the {_size(free)} free on "
            f"{device} is {_size(share)}: lower {response_key}, raise engine.kv_cache_memory_fraction, or use "
            f"a GPU with more memory"
        ]
    memory = available_memory() if memory is None else memory
    weights = plan.weight_bytes
    need = plan.total  # the cache, a hybrid's linear-attention states, the weights
    if need <= memory:
        return []
    fit = max(0, int((memory - weights) // (plan.bytes_per_slot + plan.state_bytes // plan.slots)) - 1)
    slots = (
        f"{plan.slots} slots (engine.max_num_seqs={r.max_num_seqs}"
        + (f", engine.num_kv_blocks={r.num_kv_blocks}" if r.num_kv_blocks else "")
        + (
            ", capped at the sequences the run holds at once"
            if plan.slots < r.max_num_seqs and not r.num_kv_blocks
            else ""
        )
        + ")"
    )
    fix = (
        f"lower engine.max_num_seqs to at most {fit} (each slot holds {_size(plan.bytes_per_slot)}; or cap "
        f"the slots with engine.num_kv_blocks) or lower {response_key}"
        if fit
        else f"not even one slot of {_size(plan.bytes_per_slot)} fits: lower {response_key}"
    )
    samples = max(
        [
            cfg.rollout.n_samples_per_prompt if n.train_response is not None else 0,
            cfg.eval.n_samples_per_eval_prompt if n.eval_response is not None else 0,
        ]
    )
    if 0 < fit < samples:
        fix += (
            f" ({fit} slots hold fewer than the {samples} samples of one prompt: lower "
            f"rollout.n_samples_per_prompt / eval.n_samples_per_eval_prompt too, or the response length)"
        )
    return [
        f"the embedded engine's KV cache needs {_size(plan.bytes)} ({slots} x {length} x {per_token}) plus "
        + (f"its linear-attention states {_size(plan.state_bytes)} and " if plan.state_bytes else "")
        + f"its weights {_size(weights)}, but this machine has {_size(memory)} of memory available: {fix}"
    ]


def trainer_ranks(cfg: Config) -> int:
    """Trainer ranks of an RL run: one in ``cluster.mode=local``, else actor_num_nodes x actor_num_gpus_per_node."""
    return cfg.cluster.num_trainers if cfg.cluster.mode == "ray" else 1


def parallel_problems(cfg: Config, model_config: dict[str, Any], world_size: int | None) -> list[str]:
    """The trainer's parallel layout (:class:`reinforge.parallel_layout.Layout`, where the rules live)
    against the trainer ranks (None: not known here, e.g. torchrun's) and the model: reinforge's own
    model code for tensor, context and pipeline parallelism, heads, MLP columns and decoder layers
    they divide, a mixture-of-experts model whose ``num_experts`` expert parallelism divides."""
    from .parallel_layout import Layout, size_problems, train_sizes

    sizes = train_sizes(cfg.train)
    if sizes == (1, 1, 1, 1, 1, False):
        return []
    out = size_problems(*sizes)
    if out:
        return out
    if world_size is not None:
        try:
            Layout.for_world(world_size, *sizes)
        except ValueError as e:
            local = (
                " (cluster.mode=local runs one trainer rank: use cluster.mode=ray)"
                if cfg.cluster.mode == "local"
                else ""
            )
            out.append(f"{e}{local}")
    tp, cp, ep, pp, vpp, sp = sizes
    return out + Layout(1, cp, tp, ep, pp, vpp, sp).config_problems(model_config)


def _raise(problems: list[str]) -> None:
    if problems:
        parts = problems[0] if len(problems) == 1 else " ".join(f"({i}) {p};" for i, p in enumerate(problems, 1))
        raise PreflightError(f"this run cannot start: {parts.rstrip(';')}")


def _engine_problems(
    cfg: Config,
    folder: Path,
    model_config: dict,
    n: Lengths,
    device: torch.device,
    memory: float | None,
    check_memory: bool,
    response_key: str,
) -> list[str]:
    if cfg.engine.backend != "embedded" or not is_native_config(model_config):
        return []  # other engines size their own caches (vLLM / SGLang) or grow them (transformers)
    plan = kv_cache_plan(cfg, folder, n.max_model_len, device)
    out = slot_problems(cfg, plan, n, device)
    if check_memory and not out:
        out += memory_problems(cfg, plan, n, device, memory, response_key)
    return out


def plan_rl(cfg: Config, model_folder: Path) -> Plan:
    """``reinforge train`` / ``eval``'s up-front step: the ``auto`` keys resolved once
    (:func:`reinforge.plan.resolve_config`) and :func:`check_rl` on that plan, prompts not loaded yet. The plan
    returned is the run's (:class:`reinforge.loop.RLLoop` takes it as it is; :func:`check_lengths` checks it
    again at the datasets' longest prompt).

    Raises:
        PreflightError: as :func:`check_rl` (a ``train.device`` this machine lacks: before the planner reads it).
    """
    from .plan.planner import resolve_config
    from .utils.device import device_problems

    if device_problems(cfg.train.device):
        _raise(device_problems(cfg.train.device))
    _, plan = resolve_config(cfg, model_folder)
    check_rl(cfg, model_folder, plan=plan)
    return plan


def check_rl(
    cfg: Config,
    model_folder: Path,
    max_prompt_tokens: int | None = None,
    *,
    memory: float | None = None,
    device: torch.device | None = None,
    gpu: GPU | None = None,
    plan: Plan | None = None,
) -> Lengths:
    """Every check of an RL run (``reinforge train``, ``reinforge eval``) before anything is built.

    Args:
        cfg: the run's config.
        model_folder: Hugging Face folder of the policy (``model.path`` resolved).
        max_prompt_tokens: the longest prompt of the datasets; None before they are loaded
            (then a lower bound of 1 token; :func:`check_lengths` checks again once they are).
        memory: bytes available for a CPU engine (default: this machine's MemAvailable).
        device: where the engine runs (default ``train.device``). The KV-cache memory is checked
            in ``cluster.mode=local`` only (Ray engines run elsewhere).
        gpu: the GPU whose memory the training step is checked against (:mod:`reinforge.plan`;
            default: the CUDA device of ``device``, none on a CPU). Ignored with ``plan``.
        plan: the run's plan, its ``auto`` keys resolved once by the caller
            (:func:`reinforge.plan.resolve_config`: ``reinforge train`` hands the same plan to the run);
            None: resolved here as the run resolves them.
    Returns:
        the lengths checked.
    Raises:
        PreflightError: every problem found, in one message.
        FileNotFoundError: ``model_folder`` has no config.json.
    """
    from .plan.planner import resolve_config, training_problems
    from .run_dir import output_dir_problems
    from .sandbox import sandbox_problems
    from .utils.device import device_problems, resolve_device

    _raise((device_problems(cfg.train.device) if device is None else []) + output_dir_problems(cfg.run.output_dir))
    model_config = read_model_config(model_folder)
    device = device or resolve_device(cfg.train.device)
    if plan is None:
        _, plan = resolve_config(
            cfg, model_folder, gpu=gpu if gpu is not None else "detect" if device.type == "cuda" else None
        )  # `auto` keys as the run resolves them
    cfg = plan.cfg
    n = rl_lengths(cfg, max_prompt_tokens)
    folder = Path(model_folder)
    problems = _window_problems(cfg, model_config, n, folder.name)
    problems += parallel_problems(cfg, model_config, trainer_ranks(cfg))  # (the prompts change nothing here)
    problems += _memory_problems(plan, folder, model_config, n, device, memory)
    problems += sandbox_problems(cfg)  # the python tool's sandbox, before any model is built
    if not problems:  # the training step's memory (reinforge/plan): only where lengths and budgets hold
        problems += training_problems(plan, n.prompt)
    _raise(problems)
    return n


def check_lengths(
    plan: Plan,
    model_folder: Path,
    max_prompt_tokens: int,
    *,
    memory: float | None = None,
    device: torch.device | None = None,
) -> Lengths:
    """The checks of :func:`check_rl` that depend on the longest prompt, again once the datasets are loaded
    (``max_prompt_tokens`` measured on them), after :func:`check_rl` passed with its lower bound: the context
    window, ``train.max_tokens_per_gpu``, the engine's slots and KV cache, the embedded judge beside it, the
    training step's memory. The ``auto`` keys are not resolved again (``plan.cfg`` is the run's).

    Raises:
        PreflightError: every problem found, in one message.
    """
    from .plan.planner import training_problems
    from .utils.device import resolve_device

    cfg, folder, model_config = plan.cfg, Path(model_folder), read_model_config(model_folder)
    device = device or resolve_device(cfg.train.device)
    n = rl_lengths(cfg, max_prompt_tokens)
    problems = _window_problems(cfg, model_config, n, folder.name)
    problems += _memory_problems(plan, folder, model_config, n, device, memory)
    _raise(problems or training_problems(plan, n.prompt))
    return n


def _window_problems(cfg: Config, model_config: dict, n: Lengths, name: str) -> list[str]:
    """The lengths ``n`` against the model's context window and ``train.max_tokens_per_gpu``."""
    return context_problems(cfg, context_window(model_config), n, name) + budget_problems(cfg, n)


def _memory_problems(
    plan: Plan, folder: Path, model_config: dict, n: Lengths, device: torch.device, memory: float | None
) -> list[str]:
    """The embedded engine's slots and KV cache (its memory in ``cluster.mode=local``), and the embedded judge's."""
    cfg = plan.cfg
    local = cfg.cluster.mode == "local"
    problems = _engine_problems(cfg, folder, model_config, n, device, memory, local, "rollout.rollout_max_response_len")
    return problems + judge_problems(cfg, folder, n.max_model_len, device, memory)  # judge.model_path


def check_generate(
    cfg: Config,
    model_folder: Path,
    prompt_tokens: int,
    max_new_tokens: int,
    n: int = 1,
    device: torch.device | None = None,
) -> None:
    """``reinforge generate``: the prompt + ``--max-new-tokens`` against the context window, ``--n``
    against the engine's slots, and the engine's KV cache against the memory.

    Raises:
        PreflightError: naming the flags and keys to change.
    """
    from .utils.device import device_problems, resolve_device

    model_config = read_model_config(model_folder)
    window, problems, total = context_window(model_config), [], prompt_tokens + max_new_tokens
    if window is not None and total > window.tokens:
        room, name, held = window.tokens - prompt_tokens, Path(model_folder).name, f"{window.tokens} positions"
        problems.append(
            f"the prompt ({prompt_tokens} tokens) + --max-new-tokens={max_new_tokens} = {total} tokens but the model "
            f"{name} holds {held} ({window.source}): set --max-new-tokens to at most {room}"
            if room > 0  # else no --max-new-tokens makes room: the prompt is too long
            else f"the prompt alone is {prompt_tokens} tokens (after the chat template and any --system prompt) but "
            f"the model {name} holds {held} ({window.source}), leaving no room for a new token: shorten the prompt "
            f"by at least {1 - room} tokens, or use a model with a longer context window"
        )
    lengths = Lengths(prompt_tokens, True, None, None, max_new_tokens)
    if device is None:
        problems += device_problems(cfg.train.device)
    device = device or (resolve_device(cfg.train.device) if not problems else torch.device("cpu"))
    if not problems and cfg.engine.backend == "embedded" and is_native_config(model_config):
        plan = kv_cache_plan(cfg, Path(model_folder), total, device, max_seqs=n)  # the engine is built for --n
        if n > plan.slots:
            problems.append(
                f"--n={n} exceeds the engine's {plan.slots} slots: raise engine.max_num_seqs "
                f"(and engine.num_kv_blocks, if set) to at least {n}"
            )
        problems += slot_problems(cfg, plan, lengths, device)
        if not problems:
            problems += memory_problems(cfg, plan, lengths, device, None, "--max-new-tokens")
    _raise(problems)


def longest_example(examples: Iterable[Any], sampled: int = 0) -> int:
    """Tokens of the longest sequence (prompt + one response) of offline examples (objects with
    ``prompt_ids`` and ``responses``, e.g. :class:`reinforge.data.offline.OfflineExample`); 0 for none.
    ``sampled``: a response of up to this many tokens may replace the dataset's (GKD's student samples,
    ``offline.gkd_max_new_tokens``)."""
    return max((len(e.prompt_ids) + max([sampled, *map(len, e.responses)]) for e in examples), default=0)


def check_offline(cfg: Config, model_folder: Path, longest: int) -> None:
    """``reinforge offline``: the longest example (prompt + response, after ``offline.max_length``)
    against the model's context window and ``train.max_tokens_per_gpu``.

    Raises:
        PreflightError: naming ``offline.max_length`` / ``train.max_tokens_per_gpu`` and the limit.
    """
    o, model_config = cfg.offline, read_model_config(model_folder)
    # (the world size is torchrun's: checked when the ranks start)
    problems = parallel_problems(cfg, model_config, None)
    for key in ("context_parallel_size", "pipeline_model_parallel_size"):
        if getattr(cfg.train, key) > 1:
            problems.append(
                f"train.{key}={getattr(cfg.train, key)}: reinforge offline does not run it yet; set it to 1"
            )
    window = context_window(model_config)
    if window is not None and longest > window.tokens:
        problems.append(
            f"the longest example has {longest} tokens (prompt + response; offline.max_length="
            f"{o.max_length}) but the model {Path(model_folder).name} holds {window.tokens} positions "
            f"({window.source}): set offline.max_length to at most {window.tokens} (longer examples are "
            f"dropped, or cut with offline.truncation=truncate)"
        )
    budget = unplanned(cfg.train).max_tokens_per_gpu
    if budget < longest:
        problems.append(
            f"train.max_tokens_per_gpu={budget} cannot hold the longest example's sequence of {longest} "
            f"tokens (prompt + response); a micro-batch holds whole sequences: raise "
            f"train.max_tokens_per_gpu to at least {longest}, or lower offline.max_length (longer "
            f"examples are dropped, or cut with offline.truncation=truncate)"
        )
    _raise(problems)
