"""LoRA: only adapters train, the engine gets exactly the merged model, the reference is the base,
checkpoints hold the adapter (a PEFT folder), and several FSDP ranks equal one process."""

import copy
import json
from unittest import mock

import pytest
import torch
from torch import nn

from reinforge.config import load_config
from reinforge.loop import RLLoop
from reinforge.records import GenerateRequest, SamplingParams
from tests.integration.test_integration import tiny_overrides

LORA = {
    "model.lora_rank": 4,
    "model.lora_alpha": 8,
    "train.lr": 5e-2,
    "engine.dtype": "fp32",
    "model.train_dtype": "fp32",
    "reward.type": "custom",
    "reward.function_path": "tests.reward_fns:even_token_share",
    "data.n_eval_prompts": 0,
}


def test_engine_gets_the_merged_model_after_a_step(tmp_path, tiny_model_path):
    loop = RLLoop(
        load_config(
            None,
            tiny_overrides(
                tiny_model_path,
                tmp_path / "run",
                **LORA,
                **{"algo.use_kl_loss": "true", "algo.kl_loss_coef": 0.01, "train.num_rollout": 1},
            ),
        )
    )
    actor = loop.cluster.worker.actor
    trainable = {n for n, p in actor.model.named_parameters() if p.requires_grad}
    assert trainable and all(".lora_" in n for n in trainable)
    optimised = {id(p) for g in actor.optimizer.param_groups for p in g["params"]}
    assert optimised == {id(p) for n, p in actor.model.named_parameters() if n in trainable}
    base = {n: t.clone() for n, t in actor.named_weights()}

    loop.rollout_step(0)  # GRPO step, then weight sync of the merged weights
    merged = dict(actor.named_weights())
    assert set(merged) == set(base) and not any(".lora_" in n or "base_layer" in n for n in merged)
    assert any(not torch.equal(merged[n], base[n]) for n in merged), "the step changed nothing"

    params = SamplingParams(max_new_tokens=12, temperature=1.0, stop_token_ids=[])
    prompt = loop.train_data.next_batch(1)[0]
    result = loop.engine.generate([GenerateRequest(prompt.prompt_ids, params, n=4)])[0]
    from reinforge.records import Sample

    samples = [
        Sample(
            prompt="",
            tokens=prompt.prompt_ids + r.token_ids,
            response_length=len(r.token_ids),
            loss_mask=[1] * len(r.token_ids),
        )
        for r in result
    ]
    trainer_lp = actor.compute_log_probs(samples)
    for r, lp in zip(result, trainer_lp):  # fp32 engine vs the trainer's (unmerged) LoRA forward
        assert torch.allclose(torch.tensor(r.log_probs), lp.cpu(), atol=1e-5)
    # the reference is the base model: adapters off, no second copy
    assert actor.ref is None
    from reinforge.models.loading import build_model

    plain = build_model(tiny_model_path)
    for n, t in base.items():
        assert torch.equal(t.cpu(), dict(plain.named_parameters())[n].detach())
    ref_lp = actor.compute_log_probs(samples, reference=True)
    from reinforge.models.loading import model_logits

    with torch.no_grad():
        ids = torch.tensor([samples[0].tokens])
        want = torch.log_softmax(model_logits(plain, ids)[0, :-1].float(), -1)
        want = want.gather(-1, ids[0, 1:, None]).squeeze(-1)[-samples[0].response_length :]
    assert torch.allclose(ref_lp[0].cpu(), want, atol=1e-5)
    loop.close()


def test_checkpoint_adapter_loads_with_peft_and_matches_the_merged_folder(tmp_path, tiny_model_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from reinforge.cli import main
    from reinforge.loop import run_training

    out = tmp_path / "run"
    run_training(load_config(None, tiny_overrides(tiny_model_path, out, **LORA, **{"train.num_rollout": 1})))
    ckpt = next((out / "checkpoints").glob("rollout_*"))
    assert json.loads((ckpt / "adapter" / "adapter_config.json").read_text())["r"] == 4
    assert (
        main(
            [
                "convert",
                "--checkpoint",
                str(out),
                "--out",
                str(tmp_path / "merged"),
                "--dtype",
                "float32",
                "--adapter-out",
                str(tmp_path / "adapter"),
            ]
        )
        == 0
    )
    ids = torch.tensor([[1, 250, 3000, 42, 7, 99]])
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "merged", dtype=torch.float32)
    peft_model = PeftModel.from_pretrained(
        AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32), tmp_path / "adapter"
    )
    base = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    with torch.no_grad():
        a, b, c = merged(ids).logits, peft_model(ids).logits, base(ids).logits
    assert torch.allclose(a, b, atol=1e-4)
    assert not torch.allclose(a, c, atol=1e-4)  # the adapter is in both, and it changed the model


def test_offline_dpo_with_lora_uses_the_base_as_reference(tmp_path, tiny_model_path):
    from reinforge.offline_loop import OfflineLoop
    from tests.integration.test_offline import offline_overrides, write_data

    files = write_data(tmp_path, n=6)
    loop = OfflineLoop(
        load_config(
            None,
            offline_overrides(
                tiny_model_path,
                tmp_path / "run",
                files["pairs"],
                "dpo",
                **{"model.lora_rank": 4, "offline.precompute_ref_log_probs": "false", "train.lr": 5e-2},
            ),
        )
    )
    assert loop.trainer.ref is None
    before = loop.trainer.sequence_stats(loop.train_set.examples, reference=True)[0]
    loop.trainer.step(loop.train_set.examples, loop.step_ids(0), None)
    policy = loop.trainer.sequence_stats(loop.train_set.examples, reference=False)[0]
    after = loop.trainer.sequence_stats(loop.train_set.examples, reference=True)[0]
    assert torch.allclose(torch.tensor(before), torch.tensor(after), atol=1e-5)  # the base did not move
    assert not torch.allclose(torch.tensor(policy), torch.tensor(after), atol=1e-3)  # the policy did
    loop.close()


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_lora_two_ranks_equal_one_process(tiny_model_path, dtype):
    """bf16: FSDP2's mixed precision over a frozen base held in bf16 and fp32 adapters in one unit."""
    from tests.integration.test_distributed import make_cfg, make_data, run_ranks

    cfg = make_cfg(tiny_model_path, **{"model.lora_rank": 4, "model.lora_alpha": 8, "model.train_dtype": dtype})
    data = make_data(9)
    (m1, w1), (m2, w2) = run_ranks(1, cfg, tiny_model_path, data), run_ranks(2, cfg, tiny_model_path, data)
    assert m1[0]["train/loss"] == pytest.approx(m2[0]["train/loss"], rel=1e-4 if dtype == "fp32" else 1e-3)
    assert set(w1) == set(w2) and not any("lora" in n for n in w1)
    for n in w1:
        assert torch.allclose(w1[n], w2[n], atol=2e-5 if dtype == "fp32" else 1e-2), n


@pytest.mark.parametrize("model_type", ["llama", "qwen3_moe"])
def test_frozen_base_held_in_bf16_trains_bit_for_bit_as_fp32(tmp_path, smollm2_path, model_type):
    """Under bf16 autocast the frozen base's matmul weights (Linear layers, the routed experts) held in
    bf16 give the same loss and adapter gradients, bit for bit, as held in fp32 (autocast casts them
    anyway); embeddings, norms and the adapters stay fp32; the merged weights are the fp32 merge
    rounded once."""
    from reinforge.models.loading import build_model
    from reinforge.models.lora import apply_lora, hold_frozen_weights, merged_named_weights
    from reinforge.models.moe import Experts
    from tests.conftest import make_tiny_model
    from tests.integration.test_moe import make_tiny_moe

    path = (
        make_tiny_moe(tmp_path, smollm2_path, model_type)
        if "moe" in model_type
        else make_tiny_model(tmp_path, smollm2_path)
    )
    targets = ["q_proj", "v_proj", "gate_proj", "up_proj"] if model_type == "llama" else ["q_proj", "v_proj"]
    model = apply_lora(build_model(path), 4, 8, 0.0, targets)
    for n, p in model.named_parameters():  # B starts at zero: a value, so that the merge means something
        if ".lora_B" in n:
            p.data.normal_(0, 0.02)
    models = [model, copy.deepcopy(model)]
    fp32_bytes = sum(p.numel() * p.element_size() for p in models[1].parameters())
    freed = hold_frozen_weights(models[1], torch.bfloat16)
    assert 0 < freed < fp32_bytes / 2 and freed == fp32_bytes - sum(
        p.numel() * p.element_size() for p in models[1].parameters()
    )
    dtypes = {n: p.dtype for n, p in models[1].named_parameters()}
    assert all(dtypes[n] == torch.float32 for n in dtypes if ".lora_" in n or "norm" in n or "embed" in n)
    assert all(dtypes[n] == torch.bfloat16 for n in dtypes if n.endswith("base_layer.weight"))
    experts = [m for m in models[1].modules() if isinstance(m, Experts)]
    assert all(e.gate_up_proj.dtype == torch.bfloat16 for e in experts) and bool(experts) == ("moe" in model_type)
    # build_model(matmul_dtype=bf16) makes them so directly (no fp32 copy first): the same tensors
    direct = apply_lora(build_model(path, matmul_dtype=torch.bfloat16), 4, 8, 0.0, targets)
    held = dict(models[1].named_parameters())
    for n, p in direct.named_parameters():
        assert p.dtype == held[n].dtype, n  # (peft makes the adapters fp32 on a bf16 base too)
        assert ".lora_" in n or torch.equal(p, held[n]), n
    assert hold_frozen_weights(direct, torch.bfloat16) == 0
    rand = build_model(path, random_init=True, matmul_dtype=torch.bfloat16)
    assert {n: p.dtype for n, p in rand.named_parameters()} == {
        n.replace(".base_layer", ""): d for n, d in dtypes.items() if ".lora_" not in n
    }
    # random weights drawn in any dtype are the fp32 draw rounded: trainer (bf16 base) and engine (bf16)
    # of one seed hold the same model, and neither allocates the whole model in fp32 first
    allocated = []  # the dtypes to_empty allocates: a 30B model's fp32 copy first did not fit one H200
    to_empty = nn.Module.to_empty

    def recording(module, *, device, recurse=True):
        allocated.extend(p.dtype for p in module.parameters())
        return to_empty(module, device=device, recurse=recurse)

    with mock.patch.object(nn.Module, "to_empty", recording):
        engine = dict(build_model(path, torch.bfloat16, random_init=True).named_parameters())
    assert set(allocated) == {torch.bfloat16}
    full = dict(build_model(path, random_init=True).named_parameters())
    for n, p in rand.named_parameters():
        assert torch.equal(p, full[n].to(p.dtype)) and torch.equal(engine[n], full[n].bfloat16()), n

    ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(0))
    losses, grads = [], []
    for m in models:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = m(ids)
        loss = torch.log_softmax(logits.float(), -1)[:, :-1].gather(-1, ids[:, 1:, None]).mean()
        loss.backward()
        losses.append(loss.detach())
        grads.append({n: p.grad.clone() for n, p in m.named_parameters() if p.requires_grad})
    assert torch.equal(losses[0], losses[1])
    assert grads[0].keys() == grads[1].keys() and all(torch.equal(grads[0][n], grads[1][n]) for n in grads[0])

    want = dict(merged_named_weights(models[0]))
    got = dict(merged_named_weights(models[1]))
    assert want.keys() == got.keys()
    for n, t in got.items():
        assert torch.allclose(t.float(), want[n], rtol=1e-2, atol=1e-3), n


def test_lora_rollout_step_with_bf16_autocast_holds_the_base_in_bf16(tmp_path, tiny_model_path):
    """A GRPO step with LoRA under bf16 autocast (``model.train_dtype=bf16``; on a GPU the default):
    the frozen base is held in bf16, the adapters train, weight sync and the checkpoint's adapter
    folder are written."""
    overrides = tiny_overrides(
        tiny_model_path, tmp_path / "run", **{**LORA, "model.train_dtype": "bf16", "train.num_rollout": 1}
    )
    loop = RLLoop(load_config(None, overrides))
    actor = loop.cluster.worker.actor
    held = {n: p.dtype for n, p in actor.model.named_parameters()}
    assert {held[n] for n in held if n.endswith("base_layer.weight")} == {torch.bfloat16}
    assert {held[n] for n in held if ".lora_" in n} == {torch.float32}
    before = {n: t.float().clone() for n, t in actor.named_weights()}
    loop.rollout_step(0)  # GRPO step, then weight sync of the merged weights
    after = dict(actor.named_weights())
    assert any(not torch.equal(after[n].float(), before[n]) for n in after), "the step changed nothing"
    ckpt = loop.driver.save(0)
    assert json.loads((ckpt / "adapter" / "adapter_config.json").read_text())["r"] == 4
    loop.close()
