"""Sparse mixture-of-experts MLP blocks (Qwen3-MoE, Qwen2-MoE), shared by the trainer and the engine.

One block replaces a decoder layer's dense MLP. For N tokens ``x`` [N, H] (the layer's rows
flattened, row-major) and E experts of intermediate size I, each picking its top ``k``:

* router: ``logits = x @ gate.weight.T`` [N, E] in x's dtype, ``p = softmax(logits)`` in fp32;
  the chosen experts ``ids = topk(p, k)`` [N, k] int64 (or the replayed ones, below);
* gate weights: ``w = p[ids]``, divided by their sum when ``norm_topk_prob`` (Qwen3-MoE's
  checkpoints set it; Qwen2-MoE's do not), cast to the logits' dtype;
* experts: ``y = sum_j w_j * down_e (silu(gate_e x) * up_e x)`` with ``e = ids_j`` (SwiGLU,
  Shazeer 2020);
* Qwen2-MoE adds a shared expert, a dense SwiGLU MLP of its own width scaled per token by
  ``sigmoid(x @ shared_expert_gate.weight.T)``.

The formulas follow ``transformers/models/qwen3_moe/modeling_qwen3_moe.py`` and
``qwen2_moe/modeling_qwen2_moe.py`` (fp32 logits agree with them, ``tests/integration/test_moe.py``).

Parameters (transformers 5's in-memory names and shapes; the same in 5.17 and 5.23), under the
decoder layer's ``mlp.``:

==================================  ============  ===================================================
``gate.weight``                     [E, H]        the router
``experts.gate_up_proj``            [E, 2I, H]    rows [0, I) the gate projection, [I, 2I) the up one
``experts.down_proj``               [E, H, I]
``shared_expert.{gate,up,down}_proj.weight``      Qwen2-MoE only: a dense MLP (``shared_expert_intermediate_size``)
``shared_expert_gate.weight``       [1, H]        Qwen2-MoE only
==================================  ============  ===================================================

Checkpoints on the Hugging Face hub store each expert on its own
(``mlp.experts.{e}.gate_proj.weight`` [I, H], ``up_proj`` [I, H], ``down_proj`` [H, I]):
:func:`stack_expert_weights` turns such a state dict into the stacked layout (loading) and
:func:`hub_named_tensors` back (export, and the weight sync to vLLM / SGLang, whose loaders read
the hub layout).

Expert computation: the N*k (token, expert) pairs are sorted by expert (a stable argsort), the
group ends found by ``searchsorted`` on the sorted ids (the cumulative counts, computed on the
device: no ``bincount``, whose output size needs a host read on CUDA), and each projection is
one ``torch._grouped_mm`` over the groups where it runs (:func:`grouped_mm_supported`; CUDA bf16
on Hopper and later, CPU and fp32 in torch >= 2.13 only when asked for), else a loop over the
experts (CPU, fp32). The grouped path reads nothing back to the host, so the engine can capture
it in a CUDA graph. The k outputs of a token are put back in order and summed with their weights
(the permutation both ways: :mod:`.moe_dispatch`, one Triton kernel each on CUDA).
With expert parallelism (``train.expert_model_parallel_size``) each rank holds ``E / ep`` experts
and the pairs travel to them and back by all-to-all (:mod:`.expert_parallel`).

Routing interface (:class:`Routing`, passed as ``CausalLM.forward(..., routing=...)`` and down to
every block; None costs nothing):

* ``Routing(record=True)``: after the forward, ``routing.experts[layer]`` is the [N, k] int64
  experts each token used in that MoE layer (the engine can store them with a sample);
* ``Routing(replay={layer: ids})`` (a dict, or any ``[layer]``-indexable such as an
  [num_layers, N, k] tensor): the given experts replace the router's choice and the gate
  weights are the router's probabilities of those experts, renormalised as ``norm_topk_prob``
  says: slime's / verl's *routing replay* (the trainer computes with the experts the engine
  used). Values must be in [0, E) (not checked: that would read back to the host), except a row
  whose first id is -1 (signed dtypes): there the router decides (rollout routing replay replays
  the response-predicting positions only, :mod:`reinforge.train.routing_replay`);
* ``Routing(aux_loss=True, token_mask=mask)``: each block keeps the statistics of the
  load-balancing loss, :meth:`Routing.load_balancing_loss` combines them over the layers.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from . import fused
from .expert_parallel import expert_parallel_experts
from .moe_dispatch import combine, dispatch, sort_by_expert

__all__ = ["Routing", "SparseMoeBlock", "Experts", "grouped_mm_supported", "stack_expert_weights", "hub_named_tensors"]


class Routing:
    """One forward pass's expert routing: replayed choices in, recorded choices and the
    load-balancing statistics out (see the module docstring).

    A plain class on purpose, not a dataclass: FSDP2 rebuilds dataclass arguments of a unit's
    forward (``dataclasses.replace``: its input cast under mixed precision, and, in torch 2.13, its
    gradient hooks on the tensors inside dataclasses), so the blocks of later layers would fill a
    copy and the caller's ``stats`` / ``experts`` would miss them (``tests/integration/test_expert_parallel.py``).

    Attributes:
        replay: layer -> [N, k] integer expert ids that override the router (N = the tokens of the
            forward pass, its [B, T] input flattened row-major; a row starting with -1 is left to
            the router), or None.
        record: fill ``experts``.
        aux_loss: fill ``stats`` (the load-balancing loss's inputs, with gradient).
        token_mask: [B, T] (bool or 0/1) tokens that count in the load-balancing loss (1 at real
            tokens: padding left out); None counts every token.
        experts: filled with ``record``: layer -> [N, k] int64 experts used (detached).
        stats: filled with ``aux_loss``: layer -> (tokens per expert [E] fp32, router probability
            summed per expert [E] fp32, counted tokens: a 0-d fp32 tensor).
    """

    def __init__(
        self, replay: Any = None, record: bool = False, aux_loss: bool = False, token_mask: torch.Tensor | None = None
    ):
        self.replay, self.record, self.aux_loss, self.token_mask = replay, record, aux_loss, token_mask
        self.experts: dict[int, torch.Tensor] = {}
        self.stats: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    def __repr__(self) -> str:
        return (
            f"Routing(replay={'set' if self.replay is not None else None}, record={self.record}, "
            f"aux_loss={self.aux_loss}, layers recorded={sorted(self.experts)}, with stats={sorted(self.stats)})"
        )

    def load_balancing_loss(self) -> torch.Tensor:
        """Switch Transformer's auxiliary loss (Fedus et al. 2021, eqs. 4-6) pooled over the MoE
        layers as transformers' ``load_balancing_loss_func`` pools them:
        ``E * sum_e f_e * P_e`` with ``f_e`` the (token, expert) assignments to expert e and
        ``P_e`` the router probability of e, each summed over layers and tokens and divided by
        (layers x counted tokens). Its minimum, k, is a uniform load. 0-d fp32, with gradient in
        the routers' weights.

        Raises:
            RuntimeError: no statistics (built without ``aux_loss=True``, or no MoE layer ran).
        """
        if not self.stats:
            raise RuntimeError(
                "Routing.load_balancing_loss: no statistics; pass Routing(aux_loss=True) to the "
                "forward of a mixture-of-experts model"
            )
        counts, probs, rows = (sum(s[i] for s in self.stats.values()) for i in range(3))
        rows = rows.clamp(min=1.0)
        return counts.numel() * ((counts / rows) * (probs / rows)).sum()


@functools.cache
def _cuda_grouped_mm_runs(device_index: int) -> bool:
    return torch.cuda.get_device_capability(device_index) >= (9, 0)


def grouped_mm_supported(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the automatic choice uses ``torch._grouped_mm``: CUDA bf16 on compute capability
    9.0 or later (Hopper), where torch 2.11 runs it without reading back to the host (a CUDA graph
    captures it; checked on an H100). Elsewhere the loop over the experts runs: the grouped path
    computes the same there too (torch 2.11 runs fp32 on CUDA, but reads the offsets back to the
    host, so no graph captures it; torch >= 2.13 runs it on CPU), :attr:`SparseMoeBlock.grouped`
    forces it. The engine captures decode graphs of an MoE model only where this holds."""
    return (
        hasattr(torch, "_grouped_mm")
        and device.type == "cuda"
        and dtype == torch.bfloat16
        and _cuda_grouped_mm_runs(device.index if device.index is not None else torch.cuda.current_device())
    )


class Experts(nn.Module):
    """E SwiGLU experts as two stacked parameters: ``gate_up_proj`` [E, 2I, H] and
    ``down_proj`` [E, H, I] (transformers 5's ``...MoeExperts``). :attr:`expert_params`: the parameters
    whose first dimension is the expert (expert parallelism shards them; a family's subclass adds its
    biases)."""

    expert_params: tuple[str, ...] = ("gate_up_proj", "down_proj")

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.num_experts, self.intermediate_size = num_experts, intermediate_size
        self.gate_up_proj = nn.Parameter(torch.empty(num_experts, 2 * intermediate_size, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(num_experts, hidden_size, intermediate_size))

    def forward(self, fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> torch.Tensor:
        """``fn(gate_up_proj, down_proj)``: a call through the module, so that an FSDP unit of the
        experts alone (expert parallelism with ``dp / ep`` > 1) gathers them for it and reduces
        their gradients after the backward pass."""
        return fn(self.gate_up_proj, self.down_proj)


class SparseMoeBlock(nn.Module):
    """A decoder layer's mixture-of-experts MLP (see the module docstring).

    Args:
        hidden_size: H; num_experts: E; top_k: experts per token (``num_experts_per_tok``);
        intermediate_size: I of each expert (``moe_intermediate_size``);
        norm_topk_prob: divide the k gate weights by their sum;
        layer: the decoder layer's index (the key of :class:`Routing`'s dicts);
        shared_expert: Qwen2-MoE's dense MLP applied to every token (with a sigmoid gate), or None.
    """

    grouped: bool | None = None
    """``torch._grouped_mm`` (True), the loop over the experts (False), or chosen by device and
    dtype (None, :func:`grouped_mm_supported`). A class attribute: tests and benchmarks set it."""

    def __init__(
        self,
        hidden_size: int,
        num_experts: int,
        top_k: int,
        intermediate_size: int,
        norm_topk_prob: bool,
        layer: int,
        shared_expert: nn.Module | None = None,
    ):
        super().__init__()
        if not 0 < top_k <= num_experts:
            raise ValueError(f"num_experts_per_tok={top_k} must be in [1, num_experts={num_experts}]")
        self.layer, self.top_k, self.norm_topk_prob = layer, top_k, norm_topk_prob
        self.gate = nn.Linear(hidden_size, num_experts, bias=False)
        self.experts = Experts(num_experts, hidden_size, intermediate_size)
        self.shared_expert = shared_expert
        self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False) if shared_expert is not None else None
        self.fused = False  # SiLU-and-multiply and the token permutation as Triton kernels (CausalLM.set_variant)
        # expert parallelism: the group whose ranks hold the experts (train/mesh.py sets it), None: all here
        self.ep_group: Any = None

    def fuse_projection(self, on: bool) -> None:
        """The experts' gate and up projections are stacked already; the shared expert's fuse
        as a dense MLP's do (:meth:`~reinforge.models.transformer.MLP.fuse_projection`)."""
        if self.shared_expert is not None:
            self.shared_expert.fuse_projection(on)

    def forward(self, x: torch.Tensor, routing: Routing | None = None) -> torch.Tensor:
        """x: [B, T, H] -> [B, T, H] in x's dtype (the autocast dtype under autocast).

        The routing steps are methods a family's subclass may override (GLM-4.5's sigmoid router:
        ``reinforge/models/families/glm4_moe.py``): :meth:`router_scores`, :meth:`select`,
        :meth:`gate_weights`, :meth:`balance_probs`, :meth:`add_shared`.

        Raises:
            ValueError: ``routing.replay[layer]`` is not [B*T, k].
        """
        shape = x.shape
        x = x.reshape(-1, shape[-1])
        scores, weight_dtype = self.router_scores(x)
        replay = routing.replay[self.layer] if routing is not None and routing.replay is not None else None
        if replay is None:
            ids = self.select(scores)
        else:
            if tuple(replay.shape) != (x.shape[0], self.top_k):
                raise ValueError(
                    f"Routing.replay[{self.layer}]: shape {tuple(replay.shape)}, expected "
                    f"[tokens={x.shape[0]}, num_experts_per_tok={self.top_k}]"
                )
            ids = replay.to(device=x.device, dtype=torch.long)
            if replay.dtype.is_signed:  # rows whose first id is -1: the router decides
                ids = torch.where(ids[:, :1] >= 0, ids, self.select(scores))
        weights = self.gate_weights(scores, ids)
        if routing is not None:
            self._note(routing, self.balance_probs(scores), ids)
        y = self.add_shared(x, self._experts(x, ids, weights.to(weight_dtype)))
        return y.reshape(*shape[:-1], y.shape[-1])

    def router_scores(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.dtype]:
        """x [N, H] -> (the router's scores [N, E] fp32, the dtype the gate weights are cast to).
        Default (Qwen): ``softmax(gate(x))`` in fp32, weights cast to the logits' dtype."""
        logits = self.gate(x)
        return torch.softmax(logits, dim=-1, dtype=torch.float), logits.dtype

    def select(self, scores: torch.Tensor) -> torch.Tensor:
        """The router's choice: scores [N, E] -> expert ids [N, k] int64 (default: the top k)."""
        return torch.topk(scores, self.top_k, dim=-1).indices

    def gate_weights(self, scores: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The k gate weights [N, k] fp32 of the chosen (or replayed) ``ids``: their scores,
        divided by their sum when ``norm_topk_prob``."""
        weights = scores.gather(1, ids)
        return weights / weights.sum(dim=-1, keepdim=True) if self.norm_topk_prob else weights

    def balance_probs(self, scores: torch.Tensor) -> torch.Tensor:
        """The per-token router probabilities [N, E] fp32 (rows sum to 1) that the load-balancing
        loss reads (default: the softmax scores themselves)."""
        return scores

    def add_shared(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The routed experts' output ``y`` [N, H] plus the shared expert's of ``x`` [N, H] (default:
        Qwen2-MoE's, gated per token by ``sigmoid(shared_expert_gate(x))``; none: ``y``)."""
        if self.shared_expert is None:
            return y
        return y + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)

    def _note(self, routing: Routing, probs: torch.Tensor, ids: torch.Tensor) -> None:
        """Record the experts used and the load-balancing statistics (as :class:`Routing` asks)."""
        if routing.record:
            routing.experts[self.layer] = ids.detach()
        if routing.aux_loss:
            E = probs.shape[-1]
            if routing.token_mask is None:
                mask = probs.new_ones(probs.shape[0])
            else:
                mask = routing.token_mask.reshape(-1).to(device=probs.device, dtype=torch.float32)
            counts = probs.new_zeros(E).index_add_(0, ids.detach().reshape(-1), mask.repeat_interleave(self.top_k))
            routing.stats[self.layer] = (counts, (probs * mask[:, None]).sum(0), mask.sum())

    def _experts(self, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        """sum_j weights[:, j] * expert_{ids[:, j]}(x): x [N, H], ids [N, k] int64, weights [N, k]
        -> [N, H]. With :attr:`ep_group` set the experts live on the ranks of that group
        (:func:`~reinforge.models.expert_parallel.expert_parallel_experts`)."""
        k = ids.shape[1]
        dtype = torch.get_autocast_dtype(x.device.type) if torch.is_autocast_enabled(x.device.type) else x.dtype
        if self.ep_group is not None:
            return self.experts(
                lambda gate_up, down: expert_parallel_experts(
                    self.ep_group, gate_up, down, x, ids, weights, dtype, self._compute, self.fused
                )
            )
        gate_up, down = self.experts.gate_up_proj.to(dtype), self.experts.down_proj.to(dtype)
        flat = ids.reshape(-1)
        order = sort_by_expert(flat, gate_up.shape[0])  # (token, slot) pairs grouped by expert
        ends = torch.searchsorted(flat[order], torch.arange(gate_up.shape[0], device=x.device), right=True)
        xs, pos = dispatch(x.to(dtype), order, k, self.fused)  # [N*k, H] in expert order
        return combine(self._compute(xs, gate_up, down, ends), pos, weights, self.fused)

    def _compute(self, xs: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """The experts on rows grouped by expert: xs [M, H] (expert e's rows ``[ends[e-1], ends[e])``),
        gate_up [E', 2I, H], down [E', H, I], ends [E'] int64 -> [M, H]."""
        grouped = self.grouped if self.grouped is not None else grouped_mm_supported(xs.device, xs.dtype)
        if grouped:
            offs = ends.to(torch.int32)
            return torch._grouped_mm(
                self._act(torch._grouped_mm(xs, gate_up.transpose(1, 2), offs=offs)), down.transpose(1, 2), offs=offs
            )
        return self._loop(xs, gate_up, down, [0] + ends.tolist())

    def _loop(self, xs: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, bounds: list[int]) -> torch.Tensor:
        """The grouped product as a loop over the experts that received tokens (reads the group
        bounds on the host). With no rows at all the result [0, H] still depends on the weights
        (zero gradients), so that every expert-parallel rank has expert gradients to reduce."""
        parts = []
        for e in range(gate_up.shape[0]):
            a, b = bounds[e], bounds[e + 1]
            if b > a:
                parts.append(F.linear(self._act(F.linear(xs[a:b], gate_up[e])), down[e]))
        if not parts:
            return F.linear(self._act(F.linear(xs[:0], gate_up[0])), down[0])
        return torch.cat(parts)

    def _act(self, gu: torch.Tensor) -> torch.Tensor:
        """SiLU(gate) * up on the packed [M, 2I] output of the gate/up projection."""
        if self.fused and not (torch.is_grad_enabled() and gu.requires_grad):
            return fused.silu_mul_packed(gu)
        g, u = gu.chunk(2, dim=-1)
        return fused.silu_mul(g, u) if self.fused else F.silu(g) * u


# ------------------------------------------------------------------------ hub <-> stacked layout
_HUB_EXPERT = re.compile(r"^(?P<prefix>.*\.mlp\.experts)\.(?P<e>\d+)\.(?P<proj>gate_proj|up_proj|down_proj)\.weight$")


def stack_expert_weights(state: dict[str, torch.Tensor], where: str = "the weights") -> dict[str, torch.Tensor]:
    """A state dict with the hub's per-expert tensors (``...mlp.experts.{e}.gate_proj.weight``,
    ``up_proj``, ``down_proj``) turned into the stacked parameters (``...mlp.experts.gate_up_proj``
    [E, 2I, H], ``...mlp.experts.down_proj`` [E, H, I]); every other tensor (an already stacked
    checkpoint's too) is passed through. The per-expert tensors are released as they are stacked.

    Raises:
        KeyError: a layer's experts are incomplete (an index or a projection missing), naming
            ``where`` (the folder) and the first missing tensor.
    """
    groups: dict[str, dict[tuple[int, str], str]] = {}
    for name in state:
        m = _HUB_EXPERT.match(name)
        if m:
            groups.setdefault(m["prefix"], {})[(int(m["e"]), m["proj"])] = name
    for prefix, names in groups.items():
        n = max(e for e, _ in names) + 1
        for e in range(n):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                if (e, proj) not in names:
                    raise KeyError(
                        f"{where}: {prefix}.{e}.{proj}.weight is missing ({prefix} has {n} experts in the hub layout)"
                    )
        state[f"{prefix}.gate_up_proj"] = torch.stack(
            [torch.cat([state.pop(names[(e, "gate_proj")]), state.pop(names[(e, "up_proj")])]) for e in range(n)]
        )
        state[f"{prefix}.down_proj"] = torch.stack([state.pop(names[(e, "down_proj")]) for e in range(n)])
    return state


def hub_named_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) pairs with every stacked expert parameter split into the hub's per-expert
    tensors, in expert order: ``...mlp.experts.gate_up_proj`` [E, 2I, H] becomes
    ``...mlp.experts.{e}.gate_proj.weight`` and ``up_proj.weight`` [I, H] each, ``down_proj``
    [E, H, I] becomes ``...mlp.experts.{e}.down_proj.weight`` [H, I]. The split tensors are views
    (no copy). Other pairs pass through unchanged. Used by the Hugging Face export
    (:func:`~reinforge.models.loading.save_hf_state_dict`) and the weight sync to vLLM / SGLang."""
    for name, t in named:
        if name.endswith(".mlp.experts.gate_up_proj"):
            prefix, half = name.removesuffix(".gate_up_proj"), t.shape[1] // 2
            for e in range(t.shape[0]):
                yield f"{prefix}.{e}.gate_proj.weight", t[e, :half]
                yield f"{prefix}.{e}.up_proj.weight", t[e, half:]
        elif name.endswith(".mlp.experts.down_proj"):
            prefix = name.removesuffix(".down_proj")
            for e in range(t.shape[0]):
                yield f"{prefix}.{e}.down_proj.weight", t[e]
        else:
            yield name, t
