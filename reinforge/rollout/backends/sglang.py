"""SGLang servers as rollout engines (``engine.backend: sglang``; ``pip install reinforge[sglang]``).

reinforge talks to SGLang's HTTP API (the endpoints slime uses):

* ``POST /generate`` with ``input_ids``, ``sampling_params`` (``n`` samples per prompt) and
  ``return_logprob``; tokens and log-probs come from ``meta_info.output_token_logprobs``
  (``[logprob, token_id, text]`` per token), the finish reason from ``meta_info.finish_reason.type``;
* weight updates: ``/update_weights_from_tensor`` (colocated: tensors pickled with torch's
  ``ForkingPickler`` so CUDA tensors travel as IPC handles, base64-encoded, one entry per TP
  rank), ``/init_weights_update_group`` + ``/update_weights_from_distributed`` (disaggregated:
  names / dtypes / shapes over HTTP, the tensors broadcast over a NCCL group in which this
  process is rank 0), or ``/update_weights_from_disk``;
* ``/release_memory_occupation`` / ``/resume_memory_occupation`` for colocated sleep / wake-up;
* readiness: ``GET /health_generate`` until it answers 200.

Servers are either given (``engine.sglang_urls``) or launched by reinforge, one per engine,
with ``python -m sglang.launch_server``; ``engine.sglang_server_args`` passes any further
server flag (``{mem_fraction_static: 0.7}`` becomes ``--mem-fraction-static 0.7``), as slime's
``--sglang-*`` flags do. Ports are allocated per host from ``engine.sglang_port_base`` upwards,
each checked free and never handed out twice, so several servers on one machine do not collide.
Several servers can sit behind ``sglang-router`` (``engine.sglang_router: true``); otherwise
requests are spread over them here.

What was run for real: nothing of SGLang itself (it does not run on these CPU-only machines).
The client, the launch command line, port allocation, readiness errors and the weight-update
payloads are tested against a loopback fake server that follows SGLang's documented API
(``tests/unit/test_sglang.py``), including a real gloo broadcast for the distributed update.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from ...records import FinishReason, GenerateRequest, GenerateResult
from ...utils import seeds, stall
from ...weights.broadcast import send_each
from ...weights.buckets import bucket_by_bytes
from ...weights.disk import weights_folder
from ...weights.groups import weight_sync_group
from ...weights.ipc import serialize_named_tensors

log = logging.getLogger(__name__)


class SGLangError(RuntimeError):
    """A server failed to start or answered with an error; the message says which and why."""


# ---------------------------------------------------------------------------- launching


class PortAllocator:
    """Hands out runs of consecutive free ports on this host, never the same port twice."""

    def __init__(self, base: int = 15000):
        self.cursor = base
        self.lock = threading.Lock()

    @staticmethod
    def _free(port: int) -> bool:
        with socket.socket() as s:
            try:
                s.bind(("", port))
                return True
            except OSError:
                return False

    def take(self, count: int = 1) -> int:
        """First port of ``count`` consecutive free ports at or above the cursor."""
        with self.lock:
            port = self.cursor
            while port + count < 65536:
                if all(self._free(p) for p in range(port, port + count)):
                    self.cursor = port + count
                    return port
                port += 1
        raise SGLangError(f"no {count} consecutive free ports above {self.cursor}")


def server_flags(args: dict[str, Any]) -> list[str]:
    """``{"mem_fraction_static": 0.7, "enable_metrics": True}`` -> ``--mem-fraction-static 0.7 --enable-metrics``."""
    out: list[str] = []
    for key, value in args.items():
        flag = "--" + key.replace("_", "-")
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, (list, tuple)):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out


def kv_cache_flag(kv_cache_dtype: str) -> dict[str, str]:
    """SGLang's ``--kv-cache-dtype`` for ``engine.kv_cache_dtype`` (SGLang spells vLLM's ``fp8`` as
    ``fp8_e4m3``); none for ``auto``."""
    if kv_cache_dtype == "auto":
        return {}
    return {"kv_cache_dtype": "fp8_e4m3" if kv_cache_dtype == "fp8" else kv_cache_dtype}


def launch_command(
    model_path: str,
    host: str,
    port: int,
    nccl_port: int,
    dist_init_port: int,
    *,
    tp_size: int = 1,
    base_gpu_id: int = 0,
    mem_fraction_static: float = 0.5,
    seed: int = 0,
    enable_memory_saver: bool = False,
    extra_args: dict[str, Any] | None = None,
) -> list[str]:
    """The ``python -m sglang.launch_server`` command line of one engine (slime's settings)."""
    cmd = [
        sys.executable,
        "-m",
        "sglang.launch_server",
        "--model-path",
        str(model_path),
        "--host",
        host,
        "--port",
        str(port),
        "--nccl-port",
        str(nccl_port),
        "--dist-init-addr",
        f"{host}:{dist_init_port}",
        "--tp-size",
        str(tp_size),
        "--base-gpu-id",
        str(base_gpu_id),
        "--mem-fraction-static",
        str(mem_fraction_static),
        "--random-seed",
        str(seed),
        "--skip-server-warmup",
        "--trust-remote-code",
    ]
    if enable_memory_saver:
        cmd.append("--enable-memory-saver")
    return cmd + server_flags(extra_args or {})


@dataclass
class SGLangServer:
    url: str
    command: list[str] = field(default_factory=list)
    process: subprocess.Popen | None = None
    log_path: Path | None = None

    def log_tail(self, lines: int = 20) -> str:
        if self.log_path is None or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])


def start_server(command: list[str], url: str, log_dir: Path) -> SGLangServer:
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"sglang_{url.rsplit(':', 1)[-1]}.log"
    handle = log_path.open("w")
    env = dict(os.environ)
    env.pop("PYTORCH_CUDA_ALLOC_CONF", None)  # SGLang's memory saver needs the default allocator
    process = subprocess.Popen(command, stdout=handle, stderr=subprocess.STDOUT, env=env)
    return SGLangServer(url, command, process, log_path)


def wait_ready(server: SGLangServer, timeout: float, index: int = 0, poll: float = 2.0) -> None:
    """Poll ``GET /health_generate`` until 200.

    Raises:
        SGLangError: the server process exited, or did not become ready in ``timeout`` seconds;
            the message names the server, its log tail and the likely cause.
    """
    import requests

    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if server.process is not None and server.process.poll() is not None:
            raise SGLangError(
                f"SGLang server {index} ({server.url}) exited with code {server.process.returncode} before it was "
                f"ready.{_hint(server.log_tail())}\ncommand: {' '.join(server.command)}\n"
                f"last lines of {server.log_path}:\n{server.log_tail()}"
            )
        try:
            r = requests.get(server.url + "/health_generate", timeout=10)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except requests.RequestException as e:
            last = type(e).__name__
        time.sleep(poll)
    raise SGLangError(
        f"SGLang server {index} ({server.url}) did not answer /health_generate within {timeout:g} s "
        f"(last: {last}).{_hint(server.log_tail())}\nlast lines of {server.log_path}:\n"
        f"{server.log_tail()}"
    )


def _hint(log_tail: str) -> str:
    if "get_model_info" in log_tail or "Address already in use" in log_tail:
        return (
            " Its warm-up could not reach its own HTTP port ('Max retries exceeded with url: /get_model_info'): "
            "another process holds the port, usually another server on the same machine; reinforge allocates "
            "ports from engine.sglang_port_base, so move that base or run fewer servers per machine."
        )
    if "out of memory" in log_tail.lower():
        return " It ran out of GPU memory: lower mem_fraction_static in engine.sglang_server_args."
    return ""


# ---------------------------------------------------------------------------- payloads


def generate_payload(request: GenerateRequest, seed: int | None = None) -> dict[str, Any]:
    """The ``/generate`` body for one request (``n`` samples of one prompt)."""
    p = request.params
    sampling: dict[str, Any] = {
        "max_new_tokens": p.max_new_tokens,
        "temperature": p.temperature,
        "top_p": p.top_p,
        "top_k": p.top_k if p.top_k > 0 else -1,
        "n": request.n,
        "ignore_eos": p.ignore_eos,
        "skip_special_tokens": False,
        "no_stop_trim": True,
        "spaces_between_special_tokens": False,
    }
    if p.stop:
        sampling["stop"] = list(p.stop)
    if p.stop_token_ids and not p.ignore_eos:
        sampling["stop_token_ids"] = list(p.stop_token_ids)
    if seed is not None:
        sampling["sampling_seed"] = seed
    return {"input_ids": list(request.prompt_ids), "sampling_params": sampling, "return_logprob": True}


def parse_generate(response: Any, n: int, version: int) -> list[GenerateResult]:
    """``/generate`` response (one dict, or a list of ``n``) -> results."""
    items = response if isinstance(response, list) else [response]
    if len(items) != n:
        raise SGLangError(f"/generate returned {len(items)} outputs for n={n}")
    out = []
    for item in items:
        meta = item["meta_info"]
        pairs = meta.get("output_token_logprobs") or []
        tokens = [int(t[1]) for t in pairs] or list(item.get("output_ids", []))
        log_probs = [float(t[0]) for t in pairs]
        reason = (meta.get("finish_reason") or {}).get("type", "length")
        out.append(GenerateResult(tokens, log_probs, FinishReason.parse(reason), version))
    return out


def distributed_update_payload(named: list[tuple[str, torch.Tensor]], group_name: str, version: int) -> dict[str, Any]:
    return {
        "names": [n for n, _ in named],
        "dtypes": [str(t.dtype).removeprefix("torch.") for _, t in named],
        "shapes": [list(t.shape) for _, t in named],
        "group_name": group_name,
        "flush_cache": True,
        "weight_version": str(version),
    }


# ---------------------------------------------------------------------------- engine


class SGLangEngine:
    """Implements ``RolloutEngine`` over one or more SGLang servers.

    Args:
        servers: the servers (launched or given); requests go to the router when one is given.
        router_url: an ``sglang-router`` in front of the servers, or None.
        weight_update: ``tensor`` (same machine), ``distributed`` (NCCL broadcast from this
            process) or ``disk`` (a temporary Hugging Face folder).
        model_source: the policy's folder (config / tokenizer for ``disk`` updates).
        tp_size: tensor-parallel size of each server (one serialized entry per TP rank).
    """

    GROUP = "reinforge_weight_sync"

    def __init__(
        self,
        servers: list[SGLangServer],
        *,
        router_url: str | None = None,
        weight_update: str = "tensor",
        model_source: str | None = None,
        tp_size: int = 1,
        seed: int = 0,
        concurrency: int = 256,
        bucket_bytes: int = 256 << 20,
    ):
        self.servers, self.router_url = servers, router_url
        self.weight_update, self.model_source, self.tp_size = weight_update, model_source, tp_size
        from ...models.loading import hub_layout

        self.to_hub = hub_layout(model_source)  # the names and expert layout SGLang's loader reads
        self.seed, self.weight_version = seed, 0
        self.bucket_bytes = bucket_bytes
        self.pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="sglang")
        self.group = None

    # ------------------------------------------------------------------ http
    def _post(self, url: str, path: str, body: dict[str, Any] | None = None, timeout: float | None = None) -> Any:
        import requests

        try:
            r = requests.post(url + path, json=body or {}, timeout=timeout)
        except requests.RequestException as e:
            raise SGLangError(f"SGLang server {url}: POST {path} failed: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise SGLangError(f"SGLang server {url}: POST {path} answered HTTP {r.status_code}: {r.text[:500]}")
        try:
            data = r.json()
        except ValueError:
            return None
        if isinstance(data, dict) and data.get("success") is False:
            raise SGLangError(f"SGLang server {url}: {path} failed: {data.get('message')}")
        return data

    def _all(self, path: str, body: dict[str, Any] | None = None) -> list[Any]:
        return list(self.pool.map(lambda s: self._post(s.url, path, body), self.servers))

    # ------------------------------------------------------------------ RolloutEngine
    def generate(self, requests: list[GenerateRequest]) -> list[list[GenerateResult]]:
        urls = [self.router_url] if self.router_url else [s.url for s in self.servers]

        busy = stall.busy("engine", "engine (sglang)", sequences=sum(r.n for r in requests), unit="answer")
        lock = threading.Lock()

        def one(i: int) -> list[GenerateResult]:
            req = requests[i]
            body = generate_payload(req, seeds.derive(self.seed, seeds.REQUEST, i))
            out = parse_generate(self._post(urls[i % len(urls)], "/generate", body), req.n, self.weight_version)
            with lock:  # progress for the stall doctor: one request answered
                busy.beat(sequences=busy.fields["sequences"] - req.n)
            return out

        with busy:
            return list(self.pool.map(one, range(len(requests))))

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        named = [(n, t.detach()) for n, t in self.to_hub(named_tensors)]  # the checkpoints' layout
        if self.weight_update == "tensor":
            for bucket in bucket_by_bytes(named, self.bucket_bytes):
                # one serialization per server and TP rank: a CPU tensor's shared-memory handle
                # can be opened once only (CUDA IPC handles could be reused)
                bodies = [
                    {
                        "serialized_named_tensors": [serialize_named_tensors(bucket) for _ in range(self.tp_size)],
                        "flush_cache": True,
                        "weight_version": str(version),
                    }
                    for _ in self.servers
                ]
                list(
                    self.pool.map(
                        lambda sb: self._post(sb[0].url, "/update_weights_from_tensor", sb[1]),
                        zip(self.servers, bodies),
                    )
                )
        elif self.weight_update == "distributed":
            self._update_distributed(named, version)
        elif self.weight_update == "disk":
            with weights_folder(named, self.model_source) as d:
                self._all("/update_weights_from_disk", {"model_path": str(d), "weight_version": str(version)})
        else:
            raise ValueError(f"unknown engine.sglang_weight_update {self.weight_update!r}")
        self.weight_version = version

    def init_weight_group(self, master_address: str, master_port: int, backend: str = "nccl") -> None:
        """Form the broadcast group: this process is rank 0, server i's TP ranks follow."""
        world = 1 + self.tp_size * len(self.servers)
        bodies = [
            {
                "master_address": master_address,
                "master_port": master_port,
                "rank_offset": 1 + i * self.tp_size,
                "world_size": world,
                "group_name": self.GROUP,
                "backend": backend,
            }
            for i in range(len(self.servers))
        ]
        futures = [
            self.pool.submit(self._post, s.url, "/init_weights_update_group", b) for s, b in zip(self.servers, bodies)
        ]
        self.group = weight_sync_group(master_address, master_port, 0, world, backend)
        for f in futures:
            f.result()

    def _update_distributed(self, named: list[tuple[str, torch.Tensor]], version: int) -> None:
        if self.group is None:
            raise SGLangError("distributed weight update before init_weight_group()")
        for bucket in bucket_by_bytes(named, self.bucket_bytes):
            body = distributed_update_payload(bucket, self.GROUP, version)
            futures = [
                self.pool.submit(self._post, s.url, "/update_weights_from_distributed", body) for s in self.servers
            ]
            send_each(self.group, bucket)  # in the order of the names: the servers receive them so
            for f in futures:
                f.result()

    def reseed(self, seed: int) -> None:
        self.seed = seed

    def sleep(self, offload_weights: bool = False) -> None:
        self._all("/release_memory_occupation", {"tags": None})

    def wake_up(self) -> None:
        self._all("/resume_memory_occupation", {"tags": None})

    def shutdown(self) -> None:
        for s in self.servers:
            if s.process is not None and s.process.poll() is None:
                s.process.terminate()
                try:
                    s.process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    s.process.kill()
        self.pool.shutdown(wait=False, cancel_futures=True)


def launch_router(servers: list[SGLangServer], host: str, port: int, log_dir: Path) -> str:
    """Start ``sglang-router`` and register the servers (``POST /workers``); returns its URL."""
    import requests

    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", host, "--port", str(port)]
    router = start_server(cmd, f"http://{host}:{port}", log_dir)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if router.process.poll() is not None:
            raise SGLangError(f"sglang-router exited with code {router.process.returncode}:\n{router.log_tail()}")
        try:
            requests.get(router.url + "/workers", timeout=5)
            break
        except requests.RequestException:
            time.sleep(1)
    for s in servers:
        r = requests.post(router.url + "/workers", json={"url": s.url, "worker_type": "regular"}, timeout=30)
        if r.status_code >= 300:
            raise SGLangError(f"sglang-router refused worker {s.url}: HTTP {r.status_code} {r.text[:300]}")
    return router.url


def from_spec(spec) -> SGLangEngine:
    """The ``sglang`` backend's factory (:mod:`reinforge.rollout.backends`): the given servers
    (``engine.sglang_urls``), or ``spec.num_engines`` launched ones, optionally behind a router."""
    r, tp = spec.engine, spec.tensor_parallel_size
    log_dir = spec.log_dir / "sglang_logs"
    if r.sglang_urls:
        servers = [SGLangServer(u.rstrip("/")) for u in r.sglang_urls]
    else:
        ports = PortAllocator(r.sglang_port_base)
        servers = []
        for i in range(spec.num_engines):
            port, nccl, dist_init = ports.take(1), ports.take(1), ports.take(31)
            extra = {
                "context_length": spec.max_model_len,
                **kv_cache_flag(r.kv_cache_dtype),
                **({"quantization": r.quantization} if r.quantization else {}),  # --quantization fp8
                **(r.sglang_server_args or {}),
            }
            cmd = launch_command(
                str(spec.model_path),
                r.sglang_host,
                port,
                nccl,
                dist_init,
                tp_size=tp,
                base_gpu_id=i * tp,
                mem_fraction_static=r.kv_cache_memory_fraction,
                seed=spec.seed + i,
                enable_memory_saver=spec.colocate,
                extra_args=extra,
            )
            servers.append(start_server(cmd, f"http://{r.sglang_host}:{port}", log_dir))
    for i, s in enumerate(servers):
        wait_ready(s, r.sglang_launch_timeout, i)
    router = None
    if r.sglang_router and len(servers) > 1:
        router = launch_router(servers, r.sglang_host, PortAllocator(r.sglang_port_base + 2000).take(1), log_dir)
    return SGLangEngine(
        servers,
        router_url=router,
        weight_update=r.sglang_weight_update,
        model_source=str(spec.model_path),
        tp_size=tp,
        seed=spec.seed,
        bucket_bytes=spec.bucket_bytes,
    )
