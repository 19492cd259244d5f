"""Reading the files a user names (``--import-config``, ``--host-file``) without trusting them.

A user file is read only if it is a regular file of at most :data:`MAX_BYTES`: a FIFO, a
device such as ``/dev/zero`` or a socket is refused at once (opened non-blocking, so a FIFO
with no writer cannot hang poprun), and so is a file too large to be a configuration.
"""

from __future__ import annotations

import os
import stat

from poprun.errors import PoprunError

#: The largest user file poprun reads (a host file of ~50 000 hosts fits).
MAX_BYTES = 1 << 20


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
