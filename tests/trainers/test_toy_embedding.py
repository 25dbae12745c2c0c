"""A q/k/v embedding is added with two things: its class (tests/trainers/toy/toy_embedding.py) and its row in
spaces.choices. The toy one goes through the cost, a training step, quantization and the supernet in a process
of its own (tests/trainers/toy/run_toy.py), with no other table or name in the project told of it."""
import json
import os
import subprocess
import sys

from helpers import REPO

import qkvsearch.spaces.choices

TOY = REPO / "tests" / "trainers" / "toy"


def test_an_embedding_added_by_its_class_and_row_is_counted_trained_quantized_and_shared():
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TOY), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, str(TOY / "run_toy.py"), qkvsearch.spaces.choices.__file__], env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    assert found["width"] == round(0.25 * found["dim"])                 # the row's paper width
    assert found["cost_params"] == found["model_params"] and found["toy_modules"] == 2   # counted as built
    assert found["trained_epochs"] == 1 and found["train_loss"] > 0
    toy = [n for n in found["qkv_linears"] if n.startswith("blocks.")]   # class attention keeps its q, k, v
    assert toy == [f"blocks.{b}.attn.qkv.{fc}" for b in (0, 1) for fc in ("fc1", "fc2")]
    assert found["quantized_runs"]
    assert {e for e, _, _ in found["supernet"]} == {"linear", "toy"}
    assert all(diff == 0.0 for _, _, diff in found["supernet"]), found["supernet"]
