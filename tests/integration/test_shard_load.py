"""Shard-wise loading (train/shard_load.py) on CPU (gloo): two ranks that build the model on the meta
device and receive their FSDP2 shards from rank 0 hold exactly the weights of today's whole-model
build (and of one process), take the same first step (loss, gradient norm), hold only a shard each,
and only rank 0 reads the checkpoint."""

import io

import pytest
import torch

from reinforge.models.loading import build_model, model_logits
from reinforge.parallel_layout import Layout
from reinforge.train.collectives import ParallelContext
from reinforge.train.shard_load import shard_load_problem, shard_wise_model
from tests.ranks import spawn_ranks


def _step(model):
    """One fixed batch's loss and gradient norm (full state dict gathered after, for comparison)."""
    ids = torch.arange(24).reshape(2, 12) % 50 + 3
    logits = model_logits(model, ids)
    loss = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1)
    )
    loss.backward()
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9)
    norm = norm.full_tensor() if hasattr(norm, "full_tensor") else norm
    return loss.item(), norm.item()


def _worker(rank, world, port, path, random_init, queue):
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    from reinforge.train import shard_load
    from reinforge.train.mesh import TrainMesh
    from reinforge.train.parallelize import parallelize

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    parallel = ParallelContext(rank=rank, world_size=world, mesh=TrainMesh.build(Layout(world), "cpu"))
    assert shard_load.shard_load_problem(parallel) is None
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    out = {}
    # today's path: the whole model on every rank, then fully_shard
    old = build_model(path, torch.float32, "cpu", random_init=random_init, seed=3)
    parallelize(old, parallel)
    out["old_state"] = get_model_state_dict(old, options=options)
    out["old_step"] = _step(old)
    # shard-wise: meta, fully_shard, to_empty, rank 0 reads and broadcasts
    reads = []

    def reader(*args, **kwargs):
        reads.append(rank)
        return shard_load.full_state_dict(*args, **kwargs)

    new = shard_load.meta_model(path)
    parallelize(new, parallel)
    shard_load.load_shards(new, path, torch.device("cpu"), parallel, random_init=random_init, seed=3, reader=reader)
    local = sum(p.to_local().numel() for p in new.parameters())
    full = sum(p.numel() for p in new.parameters())
    assert new.lm_head.weight is new.model.embed_tokens.weight or not new.args.tie_word_embeddings
    out["new_state"] = get_model_state_dict(new, options=options)
    out["new_step"] = _step(new)
    gathered = [None] * world
    dist.all_gather_object(gathered, {"reads": len(reads), "local": local, "full": full})
    out["ranks"] = gathered
    dist.destroy_process_group()
    if rank == 0:  # (as bytes: tensors through the queue would need this process alive)
        buf = io.BytesIO()
        torch.save(out, buf)
        queue.put(buf.getvalue())


@pytest.mark.parametrize("random_init", [False, True])
def test_two_ranks_shard_wise_equal_whole_and_one_process(tiny_model_path, random_init):
    out = torch.load(io.BytesIO(spawn_ranks(_worker, 2, (str(tiny_model_path), random_init), timeout=180)))
    one = build_model(tiny_model_path, torch.float32, "cpu", random_init=random_init, seed=3)
    one_state = {k: v.clone() for k, v in one.state_dict().items()}
    one_step = _step(one)
    assert set(out["new_state"]) == set(out["old_state"])
    for k, v in out["old_state"].items():
        assert torch.equal(out["new_state"][k], v), k
        if k in one_state:
            assert torch.equal(one_state[k], v), k
    assert out["new_step"] == out["old_step"]
    assert out["new_step"][0] == pytest.approx(one_step[0], rel=1e-5)
    assert out["new_step"][1] == pytest.approx(one_step[1], rel=1e-4)
    ranks = out["ranks"]
    assert [r["reads"] for r in ranks] == [1, 0]  # only rank 0 opens the checkpoint
    for r in ranks:  # each rank holds about half the parameters (FSDP2 pads the last shard)
        assert r["local"] <= r["full"] // 2 + 1024, r


def test_problem_names_the_layouts_that_keep_the_whole_build():
    assert shard_load_problem(ParallelContext()) == "one rank (nothing to shard)"


def test_which_trainers_load_shard_wise(tiny_model_path):
    """The actor takes the path where shard_wise_model gives a meta model: several data-parallel ranks."""
    two = ParallelContext(rank=1, world_size=2)
    model = shard_wise_model(tiny_model_path, two)
    assert model is not None and model.lm_head.weight.is_meta
    assert model.lm_head.weight is model.model.embed_tokens.weight
    assert shard_wise_model(tiny_model_path, two, lora=True) is None
    assert shard_wise_model(tiny_model_path, two, cpu_offload=True) is None
    assert shard_wise_model(tiny_model_path, ParallelContext()) is None
    assert "tensor / context" in shard_load_problem(ParallelContext(rank=0, world_size=2, mesh=_mesh(Layout(2, tp=2))))


def _mesh(layout):
    class FakeMesh:  # (only the layout is read)
        pass

    m = FakeMesh()
    m.layout = layout
    return m


def test_two_shard_wise_trainers_with_a_reference_and_random_init_equal_one_process(tiny_model_path):
    """The actor and its frozen reference (KL loss) load shard-wise on two ranks, from a random
    initialisation as from the checkpoint: the same metrics and weights as one process."""
    from tests.integration.test_distributed import assert_same, make_cfg, make_data, run_ranks, run_single

    data = make_data(8)
    for extra in ({}, {"model.random_init": "true"}):
        cfg = make_cfg(tiny_model_path, **{"algo.use_kl_loss": "true", "algo.kl_loss_coef": 0.1, **extra})
        single = run_single(cfg, tiny_model_path, data)
        two = run_ranks(2, cfg, tiny_model_path, data)
        assert_same(single[:2], two)
        assert "train/kl" in two[0][0] or any("kl" in k for k in two[0][0]), sorted(two[0][0])
