"""The Vision X-formers paper's CIFAR-10 models as qkvsearch builds them, counted by the paper's rule
(torchsummary's: weight and bias of each module whose forward runs), against every count of its Table 1."""
import pytest
import torch
from torch import nn

from qkvsearch.spaces.keys import fill
from qkvsearch.trainers.cost import model_cost
from qkvsearch.trainers.paper_counts import (
    PAPER_MODELS,
    PAPER_POSITIONS,
    PAPER_STEMS,
    paper_figures,
    paper_params,
    paper_row,
    paper_rule_params,
    reference_rows,
    summary_params,
)

XFORMER = dict(model="vit_tiny_patch16_224", img_size=32, num_classes=10, embed_dim=128, depth=4, num_heads=4,
               mlp_ratio=2.0, patch_size=1, epochs=1, dataset="cifar10", data_path="/absent")
MIXER = dict(XFORMER, model="mixer_s16_224", num_heads=None, mlp_ratio=1.0, token_mlp_ratio=8.0)
SIZES = {"performer": {"attn_features": 110}, "linformer_shared_kv": {"attn_proj_len": 64},
         "nystrom": {"attn_landmarks": 64}}
# Where our model has more than the paper's: timm's ViT gives q, k and v a bias (qkv_bias=True), the paper's
# projections had none: 3·128 a block for softmax and Nystromformer, 128 (q) + 32 (the shared k/v head) for
# Linformer; 4 blocks. Its Performer had them too (performer-pytorch), FNet has no q/k/v, MLP-Mixer no attention.
QKV_BIAS = {"vit": 4 * 3 * 128, "nystrom": 4 * 3 * 128, "linformer": 4 * (128 + 32), "performer": 0, "fnet": 0,
            "mlp_mixer": 0}
TABLE1 = [r for r in reference_rows() if r["table"] == "1"]


def _config(row: dict) -> dict:
    stem = {v: k for k, v in PAPER_STEMS.items()}[row["stem"]]
    if row["model"] == "mlp_mixer":
        return fill({**MIXER, "patch_embed": stem})
    attention = {v: k for k, v in PAPER_MODELS.items()}[row["model"]]
    pos = {v: k for k, v in PAPER_POSITIONS.items()}[row["pos_embed"]]
    return fill({**XFORMER, "attention": attention, "pos_embed": pos, "patch_embed": stem, **SIZES.get(attention, {})})


def test_the_reference_holds_table_1s_twelve_counts():
    assert len(TABLE1) == 12 and all(r["params"] for r in TABLE1)
    assert {r["model"] for r in TABLE1} == set(PAPER_MODELS.values()) | {"mlp_mixer"}


@pytest.mark.parametrize("row", TABLE1, ids=lambda r: f"{r['model']}-{r['stem']}")
def test_table_1_counts_by_the_papers_rule(row):
    cfg = _config(row)
    assert paper_row(cfg) is row and paper_params(cfg) == row["params"]
    rule = paper_rule_params(cfg)
    assert rule - row["params"] == QKV_BIAS[row["model"]], (rule, row["params"])
    # all parameters: the rule leaves out the bare ones (position table, class token, Linformer's E)
    bare = 0 if row["model"] in ("mlp_mixer",) else 1025 * 128 + 128
    if row["model"] == "linformer":
        bare += 4 * 1025 * 64
    assert model_cost(cfg)["params"] == rule + bare
    assert paper_figures(cfg) == {"params_rule": rule, "params_paper": row["params"]}


def test_the_papers_stem_adds_92736_on_every_hybrid():
    for model in {r["model"] for r in TABLE1}:
        linear, conv = (next(r for r in TABLE1 if r["model"] == model and r["stem"] == s) for s in ("linear", "conv"))
        assert conv["params"] - linear["params"] == 92_736
        assert paper_rule_params(_config(conv)) - paper_rule_params(_config(linear)) == 92_736


def test_rope_rows_have_a_rule_count_but_no_printed_one():
    rows = [r for r in reference_rows() if r["table"] == "6"]
    assert len(rows) == 8
    cfg = _config(rows[0])
    assert cfg["pos_embed"] == "rope1d" and paper_params(cfg) is None
    assert paper_figures(cfg)["params_rule"] == paper_rule_params(cfg) > 0


@pytest.mark.parametrize("change", [dict(embed_dim=192, num_heads=3), dict(attn_features=64), dict(pos_embed="rope"),
                                    dict(patch_embed="conv"), dict(attention="linformer", attn_features=None, attn_proj_len=64)])
def test_other_configs_are_no_paper_row(change):
    cfg = fill({**XFORMER, "attention": "performer", "attn_features": 110, **change})
    assert paper_row(cfg) is None and paper_figures(cfg) is None


def test_the_rule_counts_weight_and_bias_of_modules_called_once_per_call():
    class Twice(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.unused = nn.Linear(3, 3), nn.Linear(3, 3)
            self.table = nn.Parameter(torch.zeros(3))   # bare: not counted
            self.seq = nn.Sequential(nn.Linear(3, 3, bias=False))

        def forward(self, x):
            return self.seq(self.lin(self.lin(x)) + self.table)

    assert summary_params(Twice(), torch.zeros(1, 3)) == 2 * 12 + 9
