"""Reading user files safely: regular files of bounded size, and YAML without its traps.

Every input file simtrain reads (model, hardware profile, scenario, schedule CSV, torch profiler
trace) goes through :func:`read_text`, which refuses before reading anything that is not a
regular file (``/dev/zero``, a FIFO that would block forever, a socket, a folder) or that is larger
than the limit for its kind. YAML goes through :func:`parse_yaml`, PyYAML's safe loader (on
libyaml's parser when present) with two more checks:

* a key given twice in one mapping is an error (YAML 1.2 §3.2.1.1 requires unique keys; PyYAML
  silently keeps the last one, so ``num_layers`` twice gave a 2-layer model);
* the document, with every alias expanded, may have at most :data:`MAX_YAML_NODES` nodes. An
  alias bomb ("billion laughs": nine levels of nine aliases of the level below) is a few hundred
  bytes that expand to ~10⁹ nodes; PyYAML builds it as shared objects, but pydantic, which walks
  every value, then runs for minutes and gigabytes. The expanded size is counted on the composed
  node graph (memoised per node, so the count itself is linear in the file).

Errors are :class:`simtrain.errors.SimtrainError` with the path and what is allowed.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import yaml

from .errors import SimtrainError

MiB = 2**20
MAX_YAML_BYTES = 16 * MiB
"""Largest YAML file read (a calibrated profile is ~50 KB; the biggest shipped file is ~10 KB)."""
MAX_CSV_BYTES = 16 * MiB
"""Largest schedule CSV read (~3 million actions; a 64-rank, 1024-microbatch 1F1B is 0.7 MB)."""
MAX_TRACE_BYTES = 1024 * MiB
"""Largest torch profiler trace read (one pipeline step of a real model is tens of MB)."""
MAX_YAML_NODES = 1_000_000
"""Most YAML nodes after alias expansion (the largest shipped file has a few thousand)."""


def check_regular_file(path: Path, what: str, max_bytes: int) -> int:
    """Refuse, without opening it, a path that is not a regular file of at most ``max_bytes``.

    Args:
        path: the file.
        what: what it should be, for the message (e.g. ``"a YAML file"``).
        max_bytes: the largest size accepted, bytes.

    Returns:
        The file's size in bytes.

    Raises:
        SimtrainError: missing, a folder, a device / FIFO / socket, unreadable, or too large.
    """
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise SimtrainError(f"{path}: file not found (expected {what})") from None
    except OSError as exc:
        raise SimtrainError(f"{path}: cannot read the file ({exc.strerror})") from None
    if stat.S_ISDIR(info.st_mode):
        raise SimtrainError(f"{path}: is a folder, expected {what}")
    if not stat.S_ISREG(info.st_mode):
        kind = ("a FIFO (named pipe)" if stat.S_ISFIFO(info.st_mode) else "a device" if
                stat.S_ISCHR(info.st_mode) or stat.S_ISBLK(info.st_mode) else "a socket" if
                stat.S_ISSOCK(info.st_mode) else "not a regular file")
        raise SimtrainError(f"{path}: is {kind}, expected {what} (a regular file)")
    if info.st_size > max_bytes:
        raise SimtrainError(f"{path}: is {info.st_size / MiB:.1f} MiB; {what} may be at most "
                            f"{max_bytes / MiB:.0f} MiB")
    return info.st_size


def read_text(path: Path, what: str, max_bytes: int, encoding: str = "utf-8") -> str:
    """The text of a regular file of at most ``max_bytes`` (see :func:`check_regular_file`).

    Args:
        path: the file.
        what: what it should be, for messages.
        max_bytes: the largest size accepted, bytes (also enforced while reading, in case the
            file grows between the check and the read).
        encoding: text encoding; ``"utf-8-sig"`` also drops a leading byte-order mark.

    Raises:
        SimtrainError: see :func:`check_regular_file`; or not text in ``encoding``.
    """
    check_regular_file(path, what, max_bytes)
    try:
        with open(path, "rb") as f:
            data = f.read(max_bytes + 1)
    except OSError as exc:
        raise SimtrainError(f"{path}: cannot read the file ({exc.strerror})") from None
    if len(data) > max_bytes:
        raise SimtrainError(f"{path}: {what} may be at most {max_bytes / MiB:.0f} MiB")
    try:
        return data.decode(encoding)
    except UnicodeDecodeError:
        raise SimtrainError(f"{path}: not a text (UTF-8) {what.removeprefix('a ')}") from None


class _UniqueKeys:
    """Constructor mixin for PyYAML's safe loaders: refuse a mapping that repeats a key
    (``source`` names the file)."""

    source = "YAML"

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, yaml.Node] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise SimtrainError(
                        f"{self.source}: key '{key}' is given twice (lines {seen[key].start_mark.line + 1} and "
                        f"{key_node.start_mark.line + 1}); give each field once")
                seen[key] = key_node
        return super().construct_mapping(node, deep=deep)


class _UniqueKeyLoader(_UniqueKeys, yaml.SafeLoader):
    """PyYAML's pure-Python safe loader with unique keys: its messages name line and column."""


_FAST_LOADER = type("_FastUniqueKeyLoader", (_UniqueKeys, yaml.CSafeLoader), {}) if yaml.__with_libyaml__ else None
"""The same loader on libyaml's parser (about 7x faster: ``op_data.yaml`` parses in ~20 ms instead
of ~140 ms). Resolver and constructor are PyYAML's Python classes in both, so a document that both
parse gives the same values."""


def _expanded_nodes(root: yaml.Node, limit: int) -> int:
    """Nodes of the document with every alias expanded, counted on the shared graph; stops
    counting once above ``limit``. Iterative post-order, memoised per node (aliases point to the
    same node object), so it costs one visit per distinct node. A recursive alias (``&a [*a]``:
    a node inside itself) expands without end: above any ``limit``."""
    sizes: dict[int, int] = {}
    opened: set[int] = set()  # nodes whose children are being counted: what the stack holds above them is inside them
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, done = stack.pop()
        if id(node) in sizes:
            continue
        children = ([c for pair in node.value for c in pair] if isinstance(node, yaml.MappingNode)
                    else list(node.value) if isinstance(node, yaml.SequenceNode) else [])
        if not done:
            if id(node) in opened:
                return limit + 1  # reached again inside itself
            opened.add(id(node))
            stack.append((node, True))
            stack.extend((c, False) for c in children if id(c) not in sizes)
            continue
        sizes[id(node)] = min(limit + 1, 1 + sum(sizes.get(id(c), 0) for c in children))
    return sizes[id(root)]


def _nodes(root: yaml.Node, limit: int) -> int:
    """Nodes of the document with every alias expanded, as :func:`_expanded_nodes` counts them;
    stops counting once above ``limit``. A document without aliases is a tree (the composer gives
    an alias the anchored node object itself, so a node reached twice is an alias), counted by
    one walk without :func:`_expanded_nodes`' memo (~5x faster: ``op_data.yaml``'s 3,410 nodes in
    ~1 ms instead of ~8 ms); at the first node reached twice the count is left to it."""
    seen: set[int] = set()
    stack = [root]
    while stack and len(seen) <= limit:
        node = stack.pop()
        if id(node) in seen:
            return _expanded_nodes(root, limit)
        seen.add(id(node))
        if isinstance(node, yaml.MappingNode):
            for pair in node.value:
                stack.extend(pair)
        elif isinstance(node, yaml.SequenceNode):
            stack.extend(node.value)
    return len(seen)


def _load(loader_class: type, text: str, source: str, max_nodes: int) -> Any:
    """Compose ``text`` with ``loader_class``, bound its alias expansion, then construct it.

    Raises:
        yaml.YAMLError, RecursionError: as the loader raises them.
        SimtrainError: a repeated key, or an expansion above ``max_nodes``.
    """
    loader = loader_class(text)
    loader.source = source
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        if _nodes(node, max_nodes) > max_nodes:
            raise SimtrainError(f"{source}: the YAML expands (through its aliases) to more than "
                                f"{max_nodes:,} values; at most {max_nodes:,} are allowed")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def parse_yaml(text: str, source: str, max_nodes: int = MAX_YAML_NODES) -> Any:
    """Parse one YAML document safely (safe types only, unique keys, bounded alias expansion).

    libyaml's parser reads the document when PyYAML has it; a document it refuses (or nests
    beyond its 1,000 levels) is read again by PyYAML's own parser, whose message is the one shown,
    so messages do not depend on whether libyaml is installed.

    Args:
        text: the document.
        source: where it came from, for messages.
        max_nodes: the most nodes the document may have with every alias expanded.

    Returns:
        The parsed document (None for an empty one).

    Raises:
        SimtrainError: malformed YAML, a repeated key, or an expansion above ``max_nodes``.
    """
    if _FAST_LOADER is not None:
        try:
            return _load(_FAST_LOADER, text, source, max_nodes)
        except (yaml.YAMLError, RecursionError):
            pass  # PyYAML's parser below gives the message
    try:
        return _load(_UniqueKeyLoader, text, source, max_nodes)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SimtrainError(f"{source}: malformed YAML{where}: {problem}") from None
    except RecursionError:
        raise SimtrainError(f"{source}: the YAML is nested too deeply") from None


def load_yaml(path: Path) -> Any:
    """Read and parse a YAML file with :func:`read_text` and :func:`parse_yaml`.

    Raises:
        SimtrainError: see those two.
    """
    return parse_yaml(read_text(path, "a YAML file", MAX_YAML_BYTES), str(path))
