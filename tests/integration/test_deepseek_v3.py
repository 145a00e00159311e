"""The ``deepseek_v3`` family (issue 53): multi-head latent attention and DeepSeek-V3's MoE in trainer and
engine, against transformers in fp32; the engine's latent cache and absorbed projections against the
trainer's plain attention."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from reinforge.check_model import check_model, failed, format_table, write_tiny_model
from tests.conftest import TOKENIZER_FILES


def deepseek_config(q_lora_rank: int | None = 32, experts: int = 8, **changes) -> dict:
    """A tiny deepseek_v3 config.json dict: 3 layers (layer 0 dense), 4 heads, latent rank 32."""
    cfg = dict(
        model_type="deepseek_v3",
        architectures=["DeepseekV3ForCausalLM"],
        vocab_size=1000,
        hidden_size=64,
        intermediate_size=128,
        moe_intermediate_size=32,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_shared_experts=1,
        n_routed_experts=experts,
        routed_scaling_factor=2.5,
        kv_lora_rank=32,
        q_lora_rank=q_lora_rank,
        qk_rope_head_dim=8,
        v_head_dim=12,
        qk_nope_head_dim=16,
        n_group=2,
        topk_group=1,
        num_experts_per_tok=2,
        first_k_dense_replace=1,
        norm_topk_prob=True,
        max_position_embeddings=512,
        rms_norm_eps=1e-6,
        rope_interleave=True,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        tie_word_embeddings=False,
    )
    cfg.update(changes)
    return cfg


def tiny_folder(tmp_path, **kw):
    (tmp_path / "config.json").write_text(json.dumps(deepseek_config(**kw)))
    return write_tiny_model(tmp_path / "config.json", tmp_path / "tiny", layers=3)


YARN = {
    "rope_type": "yarn",
    "rope_theta": 10000.0,
    "factor": 4.0,
    "original_max_position_embeddings": 512,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
    "beta_fast": 32,
    "beta_slow": 1,
}


@pytest.mark.parametrize(
    "changes",
    [
        # q_lora_rank set, MoE after a dense first layer, interleaved RoPE, YaRN with DeepSeek's mscale_all_dim
        # softmax scale, attention biases
        {"attention_bias": True, "max_position_embeddings": 2048, "rope_parameters": YARN},
        # a plain q_proj, no MoE layer (transformers builds a sparse layer from first_k_dense_replace on: one dense
        # layer), RoPE not interleaved
        {"q_lora_rank": None, "num_hidden_layers": 1, "rope_interleave": False},
    ],
    ids=["q_lora-moe-yarn", "q_proj-dense"],
)
def test_tiny_deepseek_v3_passes_every_check(tmp_path, changes):
    """fp32 logits against transformers' DeepseekV3ForCausalLM, the engine's latent cache (absorbed
    projections) against the trainer, greedy tokens, weight sync, export."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    if "deepseek_v3" not in CONFIG_MAPPING_NAMES:
        pytest.skip("the installed transformers has no deepseek_v3 to compare with")
    rows = check_model(tiny_folder(tmp_path, **changes), tokens=16, speed=False)
    assert not failed(rows), format_table(rows)
    assert "deepseek_v3" in rows[0].value


@pytest.fixture(scope="module")
def moe_folder(tmp_path_factory, smollm2_path):
    """A tiny random deepseek_v3 (3 layers, layer 0 dense) with interleaved YaRN RoPE and SmolLM2's tokenizer."""
    tmp = tmp_path_factory.mktemp("ds")
    for name in TOKENIZER_FILES:
        if (smollm2_path / name).exists():
            shutil.copy(smollm2_path / name, tmp / name)
    return tiny_folder(tmp, max_position_embeddings=2048, rope_parameters=YARN, vocab_size=49152)


@pytest.mark.parametrize("block", [4, 0], ids=["paged", "slot"])
def test_engine_latent_cache_matches_the_trainer(moe_folder, block):
    """Chunked prefill (chunks of 8 tokens over prompts of up to 17), 3 samples per prompt sharing the prompt's
    blocks, decode over the latent cache with the absorbed projections, paged (gathered blocks) and slot layouts:
    the trainer's plain attention gives the same log-probs; the cache holds one latent row per token and layer."""
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from tests.integration.test_integration import engine_vs_trainer_worst

    engine = EmbeddedEngine(
        build_model(moe_folder, torch.float32),
        EngineConfig(max_num_seqs=8, kv_block_size=block, max_prefill_tokens=8),
        max_model_len=48,
    )
    r, a = engine.runner, engine.runner.model.args
    assert r.v_pool is r.k_pool and r.k_pool.shape[2:] == (1, r.layout.block_size, a.kv_lora_rank + a.head_dim)
    assert r.layout.paged == bool(block)
    trainer = build_model(moe_folder, torch.float32).eval()
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, 40000, (5 + 6 * i,), generator=g).tolist() for i in range(3)]
    worst = engine_vs_trainer_worst(engine, trainer, prompts)
    engine.shutdown()
    assert worst < 1e-4


def test_cache_sizing_counts_latent_bytes():
    """The engine's layout, the up-front checks' shape and the planner count kv_lora_rank + qk_rope_head_dim
    values per token and layer (DeepSeek-V3: 61 x 576), not expanded keys and values."""
    from reinforge.config import EngineConfig
    from reinforge.engine.kv_cache import plan_kv_layout
    from reinforge.models.args import ModelArgs
    from reinforge.models.shape import config_shape
    from reinforge.plan.arch import Arch

    cfg = deepseek_config(
        num_hidden_layers=61, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128
    )
    shape = config_shape(cfg)
    assert (shape.num_kv_heads, shape.head_dim, shape.kv_lora_rank) == (1, 64, 512)
    assert Arch.from_config(cfg).kv_bytes_per_token(2) == 61 * 576 * 2
    args = ModelArgs(
        "deepseek_v3", 1000, 64, 128, 61, 4, 1, 64, 1e-6, 512, False, False, False, False, kv_lora_rank=512
    )
    from reinforge.plan.kv import shape_kv_bytes_per_token

    assert shape_kv_bytes_per_token(args, 1) == 61 * 576  # the planner's count, on the engine's model args
    layout = plan_kv_layout(args, torch.bfloat16, torch.device("cpu"), EngineConfig(max_num_seqs=2), 100, False)
    assert layout.num_blocks == 2 and layout.block_size == 100
    # DeepSeek-V3's whole shape: 671B parameters
    from transformers import AutoConfig

    assert abs(Arch.from_config(AutoConfig.for_model("deepseek_v3").to_dict()).num_params / 1e9 - 671) < 1


@pytest.mark.parametrize(
    "field,value", [("index_topk", 2048), ("index_n_heads", 64), ("scoring_func", "softmax"), ("topk_method", "greedy")]
)
def test_unsupported_fields_are_refused_by_name(field, value):
    """DeepSeek-V3.2's sparse-attention indexer and DeepSeek-V2's softmax routers stop the build, naming the field."""
    from reinforge.models.families.deepseek_v3 import FAMILY

    cfg = type("Cfg", (), deepseek_config(**{field: value}))()
    with pytest.raises(ValueError, match=field):
        FAMILY.model_args(cfg)
    FAMILY.model_args(type("Cfg", (), deepseek_config())())  # (the same config without it builds)


def test_grpo_trains_deepseek_v3_natively_with_routing_replay(tmp_path, moe_folder, caplog):
    """One GRPO rollout and two steps on the native model (no transformers fallback), the engine's latent cache,
    packed trainer rows and routes replayed in the trainer: trainer and engine log-probs agree."""
    from tests.integration.test_integration import native_grpo_rollout

    extra = {"algo.use_rollout_routing_replay": "true", "train.num_steps_per_rollout": 2}
    m = native_grpo_rollout(moe_folder, tmp_path / "run", caplog, **extra)
    assert m["train/logprob_abs_diff"] < 1e-4 and m["train/grad_norm"] > 0


def _kernel_device():
    import os

    from reinforge.utils.triton import triton, triton_available

    if triton_available("cuda"):
        return "cuda"
    if triton is not None and os.environ.get("TRITON_INTERPRET") == "1":
        return "cpu"
    return None


@pytest.mark.skipif(_kernel_device() is None, reason="the Triton kernel needs CUDA, or Triton with TRITON_INTERPRET=1")
@pytest.mark.parametrize("splits,lens", [(1, [1, 9, 23]), (3, [1, 300, 700])])
def test_mla_decode_kernel_matches_the_gathered_path(splits, lens):
    """The MLA decode kernel (two head blocks, the second partial; one split, and three splits of >= 256 keys)
    against attention over the gathered latent blocks; the new token's row stored once in its block."""
    from reinforge.engine.mla_decode import mla_decode_attention_triton
    from reinforge.engine.paged_attention import gather_blocks, masked_decode_attention

    dev = _kernel_device()
    g = torch.Generator().manual_seed(0)
    B, H, R, DR, BS = 3, 20, 32, 16, 16
    lens = torch.tensor(lens)
    mb = -(-int(lens.max()) // BS)
    table = torch.randperm(B * mb, generator=g).view(B, mb).to(torch.int32)
    cache = torch.randn(B * mb + 1, 1, BS, R + DR, generator=g)
    q = torch.randn(B, H, R + DR, generator=g)
    new = torch.randn(B, R + DR, generator=g)
    pos = lens - 1
    w_blk = table.gather(1, (pos // BS)[:, None].long())[:, 0].long()
    w_off = pos % BS
    ref_cache = cache.clone()
    ref_cache[w_blk, 0, w_off] = new
    keys = gather_blocks(ref_cache, table, mb)
    bias = torch.zeros(B, 1, 1, mb * BS).masked_fill(
        ~(torch.arange(mb * BS)[None, :] < lens[:, None])[:, None, None], float("-inf")
    )
    ref = masked_decode_attention(q, keys, keys, bias)[..., :R]
    to = lambda t: t.to(dev)  # noqa: E731
    dev_cache = to(cache)
    out = mla_decode_attention_triton(
        to(q), to(new), dev_cache, R, to(table), to(lens), to(w_blk), to(w_off), num_splits=splits, block_n=16
    )
    torch.testing.assert_close(out.cpu(), ref, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dev_cache.cpu(), ref_cache)


def test_tensor_and_context_parallelism_are_refused_up_front():
    from reinforge.parallel_layout import Layout

    cfg = deepseek_config()
    for layout in (Layout(1, 1, 2), Layout(1, 2, 1)):
        (problem,) = layout.config_problems(cfg)
        assert "multi-head latent attention (deepseek_v3)" in problem and "expert_model_parallel_size" in problem
    assert Layout(1, 1, 1, 2).config_problems(cfg) == []  # expert parallelism runs (8 experts over 2 ranks)
