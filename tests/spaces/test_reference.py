"""The campaign file's generated reference (spaces.reference) lists every declared key and field with its
default, the documentation's pages place every table, and the section parsers take their defaults and error
texts from the same tables."""
import re

import pytest
from helpers import REPO

from qkvsearch.spaces import SpecError, load_campaign
from qkvsearch.spaces.keys import KEYS
from qkvsearch.spaces.reference import KEY_SECTIONS, SECTION_TABLES, field_default, key_default, render

PAGES = REPO / "docs" / "pages"
MINIMAL = {"name": "ref", "model": {"name": "xcit_nano_12_p16_224", "img_size": 32}, "train": {"epochs": 2}}


def _row(table: str, name: str) -> str:
    """The table's row of the key or field ``name`` (its first cell), or ''."""
    return next((line for line in table.splitlines() if line.startswith(f"| `{name}` |")), "")


@pytest.mark.parametrize("key", [k for k in KEYS.values() if k.section], ids=lambda k: k.name)
def test_every_sectioned_trial_key_is_listed_with_its_default(key):
    row = _row(render(f"keys {key.section}"), key.section_key or key.name)
    assert row, f"{key.section}.{key.section_key or key.name} is missing from the reference"
    assert f"`{key_default(key)}`" in row and key.check.expected.replace("|", "\\|") in row


@pytest.mark.parametrize(("table", "field"), [(t, f) for t, fields in SECTION_TABLES.items() for f in fields.values()],
                         ids=lambda x: x if isinstance(x, str) else x.name)
def test_every_declared_field_is_listed_with_its_default(table, field):
    row = _row(render(f"fields {table}"), field.name)
    assert row, f"{table}.{field.name} is missing from the reference"
    assert field_default(field).replace("|", "\\|").replace("<", "&lt;") in row


def test_the_keys_only_a_space_sets_are_listed():
    table = render("space")
    for key in KEYS.values():
        if key.section is None and key.searchable:
            assert _row(table, key.name), key.name


def test_every_table_has_a_place_in_the_documentation():
    markers = {m for page in PAGES.rglob("*.md") for m in re.findall(r"^<!-- reference: (.+?) -->$",
                                                                         page.read_text(), re.M)}
    wanted = {f"keys {s}" for s in KEY_SECTIONS} | {f"fields {t}" for t in SECTION_TABLES}
    assert wanted <= markers, sorted(wanted - markers)
    for marker in markers:   # each renders (the site's build would fail on an unknown one)
        assert render(marker).strip()


def test_an_unknown_table_is_an_error():
    with pytest.raises(KeyError):
        render("fields nowhere")


def test_the_parsers_fill_the_declared_defaults():
    spec = load_campaign(MINIMAL, check_names=False)
    for section in ("scheduler", "resources", "checkpoints", "measure"):
        got = getattr(spec, section)
        for name, field in SECTION_TABLES[section].items():
            if not field.default_doc:
                assert plain(getattr(got, name)) == plain(field.default), f"{section}.{name}"
    assert spec.search.seed == SECTION_TABLES["search"]["seed"].default


def plain(value):
    return list(value) if isinstance(value, tuple) else value


@pytest.mark.parametrize(("section", "name", "value"), [
    ("scheduler", "reduction_factor", 1), ("resources", "max_concurrent_trials", 0),
    ("resources", "placement_strategy", "TIGHT"), ("measure", "max_s", -1), ("search", "seed", -1),
    ("checkpoints", "keep", "some"), ("supernet", "retrain_from", "pretrained"),
])
def test_an_error_names_the_field_and_its_declared_expectation(section, name, value):
    raw = {**MINIMAL, section: {name: value}}
    if section == "supernet":
        raw[section]["train"] = {"epochs": 1}
    with pytest.raises(SpecError) as err:
        load_campaign(raw, check_names=False)
    assert f"{section}.{name}: expected {SECTION_TABLES[section][name].expected}, given" in str(err.value)
