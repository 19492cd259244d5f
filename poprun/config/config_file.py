"""The YAML configuration file: ``--import-config`` read into option values, ``--export-config``
written from a RunConfig.

The file is read as an untrusted user file (:mod:`poprun.config.user_files`), then composed
and its size counted with aliases expanded, so an anchor bomb (a few lines that expand to
billions of values) is refused before anything is built from it. Its keys are the options a
file may set (:data:`poprun.config.options.FILE_KEYS`); the command line wins over it
(:func:`poprun.config.run_config.build`).
"""

from __future__ import annotations

import os
from typing import Any

from poprun.config.options import BY_KEY, FILE_KEYS
from poprun.config.paths import check_file_target
from poprun.config.run_config import RunConfig
from poprun.config.user_files import read_user_file
from poprun.errors import PoprunError

#: The most values a YAML file may hold once its aliases are expanded.
MAX_YAML_VALUES = 100_000


def load_file(path: str) -> dict[str, Any]:
    """Read an ``--import-config`` YAML file (``safe_load``) into canonical keys."""
    option = "--import-config"
    text = read_user_file(option, path, "YAML file")
    import yaml  # only when a file is imported: keeps start-up light

    try:
        data = load_yaml(option, path, text)  # aliases counted: no anchor bombs
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise PoprunError(
            option, path, f"is not valid YAML{where}", "fix the file's syntax"
        ) from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise PoprunError(
            option,
            path,
            "is not a mapping of option names to values",
            "write lines like 'num-replicas: 4'",
        )
    out: dict[str, Any] = {}
    for raw_key, value in data.items():
        key = str(raw_key).strip().lstrip("-").replace("-", "_")
        if key not in FILE_KEYS and key in BY_KEY:
            raise PoprunError(
                option,
                path,
                f"key {raw_key!r} is a poprun option of the command line only",
                f"pass --{key.replace('_', '-')} on the command line, not in the file",
            )
        if key not in FILE_KEYS:
            raise PoprunError(
                option,
                path,
                f"unknown key {raw_key!r}",
                "use poprun's option names (num-replicas, host, mpi-local-args, ...); see poprun --help",
            )
        out[key] = value
    return out


def export_file(config: RunConfig, path: str, *, overwrite: bool) -> None:
    """Write the effective configuration as YAML (refusing to overwrite unless told)."""
    import yaml

    text = yaml.safe_dump(config.to_file_values(), sort_keys=False, default_flow_style=False)
    flags = os.O_WRONLY | os.O_CREAT | (os.O_TRUNC if overwrite else os.O_EXCL)
    fd = os.open(path, flags, 0o644)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


def check_export_path(path: str, *, overwrite: bool) -> None:
    """Refuse an ``--export-config`` target before anything happens."""
    option = "--export-config"
    if os.path.isdir(path):
        raise PoprunError(option, path, "is a directory", "give a file path")
    if os.path.exists(path) and not overwrite:
        raise PoprunError(
            option, path, "already exists", "choose another path or add --overwrite-config=yes"
        )
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise PoprunError(option, path, f"directory {parent} does not exist", "create it first")
    check_file_target(option, path)


def load_yaml(option: str, path: str, text: str) -> Any:
    """``yaml.safe_load(text)``, refusing a document whose aliases expand past the bound.

    Syntax errors are raised as ``yaml.YAMLError`` for the caller to report.
    """
    import yaml  # only when a file is imported: keeps start-up light

    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise PoprunError(option, path, "is nested too deeply", "flatten the file") from None
        if node is None:
            return None
        _check_expanded_size(option, path, node)
        return loader.construct_document(node)
    finally:
        loader.dispose()


def _check_expanded_size(option: str, path: str, root: Any) -> None:
    """Count the values ``root`` stands for, each alias counted as a full copy of its anchor."""
    import yaml

    sizes: dict[int, int] = {}
    active: set[int] = set()

    def refuse(problem: str) -> PoprunError:
        return PoprunError(
            option, path, problem, "write the values out, without chains of YAML aliases (*name)"
        )

    def size(node: Any) -> int:
        key = id(node)
        known = sizes.get(key)
        if known is not None:
            return known
        if key in active:
            raise refuse("has a YAML alias that refers to itself")
        active.add(key)
        total = 1
        if isinstance(node, yaml.MappingNode):
            for name, value in node.value:
                total += size(name) + size(value)
                if total > MAX_YAML_VALUES:
                    break
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                total += size(item)
                if total > MAX_YAML_VALUES:
                    break
        active.discard(key)
        if total > MAX_YAML_VALUES:
            raise refuse(f"expands to more than {MAX_YAML_VALUES} values through YAML aliases")
        sizes[key] = total
        return total

    try:
        size(root)
    except RecursionError:
        raise PoprunError(option, path, "is nested too deeply", "flatten the file") from None
