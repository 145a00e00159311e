"""Pure tensor functions of RL post-training: advantage estimators, policy / KL losses,
loss aggregation and evaluation statistics. No state, no I/O: each is tested against the
formula of the paper or reference implementation its docstring cites."""
