"""Training: the Actor (policy, reference, optimizer) and micro-batching."""
