"""Up-front checks (reinforge/preflight.py): context windows with RoPE scaling, token budgets, engine
slots and KV-cache memory, refused in words before anything is built."""

import dataclasses
import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
import torch

from reinforge import preflight
from reinforge.config import SECTIONS, load_config
from reinforge.models.context import context_window
from reinforge.preflight import PreflightError, check_generate, check_offline, check_rl, kv_cache_plan

GIB = 1 << 30
MESSAGES: list[str] = []  # every refusal of this module, for the key-name test at the end


def refused(fn, *args, **kwargs) -> str:
    with pytest.raises(PreflightError) as e:
        fn(*args, **kwargs)
    MESSAGES.append(str(e.value))
    return str(e.value)


def write_config(folder: Path, **overrides) -> Path:
    """A Hugging Face folder holding only config.json (the checks read nothing else): a Qwen2-1.5B
    attention shape (28 layers, 2 KV heads of 128) with 32768 positions unless overridden."""
    cfg = dict(
        model_type="qwen2",
        architectures=["Qwen2ForCausalLM"],
        vocab_size=1000,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=28,
        num_attention_heads=12,
        num_key_value_heads=2,
        head_dim=128,
        max_position_embeddings=32768,
        rope_theta=1e6,
        tie_word_embeddings=True,
    )
    cfg.update(overrides)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    return folder


def rl_cfg(*overrides):
    return load_config(None, ["train.device=cpu", "engine.max_num_seqs=16", *overrides])


# ----------------------------------------------------------------------------- context window


@pytest.mark.parametrize(
    "config,tokens",
    [
        ({"max_position_embeddings": 8192}, 8192),
        # Qwen2.5's recipe: the original window stays in max_position_embeddings
        (
            {
                "max_position_embeddings": 32768,
                "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
            },
            131072,
        ),
        ({"max_position_embeddings": 8192, "rope_parameters": {"rope_type": "yarn", "factor": 2.0}}, 16384),
        # DeepSeek-V3: the extended window already in max_position_embeddings
        (
            {
                "max_position_embeddings": 163840,
                "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096},
            },
            163840,
        ),
        ({"max_position_embeddings": 4096, "rope_scaling": {"type": "linear", "factor": 4.0}}, 16384),
        # Llama 3.1: the factor shapes the frequencies; the window is max_position_embeddings
        (
            {
                "max_position_embeddings": 131072,
                "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192},
            },
            131072,
        ),
        ({"n_positions": 1024}, 1024),
        ({"text_config": {"max_position_embeddings": 4096}}, 4096),
    ],
)
def test_context_window_counts_rope_scaling(config, tokens):
    assert context_window(config).tokens == tokens


def test_context_window_reads_transformers_configs_alike():
    from transformers import AutoConfig

    kw = dict(
        max_position_embeddings=32768,
        rope_theta=1e6,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
    )
    w = context_window(AutoConfig.for_model("qwen2", **kw))
    assert w.tokens == 131072 and "yarn" in w.source and "32768" in w.source
    assert context_window({"vocab_size": 3}) is None


def test_native_rope_table_covers_the_yarn_window(tmp_path, smollm2_path):
    """reinforge's own model holds every position of the scaled window and matches transformers
    past max_position_embeddings (before, its RoPE table ended there: IndexError / device assert)."""
    from transformers import AutoModelForCausalLM

    from reinforge.models.loading import build_model
    from tests.conftest import make_tiny_model

    path = make_tiny_model(
        tmp_path / "yarn",
        smollm2_path,
        "qwen2",
        max_position_embeddings=32,
        rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32},
    )
    native = build_model(path, torch.float32)
    assert native.rope_cos.shape[0] == 128
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    ids = torch.randint(0, 49152, (1, 100))
    with torch.no_grad():
        assert (native(ids) - hf(ids).logits).abs().max().item() < 1e-4


# ----------------------------------------------------------------------------- lengths


def test_too_long_configuration_refused_at_start_with_the_message(smollm2_path, monkeypatch, capsys):
    """Issue 27's example: rollout_max_response_len=8300 on SmolLM2 (8192 positions) failed mid-generation
    with an IndexError in the RoPE table; now `reinforge train` exits 2 before loading any data."""
    from reinforge import cli

    def not_reached(*a, **k):
        raise AssertionError("training started")

    monkeypatch.setattr("reinforge.loop.RLLoop", not_reached)
    code = cli.main(
        [
            "train",
            "train.device=cpu",
            "rollout.rollout_max_response_len=8300",
            "engine.max_num_seqs=8",
            "train.max_tokens_per_gpu=9000",
        ]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("reinforge train: error: this run cannot start: training sequences reach 8301 tokens"), err
    for part in (
        "rollout.rollout_max_response_len=8300",
        "smollm2-135m-instruct holds 8192 positions",
        "max_position_embeddings=8192",
        "at most 8191",
    ):
        assert part in err, err
    MESSAGES.append(err)
    assert "Traceback" not in err


def test_32k_responses_on_a_32k_model_refused_and_yarn_lets_them_run(tmp_path):
    """Issue 24's example: 32768 new tokens on a 32768-position Qwen2 model crashed after 8 minutes with
    a device-side assert. With the exact prompt length (the loop's check) the message says how much fits."""
    plain = write_config(tmp_path / "plain")
    cfg = rl_cfg("rollout.rollout_max_response_len=32768", "train.max_tokens_per_gpu=40000", "engine.max_num_seqs=8")
    msg = refused(check_rl, cfg, plain, 200, memory=1e15)
    assert (
        "training sequences reach 32968 tokens (the longest prompt (200 tokens) + "
        "rollout.rollout_max_response_len=32768)" in msg
    )
    assert "holds 32768 positions (max_position_embeddings=32768)" in msg and "at most 32568" in msg
    assert "data.rollout_max_prompt_len" in msg
    yarn = write_config(
        tmp_path / "yarn", rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    )
    assert check_rl(cfg, yarn, 200, memory=1e15).max_model_len == 32968


def test_eval_response_checked_apart_from_training(tmp_path):
    folder = write_config(tmp_path / "m", max_position_embeddings=1024)
    cfg = rl_cfg("rollout.rollout_max_response_len=512", "eval.eval_max_response_len=2048")
    msg = refused(check_rl, cfg, folder, 100, memory=1e15)
    assert "evaluation sequences reach 2148 tokens" in msg and "eval.eval_max_response_len=2048" in msg
    assert "set eval.eval_max_response_len to at most 924" in msg and "training sequences" not in msg
    # no evaluation prompts: nothing to refuse
    check_rl(
        load_config(
            None,
            [
                "train.device=cpu",
                "engine.max_num_seqs=16",
                "rollout.rollout_max_response_len=512",
                "eval.eval_max_response_len=2048",
                "data.n_eval_prompts=0",
            ],
        ),
        folder,
        100,
        memory=1e15,
    )


def test_generate_refuses_max_new_tokens_past_the_window(smollm2_path):
    msg = refused(check_generate, rl_cfg(), smollm2_path, 40, 8200)
    assert "--max-new-tokens=8200 = 8240 tokens" in msg and "at most 8152" in msg
    check_generate(rl_cfg(), smollm2_path, 40, 100)


@pytest.mark.parametrize("prompt_tokens", [8192, 9000])
def test_generate_prompt_longer_than_the_window_names_the_prompt(smollm2_path, prompt_tokens):
    """Issue 38 item 8: a prompt that fills the window alone was told to 'set --max-new-tokens to at most 0'."""
    msg = refused(check_generate, rl_cfg(), smollm2_path, prompt_tokens, 16)
    assert f"the prompt alone is {prompt_tokens} tokens" in msg and "holds 8192 positions" in msg
    assert f"shorten the prompt by at least {prompt_tokens - 8191} tokens" in msg
    assert "--max-new-tokens" not in msg
    check_generate(rl_cfg(), smollm2_path, 8191, 1)  # one new token fits


# ----------------------------------------------------------------------------- budgets and slots


def test_token_budget_smaller_than_one_sequence_refused(tmp_path):
    """Issue 27: train.max_tokens_per_gpu=1 ran for 40+ s without an answer."""
    folder = write_config(tmp_path / "m")
    msg = refused(check_rl, rl_cfg("train.max_tokens_per_gpu=1"), folder, None, memory=1e15)
    assert (
        "train.max_tokens_per_gpu=1 cannot hold one training sequence of 257 tokens (a prompt of at least 1 "
        "token + rollout.rollout_max_response_len=256)" in msg
    )
    # exactly one sequence of the longest prompt + response fits; one token less does not
    check_rl(rl_cfg("train.max_tokens_per_gpu=356"), folder, 100, memory=1e15)
    assert "at least 356" in refused(check_rl, rl_cfg("train.max_tokens_per_gpu=355"), folder, 100, memory=1e15)
    # evaluation alone trains nothing
    check_rl(rl_cfg("train.max_tokens_per_gpu=1", "train.num_rollout=0"), folder, 100, memory=1e15)


def test_samples_per_prompt_against_engine_slots(tmp_path):
    folder = write_config(tmp_path / "m")
    msg = refused(check_rl, rl_cfg("engine.max_num_seqs=4", "rollout.n_samples_per_prompt=8"), folder, 10, memory=1e15)
    assert "rollout.n_samples_per_prompt=8 exceeds the engine's 4 slots (engine.max_num_seqs=4)" in msg
    # on a CPU each slot is one block: engine.num_kv_blocks caps the slots
    msg = refused(
        check_rl,
        rl_cfg(
            "engine.num_kv_blocks=2",
            "eval.n_samples_per_eval_prompt=4",
            "rollout.n_samples_per_prompt=2",
            "eval.pass_k=[1]",
        ),
        folder,
        10,
        memory=1e15,
    )
    assert "eval.n_samples_per_eval_prompt=4 exceeds the engine's 2 slots (engine.num_kv_blocks=2" in msg
    msg = refused(check_rl, rl_cfg("engine.kv_block_size=16", "engine.num_kv_blocks=3"), folder, 10, memory=1e15)
    assert "engine.num_kv_blocks=3 holds less than one sequence of 266 tokens (17 blocks of 16)" in msg


# ----------------------------------------------------------------------------- memory


@pytest.mark.parametrize(
    "overrides",
    [[], ["engine.kv_block_size=8"], ["engine.kv_block_size=8", "engine.num_kv_blocks=20"], ["engine.num_kv_blocks=3"]],
)
def test_kv_cache_plan_is_what_the_engine_allocates(tiny_model_path, overrides):
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model

    cfg = rl_cfg("engine.max_num_seqs=5", *overrides)
    plan = kv_cache_plan(cfg, tiny_model_path, 50, torch.device("cpu"))
    engine = EmbeddedEngine(build_model(tiny_model_path, torch.float32), cfg.engine, max_model_len=50)
    assert plan.bytes == engine.runner.kv_bytes()
    layout = engine.scheduler.layout
    assert (plan.slots, plan.block_size, plan.blocks_per_seq) == (
        engine.num_slots,
        layout.block_size,
        layout.blocks_per_seq,
    )


def test_kv_cache_larger_than_memory_refused_in_words(tmp_path):
    """Issue 27: rollout_max_response_len=20000 on a CPU asked the allocator for a 30 GB KV cache."""
    folder = write_config(tmp_path / "m", max_position_embeddings=131072)
    cfg = rl_cfg(
        "rollout.rollout_max_response_len=20000", "train.max_tokens_per_gpu=30000", "rollout.n_samples_per_prompt=4"
    )
    # 2 x 28 layers x 2 KV heads x 128 x 4 bytes = 57344 bytes per token; (16 slots + the engine's sink block)
    # x 20100 tokens = 18.2 GiB
    msg = refused(check_rl, cfg, folder, 100, memory=8 * GIB)
    for part in (
        "KV cache needs 18.2 GiB",
        "16 slots (engine.max_num_seqs=16)",
        "20100 tokens",
        "57344 bytes per token (2 x 28 layers x 2 KV heads x 128 head dim x 4 bytes, float32",
        "8.0 GiB of memory available",
        "lower engine.max_num_seqs to at most 6",
        "rollout.rollout_max_response_len",
    ):
        assert part in msg, msg
    assert "fewer than the" not in msg
    # the number it proposes fits
    check_rl(
        rl_cfg(
            "rollout.rollout_max_response_len=20000",
            "train.max_tokens_per_gpu=30000",
            "engine.max_num_seqs=6",
            "rollout.n_samples_per_prompt=4",
        ),
        folder,
        100,
        memory=8 * GIB,
    )
    # and it says when that is fewer slots than one prompt's samples
    assert "6 slots hold fewer than the 8 samples of one prompt" in refused(
        check_rl,
        rl_cfg("rollout.rollout_max_response_len=20000", "train.max_tokens_per_gpu=30000"),
        folder,
        100,
        memory=8 * GIB,
    )
    # not even one slot
    msg = refused(
        check_rl,
        rl_cfg("rollout.rollout_max_response_len=20000", "train.max_tokens_per_gpu=30000"),
        folder,
        100,
        memory=GIB,
    )
    assert "not even one slot of 1.1 GiB fits" in msg
    # Ray engines run elsewhere: their memory is cluster/resources.py's estimate
    check_rl(
        load_config(
            None,
            [
                "train.device=cpu",
                "rollout.rollout_max_response_len=20000",
                "cluster.mode=ray",
                "train.max_tokens_per_gpu=30000",
            ],
        ),
        folder,
        100,
        memory=GIB,
    )


def test_fp8_kv_cache_is_counted_at_one_byte(tmp_path, monkeypatch):
    """engine.kv_cache_dtype=fp8 stores a quarter of fp32's bytes per token: the run refused above at
    8 GiB fits; the message names the key; a GPU without e4m3 is refused up front."""
    folder = write_config(tmp_path / "m", max_position_embeddings=131072)
    long = [
        "rollout.rollout_max_response_len=20000",
        "train.max_tokens_per_gpu=30000",
        "rollout.n_samples_per_prompt=4",
        "engine.kv_cache_dtype=fp8",
    ]
    check_rl(rl_cfg(*long), folder, 100, memory=8 * GIB)  # 17 x 20100 x 14336 bytes = 4.6 GiB
    msg = refused(check_rl, rl_cfg(*long), folder, 100, memory=2 * GIB)
    for part in (
        "KV cache needs 4.6 GiB",
        "14336 bytes per token",
        "x 1 bytes, float8_e4m3fn",
        "engine.kv_cache_dtype=fp8",
    ):
        assert part in msg, msg
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (40 * GIB, 80 * GIB))
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    assert "use fp8_e5m2 or auto" in refused(
        check_rl, load_config(None, long), folder, 100, device=torch.device("cuda")
    )


@pytest.mark.parametrize("triton", [True, False])
def test_gpu_kv_cache_of_one_sequence_against_the_free_memory(tmp_path, monkeypatch, triton):
    """The engine's own rule on a GPU (engine/kv_cache.py: plan_kv_layout): one sequence and one spare block must fit in
    engine.kv_cache_memory_fraction of the free memory. Blocks of 16 tokens with Triton, else one per sequence."""
    folder = write_config(tmp_path / "m", max_position_embeddings=131072)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (4 * GIB, 80 * GIB))
    monkeypatch.setattr("reinforge.utils.triton.triton_available", lambda device_type: triton)
    cfg = load_config(
        None,
        [
            "rollout.rollout_max_response_len=65536",
            "train.max_tokens_per_gpu=70000",
            "engine.kv_cache_memory_fraction=0.3",
        ],
    )
    # bf16 on a GPU: 28672 bytes per token x 65636 tokens = 1.75 GiB (+ a spare block: 16 tokens, or a whole
    # sequence without Triton) > 0.3 x 4 GiB
    msg = refused(check_rl, cfg, folder, 100, device=torch.device("cuda"))
    for part in (
        "one sequence of 65636 tokens",
        "needs 1.8 GiB" if triton else "needs 3.5 GiB",
        "x 2 bytes, bfloat16",
        "engine.kv_cache_memory_fraction=0.3 of the 4.0 GiB free on cuda is 1.2 GiB",
    ):
        assert part in msg, msg
    fits = load_config(
        None,
        [
            "rollout.rollout_max_response_len=65536",
            "train.max_tokens_per_gpu=70000",
            "engine.kv_cache_memory_fraction=0.5",
        ],
    )
    if triton:
        check_rl(fits, folder, 100, device=torch.device("cuda"))
    else:
        assert "needs 3.5 GiB" in refused(check_rl, fits, folder, 100, device=torch.device("cuda"))


def test_policy_judge_and_placement_count_one_engine_memory(tmp_path):
    """Issue 54: the CPU engine's memory was counted three ways (preflight's KV-cache plan, the judge's
    engine_bytes without rings or states, resources.estimate_memory at fp32 without the engine's sink block);
    now all three read the engine's own plan (engine.kv_cache.kv_cache_plan) and agree to the byte."""
    from reinforge.cluster.resources import PROCESS_OVERHEAD, estimate_memory
    from reinforge.models.shape import model_shape
    from reinforge.reward.judge_engine import engine_plan
    from reinforge.rollout.backends import engine_config_for

    folder = write_config(tmp_path / "m")
    cfg = load_config(None, ["train.device=cpu", "engine.max_num_seqs=4", "rollout.rollout_max_response_len=100"])
    cpu = torch.device("cpu")
    plan = kv_cache_plan(cfg, folder, 130, cpu)
    assert plan.bytes == (4 + 1) * 130 * 2 * 28 * 2 * 128 * 4  # 4 slots and the sink block, fp32 on a CPU
    assert engine_plan(folder, engine_config_for(cfg), 130, cpu) == plan  # the judge's count of an engine
    estimate = estimate_memory(cfg, model_shape(folder), 130, 1)
    assert estimate.engine - PROCESS_OVERHEAD == plan.total  # the placement's (was 4 slots: no sink block)


def test_cpu_placement_counts_the_trainer_as_the_planner_does(tmp_path):
    """Issue 54: the CPU placement's trainer estimate was a second trainer-memory model (16 B / parameter, a
    reference of 4 B / parameter on every rank); now it is the planner's trainer_state: the reference sharded
    over the ranks like the policy, fp32 on a CPU (Actor._frozen)."""
    from reinforge.cluster.resources import FP32, PROCESS_OVERHEAD, estimate_memory
    from reinforge.models.shape import model_shape
    from reinforge.plan.model import trainer_state

    folder = write_config(tmp_path / "m")
    shape = model_shape(folder)
    cfg = load_config(
        None, ["train.device=cpu", "algo.use_kl_loss=true", "algo.kl_loss_coef=0.01", "train.max_tokens_per_gpu=100"]
    )
    p = shape.num_params
    estimate = estimate_memory(cfg, shape, 130, 4)
    state = trainer_state(p, 4, bf16=False, reference=True)
    assert state["reference"] == 4 * p / 4  # (was 4 * p on each of the 4 ranks)
    assert estimate.trainer == int(PROCESS_OVERHEAD + sum(state.values()) + FP32 * p + 100 * shape.vocab_size * FP32)
    assert "the reference model" in estimate.trainer_parts


# ----------------------------------------------------------------------------- wiring


def test_check_lengths_runs_the_exact_check_on_the_runs_plan(tiny_model_path):
    """The loop's engine length (longest prompt + response) reaches the check before anything is built, on the
    plan the run resolved (no second resolution)."""
    from reinforge.plan import resolve_config
    from reinforge.preflight import check_lengths

    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_path}",
            "train.device=cpu",
            "engine.max_num_seqs=4",
            "rollout.rollout_max_response_len=1000",
        ],
    )
    _, plan = resolve_config(cfg, tiny_model_path)
    msg = refused(check_lengths, plan, tiny_model_path, 37, memory=1e12)
    assert "the longest prompt (37 tokens) + rollout.rollout_max_response_len=1000" in msg
    assert "holds 1024 positions" in msg


def test_train_resolves_auto_keys_and_runs_the_rl_check_once(tmp_path, tiny_model_path, monkeypatch):
    """Issue 54: one `reinforge train` resolved the `auto` keys three times (the CLI's check_rl, RLLoop,
    LocalCluster's check_placement -> check_rl) and ran check_rl twice. Now the CLI's plan is handed to the run:
    one resolution, one check_rl, and the prompt-dependent checks once more at the datasets' longest prompt."""
    from collections import Counter

    import reinforge.plan as plan_package
    from reinforge import cli
    from reinforge.loop import RLLoop
    from reinforge.plan import planner
    from tests.integration.test_integration import tiny_overrides

    calls: Counter = Counter()

    def counted(name, fn):
        def wrapper(*args, **kwargs):
            calls[name] += 1
            return fn(*args, **kwargs)

        return wrapper

    resolve = counted("resolve_config", planner.resolve_config)
    monkeypatch.setattr(planner, "resolve_config", resolve)
    monkeypatch.setattr(plan_package, "resolve_config", resolve)
    monkeypatch.setattr(preflight, "check_rl", counted("check_rl", preflight.check_rl))
    monkeypatch.setattr(preflight, "check_lengths", counted("check_lengths", preflight.check_lengths))
    monkeypatch.setattr(RLLoop, "train", lambda self: None)  # built (datasets, engine, trainer), not run
    overrides = tiny_overrides(tiny_model_path, tmp_path / "run", **{"train.max_tokens_per_gpu": "auto"})
    assert cli.main(["train", *overrides]) == 0
    assert calls == {"resolve_config": 1, "check_rl": 1, "check_lengths": 1}


def test_offline_refuses_examples_past_window_and_budget(tmp_path, tiny_model_path, monkeypatch):
    folder = write_config(tmp_path / "m", max_position_embeddings=512)
    msg = refused(
        check_offline, load_config(None, ["offline.max_length=1024", "train.max_tokens_per_gpu=600"]), folder, 700
    )
    assert "the longest example has 700 tokens" in msg and "set offline.max_length to at most 512" in msg
    assert "train.max_tokens_per_gpu=600 cannot hold the longest example's sequence of 700 tokens" in msg
    # through run_offline: refused after the data is read, before the trainer is built
    from reinforge.offline_loop import run_offline

    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"prompt": "What is 2 + 2?", "completion": "<answer>4</answer>"}) + "\n")
    monkeypatch.setattr(
        "reinforge.offline_loop.OfflineTrainer", lambda *a, **k: (_ for _ in ()).throw(AssertionError("trainer built"))
    )
    cfg = load_config(
        None,
        [
            f"model.path={tiny_model_path}",
            "offline.method=sft",
            f"offline.train_data={data}",
            "train.device=cpu",
            "train.max_tokens_per_gpu=8",
            f"run.output_dir={tmp_path}/run",
        ],
    )
    with pytest.raises(
        PreflightError,
        match=r"train.max_tokens_per_gpu=8 cannot hold the longest example's "
        r"sequence of \d+ tokens",
    ):
        run_offline(cfg)


def test_offline_counts_gkd_student_samples():
    """GKD with ``offline.gkd_lmbda`` > 0 trains on student samples of up to ``offline.gkd_max_new_tokens``
    tokens in place of the dataset's responses: the length check counts the longer of the two."""
    from types import SimpleNamespace

    from reinforge.preflight import longest_example

    examples = [
        SimpleNamespace(prompt_ids=[1] * 30, responses=[[2] * 5, [2] * 9]),
        SimpleNamespace(prompt_ids=[1] * 4, responses=[[2] * 50]),
    ]
    assert longest_example(examples) == 54
    assert longest_example(examples, sampled=128) == 158
    assert longest_example([], sampled=128) == 0


def test_a_broken_python_sandbox_is_refused_at_start(smollm2_path, monkeypatch, capsys, tmp_path):
    """Issue 57: a broken python sandbox was found only at the first rollout, as a traceback, and
    taking bwrap off PATH did not disable it. Now `reinforge train` with the `python` tool exits 2 before
    any model is built, with one line saying what is wrong and what to do: bwrap missing from PATH, or
    the bubblewrap that `$REINFORGE_BWRAP` names failing its trial run. `sandbox.backend=none`
    (the opt-out the line names) is not checked."""
    from reinforge import cli
    from reinforge.sandbox import sandbox_problems

    BWRAP_ENV = "REINFORGE_BWRAP"  # reinforge.sandbox.isolation.BWRAP_ENV

    def not_reached(*a, **k):
        raise AssertionError("training started")

    monkeypatch.setattr("reinforge.loop.run_training", not_reached)
    monkeypatch.delenv(BWRAP_ENV, raising=False)
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on PATH
    agent = ["agent.tools=[python]", "rollout.custom_generate_function_path=reinforge.rollout.agent:generate"]
    args = ["train", "train.device=cpu", "engine.max_num_seqs=8", *agent]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("reinforge train: error: this run cannot start: the python tool runs"), err
    assert "no `bwrap` on PATH" in err and "sandbox.backend=none" in err, err
    assert err.strip().count("\n") == 0 and "Traceback" not in err, err
    MESSAGES.append(err)
    reachable = Path(tempfile.mkdtemp())  # the sandbox's uid runs it: a folder any uid can enter
    try:
        reachable.chmod(0o755)
        fake = reachable / "broken-bwrap"
        fake.write_text("#!/bin/sh\necho 'bwrap: setting up uid map: Permission denied' >&2\nexit 1\n")
        fake.chmod(0o755)
        monkeypatch.setenv(BWRAP_ENV, str(fake))
        assert cli.main(args) == 2
    finally:
        shutil.rmtree(reachable)
    err = capsys.readouterr().err
    assert "fails here (bwrap: setting up uid map: Permission denied;" in err, err
    assert err.strip().count("\n") == 0 and "Traceback" not in err, err
    assert sandbox_problems(rl_cfg(*agent, "sandbox.backend=none")) == []


def test_messages_name_only_keys_that_exist():
    """Every `section.key` in the messages (those the tests above collected, and every one the module's source
    can write) is a key of a section under reinforge/config/ (module paths such as `.cluster.resources` are not
    keys: a dot before)."""
    keys = {f"{s}.{f.name}" for s, cls in SECTIONS.items() for f in dataclasses.fields(cls)}
    pattern = re.compile(r"(?<![\w.])(" + "|".join(SECTIONS) + r")\.([a-z_][a-z0-9_]*)")
    source = Path(preflight.__file__).read_text()
    named = {".".join(m) for text in MESSAGES + [source] for m in pattern.findall(text)}
    assert not sorted(named - keys), sorted(named - keys)
    assert {
        "rollout.rollout_max_response_len",
        "train.max_tokens_per_gpu",
        "data.rollout_max_prompt_len",
        "eval.eval_max_response_len",
        "engine.max_num_seqs",
        "offline.max_length",
    } <= named
