"""Training one trial, free of the search:

- engine: the per-rank training engine (a ``Run``, ``fit``, ``evaluate``), free of Ray;
- checkpoints: run folders, state files and the weights a run starts from;
- cli: the plain path, one process or torchrun, no Ray;
- faults (injected on purpose, in tests) and errors (importable without torch).

The Ray Train adapter around the engine is a role of its own: trainers.ray_train.
"""
