"""The Vision X-formers paper's CIFAR-10 models as qkvsearch builds them, counted by the paper's rule
(torchsummary's: weight and bias of each module whose forward runs), against every count of its Table 1, to the
unit, with the q/k/v bias its code has; and its ViL-RoPE, counted as its code counts it."""
import pytest
import torch
from torch import nn

from qkvsearch.spaces.keys import fill
from qkvsearch.trainers.model.cost import measure_cost, model_cost
from qkvsearch.trainers.model.paper_counts import (
    PAPER_LINFORMER,
    PAPER_MODELS,
    PAPER_POSITIONS,
    PAPER_QKV_BIAS,
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
         "linformer_shared_kv_heads": {"attn_proj_len": 64}, "nystrom": {"attn_landmarks": 64}}
# Where timm's own q/k/v bias (qkv_bias null: true) adds to the paper's model, whose projections had none:
# 3·128 a block for softmax and Nystromformer, 128 (q) + 32 (the shared k/v head) for Linformer; 4 blocks. Its
# Performer had them (performer-pytorch's then), FNet has no q/k/v, the MLP-Mixer no attention.
TIMM_BIAS_EXTRA = {"vit": 4 * 3 * 128, "nystrom": 4 * 3 * 128, "linformer": 4 * (128 + 32), "performer": 0}
TABLE1 = [r for r in reference_rows() if r["table"] == "1"]
# The paper's ViL-RoPE (its ViLRoPE.py and HybridViLRoPE.py: one_kv_head=False, share_kv=True) as its code counts
# it: torchsummary's parameters, and MACs as fvcore counts them (matmuls and convolutions).
VIL_ROPE = {"linear": (464_906, 604_964_096), "conv": (557_642, 699_827_456)}


def _config(row: dict, **change) -> dict:
    """The resolved config of one of the paper's rows, as its code builds it (``change``: keys changed)."""
    stem = {v: k for k, v in PAPER_STEMS.items()}[row["stem"]]
    if row["model"] == "mlp_mixer":
        return fill({**MIXER, "patch_embed": stem, **change})
    pos = {v: k for k, v in PAPER_POSITIONS.items()}[row["pos_embed"]]
    attention = PAPER_LINFORMER[pos] if row["model"] == "linformer" else \
        {v: k for k, v in PAPER_MODELS.items()}[row["model"]]
    return fill({**XFORMER, "attention": attention, "pos_embed": pos, "patch_embed": stem,
                 "qkv_bias": PAPER_QKV_BIAS.get(attention), **SIZES.get(attention, {}), **change})


def test_the_reference_holds_table_1s_twelve_counts():
    assert len(TABLE1) == 12 and all(r["params"] for r in TABLE1)
    assert {r["model"] for r in TABLE1} == set(PAPER_MODELS.values()) | {"mlp_mixer"}


@pytest.mark.parametrize("row", TABLE1, ids=lambda r: f"{r['model']}-{r['stem']}")
def test_table_1_counts_by_the_papers_rule(row):
    cfg = _config(row)
    assert paper_row(cfg) is row and paper_params(cfg) == row["params"]
    rule = paper_rule_params(cfg)
    assert rule == row["params"]   # to the unit, with the q/k/v bias the paper's code has
    # all parameters: the rule leaves out the bare ones (position table, class token, Linformer's E)
    bare = 0 if row["model"] in ("mlp_mixer",) else 1025 * 128 + 128
    if row["model"] == "linformer":
        bare += 4 * 1025 * 64
    assert model_cost(cfg)["params"] == rule + bare
    assert paper_figures(cfg) == {"params_rule": rule, "params_paper": row["params"]}


@pytest.mark.parametrize("row", [r for r in TABLE1 if r["model"] in TIMM_BIAS_EXTRA and r["stem"] == "linear"],
                         ids=lambda r: r["model"])
def test_timms_own_qkv_bias_is_another_model_than_the_papers(row):
    """qkv_bias null (timm's ViT: a bias) builds what qkvsearch built before the key existed: the paper's model
    with a bias on q, k and v, no paper row where the paper's had none."""
    timm_own = _config(row, qkv_bias=None)
    assert paper_rule_params(timm_own) - row["params"] == TIMM_BIAS_EXTRA[row["model"]]
    assert (paper_row(timm_own) is row) == PAPER_QKV_BIAS[timm_own["attention"]]


@pytest.mark.parametrize("stem", ["linear", "conv"])
def test_vil_rope_is_counted_as_the_papers_code_counts_it(stem):
    """A key/value head per query head (linformer_shared_kv_heads), no q/k/v bias, 1-D RoPE: its code's 464,906
    parameters and 604,964,096 MACs (hybrid: 557,642 and 699,827,456), to the unit, by our closed form and by
    counting the built model; linformer_shared_kv with RoPE is not the paper's row."""
    row = next(r for r in reference_rows() if (r["model"], r["stem"], r["pos_embed"]) == ("linformer", stem, "rope"))
    cfg = _config(row)
    assert cfg["attention"] == "linformer_shared_kv_heads" and paper_row(cfg) is row
    params, macs = VIL_ROPE[stem]
    assert paper_rule_params(cfg) == params
    cost = model_cost(cfg)
    assert round(cost["gmacs"] * 1e9) == macs and cost == measure_cost(cfg)
    assert paper_row(_config(row, attention="linformer_shared_kv")) is None   # one shared k/v head


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
                                    dict(patch_embed="conv"),
                                    dict(attention="linformer", attn_features=None, attn_proj_len=64)])
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
