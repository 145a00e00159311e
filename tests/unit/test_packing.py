"""Trainer layouts (train.packing): padded rows, packed sequences and shared-prompt rows compute the
same log-probs, losses and updates (fp32); their micro-batch plans respect the token budget."""

import pytest
import torch
import torch.nn.functional as F

from reinforge.config import load_config
from reinforge.models.packing import PackedAttention, shared_prompt_keys
from reinforge.records import Sample
from reinforge.train.actor import Actor, TrainData
from reinforge.train.batching import build, plan_rows, row_length
from reinforge.train.rollout_share import RolloutBatch
from reinforge.train.worker import TrainWorker

LAYOUTS = ["none", "sequences", "shared_prompt"]


def group_rollout(prompts: int = 3, group: int = 4, seed: int = 0, rewards=None) -> list[list[Sample]]:
    """``prompts`` groups of ``group`` scored samples with the same prompt, responses of 1-9 tokens, a
    tool-output span (loss mask 0) in some, and equal rewards in group 1 (zero GRPO advantages);
    ``rewards(p, k)`` instead: sample ``k`` of group ``p``'s reward."""
    g = torch.Generator().manual_seed(seed)
    groups: list[list[Sample]] = []
    for p in range(prompts):
        samples: list[Sample] = []
        prompt = torch.randint(10, 40000, (3 + 2 * p,), generator=g).tolist()
        for k in range(group):
            R = 1 + (p * 5 + k * 3) % 9
            mask = [1] * R
            if R > 4 and k % 2:
                mask[2:4] = [0, 0]
            response = torch.randint(10, 40000, (R,), generator=g).tolist()
            samples.append(
                Sample(
                    prompt="p",
                    tokens=prompt + response,
                    response_length=R,
                    loss_mask=mask,
                    rollout_log_probs=[-1.0] * R,
                    group_index=p,
                    reward=rewards(p, k) if rewards else 0.5 if p == 1 else float(torch.randn(1, generator=g)),
                )
            )
        groups.append(samples)
    return groups


def flat(groups: list[list[Sample]]) -> list[Sample]:
    return [s for group in groups for s in group]


def train_rollout(worker: TrainWorker, groups: list[list[Sample]], rollout_id: int = 0) -> dict[str, float]:
    """The trainer's one way in: the rollout scored on the worker's ranks, then its optimizer steps
    (:meth:`TrainWorker.score`, :meth:`TrainWorker.train`); the ``train/*`` metrics."""
    worker.score(RolloutBatch(groups, rollout_id))
    return worker.train(rollout_id)


DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def make_actor(path, layout: str, device: torch.device = torch.device("cpu"), **extra) -> Actor:
    o = {
        "model.path": path,
        "model.train_dtype": "fp32",
        "train.lr": 1e-2,
        "train.max_tokens_per_gpu": 40,
        "train.packing": layout,
        "train.adam_eps": 1e-3,
        "train.clip_grad": 1e9,
        "algo.entropy_coef": 0.01,
        **extra,
    }
    cfg = load_config(None, [f"{k}={v}" for k, v in o.items()])
    return Actor(cfg, path, device)


def make_worker(path, layout: str, **extra) -> TrainWorker:
    """A one-process trainer on the CPU with :func:`make_actor`'s settings."""
    o = {
        "model.path": path,
        "model.train_dtype": "fp32",
        "train.device": "cpu",
        "train.lr": 1e-2,
        "train.max_tokens_per_gpu": 40,
        "train.packing": layout,
        "train.adam_eps": 1e-3,
        "train.clip_grad": 1e9,
        "algo.entropy_coef": 0.01,
        **extra,
    }
    return TrainWorker(load_config(None, [f"{k}={v}" for k, v in o.items()]), path)


def test_layouts_give_the_same_log_probs_and_update(tiny_model_path):
    groups = group_rollout()
    results = {}
    for layout in LAYOUTS:
        worker = make_worker(tiny_model_path, layout, **{"algo.use_kl_loss": "true", "algo.kl_loss_coef": 0.1})
        lp = worker.actor.compute_log_probs(flat(groups))
        ref = worker.actor.compute_log_probs(flat(groups), reference=True)
        metrics = train_rollout(worker, groups)
        weights = {n: t.clone() for n, t in worker.named_weights()}
        results[layout] = (lp, ref, metrics, weights)
    lp0, ref0, m0, w0 = results["none"]
    assert all(len(x) == s.response_length for x, s in zip(lp0, flat(groups)))
    for layout in LAYOUTS[1:]:
        lp, ref, m, w = results[layout]
        for a, b in zip(lp0 + ref0, lp + ref):
            assert torch.allclose(a, b, atol=1e-5), layout
        for k in ("train/pg_loss", "train/kl", "train/entropy", "train/loss", "train/grad_norm"):
            assert m[k] == pytest.approx(m0[k], rel=1e-4, abs=1e-6), (layout, k)
        for n in w0:
            assert torch.allclose(w0[n], w[n], atol=1e-5), (layout, n)
    assert any(not torch.equal(w0[n], make_actor(tiny_model_path, "none").model.state_dict()[n]) for n in w0)


def test_the_actor_trains_a_scored_rollout_only(tiny_model_path):
    """Issue 54 item 3: ``Actor.train`` no longer computes missing log-probs itself (a path only tests and
    benches took); the rollout is scored first (``TrainWorker.score``), and data without the old log-probs
    that several optimizer steps need is refused in words."""
    worker = make_worker(tiny_model_path, "none", **{"train.num_steps_per_rollout": 2})
    samples = flat(group_rollout())
    data = TrainData(samples, [torch.ones(s.response_length) for s in samples], None, None, [0] * len(samples))
    with pytest.raises(ValueError, match=r"TrainData.old_log_probs is None but Config.needs_old_log_probs.*score"):
        worker.actor.train(data, 0)


def test_engine_and_every_layout_agree_in_fp32(tiny_model_path):
    """The engine's sampling log-probs equal the trainer's under each layout (fp32, < 1e-5)."""
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from reinforge.records import GenerateRequest, SamplingParams

    engine = EmbeddedEngine(
        build_model(tiny_model_path, torch.float32, DEVICE),
        EngineConfig(max_num_seqs=16, cuda_graph=False),
        max_model_len=64,
        seed=0,
    )
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(10, 40000, (5 + 3 * i,), generator=g).tolist() for i in range(3)]
    results = engine.generate(
        [GenerateRequest(p, SamplingParams(max_new_tokens=12, temperature=1.0), n=4) for p in prompts]
    )
    engine.shutdown()
    samples = [
        Sample(prompt="p", tokens=p + r.token_ids, response_length=len(r.token_ids), loss_mask=[1] * len(r.token_ids))
        for p, group in zip(prompts, results)
        for r in group
    ]
    for layout in LAYOUTS:
        lps = make_actor(tiny_model_path, layout, DEVICE).compute_log_probs(samples)
        for s, lp, r in zip(samples, lps, [r for group in results for r in group]):
            assert torch.allclose(lp, torch.tensor(r.log_probs), atol=1e-5), layout


@pytest.mark.skipif(not torch.cuda.is_available(), reason="varlen flash attention runs on CUDA in bf16")
def test_varlen_attention_matches_padded_in_bf16(tiny_model_path):
    samples = flat(group_rollout(prompts=4, group=6))
    ref = make_actor(tiny_model_path, "none", DEVICE, **{"model.train_dtype": "bf16"})
    a = torch.cat(ref.compute_log_probs(samples))
    for layout in ("sequences", "shared_prompt"):
        packed = make_actor(tiny_model_path, layout, DEVICE, **{"model.train_dtype": "bf16"})
        mb, _ = packed.rank_micro_batches(samples, list(range(len(samples))))
        assert mb[0].to(DEVICE).attention().use_varlen
        b = torch.cat(packed.compute_log_probs(samples))
        assert (a - b).abs().mean() < 2e-2 and (a - b).abs().max() < 0.25, layout


def test_plan_rows_budget_and_cover():
    samples = flat(group_rollout(prompts=4, group=5))
    tokens = [s.tokens for s in samples]
    rlen = [s.response_length for s in samples]
    idx = list(range(len(tokens)))
    for layout in LAYOUTS:
        plans = plan_rows(tokens, rlen, idx, layout, 30)
        assert sorted(i for mb in plans for row in mb for i in row) == idx
        for mb in plans:
            shared = layout == "shared_prompt"
            lengths = [row_length(tokens, rlen, row, shared) for row in mb]
            if layout == "sequences":
                assert len(mb) == 1 and (lengths[0] <= 30 or len(mb[0]) == 1)
            else:
                assert len(mb) * max(lengths) <= 30 or len(mb) == 1
            if shared:  # every row holds one prompt's samples
                for row in mb:
                    assert len({samples[i].group_index for i in row}) == 1
    # shared prompt: each group's prompt once
    plans = plan_rows(tokens, rlen, idx, "shared_prompt", 10_000)
    assert sum(row_length(tokens, rlen, row, True) for mb in plans for row in mb) == sum(rlen) + sum(
        len(samples[g[0]].tokens) - samples[g[0]].response_length
        for g in ([i for i in idx if samples[i].group_index == p] for p in range(4))
    )


def test_shared_prompt_layout_positions():
    # prompt [1, 2, 3]; responses [4, 5] and [6]: row [1 2 3 4 5 6], response 2 continues at position 3
    mb = build([[1, 2, 3, 4, 5], [1, 2, 3, 6]], [2, 1], [[1, 0], [1]], [[0, 1]], pad_id=0, shared_prompt=True)
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5, 6]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 4, 3]]
    assert mb.doc_ids.tolist() == [[0, 0, 0, 1, 1, 2]] and mb.shared.tolist() == [[True] * 3 + [False] * 3]
    # token 4 and token 6 are both predicted by the prompt's last position (2); token 5 by position 3
    assert mb.logit_cols.tolist() == [2, 3, 2]
    assert mb.targets.tolist() == [[4, 5], [6, 0]] and mb.loss_mask.tolist() == [[1, 0], [1, 0]]
    with pytest.raises(ValueError, match="same, non-empty prompt"):
        build([[1, 2, 4], [9, 2, 5]], [1, 1], [[1], [1]], [[0, 1]], pad_id=0, shared_prompt=True)


def test_attention_mask_and_cu_seqlens():
    doc = torch.tensor([[1, 1, 2, 2, 2, -1], [1, 2, 3, -1, -1, -1]])
    ctx = PackedAttention(doc)
    cu, longest = ctx.cu_seqlens()
    assert cu.tolist() == [0, 2, 5, 6, 7, 8, 9, 12] and longest == 3
    assert ctx.mask[0, 3].tolist() == [False, False, True, True, False, False]
    shared = PackedAttention(torch.tensor([[0, 0, 1, 2]]), torch.tensor([[True, True, False, False]]))
    assert shared.mask[0, 3].tolist() == [True, True, False, True]


def shared_rows() -> tuple[torch.Tensor, torch.Tensor]:
    """Two shared-prompt rows of width 9: prompt 3 + responses of 2 and 3 + padding; prompt 2 +
    responses of 1, 2 and 3 + padding."""
    doc = torch.tensor([[0, 0, 0, 1, 1, 2, 2, 2, -1], [0, 0, 1, 2, 2, 3, 3, 3, -1]])
    return doc, doc == 0


def test_shared_prompt_keys_lay_out_the_prompt_before_each_response():
    doc, shared = shared_rows()
    cu, _ = PackedAttention(doc).cu_seqlens()
    assert cu.tolist() == [0, 3, 5, 8, 9, 11, 12, 14, 17, 18]
    index, cu_k, longest = shared_prompt_keys(doc, shared, cu)
    runs = [index[a:b].tolist() for a, b in zip(cu_k[:-1], cu_k[1:])]
    assert runs == [
        [0, 1, 2],
        [0, 1, 2, 3, 4],
        [0, 1, 2, 5, 6, 7],
        [8],  # row 0: prompt, responses after it, padding
        [9, 10],
        [9, 10, 11],
        [9, 10, 12, 13],
        [9, 10, 14, 15, 16],
        [17],
    ]
    assert longest == 6 and cu_k.dtype == torch.int32
    # shared positions that are not a prefix of their row: no layout (the caller masks)
    assert shared_prompt_keys(doc, torch.roll(shared, 1, dims=1), cu) is None


def test_shared_prompt_keys_give_the_masked_attention():
    """Attention over each query run and its gathered keys, causal aligned to the bottom right
    (flash attention's rule for more keys than queries), equals the [T, T] mask at every
    non-padding position (the GPU test below runs the kernel itself)."""
    doc, shared = shared_rows()
    B, T, H, D = 2, doc.shape[1], 2, 8
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, T, H, D, generator=g) for _ in range(3))
    ref = PackedAttention(doc, shared).attend(0, q, k, v).reshape(B * T, H, D)
    cu, _ = PackedAttention(doc).cu_seqlens()
    index, cu_k, _ = shared_prompt_keys(doc, shared, cu)
    qf, kf, vf = q.reshape(B * T, H, D), k.reshape(B * T, H, D)[index], v.reshape(B * T, H, D)[index]
    for s in range(len(cu) - 1):
        a, b, c, e = cu[s], cu[s + 1], cu_k[s], cu_k[s + 1]
        Lq, Lk = int(b - a), int(e - c)
        allowed = torch.arange(Lk)[None, :] <= torch.arange(Lq)[:, None] + (Lk - Lq)
        o = F.scaled_dot_product_attention(
            qf[a:b].transpose(0, 1), kf[c:e].transpose(0, 1), vf[c:e].transpose(0, 1), attn_mask=allowed
        ).transpose(0, 1)
        if doc.flatten()[a] >= 0:
            assert torch.allclose(o, ref[a:b], atol=1e-5), s


@pytest.mark.skipif(not torch.cuda.is_available(), reason="varlen flash attention runs on CUDA in bf16")
def test_shared_prompt_varlen_kernel_matches_the_mask():
    """The varlen kernel over gathered prompt keys (forward and gradients) against the masked path."""
    doc, shared = (x.to(DEVICE) for x in shared_rows())
    B, T, H, KVH, D = 2, doc.shape[1], 4, 2, 64
    g = torch.Generator(device=DEVICE).manual_seed(0)
    inputs = [torch.randn(B, T, h, D, generator=g, device=DEVICE, dtype=torch.bfloat16) for h in (H, KVH, KVH)]
    outs, grads = [], []
    for varlen in (True, False):
        x = [t.clone().requires_grad_() for t in inputs]
        ctx = PackedAttention(doc, shared, varlen=varlen)
        assert ctx.use_varlen == varlen
        o = ctx.attend(0, *x)
        keep = (doc >= 0)[..., None, None]
        (o.float() * keep).square().sum().backward()
        outs.append(o * keep)
        grads.append([t.grad for t in x])

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:  # bf16 rounding: about 4e-3 of the norm
        return float((a.float() - b.float()).norm() / b.float().norm())

    assert rel(outs[0], outs[1]) < 1e-2
    for a, b in zip(grads[0], grads[1]):
        assert rel(a, b) < 1e-2


def test_hugging_face_model_refuses_packing(tmp_path, tiny_model_path):
    from reinforge.train.step import ModelInput, response_outputs

    mb = build([[1, 2, 3], [1, 2, 4]], [1, 1], [[1], [1]], [[0, 1]], pad_id=0)
    with pytest.raises(ValueError, match="train.packing=none"):
        inp = ModelInput(mb.input_ids, None, None, (mb.logit_rows, mb.logit_cols))
        response_outputs(torch.nn.Linear(1, 1), mb, inp)


@pytest.mark.slow
def test_compiled_layers_give_the_same_log_probs_and_update(tiny_model_path):
    """model.torch_compile: the same log-probs, loss and weights as eager (fp32), names unchanged."""
    groups = group_rollout()
    out = {}
    for compiled in (False, True):
        worker = make_worker(tiny_model_path, "none", **{"model.torch_compile": str(compiled).lower()})
        assert (worker.actor.model.model.layers[0]._compiled_call_impl is not None) == compiled
        lp = worker.actor.compute_log_probs(flat(groups))
        metrics = train_rollout(worker, groups)
        out[compiled] = (lp, metrics, {n: t.clone() for n, t in worker.named_weights()})
    (lp0, m0, w0), (lp1, m1, w1) = out[False], out[True]
    assert list(w0) == list(w1)
    for a, b in zip(lp0, lp1):
        assert torch.allclose(a, b, atol=1e-5)
    assert m1["train/loss"] == pytest.approx(m0["train/loss"], rel=1e-4, abs=1e-6)
    for n in w0:
        assert torch.allclose(w0[n], w1[n], atol=1e-5), n
