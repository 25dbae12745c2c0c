"""The attention design's building blocks, one module per choice (timm's ``create_attn.py`` layout); each
class builds itself and counts its parameters and MACs exactly (``shape.Counted``), and the registries of
trainers.model.choices name them (the names: spaces.choices).

- ``shape``: ``Shape``, what a choice is built and counted at, and the ``Counted`` protocol.
- ``base``: ``QKVAttention``, timm's Attention with the product of q, k, v chosen by a subclass.
- ``softmax``, ``performer``, ``linformer``, ``linformer_shared_kv`` (also linformer_shared_kv_heads),
  ``nystrom``, ``fnet``: the token mixers (``attention``).
- ``positions``: learned, rope, rope1d, none (``pos_embed``).
- ``stems``: linear, conv, conv_plain (``patch_embed``).
- ``manifold``: the shared and the manifold key (``key``).
- ``fft``: the FLOP counter used everywhere, with the FFT convention FNet is counted by.

How the chosen classes reach timm's constructor: trainers.model.architecture and trainers.model.hosts.
"""
