"""Reading the files a user names (``--import-config``, ``--host-file``) without trusting them.

A user file is read only if it is a regular file of at most :data:`MAX_BYTES`: a FIFO, a
device such as ``/dev/zero`` or a socket is refused at once (opened non-blocking, so a FIFO
with no writer cannot hang poprun), and so is a file too large to be a configuration. YAML
is composed first and its size counted with aliases expanded, so an anchor bomb (a few lines
that expand to billions of values) is refused before anything is built from it.
"""

from __future__ import annotations

import os
import stat
from typing import Any

from poprun.errors import PoprunError

#: The largest user file poprun reads (a host file of ~50 000 hosts fits).
MAX_BYTES = 1 << 20
#: The most values a YAML file may hold once its aliases are expanded.
MAX_YAML_VALUES = 100_000


def read_user_file(option: str, path: str, kind: str) -> str:
    """The UTF-8 text of a file the user named with ``option``, or a :class:`PoprunError`.

    ``kind`` says what the file should be (``"YAML file"``, ``"host file (one host a line)"``).
    """
    fix = f"give a readable {kind}"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as error:
        raise PoprunError(option, path, f"cannot read it ({error.strerror})", fix) from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise PoprunError(option, path, "is a directory", f"give the path of a {kind}")
        if not stat.S_ISREG(info.st_mode):
            raise PoprunError(
                option,
                path,
                "is not a regular file (a FIFO, a device or a socket)",
                f"give the path of a {kind} on disk (copy a stream to a file first)",
            )
        too_big = PoprunError(
            option,
            path,
            f"is larger than {MAX_BYTES >> 20} MiB, too large for a {kind}",
            f"give a {kind} of at most {MAX_BYTES} bytes",
        )
        if info.st_size > MAX_BYTES:
            raise too_big
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_BYTES:  # st_size can be 0 or stale (/proc files): read bounded
            try:
                chunk = os.read(fd, MAX_BYTES + 1 - size)
            except OSError as error:
                raise PoprunError(option, path, f"cannot read it ({error.strerror})", fix) from None
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > MAX_BYTES:
            raise too_big
    finally:
        os.close(fd)
    try:
        return b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise PoprunError(option, path, "is not UTF-8 text", "save it as UTF-8 text") from None


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
