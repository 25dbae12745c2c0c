"""The campaign file's ``tracking`` section: which experiment trackers a campaign feeds, and their settings.

    tracking:
      mlflow: {tracking_uri: http://mlflow:5000, experiment: xcit-s}   # default: a SQLite store in the folder
      wandb: {project: qkv, mode: offline}                             # offline: run folders in the folder
      tensorboard: {}                                                  # event files in the folder
      optuna: {storage: sqlite:///optuna.db}                           # default: a journal file in the folder

Everything about a tracker is one row of ``TRACKERS``: its settings and their defaults, where its data lives,
the packages it needs and the extra that installs them, and the class that feeds it (search.campaign.tracking,
imported when a campaign uses it).

Where a tracker writes (its ``location`` setting: mlflow.tracking_uri, optuna.storage) is a URL of a scheme it
takes (``schemes``) or a path. A path is a file inside the campaign folder when relative, never in the working
directory, which differs between launch, resume and the Ray workers; so is the file of a relative SQLite URL
(``sqlite:///optuna.db``). A path is the tracker's own kind of file (``path_url``: optuna's journal, mlflow's
SQLite database). A value that reads as a mistyped URL (``sqlite//x``, ``http:/x``, a scheme the tracker does
not take) is refused when the spec is read (``location_problem``), not when the campaign runs.
"""
from __future__ import annotations

import os
import re
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from qkvsearch.spaces import dimensions
from qkvsearch.spaces.checks import TEXT
from qkvsearch.spaces.errors import Collector, show
from qkvsearch.spaces.fields import Field, choice, table
from qkvsearch.spaces.schema import FrozenMap, plain
from qkvsearch.spaces.spec import CampaignSpec


@dataclass(frozen=True)
class TrackerInfo:
    """One tracker. fields: its settings (spaces.fields; default None: decided at launch: a location inside
    the campaign folder, or the campaign's name as experiment, project or study); location: the setting that
    says where it writes (None: always inside the campaign folder); modules: what it imports; extra: the pip
    extra that installs them; home: "module:Class" of the tracker; schemes: the URL schemes its location takes
    (before a "+driver"); path_url: the URL a path stands for ("{path}": the path itself); doc: where it writes
    by default and how to look."""

    name: str
    fields: dict[str, Field]
    location: str | None
    modules: tuple[str, ...]
    extra: str
    home: str
    schemes: tuple[str, ...] = ()
    path_url: str = "{path}"
    doc: str = ""

    @property
    def settings(self) -> FrozenMap:
        """setting -> default."""
        return FrozenMap({name: f.default for name, f in self.fields.items()})


_HOME = "qkvsearch.search.campaign.tracking"
WANDB_MODES = ("offline", "online", "disabled")
# Every setting is a non-empty string first (TEXT); a setting with a check of its own is also checked by it.
_IN_FOLDER = "a file inside the campaign folder"
TRACKERS = {t.name: t for t in (
    # A path is a SQLite store: MLflow 3 refuses to create experiments in its file store (file://, a bare
    # folder), and "databricks" alone names the workspace of the user's Databricks configuration.
    TrackerInfo("mlflow", table(
        Field("tracking_uri", "a URL (http(s)://, sqlite:///, postgresql://, mysql://, mssql://, databricks) or a "
                              "path", None, "where runs are stored",
              default_doc="the SQLite store <campaign folder>/tracking/mlflow.db"),
        Field("experiment", TEXT, None, "the MLflow experiment", default_doc="the campaign's name")),
        "tracking_uri", ("mlflow",), "mlflow", f"{_HOME}.mlflow_tracker:MLflowTracker",
        ("http", "https", "sqlite", "postgresql", "mysql", "mssql", "databricks"), "sqlite:///{path}",
        "the SQLite store <campaign folder>/tracking/mlflow.db; `mlflow ui --backend-store-uri "
        "sqlite:///<campaign folder>/tracking/mlflow.db` needs the full mlflow package"),
    # mode: offline writes run folders, nothing leaves the machine
    TrackerInfo("wandb", table(
        Field("project", TEXT, None, "the W&B project", default_doc="the campaign's name"),
        Field("entity", TEXT, None, "the W&B entity (user or team)", default_doc="null (W&B's default)"),
        Field("mode", choice(*WANDB_MODES), "offline",
              "offline: run folders in <campaign folder>/tracking/wandb (`wandb sync` uploads them)")),
        None, ("wandb",), "wandb", f"{_HOME}.wandb_tracker:WandbTracker",
        doc="offline run folders in <campaign folder>/tracking/wandb; `wandb sync` uploads them"),
    TrackerInfo("tensorboard", table(), None, ("tensorboard",), "tensorboard",
                f"{_HOME}.tensorboard_tracker:TensorBoardTracker",
                doc="event files: `tensorboard --logdir <campaign folder>/tracking/tensorboard`"),
    # A URL is an RDB storage (SQLAlchemy's dialects); a path, a journal file (optuna-dashboard opens either).
    TrackerInfo("optuna", table(
        Field("storage", "an SQLAlchemy URL (sqlite:///, postgresql://, mysql://, ...) or a path (a journal file)",
              None, "the searcher's study, which optuna-dashboard shows while the campaign runs",
              default_doc="the journal <campaign folder>/tracking/optuna.journal")),
        "storage", ("optuna",), "optuna-dashboard", f"{_HOME}.optuna_tracker:OptunaTracker",
        ("sqlite", "postgresql", "mysql", "mariadb", "oracle", "mssql"),
        doc="the journal the searcher's study is kept in, live: `optuna-dashboard <campaign "
            "folder>/tracking/optuna.journal`"),
)}
TRACKER_SETTING = TEXT   # what every setting is first


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*):")
_BARE = ("databricks",)   # a scheme alone is a whole location: mlflow's "databricks"
_URL_SCHEMES = {s for t in TRACKERS.values() for s in t.schemes} | {"file", "s3", "gs"}


def is_url(value: str) -> bool:
    """Whether a tracker location is a URL (scheme and colon first, or a bare scheme) rather than a path."""
    return bool(_SCHEME.match(value)) or value in _BARE


def location_problem(name: str, value: str) -> str | None:
    """What is wrong with ``value`` as tracker ``name``'s location ("expected ..., given ..."), or None."""
    info, text = TRACKERS[name], value.strip()
    takes = ", ".join(f"{s}://" for s in info.schemes)
    expected = f"a URL ({takes}) or a path (inside the campaign folder when relative)"
    head = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)//", text)
    if head and head.group(1).lower() in _URL_SCHEMES:
        return f"expected {expected}, given {show(value)}, a URL without the ':' after its scheme"
    if not is_url(text):
        return None
    if text in _BARE:
        return None if text in info.schemes else f"expected {expected}, given {show(value)}"
    scheme = _SCHEME.match(text).group(1).lower()
    base, rest = scheme.split("+")[0], text[len(scheme) + 1:]
    if not rest.startswith("//"):
        return (f"expected {expected}, given {show(value)}, which is neither: a URL has '//' after '{scheme}:', "
                f"and a path with ':' in its first part reads as a URL (write ./{text} for such a path)")
    if base not in info.schemes:
        return f"expected {expected}, given {show(value)}, whose scheme {scheme} {name} does not take"
    try:
        parts = urlsplit(text)
        parts.port  # noqa: B018  (parsing the port raises on one that is not a number)
    except ValueError as err:
        return f"expected {expected}, given {show(value)}, which cannot be parsed ({err})"
    if base == "sqlite":
        if parts.netloc or not parts.path.strip("/"):
            return (f"expected a SQLite URL naming a file (sqlite:///relative/file.db, sqlite:////absolute/"
                    f"file.db), given {show(value)}" + ("" if parts.netloc else ", an in-memory database that "
                                                        "is lost when the driver ends"))
    elif base in ("http", "https") and not parts.hostname:
        return f"expected {expected}, given {show(value)}, a URL without a host"
    elif not rest[2:]:
        return f"expected {expected}, given {show(value)}, a URL with nothing after its scheme"
    return None


def tracker_location(name: str, value: str, exp: str) -> str:
    """The location tracker ``name`` opens for its setting ``value`` (module docstring): a URL as given, a
    relative SQLite URL's file and a relative path inside the campaign folder ``exp``, a path as the
    tracker's URL for it."""
    text = value.strip()
    if text.lower().startswith("sqlite:///") and not text[len("sqlite:///"):].startswith("/"):
        return "sqlite:///" + os.path.join(exp, text[len("sqlite:///"):])
    if is_url(text):
        return text
    return TRACKERS[name].path_url.format(path=os.path.join(exp, os.path.expanduser(text)))


def _in_campaign_folder(value: str) -> bool:
    """Whether a location is a file the campaign folder holds (a relative path or SQLite file)."""
    text = value.strip()
    if text.lower().startswith("sqlite:///"):
        return not text[len("sqlite:///"):].startswith("/")
    return not is_url(text) and not os.path.isabs(os.path.expanduser(text))


def _remote(storage: str) -> bool:
    """Whether the campaign folder is in a bucket (s3://, gs://...), where trackers cannot write files."""
    scheme = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", storage)
    return bool(scheme) and scheme.group(1).lower() != "file"


def parse_tracking(raw, storage: str, c: Collector) -> FrozenMap:
    """The tracking section -> tracker -> FrozenMap of its settings (defaults filled in). A tracker given as
    ``{}`` or null is on with its defaults; the section absent or null: no tracker."""
    raw = c.section("tracking", raw, TRACKERS, f"a mapping of trackers ({', '.join(TRACKERS)})")
    if raw is None:
        return FrozenMap()
    out = {}
    for name, given in raw.items():
        if name in TRACKERS:
            settings = _parse_tracker(name, given, storage, c)
            if settings is not None:
                out[name] = settings
    return FrozenMap(out)


def _parse_tracker(name: str, given, storage: str, c: Collector) -> FrozenMap | None:
    path, fields = f"tracking.{name}", TRACKERS[name].fields
    if given is None:
        given = {}
    if not isinstance(given, dict):
        c.expected(path, f"a mapping ({', '.join(fields)})" if fields else "{} (no settings)", given)
        return None
    c.unknown_keys(path, given, fields)
    values = dict(TRACKERS[name].settings)
    for key, value in given.items():
        if key not in fields:
            continue
        if value is not None and not (isinstance(value, str) and value.strip()):
            c.expected(f"{path}.{key}", TRACKER_SETTING.expected, value)
            continue
        problem = location_problem(name, value) if key == TRACKERS[name].location and value is not None else None
        if problem:
            c.add(f"{path}.{key}", problem)
            continue
        values[key] = value
    for key, field in fields.items():   # a setting's own check, on its value or default
        if field.check not in (None, TRACKER_SETTING) and values[key] is not None:
            dimensions.check_value(field.check, values[key], c, f"{path}.{key}")
    if _remote(storage):
        where = TRACKERS[name].location
        if where is None:
            c.add(path, f"writes its files into the campaign folder, which must be on a local disk (storage is "
                        f"{storage})")
        elif values[where] is None:
            c.add(f"{path}.{where}", f"required when storage is a bucket (the default is a file inside the "
                                     f"campaign folder; storage is {storage})")
        elif _in_campaign_folder(values[where]):
            c.add(f"{path}.{where}", f"expected a server URL or an absolute path when storage is a bucket, given "
                                     f"{show(values[where])}, a file inside the campaign folder (storage is {storage})")
    return FrozenMap(values)


def add_trackers(spec: CampaignSpec, names: Iterable[str]) -> CampaignSpec:
    """``spec`` with the trackers ``names`` on (`--track NAME`): those its tracking section lacks get their
    defaults, those it has keep their settings. SpecError naming an unknown tracker."""
    from dataclasses import replace

    raw = plain(spec.tracking)
    for name in names:
        raw.setdefault(name, {})
    c = Collector()
    tracking = parse_tracking(raw, spec.storage, c)
    c.raise_if_any(spec.source)
    return replace(spec, tracking=tracking)
