"""The embedded LLM judge (``judge.model_path``, docs/agents.md#llm-as-judge-rewards) on a few
hand-written samples: what the judge answers, what the score parser reads, how many parse.

Eight arithmetic questions, each with a right and a wrong response (16 samples), are scored through the
reward manager as a run scores them: one batched engine call, greedy, the judge's chat template. Prints a
table (question, response, label, the end of the judge's answer, the score or the failure kind), the
counts and the wall time; scoring the same samples again shows the cache (no engine call). Overrides of
the ``reward`` and ``judge`` sections follow the options (``judge.template=...``).

    python bench/judge_embedded.py                       # SmolLM2-135M-Instruct on this machine's device
    python bench/judge_embedded.py --judge ~/models/Qwen3-0.6B train.device=cuda
"""

from __future__ import annotations

import argparse
import time

from reinforge.config import load_config
from reinforge.records import Sample, Status
from reinforge.reward.manager import RewardManager

CASES = [
    ("What is 7 + 5?", "12", "12", "3"),
    ("What is 9 * 6?", "54", "54", "45"),
    ("What is 100 - 37?", "63", "63", "73"),
    ("What is 144 / 12?", "12", "12", "14"),
    ("What is the capital of France?", "Paris", "Paris", "Berlin"),
    ("How many legs does a spider have?", "8", "8", "6"),
    ("What is 2 to the power of 10?", "1024", "1024", "512"),
    ("Is 17 a prime number? Answer yes or no.", "yes", "yes", "no"),
]


def samples() -> list[Sample]:
    out = []
    for q, label, right, wrong in CASES:
        for response in (right, wrong):
            out.append(
                Sample(
                    prompt=q,
                    tokens=[1],
                    response_length=1,
                    response=response,
                    label=label,
                    index=len(out),
                    loss_mask=[1],
                )
            )
    return out


def cell(text: str, n: int = 60) -> str:
    text = " ".join(text.split()).replace("|", "\\|")
    return text if len(text) <= n else "..." + text[-(n - 3) :]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--judge", default="smollm2-135m-instruct", help="judge.model_path")
    ap.add_argument("overrides", nargs="*", help="config overrides (reward.*, judge.*, train.device, engine.*)")
    args = ap.parse_args()
    cfg = load_config(
        None, ["reward.type=judge", f"judge.model_path={args.judge}", "data.n_eval_prompts=0", *args.overrides]
    )
    t = time.perf_counter()
    mgr = RewardManager(cfg.reward, run=cfg)
    build_s = time.perf_counter() - t
    batch = samples()
    t, c = time.perf_counter(), time.process_time()
    counts = mgr.score(batch)
    score_s, score_cpu = time.perf_counter() - t, time.process_time() - c
    eng = mgr.judge.engine
    print("| question | response | label | judge's answer (end) | score |")
    print("| --- | --- | --- | --- | --- |")
    for s in batch:
        answer = s.reward_info.get("judge_answer", "")
        score = f"failed: {cell(s.reward_info['reward_failure'], 45)}" if s.status == Status.FAILED else f"{s.reward:g}"
        print(f"| {cell(str(s.prompt), 40)} | {s.response} | {s.label} | {cell(answer)} | {score} |")
    ok = [s for s in batch if s.status != Status.FAILED]
    right = [s.reward for s in ok if s.response == s.label]
    wrong = [s.reward for s in ok if s.response != s.label]
    mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
    print(
        f"\n{len(ok)} of {len(batch)} parsed (judge_unparseable {counts['reward/judge_unparseable']:g}, "
        f"judge_errors {counts['reward/judge_errors']:g}); mean score of right responses {mean(right):.2f}, "
        f"of wrong ones {mean(wrong):.2f}; engine calls {eng.calls} ({eng.prompt_tokens} prompt tokens, "
        f"{eng.answer_tokens} answer tokens); judge built in {build_s:.1f} s, 16 samples scored in {score_s:.1f} s "
        f"({score_cpu:.1f} s of CPU time in this process) on {eng.spec.device}, {eng.spec.engine.max_num_seqs} slots "
        f"of {eng.spec.max_len} tokens"
    )
    t = time.perf_counter()
    mgr.score(samples())
    print(
        f"the same 16 again: {time.perf_counter() - t:.2f} s, engine calls {mgr.judge.engine.calls} "
        f"(parsed ones from the cache)"
    )
    mgr.close()


if __name__ == "__main__":
    main()
