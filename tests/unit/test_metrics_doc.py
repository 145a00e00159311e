"""Issue 57 item 13: every metric the loop logs has a line in docs/metrics.md. The names are those found
in the code (every quoted ``"prefix/name"`` literal of reinforge/ under a metric prefix) and those built
at run time from the objective's, the critic's, the mismatch statistics' and the planner's names."""

from __future__ import annotations

import re
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]
PREFIXES = (
    "rollout",
    "train",
    "time",
    "eval",
    "reward",
    "data",
    "async",
    "critic",
    "agent",
    "sandbox",
    "perf",
    "plan",
    "sync",
    "distill",
)
LITERAL = re.compile(r"[\"']((?:" + "|".join(PREFIXES) + r")/[A-Za-z0-9_@]+(?:/[A-Za-z0-9_@]+)*)[\"']")


def documented() -> list[re.Pattern[str]]:
    """The names of docs/metrics.md's tables (first column), ``<k>``-style placeholders as wildcards."""
    names = []
    for line in (ROOT / "docs" / "metrics.md").read_text().splitlines():
        if line.startswith("| `"):
            for name in re.findall(r"`([^`]+)`", line.split(" | ")[0]):
                names.append(re.compile(re.sub(r"<[a-z]+>", "[A-Za-z0-9_@./]+", re.escape(name)) + "$"))
    return names


def code_names() -> set[str]:
    from reinforge.algo.mismatch import mismatch_stats
    from reinforge.algo.objective import STAT_KEYS
    from reinforge.plan.report import PHASES

    found = set()
    for path in (ROOT / "reinforge").rglob("*.py"):
        for name in LITERAL.findall(path.read_text()):
            if not name.endswith(("/", "@")) and not re.search(r"/(?:cpu|gpu|cuda|fp8|bf16)$", name):
                found.add(name)
    found |= {f"train/{k}" for k in STAT_KEYS} | {f"train/{k}" for k in mismatch_stats(torch.randn(50))}
    found |= {f"critic/{k}" for k in ("value_loss", "value_clipfrac", "values")}
    found.add("train/moe_aux_loss")  # train/actor.py adds it to the objective's statistics with an MoE aux loss
    for p in PHASES:
        found |= {f"plan/{p}_{s}" for s in ("measured_s", "predicted_s", "ratio", "limit_fraction")}
    found |= {"eval/pass@1", "eval/pass@4", "eval/score_above_threshold@2", "rollout_id", "weight_version"}
    return found


def test_every_metric_in_the_code_is_documented():
    patterns = documented()
    names = code_names()
    assert len(names) > 100  # the scan finds the loop's metrics
    missing = sorted(n for n in names if not any(p.match(n) for p in patterns))
    assert not missing, f"metrics not in docs/metrics.md: {missing}"


def test_the_doc_lists_no_metric_the_code_does_not_have():
    names = code_names()
    stale = [
        p.pattern for p in documented() if "[A-Za-z0-9_@./]+" not in p.pattern and not any(p.match(n) for n in names)
    ]
    assert not stale, f"docs/metrics.md lists names the code never logs: {stale}"
