"""``reinforge check-model``: is a model family right? One table, transformers beside reinforge's own code.

The check that makes a new model trustworthy (issue 52): it loads one Hugging Face folder three ways, as
``transformers`` (the reference), as reinforge's native family (the trainer) and in the embedded engine, and
compares them on random token ids, all in fp32:

====================  ==================================================================================
row                   what it compares
====================  ==================================================================================
family                the registered family, or what the config has that no family implements
logits (fp32)         max |logit difference| native vs transformers; the first decoder layer whose output
                      differs by more than the bound (hooks on both models' layers)
engine log-probs      the embedded engine's sampled tokens' log-probs vs the trainer's for the same text
greedy continuation   the engine's greedy tokens vs transformers' greedy tokens (``--tokens``, no stop)
weight sync           the engine after ``update_weights`` with perturbed weights: its log-probs equal the
                      perturbed trainer's (and differ from the unperturbed model's, so the sync happened)
HF export             the native model written by ``save_hf_folder`` and read back by transformers: logits
LoRA targets          the ``nn.Linear`` names peft would adapt (``model.lora_target_modules``) that exist
speed                 forward + backward tokens/s, native vs the transformers fallback
====================  ==================================================================================

An unregistered family gets the rows transformers alone can fill and says what is missing: its engine rows
check the fallback engine a run would use (transformers' batched ``generate``, ``engine.backend=hf``) against
transformers' forward pass, then export, LoRA targets and the fallback's speed.

``--random-tiny`` first writes a tiny random model of the folder's ``config.json`` (:func:`tiny_config`: 2-4
layers of width 64, the layer pattern and every option kept) and checks that: a config-only folder (or a
``config.json``) is enough, so a new architecture can be proven in minutes on a CPU.

The bound for fp32 rows is 1e-4 (absolute, on logits and log-probs), the one the families' tests use.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

BOUND = 1e-4
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "chat_template.jinja",
    "special_tokens_map.json",
    "generation_config.json",
)


@dataclass
class Row:
    """One line of the table: ``ok`` True / False, or None where the row was not run (``value`` says why)."""

    name: str
    value: str
    ok: bool | None = None

    def __post_init__(self) -> None:
        if self.ok is not None:
            self.ok = bool(self.ok)  # (a comparison of tensors gives a 0-d tensor)

    def mark(self) -> str:
        return {True: "ok", False: "FAIL", None: "-"}[self.ok]


# ---------------------------------------------------------------------------------------------- tiny configs
_WIDTHS = {"hidden_size": 64, "intermediate_size": 128, "moe_intermediate_size": 32}
_SMALL = {  # key -> the value a tiny model takes (never more than the config's own)
    "shared_expert_intermediate_size": 32,
    "kv_lora_rank": 32,
    "q_lora_rank": 32,
    "linear_num_value_heads": 4,
    "linear_num_key_heads": 2,
    "num_experts": 8,
    "n_routed_experts": 8,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "sliding_window": 8,  # (shorter than the checked texts, so that the windows matter)
}


def tiny_config(cfg: dict, layers: int = 4) -> dict:
    """A tiny copy of a ``config.json`` dict: width 64, at most ``layers`` decoder layers (per-layer lists
    such as ``layer_types`` cut to match, so a hybrid keeps its first layers' pattern), 4 query heads with
    the config's query / key-value head ratio, head dims of 16, at most 8 experts (2 per token), sliding windows
    of at most 8 tokens (shorter than the checked texts). A multimodal config's ``text_config`` is made tiny in
    place. Keys it does not know are kept.

    Args:
        cfg: the ``config.json`` dict.
        layers: the most decoder layers kept (a hybrid model with a full-attention layer every
            ``full_attention_interval`` layers keeps at least one of each kind: 4 for Qwen3-Next's 3:1).
    Returns:
        a new dict (``cfg`` is not changed).
    """
    if isinstance(
        cfg.get("text_config"), dict
    ):  # a multimodal checkpoint: its language model, a one-block vision tower
        text = tiny_config(cfg["text_config"], layers)
        out = {**cfg, "text_config": text}
        if isinstance(cfg.get("vision_config"), dict):
            small = {
                "depth": 1,
                "hidden_size": 32,
                "intermediate_size": 64,
                "num_heads": 2,
                "num_position_embeddings": 64,
            }
            vision = {**cfg["vision_config"], **{k: v for k, v in small.items() if k in cfg["vision_config"]}}
            if "out_hidden_size" in vision:
                vision["out_hidden_size"] = text.get("hidden_size", 64)
            out["vision_config"] = vision
        return out
    out = dict(cfg)
    old_layers = int(cfg.get("num_hidden_layers", layers))
    n = min(old_layers, max(layers, int(cfg.get("full_attention_interval") or 0)))
    out["num_hidden_layers"] = n
    for key, value in cfg.items():
        if isinstance(value, list) and len(value) == old_layers:
            out[key] = value[:n]
    for key in ("mlp_only_layers",):
        if isinstance(cfg.get(key), list):
            out[key] = [i for i in cfg[key] if i < n]
    for key, width in _WIDTHS.items():
        if key in cfg:
            out[key] = width
    for key, small in _SMALL.items():
        if isinstance(cfg.get(key), int) and not isinstance(cfg.get(key), bool):
            out[key] = min(int(cfg[key]), small)
    heads = int(cfg.get("num_attention_heads") or 4)
    kv = int(cfg.get("num_key_value_heads") or heads)
    out["num_attention_heads"] = 4
    if "num_key_value_heads" in cfg:
        tiny_kv = max(1, 4 // max(1, heads // kv))  # the same query heads per key-value head, where 4 allow it
        out["num_key_value_heads"] = tiny_kv if 4 % tiny_kv == 0 else 1
    for key, value in cfg.items():
        if key.endswith("head_dim") and isinstance(value, int) and value > 0:
            out[key] = 16
    if "head_dim" not in cfg and "hidden_size" in cfg:
        out["head_dim"] = 16  # (64 / 4 heads)
    if "num_experts_per_tok" in out and any(k in out for k in ("num_experts", "n_routed_experts", "num_local_experts")):
        experts = next(int(out[k]) for k in ("num_experts", "n_routed_experts", "num_local_experts") if k in out)
        out["num_experts_per_tok"] = min(int(out["num_experts_per_tok"]), experts)
    out.pop("quantization_config", None)  # random weights are plain
    return out


def write_tiny_model(source: str | os.PathLike, out: str | os.PathLike, seed: int = 0, layers: int = 4) -> Path:
    """A tiny random model of ``source``'s config (a folder with ``config.json``, or the file) in ``out``:
    transformers' model class when the installed transformers has it, else the native family's; weights
    drawn N(0, 0.2) (matrices) and N(0, 0.1) (biases) so outputs and routing vary with the input. The
    tokenizer files beside the config are copied.

    Raises:
        FileNotFoundError: no config.json at ``source``.
        ValueError: neither transformers nor a registered family knows the ``model_type``.
    """
    src = Path(source)
    cfg_file = src if src.is_file() else src / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"check-model: no config.json at {source}")
    cfg = tiny_config(json.loads(cfg_file.read_text()), layers)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        if (cfg_file.parent / name).exists():
            (out / name).write_bytes((cfg_file.parent / name).read_bytes())
    model_type = cfg.get("model_type")
    generator = torch.Generator().manual_seed(seed)
    hf_cfg = _transformers_config(cfg)
    if hf_cfg is not None:
        torch.manual_seed(seed)
        model = _auto_class(cfg).from_config(hf_cfg, dtype=torch.float32)
        _spread_weights(model, generator)
        model.save_pretrained(out)
        return out
    from .models.families import is_native_type

    if not is_native_type(model_type):
        raise ValueError(
            f"check-model: model_type {model_type!r} is known neither to the installed transformers nor to a "
            f"registered family: no model can be built from {cfg_file}"
        )
    from .models.loading import load_hf_config, save_hf_folder
    from .models.transformer import CausalLM

    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    native = CausalLM(load_hf_config(out))
    native.init_weights(generator=generator)
    _spread_weights(native, generator)
    save_hf_folder(native, out, out)
    return out


def _auto_class(cfg: dict) -> Any:
    """transformers' auto class for a config: image-text-to-text for a multimodal one (a vision tower
    beside ``text_config``: the checkpoint keeps its layout), else causal LM."""
    import transformers

    multimodal = isinstance(cfg.get("vision_config"), dict) and isinstance(cfg.get("text_config"), dict)
    return transformers.AutoModelForImageTextToText if multimodal else transformers.AutoModelForCausalLM


def _transformers_config(cfg: dict) -> Any:
    """transformers' config object for ``cfg`` (None when the installed transformers lacks the type)."""
    from transformers import AutoConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    model_type = cfg.get("model_type")
    if model_type not in CONFIG_MAPPING_NAMES:
        return None
    kwargs = {k: v for k, v in cfg.items() if k not in ("model_type", "architectures", "transformers_version")}
    return AutoConfig.for_model(model_type, **kwargs)


# projections that set a linear-attention layer's decay: drawn small, so that the decays stay in the range of
# trained models (with N(0, 0.2) a token's decay factor reaches exp(-60), and fp32 itself, transformers' code
# included, then differs from float64 by 1e-3 in the logits)
SMALL_INIT = ("in_proj_a.weight", "in_proj_ba.weight")


def _spread_weights(model: nn.Module, generator: torch.Generator) -> None:
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=generator) * (0.02 if name.endswith(SMALL_INIT) else 0.2))
            elif name.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=generator) * 0.1)


# ---------------------------------------------------------------------------------------------- the checks
def _prompts(vocab: int, seed: int, count: int = 3) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    top = max(11, min(vocab, 40000))
    return [torch.randint(10, top, (5 + 3 * i,), generator=g).tolist() for i in range(count)]


def _layer_outputs(layers: nn.ModuleList, run: Callable[[], Any]) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []

    def hook(_m, _inp, output):
        out.append((output[0] if isinstance(output, tuple) else output).detach())

    handles = [layer.register_forward_hook(hook) for layer in layers]
    try:
        run()
    finally:
        for h in handles:
            h.remove()
    return out


def _token_log_probs(model: nn.Module, prompt: list[int], tokens: list[int], temperature: float = 1.0) -> torch.Tensor:
    from .models.loading import model_logits

    ids = torch.tensor([prompt + tokens])
    with torch.no_grad():
        logits = model_logits(model, ids)[0, len(prompt) - 1 : -1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(tokens)[:, None])[:, 0]


def _greedy(model: nn.Module, prompt: list[int], steps: int) -> list[int]:
    from .models.loading import model_logits

    ids = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            ids.append(int(model_logits(model, torch.tensor([ids]))[0, -1].argmax()))
    return ids[len(prompt) :]


def _engine(model: nn.Module, max_model_len: int) -> Any:
    from .config import EngineConfig
    from .engine import EmbeddedEngine

    return EmbeddedEngine(model, EngineConfig(max_num_seqs=4, kv_block_size=4), max_model_len=max_model_len)


def _fallback_engine(model: nn.Module) -> Any:
    """The rollout engine of a model of no registered family (``engine.backend=hf``)."""
    from .rollout.backends.hf import HFEngine

    cfg = model.config
    pad = next((i for i in (cfg.pad_token_id, cfg.eos_token_id, 0) if isinstance(i, int)), 0)
    return HFEngine(model, pad_token_id=pad, batch_size=4)


def _sample(engine: Any, prompts: list[list[int]], new_tokens: int, temperature: float) -> list[list[int]]:
    from .records import GenerateRequest, SamplingParams

    params = SamplingParams(max_new_tokens=new_tokens, temperature=temperature, ignore_eos=True)
    results = engine.generate([GenerateRequest(p, params) for p in prompts])
    return [[list(r.token_ids), list(r.log_probs)] for (r,) in results]


def _speed(model: nn.Module, vocab: int, tokens: int = 512, reps: int = 3) -> float:
    """Forward + backward tokens/s of ``model`` on [2, tokens / 2] random ids (median of ``reps``)."""
    from .models.loading import model_logits

    ids = torch.randint(10, max(11, min(vocab, 40000)), (2, tokens // 2), generator=torch.Generator().manual_seed(1))
    model.train()
    times = []
    for i in range(reps + 1):
        t0 = time.perf_counter()
        model_logits(model, ids).float().logsumexp(-1).mean().backward()
        if i:
            times.append(time.perf_counter() - t0)
        model.zero_grad(set_to_none=True)
    model.eval()
    return tokens / sorted(times)[len(times) // 2]


def check_model(
    path: str | os.PathLike,
    *,
    tokens: int = 64,
    seed: int = 0,
    speed: bool = True,
    lora_targets: list[str] | None = None,
) -> list[Row]:
    """Run every check on the Hugging Face folder ``path`` (fp32, CPU or the current device's default);
    see the module docstring for the rows.

    Args:
        path: a folder with ``config.json`` and safetensors weights.
        tokens: the length of the greedy continuation compared (and of the sampled text).
        seed: the prompts' and the sampling's seed.
        speed: run the speed row (forward + backward, 3 timed repetitions each side).
        lora_targets: peft ``target_modules`` to look for (default: ``model.lora_target_modules``' default).
    Returns:
        the table's rows, in order.
    """
    from .models.families import FAMILIES, family_of, is_native_type
    from .models.loading import build_model, is_native, load_hf_config, model_logits, save_hf_folder

    path = Path(path)
    hf_cfg = load_hf_config(path)
    text_cfg = getattr(hf_cfg, "text_config", None) or hf_cfg
    model_type = getattr(hf_cfg, "model_type", None)
    vocab = int(getattr(text_cfg, "vocab_size", 32000))
    rows: list[Row] = []
    native: nn.Module | None = None
    missing = ""
    if is_native_type(model_type):
        try:
            family = family_of(hf_cfg)
            family.model_args(family.text_config(hf_cfg))
            native = build_model(path, torch.float32).eval()
            rows.append(Row("family", f"{model_type}: {FAMILIES.info(model_type).get('title', '')}", True))
        except NotImplementedError as e:
            missing = str(e)
    else:
        missing = f"no registered family for model_type {model_type!r} (registered: {', '.join(FAMILIES.names())})"
    if native is None:
        rows.append(Row("family", f"fallback (transformers): {missing}", None))
    reference = _reference(path)
    if reference is None:
        rows.append(Row("logits (fp32)", "not run: the installed transformers cannot load this folder", None))
    prompts = _prompts(vocab, seed)
    longest = max(map(len, prompts)) + tokens + 1
    if native is not None and not is_native(native):  # build_model fell back
        native = None
    if native is not None and reference is not None:
        rows += _logits_rows(native, reference, vocab, seed)
    if native is not None:
        rows += _engine_rows(path, native, reference, prompts, tokens, longest, seed)
    elif reference is not None:  # the fallback the run would use: transformers' generate (engine.backend=hf)
        rows += _engine_rows(path, reference, None, prompts, tokens, longest, seed, fallback=True)
    else:
        for name in ("engine log-probs (fp32)", "greedy continuation", "weight sync"):
            rows.append(Row(name, "not run: no model to run (transformers cannot load this folder)", None))
    exported = native if native is not None else reference
    if exported is not None:
        with tempfile.TemporaryDirectory() as tmp:
            save_hf_folder(exported, tmp, path, torch.float32)
            back = _reference(Path(tmp))
            if back is None:
                rows.append(Row("HF export", "not run: the installed transformers cannot load the export", None))
            else:
                ids = torch.tensor([prompts[-1]])
                with torch.no_grad():
                    diff = (model_logits(exported, ids) - back(input_ids=ids, use_cache=False).logits).abs().max()
                rows.append(Row("HF export", f"read back by transformers: max |logit diff| {diff:.2e}", diff < BOUND))
    rows.append(_lora_row(native if native is not None else reference, lora_targets))
    if speed:
        rows.append(_speed_row(native, reference, vocab))
    return rows


def _reference(path: Path) -> nn.Module | None:
    """transformers' model of ``path`` in fp32, eval mode (None where it cannot be loaded)."""
    try:
        cfg = json.loads((path / "config.json").read_text())
        return _auto_class(cfg).from_pretrained(str(path), dtype=torch.float32).eval()
    except (ValueError, KeyError, OSError, ImportError):
        return None


def _logits_rows(native: nn.Module, reference: nn.Module, vocab: int, seed: int) -> list[Row]:
    """The logits row. Where native and transformers differ by more than :data:`BOUND` in fp32, both are
    also compared with transformers in float64: a native model at least as close to float64 as
    transformers' own fp32 passes (the fp32 reference's rounding, e.g. the gated delta rule's chunked
    decays, is then the difference), and the first layer whose output differs is named."""
    import copy

    ids = torch.randint(10, max(11, min(vocab, 40000)), (2, 13), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        ours_layers = _layer_outputs(native.model.layers, lambda: native(ids))
        ref_layers = _layer_outputs(_decoder_layers(reference), lambda: reference(input_ids=ids, use_cache=False))
        ours = native(ids)
        ref = reference(input_ids=ids, use_cache=False).logits
    diff = (ours - ref).abs().max().item()
    first = next(
        (
            i
            for i, (a, b) in enumerate(zip(ours_layers, ref_layers))
            if a.shape != b.shape or (a - b).abs().max().item() > BOUND
        ),
        None,
    )
    where = "no layer differs" if first is None else f"first differing layer: {first}"
    if diff < BOUND:
        return [Row("logits (fp32)", f"max |diff| vs transformers {diff:.2e}; {where}", True)]
    exact = copy.deepcopy(reference).double()
    if hasattr(exact, "set_experts_implementation"):  # (grouped matmuls take no float64)
        try:
            exact.set_experts_implementation("eager")
        except ValueError:
            pass
    with torch.no_grad():
        ref64 = exact(input_ids=ids, use_cache=False).logits
    ours64, theirs64 = (ours.double() - ref64).abs().max().item(), (ref.double() - ref64).abs().max().item()
    ok = ours64 <= max(BOUND, theirs64)
    value = (
        f"max |diff| vs transformers {diff:.2e}; vs transformers in float64: native {ours64:.2e}, "
        f"transformers fp32 {theirs64:.2e}" + ("" if ok else f"; {where}")
    )
    return [Row("logits (fp32)", value, ok)]


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    inner = getattr(model, "model", model)
    inner = getattr(inner, "language_model", inner)
    return inner.layers


def _engine_rows(
    path: Path,
    native: nn.Module,
    reference: nn.Module | None,
    prompts: list[list[int]],
    tokens: int,
    max_len: int,
    seed: int,
    fallback: bool = False,
) -> list[Row]:
    """The engine rows: the embedded engine beside the native trainer, or (``fallback``: a model of no
    registered family, ``native`` then transformers' model) the fallback engine a run uses,
    :class:`~reinforge.rollout.backends.hf.HFEngine` (transformers' batched ``generate``)."""
    from .models.loading import build_model, named_weights

    rows = []
    engine = (
        _fallback_engine(build_model(path, torch.float32))
        if fallback
        else _engine(build_model(path, torch.float32), max_len)
    )
    kind = "fallback engine (transformers generate)" if fallback else "engine"
    engine.reseed(seed)
    sampled = _sample(engine, prompts, tokens, 1.0)
    diff = max(
        (_token_log_probs(native, p, t) - torch.tensor(lp)).abs().max().item() for p, (t, lp) in zip(prompts, sampled)
    )
    rows.append(Row("engine log-probs (fp32)", f"max |diff| trainer vs {kind} {diff:.2e}", diff < BOUND))
    greedy = _sample(engine, prompts[:1], tokens, 0.0)[0][0]
    ref_model = reference if reference is not None else native
    expected = _greedy(ref_model, prompts[0], tokens)
    same = next((i for i, (a, b) in enumerate(zip(greedy, expected)) if a != b), len(expected))
    who = "transformers" if reference is not None else "the trainer"
    rows.append(Row("greedy continuation", f"{same} of {tokens} tokens equal to {who}'s", same == tokens))
    # weight sync: perturb a copy, sync it in, and compare the engine against it (and against the original)
    moved = build_model(path, torch.float32).eval()
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in moved.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.05)
    engine.update_weights(named_weights(moved), version=1)
    after = _sample(engine, prompts[:2], min(tokens, 16), 1.0)
    synced = max(
        (_token_log_probs(moved, p, t) - torch.tensor(lp)).abs().max().item() for p, (t, lp) in zip(prompts, after)
    )
    stale = max(
        (_token_log_probs(native, p, t) - torch.tensor(lp)).abs().max().item() for p, (t, lp) in zip(prompts, after)
    )
    ok = synced < BOUND and stale > 10 * BOUND
    rows.append(Row("weight sync", f"engine vs synced weights {synced:.2e} (vs the weights before: {stale:.2e})", ok))
    engine.shutdown()
    return rows


def _lora_row(model: nn.Module | None, targets: list[str] | None) -> Row:
    if model is None:
        return Row("LoRA targets", "not run: no model", None)
    if targets is None:
        from .config.model import ModelConfig
        from .models.lora import with_family_targets

        targets = with_family_targets(model, ModelConfig().lora_target_modules)
    found = sorted({n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, nn.Linear)})
    hit = [t for t in targets if t in found]
    missing = [t for t in targets if t not in found]
    value = f"{', '.join(hit) or 'none'} found" + (f"; absent: {', '.join(missing)}" if missing else "")
    others = [n for n in found if n not in targets and n != "lm_head"]
    if others:
        value += f"; other linear layers: {', '.join(others)}"
    return Row("LoRA targets", value, bool(hit))


def _speed_row(native: nn.Module | None, reference: nn.Module | None, vocab: int) -> Row:
    if reference is None:
        return Row("speed", "not run: no transformers model to compare with", None)
    fallback = _speed(reference, vocab)
    if native is None:
        return Row("speed", f"fallback (transformers) forward+backward {fallback:,.0f} tok/s", None)
    ours = _speed(native, vocab)
    return Row(
        "speed",
        f"forward+backward native {ours:,.0f} tok/s, transformers {fallback:,.0f} tok/s ({ours / fallback:.2f}x)",
        None,
    )


def format_table(rows: list[Row]) -> str:
    """The rows as an aligned text table (``name | ok/FAIL/- | value``)."""
    width = max(len(r.name) for r in rows)
    return "\n".join(f"{r.name:<{width}}  {r.mark():<4}  {r.value}" for r in rows)


def failed(rows: list[Row]) -> list[Row]:
    """The rows whose check ran and failed."""
    return [r for r in rows if r.ok is False]
