"""Offload for one GPU (issue 36 item 6): ``train.optimizer_offload`` (AdamW's moments in CPU memory,
the step a chunk of parameters at a time) and ``train.fsdp_cpu_offload`` on a single trainer rank
(FSDP2 over a one-rank process group). On the CPU the chunked step and the one-rank FSDP2 path run
for real; the side-stream copies are the GPU's (scripts/gpu_8b_offload.sh runs this file there)."""

import copy

import pytest
import torch

from reinforge.config import load_config
from reinforge.train.offload import OffloadedAdamW, build_adamw
from tests.integration.test_offload_rollout import run


def _params(seed: int) -> list[torch.nn.Parameter]:
    g = torch.Generator().manual_seed(seed)
    shapes = [(64, 32), (32,), (16, 64), (7, 5), (128,)]
    return [torch.nn.Parameter(torch.randn(s, generator=g)) for s in shapes]


def _steps(opt, params, n: int, seed: int = 1) -> None:
    g = torch.Generator().manual_seed(seed)
    for _ in range(n):
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        opt.step()


@pytest.mark.parametrize("chunk_bytes", [1, 600, 1 << 30])  # a chunk per parameter, a few, one
def test_offloaded_adamw_steps_exactly_as_adamw(chunk_bytes):
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    plain_params, off_params = _params(0), _params(0)
    plain, off = torch.optim.AdamW(plain_params, **kw), OffloadedAdamW(off_params, chunk_bytes=chunk_bytes, **kw)
    assert len(off._chunks()) == 0  # no gradients yet
    _steps(plain, plain_params, 3)
    _steps(off, off_params, 3)
    for a, b in zip(plain_params, off_params):
        assert torch.equal(a, b)
    for a, b in zip(plain_params, off_params):
        sa, sb = plain.state[a], off.state[b]
        assert torch.equal(sa["exp_avg"], sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"], sb["exp_avg_sq"])
        assert sb["exp_avg"].device.type == "cpu" and float(sa["step"]) == float(sb["step"]) == 3
    if chunk_bytes == 1:
        assert len(off._chunks()) == len(off_params)


def test_offloaded_adamw_state_dict_is_adamws():
    kw = dict(lr=1e-2)
    a_params, b_params = _params(0), _params(0)
    a = OffloadedAdamW(a_params, chunk_bytes=600, **kw)
    _steps(a, a_params, 2)
    plain = torch.optim.AdamW(b_params, **kw)  # the offloaded optimizer's state loads into the plain one
    for p, q in zip(a_params, b_params):
        q.data.copy_(p.data)
    plain.load_state_dict(copy.deepcopy(a.state_dict()))  # a copy: load_state_dict keeps tensors
    back = OffloadedAdamW(_params(5), chunk_bytes=600, **kw)  # and back, into another offloaded one
    back_params = back.param_groups[0]["params"]
    for p, q in zip(a_params, back_params):
        q.data.copy_(p.data)
    back.load_state_dict(copy.deepcopy(plain.state_dict()))
    _steps(a, a_params, 1, seed=9)
    _steps(plain, b_params, 1, seed=9)
    _steps(back, back_params, 1, seed=9)
    for p, q, r in zip(a_params, b_params, back_params):
        assert torch.equal(p, q) and torch.equal(p, r)


def test_build_adamw_chooses_the_offloaded_optimizer():
    params = _params(0)
    assert type(build_adamw(params, torch.device("cpu"), False, lr=1.0)) is torch.optim.AdamW
    assert type(build_adamw(params, torch.device("cpu"), True, lr=1.0)) is OffloadedAdamW


def test_optimizer_offload_is_refused_where_it_does_not_apply():
    from reinforge.config.fields import ConfigError

    with pytest.raises(ConfigError, match="set one of the two"):
        load_config(None, ["train.optimizer_offload=true", "train.fsdp_cpu_offload=true"])
    with pytest.raises(ConfigError, match="2 trainer ranks use train.fsdp_cpu_offload"):
        load_config(None, ["train.optimizer_offload=true", "cluster.mode=ray", "cluster.actor_num_gpus_per_node=2"])


def test_one_rank_training_with_offload_matches_without(tmp_path, tiny_model_path, monkeypatch):
    """Two GRPO rollouts in local mode: the metrics with optimizer offload are those without
    (the same update); FSDP2's CPU offload on one rank (a process group of its own) trains to the
    same metrics within float tolerance (its reduction and state layout differ)."""
    _, plain = run(tmp_path, tiny_model_path, offload=False)
    _, offloaded = run(tmp_path, tiny_model_path, False, extra=("train.optimizer_offload=true",))
    assert offloaded == plain
    import reinforge.train.model_trainer as mt

    sharded, shard = [], mt.parallelize
    monkeypatch.setattr(mt, "parallelize", lambda *a, **k: sharded.append(shard(*a, **k)) or sharded[-1])
    _, fsdp = run(tmp_path, tiny_model_path, False, extra=("train.fsdp_cpu_offload=true",))
    assert sharded and all(s.fsdp for s in sharded)  # FSDP2 wrapped the one rank's model
    assert not torch.distributed.is_initialized()  # the run's process group of one is gone
    assert fsdp[0]["rollout/reward_mean"] == plain[0]["rollout/reward_mean"]
    for a, b in zip(plain, fsdp):
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-4, abs=1e-5), k


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the side-stream copies need a GPU")
@pytest.mark.parametrize("chunk_bytes", [1, 3000, 1 << 30])  # 3000: small moments that share pages (H200, 2026-11-27)
def test_offloaded_adamw_on_a_gpu_steps_exactly_as_fused_adamw(chunk_bytes):
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    big = torch.randn(512, 1024, generator=torch.Generator().manual_seed(2))  # 2 MiB: moments in mappings of their own
    plain_params = [torch.nn.Parameter(p.detach().cuda()) for p in [*_params(0), big]]
    off_params = [torch.nn.Parameter(p.detach().cuda()) for p in [*_params(0), big]]
    plain, off = torch.optim.AdamW(plain_params, **kw), OffloadedAdamW(off_params, chunk_bytes=chunk_bytes, **kw)
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        for a, b in zip(plain_params, off_params):
            a.grad = torch.randn(a.shape, generator=g).cuda()
            b.grad = a.grad.clone()
        plain.step()
        off.step()
    torch.cuda.synchronize()
    for a, b in zip(plain_params, off_params):
        assert torch.equal(a, b)
        sa, sb = plain.state[a], off.state[b]
        assert sb["exp_avg"].device.type == "cpu" and sb["exp_avg_sq"].device.type == "cpu"
        assert torch.equal(sa["exp_avg"].cpu(), sb["exp_avg"]) and torch.equal(sa["exp_avg_sq"].cpu(), sb["exp_avg_sq"])
    del off  # the registered mappings are unregistered with the optimizer
    torch.cuda.synchronize()


def test_host_buffers_are_made_once_and_remade_on_a_new_shape():
    from reinforge.train.offload import HostBuffers

    buffers = HostBuffers()
    a = buffers.get("m", torch.zeros(3, 4))
    assert a.shape == (3, 4) and a.device.type == "cpu" and buffers.get("m", torch.zeros(3, 4)) is a
    b = buffers.get("m", torch.zeros(5, dtype=torch.bfloat16))
    assert b is not a and b.shape == (5,) and b.dtype == torch.bfloat16


def test_host_buffers_register_their_own_mappings_and_unregister_them(monkeypatch):
    """The CUDA bookkeeping with a fake runtime (this machine has no GPU): a large buffer is an exact,
    page-aligned mapping registered once, unregistered when remade and when the buffers go; a failed
    registration clears CUDA's error and leaves the buffer usable."""
    import gc

    from reinforge.train import offload

    calls = []

    class FakeCudart:
        fail = False

        def cudaHostRegister(self, ptr, n, flags):
            calls.append(("register", ptr, n))
            return 712 if self.fail else 0  # cudaErrorHostMemoryAlreadyRegistered

        def cudaHostUnregister(self, ptr):
            calls.append(("unregister", ptr))
            return 0

        def cudaGetLastError(self):
            calls.append(("clear",))
            return 0

    rt = FakeCudart()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "cudart", lambda: rt)
    buffers = offload.HostBuffers()
    like = torch.zeros(512, 1024)  # 2 MiB
    a = buffers.get("m", like)
    assert a.data_ptr() % 4096 == 0 and calls == [("register", a.data_ptr(), 2 << 20)]
    a.fill_(3.0)
    assert float(a.sum()) == 3.0 * a.numel()
    ptr = a.data_ptr()
    del a
    b = buffers.get("m", torch.zeros(1024, 1024))  # remade: the old mapping unregistered first
    assert calls[1] == ("unregister", ptr) and calls[2][0] == "register"
    rt.fail = True
    buffers.get("v", like)
    assert calls[-2][0] == "register" and calls[-1] == ("clear",)
    del b, buffers
    gc.collect()
    assert calls[-1][0] == "unregister" and sum(c[0] == "unregister" for c in calls) == 2  # the failed one is not


def test_build_adamw_steps_sharded_and_plain_parameters_fused(tmp_path):
    """A fused AdamW over DTensor and plain parameters at once (pipeline x tensor parallel without data
    parallelism: norms stay plain) steps each as alone; one group of both raised on 4 GPUs (torch
    refuses mixed Tensor and DTensor in ``_fused_adamw_``)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        torch.manual_seed(0)
        w, b = torch.randn(4, 3), torch.randn(3)
        sharded = torch.nn.Parameter(distribute_tensor(w.clone(), mesh, [Replicate()]))
        plain = torch.nn.Parameter(b.clone())
        opt = build_adamw([sharded, plain], torch.device("cpu"), False, fused=True, lr=0.1)
        ref = [torch.nn.Parameter(w.clone()), torch.nn.Parameter(b.clone())]
        ref_opt = torch.optim.AdamW(ref, lr=0.1, fused=True)
        for p, g in zip([sharded, plain, *ref], [torch.ones(4, 3), torch.ones(3)] * 2):
            p.grad = distribute_tensor(g, mesh, [Replicate()]) if hasattr(p, "device_mesh") else g
        opt.step()
        ref_opt.step()
        assert torch.equal(sharded.full_tensor(), ref[0]) and torch.equal(plain.detach(), ref[1])
    finally:
        dist.destroy_process_group()
