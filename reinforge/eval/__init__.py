"""Evaluation: greedy accuracy, pass@k."""
