"""A trained or untrained model on the hardware it is served on:

- measure: measured latency, throughput, train-step time and peak memory of a config on this process's device;
- policy_eval: another quantization policy evaluated on a trainer's weights, without training.
"""
