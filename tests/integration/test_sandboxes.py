"""One :class:`~reinforge.sandbox.Sandboxes` per run: the ``python`` tool and the environment share
its limits, slots, trial runs and run numbers; other runs and runs outside any run do not (issue 54:
six module-level caches before). Without bubblewrap (``isolation: none``): fast, any machine."""

from __future__ import annotations

import asyncio
import time

from reinforge.config import load_config
from reinforge.envs import EnvContext
from reinforge.sandbox import OUTSIDE_RUNS, Sandboxes
from reinforge.tools import ToolSet
from reinforge.tools.builtin import make_python

NONE = ["sandbox.backend=none", "agent.tools=[python]", "sandbox.max_concurrent=1"]


def test_the_python_tool_and_the_environment_share_the_runs_sandboxes():
    cfg = load_config(None, NONE + ["agent.tool_timeout=7"])
    agent = cfg.agent
    run = Sandboxes.from_config(cfg.sandbox, agent.tool_timeout)
    assert (run.isolation, run.limits.timeout, run.slots.limit) == ("none", 7, 1)
    tools = ToolSet.from_config(agent, run)
    ctx = EnvContext(agent, tools, {}, run)
    assert ctx.sandboxes is run
    outside = next(OUTSIDE_RUNS.numbers)

    async def both():
        out = await tools.tools["python"].fn("print(6 * 7)")
        r = await ctx.sandboxes.run("print(1 + 1)", timeout=5)
        return out, r.stdout.strip()

    assert asyncio.run(both()) == ("42", "2")
    assert run.checked == {("none", cfg.sandbox.uid)}  # the trial ran once, for the run
    assert next(run.numbers) == 2  # both runs were the run's, numbered 0 and 1
    assert next(OUTSIDE_RUNS.numbers) == outside + 1  # none counted outside the run
    tools.close()


def test_a_context_without_sandboxes_makes_its_own_with_the_agents_timeout():
    agent = load_config(None, NONE + ["agent.tool_timeout=7"]).agent
    a, b = EnvContext(agent, ToolSet([])), EnvContext(agent, ToolSet([]))
    assert a.sandboxes is not b.sandboxes and a.sandboxes.limits.timeout == 7


def test_one_slot_makes_the_tool_and_the_environment_take_turns():
    cfg = load_config(None, NONE)
    agent = cfg.agent
    run = Sandboxes.from_config(cfg.sandbox, agent.tool_timeout)
    python = make_python(agent, run)
    nap = "import time\ntime.sleep(0.4)\nprint('up')"

    async def together():
        return await asyncio.gather(python(nap), run.run(nap))

    start = time.perf_counter()
    out, r = asyncio.run(together())
    assert out == "up" and r.stdout.strip() == "up"
    assert time.perf_counter() - start >= 0.8  # one after the other: the run has one slot
