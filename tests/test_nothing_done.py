"""Commands that find nothing to act on say what they found and exit non-zero (issue 19).

``recover`` with no state, or with a state that has no checkpoint yet, used to start fresh and
exit 0; ``recover --epochs 0`` printed an assignment and applied nothing. Each is now refused
before anything is written (no lease, no table, no Spark).
"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import yaml

from splitkeeper.cli import main


def _config(tmp_path: Path) -> Path:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("one\ntwo\n")
    mapping = {
        "name": "orders",
        "source": {"kind": "files", "path": str(tmp_path / "in")},
        "state": {"path": str(tmp_path / "state")},
        "sink": {"path": str(tmp_path / "sink")},
    }
    path = tmp_path / "orders.yaml"
    path.write_text(yaml.safe_dump(mapping))
    return path


def _cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_recover_without_a_state_folder_says_there_is_nothing_to_recover(tmp_path: Path) -> None:
    config = _config(tmp_path)
    code, out, err = _cli("recover", "--config", str(config))
    assert code == 2 and out == ""
    assert err.startswith(
        f"splitkeeper recover: [STATE_ERROR] pipeline 'orders' has no state folder at {tmp_path / 'state'} "
        f"(state.path in {config}): there is nothing to recover. Check the path for a typo"
    ), err
    assert not (tmp_path / "state").exists() and not (tmp_path / "sink").exists()


def test_recover_of_a_pipeline_without_a_checkpoint_is_refused(tmp_path: Path) -> None:
    config = _config(tmp_path)
    (tmp_path / "state").mkdir()
    code, out, err = _cli("recover", "--config", str(config))
    assert code == 2 and out == ""
    assert "[CHECKPOINT_ERROR] pipeline 'orders' has no completed checkpoint to recover from" in err
    assert "nothing was done. 'splitkeeper run' starts the pipeline" in err
    # nothing written but the lease (taken first, so that a run starting meanwhile refuses it), released
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["lease"] and not (tmp_path / "sink").exists()


def test_recover_with_zero_epochs_is_refused_because_it_would_apply_nothing(tmp_path: Path) -> None:
    config = _config(tmp_path)
    code, out, err = _cli("recover", "--config", str(config), "--epochs", "0")
    assert code == 2 and out == ""
    assert "[INVALID_PARAMETER] epochs=0 is not allowed: an integer >= 1, or 0 with --dry-run" in err
    assert "with 0 epochs nothing would be applied" in err
    assert not (tmp_path / "state").exists()
