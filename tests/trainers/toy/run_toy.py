"""Run in a process of its own by tests/trainers/test_toy_embedding.py: the toy embedding's row is put in the
table before anything reads the table (as if spaces/choices.py held it), then the embedding goes through the
cost, a training step, quantization and the supernet. Prints one JSON line of what it found."""
import importlib.util
import json
import sys

choices_file = sys.argv[1]
spec = importlib.util.spec_from_file_location("qkvsearch.spaces.choices", choices_file)
choices = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = choices
spec.loader.exec_module(choices)
choices.EMBEDDING_CHOICES["toy"] = choices.Choice("toy_embedding:Toy", "one hidden layer shared by q, k, v",
                                                  hidden=True, paper_width=0.25)

import torch  # noqa: E402

from qkvsearch.search.campaign.oneshot.plan import candidates  # noqa: E402
from qkvsearch.spaces import load_campaign  # noqa: E402
from qkvsearch.trainers.model.cost import resolve_trial  # noqa: E402
from qkvsearch.trainers.model.models import build_model  # noqa: E402
from qkvsearch.trainers.model.quantize import part_linears, quantize_model  # noqa: E402
from qkvsearch.trainers.supernet.weights import Supernet  # noqa: E402
from qkvsearch.trainers.training.engine import Dist, fit  # noqa: E402

BASE = {"model": "xcit_nano_12_p8_224", "img_size": 16, "depth": 2, "dataset": "digits", "epochs": 1,
        "batch_size": 16, "max_steps_per_epoch": 2, "warmup_epochs": 0}
cfg, cost = resolve_trial({**BASE, "embedding": "toy", "hidden_width": "paper"})
model = build_model(cfg)
found = {"width": cfg["width"], "dim": model.embed_dim, "cost_params": cost["params"],
         "model_params": sum(p.numel() for p in model.parameters()),
         "toy_modules": sum(type(m).__name__ == "Toy" for m in model.modules())}
history = fit(cfg, Dist())
found["trained_epochs"], found["train_loss"] = len(history), history[-1]["train_loss"]
found["qkv_linears"] = sorted(part_linears(model)["quant_qkv"])
quantize_model(model.eval(), {**cfg, "quant_qkv": "int8_dynamic"}, "cpu")
found["quantized_runs"] = bool(torch.isfinite(model(torch.randn(2, 3, 16, 16))).all())
space = {"embedding": {"choice": ["linear", "toy"]}, "hidden_width": {"choice": [0.25, 0.5]}}
campaign = {"name": "toy", "model": {"name": BASE["model"], "img_size": 16, "num_classes": 10},
            "data": {"dataset": "digits"}, "train": {"epochs": 1, "batch_size": 8}, "space": {"depth": 2, **space},
            "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
            "search": {"algorithm": "random", "num_trials": 4}, "storage": "/tmp"}
subnets = [t["config"] for t in candidates(load_campaign(campaign))]
supernet, x, diffs = Supernet(subnets, seed=0).eval(), torch.randn(2, 3, 16, 16), []
for sub in subnets:
    built = build_model(sub).eval()
    built.load_state_dict(supernet.extract(sub))
    with torch.no_grad():
        diffs.append([sub["embedding"], sub["width"], (supernet(x, sub) - built(x)).abs().max().item()])
found["supernet"] = diffs
print(json.dumps(found))
