"""Trial schedulers: ``moasha`` (MO-ASHA's rules, pure), ``tune_schedulers`` (the Ray Tune schedulers a
campaign runs) and ``forced_saves`` (the experiment-state saves every one of them makes)."""
