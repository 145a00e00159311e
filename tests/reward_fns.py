"""Reward functions for tests (loaded through reward.function_path)."""

from os import _exit  # a module that holds the real os._exit before any guard could replace it


def even_first_token(sample):
    """1 when the first response token id is even: learnable by a tiny random model."""
    ids = sample.response_ids
    return float(bool(ids) and ids[0] % 2 == 0)


def even_token_share(sample):
    """The share of even response token ids: varies between samples of any prompt."""
    ids = sample.response_ids
    return sum(i % 2 == 0 for i in ids) / max(len(ids), 1)


def raises_on_odd_first_token(sample):
    """even_first_token, but a bug on samples whose first token is odd: the manager scores them 0."""
    ids = sample.response_ids
    if ids and ids[0] % 2:
        raise RuntimeError("reward bug")
    return 1.0


def hangs(sample):
    """Never returns within reward.timeout (tests set it far below the sleep)."""
    import time

    time.sleep(3.0)
    return 1.0


def nan_on_odd_first_token(sample):
    """NaN for odd first tokens: the manager refuses non-finite rewards and scores them 0."""
    ids = sample.response_ids
    return float("nan") if ids and ids[0] % 2 else 1.0


def exits(sample):
    """Ends the process the hard way (no exception, no handler runs): the manager must catch it."""
    import os

    os._exit(1)


def sys_exits(sample):
    import sys

    sys.exit(3)


def always_raises(sample):
    raise RuntimeError("reward bug on every sample")


def hangs_when_flagged(sample):
    """Hangs (5 s) on samples whose metadata has ``hang``; 1.0 at once on the others."""
    import time

    if sample.metadata.get("hang"):
        time.sleep(5.0)
    return 1.0


async def async_blocks(sample):
    """An async reward that blocks its event loop (time.sleep instead of await asyncio.sleep)."""
    import time

    if sample.metadata.get("hang"):
        time.sleep(3.0)
    return 1.0


def exits_via_imported_name(sample):
    """``os._exit`` reached through a name imported at module load (no patch of ``os`` sees it)."""
    _exit(7)


def exits_from_a_thread(sample):
    """Returns 1.0, but a thread it starts ends the process 50 ms later."""
    import os
    import threading
    import time

    threading.Thread(target=lambda: (time.sleep(0.05), os._exit(5)), daemon=True).start()
    time.sleep(0.2)  # the thread ends the process during the call
    return 1.0


def returns_a_string(sample):
    return "1.0"


def worker_pid(sample):
    """1.0, with the process it ran in under reward_info['pid']."""
    import os

    sample.reward_info["pid"] = os.getpid()
    return 1.0


def with_info(sample):
    """even_first_token as verl's dict, with extra numbers (averaged into reward_info/* metrics) and a string."""
    r = even_first_token(sample)
    return {"score": r, "format_ok": 1, "odd": r == 0.0, "pred": "text"}


_KEPT: list = []


def leaks(sample):
    """Keeps 40 MiB more after each call (a cache that only grows); returns how many it holds."""
    _KEPT.append(bytearray(40 << 20))
    return float(len(_KEPT))
