"""Offline post-training: data checks, every method end to end, reward models, multi-rank equality."""

import json
import random

import pytest
import torch

from reinforge.config import load_config
from reinforge.data.offline import Tokenizer, build_examples, read_rows
from reinforge.data.sources import DataError
from reinforge.models.loading import load_tokenizer
from reinforge.offline_loop import run_offline
from tests.ranks import spawn_ranks

METHODS = ["sft", "rm", "dpo", "ipo", "cpo", "simpo", "orpo", "kto"]


def write_data(d, n=24, seed=0):
    rng = random.Random(seed)
    pairs, sft, kto = d / "pairs.jsonl", d / "sft.jsonl", d / "kto.jsonl"
    with pairs.open("w") as fp, sft.open("w") as fs, kto.open("w") as fk:
        for i in range(n):
            a, b = rng.randint(1, 30), rng.randint(1, 30)
            q = f"What is {a} + {b}?"
            wrong = a + b + rng.randint(1, 9)
            fp.write(
                json.dumps(
                    {
                        "prompt": q,
                        "chosen": f"<answer>{a + b}</answer>",
                        "rejected": f"The answer is {wrong}, I think" + " really" * (i % 5),
                    }
                )
                + "\n"
            )
            fs.write(
                json.dumps(
                    {
                        "messages": [
                            {"role": "user", "content": q},
                            {"role": "assistant", "content": f"<answer>{a + b}</answer>"},
                            {"role": "user", "content": "Doubled?"},
                            {"role": "assistant", "content": f"<answer>{2 * (a + b)}</answer>"},
                        ]
                    }
                )
                + "\n"
            )
            fk.write(
                json.dumps(
                    {"prompt": q, "completion": f"<answer>{a + b if i % 2 else wrong}</answer>", "label": bool(i % 2)}
                )
                + "\n"
            )
    return {"pairs": pairs, "sft": sft, "kto": kto}


def data_for(method, files):
    return files["sft"] if method == "sft" else files["kto"] if method == "kto" else files["pairs"]


def offline_overrides(model, out, data, method, **extra):
    o = [
        f"model.path={model}",
        f"run.output_dir={out}",
        f"offline.method={method}",
        f"offline.train_data={data}",
        "offline.global_batch_size=6",
        "train.lr=1e-3",
        "train.max_tokens_per_gpu=200",
        "run.progress=false",
        "run.tensorboard=false",
    ]
    return o + [f"{k}={v}" for k, v in extra.items()]


# ---------------------------------------------------------------------------- data


def test_bad_input_names_file_line_and_key(tmp_path, smollm2_path):

    tok = Tokenizer(load_tokenizer(smollm2_path), None)
    cfg = load_config(None, ["offline.method=dpo"])
    f = tmp_path / "bad.jsonl"
    f.write_text(
        json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"})
        + "\n\n"
        + json.dumps({"prompt": "a", "chosen": "b", "rejected": None})
        + "\n"
    )
    with pytest.raises(
        DataError,
        match=r"bad.jsonl:3: no pairs format fits this row \(its keys: \['chosen', "
        r"'prompt'\]\); expected preference: 'prompt', 'chosen', 'rejected'",
    ):
        build_examples(read_rows(f), str(f), tok, cfg.offline)
    f.write_text('{"prompt": "a", "chosen": "b", "rejected": "c"}\n{"prompt": "a", oops}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: not valid JSON"):
        read_rows(f)


def test_identical_pairs_skipped_and_long_examples_counted(tmp_path, smollm2_path):

    tok = Tokenizer(load_tokenizer(smollm2_path), None)
    f = tmp_path / "p.jsonl"
    rows = [
        {"prompt": "q", "chosen": "same", "rejected": "same"},
        {"prompt": "q", "chosen": "short", "rejected": "long " * 80},
        {"prompt": "q", "chosen": "yes", "rejected": "no"},
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    drop = build_examples(read_rows(f), "p", tok, load_config(None, ["offline.max_length=60"]).offline)
    assert drop.counts == {"dropped_too_long": 1, "truncated": 0, "identical_pairs": 1} and len(drop.examples) == 1
    cut = build_examples(
        read_rows(f),
        "p",
        tok,
        load_config(
            None, ["offline.max_length=60", "offline.truncation=truncate", "offline.max_prompt_length=20"]
        ).offline,
    )
    assert cut.counts["truncated"] == 1 and len(cut.examples) == 2
    assert all(len(e.prompt_ids) + len(r) <= 60 for e in cut.examples for r in e.responses)


@pytest.mark.parametrize("response", ["\n\n<answer>42</answer>", " 42", "\n", "42"])
def test_response_tokens_separate_from_the_prompt(smollm2_path, response):
    """A response whose first characters would merge with the prompt's last token (make-data wrote
    such model outputs) keeps its own tokens: prompt ids + response ids decode to the whole chat."""
    hf_tok = load_tokenizer(smollm2_path)
    tok = Tokenizer(hf_tok, "Answer.")
    p, r = tok.prompt_and_response("What is 6 * 7?", response, "x.jsonl:1")
    assert p == hf_tok(tok.render(tok.messages("What is 6 * 7?"), True), add_special_tokens=False)["input_ids"]
    full = tok.render(tok.messages("What is 6 * 7?") + [{"role": "assistant", "content": response}], False)
    assert hf_tok.decode(p + r) == full and hf_tok.decode(r).startswith(response)


def test_sft_loss_mask_covers_assistant_turns_only(tmp_path, smollm2_path):

    hf_tok = load_tokenizer(smollm2_path)
    files = write_data(tmp_path, n=2)
    ds = build_examples(
        read_rows(files["sft"]), "sft", Tokenizer(hf_tok, None), load_config(None, ["offline.method=sft"]).offline
    )
    e = ds.examples[0]
    trained = hf_tok.decode([t for t, m in zip(e.responses[0], e.loss_masks[0]) if m])
    masked = hf_tok.decode([t for t, m in zip(e.responses[0], e.loss_masks[0]) if not m])
    assert "<answer>" in trained and "Doubled?" not in trained and trained.count("<|im_end|>") == 2
    assert "Doubled?" in masked and "user" in masked


# ---------------------------------------------------------------------------- every method


@pytest.mark.parametrize("method", METHODS)
def test_method_trains_and_checkpoints(tmp_path, tiny_model_path, method):
    files = write_data(tmp_path)
    cfg = load_config(
        None,
        offline_overrides(
            tiny_model_path,
            tmp_path / "run",
            data_for(method, files),
            method,
            **{"offline.eval_fraction": 0.25, "offline.num_epochs": 2},
        ),
    )
    evals = run_offline(cfg)
    assert [label for label, _ in evals] == ["before", "after"]
    before, after = evals[0][1], evals[1][1]
    assert all(torch.isfinite(torch.tensor(v)) for v in after.values())
    assert after["eval/loss"] != before["eval/loss"]
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert sum("train/loss" in r for r in rows) == 2 * 3  # 18 examples / batch 6 = 3 steps per epoch
    model_dir = next((tmp_path / "run" / "checkpoints").glob("step_*")) / "model"
    assert (model_dir / "config.json").is_file()
    assert (tmp_path / "run" / "curves.png").is_file() and (tmp_path / "run" / "eval_table.txt").is_file()


def test_dpo_learns_the_preference(tmp_path, tiny_model_path):
    """The implicit reward margin and accuracy on the training pairs rise (a test that can fail)."""
    files = write_data(tmp_path, n=12)
    cfg = load_config(
        None,
        offline_overrides(
            tiny_model_path,
            tmp_path / "run",
            files["pairs"],
            "dpo",
            **{"offline.eval_data": files["pairs"], "offline.num_epochs": 4, "offline.beta": 0.5, "train.lr": 3e-3},
        ),
    )
    before, after = (m for _, m in run_offline(cfg))
    assert after["eval/rewards/margin"] > before["eval/rewards/margin"] + 0.5
    assert after["eval/rewards/accuracy"] >= 0.9


def test_reward_model_loads_in_transformers_and_scores_rl(tmp_path, tiny_model_path):
    from transformers import AutoModelForSequenceClassification

    from reinforge.models.reward_model import build_reward_model

    files = write_data(tmp_path)
    run_offline(load_config(None, offline_overrides(tiny_model_path, tmp_path / "rm", files["pairs"], "rm")))
    folder = next((tmp_path / "rm" / "checkpoints").glob("step_*")) / "model"
    ids = torch.tensor([[1, 200, 300, 400, 2, 2], [1, 500, 2, 2, 2, 2], [1, 200, 300, 400, 500, 600]])
    ours = build_reward_model(folder)(ids)
    hf = AutoModelForSequenceClassification.from_pretrained(folder, dtype=torch.float32)
    assert torch.allclose(ours, hf(ids).logits.squeeze(-1), atol=1e-4)
    from reinforge.cli import main

    assert (
        main(["convert", "--checkpoint", str(tmp_path / "rm"), "--out", str(tmp_path / "export"), "--dtype", "float32"])
        == 0
    )
    exported = AutoModelForSequenceClassification.from_pretrained(tmp_path / "export", dtype=torch.float32)
    assert torch.allclose(ours, exported(ids).logits.squeeze(-1), atol=1e-4)
    # SFT -> RM -> GRPO: the RL loop with reward.type=model
    from reinforge.loop import run_training
    from tests.integration.test_integration import read_metrics, tiny_overrides

    out = tmp_path / "grpo"
    run_training(
        load_config(
            None,
            tiny_overrides(
                tiny_model_path,
                out,
                **{
                    "reward.type": "model",
                    "reward.model_path": folder,
                    "data.n_eval_prompts": 0,
                    "run.save_final": "false",
                },
            ),
        )
    )
    rewards = [r["rollout/reward_mean"] for r in read_metrics(out) if "rollout/reward_mean" in r]
    assert len(rewards) == 2 and all(r != 0.0 for r in rewards)


def test_make_data_pairs_kto_sft(tmp_path, tiny_model_path):
    from reinforge.cli import main
    from tests.reward_fns import __name__ as fns  # noqa: F401  (custom reward below)

    common = [
        f"model.path={tiny_model_path}",
        "data.prompt_data=reasoning_gym:basic_arithmetic",
        "data.num_prompts=16",
        "rollout.n_samples_per_prompt=4",
        "rollout.rollout_max_response_len=6",
        "reward.type=custom",
        "reward.function_path=tests.reward_fns:even_first_token",
    ]
    for kind in ("pairs", "kto", "sft"):
        out = tmp_path / f"{kind}.jsonl"
        assert main(["make-data", kind, "--out", str(out), "--num-prompts", "8", *common]) == 0
        rows = [json.loads(line) for line in out.read_text().splitlines()]
        assert rows, kind
        keys = {
            "pairs": {"prompt", "chosen", "rejected"},
            "kto": {"prompt", "completion", "label"},
            "sft": {"messages"},
        }[kind]
        assert set(rows[0]) == keys
    assert all(
        r["chosen"] != r["rejected"] for r in map(json.loads, (tmp_path / "pairs.jsonl").read_text().split("\n")[:-1])
    )


# ---------------------------------------------------------------------------- several ranks


def _rank(rank, world, port, overrides, queue):
    cfg = load_config(None, overrides)
    evals = run_offline(cfg, rank=rank, world_size=world, master_addr="127.0.0.1", master_port=port)
    if rank == 0:
        queue.put(evals)


def run_ranks(world, overrides, timeout=240):
    return spawn_ranks(_rank, world, (overrides,), timeout)


def _weights(run_dir):
    from safetensors.torch import load_file

    folder = next((run_dir / "checkpoints").glob("step_*")) / "model"
    return load_file(str(folder / "model.safetensors"))


# Uneven work per rank: 7 examples per step over 2 ranks; adam_eps large keeps updates proportional
# to the gradient (see tests/integration/test_distributed.py), so equal weights mean equal gradients.
EQ = {
    "offline.global_batch_size": 7,
    "train.lr": 1e-2,
    "train.adam_eps": 1e-3,
    "train.clip_grad": 1e9,
    "offline.eval_data": "null",
    "eval.eval_before_train": "false",
    "train.max_tokens_per_gpu": 120,
}


@pytest.mark.parametrize(
    "method,extra", [(m, {}) for m in METHODS] + [("dpo", {"offline.precompute_ref_log_probs": "false"})]
)
def test_two_ranks_equal_one_process(tmp_path, tiny_model_path, method, extra):
    files = write_data(tmp_path, n=7)
    assert_two_ranks_equal_one(tmp_path, tiny_model_path, data_for(method, files), method, **EQ, **extra)


def assert_two_ranks_equal_one(tmp_path, model_path, data, method, **overrides):
    """The run on one process (``tmp_path/one``) and on two ranks (``tmp_path/two``): the same losses and weights."""
    run_offline(load_config(None, offline_overrides(model_path, tmp_path / "one", data, method, **overrides)))
    run_ranks(2, offline_overrides(model_path, tmp_path / "two", data, method, **overrides))
    losses = [
        [json.loads(line).get("train/loss") for line in (tmp_path / d / "metrics.jsonl").read_text().splitlines()]
        for d in ("one", "two")
    ]
    assert [x for x in losses[0] if x is not None] == pytest.approx([x for x in losses[1] if x is not None], rel=1e-4)
    w1, w2 = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    for name in w1:
        assert torch.allclose(w1[name], w2[name], atol=2e-5), name


def test_rank_with_no_examples_does_not_hang(tmp_path, tiny_model_path):
    """One example per step over 2 ranks: every step leaves one rank without data; it must still
    issue the same collectives (dummy micro-batches), so the run ends within the timeout."""
    files = write_data(tmp_path, n=3)
    for method in ("cpo", "kto"):
        overrides = offline_overrides(
            tiny_model_path,
            tmp_path / method,
            data_for(method, files),
            method,
            **{"offline.global_batch_size": 1, "eval.eval_before_train": "false"},
        )
        evals = run_ranks(2, overrides, timeout=120)
        assert evals == []  # no eval data: nothing evaluated, but every step ran
        rows = (tmp_path / method / "metrics.jsonl").read_text().splitlines()
        assert sum('"train/loss"' in r for r in rows) == 3


def test_sft_packing_matches_padding(tmp_path, tiny_model_path):
    """Packed rows (several chats per row, attention kept within each) give the padded loss."""
    files = write_data(tmp_path, n=10)
    common = {
        "offline.eval_data": files["sft"],
        "eval.eval_before_train": "true",
        "offline.global_batch_size": 5,
        "train.max_tokens_per_gpu": 400,
    }
    padded = run_offline(
        load_config(None, offline_overrides(tiny_model_path, tmp_path / "pad", files["sft"], "sft", **common))
    )
    packed = run_offline(
        load_config(
            None,
            offline_overrides(
                tiny_model_path, tmp_path / "pack", files["sft"], "sft", **common, **{"offline.packing": "true"}
            ),
        )
    )
    for (_, a), (_, b) in zip(padded, packed):
        assert a["eval/loss"] == pytest.approx(b["eval/loss"], rel=1e-4)


def test_pack_layout():
    from reinforge.train.batching import build, plan_rows

    tokens, rlen, masks = [[1, 2, 3, 4], [5, 6, 7], [8, 9]], [2, 1, 1], [[1, 1], [1], [1]]
    mbs = [build(tokens, rlen, masks, rows, pad_id=0) for rows in plan_rows(tokens, rlen, [0, 1, 2], "sequences", 7)]
    assert [mb.indices for mb in mbs] == [[0, 1], [2]]
    mb = mbs[0]
    assert mb.input_ids.tolist() == [[1, 2, 3, 4, 5, 6, 7]]
    assert mb.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 2]] and mb.doc_ids.tolist() == [[1, 1, 1, 1, 2, 2, 2]]
    # positions 1, 2 predict tokens 3, 4 (sequence 0); position 5 predicts 7 (sequence 1); 3 predicts nothing
    assert mb.logit_cols.tolist() == [1, 2, 5] and mb.targets.tolist() == [[3, 4], [7, 0]]


@pytest.mark.parametrize("name", ["sft", "rm", "dpo", "ipo", "cpo", "simpo", "orpo", "kto"])
def test_offline_example_configs_run(tmp_path, tiny_model_path, name):
    from pathlib import Path

    files = write_data(tmp_path, n=8)
    example = Path(__file__).resolve().parents[2] / "examples" / "offline" / f"{name}.yaml"
    cfg = load_config(
        example,
        [
            f"model.path={tiny_model_path}",
            f"offline.train_data={data_for(name, files)}",
            f"run.output_dir={tmp_path / 'run'}",
            "offline.num_epochs=1",
            "offline.global_batch_size=4",
            "run.progress=false",
            "eval.eval_interval=null",
            "train.max_tokens_per_gpu=400",
        ],
    )
    assert cfg.offline.method == name
    evals = run_offline(cfg)
    assert [label for label, _ in evals] == ["before", "after"]


def test_shared_prefix_rows_score_like_separate_sequences(tmp_path, tiny_model_path):
    """[prompt | chosen | rejected] rows give each response the log-probs it has alone (fp32)."""
    from reinforge.offline_loop import OfflineLoop

    files = write_data(tmp_path, n=6)
    loop = OfflineLoop(load_config(None, offline_overrides(tiny_model_path, tmp_path / "run", files["pairs"], "dpo")))
    t, examples = loop.trainer, loop.train_set.examples
    assert t.shared_prefix
    shared, _ = t.sequence_stats(examples, reference=False)
    t.shared_prefix = False  # the padded path: each response as its own row
    separate, _ = t.sequence_stats(examples, reference=False)
    assert torch.allclose(torch.tensor(shared), torch.tensor(separate), atol=1e-4)
    loop.close()


def test_a_rank_with_only_dummy_micro_batches_keeps_its_gradient_shard(tmp_path, tiny_model_path):
    """One example per step over 2 FSDP ranks: the rank without data runs dummy micro-batches, whose
    backward still reduce-scatters the other rank's gradients into its shard; that shard must be
    applied (it was zeroed as if the step had no micro-batch), so the weights equal one process's."""
    files = write_data(tmp_path, n=2)
    eq = {**EQ, "offline.global_batch_size": 1}
    one = offline_overrides(tiny_model_path, tmp_path / "one", data_for("sft", files), "sft", **eq)
    two = offline_overrides(tiny_model_path, tmp_path / "two", data_for("sft", files), "sft", **eq)
    run_offline(load_config(None, one))
    run_ranks(2, two, timeout=180)
    w1, w2 = _weights(tmp_path / "one"), _weights(tmp_path / "two")
    for name in w1:
        assert torch.allclose(w1[name], w2[name], atol=2e-5), name
