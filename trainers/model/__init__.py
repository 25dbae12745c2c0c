"""Building a model and counting it, without training:

- models: ``build_model(cfg)``, timm's vision transformers with their q/k/v embedding replaced;
- hosts: the model families (ViT/DeiT, XCiT, MLP-Mixer, any other timm transformer) and how timm builds each;
- sites: where each timm attention makes q, k and v (a registry of site adapters); coverage: the probe of one timm
  entrypoint with each embedding; meta: building on the meta device without running initialisers;
- architecture: the architecture keys as classes and timm arguments;
- choices: the registries, one class per value of each choice key (the names: spaces.choices);
- attention/: those classes (token mixers, keys, positions, stems); embeddings and embedding_forms: the q/k/v
  embeddings and their plain-``Linear`` forms;
- registry: the ``qkv_<timm name>`` models registered with timm;
- cost: params and MACs from a config (``model_cost``, ``resolve_trial``); paper_counts: the Vision X-formers
  paper's counts beside ours;
- quantize: post-training quantization under a trial's policy (torchao).
"""
