"""The SGLang client against a loopback fake server that follows SGLang's HTTP API.

SGLang itself does not run on CPU-only machines; these tests check what reinforge sends and
how it reads the answers: /generate payloads and parsing, weight-update payloads (tensor,
distributed with a real gloo broadcast, disk), memory release, the launch command line, port
allocation and readiness errors.
"""

import base64
import json
import pickle
import socket
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from reinforge.records import FinishReason, GenerateRequest, SamplingParams
from reinforge.rollout.backends.sglang import (
    PortAllocator,
    SGLangEngine,
    SGLangError,
    SGLangServer,
    generate_payload,
    launch_command,
    parse_generate,
    start_server,
    wait_ready,
)
from reinforge.utils.net import free_port


class FakeSGLang:
    """Records requests; answers like an SGLang server."""

    def __init__(self):
        self.calls: list[tuple[str, dict]] = []
        self.received: dict[str, torch.Tensor] = {}
        self.group = None
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, obj, code=200):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                self._reply({"status": "ok"} if self.path == "/health_generate" else {}, 200)

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])) or b"{}")
                fake.calls.append((self.path, body))
                self._reply(fake.handle(self.path, body))

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def handle(self, path, body):
        if path == "/generate":
            n = body["sampling_params"]["n"]
            base = body["input_ids"][-1]
            outs = [
                {
                    "text": "x",
                    "output_ids": [base + j, 2],
                    "meta_info": {
                        "output_token_logprobs": [[-0.5 - j, base + j, None], [-0.25, 2, None]],
                        "finish_reason": {"type": "stop", "matched": 2},
                    },
                }
                for j in range(n)
            ]
            return outs if n > 1 else outs[0]
        if path == "/update_weights_from_tensor":
            for entry in body["serialized_named_tensors"]:
                for name, t in pickle.loads(base64.b64decode(entry)):
                    self.received[name] = t.clone()
            return {"success": True, "message": ""}
        if path == "/init_weights_update_group":
            import datetime

            import torch.distributed as dist

            store = dist.TCPStore(
                body["master_address"],
                body["master_port"],
                body["world_size"],
                False,
                timeout=datetime.timedelta(seconds=30),
            )
            self.group = dist.ProcessGroupGloo(
                store, body["rank_offset"], body["world_size"], datetime.timedelta(seconds=30)
            )
            return {"success": True, "message": ""}
        if path == "/update_weights_from_distributed":
            opts = torch.distributed.BroadcastOptions()
            opts.rootRank = 0
            for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"]):
                t = torch.empty(shape, dtype=getattr(torch, dtype))
                self.group.broadcast([t], opts).wait()
                self.received[name] = t
            return {"success": True, "message": ""}
        if path == "/update_weights_from_disk":
            assert (Path(body["model_path"]) / "config.json").exists()
            return {"success": True, "message": ""}
        return None

    def close(self):
        self.server.shutdown()


@pytest.fixture
def fakes():
    servers = [FakeSGLang(), FakeSGLang()]
    yield servers
    for s in servers:
        s.close()


def test_generate_payload_and_parsing(fakes):
    engine = SGLangEngine([SGLangServer(f.url) for f in fakes], seed=3)
    sp = SamplingParams(max_new_tokens=7, temperature=0.9, top_p=0.8, top_k=5, stop=["</answer>"], stop_token_ids=[2])
    results = engine.generate([GenerateRequest([1, 10], sp, n=2), GenerateRequest([1, 20], sp, n=1)])
    assert [[r.token_ids for r in g] for g in results] == [[[10, 2], [11, 2]], [[20, 2]]]
    assert results[0][1].log_probs == [-1.5, -0.25] and results[0][0].finish_reason == FinishReason.STOP
    # requests were spread over both servers
    assert len(fakes[0].calls) == len(fakes[1].calls) == 1
    body = fakes[0].calls[0][1]
    assert body["input_ids"] == [1, 10] and body["return_logprob"] is True
    assert body["sampling_params"] == {
        "max_new_tokens": 7,
        "temperature": 0.9,
        "top_p": 0.8,
        "top_k": 5,
        "n": 2,
        "ignore_eos": False,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
        "stop": ["</answer>"],
        "stop_token_ids": [2],
        "sampling_seed": 3 * 1_000_003,
    }
    engine.shutdown()


def test_parse_length_and_errors():
    out = parse_generate(
        {
            "output_ids": [4],
            "meta_info": {"output_token_logprobs": [[-1.0, 4, None]], "finish_reason": {"type": "length", "length": 1}},
        },
        1,
        7,
    )
    assert out[0].finish_reason == FinishReason.LENGTH and out[0].weight_version == 7
    with pytest.raises(SGLangError, match="returned 1 outputs for n=2"):
        parse_generate({"meta_info": {}}, 2, 0)
    p = generate_payload(GenerateRequest([1], SamplingParams(ignore_eos=True, stop_token_ids=[2], top_k=-1)))
    assert "stop_token_ids" not in p["sampling_params"] and p["sampling_params"]["top_k"] == -1


def test_update_weights_from_tensor_and_memory(fakes):
    engine = SGLangEngine([SGLangServer(f.url) for f in fakes], tp_size=2, bucket_bytes=16)
    named = [("model.a", torch.arange(6.0).view(2, 3)), ("model.b", torch.ones(20))]
    engine.update_weights(named, version=4)
    for f in fakes:
        assert torch.equal(f.received["model.a"], named[0][1]) and torch.equal(f.received["model.b"], named[1][1])
        bodies = [b for p, b in f.calls if p == "/update_weights_from_tensor"]
        assert len(bodies) == 2  # a 24-byte and an 80-byte tensor, buckets of 16 bytes: one bucket each
        assert all(
            len(b["serialized_named_tensors"]) == 2 and b["weight_version"] == "4" and b["flush_cache"] for b in bodies
        )
    engine.sleep()
    engine.wake_up()
    assert [p for p, _ in fakes[0].calls][-2:] == ["/release_memory_occupation", "/resume_memory_occupation"]
    assert engine.weight_version == 4


def test_update_weights_from_distributed_broadcasts(fakes):
    engine = SGLangEngine([SGLangServer(fakes[0].url)], weight_update="distributed")
    port = free_port()
    engine.init_weight_group("127.0.0.1", port, backend="gloo")
    ((path, body),) = fakes[0].calls
    assert path == "/init_weights_update_group"
    assert body == {
        "master_address": "127.0.0.1",
        "master_port": port,
        "rank_offset": 1,
        "world_size": 2,
        "group_name": SGLangEngine.GROUP,
        "backend": "gloo",
    }
    named = [("w1", torch.randn(3, 4)), ("w2", torch.randn(5).to(torch.bfloat16))]
    engine.update_weights(named, version=9)
    upd = [b for p, b in fakes[0].calls if p == "/update_weights_from_distributed"][0]
    assert upd["names"] == ["w1", "w2"] and upd["dtypes"] == ["float32", "bfloat16"]
    assert upd["shapes"] == [[3, 4], [5]] and upd["weight_version"] == "9"
    assert torch.equal(fakes[0].received["w1"], named[0][1]) and torch.equal(fakes[0].received["w2"], named[1][1])


def test_update_weights_from_disk(fakes, tiny_model_path):
    from reinforge.models.loading import build_model

    engine = SGLangEngine([SGLangServer(fakes[0].url)], weight_update="disk", model_source=str(tiny_model_path))
    engine.update_weights(build_model(tiny_model_path, torch.float32).named_parameters(), version=2)
    assert [p for p, _ in fakes[0].calls] == ["/update_weights_from_disk"]


def test_launch_command_and_pass_through():
    cmd = launch_command(
        "/m",
        "127.0.0.1",
        15000,
        15001,
        15002,
        tp_size=2,
        base_gpu_id=4,
        mem_fraction_static=0.6,
        seed=7,
        enable_memory_saver=True,
        extra_args={
            "mem_fraction_static": 0.7,
            "enable_metrics": True,
            "disable_radix_cache": False,
            "cuda_graph_bs": [1, 2],
        },
    )
    s = " ".join(cmd[1:])
    assert s.startswith(
        "-m sglang.launch_server --model-path /m --host 127.0.0.1 --port 15000 --nccl-port 15001 "
        "--dist-init-addr 127.0.0.1:15002 --tp-size 2 --base-gpu-id 4 --mem-fraction-static 0.6 "
        "--random-seed 7 --skip-server-warmup --trust-remote-code --enable-memory-saver"
    )
    assert s.endswith("--mem-fraction-static 0.7 --enable-metrics --cuda-graph-bs 1 2")
    assert "disable-radix-cache" not in s


def test_port_allocation_skips_taken_ports_and_never_repeats():
    with socket.socket() as taken:
        taken.bind(("", 0))
        busy = taken.getsockname()[1]
        ports = PortAllocator(busy)
        first = ports.take(1)
        assert first != busy
        block = ports.take(31)
        assert block > first and all(PortAllocator._free(p) for p in range(block, block + 31))


def test_server_that_dies_is_reported_with_cause(tmp_path):
    script = (
        "import sys; print('requests.exceptions.ConnectionError: HTTPConnectionPool: "
        "Max retries exceeded with url: /get_model_info'); sys.exit(3)"
    )
    server = start_server([sys.executable, "-c", script], "http://127.0.0.1:1", tmp_path)
    with pytest.raises(SGLangError) as e:
        wait_ready(server, timeout=30, index=2, poll=0.1)
    msg = str(e.value)
    assert "SGLang server 2 (http://127.0.0.1:1) exited with code 3" in msg
    assert "another process holds the port" in msg and "engine.sglang_port_base" in msg


def test_server_that_never_answers_times_out(tmp_path):
    server = start_server([sys.executable, "-c", "import time; time.sleep(30)"], "http://127.0.0.1:9", tmp_path)
    with pytest.raises(SGLangError, match="did not answer /health_generate within 1 s"):
        wait_ready(server, timeout=1, poll=0.2)
    server.process.kill()


def test_update_weights_in_the_checkpoints_layout(fakes, tmp_path):
    """The sync sends what the model's checkpoints hold: a GPT-OSS's stacked experts whole (its hub layout),
    a Qwen3-MoE's per expert."""
    import json

    stacked = ("model.layers.0.mlp.experts.gate_up_proj", torch.arange(48.0).view(2, 4, 6))
    for model_type, expected in [
        ("gpt_oss", {stacked[0]}),
        ("qwen3_moe", {f"model.layers.0.mlp.experts.{e}.{p}.weight" for e in (0, 1) for p in ("gate_proj", "up_proj")}),
    ]:
        folder = tmp_path / model_type
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"model_type": model_type}))
        fakes[0].received.clear()
        SGLangEngine([SGLangServer(fakes[0].url)], model_source=str(folder)).update_weights([stacked], version=1)
        assert set(fakes[0].received) == expected, model_type
    assert torch.equal(SGLangEngine([SGLangServer(fakes[0].url)]).to_hub([stacked]).__next__()[1], stacked[1][0, :2])
