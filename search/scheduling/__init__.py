"""Trial schedulers: ``moasha`` (MO-ASHA's rules, pure) and ``tune_schedulers`` (the Ray Tune schedulers a
campaign runs)."""
