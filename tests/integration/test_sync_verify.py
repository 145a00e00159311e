"""Weight sync that proves itself (issue 51): checksums on both sides of every sync, the log-prob
probe, and the faults they catch (a damaged bucket, a dropped LoRA merge), each named in one line."""

import pytest
import torch

from reinforge.config import load_config
from reinforge.loop import RLLoop
from reinforge.utils import faults
from reinforge.weights.verify import CHUNK, PRIME, SentSums, WeightSyncMismatch, checksum, checksums, compare
from tests.integration.test_integration import tiny_overrides


def reference_checksum(t: torch.Tensor) -> int:
    """The definition, in Python integers: sum of int32 words * (i mod PRIME + 1), mod 2^64 signed."""
    words = t.contiguous().view(-1).view(torch.uint8).view(torch.int32).tolist()
    total = sum(w * (i % PRIME + 1) for i, w in enumerate(words)) % (1 << 64)
    return total - (1 << 64) if total >= 1 << 63 else total


def test_checksum_is_the_exact_position_weighted_word_sum():
    g = torch.Generator().manual_seed(0)
    t = torch.randn(300, 7, generator=g) * 1e30  # large words: the products overflow int32
    assert checksums([t]) == [reference_checksum(t)]
    # bit-exact, not close: the smallest change of one element (its last mantissa bit) shows
    bumped = t.clone()
    bumped.view(-1).view(torch.int32)[123] += 1
    assert checksum(bumped) != checksum(t)
    # order-sensitive: two elements swapped, and a transposed layout of the same values
    swapped = t.clone().view(-1)
    swapped[[5, 900]] = swapped[[900, 5]]
    assert checksum(swapped) != checksum(t)
    assert checksum(t.t().contiguous()) != checksum(t)
    # the cast both sides do: fp32 master weights checksummed as the engine's bf16
    assert checksum(t, torch.bfloat16) == checksum(t.to(torch.bfloat16))
    # a bf16 tensor of odd length (16-bit words) and a tensor longer than one chunk
    odd = torch.randn(5, generator=g).to(torch.bfloat16)
    assert checksum(odd) != checksum(-odd)
    big = torch.randn(CHUNK + 1000, generator=g)
    tail = big.clone()
    tail[-1] = -tail[-1]
    assert checksum(big) != checksum(tail)
    assert int(checksum(big)) == int(checksum(big[:CHUNK])) + int(checksum_offset(big[CHUNK:], CHUNK))


def checksum_offset(t: torch.Tensor, offset: int) -> torch.Tensor:
    words = t.contiguous().view(-1).view(torch.int32).to(torch.int64)
    return (words * ((torch.arange(words.numel()) + offset) % PRIME + 1)).sum()


def test_compare_names_bucket_parameter_and_transport_in_one_line():
    a, b = torch.ones(3), torch.zeros(2)
    sent = SentSums(torch.float32)
    sent.add([("x.weight", a)])
    sent.add([("y.weight", b), ("z.weight", a)])
    good = dict(zip(["x.weight", "y.weight", "z.weight"], checksums([a, b, a])))
    assert compare(sent, good, "CUDA IPC") == []
    assert compare(sent, {**good, "z.weight": None}, "CUDA IPC") == ["z.weight"]  # the engine cannot check it
    with pytest.raises(WeightSyncMismatch) as e:
        compare(sent, {**good, "z.weight": good["z.weight"] + 1}, "NCCL broadcast", "engine 1")
    msg = str(e.value)
    assert "\n" not in msg and "bucket 1 parameter z.weight" in msg and "NCCL broadcast" in msg and "engine 1" in msg
    with pytest.raises(WeightSyncMismatch, match="bucket 0 parameter x.weight was sent but the engine reports no"):
        compare(sent, {k: v for k, v in good.items() if k != "x.weight"}, "disk")


def test_corrupt_bucket_fault_stops_the_run_naming_the_tensor(tmp_path, tiny_model_path, monkeypatch, capsys):
    from reinforge.cli import main

    monkeypatch.setenv("REINFORGE_FAULT", "corrupt_bucket:2")
    faults.reset()
    overrides = tiny_overrides(
        tiny_model_path, tmp_path / "run", **{"cluster.weight_sync_bucket_mb": 1, "engine.dtype": "fp32"}
    )
    # the sync at start-up: the second bucket (the layers after the embedding) damaged after the trainer's checksum
    assert main(["train", *overrides]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "Traceback" not in err[0], err  # one line, no traceback
    assert err[0].startswith("reinforge train: error: weight sync (in-process tensor) mismatch in the engine: ")
    assert "bucket 1 parameter model.norm.weight holds other bytes" in err[0], err  # the bucket's last tensor
    faults.reset()


def test_sync_metrics_and_probe_on_a_healthy_run(tmp_path, tiny_model_path):
    cfg = load_config(
        None,
        tiny_overrides(
            tiny_model_path,
            tmp_path / "run",
            **{"engine.dtype": "fp32", "cluster.weight_sync_probe_interval": 2, "data.n_eval_prompts": 0},
        ),
    )
    loop = RLLoop(cfg)
    start = loop.probe(0, start=True)["sync/probe_logprob_diff"]  # what train() does first
    assert 0 <= start < 1e-3  # fp32 engine and trainer: the same model
    metrics, _ = loop.rollout_step(0)  # version 1: verified, not probed (every 2 syncs)
    assert metrics["sync/verified"] == 1.0 and "sync/probe_logprob_diff" not in metrics
    assert 0 <= metrics["sync/verify_seconds"] < metrics["time/sync"]
    assert loop.probe.due(2) and not loop.probe.due(3)
    assert 0 <= loop.probe(2)["sync/probe_logprob_diff"] < 1e-3  # after the trained step's sync
    loop.close()


def test_drop_lora_merge_is_caught_by_the_probe_naming_the_tensor(tmp_path, tiny_model_path, monkeypatch):
    from tests.integration.test_lora import LORA

    # merged_named_weights passes: 1 the sync at start-up, 2 the sync after the first step (dropped)
    monkeypatch.setenv("REINFORGE_FAULT", "drop_lora_merge:2")
    faults.reset()
    cfg = load_config(
        None,
        tiny_overrides(
            tiny_model_path,
            tmp_path / "run",
            **LORA,
            **{"cluster.weight_sync_probe_interval": 1, "train.num_rollout": 1, "run.save_final": "false"},
        ),
    )
    loop = RLLoop(cfg)
    with pytest.raises(WeightSyncMismatch) as e:
        loop.rollout_step(0)
    msg = str(e.value)
    assert "\n" not in msg and "probe prompt differ" in msg and "in-process tensor" in msg, msg
    assert "parameter model.layers.0.self_attn.q_proj.weight" in msg, msg  # the first adapted weight, named
    loop.close()
    faults.reset()


def test_vllm_side_checksums_in_the_worker_with_a_stand_in_llm():
    """VLLMEngine's path without vLLM installed: collective_rpc reaches the worker extension, which
    checksums what arrives before vLLM's reload (the real engine: tests/integration/test_vllm.py)."""
    from reinforge.models.loading import hub_layout
    from reinforge.rollout.backends.vllm import ReinforgeWorkerExtension, VLLMEngine

    class Worker(ReinforgeWorkerExtension):
        def __init__(self, damage: bool):
            self.damage, self.loaded = damage, {}

        def reload_weights(self, weights_iterator, is_checkpoint_format):
            self.loaded.update({n: t.clone() for n, t in weights_iterator})

        def reinforge_reload(self, named, dtype=None):
            return super().reinforge_reload(corrupt(named) if self.damage else named, dtype)

    class LLM:  # two TP workers, in process
        def __init__(self, damage_second: bool):
            self.workers = [Worker(False), Worker(damage_second)]

        def collective_rpc(self, method, args=()):
            return [getattr(w, method)(*args) for w in self.workers]

        def reset_prefix_cache(self):
            pass

    from reinforge.weights.verify import corrupt

    named = [("model.embed_tokens.weight", torch.randn(8, 4)), ("model.norm.weight", torch.randn(4))]
    for damage in (False, True):
        engine = VLLMEngine.__new__(VLLMEngine)
        engine.tied, engine.in_process, engine.weight_version = True, True, 0
        engine.weight_dtype, engine._arrived, engine._converted = torch.bfloat16, {}, set()
        engine.llm = LLM(damage)
        engine.to_hub = hub_layout(None)  # (no folder: the default layout, dense names unchanged)
        sent = SentSums(engine.weight_dtype)
        engine.update_weights(sent.stream([named]), version=1)
        if not damage:
            assert compare(sent, engine.weight_checksums(sent.names), "vLLM collective_rpc") == []
            assert "lm_head.weight" in engine.llm.workers[0].loaded  # the tied head, sent under its name
        else:
            with pytest.raises(WeightSyncMismatch, match="parameter lm_head.weight arrived with different bytes"):
                engine.weight_checksums(["model.embed_tokens.weight", "model.norm.weight", "lm_head.weight"])


def test_broadcast_transport_is_verified_and_a_damaged_bucket_named(tiny_model_path, monkeypatch):
    """The disaggregated transport (flat fp32 buckets over a gloo group, as NCCL on GPUs) into a bf16
    embedded engine: checksums agree through flatten -> broadcast -> cast; a damaged bucket is named."""
    import queue
    import threading

    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from reinforge.utils.net import free_port
    from reinforge.weights.broadcast import receive_flat, send_flat
    from reinforge.weights.buckets import bucket_by_bytes
    from reinforge.weights.groups import weight_sync_group

    trainer = build_model(tiny_model_path, torch.float32)
    engine = EmbeddedEngine(build_model(tiny_model_path, torch.bfloat16, random_init=True), max_model_len=64)
    named = [(n, p.detach()) for n, p in trainer.named_parameters()]
    port = free_port("127.0.0.1")

    def receiver(metas: queue.Queue) -> None:
        group = weight_sync_group("127.0.0.1", port, 1, 2, "gloo")
        while (meta := metas.get()) is not None:
            engine.update_weights(receive_flat(group, meta, torch.device("cpu")), version=1)

    for fault in ("", "corrupt_bucket:2"):
        monkeypatch.setenv("REINFORGE_FAULT", fault)
        faults.reset()
        metas: queue.Queue = queue.Queue()
        thread = threading.Thread(target=receiver, args=(metas,))
        thread.start()
        group = weight_sync_group("127.0.0.1", port, 0, 2, "gloo")
        sent = SentSums(engine.weight_dtype)
        for bucket in bucket_by_bytes(named, 1 << 20):
            send_flat(group, sent.add(bucket), metas.put)
        metas.put(None)
        thread.join()
        if not fault:
            assert len(sent.buckets) > 1 and compare(sent, engine.weight_checksums(sent.names), "gloo broadcast") == []
        else:
            with pytest.raises(WeightSyncMismatch, match=r"weight sync \(gloo broadcast\) mismatch .* bucket 1 "):
                compare(sent, engine.weight_checksums(sent.names), "gloo broadcast")
        port = free_port("127.0.0.1")
    faults.reset()


def test_a_sync_that_silently_did_not_happen_is_caught(tiny_model_path, caplog):
    """The engine's update_weights returns without loading (a stale engine, TRL #5312): the
    checksums of what it holds differ from what was sent; verification off, or an engine without
    checksums, reports sync/verified accordingly."""
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from reinforge.weights.tensor import sync_in_process

    trainer = build_model(tiny_model_path, torch.float32)
    engine = EmbeddedEngine(build_model(tiny_model_path, torch.float32, random_init=True), max_model_len=64)
    named = lambda: ((n, p.detach()) for n, p in trainer.named_parameters())  # noqa: E731
    out = sync_in_process(named(), engine, 1)
    assert out["sync/verified"] == 1.0 and 0 <= out["sync/verify_seconds"] <= out["time/sync"]
    engine.update_weights = lambda tensors, version: list(tensors)  # consumed, never loaded
    for p in engine.model.parameters():
        p.data.add_(1.0)
    with pytest.raises(WeightSyncMismatch, match="bucket 0 parameter model.embed_tokens.weight holds other bytes"):
        sync_in_process(named(), engine, 2)
    assert set(sync_in_process(named(), engine, 3, verify=False)) == {"time/sync"}  # off: not checked

    class Plain:  # an engine that reports no checksums (SGLang's case)
        def update_weights(self, tensors, version):
            list(tensors)

    with caplog.at_level("WARNING"):
        assert sync_in_process(named(), Plain(), 1)["sync/verified"] == 0.0
    assert "Plain cannot report checksums" in caplog.text


def test_probe_tolerance_follows_the_lowest_precision():
    from reinforge.weights.probe import check_probe, probe_tolerance

    assert probe_tolerance(None, torch.float32, False, False) == 1e-3
    assert probe_tolerance(None, torch.float32, True, False) == 1.0  # bf16 autocast in the trainer
    assert probe_tolerance(None, torch.bfloat16, False, True) == 2.0  # fp8 weights or KV cache
    assert probe_tolerance(0.25, torch.bfloat16, False, True) == 0.25
    check_probe(0.5, 1.0, 3, "CUDA IPC")
    for bad in (1.5, float("nan")):
        with pytest.raises(WeightSyncMismatch, match=r"weight sync \(CUDA IPC\) of version 3: .* differ"):
            check_probe(bad, 1.0, 3, "CUDA IPC")


def test_fp8_engine_checks_quantized_layers_before_quantization(tiny_model_path, monkeypatch):
    """engine.quantization=fp8: the quantized layers' tensors are checksummed as they arrive (cast to the
    engine's dtype, before quantization), the others where they landed; a damaged one is named."""
    from reinforge.config import EngineConfig
    from reinforge.engine import EmbeddedEngine
    from reinforge.models.loading import build_model
    from reinforge.weights.tensor import sync_in_process

    trainer = build_model(tiny_model_path, torch.float32)
    cfg = EngineConfig(max_num_seqs=8, quantization="fp8")
    engine = EmbeddedEngine(build_model(tiny_model_path, torch.float32, random_init=True), cfg, max_model_len=48)
    down = "model.layers.1.mlp.down_proj.weight"  # a quantized layer's weight (no parameter in the engine)
    assert down not in dict(engine.model.named_parameters())
    named = [(n, p.detach()) for n, p in trainer.named_parameters() if n != down] + [
        (down, trainer.get_parameter(down))
    ]
    assert sync_in_process(named, engine, 1, bucket_bytes=1 << 16)["sync/verified"] == 1.0
    monkeypatch.setenv("REINFORGE_FAULT", "corrupt_bucket:1")
    faults.reset()
    with pytest.raises(WeightSyncMismatch, match=f"bucket 0 parameter {down} holds other bytes"):
        sync_in_process(named, engine, 2, bucket_bytes=64 << 20)  # one bucket: its last tensor damaged
    faults.reset()


def test_the_two_faults_default_to_corrupting():
    assert faults.parse("corrupt_bucket:2, drop_lora_merge:1") == {
        "corrupt_bucket": (2, "corrupt"),
        "drop_lora_merge": (1, "corrupt"),
    }
    assert faults.parse("weight_sync:1") == {"weight_sync": (1, "kill")}  # the others as before


def test_ray_actor_mismatch_reaches_the_driver_as_one_line():
    """Ray wraps an actor's exception (RayTaskError, its message the actor's traceback); the driver
    raises the WeightSyncMismatch itself, one line."""
    from reinforge.weights.ray_transport import transport_name, unwrap_mismatch

    class RayTaskError(Exception):  # what ray.get raises: the actor's exception as `cause`
        def __init__(self, cause):
            super().__init__("ray::TrainerActor.sync_broadcast()\\nTraceback (most recent call last): ...")
            self.cause = cause

    line = "weight sync (gloo broadcast) mismatch in engine 1: bucket 3 parameter x holds other bytes"

    def failing(refs):
        raise RayTaskError(WeightSyncMismatch(line))

    with pytest.raises(WeightSyncMismatch) as e:
        unwrap_mismatch(failing, [])
    assert str(e.value) == line
    with pytest.raises(RayTaskError):  # any other failure as it was
        unwrap_mismatch(lambda refs: (_ for _ in ()).throw(RayTaskError(ValueError("x"))), [])
    assert unwrap_mismatch(lambda refs: [1, 2], []) == [1, 2]
    assert transport_name(True, True) == "CUDA IPC" and transport_name(False, False) == "gloo broadcast"
