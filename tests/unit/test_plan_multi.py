"""The pure math of plans for many GPUs (issue 56 item 3): pipeline and expert parallelism's memory and time
(reinforge/plan/parallel.py) and the discrete-event model of the two sides (reinforge/plan/simulate.py)."""

from __future__ import annotations

import pytest

from reinforge.plan import GPUS
from reinforge.plan import model as M
from reinforge.plan import parallel as P
from reinforge.plan.arch import Arch
from reinforge.plan.simulate import StepPhases, choose_staleness, jittered, simulate

MOE = dict(
    model_type="qwen3_moe",
    vocab_size=49152,
    hidden_size=2048,
    intermediate_size=6144,
    moe_intermediate_size=768,
    num_experts=128,
    num_experts_per_tok=8,
    num_hidden_layers=24,
    num_attention_heads=32,
    num_key_value_heads=4,
    head_dim=128,
    tie_word_embeddings=True,
)
DENSE = dict(
    model_type="qwen2",
    vocab_size=49152,
    hidden_size=1024,
    intermediate_size=4096,
    num_hidden_layers=24,
    num_attention_heads=8,
    num_key_value_heads=4,
    tie_word_embeddings=True,
)


def work(arch: dict, **kw) -> M.Workload:
    base = dict(prompt_len=64, response_len=2048, num_seqs=128, slots=128, micro_tokens=16384, recompute=0, dp=4)
    return M.Workload(arch=Arch.from_config(arch), gpu=GPUS["h200"], **{**base, **kw})


# ------------------------------------------------------------------------------------------- pipeline


def test_the_bubble_is_p_minus_1_over_v_microbatch_times():
    assert P.pipeline_time_factor(8, 1) == 1.0
    assert P.pipeline_time_factor(2, 2) == pytest.approx(3 / 2)  # (m + p - 1) / m
    assert P.pipeline_time_factor(4, 4) == pytest.approx(7 / 4)
    assert P.pipeline_time_factor(2, 2, 2) == pytest.approx((2 + 1 / 2) / 2)  # interleaved: the bubble / v
    assert P.pipeline_time_factor(1, 4) == pytest.approx(7.0)  # 3 dummy micro-batches make up the schedule's 4
    assert P.pipeline_idle_share(4, 2) == pytest.approx(1 / 5)  # (p - 1) / (m + p - 1)
    assert P.pipeline_idle_share(4, 1) == 0.0


def test_the_first_stage_holds_every_layers_activations_more_when_interleaved():
    assert P.pipeline_activation_factor(1) == 1.0
    assert P.pipeline_activation_factor(4) == 1.0  # p micro-batches of L / p layers
    assert P.pipeline_activation_factor(2, 2) == pytest.approx(1 + 1 / 4)  # 1 + (p - 1) / (p v)
    assert P.pipeline_activation_factor(4, 2) == pytest.approx(1 + 3 / 8)


def test_a_stage_holds_its_layers_and_one_end():
    a = Arch.from_config(DENSE)
    assert P.stage_params(a, 1) == a.num_params
    assert P.stage_params(a, 2) == pytest.approx(a.layers_params / 2 + a.head_params)
    w1, w2 = work(DENSE, dp=4), work(DENSE, dp=2, pp=2)  # 4 GPUs either way
    assert M.trainer_resident(w2)["AdamW"] == pytest.approx(8 * P.stage_params(a, 2) / 2)
    assert M.trainer_resident(w2)["AdamW"] > M.trainer_resident(w1)["AdamW"]  # FSDP over 2, not 4


def test_pipeline_time_is_the_work_over_every_gpu_times_the_bubble():
    w1, w2 = work(DENSE, dp=4), work(DENSE, dp=2, pp=2)
    assert w1.trainer_gpus == w2.trainer_gpus == 4
    m = M.micro_batches(w2)  # per pipeline replica and step
    ratio = M.train_seconds(w2) / M.train_seconds(w1)
    assert ratio == pytest.approx(P.pipeline_time_factor(m, 2), rel=1e-6)


# ------------------------------------------------------------------------------------------- experts


def test_expert_parallelism_gathers_a_share_of_the_experts():
    a = Arch.from_config(MOE)
    experts = 128 * 3 * 2048 * 768
    assert P.gathered_layer_params(a, 1) - P.gathered_layer_params(a, 4) == pytest.approx(experts * 3 / 4)
    d = Arch.from_config(DENSE)
    assert P.gathered_layer_params(d, 4) == pytest.approx(d.layers_params / d.num_layers)
    fsdp, ep = M.train_breakdown(work(MOE)), M.train_breakdown(work(MOE, ep=4))
    assert fsdp.parts["bf16 weight copies"] - ep.parts["bf16 weight copies"] == pytest.approx(4 * experts * 3 / 4)
    assert ep.parts["all-to-all buffers"] > 0 == fsdp.parts["all-to-all buffers"]
    assert M.trainer_resident(work(MOE, ep=4)) == M.trainer_resident(work(MOE))  # FSDP shards the state alike


def test_the_all_to_all_sends_the_routed_copies_that_leave_the_gpu():
    a = Arch.from_config(MOE)
    assert P.alltoall_bytes(1000, a, 1) == 0.0
    two = P.alltoall_bytes(1000, a, 2)
    assert two == pytest.approx(24 * 2 * 1000 * 8 * 2048 * 2 * (1 / 2))  # dispatch + combine, bf16, half away
    assert P.alltoall_bytes(1000, a, 4) == pytest.approx(two * (3 / 4) / (1 / 2))
    assert P.alltoall_bytes(1000, Arch.from_config(DENSE), 4) == 0.0
    s = P.alltoall_seconds(1000, a, 2, 1, 450e9)
    assert s == pytest.approx(two / (450e9 * P.ALLTOALL_EFFICIENCY))
    assert P.alltoall_seconds(1000, a, 2, 3, 450e9) == pytest.approx(3 * s)
    assert P.alltoall_seconds(1000, a, 2, 1, None) == 0.0  # an unknown link: not predicted
    assert P.expert_link(8, 8, 450e9) == 450e9 and P.expert_link(16, 8, 450e9) == 50e9  # across nodes: the network


def test_expert_parallel_training_adds_the_all_to_all_time():
    fsdp, ep = work(MOE), work(MOE, ep=2)
    extra = P.alltoall_seconds(M.rollout_tokens(ep) / ep.dp, ep.arch, 2, 2, GPUS["h200"].link)
    assert M.train_seconds(ep) - M.train_seconds(fsdp) == pytest.approx(extra)


# ------------------------------------------------------------------------------------------- simulation


def test_synchronous_is_the_sum_of_the_phases():
    steps = [StepPhases(30, 5, 10, 1), StepPhases(20, 4, 12, 1), StepPhases(25, 5, 9, 1)]
    r = simulate(steps, 0)
    assert r.seconds == pytest.approx(sum(p.generation + p.trainer + p.weight_sync for p in steps))
    assert r.staleness == 0
    even = simulate([StepPhases(30, 5, 10, 1)] * 8, 0)
    assert even.step == pytest.approx(46)
    assert even.engine_idle == pytest.approx(1 - 31 / 46) and even.trainer_idle == pytest.approx(1 - 16 / 46)
    colocated = simulate([StepPhases(30, 5, 10, 1)] * 8, 2, colocated=True)  # one set of GPUs: k does nothing
    assert colocated.step == pytest.approx(46) and colocated.engine_idle == colocated.trainer_idle == 0.0


def test_one_step_off_is_the_longer_side_plus_the_sync():
    balanced = simulate([StepPhases(10, 2, 8, 1)] * 20, 1)
    assert balanced.step == pytest.approx(11)  # max(10, 2 + 8) + 1
    gen_bound = simulate([StepPhases(30, 5, 10, 1)] * 20, 1)
    assert gen_bound.step == pytest.approx(31)
    assert gen_bound.trainer_idle > 0.4 and gen_bound.engine_idle < 0.05  # the trainers wait for rollouts
    train_bound = simulate([StepPhases(10, 5, 15, 1)] * 20, 1)
    assert train_bound.step == pytest.approx(21)
    assert train_bound.engine_idle > 0.4 and train_bound.trainer_idle < 0.05
    assert gen_bound.staleness == pytest.approx(19 / 20)  # every rollout but the first one version behind
    assert simulate([StepPhases(10, 5, 15, 1)] * 20, 2).staleness > 1.5  # the engines run two ahead
    assert simulate([StepPhases(30, 5, 10, 1)] * 20, 1, partial_rollout=True).step == pytest.approx(31)


def test_streaming_engines_overlap_the_long_tail():
    tail = StepPhases(30, 5, 10, 1, generation_full=20)
    assert simulate([tail] * 20, 1).step == pytest.approx(31)
    assert simulate([tail] * 20, 1, streaming=True).step == pytest.approx(21)
    assert simulate([tail] * 20, 0).step == pytest.approx(46)  # synchronous: the tail in every step
    assert simulate([tail] * 20, 0, streaming=True).step == pytest.approx(36)  # ... cut by over-sampling


def test_staleness_is_chosen_where_the_step_stops_improving():
    k, runs = choose_staleness(StepPhases(30, 5, 10, 1), spread=0)
    assert k == 1 and runs[1].step == pytest.approx(runs[4].step)  # one side is the longer every step
    k, runs = choose_staleness(StepPhases(20, 5, 15, 1), spread=0.3, partial_rollout=True)
    best = min(r.step for r in runs.values())
    assert runs[k].step <= best * 1.02 and all(runs[j].step > best * 1.02 for j in runs if j < k)


def test_jittered_steps_and_bad_input():
    base = StepPhases(30, 5, 10, 1)
    assert jittered(base, 3, 0) == [base] * 3
    steps = jittered(base, 2000, 0.2, seed=1)
    assert sum(p.generation for p in steps) / 2000 == pytest.approx(30, rel=0.03)
    assert jittered(base, 5, 0.2, seed=1) == jittered(base, 5, 0.2, seed=1)
    with pytest.raises(ValueError):
        simulate([])
    with pytest.raises(ValueError):
        simulate([base], -1)
