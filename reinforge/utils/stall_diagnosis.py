"""The stall doctor's one line (:mod:`reinforge.utils.stall`): what is stuck, from the reports of
every process of the run (plain dicts, :func:`reinforge.utils.stall.snapshot`'s form: ``activities``
with ``kind``, ``what``, ``age_s``, ``idle_s``, ``fields``; ``phases`` per thread; ``role``, ``rank``)."""

from __future__ import annotations

from typing import Any

KINDS = ("collective", "sandbox", "env", "reward", "engine")
"""Activity kinds, most specific first: a stall names the first kind that is busy."""


def seconds(s: float) -> str:
    """'12 s', '1.5 s'."""
    return f"{s:.0f} s" if s >= 10 else f"{s:.1f} s"


def _ranks(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in sorted(ranks))


def _phase_text(report: dict[str, Any]) -> str:
    """The deepest chain of open phases of one process ('' when none)."""
    best = max(report.get("phases", []), key=lambda p: (len(p["phases"]), p["age_s"]), default=None)
    return " > ".join(best["phases"]) if best else ""


def _collective_line(acts: list[tuple[dict[str, Any], dict[str, Any]]], reports: list[dict[str, Any]]) -> str:
    """'ranks 0, 2 wait in all_reduce (ParallelContext.max_int) for 600 s; rank 1 is in no collective
    (in train_actor > forward)'."""
    by_op: dict[str, list[tuple[int, float]]] = {}
    world = 0
    for _, a in acts:
        f = a["fields"]
        by_op.setdefault(a["what"], []).append((int(f.get("rank", -1)), a["age_s"]))
        world = max(world, int(f.get("world_size", 0)))
    parts = [
        f"{_ranks([r for r, _ in waiting])} wait{'s' if len(waiting) == 1 else ''} in {op} for "
        f"{seconds(max(age for _, age in waiting))}"
        for op, waiting in sorted(by_op.items(), key=lambda kv: -max(age for _, age in kv[1]))
    ]
    inside = {r for waiting in by_op.values() for r, _ in waiting}
    missing = [r for r in range(world) if r not in inside]
    if missing:
        where = {rep.get("rank"): _phase_text(rep) for rep in reports if rep.get("rank") is not None}
        # the ones the others wait for, and where they are instead
        parts += [f"{_ranks([r])} is in no collective" + (f" (in {where[r]})" if where.get(r) else "") for r in missing]
    return "; ".join(parts)


def diagnose(reports: list[dict[str, Any]]) -> str:
    """One line naming what is stuck, from the reports of every process (the driver's first).

    The most specific kind busy wins (:data:`KINDS`), and of it the oldest activity; trainer ranks
    in collectives are reported together, with the ranks that are in none. Without any activity:
    the deepest chain of open phases (the loop's phase)."""
    acts = [(r, a) for r in reports for a in r.get("activities", [])]
    order = {k: i for i, k in enumerate(KINDS)}
    acts.sort(key=lambda ra: (order.get(ra[1]["kind"], len(KINDS)), -ra[1]["age_s"]))
    where = _phase_text(reports[0]) if reports else ""
    context = f" (loop phase: {where})" if where else ""
    if not acts:
        for rep in reports:
            text = _phase_text(rep)
            if text:
                who = "loop" if rep is reports[0] else rep.get("role", "process")
                return f"{who}: in {text} for {seconds(max(p['age_s'] for p in rep['phases']))}, nothing reported busy"
        return "no component reported what it is doing (see the stacks)"
    top_kind = acts[0][1]["kind"]
    same = [ra for ra in acts if ra[1]["kind"] == top_kind]
    rep, a = same[0]
    if top_kind == "collective":
        return _collective_line(same, reports) + context
    more = f" (and {len(same) - 1} more {top_kind} activit{'y' if len(same) == 2 else 'ies'})" if len(same) > 1 else ""
    if top_kind == "engine":
        f = a["fields"]
        who = a["what"] if rep is reports[0] else f"{a['what']} ({rep.get('role')})"
        split = f" ({f['running']} running, {f['waiting']} waiting)" if "running" in f else ""
        return (
            f"{who}: {f.get('sequences', '?')} sequences in flight{split}, no {f.get('unit', 'token')} for "
            f"{seconds(a['idle_s'])}{more}{context}"
        )
    prefix = {"env": "environment call ", "sandbox": "", "reward": ""}.get(top_kind, f"{top_kind}: ")
    verb = "running for" if top_kind in ("env", "sandbox") else "for"
    return f"{prefix}{a['what']} {verb} {seconds(a['age_s'])}{more}{context}"
