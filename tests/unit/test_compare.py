"""``reinforge compare`` (issue 55 item 4): the statistics against hand-computed values, the pairing of
evaluation files problem by problem, and the command's report."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from reinforge.eval.compare import (
    accuracy_interval,
    compare_arms,
    mcnemar_exact,
    paired_bootstrap,
    problem_scores,
    wilson_interval,
)


def test_wilson_interval_matches_the_textbook_value():
    # 81 of 263 (Newcombe 1998, table I, example: 0.2553 to 0.3662 for the Wilson score interval)
    lo, hi = wilson_interval(81, 263)
    assert lo == pytest.approx(0.2553, abs=5e-4) and hi == pytest.approx(0.3662, abs=5e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(0, 0) == (0.0, 1.0)


def test_mcnemar_exact_is_the_doubled_binomial_tail_of_the_discordant_pairs():
    # b=1, c=9: 2 * (C(10,0) + C(10,1)) / 2**10 = 22 / 1024
    assert mcnemar_exact(1, 9) == pytest.approx(22 / 1024)
    assert mcnemar_exact(9, 1) == pytest.approx(22 / 1024)
    assert mcnemar_exact(5, 5) == 1.0 and mcnemar_exact(0, 0) == 1.0
    assert mcnemar_exact(0, 6) == pytest.approx(2 / 64)


def test_the_paired_bootstrap_sees_a_consistent_gain_and_not_noise():
    rng = np.random.default_rng(1)
    a = (rng.random((1, 400)) < 0.3).astype(float)
    better = a.copy()
    better[0, np.flatnonzero(a[0] == 0)[:60]] = 1.0  # 60 more problems right, none lost
    d, lo, hi, p = paired_bootstrap(a, better, resamples=4000)
    assert d == pytest.approx(60 / 400) and lo > 0 and p < 0.001
    shuffled = a[:, rng.permutation(400)]  # the same accuracy on other problems: no paired difference expected
    d2 = compare_arms(a, shuffled, resamples=4000)
    assert d2.diff == 0.0 and not d2.distinguishable and d2.p_mcnemar == pytest.approx(1.0)


def test_seeds_are_a_second_level_widening_the_interval():
    rng = np.random.default_rng(0)
    base = (rng.random(300) < 0.5).astype(float)
    one = np.stack([base])
    noisy = np.stack([np.where(rng.random(300) < 0.3, 1 - base, base) for _ in range(3)])  # 3 seeds, each 30% flipped
    _, lo1, hi1 = accuracy_interval(one, resamples=3000)
    assert (lo1, hi1) == pytest.approx(wilson_interval(int(base.sum()), 300))
    m, lo3, hi3 = accuracy_interval(noisy, resamples=3000)
    assert lo3 < m < hi3 and math.isfinite(lo3)
    d = compare_arms(noisy, noisy, resamples=3000)
    assert d.diff == 0.0 and d.p_mcnemar is None and not d.distinguishable


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_problem_scores_pair_by_prompt_and_label_greedy_first_in_old_files(tmp_path):
    old = _write(
        tmp_path / "old.jsonl",
        [
            {"prompt": "1+1", "label": "2", "reward": 1.0},  # greedy (first of its problem)
            {"prompt": "2+2", "label": "4", "reward": 0.0},
            {"prompt": "1+1", "label": "2", "reward": 0.0},  # sampled
            {"prompt": "1+1", "label": "2", "reward": 1.0},
            {"prompt": "3+3", "label": "6", "reward": None},  # failed: not scored
        ],
    )
    scores = problem_scores(old)
    assert sorted(scores.values()) == [0.0, 1.0] and len(scores) == 2
    assert list(problem_scores(old, sampled=True).values()) == [0.5]
    new = _write(
        tmp_path / "new.jsonl",
        [
            {"greedy": False, "prompt": "1+1", "label": "2", "reward": 1.0},
            {"greedy": True, "prompt": "1+1", "label": "2", "reward": 0.0},
        ],
    )
    assert list(problem_scores(new).values()) == [0.0]


def test_reinforge_compare_prints_intervals_and_says_when_it_cannot_tell(tmp_path, capsys):
    from reinforge.cli import main

    problems = [{"prompt": f"q{i}", "label": str(i)} for i in range(200)]
    a = _write(
        tmp_path / "a.jsonl", [{**p, "greedy": True, "reward": float(i % 4 == 0)} for i, p in enumerate(problems)]
    )
    b = _write(
        tmp_path / "b.jsonl", [{**p, "greedy": True, "reward": float(i % 2 == 0)} for i, p in enumerate(problems)]
    )
    c = _write(
        tmp_path / "c.jsonl", [{**p, "greedy": True, "reward": float(i % 4 == 1)} for i, p in enumerate(problems)]
    )
    assert main(["compare", str(a), str(b), str(c), "--resamples", "2000"]) == 0
    out = capsys.readouterr().out
    assert "200 problems" in out and "0.250" in out and "0.500" in out
    lines = out.splitlines()
    b_line = next(line for line in lines if line.strip().startswith(f"{b} -"))
    c_line = next(line for line in lines if line.strip().startswith(f"{c} -"))
    assert "+0.250" in b_line and ": distinguishable" in b_line and "McNemar exact p=" in b_line
    assert "+0.000" in c_line and "not distinguishable" in c_line
    assert main(["compare", str(a)]) == 2
    assert main(["compare", str(a), str(tmp_path / "missing")]) == 2
    assert "no such evaluation file" in capsys.readouterr().err
