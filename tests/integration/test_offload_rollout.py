"""cluster.offload_rollout: in local mode the engine frees its KV cache while the trainer trains
(slime's --offload-rollout) and takes it back for the next rollout, changing no result."""

import json

import pytest

from reinforge.config import load_config
from reinforge.config.fields import ConfigError
from reinforge.loop import RLLoop
from tests.integration.test_integration import TASK, tiny_overrides

KEYS = ("rollout/response_len_mean", "rollout/reward_mean", "train/loss", "train/grad_norm")


@pytest.mark.parametrize(
    "overrides,match",
    [
        (["cluster.offload_rollout=true", "cluster.mode=ray"], "mode=ray"),
        (["cluster.offload_rollout=true", "rollout.max_staleness=1"], "max_staleness=1"),
    ],
)
def test_config_refuses_offload_rollout_where_it_does_not_apply(overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, overrides)


def run(tmp_path, model_path, offload: bool, weights: bool = False, extra: tuple[str, ...] = ()):
    """Two rollout steps (``extra`` overrides on top); returns whether the engine was asleep at each
    train call, and metrics."""
    data = tmp_path / "prompts.jsonl"  # plain prompts: no task generator needed
    data.write_text("".join(json.dumps({"prompt": f"Count to {i}.", "label": str(i)}) + "\n" for i in range(64)))
    overrides = [
        o
        for o in tiny_overrides(
            model_path,
            tmp_path / f"run{offload}{weights}{'_'.join(extra)}",
            **{
                "cluster.offload_rollout": str(offload).lower(),
                "cluster.offload_engine_weights": str(weights).lower(),
                "reward.type": "custom",
                "reward.function_path": "tests.reward_fns:even_first_token",
            },
        )
        if o not in TASK
    ]
    cfg = load_config(None, overrides + [f"data.prompt_data={data}", *extra])
    loop = RLLoop(cfg)
    asleep, train = [], loop.cluster.train

    def spy(*args, **kwargs):
        asleep.append(loop.cluster.engine.scheduler is None)
        return train(*args, **kwargs)

    loop.cluster.train = spy
    try:
        metrics = [loop.rollout_step(i)[0] for i in range(2)]
    finally:
        loop.close()
    for m in metrics:  # the engine's sleep and wake are a timed phase of the step (`time/offload`)
        phases = [v for k, v in m.items() if k.startswith("time/") and k != "time/rollout_step"]
        assert m["time/offload"] >= 0 and m["time/rollout_step"] == pytest.approx(sum(phases))
    return asleep, [{k: m[k] for k in KEYS if k in m} for m in metrics]


def test_offload_rollout_frees_the_cache_during_training_and_changes_nothing(tmp_path, tiny_model_path):
    asleep, kept = run(tmp_path, tiny_model_path, offload=False)
    assert asleep == [False, False]
    asleep, offloaded = run(tmp_path, tiny_model_path, offload=True)
    assert asleep == [True, True]
    assert offloaded == kept and all(len(m) == len(KEYS) for m in kept)
    asleep, with_weights = run(tmp_path, tiny_model_path, offload=True, weights=True)
    assert asleep == [True, True] and with_weights == kept
