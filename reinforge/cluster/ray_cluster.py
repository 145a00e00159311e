"""Ray placement: trainer ranks and rollout engines as Ray actors in one placement group.

* One **placement group** holds a bundle per trainer rank and, when disaggregated, a bundle per engine. Before
  anything is placed, the resources asked for are checked against the cluster and a shortfall is reported in words
  (no hanging at submission).
* **Trainer actors** (one per GPU) each run a :class:`TrainWorker`; together they form the torch process group (NCCL
  on GPUs, gloo on CPU) that FSDP2 shards over.
* **Engine actors** each run an embedded engine. ``colocate: true`` places engine ``i`` on trainer ``i``'s GPU (half
  a GPU each in Ray's accounting): engines ``sleep()`` while the trainers train and ``wake_up()`` before the
  rollout. Otherwise engines have their own GPUs.
* **The rollout moves once**: each step the driver puts the rollout in the object store (``ray.put``) and hands
  every trainer rank the reference; each takes its share of whole groups, computes their log-probs, values and
  advantages and trains on them (``TrainWorker.score`` / ``train``); only metrics come back
  (``bench/driver_bytes.py`` measures it).
* **Weight sync** after every optimizer phase, in buckets of ``cluster.weight_sync_bucket_mb``: colocated, each
  trainer rank gathers the full tensors from the FSDP shards for the engine on its GPU (CUDA IPC handles; by value
  on CPU); disaggregated, trainer rank 0 broadcasts flat buckets over a dedicated group to every engine.
* **Multi-engine rollout** (:class:`EnginePool`): requests spread by expected tokens; a failing engine named.
* **Trace** (``run.trace``): each actor's spans, one track group per process in ``trace.json`` (:mod:`.ray_trace`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from ..config import Config
from ..records import GenerateRequest, GenerateResult, Sample
from ..utils import faults, seeds, stall, trace
from ..utils.net import free_port
from ..weights import ipc
from ..weights.groups import backend_for, weight_sync_group
from ..weights.ray_transport import (
    EngineDtype,
    receive_broadcast,
    receive_ipc,
    send_broadcast,
    send_by_value,
    send_colocated,
    sync_metrics,
    transport_name,
    unwrap_mismatch,
)
from ..weights.verify import checkable
from .base import ClusterSpec
from .ray_trace import ActorTraces, TracedActor
from .resources import ClusterError, check_placement, machine_resources, placement_counts

if TYPE_CHECKING:
    from ..train.rollout_share import RolloutBatch

log = logging.getLogger(__name__)


def plan(cfg: Config) -> dict[str, int]:
    """Counts of the placement: trainer ranks, engines, GPUs needed."""
    n = placement_counts(cfg)
    return {"trainers": n["trainers"], "engines": n["engines"], "gpus": n["gpus"]}


def check_resources(
    cfg: Config,
    resources: dict[str, float],
    model_folder: Path | None = None,
    max_model_len: int | None = None,
    where: str = "the Ray cluster",
) -> bool:
    """Whether the run uses GPUs; raises :class:`ClusterError` describing any shortfall
    (:func:`reinforge.cluster.resources.check_placement`)."""
    return check_placement(cfg, resources, model_folder, max_model_len, where)


def get_all(refs: list[Any]) -> list[Any]:
    """``ray.get(refs)``, but the first failure raises at once: when one trainer rank dies the
    others block in a collective, and waiting for them in order would hang until its timeout."""
    import ray

    pending = list(refs)
    while pending:
        done, pending = ray.wait(pending, num_returns=1)
        ray.get(done[0])  # raises the task's error (RayActorError when its process died)
    return ray.get(list(refs))


# ---------------------------------------------------------------------------- actors


class TrainerActor(TracedActor):
    """Hosts one :class:`TrainWorker` (wrapped with ``ray.remote`` at run time)."""

    def address(self) -> tuple[str, int]:
        import ray

        return ray.util.get_node_ip_address(), free_port("")

    def setup(
        self,
        cfg: Config,
        base_path: str,
        critic_path: str | None,
        rank: int,
        world: int,
        addr: str,
        port: int,
        pad_id: int,
    ) -> dict[str, Any]:
        from ..train.worker import TrainWorker

        stall.join(f"rank {rank}", rank=rank)  # its stacks and progress in the stall doctor's report
        with trace.span("setup", "train", rank=rank):
            self.worker = TrainWorker(
                cfg,
                base_path,
                critic_path,
                rank=rank,
                world_size=world,
                master_addr=addr,
                master_port=port,
                pad_id=pad_id,
            )
            self.worker.release_cached_memory()  # the full model built before sharding: not the engine's to use
        self.weight_group = None
        return self.worker.describe()

    def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        with trace.span(method, "train"):
            return getattr(self.worker, method)(*args, **kwargs)

    def init_weight_group(self, addr: str, port: int, size: int) -> None:
        self.weight_group = weight_sync_group(addr, port, 0, size, backend_for(self.worker.device))

    def sync_colocated(self, engine: Any, version: int, bucket_bytes: int, dtype: Any = None) -> dict[str, float]:
        """Gather the full weights (all ranks must run this) and hand them to the engine on this GPU
        (:func:`~reinforge.weights.ray_transport.send_colocated`; verified with ``dtype``)."""
        with trace.span("sync_colocated", "sync", version=version):
            return send_colocated(self.worker.weight_buckets(bucket_bytes), engine, version, dtype)

    def send_weights(self, engine: Any, version: int, bucket_bytes: int) -> None:
        """Gather the full weights (all ranks must run this); the rank given an ``engine`` sends
        them by value through the object store (a replaced engine: works on any device)."""
        with trace.span("send_weights", "sync", version=version):
            send_by_value(self.worker.weight_buckets(bucket_bytes), engine, version)

    def sync_broadcast(self, engines: list[Any] | None, version: int, bucket_bytes: int, dtype: Any = None) -> dict:
        """Gather the full weights (all ranks); rank 0 broadcasts each bucket to the engines
        (:func:`~reinforge.weights.ray_transport.send_broadcast`; verified with ``dtype``)."""
        transport = "NCCL broadcast" if backend_for(self.worker.device) == "nccl" else "gloo broadcast"
        with trace.span("sync_broadcast", "sync", version=version):
            buckets = self.worker.weight_buckets(bucket_bytes)
            return send_broadcast(self.weight_group, buckets, engines, version, dtype, transport)


class EngineActor(TracedActor):
    """Hosts one rollout engine (wrapped with ``ray.remote`` at run time)."""

    def setup(self, cfg: Config, base_path: str, max_model_len: int, index: int) -> dict[str, Any]:
        import ray

        from ..models.loading import load_tokenizer
        from ..rollout.backends import build_engine, engine_spec
        from ..utils.device import resolve_device

        self.index = index
        stall.join(f"engine actor {index}")  # its stacks and progress in the stall doctor's report
        self.device = resolve_device(cfg.train.device)
        with trace.span("setup", "engine", index=index):
            self.engine = build_engine(
                engine_spec(cfg, Path(base_path), load_tokenizer(base_path), self.device, max_model_len, index=index)
            )
        self.weight_group = None
        return {"index": index, "node": ray.util.get_node_ip_address(), "gpus": [str(g) for g in ray.get_gpu_ids()]}

    def generate(self, requests: list[GenerateRequest]) -> list[list[GenerateResult]]:
        faults.hit("engine_generate")  # fault injection (tests): no-op unless REINFORGE_FAULT arms it
        with trace.span("generate", "engine", requests=len(requests), samples=sum(r.n for r in requests)):
            return self.engine.generate(requests)

    def update_weights(self, named: list[tuple[str, torch.Tensor]], version: int) -> None:
        with trace.span("update_weights", "sync", version=version, tensors=len(named)):
            self.engine.update_weights(named, version)

    def update_weights_ipc(self, handles: ipc.Handles, version: int) -> None:
        with trace.span("update_weights", "sync", version=version, ipc=True):
            receive_ipc(self.engine, handles, version)

    def engine_index(self) -> int:
        return self.index

    def weight_dtype(self) -> torch.dtype | None:  # (None: the engine reports no checksums)
        return self.engine.weight_dtype if checkable(self.engine) else None

    def weight_checksums(self, names: list[str]) -> dict[str, int | None]:  # (reinforge.weights.verify)
        with trace.span("weight_checksums", "sync", tensors=len(names)):
            return self.engine.weight_checksums(names)

    def init_weight_group(self, addr: str, port: int, rank: int, size: int) -> None:
        self.weight_group = weight_sync_group(addr, port, rank, size, backend_for(self.device))

    def receive_bucket(self, meta: list[tuple[str, tuple[int, ...]]], version: int) -> None:
        with trace.span("receive_bucket", "sync", version=version, tensors=len(meta)):
            receive_broadcast(self.engine, self.weight_group, meta, self.device, version)

    def reseed(self, seed: int) -> None:
        self.engine.reseed(seed + seeds.ENGINE_INDEX * self.index)

    def interrupt(self) -> None:
        """Make the running ``generate`` return early (partial rollouts: the actor is threaded, so
        this runs while ``generate`` does)."""
        self.engine.interrupt()

    def resume(self) -> None:
        self.engine.resume()

    def sleep(self, offload_weights: bool = False) -> None:
        with trace.span("sleep", "engine"):
            self.engine.sleep(offload_weights=offload_weights)

    def wake_up(self) -> None:
        with trace.span("wake_up", "engine"):
            self.engine.wake_up()

    def shutdown(self) -> None:
        self.engine.shutdown()


# ---------------------------------------------------------------------------- driver side


class EnginePool:
    """Several engine actors behind the ``RolloutEngine`` interface.

    An engine actor that dies during :meth:`generate` (process killed, node lost) is replaced
    through ``respawn(index)`` (a new actor in its bundle with the current weights) and its
    requests are sent again, up to ``max_restarts`` times per run (``restarts`` counts them);
    other failures, and deaths outside generation, raise naming the engine.
    """

    def __init__(
        self,
        handles: list[Any],
        infos: list[dict[str, Any]],
        offload_weights: bool = False,
        respawn: Callable[[int], None] | None = None,
        max_restarts: int = 0,
    ):
        self.handles, self.infos = handles, infos
        self.weight_version = 0
        self.offload_weights = offload_weights
        self.respawn, self.max_restarts = respawn, max_restarts
        self.restarts = 0
        self._seed: int | None = None

    def _failure(self, e: int, err: Exception) -> RuntimeError:
        info = self.infos[e]
        cause = getattr(err, "cause", None) or err  # a RayTaskError wraps the engine's exception
        return RuntimeError(
            f"rollout engine {info['index']} on node {info['node']} (GPU "
            f"{','.join(info['gpus']) or 'none'}) failed: {type(cause).__name__}: {cause}"
        )

    def _get_or_replace(self, e: int, ref: Any, submit: Callable[[], Any]) -> Any:
        """``ray.get(ref)``; when engine ``e``'s actor died, replace it and ``submit()`` again."""
        import ray
        from ray.exceptions import RayActorError

        while True:
            try:
                return ray.get(ref)
            except RayActorError as err:
                if self.respawn is None or self.restarts >= self.max_restarts:
                    raise self._failure(e, err) from err
                self.restarts += 1
                log.warning(
                    "rollout engine %d on node %s died during generation (%s): replacing it (restart %d "
                    "of cluster.max_engine_restarts=%d) and re-queueing its requests",
                    e,
                    self.infos[e]["node"],
                    type(err).__name__,
                    self.restarts,
                    self.max_restarts,
                )
                self.respawn(e)
                if self._seed is not None:
                    ray.get(self.handles[e].reseed.remote(self._seed))
                ref = submit()
            except Exception as err:
                raise self._failure(e, err) from err

    def _get(self, refs: list[Any], engines: list[int] | None = None) -> list[Any]:
        """Results of one call per engine; a failure names the engine, its node and GPU."""
        import ray

        out = []
        for ref, e in zip(refs, engines if engines is not None else range(len(refs))):
            try:
                out.append(ray.get(ref))
            except Exception as err:
                raise self._failure(e, err) from err
        return out

    def generate(self, requests: list[GenerateRequest]) -> list[list[GenerateResult]]:
        """Spread requests over the engines by expected tokens (longest first to the least loaded)."""
        load = [0] * len(self.handles)
        assignment: list[list[int]] = [[] for _ in self.handles]
        cost = [r.n * (len(r.prompt_ids) + r.params.max_new_tokens) for r in requests]
        for i in sorted(range(len(requests)), key=lambda i: -cost[i]):
            e = min(range(len(load)), key=lambda k: load[k])
            assignment[e].append(i)
            load[e] += cost[i]
        busy = [e for e in range(len(self.handles)) if assignment[e]]

        def submit(e: int) -> Any:
            return self.handles[e].generate.remote([requests[i] for i in assignment[e]])

        refs = {e: submit(e) for e in busy}
        parts = [self._get_or_replace(e, refs[e], lambda e=e: submit(e)) for e in busy]
        results: list[list[GenerateResult] | None] = [None] * len(requests)
        for e, part in zip(busy, parts):
            for i, res in zip(assignment[e], part):
                results[i] = res
        return results  # type: ignore[return-value]

    def update_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        import ray

        ref = ray.put(list(named_tensors))
        self._get([h.update_weights.remote(ref, version) for h in self.handles])
        self.weight_version = version

    def reseed(self, seed: int) -> None:
        self._seed = seed
        self._get([h.reseed.remote(seed) for h in self.handles])

    def interrupt(self) -> None:
        """Every engine's running ``generate`` returns at its next step (asynchronous RL with
        partial rollouts; the engine actors are threaded then)."""
        self._get([h.interrupt.remote() for h in self.handles])

    def resume(self) -> None:
        self._get([h.resume.remote() for h in self.handles])

    def sleep(self, offload_weights: bool = False) -> None:
        self._get([h.sleep.remote(offload_weights or self.offload_weights) for h in self.handles])

    def wake_up(self) -> None:
        self._get([h.wake_up.remote() for h in self.handles])

    def shutdown(self) -> None:
        import ray

        for h in self.handles:
            try:
                ray.get(h.shutdown.remote(), timeout=30)
            except Exception:  # shutting down: nothing left to report to
                pass


class RayCluster:
    """Implements :class:`~reinforge.cluster.base.Cluster` with Ray actors: creates the placement
    group, trainer and engine actors, and owns their lifetime."""

    def __init__(self, cfg: Config, spec: ClusterSpec):
        import ray
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        self.cfg = cfg
        c, p = cfg.cluster, plan(cfg)
        self._started_ray = False
        if not ray.is_initialized() and not c.ray_address:  # starting Ray here: check this machine first
            check_resources(cfg, machine_resources(), spec.base_path, spec.max_model_len, where="this machine")
        if not ray.is_initialized():
            if c.ray_address:
                ray.init(address=c.ray_address, log_to_driver=True)
            else:
                bundles = p["trainers"] + (0 if c.colocate else p["engines"])
                cpus = max(os.cpu_count() or 1, int(bundles * c.num_cpus_per_worker) + 1)
                # the workers (trainer ranks, engines: the run) at the driver's priority, not Ray's default
                nice = {"worker_niceness": 0}  # niceness 15: on a busy machine they waited minutes to start
                ray.init(num_cpus=cpus, include_dashboard=False, log_to_driver=True, _system_config=nice)
            self._started_ray = True
        self.use_gpu = check_resources(cfg, ray.cluster_resources(), spec.base_path, spec.max_model_len)
        gpu = 1 if self.use_gpu else 0
        trainer_bundles = [{"CPU": c.num_cpus_per_worker, **({"GPU": 1} if gpu else {})} for _ in range(p["trainers"])]
        engine_bundles = (
            []
            if c.colocate
            else [
                {"CPU": c.num_cpus_per_worker, **({"GPU": c.rollout_num_gpus_per_engine} if gpu else {})}
                for _ in range(p["engines"])
            ]
        )
        self.pg = placement_group(trainer_bundles + engine_bundles, strategy="PACK")
        if not self.pg.wait(timeout_seconds=120):
            remove_placement_group(self.pg)
            raise ClusterError(
                f"Ray could not place {len(trainer_bundles)} trainer and {len(engine_bundles)} engine "
                f"bundles within 120 s (each {trainer_bundles[0]}): check `ray status`"
            )
        share = 0.5 if (gpu and c.colocate) else float(gpu)

        def on(bundle: int, num_gpus: float, cls, **options: Any):
            if not self._started_ray:  # (a Ray this run started: its workers inherit the environment)
                options.update(stall.ray_options())  # the actors join the stall doctor's reports
            return ray.remote(cls).options(
                num_cpus=c.num_cpus_per_worker / (2 if c.colocate else 1),
                num_gpus=num_gpus,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=bundle),
                **options,
            )

        self.workers = [on(i, share, TrainerActor).remote() for i in range(p["trainers"])]
        self.traces = ActorTraces() if cfg.run.trace else None
        self.engine_dtype = EngineDtype()  # the engines' weight dtype, for verified syncs
        if self.traces is not None:
            for i, w in enumerate(self.workers):
                self.traces.add(f"trainer {i}", w, f"trainer rank {i}", "train", 1 + i)
        addr, port = ray.get(self.workers[0].address.remote())
        critic = str(spec.critic_path) if spec.critic_path else None
        self.describe = ray.get(
            [
                w.setup.remote(cfg, str(spec.base_path), critic, i, p["trainers"], addr, port, spec.pad_id)
                for i, w in enumerate(self.workers)
            ]
        )
        engine_gpus = share if c.colocate else float(c.rollout_num_gpus_per_engine * gpu)
        engine_bundle = (lambda j: j) if c.colocate else (lambda j: p["trainers"] + j)
        # partial rollouts: interrupt() must reach an engine while its generate() runs (a threaded actor)
        threaded = {"max_concurrency": 2} if cfg.rollout.partial_rollout else {}
        self._new_engine = lambda j: on(engine_bundle(j), engine_gpus, EngineActor, **threaded).remote()
        self._engine_setup = (str(spec.base_path), spec.max_model_len)
        handles = [self._new_engine(j) for j in range(p["engines"])]
        for j, h in enumerate(handles):
            self._trace_engine(j, h)
        infos = ray.get([h.setup.remote(cfg, *self._engine_setup, j) for j, h in enumerate(handles)])
        self.engine = EnginePool(
            handles,
            infos,
            offload_weights=c.offload_engine_weights,
            respawn=self._replace_engine,
            max_restarts=c.max_engine_restarts,
        )
        if not c.colocate:
            self._init_weight_group()
        self.has_reference = cfg.algo.needs_reference
        self.has_critic = cfg.algo.needs_critic
        log.info(
            "ray placement: %d trainer ranks %s, %d engines %s (%s)",
            len(self.workers),
            [d.get("device") for d in self.describe],
            len(handles),
            infos,
            "colocated" if c.colocate else "disaggregated",
        )

    def _trace_engine(self, j: int, handle: Any) -> None:
        if self.traces is not None:
            self.traces.add(f"engine {j}", handle, f"engine {j}", "engine", 1 + len(self.workers) + j)

    def _init_weight_group(self) -> None:
        """(Re)build the disaggregated weight-sync group: trainer rank 0 and every engine."""
        import ray

        handles = self.engine.handles
        waddr, wport = ray.get(self.workers[0].address.remote())
        size = 1 + len(handles)
        ray.get(
            [self.workers[0].init_weight_group.remote(waddr, wport, size)]
            + [h.init_weight_group.remote(waddr, wport, j + 1, size) for j, h in enumerate(handles)]
        )

    def _replace_engine(self, j: int) -> None:
        """Engine ``j``'s actor died: start a new one in its bundle, give it the current weights
        (by value from the trainers; every rank gathers), and rebuild the weight-sync group."""
        import ray

        try:
            ray.kill(self.engine.handles[j])
        except Exception:  # already gone
            pass
        with trace.span("replace_engine", "rollout", engine=j) as s:
            h = self._new_engine(j)
            self._trace_engine(j, h)
            self.engine.infos[j] = ray.get(h.setup.remote(self.cfg, *self._engine_setup, j))
            self.engine.handles[j] = h
            version = self.engine.weight_version
            bucket = self.cfg.cluster.weight_sync_bucket_mb << 20
            ray.get([w.send_weights.remote(h if i == 0 else None, version, bucket) for i, w in enumerate(self.workers)])
            if not self.cfg.cluster.colocate:
                self._init_weight_group()
        log.info("rollout engine %d replaced in %.1f s (weights version %d)", j, s.seconds, version)

    def _on_every_rank(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Run a :class:`TrainWorker` method on every rank; rank 0's result (the first failure
        of any rank raises at once)."""
        return get_all([w.call.remote(method, *args, **kwargs) for w in self.workers])[0]

    # ------------------------------------------------------------------ Cluster
    def score(self, batch: RolloutBatch) -> dict[str, float]:
        """Put the rollout in the object store once and give every rank the reference (Ray hands each
        rank the object, read from its node's store; the driver sends the data once, not once per
        rank and call); each rank scores its share and keeps it (``TrainWorker.score``)."""
        import ray

        ref = ray.put(batch)
        return self._on_every_rank("score", ref)

    def train(self, rollout_id: int) -> dict[str, float]:
        return self._on_every_rank("train", rollout_id)

    def before_train(self) -> None:
        if self.cfg.cluster.colocate:
            self.engine.sleep()

    def after_train(self) -> None:
        if self.cfg.cluster.colocate:  # the ranks' cached blocks back to the driver, for the engines' KV caches
            self._on_every_rank("release_cached_memory")
            self.engine.wake_up()

    def sync_weights(self, version: int) -> dict[str, float]:
        """Colocated: every rank hands its engine the full tensors (IPC); disaggregated: rank 0
        broadcasts buckets to all engines. All ranks take part (FSDP all-gathers). Verified with
        ``cluster.verify_weight_sync`` (:mod:`reinforge.weights.ray_transport`: ``sync/verified``,
        ``sync/verify_seconds``)."""
        dtype = self.engine_dtype.get(self.engine.handles) if self.cfg.cluster.verify_weight_sync else None
        with trace.span("update_weights", "sync", version=version) as s:
            bucket, handles = self.cfg.cluster.weight_sync_bucket_mb << 20, self.engine.handles
            if self.cfg.cluster.colocate:
                targets = handles + [None] * (len(self.workers) - len(handles))
                calls = [w.sync_colocated.remote(e, version, bucket, dtype) for w, e in zip(self.workers, targets)]
            else:
                sends = [handles] + [None] * (len(self.workers) - 1)  # rank 0 broadcasts
                calls = [w.sync_broadcast.remote(e, version, bucket, dtype) for w, e in zip(self.workers, sends)]
            results = unwrap_mismatch(get_all, calls)  # a WeightSyncMismatch in one line, not Ray's traceback
            self.engine.weight_version = version
        if self.traces is not None:  # the actors' events of this step, into the driver's trace
            self.traces.collect()
        return {"time/sync": s.seconds, **sync_metrics(self.cfg.cluster.verify_weight_sync, results, self.engine)}

    @property
    def weight_transport(self) -> str:
        return transport_name(self.cfg.cluster.colocate, self.use_gpu)

    def probe_log_probs(self, samples: list[Sample]) -> list[torch.Tensor]:  # (the sync probe; every rank runs it)
        return self._on_every_rank("probe_log_probs", samples)

    def save(self, directory: Path, optimizer: bool = True) -> None:
        self._on_every_rank("save", str(directory), optimizer)

    def load(self, directory: Path) -> list[str]:
        return self._on_every_rank("load", str(directory))

    def shutdown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        if self.traces is not None:
            self.traces.close()
        self.engine.shutdown()
        for a in self.workers + self.engine.handles:
            try:
                ray.kill(a)
            except Exception:  # already gone
                pass
        try:
            remove_placement_group(self.pg)
        except Exception:  # already removed
            pass
        if self._started_ray:
            ray.shutdown()
