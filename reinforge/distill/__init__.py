"""On-policy distillation's teachers (docs/distillation.md): which teacher scores each sample
(:mod:`.teachers`), checkpoint teachers on the trainer ranks, endpoint teachers over HTTP (:mod:`.endpoint`),
and the start-up checks (the teacher's tokenizer must be the student's). The tensor math is in
:mod:`reinforge.algo.distill`."""
