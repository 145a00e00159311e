"""Environments for the environment tests (loaded by `module:Class` path from agent.environment)."""

from __future__ import annotations

import asyncio
import os
import sys
import time

from reinforge.envs import Environment, Step, Turn


class Countdown(Environment):
    """A stateful game: the user says a number; each model turn that says "next" gets the number
    minus one back and reward 0.25; a turn that says "stop" ends the episode with reward 1 when the
    number has reached the label. Initial messages come from reset() (the data prompt is replaced)."""

    max_prompt_tokens = 1024  # reset()'s prompt, with the test tools' description (about 560 tokens)

    def __init__(self, row, ctx):
        super().__init__(row, ctx)
        self.n = int(ctx.kwargs.get("start", 3))

    async def reset(self):
        return [{"role": "user", "content": f"Count down from {self.n}."}]

    async def step(self, turn: Turn) -> Step:
        if "stop" in turn.text:
            return Step(done=True, reward=1.0 if str(self.n) == str(self.row["label"]) else 0.0, info={"left": self.n})
        self.n -= 1
        return Step(messages=[{"role": "user", "content": str(self.n)}], reward=0.25)

    async def reward(self):
        return 0.5  # a final reward, added to the turns'


class ShortCountdown(Countdown):
    """Countdown without tools: its reset() prompt is short (a model of 1024 positions holds it)."""

    max_prompt_tokens = 128


class Broken(Environment):
    """Fails in the way ``ctx.kwargs["how"]`` names, on the first step of samples whose index is in
    ``ctx.kwargs["which"]`` (all when absent); otherwise a plain one-turn episode with reward 1."""

    def step(self, turn: Turn) -> Step:  # a plain (sync) method: run in a worker thread
        which = self.ctx.kwargs.get("which")
        if which is not None and self.row["metadata"].get("i") not in which:
            return Step(done=True, reward=1.0)
        how = self.ctx.kwargs["how"]
        if how == "raise":
            raise KeyError("boom")
        if how == "hang":
            time.sleep(5)
        if how == "malformed":
            return Step(messages=[{"role": "user"}])
        if how == "not_a_step":
            return {"done": True}
        if how == "huge":
            return Step(messages=[{"role": "user", "content": "x" * 10_000_000}])
        return Step(done=True, reward=1.0)


class SlowAsync(Environment):
    async def step(self, turn):
        await asyncio.sleep(5)
        return Step(done=True)


class Exits(Environment):
    """A plain step() that does what the prompt (the question) says: ``exit`` (``os._exit(7)``),
    ``sys_exit`` (``sys.exit(3)``) or ``hang`` (300 s)."""

    def step(self, turn):
        how = self.row["prompt"]
        if how == "exit":
            os._exit(7)
        if how == "sys_exit":
            sys.exit(3)
        time.sleep(300)


class ExitsAsync(Environment):
    """An async step(): ``os._exit(5)``, or ``sys.exit(4)`` when the prompt says ``sys_exit``."""

    async def step(self, turn):
        if self.row["prompt"] == "sys_exit":
            sys.exit(4)
        os._exit(5)


class LongReset(Environment):
    """reset() gives a user message of ``ctx.kwargs["words"]`` words when the data's prompt (the
    question) is ``long``, else of one word; one turn, reward 1."""

    def __init__(self, row, ctx):
        super().__init__(row, ctx)
        self.words = int(ctx.kwargs.get("words", 1)) if "long" in str(row["prompt"]) else 1

    async def reset(self):
        return [{"role": "user", "content": " ".join(["word"] * self.words)}]

    async def step(self, turn):
        return Step(done=True, reward=1.0)


class DeclaredReset(LongReset):
    max_prompt_tokens = 300
