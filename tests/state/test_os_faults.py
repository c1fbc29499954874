"""OS errors of the state and the sink: a read-only folder or a full disk is a [STATE_ERROR] naming
the path, and nothing committed is lost (the next run, once the fault is gone, finishes the input
exactly once, checked line by line).

The faults are real ones root cannot bypass (``chmod`` does not stop root): a read-only bind mount
of the folder (``mount --bind`` + ``mount -o remount,ro,bind``) and a tiny tmpfs filled to the last
byte. Without the right to mount (not root, or no CAP_SYS_ADMIN) the tests skip, saying so.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from splitkeeper.errors import StateError

from .samples import LocalPipeline, assert_sink_is_input, tree


def _mount(*args: str) -> None:
    result = subprocess.run(["mount", *args], capture_output=True, text=True, check=False)
    if result.returncode != 0:
        pytest.skip(f"cannot mount here ({result.stderr.strip() or result.returncode}): needs root")


def _umount(path: str) -> None:
    subprocess.run(["umount", path], check=True)


@contextlib.contextmanager
def read_only(folder: str) -> Iterator[None]:
    """``folder`` read-only for every process, root included (a read-only bind mount onto itself)."""
    _mount("--bind", folder, folder)
    try:
        subprocess.run(["mount", "-o", "remount,ro,bind", folder], check=True)
        with pytest.raises(OSError) as probe:
            Path(folder, "probe").write_text("x")
        assert probe.value.errno == errno.EROFS
        yield
    finally:
        _umount(folder)


def _committed(pipeline: LocalPipeline) -> dict[str, bytes]:
    """The committed files of the sink and state (their logs and data), without the lease's heartbeat."""
    return {
        k: v
        for k, v in {
            **tree(pipeline.sink_path),
            **{f"state/{k}": v for k, v in tree(pipeline.state).items()},
        }.items()
        if "/_delta_log/" in f"/{k}" and not k.startswith("state/lease/")
    }


@pytest.mark.parametrize("which", ["state", "sink"])
def test_a_read_only_state_or_sink_folder_is_a_state_error_naming_it_and_loses_nothing(tmp_path, which):
    pipeline = LocalPipeline(tmp_path)
    pipeline.write_input(files=2, lines=30)
    pipeline.run(2)
    folder = pipeline.state if which == "state" else pipeline.sink_path
    before = _committed(pipeline)
    with read_only(folder), pytest.raises(StateError) as err:
        pipeline.run(1)  # before: a raw DeltaError (state) or OSError (sink) traceback
    message = str(err.value)
    assert message.startswith("[STATE_ERROR] cannot write to ") and "Read-only file system" in message
    assert folder in message
    assert {k: v for k, v in _committed(pipeline).items() if k in before} == before  # nothing committed lost
    pipeline.run()  # the fault gone: the rest of the input, exactly once
    assert_sink_is_input(pipeline)


def test_a_full_disk_is_a_state_error_naming_the_path_and_loses_nothing(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    _mount("-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk))
    try:
        pipeline = LocalPipeline(disk)
        pipeline.write_input(files=2, lines=30)
        pipeline.run(2)
        before = _committed(pipeline)
        filler = disk / "filler"
        with open(filler, "wb", buffering=0) as out, contextlib.suppress(OSError):
            while True:  # the disk full to the last byte
                out.write(b"\0" * 4096)
        with pytest.raises(StateError) as err:
            pipeline.run(1)
        message = str(err.value)
        assert message.startswith("[STATE_ERROR] cannot write to ") and "No space left on device" in message
        assert str(disk) in message
        assert {k: v for k, v in _committed(pipeline).items() if k in before} == before
        os.remove(filler)
        pipeline.run()
        assert_sink_is_input(pipeline)
    finally:
        _umount(str(disk))
