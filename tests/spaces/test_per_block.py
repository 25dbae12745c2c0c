"""Per-block keys (spaces.blocks.PER_BLOCK_KEYS): a block's own embedding and width, ``embedding.3`` and
``hidden_width.3``. One representation everywhere: a flat trial key checked as its key, one Parquet column typed
as its key, one Optuna parameter, one ehvi feature, one part of the identity; null past the depth. The space draws
them with ``per_block: true``; the model built, its counted cost and its label follow each block's."""
from __future__ import annotations

import optuna
import pyarrow as pa
import pytest

from qkvsearch.search.analysis.results import config_columns
from qkvsearch.search.campaign.driver import trial_name
from qkvsearch.search.searchers.surrogate import encode
from qkvsearch.spaces import base_config, load_campaign, suggest_config
from qkvsearch.spaces.blocks import base_key, block_key, block_text, is_block_key_of, split_block_key
from qkvsearch.spaces.dimensions import count, iterate
from qkvsearch.spaces.errors import SpecError
from qkvsearch.spaces.keys import ConfigError, fill, identity
from qkvsearch.spaces.trials import params_of
from qkvsearch.trainers.model.cost import measure_cost, model_cost
from qkvsearch.trainers.model.models import build_model

MODEL = {"model": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10, "depth": 4, "embed_dim": 64,
         "num_heads": 4, "epochs": 1}


def _spec(space: dict) -> dict:
    return {"name": "pb", "model": {"name": "xcit_nano_12_p8_224", "img_size": 16, "num_classes": 10},
            "data": {"dataset": "digits"}, "train": {"epochs": 1}, "space": space,
            "objectives": [{"metric": "top1", "mode": "max"}, {"metric": "gmacs", "mode": "min"}],
            "search": {"algorithm": "random", "num_trials": 4}, "storage": "/tmp"}


PER_BLOCK = {"depth": {"choice": [2, 3]}, "embedding": {"choice": ["linear", "sne", "fsne"], "per_block": True},
             "hidden_width": {"choice": [0.25, 0.5], "per_block": True}, "code_size": {"choice": [4, 8]}}


def test_a_per_block_name_is_read_by_one_rule():
    """block_key and split_block_key are inverses; base_key and is_block_key_of derive from split_block_key, so a
    name that only looks per-block (a key that is not per-block, a block past the limit, a padded index) is not."""
    assert split_block_key(block_key("embedding", 3)) == ("embedding", 3)
    assert (base_key("embedding.3"), base_key("hidden_width.0"), base_key("embedding")) == \
        ("embedding", "hidden_width", "embedding")
    assert is_block_key_of("embedding.3", "embedding") and not is_block_key_of("embedding", "embedding")
    assert not is_block_key_of("hidden_width.3", "embedding")
    for name in ("depth.1", "embedding.03", "embedding.-1", "embedding.x", "embedding.1000"):
        assert split_block_key(name) is None and base_key(name) == name and not is_block_key_of(name, "embedding")


@pytest.mark.parametrize("blocks", [
    {"embedding.0": "sne", "embedding.2": "fsne", "hidden_width.0": 0.25, "code_size": 4},
    {"embedding": "psne", "embedding.1": "linear", "embedding.3": "fsne", "hidden_width.3": 16,
     "code_sharing": "per_block"},
    {"embedding": "fsne", "embedding.1": "linear", "embed_class_attn": True},
])
def test_each_block_gets_its_own_embedding_and_the_counted_cost_is_the_built_models(blocks):
    cfg = fill({**MODEL, **blocks})
    model = build_model(cfg)
    got = [type(model.blocks[b].attn.qkv).__name__.lower() for b in range(4)]
    assert got == [cfg.get(f"embedding.{b}") or cfg["embedding"] for b in range(4)]
    assert model_cost(cfg) == measure_cost(cfg)   # the closed form follows every block, codes counted once


@pytest.mark.parametrize("blocks, field, expected", [
    ({"embedding.4": "sne"}, "embedding.4", "null unless depth > 4"),
    ({"embedding.0": "foo"}, "embedding.0", "one of linear, sne, psne, fsne"),
    ({"hidden_width.1": 0.5}, "hidden_width.1", "null unless block 1's embedding is sne or psne or fsne"),
    ({"embedding.1": "sne", "hidden_width.1": "match"}, "hidden_width.1", "a width of its own"),
    ({"embedding.1": "sne", "hidden_width": "match"}, "hidden_width", "a width of the blocks' own"),
    ({"embedding.01": "sne"}, "embedding.01", "a trial key"),
])
def test_a_bad_per_block_value_is_refused_naming_its_key(blocks, field, expected):
    with pytest.raises(ConfigError) as err:
        fill({**MODEL, **blocks})
    assert str(err.value).startswith(f"{field}: expected {expected}")


def test_a_key_that_follows_the_blocks_embeddings_is_null_where_no_block_takes_it():
    cfg = fill({**MODEL, "embedding.0": "sne", "code_size": 4})   # no F-SNE block: code_size means nothing
    assert cfg["code_size"] is None and "code_size" not in identity(cfg)
    with pytest.raises(ConfigError, match="code_size: expected null unless embedding is fsne"):
        fill({**MODEL, "embedding": "sne", "code_size": 4})   # without per-block keys: an error, as ever


def test_per_block_draws_one_dimension_per_block_active_below_the_depth():
    spec = load_campaign(_spec(PER_BLOCK))
    keys = [d.key for d in spec.space.dimensions]
    assert keys == ["depth", "code_size", "embedding.0", "hidden_width.0", "embedding.1", "hidden_width.1",
                    "embedding.2", "hidden_width.2"]   # block by block, each after what its conditions read
    dims = {d.key: d for d in spec.space.dimensions}
    assert dict(dims["embedding.2"].when) == {"depth": (3,)}
    assert dict(dims["hidden_width.1"].when) == {"embedding.1": ("sne", "fsne")}
    configs = list(iterate(spec.space))
    assert count(spec.space) == len(configs) == 2 * (5 ** 2 + 5 ** 3)   # 5 = linear, or 2 kinds x 2 widths
    filled = [fill({**base_config(spec), **c}) for c in configs]
    assert all("embedding.2" not in c for c in configs if c["depth"] == 2)
    assert len({identity(c) for c in filled}) < len(configs)   # code_size drawn where no block is F-SNE: one trial


def test_a_space_of_twelve_blocks_is_counted_and_drawn_without_enumerating_it():
    spec = load_campaign(_spec({"depth": 12, "embedding": {"choice": ["linear", "sne", "psne", "fsne"],
                                                           "per_block": True}}))
    assert count(spec.space) == 4 ** 12
    drawn = suggest_config(spec, optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask())
    assert sorted(drawn) == sorted(["depth", *(f"embedding.{b}" for b in range(12))])
    params, dists = params_of(spec.space, drawn)   # one Optuna parameter per block, and back
    assert set(params) == set(drawn) and all(
        isinstance(dists[f"embedding.{b}"], optuna.distributions.CategoricalDistribution) for b in range(12))


@pytest.mark.parametrize("space, field, expected", [
    ({"embedding": {"choice": ["linear", "sne"], "per_block": True}}, "space.embedding.per_block",
     "needs the space to set depth"),
    ({"depth": {"int": [2, 4]}, "embedding": {"choice": ["linear", "sne"], "per_block": True}},
     "space.embedding.per_block", "given a depth range"),
    ({"depth": 3, "lr": {"float": [0.1, 0.2], "per_block": True}}, "space.lr.per_block",
     "only embedding, hidden_width, quant_qkv, quant_proj, quant_mlp, quant_token_mlp take a value per block"),
    ({"depth": 3, "embedding": {"choice": ["linear", "sne"], "per_block": "yes"}}, "space.embedding.per_block",
     "expected true or false"),
])
def test_a_per_block_dimension_the_space_cannot_draw_is_refused_naming_it(space, field, expected):
    with pytest.raises(SpecError) as err:
        load_campaign(_spec(space))
    assert any(e.startswith(field) and expected in e for e in err.value.errors), err.value.errors


def test_a_saved_space_reads_back_as_the_same_dimensions():
    spec = load_campaign(_spec(PER_BLOCK))
    again = load_campaign(spec.to_dict())
    assert again.space == spec.space


def test_a_per_block_key_is_one_typed_column_one_feature_and_one_label():
    configs = [fill({**MODEL, "embedding.0": "sne", "hidden_width.0": 0.5, "embedding.1": "fsne"}),
               fill({**MODEL, "embedding.0": "linear", "embedding.1": "sne", "hidden_width.1": 16})]
    columns = {name: typ for name, typ, _ in config_columns(configs)}
    assert columns["config_embedding.0"] == pa.string() and columns["config_hidden_width.1"] == pa.string()
    assert list(columns)[-4:] == ["config_embedding.0", "config_embedding.1", "config_hidden_width.0",
                                  "config_hidden_width.1"]   # after the declared keys, by key then block
    _, groups = encode(configs)   # ehvi's features: a group (one length scale) per varying key
    varying = {"embedding.0", "embedding.1", "hidden_width.0", "hidden_width.1", "code_size", "code_sharing"}
    assert len(set(groups)) == len(varying)
    assert block_text(configs[0], "embedding") == "sne+fsne+linear+linear"
    assert trial_name(configs[0], "t_00003").startswith("sne+fsne+linear+linear-")


def test_a_blocks_own_precision_is_a_policy_key_drawn_like_any_per_block_key():
    """quant_qkv.<i>: one dimension, Optuna parameter and ehvi feature per block, as embedding.<i>; part of the
    policy, so the training identity leaves it out and the model as deployed (identity with the policy, the
    measured key) keeps it; the block-less key is every block's default, and a block's own equal to it is no
    other policy."""
    from qkvsearch.search.campaign.measured import measured_key
    from qkvsearch.spaces.keys import is_policy_key, quant_policy

    spec = load_campaign(_spec({"depth": {"choice": [2, 3]}, "quant_mlp": {"choice": ["fp", "int8_dynamic"]},
                                "quant_qkv": {"choice": ["fp", "int8_weight_only"], "per_block": True}}))
    dims = {d.key: d for d in spec.space.dimensions}
    assert list(dims) == ["depth", "quant_mlp", "quant_qkv.0", "quant_qkv.1", "quant_qkv.2"]
    assert dict(dims["quant_qkv.2"].when) == {"depth": (3,)}
    configs = list(iterate(spec.space))
    assert count(spec.space) == len(configs) == 2 * (2 ** 2 + 2 ** 3)
    filled = [fill({**base_config(spec), **c}) for c in configs]
    assert len({identity(c) for c in filled}) == 2   # one training per depth
    assert len({identity(c, policy=True) for c in filled}) == len({measured_key(c) for c in filled}) == len(configs)
    assert all(is_policy_key(k) for k in ("quant_qkv", "quant_qkv.2", "quant_token_mlp.0"))
    assert not any(is_policy_key(k) for k in ("embedding.0", "quant_qkv.x", "quant"))

    drawn = suggest_config(spec, optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0)).ask())
    params, dists = params_of(spec.space, drawn)
    assert set(params) == set(drawn) and all(isinstance(dists[f"quant_qkv.{b}"],
                                                        optuna.distributions.CategoricalDistribution)
                                             for b in range(drawn["depth"]))
    _, groups = encode(filled)   # depth, quant_mlp and a feature per block
    assert len(set(groups)) == 5
    columns = {name: typ for name, typ, _ in config_columns(filled)}
    assert columns["config_quant_qkv.2"] == pa.string()

    cfg = fill({**MODEL, "quant_qkv": "int8_dynamic", "quant_qkv.1": "fp", "quant_qkv.2": "int8_dynamic"})
    assert quant_policy(cfg) == {"quant_qkv": "int8_dynamic", "quant_qkv.1": "fp"}   # block 2's is its part's
    assert identity(cfg, policy=True) == identity({**cfg, "quant_qkv.2": None}, policy=True)
    assert trial_name(cfg, "t_00007").startswith("linear-qkv.a8w8-qkv.1.fp-")
