"""Training one trial, free of the search:

- engine: the per-rank training engine (a ``Run``, ``fit``, ``evaluate``), free of Ray;
- checkpoints: run folders, state files and the weights a run starts from;
- cli: the plain path, one process or torchrun, no Ray;
- faults (injected on purpose, in tests) and errors (importable without torch);
- loop: the Ray Train adapter (``run_trainer``, ``train_worker``), every Ray import of trainers; it stands
  above supernet/ (tests/search/test_layers.py), whose runs it also starts.
"""
