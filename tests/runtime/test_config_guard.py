"""Config that cannot hurt (issue 19): placement of the locations, the parallelism limit, and
files that are refused before anything expands them (duplicate keys, deep nesting, alias bombs).

Each case is written from the issue's steps, through the loader and through ``splitkeeper
status --config`` (rc and message); nothing here starts Spark.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from splitkeeper.cli import main
from splitkeeper.errors import ConfigError
from splitkeeper.runtime.config import load_config
from splitkeeper.runtime.regions import MAX_PARALLELISM

HEAD = "name: orders\n"
SOURCE = "source: {kind: files, path: incoming}\n"
PLACES = "state: {path: state}\nsink: {path: sink}\n"


def write(tmp_path: Path, text: str, name: str = "p.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def refused(path: Path, **kwargs: Any) -> str:
    with pytest.raises(ConfigError) as info:
        load_config(path, **kwargs)
    return str(info.value)


def status_rc(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    rc = main(["status", "--config", str(path)])
    return rc, capsys.readouterr().err


# --------------------------------------------------------------------------- parallelism


def test_parallelism_above_the_limit_is_refused_with_how_to_fix(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = write(tmp_path, HEAD + "parallelism: 10000\n" + SOURCE + PLACES)
    message = refused(path)
    assert message.startswith(
        f"[CONFIG_ERROR] parallelism=10000 is not allowed: an integer from 1 to {MAX_PARALLELISM}; "
    )
    assert f"use at most {MAX_PARALLELISM}" in message and str(path) in message
    rc, err = status_rc(path, capsys)
    assert rc == 2 and "parallelism=10000 is not allowed" in err
    write(tmp_path, HEAD + f"parallelism: {MAX_PARALLELISM}\n" + SOURCE + PLACES)
    assert load_config(path).parallelism == MAX_PARALLELISM


def test_recover_refuses_a_rescale_above_the_limit_before_opening_anything(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from splitkeeper.app import services

    def opened(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the pipeline was opened")

    monkeypatch.setattr(services, "_pipeline", opened)
    path = write(tmp_path, HEAD + SOURCE + PLACES)
    rc = main(["recover", "--config", str(path), "--parallelism", "10000", "--dry-run"])
    assert rc == 2
    assert (
        f"--parallelism=10000 is not allowed: an integer from 1 to {MAX_PARALLELISM}"
        in capsys.readouterr().err
    )
    with pytest.raises(
        Exception, match=f"parallelism=10000 is not allowed: an integer from 1 to {MAX_PARALLELISM}"
    ):
        services.recover(load_config(path), parallelism=10000, dry_run=True)
