"""Placement of trainers and rollout engines: ``local`` (one process) or ``ray`` (many GPUs / nodes)."""
