"""reinforge's embedded inference engine (the default rollout engine), on nano-vllm's pattern.

* :mod:`.engine`: :class:`EmbeddedEngine`, the front door (``generate`` / ``add_request`` / ``step`` /
  ``abort`` / ``interrupt`` / ``sleep`` / ``wake_up`` / ``update_weights``); ``step()`` reads as
  schedule -> run -> postprocess.
* :mod:`.scheduler`: host-only: waiting queue, slots, block tables; admission, block grants,
  preemption choice.
* :mod:`.runner`: device state: KV cache and per-slot buffers, prefill, decode, CUDA graphs,
  read-backs for overlap scheduling.
* :mod:`.kv_cache` (block allocator, layout planning), :mod:`.attention` (the attention contexts the
  model calls, chosen once per layout), :mod:`.paged_attention` (decode attention kernels),
  :mod:`.sampling` (samplers).

The rollout layer (:mod:`reinforge.rollout`) builds it through the ``embedded`` backend
(``rollout/backends/embedded.py``) and never reaches inside.
"""

from .engine import EmbeddedEngine

__all__ = ["EmbeddedEngine"]
