"""Fallback rollout engine on ``transformers``' ``generate`` (any causal LM, slow)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from ...models.loading import build_model, copy_weights_
from ...records import FinishReason, GenerateRequest, GenerateResult, SamplingParams


class HFEngine:
    """Implements ``RolloutEngine`` with batched ``model.generate`` (left padding).

    For architectures the embedded engine does not implement. One :meth:`generate` call runs its
    requests' ``n`` completions each in batches of up to ``batch_size`` sequences
    (``engine.max_num_seqs``): the sequences whose sampling parameters are equal in value (every field
    but ``max_new_tokens``) share one ``model.generate`` of the longest ``max_new_tokens`` among them,
    each cut at its own (a completion's tokens and log-probs do not depend on how long the others run).
    So the many requests of an agent rollout, each with its own parameters object, still go in a few
    batches. Stop strings are not supported (use stop token ids).
    """

    def __init__(self, model: nn.Module, pad_token_id: int, batch_size: int = 64, seed: int = 0):
        self.model = model.eval().requires_grad_(False)
        self.pad_id = pad_token_id
        self.batch_size = batch_size
        self.seed = seed
        self.weight_version = 0
        self.device = next(model.parameters()).device

    @torch.no_grad()
    def generate(self, requests: list[GenerateRequest]) -> list[list[GenerateResult]]:
        """``requests[i].n`` results for each request, in order (see the class docstring for the batching).

        Raises:
            ValueError: a request has stop strings (``SamplingParams.stop``).
        """
        for r in requests:
            if r.params.stop:
                raise ValueError("the hf backend does not support stop strings; use rollout_stop_token_ids")
        by_params: dict[tuple, list[tuple[int, GenerateRequest]]] = {}
        for i, r in enumerate(requests):
            by_params.setdefault(batch_key(r.params), []).extend((i, r) for _ in range(r.n))
        out: list[list[GenerateResult]] = [[] for _ in requests]
        torch.manual_seed(self.seed)
        for rows in by_params.values():
            for start in range(0, len(rows), self.batch_size):
                chunk = rows[start : start + self.batch_size]
                for (i, _), res in zip(chunk, self._run([r for _, r in chunk])):
                    out[i].append(res)
        return out

    def _run(self, reqs: list[GenerateRequest]) -> list[GenerateResult]:
        """One ``model.generate`` over ``reqs`` (equal :func:`batch_key`), each cut at its ``max_new_tokens``."""
        p = reqs[0].params
        longest = max(r.params.max_new_tokens for r in reqs)
        width = max(len(r.prompt_ids) for r in reqs)
        ids = torch.full((len(reqs), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, r in enumerate(reqs):
            ids[row, width - len(r.prompt_ids) :] = torch.tensor(r.prompt_ids)
            mask[row, width - len(r.prompt_ids) :] = 1
        stop = [] if p.ignore_eos else list(p.stop_token_ids)
        greedy = p.temperature <= 0
        gen = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            max_new_tokens=longest,
            min_new_tokens=longest if p.ignore_eos else None,
            do_sample=not greedy,
            temperature=None if greedy else p.temperature,
            top_p=p.top_p if p.top_p < 1 else None,
            top_k=p.top_k if p.top_k > 0 else None,
            eos_token_id=stop or None,
            pad_token_id=self.pad_id,
            return_dict_in_generate=True,
            output_logits=True,
        )
        seqs = gen.sequences[:, width:].cpu()
        temp = 1.0 if greedy else p.temperature
        logps = torch.stack([torch.log_softmax(l.float() / temp, -1) for l in gen.logits], 1).cpu()  # [B, T, V]
        results = []
        for row, r in enumerate(reqs):
            toks = seqs[row, : r.params.max_new_tokens].tolist()
            n, reason = len(toks), FinishReason.LENGTH
            for t, tok in enumerate(toks):
                if tok in stop:
                    n, reason = t + 1, FinishReason.STOP
                    break
            lp = logps[row, torch.arange(n), seqs[row, :n]].tolist()
            results.append(GenerateResult(toks[:n], lp, reason, self.weight_version))
        return results

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        copy_weights_(self.model, named_tensors)
        self.weight_version = version

    @property
    def weight_dtype(self) -> torch.dtype:
        return self.model.get_input_embeddings().weight.dtype

    def weight_checksums(self, names: list[str]) -> dict[str, int | None]:
        """Checksums of the named parameters where they landed (:mod:`reinforge.weights.verify`)."""
        from ...weights.verify import param_checksums

        return param_checksums(self.model, names, self.weight_dtype)

    def reseed(self, seed: int) -> None:
        self.seed = seed

    def sleep(self, offload_weights: bool = False) -> None:
        pass

    def wake_up(self) -> None:
        pass

    def shutdown(self) -> None:
        pass


def batch_key(params: SamplingParams) -> tuple:
    """The sampling parameters that must be equal for two sequences to share one ``model.generate``:
    every field of :class:`~reinforge.records.SamplingParams` but ``max_new_tokens``."""
    return (
        params.temperature,
        params.top_p,
        params.top_k,
        tuple(params.stop),
        tuple(params.stop_token_ids),
        params.ignore_eos,
    )


def from_spec(spec) -> HFEngine:
    """The ``hf`` backend's factory (:mod:`reinforge.rollout.backends`)."""
    model = build_model(spec.model_path, spec.dtype, spec.device, random_init=spec.random_init, seed=spec.init_seed)
    return HFEngine(
        model, pad_token_id=spec.tokenizer.pad_token_id, batch_size=spec.engine.max_num_seqs, seed=spec.seed
    )
