"""``reinforge make-data``: offline datasets made from a prompt source with the policy itself.

* ``pairs``: sample ``rollout.n_samples_per_prompt`` completions per prompt with the engine, score
  them with the configured reward, and pair a correct completion (reward >= ``reward.correct_threshold``)
  with an incorrect one of the same prompt (preference data for RM / DPO / IPO / CPO / SimPO / ORPO);
* ``kto``: every scored completion with ``label`` = correct (unpaired data for KTO);
* ``sft``: the prompt with the task's reference answer written in the answer format
  (``--answer-format``, e.g. ``<answer>{answer}</answer>``), no sampling (SFT data);
* ``kd``: sequence-level knowledge distillation (Kim & Rush 2016): ``rollout.n_samples_per_prompt``
  completions per prompt sampled from ``model.path`` (the teacher), each written as an SFT chat
  (prompt + the teacher's answer), not scored; ``reinforge offline offline.method=sft`` on that file trains
  the student on the teacher's samples (docs/distillation.md);
* ``tool-sft``: a tool-use conversation (call the tool, read its output, answer) written by the
  program from the task's expression and answer (:mod:`reinforge.tool_traces`), for SFT before
  agentic RL.

Prompts are written as chat messages (with ``data.system_prompt`` when set), so the files are
self-contained. Everything runs offline on the configured engine (CPU or GPU).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from .config import Config
from .data import load_datasets
from .models.hub import resolve_model_path
from .models.loading import load_tokenizer
from .rollout.backends import build_engine, engine_spec
from .rollout.generate import RolloutContext, generate_groups, model_stop_token_ids
from .utils.device import resolve_device

log = logging.getLogger(__name__)

KINDS = ("pairs", "kto", "sft", "tool-sft", "kd")


def _messages(prompt: str | list[dict[str, Any]], system_prompt: str | None) -> list[dict[str, Any]]:
    msgs = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
    if system_prompt and msgs[0]["role"] != "system":
        msgs = [{"role": "system", "content": system_prompt}] + msgs
    return msgs


def make_data(
    cfg: Config,
    kind: str,
    out: str | Path,
    num_prompts: int,
    answer_format: str = "<answer>{answer}</answer>",
    pairs_per_prompt: int = 1,
    batch_prompts: int = 256,
) -> dict[str, float]:
    """Write ``kind`` examples for up to ``num_prompts`` training prompts of ``data.prompt_data`` to ``out``
    (jsonl). Returns counts (prompts, examples written, prompts without a correct/incorrect mix).

    The engine's KV cache holds one chunk of work (at most ``batch_prompts`` prompts x
    ``rollout.n_samples_per_prompt`` sequences), not ``engine.max_num_seqs``.

    Raises:
        ValueError: unknown ``kind``.
        DataError: unreadable prompt data, or prompts ``reward.type`` cannot score (pairs, kto).
    """
    if kind not in KINDS:
        raise ValueError(f"make-data: kind must be one of {KINDS}, got {kind!r}")
    path = resolve_model_path(cfg.model.path)
    tok = load_tokenizer(path)
    train, _ = load_datasets(cfg.data, tok, reward=cfg.reward if kind in ("pairs", "kto") else None)
    prompts = train.prompts[:num_prompts]
    system = cfg.data.system_prompt
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    counts = {"prompts": float(len(prompts)), "examples": 0.0, "prompts_without_pair": 0.0}
    if kind == "tool-sft":
        from .tool_traces import tool_trace

        with out.open("w") as f:
            for p in prompts:
                msgs = tool_trace(cfg, tok, p, answer_format)
                if msgs is not None:
                    f.write(json.dumps({"messages": msgs}) + "\n")
                    counts["examples"] += 1
        return counts
    if kind == "sft":
        with out.open("w") as f:
            for p in prompts:
                msgs = _messages(p.prompt, system) + [
                    {"role": "assistant", "content": answer_format.format(answer=p.label)}
                ]
                f.write(json.dumps({"messages": msgs}) + "\n")
        counts["examples"] = float(len(prompts))
        return counts
    from .reward import RewardManager

    r = cfg.rollout
    max_len = train.max_prompt_tokens + r.rollout_max_response_len
    engine = build_engine(
        engine_spec(
            cfg,
            path,
            tok,
            resolve_device(cfg.train.device),
            max_len,  # KV cache for
            max_seqs=min(batch_prompts, len(prompts)) * r.n_samples_per_prompt,
        )
    )  # the work
    reward = RewardManager(cfg.reward, pad_id=tok.pad_token_id or 0, judge=cfg.judge)
    ctx = RolloutContext(cfg, engine, tok, reward, model_stop_token_ids(tok, str(path), r.rollout_stop_token_ids))
    thr = cfg.reward.correct_threshold
    try:
        with out.open("w") as f:
            for start in range(0, len(prompts), batch_prompts):
                chunk = prompts[start : start + batch_prompts]
                groups = generate_groups(ctx, chunk, r.n_samples_per_prompt, ctx.sampling_params())
                if kind != "kd":
                    reward.score([s for g in groups for s in g])
                for p, g in zip(chunk, groups):
                    msgs = _messages(p.prompt, system)
                    if kind == "kd":  # the teacher's completions as SFT targets (truncated ones left out)
                        for s in g:
                            if s.status.value != "truncated":
                                f.write(json.dumps({"messages": msgs + [{"role": "assistant", "content": s.response}]}))
                                f.write("\n")
                                counts["examples"] += 1
                        continue
                    if kind == "kto":
                        for s in g:
                            f.write(
                                json.dumps({"prompt": msgs, "completion": s.response, "label": bool(s.reward >= thr)})
                                + "\n"
                            )
                            counts["examples"] += 1
                        continue
                    good = list(dict.fromkeys(s.response for s in g if s.reward >= thr))
                    bad = list(dict.fromkeys(s.response for s in g if s.reward < thr))
                    if not good or not bad:
                        counts["prompts_without_pair"] += 1
                        continue
                    for c, rj in list(zip(good, bad))[:pairs_per_prompt]:
                        f.write(json.dumps({"prompt": msgs, "chosen": c, "rejected": rj}) + "\n")
                        counts["examples"] += 1
                log.info(
                    "make-data %s: %d / %d prompts, %d examples",
                    kind,
                    start + len(chunk),
                    len(prompts),
                    counts["examples"],
                )
    finally:
        reward.close()
        engine.shutdown()
    return counts
