"""trainers.stages.transfer: a fine-tuning starts from the pretrained weights with a new head; the OOD scores."""
import pytest
import torch

from qkvsearch.spaces.keys import fill
from qkvsearch.trainers import build_model
from qkvsearch.trainers.stages.transfer import scores
from qkvsearch.trainers.training.checkpoints import load_pretrained
from qkvsearch.trainers.training.engine import save_state

TINY = {"model": "xcit_nano_12_p8_224", "img_size": 16, "epochs": 1, "depth": 2, "embedding": "sne",
        "hidden_width": 0.25}


def test_pretrained_weights_load_all_but_the_head(tmp_path):
    torch.manual_seed(0)
    pre = build_model(fill({**TINY, "dataset": "digits"}))  # 10 classes
    save_state({"format": 1, "model": pre.state_dict()}, str(tmp_path))
    torch.manual_seed(1)
    new = build_model(fill({**TINY, "dataset": "digits_0to8"}))  # 9 classes: another head
    head_before = {k: v.clone() for k, v in new.state_dict().items() if k.startswith("head.")}
    fresh = load_pretrained(new, str(tmp_path))
    assert fresh == ["head.bias", "head.weight"]
    for k, v in new.state_dict().items():
        ref = head_before[k] if k.startswith("head.") else pre.state_dict()[k]
        assert torch.equal(v, ref), k


def test_scores():
    z = torch.tensor([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])
    assert scores(z, "msp")[0] == pytest.approx(torch.softmax(z[0], 0)[0].item())
    assert scores(z, "msp")[1] == pytest.approx(1 / 3)
    assert scores(z, "energy")[1] == pytest.approx(1.0 + torch.log(torch.tensor(3.0)).item())
    assert scores(z, "max_logit").tolist() == [2.0, 1.0]
