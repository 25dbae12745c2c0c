"""The Ray Train adapter, a role of its own above the others (tests/search/test_layers.py): loop runs a trial's
training on Ray Train workers (``run_trainer``, ``train_worker``), one DDP rank each, the engine of training/ on
each, or a supernet's run of supernet/; every Ray import of trainers is there."""
