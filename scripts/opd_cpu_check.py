"""On-policy distillation on the CPU with a real model: does the exact reverse KL on held-out prompts fall?

Student = a model (default SmolLM2-135M-Instruct), teacher = the same model with its final norm's weight times
``--teacher-scale`` (its logits times that: temperature 1 / scale). Each step samples ``--samples`` completions
of ``--max-new`` tokens for each of 4 training prompts from the student, scores them with the teacher, takes the
advantage of :func:`reinforge.algo.distill.distill_advantages` (``log p_teacher - log p_student``, discount 0) and
one AdamW step on ``-mean(advantage * log p_student)`` (the PPO loss at ratio 1, token mean). After each step it
prints the exact reverse KL ``sum_v s(v) (log s(v) - log t(v))`` averaged over the positions of fixed-seed
student samples on 4 held-out prompts (no sampling noise in the metric beyond the fixed samples).

    PYTHONPATH=. python scripts/opd_cpu_check.py --steps 5 --lr 1e-5        # docs/distillation.md's numbers
    PYTHONPATH=. python scripts/opd_cpu_check.py --exact                    # the full-vocabulary loss instead
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F
from transformers import AutoModelForCausalLM, AutoTokenizer

from reinforge.algo.distill import distill_advantages
from reinforge.models.hub import resolve_model_path

TRAIN = ["What is 2+3?", "Name a colour.", "What is the capital of France?", "Say hello."]
HELD_OUT = ["What is 7+1?", "Name an animal.", "What is the capital of Spain?", "Say goodbye."]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--teacher-scale", type=float, default=2.0)
    ap.add_argument("--lr", type=float, default=1e-5)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--samples", type=int, default=4, help="completions per training prompt and step")
    ap.add_argument("--max-new", type=int, default=8)
    ap.add_argument("--exact", action="store_true", help="train on the exact full-vocabulary reverse KL instead")
    a = ap.parse_args()
    path = resolve_model_path(a.model)
    tok = AutoTokenizer.from_pretrained(path)
    student = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    teacher = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval().requires_grad_(False)
    with torch.no_grad():
        teacher.model.norm.weight.mul_(a.teacher_scale)

    def encode(questions: list[str]) -> torch.Tensor:
        ids = [tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True) for q in questions]
        ids = [i if isinstance(i, list) else i["input_ids"] for i in ids]
        n = min(len(i) for i in ids)  # (left-cut to one length: no padding needed)
        return torch.tensor([i[-n:] for i in ids])

    train, held = encode(TRAIN), encode(HELD_OUT)

    @torch.no_grad()
    def sample(prompts: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        ids = prompts
        for _ in range(a.max_new):
            nxt = torch.multinomial(F.softmax(student(ids).logits[:, -1], -1), 1, generator=gen)
            ids = torch.cat([ids, nxt], 1)
        return ids

    def log_probs(model: torch.nn.Module, ids: torch.Tensor, p: int) -> torch.Tensor:
        return model(ids).logits[:, p - 1 : -1].log_softmax(-1)  # [B, max_new, V]: those of the response tokens

    def held_out_kl() -> float:
        ids = sample(held.repeat(2, 1), torch.Generator().manual_seed(123))
        with torch.no_grad():
            s, t = log_probs(student, ids, held.shape[1]), log_probs(teacher, ids, held.shape[1])
            return float((s.exp() * (s - t)).sum(-1).mean())

    opt = torch.optim.AdamW(student.parameters(), lr=a.lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(7)
    print(f"step 0 held-out reverse KL {held_out_kl():.4f}", flush=True)
    for step in range(1, a.steps + 1):
        t0 = time.time()
        ids = sample(train.repeat(a.samples, 1), gen)
        p = train.shape[1]
        lp_all = log_probs(student, ids, p)
        targets = ids[:, p:, None]
        lp = lp_all.gather(-1, targets)[..., 0]
        with torch.no_grad():
            t_all = log_probs(teacher, ids, p)
        if a.exact:
            loss = (lp_all.exp() * (lp_all - t_all)).sum(-1).mean()
        else:
            mask = torch.ones_like(lp)
            adv = distill_advantages(t_all.gather(-1, targets)[..., 0], lp.detach(), mask, mask)
            loss = -(adv * lp).mean()
        sampled = float((lp.detach() - t_all.gather(-1, targets)[..., 0]).mean())
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(
            f"step {step} rollout reverse KL (k1) {sampled:.4f} held-out reverse KL {held_out_kl():.4f} "
            f"({time.time() - t0:.0f} s)",
            flush=True,
        )


if __name__ == "__main__":
    main()
