"""A rollout on the trainer ranks (reinforge/train/rollout_share.py): each data-parallel rank takes
whole groups, computes the advantages of its share, and gets what the whole batch gives; the
advantage statistics are reduced over the ranks. Ranks are threads here, summing through a barrier
(the same calls in the same order, as the collectives of ParallelContext.sum_tensor / sum_floats)."""

import random
import threading

import pytest
import torch

from reinforge.config import load_config
from reinforge.records import Sample, Status
from reinforge.train.rollout_advantages import compute_advantages
from reinforge.train.rollout_share import RolloutBatch, RolloutShare, advantage_metrics, group_share, move_rows, owners


class ThreadRanks:
    """``n`` threads standing for data-parallel ranks, exchanging through a barrier (rank order)."""

    def __init__(self, n: int):
        self.n, self.barrier, self.parts = n, threading.Barrier(n), [None] * n

    def gather(self, rank: int, value) -> list:
        self.parts[rank] = value
        self.barrier.wait()
        parts = list(self.parts)
        self.barrier.wait()
        return parts

    def sum(self, rank: int, value):
        parts = self.gather(rank, value)
        if isinstance(value, dict):
            return {k: sum(p[k] for p in parts) for k in value}
        return sum(parts[1:], parts[0])

    def all_to_all(self, rank: int, t, send_sizes, recv_sizes):
        """ParallelContext.all_to_all over the threads: rows of ``t`` in ``send_sizes`` chunks, one per rank."""
        chunks = self.gather(rank, list(t.split(send_sizes)))
        assert [len(chunks[src][rank]) for src in range(self.n)] == recv_sizes
        return torch.cat([chunks[src][rank] for src in range(self.n)])

    def run(self, fn):
        out, errors = [None] * self.n, []

        def one(rank):
            try:
                out[rank] = fn(rank)
            except BaseException as e:  # re-raised below, in the test's thread
                errors.append(e)
                self.barrier.abort()

        threads = [threading.Thread(target=one, args=(r,)) for r in range(self.n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return out


def rollout(num_groups: int = 5, n: int = 4, seed: int = 0) -> list[list[Sample]]:
    """Groups of varied lengths and rewards: a group of equal rewards, a failed sample, tool tokens."""
    rng = random.Random(seed)
    groups = []
    for g in range(num_groups):
        prompt = [5 + g] * rng.randint(2, 5)
        group = []
        for j in range(n):
            length = rng.randint(3, 9)
            mask = [1] * length
            if (g + j) % 3 == 0:  # a tool's output inside the response
                mask[1:3] = [0, 0]
            reward = 1.0 if g == 1 else rng.choice([0.0, 0.5, 1.0])
            status = Status.FAILED if (g, j) == (2, 1) else Status.COMPLETED
            tokens = prompt + [rng.randint(10, 99) for _ in range(length)]
            group.append(Sample(prompt="p", tokens=tokens, response_length=length, reward=reward, loss_mask=mask))
            group[-1].status = status
        groups.append(group)
    return groups


ESTIMATORS = {
    "grpo-kl-in-reward": ["algo.advantage_estimator=grpo", "algo.use_kl_in_reward=true", "algo.kl_coef=0.1"],
    "rloo-normalized": ["algo.advantage_estimator=rloo", "algo.normalize_rewards=true"],
    "reinforce++-kl": [
        "algo.advantage_estimator=reinforce_plus_plus",
        "algo.gamma=0.9",
        "algo.use_kl_in_reward=true",
        "algo.kl_coef=0.1",
    ],
    "reinforce++-baseline": ["algo.advantage_estimator=reinforce_plus_plus_baseline"],
    "gae-kl": [
        "algo.advantage_estimator=gae",
        "algo.gamma=0.95",
        "algo.lambd=0.9",
        "algo.use_kl_in_reward=true",
        "algo.kl_coef=0.05",
    ],
}


@pytest.mark.parametrize("ranks", [2, 3])
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_each_rank_gets_the_advantages_of_the_whole_batch(name, ranks):
    cfg = load_config(None, ["rollout.n_samples_per_prompt=4", *ESTIMATORS[name]])
    groups = rollout()
    flat = [s for g in groups for s in g]
    gen = torch.Generator().manual_seed(1)
    per_token = {
        key: [torch.randn(s.response_length, generator=gen) * 0.3 for s in flat]
        for key in ("values", "old_log_probs", "ref_log_probs")
    }
    if cfg.algo.advantage_estimator != "gae":
        per_token.pop("values")
    if not cfg.algo.use_kl_in_reward:
        per_token.pop("old_log_probs"), per_token.pop("ref_log_probs")
    whole = compute_advantages(cfg.algo, groups, 64, **per_token)
    world = ThreadRanks(ranks)

    def rank(r):
        share = RolloutShare.take(RolloutBatch(groups, 0), r, ranks)
        adv = compute_advantages(
            cfg.algo,
            groups,
            64,
            **{k: share.mine(v) for k, v in per_token.items()},
            owned=share.groups,
            batch_sum=lambda t: world.sum(r, t),
        )
        metrics = advantage_metrics(adv.advantages, lambda d: world.sum(r, d))
        return share, share.spread(adv.advantages), share.spread(adv.returns), metrics

    results = world.run(rank)
    owners = sorted(i for share, *_ in results for i in share.owned)
    assert owners == list(range(len(flat)))  # every sample on exactly one rank
    assert all(len(share.owned) < len(flat) for share, *_ in results)  # (each rank has a part only)
    for share, adv, returns, metrics in results:
        for i in share.owned:
            torch.testing.assert_close(adv[i], whole.advantages[i], rtol=1e-5, atol=1e-6)
            if whole.returns is not None:
                torch.testing.assert_close(returns[i], whole.returns[i], rtol=1e-5, atol=1e-6)
        every = torch.cat(whole.advantages)  # the statistics the driver computed before, from every token
        assert metrics["rollout/advantage_mean"] == pytest.approx(float(every.mean()), abs=1e-6)
        assert metrics["rollout/advantage_std"] == pytest.approx(float(every.std()), rel=1e-5)
        assert metrics["rollout/advantage_abs_mean"] == pytest.approx(float(every.abs().mean()), rel=1e-5)


def test_group_shares_are_whole_disjoint_and_token_balanced():
    groups = rollout(num_groups=7)
    shares = [group_share(groups, r, 3) for r in range(3)]
    assert sorted(g for s in shares for g in s) == list(range(7))
    tokens = [sum(len(x.tokens) for g in s for x in groups[g]) for s in shares]
    longest = max(sum(len(x.tokens) for x in g) for g in groups)
    assert max(tokens) - min(tokens) <= longest  # greedy longest-first: within one group of each other
    assert group_share(groups, 0, 1) == list(range(7))
    assert [group_share(groups[:1], r, 2) for r in range(2)] in ([[0], []], [[], [0]])  # fewer groups than ranks
    shared = [group_share(groups, r, 3, shared_prompt=True) for r in range(3)]
    assert sorted(g for s in shared for g in s) == list(range(7))


def test_advantage_metrics_of_no_token_are_zero():
    zero = {"rollout/advantage_mean": 0.0, "rollout/advantage_std": 0.0, "rollout/advantage_abs_mean": 0.0}
    assert advantage_metrics([]) == zero and advantage_metrics([torch.zeros(0)]) == zero
    one = advantage_metrics([torch.tensor([2.0])])
    assert one == {"rollout/advantage_mean": 2.0, "rollout/advantage_std": 0.0, "rollout/advantage_abs_mean": 2.0}


class FakeParallel:
    """What move_rows reads of a ParallelContext, for one thread of ThreadRanks."""

    def __init__(self, world: ThreadRanks, rank: int):
        self.world, self.dp_rank, self.dp_size = world, rank, world.n

    def all_to_all(self, t, send_sizes, recv_sizes):
        return self.world.all_to_all(self.dp_rank, t, send_sizes, recv_sizes)


@pytest.mark.parametrize("ranks", [1, 2, 3])
def test_rows_move_from_the_rank_that_holds_them_to_the_rank_that_runs_them(ranks):
    groups = rollout(num_groups=5)
    flat = [s for g in groups for s in g]
    lengths = [s.response_length for s in flat]
    owner = owners(groups, ranks)
    share = RolloutShare.take(RolloutBatch(groups, 0), ranks - 1, ranks)
    assert share.owner == owner and all(owner[i] == ranks - 1 for i in share.owned)
    rows = {k: [torch.arange(n, dtype=torch.float32) + 100 * i + k for i, n in enumerate(lengths)] for k in (0, 1)}
    dest = [(i * 7) % ranks if i % 5 else -1 for i in range(len(flat))]  # -1: a sample no step runs
    world = ThreadRanks(ranks)

    def rank(r):
        held = {f"f{k}": [v if owner[i] == r else None for i, v in enumerate(rows[k])] for k in rows}
        return move_rows(FakeParallel(world, r), held, lengths, owner, dest)

    for r, got in enumerate(world.run(rank)):
        for k in rows:
            for i in range(len(flat)):
                if dest[i] == r:
                    torch.testing.assert_close(got[f"f{k}"][i], rows[k][i])
                else:
                    assert got[f"f{k}"][i] is None
