"""Reading a campaign file: safe YAML with bounds on size and nesting, presets by name, and ``--set`` overrides
applied to the parsed file before any section is checked (spaces.loader)."""
from __future__ import annotations

import os
import re
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path

import yaml

from qkvsearch.spaces.errors import Collector, SpecError, clip, hint, show
from qkvsearch.spaces.schema import SECTIONS

PRESET_DIR = Path(__file__).parent / "presets"
MAX_FILE_BYTES = 1 << 20   # a campaign file is a few KB; this bounds reading and parsing time
MAX_DEPTH = 100            # nesting levels (a spec needs about 6)
MAX_NODES = 100_000        # values in a spec, counted as if every alias were copied out


class _TooBig(yaml.MarkedYAMLError):
    """A file past MAX_DEPTH or MAX_NODES: refused while composing, before PyYAML recurses or builds it."""


class _Loader(yaml.SafeLoader):
    """Safe YAML that rejects duplicate keys and reads 5e-4 as a float (YAML 1.1 reads it as a string).

    It also refuses nesting deeper than MAX_DEPTH (PyYAML composes recursively and would raise
    RecursionError) and more than MAX_NODES nodes. Merge keys (<<) are not supported: a key's
    constructor runs before PyYAML would flatten merges, and the merge tag has none.
    """

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._nodes = 0

    def compose_node(self, parent, index):
        self._depth += 1
        self._nodes += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooBig(problem=f"expected YAML nested at most {MAX_DEPTH} levels deep, given nesting "
                                      f"deeper than {MAX_DEPTH} levels", problem_mark=self.peek_event().start_mark)
            if self._nodes > MAX_NODES:
                raise _TooBig(problem=f"expected at most {MAX_NODES} values, given more",
                              problem_mark=self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node, deep=False):
        seen: dict = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                if key in seen:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {show(key)} (first at line {seen[key]})",
                        key_node.start_mark)
                seen[key] = key_node.start_mark.line + 1
            except TypeError:   # unhashable key: let PyYAML report it
                pass
        return super().construct_mapping(node, deep)


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"),
)


def parse_yaml(text: str, source: str):
    try:
        return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass
    except _TooBig as exc:
        mark = exc.problem_mark
        raise SpecError([f"{source}: {exc.problem} (line {mark.line + 1})"], source) from None
    except RecursionError:  # only under a recursion limit too low for MAX_DEPTH levels
        raise SpecError([f"{source}: expected YAML nested at most {MAX_DEPTH} levels deep, given nesting "
                         f"deeper than Python can parse"], source) from None
    except yaml.reader.ReaderError as exc:
        code = exc.character if isinstance(exc.character, int) else ord(exc.character[:1] or "\0")
        raise SpecError([f"{source}: expected printable text, given the control character #x{code:04x} "
                         f"at character {exc.position}"], source) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or str(exc)
        context = getattr(exc, "context", None)
        detail = f"{problem} ({context})" if context else problem
        line = f" (line {mark.line + 1})" if mark else ""
        raise SpecError([f"{where}: YAML syntax error{line}: {clip(detail)}"], source) from None
    except ValueError as exc:  # a scalar PyYAML cannot convert, e.g. an int past Python's digit limit
        raise SpecError([f"{source}: expected YAML values Python can read, given one it cannot "
                         f"({clip(exc)})"], source) from None


def check_size(data, source: str | None) -> None:
    """Refuse data with more than MAX_NODES values once shared references (YAML aliases) are counted
    as copies, nesting past MAX_DEPTH, or a value that contains itself. Counting is memoised on id(),
    so it costs one visit per distinct object however far the aliases would expand."""
    problem = size_problem(data)
    if problem:
        raise SpecError([f"{source or 'the spec'}: {problem}"], source)


def size_problem(data) -> str | None:
    try:
        count, depth = _size(data)
    except _Cycle:
        return "expected a tree of values, given a value that contains itself (an alias inside its own anchor)"
    if count > MAX_NODES:
        return f"expected at most {MAX_NODES} values after expanding aliases (*name), given more than {MAX_NODES}"
    if depth > MAX_DEPTH:
        return f"expected nesting at most {MAX_DEPTH} levels deep, given {depth} levels"
    return None


class _Cycle(Exception):
    pass


def _size(root) -> tuple[int, int]:
    """(values, depth) of a tree of dicts/lists as if every shared reference were copied out.

    Iterative post-order walk with memo[id] = (count, depth); counts saturate just past MAX_NODES.
    """
    memo: dict[int, tuple[int, int]] = {}   # ids of live containers only: scalars never collide
    active: set[int] = set()                 # the containers on the path from the root
    stack = [(root, False)]
    while stack:
        node, done = stack.pop()
        key = id(node)
        if done:
            active.discard(key)
            count, depth = 1, 0
            for child in _children(node):
                c_count, c_depth = memo.get(id(child), (1, 0))
                count = min(count + c_count, MAX_NODES + 1)
                depth = max(depth, c_depth)
            memo[key] = (count, depth + 1)
            continue
        if key in memo or not _is_container(node):
            continue
        if key in active:
            raise _Cycle
        active.add(key)
        stack.append((node, True))
        stack.extend((child, False) for child in _children(node) if _is_container(child))
    return memo.get(id(root), (1, 0))


def _is_container(node) -> bool:
    return isinstance(node, (Mapping, list, tuple, set, frozenset))


def _children(node) -> list:
    if isinstance(node, Mapping):
        return [*node.keys(), *node.values()]
    if isinstance(node, (list, tuple, set, frozenset)):
        return list(node)
    return []


# ---------------------------------------------------------------- presets and files


def list_presets() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.yaml"))


def preset_path(name: str) -> Path:
    path = PRESET_DIR / f"{name}.yaml"
    if not path.is_file():
        raise SpecError([f"unknown preset {show(name)}" + hint(name, list_presets())])
    return path


def read_spec_file(path_like) -> tuple[object, str, str]:
    """(raw YAML data, source text for messages, default campaign name). A bare preset name works too."""
    path = Path(os.fspath(path_like))
    if not path.exists() and path.suffix == "" and (PRESET_DIR / f"{path.name}.yaml").is_file():
        path = PRESET_DIR / f"{path.name}.yaml"
    source = clip(str(path))
    data = parse_yaml(_read_text(path, source), source)
    check_size(data, source)
    return data, source, path.stem


def _read_text(path: Path, source: str) -> str:
    """The file's text: a regular file of at most MAX_FILE_BYTES bytes of UTF-8, else SpecError."""
    def refuse(given: str, expected: str = "a campaign YAML file"):
        raise SpecError([f"{source}: expected {expected}, given {given}"], source)

    try:
        info = path.stat()
    except FileNotFoundError:
        raise SpecError([f"campaign file not found: {source} (expected a campaign YAML file or a preset "
                         f"name: {', '.join(list_presets())})"], source) from None
    except OSError as err:   # a parent that is a file, no permission to look inside a folder, ...
        refuse(f"a path that cannot be read ({err.strerror or err})")
    if stat.S_ISDIR(info.st_mode):
        refuse("a directory")
    if not stat.S_ISREG(info.st_mode):   # a FIFO or a device would block or never end
        refuse("a special file (not a regular file)")
    if info.st_size > MAX_FILE_BYTES:
        refuse(f"{info.st_size} bytes", f"a campaign YAML file of at most {MAX_FILE_BYTES} bytes")
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as err:
        refuse(f"a file that cannot be read ({err.strerror or err})")
    if len(data) > MAX_FILE_BYTES:
        refuse(f"more than {MAX_FILE_BYTES} bytes", f"a campaign YAML file of at most {MAX_FILE_BYTES} bytes")
    return _decode(data, refuse)


def _decode(data: bytes, refuse) -> str:
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        refuse("UTF-16 text (save it as UTF-8)", "UTF-8 YAML text")
    nul = data.find(b"\0")
    if nul >= 0:
        refuse(f"binary data (a NUL byte at offset {nul})", "UTF-8 YAML text")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        refuse(f"bytes that are not UTF-8 (0x{data[err.start]:02x} at offset {err.start})", "UTF-8 YAML text")


# ---------------------------------------------------------------- overrides


def apply_overrides(raw: dict, overrides: Sequence[str], c: Collector) -> None:
    """Apply "a.b=value" strings in place; the value is a YAML scalar or flow collection."""
    for text in overrides:
        label = f"override {show(text)}"
        key_path, sep, value_text = str(text).partition("=")
        segments = key_path.strip().split(".")
        if not sep or not all(s.strip() for s in segments):
            c.add(label, "expected key.path=value, e.g. train.epochs=10")
            continue
        try:
            value = yaml.load(value_text, Loader=_Loader) if value_text.strip() else None  # noqa: S506
        except yaml.YAMLError as exc:
            c.add(label, f"the value is not valid YAML: {clip(getattr(exc, 'problem', None) or exc)}")
            continue
        except (RecursionError, ValueError) as exc:
            c.add(label, f"the value cannot be read: {clip(type(exc).__name__)}")
            continue
        too_big = size_problem(value)
        if too_big:
            c.add(label, too_big)
            continue
        if segments[0] not in SECTIONS:
            c.add(label, f"unknown section {show(segments[0])}" + hint(segments[0], SECTIONS))
            continue
        problem = _set_path(raw, [s.strip() for s in segments], value)
        if problem:
            c.add(label, problem)


def _set_path(node, segments: list[str], value) -> str | None:
    for depth, seg in enumerate(segments):
        last = depth == len(segments) - 1
        here = ".".join(segments[:depth]) or "the spec"
        if isinstance(node, list):
            if not seg.isdigit() or int(seg) >= len(node):
                return f"{here} is a list of {len(node)}: expected an index below {len(node)}, given {show(seg)}"
            seg = int(seg)
        elif not isinstance(node, dict):
            return f"{here} is {show(node)}, not a mapping"
        if last:
            node[seg] = value
        else:
            if isinstance(node, dict) and node.get(seg) is None:
                if segments[depth + 1].isdigit():
                    return f"{'.'.join(segments[:depth + 1])} is not set, so it has no item {segments[depth + 1]}"
                node[seg] = {}
            node = node[seg]
    return None
