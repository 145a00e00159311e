"""One run driver for RL and offline training (:mod:`.driver`) and the choice of the checkpoint a
run resumes from (:mod:`.resume`)."""

from .driver import Driver, Job, RunSpec
from .resume import load_first, read_state, resume_candidates

__all__ = ["Driver", "Job", "RunSpec", "load_first", "read_state", "resume_candidates"]
