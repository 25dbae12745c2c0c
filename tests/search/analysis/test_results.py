"""search.analysis.results on realistic record files written the way the campaign layer writes them."""
import json
import logging
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers.campaign_files import ALL_STATUSES, atomic_json, tree_digest, write_campaign, write_record

from qkvsearch.search.analysis.results import EPOCHS_FILE, TRIALS_FILE, collect, parquet_files, write_results
from qkvsearch.search.records import readers
from qkvsearch.search.records.epochs_csv import epochs_csv
from qkvsearch.search.records.layout import EPOCHS_SUFFIX, CampaignFileError
from qkvsearch.spaces.errors import BadInput
from qkvsearch.spaces.upgrade import upgraded

# Documented fixed types (RESULTS_SCHEMA.md); spot-check the ones a reader relies on.
EXPECTED_TRIAL_TYPES = {
    "trial_id": pa.string(), "status": pa.string(), "config_model": pa.string(),
    "config_hidden_width": pa.string(), "config_code_size": pa.int64(), "config_lr": pa.float64(),
    "config_deterministic": pa.bool_(), "config_seed": pa.int64(), "config_tags": pa.string(),
    "params_m": pa.float64(), "gmacs": pa.float64(), "params": pa.int64(), "config_width": pa.int64(),
    "final_top1": pa.float64(), "best_top1": pa.float64(), "best_val_loss": pa.float64(),
    "best_epoch": pa.int64(), "epochs_run": pa.int64(), "epochs_planned": pa.int64(),
    "train_s_total": pa.float64(), "started_at": pa.timestamp("us", tz="UTC"),
    "ended_at": pa.timestamp("us", tz="UTC"), "error": pa.string(), "config_json": pa.string(),
}
EXPECTED_EPOCH_TYPES = {"trial_id": pa.string(), "trial_name": pa.string(), "epoch": pa.int64(),
                        "top1": pa.float64(), "val_loss": pa.float64(), "train_s": pa.float64()}


def test_collect_one_row_per_trial_with_documented_types(tmp_path):
    records = write_campaign(tmp_path, ALL_STATUSES)
    trials, epochs = collect(tmp_path)
    assert trials.num_rows == len(records)
    assert sorted(trials.column("status").to_pylist()) == sorted(ALL_STATUSES)
    for name, typ in EXPECTED_TRIAL_TYPES.items():
        assert trials.schema.field(name).type == typ, name
    for name, typ in EXPECTED_EPOCH_TYPES.items():
        assert epochs.schema.field(name).type == typ, name
    assert epochs.num_rows == sum(len(r["epochs"]) for r in records)

    rows = {r["trial_id"]: r for r in trials.to_pylist()}
    for rec in records:
        row = rows[rec["trial_id"]]
        assert row["epochs_run"] == len(rec["epochs"])
        assert row["config_width"] == rec["config"]["width"] and row["train_s_total"] == rec["train_s_total"]
        requested = rec["config"]["hidden_width"]
        assert row["config_hidden_width"] == (None if requested is None else
                                              requested if isinstance(requested, str) else json.dumps(requested))
        assert json.loads(row["config_json"]) == upgraded(rec["config"])   # keys it lacks: as they were before
        if rec["epochs"]:
            tops = [e["top1"] for e in rec["epochs"]]
            assert row["final_top1"] == tops[-1]
            assert row["best_top1"] == max(tops)
            assert row["best_epoch"] == 1 + int(np.argmax(tops))
            assert row["best_val_loss"] == min(e["val_loss"] for e in rec["epochs"])
        else:
            assert row["final_top1"] is None and row["best_top1"] is None and row["best_epoch"] is None
        if rec["ended_at"] is not None:
            assert row["ended_at"].timestamp() == pytest.approx(rec["ended_at"])
        else:
            assert row["ended_at"] is None
    match = rows["t00004"]  # fsne "match": requested string, resolved int
    assert match["config_hidden_width"] == "match" and match["config_width"] == 160


def test_unreadable_records_are_skipped_with_a_warning(tmp_path, caplog):
    write_campaign(tmp_path, ["completed", "running"])
    (tmp_path / "qs_trials" / "broken.json").write_text('{"trial_id": "x", "epochs": [')
    (tmp_path / "qs_trials" / "list.json").write_text("[1, 2]")
    (tmp_path / "qs_trials" / "badtypes.json").write_text('{"trial_id": "y", "config": 3, "cost": {}, "epochs": []}')
    (tmp_path / "qs_trials" / "t9.json.tmp").write_text("half")  # a temp file is not a record
    with caplog.at_level(logging.WARNING, logger="qkvsearch.search.records"):
        trials, _ = collect(tmp_path)
    msgs = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(msgs) == 3 and any("broken.json" in m for m in msgs)
    assert any("badtypes.json: config: expected an object, given 3" in m for m in msgs)
    assert trials.column("trial_id").to_pylist() == ["t00000", "t00001"]


def test_running_campaign_without_records_gives_empty_tables_with_schema(tmp_path):
    write_campaign(tmp_path, [])
    os.rmdir(tmp_path / "qs_trials")
    trials, epochs = collect(tmp_path)
    assert trials.num_rows == 0 and epochs.num_rows == 0
    assert trials.schema.field("final_top1").type == pa.float64()
    assert epochs.schema.field("top1").type == pa.float64()


def test_not_a_campaign_dir_raises_bad_input_naming_the_file(tmp_path):
    with pytest.raises(CampaignFileError, match="qs_campaign.json: expected a campaign folder"):
        collect(tmp_path)


def test_write_results_round_trips_and_leaves_campaign_files_alone(tmp_path):
    write_campaign(tmp_path, ALL_STATUSES)
    before = tree_digest(tmp_path)
    paths = write_results(tmp_path)
    assert tree_digest(tmp_path) == before
    assert paths == {"trials": f"{tmp_path}/results/{TRIALS_FILE}", "epochs": f"{tmp_path}/results/{EPOCHS_FILE}"}
    assert sorted(os.listdir(tmp_path / "results")) == sorted([TRIALS_FILE, EPOCHS_FILE])  # no temp left

    import duckdb
    import pandas as pd

    df = pd.read_parquet(paths["trials"])
    assert len(df) == len(ALL_STATUSES)
    assert str(df["final_top1"].dtype) == "float64" and str(df["epochs_run"].dtype) == "int64"
    assert str(df["ended_at"].dtype).startswith("datetime64[us, UTC]")
    assert df.loc[df.trial_id == "t00004", "config_hidden_width"].item() == "match"
    ep = pd.read_parquet(paths["epochs"])
    assert str(ep["epoch"].dtype) == "int64" and str(ep["top1"].dtype) == "float64"

    con = duckdb.connect()
    described = con.execute(f"DESCRIBE SELECT * FROM read_parquet('{paths['trials']}')").fetchall()
    types = {row[0]: row[1] for row in described}  # column_name -> column_type
    assert types["trial_id"] == "VARCHAR" and types["final_top1"] == "DOUBLE" and types["epochs_run"] == "BIGINT"
    assert types["ended_at"] == "TIMESTAMP WITH TIME ZONE" and types["config_deterministic"] == "BOOLEAN"
    n_completed, best = con.execute(
        f"SELECT count(*), max(final_top1) FROM read_parquet('{paths['trials']}') WHERE status = 'completed'"
    ).fetchone()
    assert n_completed == ALL_STATUSES.count("completed") and best == df[df.status == "completed"].final_top1.max()
    n_epochs = con.execute(f"SELECT count(*) FROM read_parquet('{paths['epochs']}')").fetchone()[0]
    assert n_epochs == len(ep)


def test_write_results_writes_files_encoded_beforehand_as_they_are(tmp_path):
    exp = tmp_path / "exp"
    write_campaign(exp, ALL_STATUSES)
    trials, epochs = collect(exp)
    files = parquet_files(trials, epochs)
    paths = write_results(exp, out_dir=tmp_path / "out", files=files)
    assert open(paths["trials"], "rb").read() == files[TRIALS_FILE].to_pybytes()
    assert open(paths["epochs"], "rb").read() == files[EPOCHS_FILE].to_pybytes()
    assert pq.read_table(paths["trials"]).equals(trials) and pq.read_table(paths["epochs"]).equals(epochs)


def test_uri_and_out_dir(tmp_path):
    exp = tmp_path / "exp"
    write_campaign(exp, ["completed", "failed"])
    trials, _ = collect(f"file://{exp}")
    assert trials.num_rows == 2
    out = write_results(f"file://{exp}", out_dir=f"file://{tmp_path}/elsewhere")
    assert out["trials"] == f"file://{tmp_path}/elsewhere/{TRIALS_FILE}"
    assert (tmp_path / "elsewhere" / TRIALS_FILE).exists()
    with pytest.raises(BadInput, match="--out: expected a folder outside a campaign's own files, "
                                       ".* the campaign folder"):
        write_results(exp, out_dir=exp)
    with pytest.raises(BadInput, match="--out: expected a folder outside a campaign's own files, "
                                       ".* the campaign's qs_trials/"):
        write_results(exp, out_dir=exp / "qs_trials")
    (tmp_path / "afile").write_text("keep")
    with pytest.raises(BadInput, match='--out: expected a folder, given ".*afile", which is a file'):
        write_results(exp, out_dir=tmp_path / "afile")
    assert (tmp_path / "afile").read_text() == "keep"


def test_irregular_epochs_and_extra_metrics(tmp_path):
    """Epoch dicts with differing keys, a non-numeric value and an extra metric still line up."""
    write_campaign(tmp_path, ["completed"], layout="older")
    path = tmp_path / "qs_trials" / "t00000.json"
    rec = json.loads(path.read_text())
    rec["epochs"] = [{"epoch": 1, "top1": 10.0, "qs_note": "warmup"},
                     {"top1": 20.0, "epoch": 2, "ema_top1": 21.0},
                     {"epoch": 3, "val_loss": 0.5}]
    atomic_json(path, rec)
    trials, epochs = collect(tmp_path)
    assert epochs.column("epoch").to_pylist() == [1, 2, 3]
    assert epochs.column("top1").to_pylist() == [10.0, 20.0, None]
    assert epochs.column("ema_top1").to_pylist() == [None, 21.0, None]
    assert epochs.column("qs_note").to_pylist() == [None, None, None]
    row = trials.to_pylist()[0]
    assert row["final_top1"] is None and row["best_top1"] == 20.0 and row["best_epoch"] == 2
    assert row["final_ema_top1"] is None and row["final_val_loss"] == 0.5


# ---------------------------------------------------------------------------------------- layouts
def _tables(exp):
    trials, epochs = collect(exp)
    return trials, epochs


@pytest.mark.parametrize("layout", ["current", ["current", "older"], ["older", "older", "current"]])
def test_both_record_layouts_collect_the_same_tables(tmp_path, layout, monkeypatch):
    """Older campaigns (epochs inside the records), current ones (epochs files) and campaigns mixing
    both give equal tables: same columns, types, values and order. Small read chunks and a second
    header (an extra metric) exercise the grouped parse across chunks."""
    monkeypatch.setattr(readers, "_CHUNK", 4)
    extra = {i: {"ema_top1": 1.5 * i} for i in (3, 8, 9)}

    def write(exp, lay):
        recs = write_campaign(exp, ALL_STATUSES, layout="older")
        for i, rec in enumerate(recs):
            for e in rec["epochs"]:
                e.update(extra.get(i, {}))
            write_record(exp, rec, lay if isinstance(lay, str) else lay[i % len(lay)])
        return recs

    write(tmp_path / "older", "older")
    recs = write(tmp_path / "new", layout)
    if layout == "current":
        assert sorted(os.listdir(tmp_path / "new" / "qs_trials")) == sorted(
            [f"{r['trial_id']}.json" for r in recs] + [f"{r['trial_id']}{EPOCHS_SUFFIX}" for r in recs if r["epochs"]])
    old_trials, old_epochs = _tables(tmp_path / "older")
    new_trials, new_epochs = _tables(tmp_path / "new")
    assert new_trials.schema == old_trials.schema and new_epochs.schema == old_epochs.schema
    assert new_trials.equals(old_trials) and new_epochs.equals(old_epochs)
    assert "final_ema_top1" in new_trials.column_names and new_epochs.num_rows == sum(len(r["epochs"]) for r in recs)


def test_epochs_file_is_readable_csv_with_exact_numbers(tmp_path):
    epochs = [{"epoch": 1.0, "top1": 0.1 + 0.2, "lr": 1e-300, "val_loss": -0.0, "images_per_s": 1e16, "a,b": 2.5},
              {"epoch": 2.0, "top1": 1 / 3, "note": "n/a"}]
    text = epochs_csv(epochs).decode()
    assert text.splitlines()[0] == 'epoch,top1,lr,val_loss,images_per_s,"a,b",note'
    assert text.splitlines()[1] == "1,0.30000000000000004,1e-300,-0,1e+16,2.5,"
    assert text.splitlines()[2] == "2,0.3333333333333333,,,,,"
    write_campaign(tmp_path, ["completed"], layout="older")
    rec = json.loads((tmp_path / "qs_trials" / "t00000.json").read_text())
    rec["epochs"] = epochs
    write_record(tmp_path, rec)
    _, table = collect(tmp_path)
    assert table.column("top1").to_pylist() == [0.1 + 0.2, 1 / 3]
    assert table.column("lr").to_pylist() == [1e-300, None]
    assert str(table.column("val_loss").to_pylist()[0]) == "-0.0"
    assert table.column("a,b").to_pylist() == [2.5, None] and "note" in table.column_names


def test_a_blocks_own_precision_survives_the_parquet_round_trip(tmp_path):
    """A block's own precision (quant_qkv.1) is a column of its own, typed as its key, null where a record has none;
    read back from trials.parquet, each trial's quantization policy is the one its record holds."""
    from qkvsearch.spaces.keys import quant_policy

    records = write_campaign(tmp_path, ["completed"] * 3)
    policies = [{}, {"quant_qkv": "int8_dynamic", "quant_qkv.1": "fp", "quant_mlp.11": "int8_weight_only"},
                {"quant_proj.0": "int8_dynamic"}]
    for rec, policy in zip(records, policies):
        rec["config"].update(policy)
        write_record(tmp_path, rec)
    table = pq.read_table(write_results(tmp_path)["trials"])
    for name in ("config_quant_qkv.1", "config_quant_mlp.11", "config_quant_proj.0"):
        assert table.schema.field(name).type == pa.string(), name
    rows = table.to_pylist()
    assert rows[0]["config_quant_qkv.1"] is None and rows[1]["config_quant_qkv.1"] == "fp"
    back = [quant_policy({k.removeprefix("config_"): v for k, v in row.items() if k.startswith("config_")})
            for row in rows]
    assert back == [quant_policy(r["config"]) for r in records] == policies
    assert [json.loads(row["config_json"]) for row in rows] == [upgraded(r["config"]) for r in records]
