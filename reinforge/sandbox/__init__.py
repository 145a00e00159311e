"""The sandbox: running model-written code isolated from the host (docs/agents.md#threat-model).

- :mod:`.runner`: :func:`run_python` (one program in a bubblewrap sandbox) and :class:`Sandboxes`
  (the sandboxes of one run: limits, slots, trial runs; the ``python`` tool and environments run
  through it);
- :mod:`.limits`: :class:`SandboxLimits`, :class:`SandboxResult`, :class:`SandboxSlots`;
- :mod:`.isolation`: how a sandbox is built (launcher, bubblewrap arguments, seccomp filter, uid
  leases); :mod:`.launch_server`: the fork server that starts launchers; :mod:`.cgroup`: the
  group limits of one run; :mod:`.io`: the run's descriptors and output; :mod:`.prelude`: the
  program's first lines inside; :mod:`.metrics`: the episode's fleet metrics;
- :mod:`.workspace`: copy-on-write workspaces (a base plus an episode's layer) the sandbox shows.

It sits below ``tools`` and ``envs`` (which use it) and imports neither.
"""

from .isolation import SandboxUnavailable, bwrap_path
from .limits import SandboxLimits, SandboxResult, SandboxSlots, default_max_sandboxes
from .runner import ISOLATIONS, LAUNCHERS, OUTSIDE_RUNS, Sandboxes, check_sandbox, run_python, sandbox_problems

__all__ = [
    "ISOLATIONS",
    "LAUNCHERS",
    "OUTSIDE_RUNS",
    "SandboxLimits",
    "SandboxResult",
    "SandboxSlots",
    "SandboxUnavailable",
    "Sandboxes",
    "bwrap_path",
    "check_sandbox",
    "default_max_sandboxes",
    "run_python",
    "sandbox_problems",
]
