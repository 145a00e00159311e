"""Expert parallelism on CPU (gloo): the experts of tiny qwen3_moe / qwen2_moe models split over 2
ranks (and FSDP x EP on 4) give one process's loss, gradient norm and updated weights; a rank that
receives no tokens, or sends none, does not hang; checkpoints and the Hugging Face export of an EP
run load on one process with the same weights; the config and preflight checks name the keys."""

import pytest
import torch

from reinforge.parallel_layout import Layout
from tests.integration.test_distributed import (
    assert_resumes_on_one_process,
    assert_same,
    make_cfg,
    make_data,
    run_ranks,
    run_single,
)
from tests.integration.test_moe import make_tiny_moe
from tests.ranks import spawn_ranks


@pytest.fixture(scope="module")
def qwen3_moe_path(tmp_path_factory, smollm2_path):
    return make_tiny_moe(tmp_path_factory.mktemp("qwen3_moe_ep"), smollm2_path, "qwen3_moe")


@pytest.fixture(scope="module")
def qwen2_moe_path(tmp_path_factory, smollm2_path):
    return make_tiny_moe(tmp_path_factory.mktemp("qwen2_moe_ep"), smollm2_path, "qwen2_moe")


def ep_cfg(path, ep, **extra):
    return make_cfg(path, **{"train.expert_model_parallel_size": ep, **extra})


def test_layout_words_and_checks():
    assert Layout.for_world(4, ep=2).words() == "4 trainer ranks = 4 data (experts over 2)"
    assert Layout.for_world(4, ep=2).edp == 2
    with pytest.raises(ValueError, match=r"expert_model_parallel_size=3 does not divide the 4 data-parallel rank"):
        Layout.for_world(4, ep=3)
    with pytest.raises(ValueError, match=r"expert_model_parallel_size=2 with .*tensor_model_parallel_size=2"):
        Layout.for_world(4, tp=2, ep=2)
    assert Layout(4, ep=2).expert_problems(8) == []
    assert "num_experts=6" in Layout(4, ep=4).expert_problems(6)[0]
    assert "dense" in Layout(2, ep=2).expert_problems(0)[0]


# ----------------------------------------------------------------------- the block alone
def _block_worker(rank, world, port, full_state, xs, replays, queue):
    """Each rank runs its own tokens (possibly none) through an EP block whose replayed experts may
    all live on one rank; returns outputs and gradients for comparison with one process."""
    import torch.distributed as dist

    from reinforge.models.moe import Routing, SparseMoeBlock
    from reinforge.train.mesh import TrainMesh, apply_expert_parallel

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    mesh = TrainMesh.build(Layout(world, ep=world), "cpu")
    block = SparseMoeBlock(16, 4, 2, 8, True, layer=0)
    block.load_state_dict(full_state)
    holder = torch.nn.Module()
    holder.mlp = block
    assert len(apply_expert_parallel(holder, mesh, {})) == 2
    x = xs[rank].clone().requires_grad_(True)
    routing = Routing(replay={0: replays[rank]}, aux_loss=True)
    y = block(x[None], routing)[0]
    (y * torch.arange(1.0, 17.0)).sum().backward()
    grads = {
        "gate_up": block.experts.gate_up_proj.grad.full_tensor() * world,  # (the 1 / ep scale, undone)
        "down": block.experts.down_proj.grad.full_tensor() * world,
    }
    router = block.gate.weight.grad.clone()
    dist.all_reduce(router)
    counts = routing.stats[0][0].clone()
    dist.all_reduce(counts)
    ys = [None] * world
    dist.all_gather_object(ys, (y.detach(), x.grad))
    if rank == 0:  # numpy: no shared-memory handles that die with this process
        queue.put(
            (
                [(a.numpy(), b.numpy()) for a, b in ys],
                {k: v.numpy() for k, v in grads.items()},
                router.numpy(),
                counts.numpy(),
            )
        )
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("case", ["all_to_rank0", "rank1_empty"])
def test_block_rank_without_tokens_does_not_hang(case):
    """Replayed experts send every token to rank 0's experts (rank 1's experts receive none), or
    rank 1 has no tokens at all (a rank sends nothing): the same outputs and gradients as one
    process, and the routing statistics are the router's (before the dispatch)."""
    from reinforge.models.moe import Routing, SparseMoeBlock

    torch.manual_seed(0)
    block = SparseMoeBlock(16, 4, 2, 8, True, layer=0)
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0, 0.3)
    g = torch.Generator().manual_seed(1)
    if case == "all_to_rank0":
        xs = [torch.randn(5, 16, generator=g), torch.randn(3, 16, generator=g)]
        replays = [torch.tensor([[0, 1], [1, 0], [0, 1], [1, 0], [0, 1]]), torch.tensor([[1, 0], [0, 1], [1, 0]])]
    else:
        xs = [torch.randn(6, 16, generator=g), torch.zeros(0, 16)]
        replays = [torch.tensor([[0, 3], [2, 1], [3, 2], [0, 2], [1, 3], [3, 0]]), torch.zeros(0, 2, dtype=torch.long)]
    ys, grads, router, counts = spawn_ranks(_block_worker, 2, (block.state_dict(), xs, replays), timeout=90)
    ys = [(torch.from_numpy(a), torch.from_numpy(b)) for a, b in ys]
    grads = {k: torch.from_numpy(v) for k, v in grads.items()}
    router, counts = torch.from_numpy(router), torch.from_numpy(counts)
    x = torch.cat(xs).requires_grad_(True)
    routing = Routing(replay={0: torch.cat(replays)}, aux_loss=True)
    y = block(x[None], routing)[0]
    (y * torch.arange(1.0, 17.0)).sum().backward()
    assert torch.allclose(torch.cat([a for a, _ in ys]), y.detach(), atol=1e-5)
    assert torch.allclose(torch.cat([b for _, b in ys]), x.grad, atol=1e-5)
    assert torch.allclose(grads["gate_up"], block.experts.gate_up_proj.grad, atol=1e-5)
    assert torch.allclose(grads["down"], block.experts.down_proj.grad, atol=1e-5)
    assert torch.allclose(router, block.gate.weight.grad, atol=1e-5)
    assert torch.equal(counts, routing.stats[0][0])


# ----------------------------------------------------------------------- the trainer
def test_ep2_matches_one_process(qwen3_moe_path):
    """(qwen2_moe, with its shared expert: the checkpoint test below compares EP=2 with one process.)"""
    path = qwen3_moe_path
    data = make_data(6, seed=7)
    single = run_single(make_cfg(path), path, data)
    assert_same(single[:2], run_ranks(2, ep_cfg(path, 2), path, data))


def test_ep2_dummy_micro_batch_with_aux_loss(qwen3_moe_path):
    """One sample: one rank has none and runs a dummy micro-batch through the dispatch (no hang,
    the same update as one process), with the load-balancing loss on: its statistics come from each
    rank's own router before the dispatch, and every MoE layer's reach the trainer through FSDP's
    hooks (a dataclass Routing lost those of the layers after the first)."""
    # one group of one sample (REINFORCE++: no group to compare it with)
    aux = {
        "train.moe_aux_loss_coeff": 0.01,
        "rollout.n_samples_per_prompt": 1,
        "algo.advantage_estimator": "reinforce_plus_plus",
    }
    data = [make_data(1, seed=2)[0][:1]]
    single = run_single(make_cfg(qwen3_moe_path, **aux), qwen3_moe_path, data)
    metrics, weights = run_ranks(2, ep_cfg(qwen3_moe_path, 2, **aux), qwen3_moe_path, data)
    assert metrics[0]["train/moe_aux_loss"] == pytest.approx(single[0][0]["train/moe_aux_loss"], rel=1e-5)
    assert_same(single[:2], (metrics, weights))


@pytest.mark.slow
def test_fsdp_times_ep_on_four_ranks(qwen3_moe_path):
    """4 data ranks, experts over 2: each pair of ranks holding the same experts shards them with FSDP."""
    data = make_data(6, seed=8)
    assert_same(
        run_single(make_cfg(qwen3_moe_path), qwen3_moe_path, data)[:2],
        run_ranks(4, ep_cfg(qwen3_moe_path, 2), qwen3_moe_path, data),
    )
    # one sample: three ranks run dummy micro-batches through the dispatch and the experts' FSDP unit
    data = make_data(1, seed=2)
    assert_same(
        run_single(make_cfg(qwen3_moe_path), qwen3_moe_path, data)[:2],
        run_ranks(4, ep_cfg(qwen3_moe_path, 2), qwen3_moe_path, data),
    )


def test_ep_checkpoint_and_hf_export_load_on_one_process(tmp_path, qwen2_moe_path):
    """The DCP checkpoint of an EP=2 run (expert DTensor shards) resumes on one process, a second
    step equals an uninterrupted run's; the Hugging Face folder (hub per-expert layout) holds the same weights."""
    weights = assert_resumes_on_one_process(
        qwen2_moe_path, ep_cfg(qwen2_moe_path, 2), make_data(6, seed=10), tmp_path / "ckpt"
    )
    assert any(k.endswith("mlp.experts.gate_up_proj") for k in weights)


def test_config_and_preflight_name_keys(qwen3_moe_path, tiny_model_path):
    from reinforge.config import ConfigError, load_config
    from reinforge.preflight import PreflightError, check_rl

    ray = ["cluster.mode=ray", "cluster.actor_num_gpus_per_node=4"]
    with pytest.raises(
        ConfigError,
        match=r"train.expert_model_parallel_size=3 does not divide the 4 data-parallel "
        r"rank.*of the 4 trainer rank.*actor_num_gpus_per_node=4",
    ):
        load_config(None, ray + [f"model.path={qwen3_moe_path}", "train.expert_model_parallel_size=3"])
    with pytest.raises(ConfigError, match=r"expert_model_parallel_size=2 with train.tensor_model_parallel_size=2"):
        load_config(
            None,
            ray
            + [
                f"model.path={qwen3_moe_path}",
                "train.expert_model_parallel_size=2",
                "train.tensor_model_parallel_size=2",
            ],
        )
    cfg = load_config(None, ray + [f"model.path={qwen3_moe_path}", "train.expert_model_parallel_size=4"])
    check_rl(cfg, qwen3_moe_path, 10, memory=1e15)  # 8 experts over 4 ranks: fine
    cfg = load_config(
        None,
        [
            "cluster.mode=ray",
            "cluster.actor_num_gpus_per_node=3",
            f"model.path={qwen3_moe_path}",
            "train.expert_model_parallel_size=3",
        ],
    )
    with pytest.raises(PreflightError, match=r"expert_model_parallel_size=3 must divide the model's num_experts=8"):
        check_rl(cfg, qwen3_moe_path, 10, memory=1e15)
    cfg = load_config(None, ray + [f"model.path={tiny_model_path}", "train.expert_model_parallel_size=2"])
    with pytest.raises(PreflightError, match=r"expert_model_parallel_size=2 needs a mixture-of-experts model"):
        check_rl(cfg, tiny_model_path, 10, memory=1e15)
    local = load_config(None, [f"model.path={qwen3_moe_path}", "train.expert_model_parallel_size=2"])
    with pytest.raises(PreflightError, match=r"does not divide the 1 data-parallel rank.*cluster.mode=ray"):
        check_rl(local, qwen3_moe_path, 10, memory=1e15)


@pytest.mark.parametrize("tp,cp", [(2, 1), (1, 2)])
def test_moe_model_with_tensor_or_context_parallelism(qwen3_moe_path, tp, cp):
    """An MoE model under tensor parallelism (attention split; each MoE layer's experts whole on
    every tensor-parallel rank) or context parallelism (the experts see each rank's positions):
    the loss, gradient norm and updated weights of one process."""
    data = make_data(4, seed=11)
    cfg = make_cfg(qwen3_moe_path, **{"train.tensor_model_parallel_size": tp, "train.context_parallel_size": cp})
    assert_same(run_single(make_cfg(qwen3_moe_path), qwen3_moe_path, data)[:2], run_ranks(2, cfg, qwen3_moe_path, data))
