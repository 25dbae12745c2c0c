"""MkDocs hooks (mkdocs.yml ``hooks:``), run on every build.

- The campaign file's reference tables are rendered from the declarations in ``qkvsearch.spaces``
  (spaces.reference): a line ``<!-- reference: keys train -->`` in a page becomes that table, so a page
  cannot drift from the parser. An unknown name fails the build.
- ``::: qkvsearch.build_model`` (mkdocstrings) names an object by the path users import it from; the hook
  rewrites it to the module that defines it, which mkdocstrings reads.
- mkdocstrings reads source files, but the package's folders are mapped (pyproject.toml
  ``[tool.setuptools.package-dir]``: ``qkvsearch`` is ``search/_root``, ``qkvsearch.spaces`` is ``spaces/``,
  ...), which no source tree shows. The hook lays out ``build/docs-api/qkvsearch/`` as links to those folders,
  the tree mkdocs.yml gives the Python handler as its ``paths``.
- benchmarks/README.md and search/RESULTS_SCHEMA.md are pages of the site, read from where they live. The results
  schema's generated tables are rendered from their declarations here too: a line ``<!-- results: NAME -->`` becomes
  ``RESULTS[NAME]()`` (the config columns from spaces.keys.KEYS, the stage metrics from spaces.metrics).
"""
from __future__ import annotations

import importlib
import re
import shutil
from pathlib import Path

from mkdocs.structure.files import File

REPO = Path(__file__).resolve().parent.parent
API_TREE = REPO / "build" / "docs-api"
MARKER = re.compile(r"^<!-- reference: (.+?) -->$", re.M)
RESULTS_MARKER = re.compile(r"^<!-- results: (.+?) -->$", re.M)
AUTODOC = re.compile(r"^::: ([\w.]+)$", re.M)
# page of the site -> file of the repository it shows
INCLUDED = {"benchmarks.md": "benchmarks/README.md", "results-schema.md": "search/RESULTS_SCHEMA.md"}


def package_dirs() -> dict[str, str]:
    """pyproject.toml's [tool.setuptools.package-dir]: package -> folder (read as text: no TOML parser on 3.10)."""
    text = (REPO / "pyproject.toml").read_text()
    section = text.split("[tool.setuptools.package-dir]", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^"([\w.]+)"\s*=\s*"([^"]+)"', section, re.M))


def lay_out_api_tree() -> None:
    """build/docs-api/<package>/...: each mapped package as a folder of links to its files and subpackages."""
    shutil.rmtree(API_TREE, ignore_errors=True)
    for package, folder in sorted(package_dirs().items(), key=lambda item: item[0].count(".")):
        target = API_TREE.joinpath(*package.split("."))
        if package.count(".") == 0:   # the root: its own files, linked one by one (subpackages go inside it)
            target.mkdir(parents=True)
            for entry in (REPO / folder).glob("*.py"):
                (target / entry.name).symlink_to(entry)
        else:
            target.symlink_to(REPO / folder, target_is_directory=True)


def defined_at(path: str) -> str:
    """The dotted path of the module that defines the object imported as ``path`` (``path`` if not found)."""
    parts = path.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
        return f"{module}.{qualname}" if module and qualname and cut < len(parts) else path
    return path


def on_startup(command, dirty):
    # before any plugin's on_config: mkdocstrings' Python handler takes its search paths as they are then
    lay_out_api_tree()


def on_files(files, config):
    for page, source in INCLUDED.items():
        files.append(File.generated(config, page, abs_src_path=str(REPO / source)))
    return files


def results_table(name: str) -> str:
    """A generated table of search/RESULTS_SCHEMA.md (KeyError for a name none generates: the build fails)."""
    from qkvsearch.search.analysis.results import config_columns_markdown
    from qkvsearch.search.analysis.stages import stage_metric_markdown

    return {"config-columns": config_columns_markdown, "stage-metrics": stage_metric_markdown}[name]()


def render_page(markdown: str) -> str:
    """A page's markdown with its generated tables in place of their markers."""
    from qkvsearch.spaces.reference import render

    markdown = MARKER.sub(lambda m: render(m.group(1)), markdown)
    return RESULTS_MARKER.sub(lambda m: results_table(m.group(1)), markdown)


def on_page_markdown(markdown, page, config, files):
    return AUTODOC.sub(lambda m: "::: " + defined_at(m.group(1)), render_page(markdown))
