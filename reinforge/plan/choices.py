"""The ``auto`` keys' values on a workload (:func:`choose`), each with its reason: the packing, the
engine's slots and KV-cache share, ``cluster.offload_rollout``, the recomputation and the micro-batch
(the order and the rules: :mod:`.planner`'s doc, docs/planner.md "`auto` keys"). Without a plan each key
is :data:`DEFAULTS` (its declared ``unplanned`` value, the sections under ``reinforge/config/``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import model as M

if TYPE_CHECKING:
    from ..config import Config

AUTO = "auto"
AUTO_KEYS = (
    "train.packing",
    "engine.max_num_seqs",
    "engine.kv_cache_memory_fraction",
    "cluster.offload_rollout",
    "model.recompute_num_layers",
    "train.max_tokens_per_gpu",
)


def _unplanned() -> dict[str, Any]:
    from ..config import ClusterConfig, EngineConfig, ModelConfig, TrainConfig
    from ..config.fields import unplanned_values

    sections = {"engine": EngineConfig, "cluster": ClusterConfig, "model": ModelConfig, "train": TrainConfig}
    return {f"{s}.{k}": v for s, cls in sections.items() for k, v in unplanned_values(cls).items()}


DEFAULTS: dict[str, Any] = _unplanned()  # what `auto` is without a plan (each key's `unplanned`, reinforge/config/)
KV_FRACTIONS = [round(0.95 - 0.01 * i, 2) for i in range(91)]  # engine.kv_cache_memory_fraction=auto tries these
KV_KEY = "engine.kv_cache_memory_fraction"
MIN_AUTO_TOKENS = 8192  # today's default micro-batch: auto keeps at least this where it fits
MAX_AUTO_TOKENS = 32768  # larger micro-batches gain little speed (docs/benchmarks.md) and risk fragmentation
TOKEN_MULTIPLE = 256
AUTO_HEADROOM = 0.92  # auto choices fill at most this share of what a refusal allows: the planner errs on the safe side


@dataclass
class Choice:
    key: str
    value: Any
    reason: str


def _get(cfg: Config, key: str) -> Any:
    section, name = key.split(".")
    return getattr(getattr(cfg, section), name)


def _set(cfg: Config, changes: dict[str, Any]) -> Config:
    by_section: dict[str, dict[str, Any]] = {}
    for key, value in changes.items():
        section, name = key.split(".")
        by_section.setdefault(section, {})[name] = value
    return dataclasses.replace(cfg, **{s: dataclasses.replace(getattr(cfg, s), **v) for s, v in by_section.items()})


def auto_keys(cfg: Config) -> list[str]:
    """The keys of ``cfg`` left at ``auto``."""
    return [k for k in AUTO_KEYS if _get(cfg, k) == AUTO]


def _round_down(n: int) -> int:
    return max(TOKEN_MULTIPLE, n // TOKEN_MULTIPLE * TOKEN_MULTIPLE)


def _round_up(n: int) -> int:
    return -(-n // TOKEN_MULTIPLE) * TOKEN_MULTIPLE


@dataclass(order=True)
class MicroFit:
    """What the ``auto`` recomputation and micro-batch come to on a workload, ordered by how good it is:
    the step fits, fewer layers recomputed, more tokens."""

    fits: bool
    fewer_recomputed: int
    tokens: int

    @property
    def recompute(self) -> int:
        return -self.fewer_recomputed

    def words(self, without: MicroFit, layers: int) -> str:
        """What this fit gains over ``without``, in words."""
        if not without.fits:
            return "the step fits only with it"
        if self.recompute < without.recompute:
            return f"{self.recompute} of {layers} layers recomputed instead of {without.recompute}"
        return f"a micro-batch of {self.tokens} tokens instead of {without.tokens}"


def _micro_batch(
    cfg: Config, w: M.Workload, native: bool, rec_auto: bool, tok_auto: bool, limit: float, offline: bool
) -> tuple[tuple[dict[str, Any], list[Choice]], MicroFit]:
    """The ``auto`` recomputed layers and micro-batch on ``w`` (module doc, 3): (their changes and
    choices, how good the result is). The recomputation's reason is judged at the resolved micro-batch."""
    changes: dict[str, Any] = {}
    out: list[Choice] = []
    L = w.arch.num_layers
    one_seq = _round_up(w.seq_len)
    floor = max(one_seq, MIN_AUTO_TOKENS)
    target: int | None = w.micro_tokens if not tok_auto else floor
    k = w.recompute
    if rec_auto:
        found = M.min_recompute_that_fits(w, target, limit) if target is not None else None
        if found is None and tok_auto:  # not even with every layer: the largest micro-batch that fits then
            found, target = L, None
        k = L if found is None else found
        all_or_none = not native and 0 < k < L
        if all_or_none:
            k = L
        changes["model.recompute_num_layers"] = k if native else None
        changes["model.gradient_checkpointing"] = k > 0 or (native and cfg.model.gradient_checkpointing)
        w = M.with_(w, recompute=k)
    n = w.micro_tokens
    if tok_auto:
        fit = M.max_tokens_that_fit(w, limit=limit)
        cap = max(MAX_AUTO_TOKENS, one_seq)
        n = min(fit, cap)
        if n < one_seq:
            n = one_seq
            why = f"one whole sequence ({w.seq_len} tokens) is the least a micro-batch holds; only {fit} fit"
            why += " (refused below)"
        else:
            why = (
                f"the largest micro-batch that fits ({fit} tokens)"
                if n == fit
                else f"{cap} tokens (the cap; {fit} would fit)"
            )
            n = _round_down(n)
        if offline:
            why += "; offline.max_length is not read here: one example must fit"
        changes["train.max_tokens_per_gpu"] = n
        out.append(Choice("train.max_tokens_per_gpu", n, why))
    if rec_auto:
        if not M.fits(w, n, k, limit) and target is not None:
            why = f"even every layer recomputed leaves no room for {n} tokens (refused below)"
        elif all_or_none:
            why = "this model's code recomputes all layers or none: all"
        elif target is None:
            why = "every layer: the micro-batch is what memory limits"
        elif k == 0:
            why = f"no recomputation needed: the micro-batch ({n} tokens) fits without it"
        elif tok_auto:
            why = f"the fewest of {L} layers with which {floor} tokens fit (the least `auto` keeps); with them {n} do"
        else:
            why = f"the fewest of {L} layers with which {n} tokens fit"
        out.insert(0, Choice("model.recompute_num_layers", k if native else ("all" if k else "none"), why))
    return (changes, out), MicroFit(M.fits(w, n, k, limit), -k, n)


def _slots_choice(cfg: Config, w: M.Workload) -> Choice:
    """``engine.max_num_seqs=auto`` on ``w`` (module doc, 1)."""
    a = w.arch
    held_tokens = w.prompt_len + 0.75 * w.response_len
    footprint = a.seq_kv_bytes(held_tokens, w.kv_elem_bytes, w.engine_elem_bytes)  # a hybrid's states included
    share = M.per_engine(w)[0].num_seqs  # the sequences one engine gets
    pool = M.kv_pool(M.with_(w, slots=share))
    held = int(pool // max(footprint, 1))
    n = max(min(share, held), min(cfg.rollout.n_samples_per_prompt, share))
    return Choice(
        "engine.max_num_seqs",
        n,
        f"{'all ' if n == share else ''}{n} of {M.share_text(w)} "
        f"at once: the KV cache ({pool / M.GIB:.1f} GiB, engine.kv_cache_memory_fraction="
        f"{w.kv_fraction:g}) holds {held} at prompt + 3/4 of the response",
    )


def largest_kv_fraction(w: M.Workload, limit: float, trains: bool = True) -> float | None:
    """The largest ``engine.kv_cache_memory_fraction`` of :data:`KV_FRACTIONS` with which every phase
    of ``w`` fits ``limit`` bytes (the cache beside the trainer's state while generating, and beside
    the training step unless ``offload_rollout`` frees it), lowered to the least that gives the slots'
    full-length need (a larger share allocates nothing more); None when even 0.05 does not fit.
    ``trains`` False (``reinforge eval``: no rollout trains): the generation phase alone."""
    phases = ("generation", "log-probs", "training") if trains else ("generation",)
    for f in KV_FRACTIONS:
        v = M.with_(w, kv_fraction=f)
        if all(b.total <= limit for b in M.memory_plan(v) if b.phase in phases):
            need = M.kv_need(v)
            while f > KV_FRACTIONS[-1] and M.kv_pool(M.with_(v, kv_fraction=round(f - 0.01, 2))) >= need:
                f = round(f - 0.01, 2)
            return f
    return None


def _kv_choice(w: M.Workload, limit: float, offload_words: str, trains: bool) -> tuple[float, str]:
    """``engine.kv_cache_memory_fraction=auto`` on ``w`` (its other keys resolved): the value, the reason."""
    f = largest_kv_fraction(w, limit, trains)
    if f is None:
        return DEFAULTS[KV_KEY], "no share fits beside the other phases: today's default (refused below)"
    v = M.with_(w, kv_fraction=f)
    pool, need, per = M.kv_pool(v), M.kv_need(v), M.kv_need(M.with_(v, slots=1))
    held = f"holds {v.slots} full-length sequences" if pool >= need else f"holds {int(pool // per)} at full length"
    return f, f"the largest cache that fits beside every other phase ({pool / M.GIB:.1f} GiB, {held}{offload_words})"


def _packing_choice(cfg: Config, w: M.Workload, native: bool) -> Choice:
    """``train.packing=auto``: ``sequences`` where reinforge's own model code trains in bf16 on the GPU."""
    if not native:
        return Choice("train.packing", "none", "a Hugging Face model's code takes padded rows only")
    if not w.train_bf16:
        return Choice("train.packing", "none", "model.train_dtype=fp32: no varlen attention kernel, padded rows")
    return Choice(
        "train.packing",
        "sequences",
        "reinforge's own model code in bf16 on a GPU: samples side by side (varlen attention), no padding",
    )


def choose(cfg: Config, w: M.Workload, native: bool, offline: bool) -> tuple[dict[str, Any], list[Choice]]:
    """The values of the ``auto`` keys of ``cfg`` on workload ``w`` (module doc)."""
    keys, changes, out = auto_keys(cfg), {}, []
    L = w.arch.num_layers
    limit = w.usable * AUTO_HEADROOM
    if "train.packing" in keys:
        c = _packing_choice(cfg, w, native)
        changes[c.key] = c.value
        out.append(c)
    kv_auto = KV_KEY in keys and not offline
    if KV_KEY in keys and offline:
        changes[KV_KEY] = DEFAULTS[KV_KEY]
    other = (
        f"engine.backend={cfg.engine.backend} sizes its own cache from this share; the planner sizes the embedded "
        f"engine's"
        if cfg.engine.backend != "embedded"
        else "a judge engine (judge.model_path) takes this share too, beside the policy's"
        if cfg.judge.model_path
        else None
    )
    if kv_auto and other:
        kv_auto = False
        changes[KV_KEY] = DEFAULTS[KV_KEY]
        out.append(Choice(KV_KEY, DEFAULTS[KV_KEY], f"{other}: today's default"))
    if "engine.max_num_seqs" in keys and not kv_auto:  # the cache's size is known: the slots it holds first
        c = _slots_choice(cfg, w)
        changes[c.key] = c.value
        out.append(c)
        w = M.with_(w, slots=c.value)
    rec_auto, tok_auto = "model.recompute_num_layers" in keys, "train.max_tokens_per_gpu" in keys

    def settle(v: M.Workload) -> tuple[MicroFit, float]:
        """How good the micro-batch and (``kv_auto``) the cache come out on ``v``."""
        (micro, _), fit = _micro_batch(cfg, v, native, rec_auto, tok_auto, limit, offline)
        if not kv_auto:
            return fit, M.kv_pool(v)
        v = M.with_(v, recompute=fit.recompute, micro_tokens=fit.tokens)
        f = largest_kv_fraction(v, limit, cfg.train.num_rollout > 0)
        return fit, M.kv_pool(M.with_(v, kv_fraction=f)) if f is not None else 0.0

    if "cluster.offload_rollout" in keys:
        can = w.colocated and cfg.cluster.mode == "local" and cfg.rollout.max_staleness == 0
        on = M.with_(w, offload_rollout=True)
        kv = M.kv_pool(w, after_training=False) / M.GIB
        (off_fit, off_kv), (on_fit, on_kv) = settle(w), settle(on)
        larger_cache = kv_auto and on_kv > 1.05 * off_kv and on_fit >= off_fit
        gain = can and on_fit.fits and (on_fit > off_fit or larger_cache)
        changes["cluster.offload_rollout"] = gain
        if not can:
            why = "needs cluster.mode=local, rollout.max_staleness=0"
        elif not on_fit.fits:
            why = (
                f"would free the {kv:.1f} GiB KV cache the training step holds, but the step does not fit either "
                f"way (refused below)"
            )
        elif gain and on_fit > off_fit:
            why = f"frees the {kv:.1f} GiB KV cache while training: {on_fit.words(off_fit, L)}"
        elif gain:
            why = (
                f"frees the KV cache while training, so it can grow to {on_kv / M.GIB:.1f} GiB instead of "
                f"{off_kv / M.GIB:.1f} GiB (engine.kv_cache_memory_fraction=auto) with the same micro-batch"
            )
        else:
            why = (
                f"not needed: the {kv:.1f} GiB KV cache stays while training and the micro-batch is the same "
                f"without it ({off_fit.tokens} tokens, {off_fit.recompute} of {L} layers recomputed)"
            )
        out.append(Choice("cluster.offload_rollout", gain, why))
        w = on if gain else w
    micro, fit = _micro_batch(cfg, w, native, rec_auto, tok_auto, limit, offline)
    changes.update(micro[0])
    out += micro[1]
    if kv_auto:
        w = M.with_(w, recompute=fit.recompute, micro_tokens=fit.tokens)
        freed = (
            ", the cache freed while training (cluster.offload_rollout)" if w.offload_rollout and w.colocated else ""
        )
        f, why = _kv_choice(w, limit, freed, cfg.train.num_rollout > 0)
        changes[KV_KEY] = f
        out.append(Choice(KV_KEY, f, why))
        w = M.with_(w, kv_fraction=f)
        if "engine.max_num_seqs" in keys:
            c = _slots_choice(cfg, w)
            changes[c.key] = c.value
            out.append(c)
    return changes, out
