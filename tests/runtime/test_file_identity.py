"""Files that change after discovery (issue 19, protocol rule 1.9), end to end on real files.

Each test follows a step of the issue with a real pipeline (Spark, the Delta state and
sink): a first run reads part of the input, the files change the way drops written by
other teams' jobs change (rewritten in place with ``os.replace``, appended to, moved into
an archive folder, a broken symlink), a second run (a restarted driver) goes on. After
each, the sink is compared with the input line by line, and the restart checks run.
"""

from __future__ import annotations

import os
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from splitkeeper.app import services
from splitkeeper.config.settings import config_from_mapping
from splitkeeper.errors import SourceError

from .helpers import assert_sink_equals_source, pipeline_mapping, run_pipeline, sink_rows


def lines(prefix: str, count: int) -> list[str]:
    return [f"{prefix}-{i:04d} payload {'x' * (i % 7)}" for i in range(count)]


def write(path: Path, text_lines: list[str], mode: str = "w") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, mode, encoding="utf-8") as f:
        f.write("".join(line + "\n" for line in text_lines))


def config_for(root: Path, *, policy: str | None = None, parallelism: int = 1, **checkpoint: Any) -> Any:
    mapping = pipeline_mapping(root, "drops", root / "in", parallelism=parallelism, epoch_records=40)
    if policy is not None:
        mapping["source"]["on_file_change"] = policy
    mapping["checkpoint"].update(checkpoint)
    return config_from_mapping(mapping)


def values(spark: Any, root: Path) -> dict[str, list[str]]:
    """Per split id, the sink's values (its lines' bytes, as text) in offset order."""
    out: dict[str, list[str]] = {}
    for row in sorted(sink_rows(root / "sink"), key=lambda r: (r.split_id, r.offset)):
        out.setdefault(row.split_id, []).append((row.value or b"").decode("utf-8"))
    return out


def shuffle_in_place(path: Path) -> list[str]:
    """Same lines, same byte size, another order, written to a temp file and os.replace'd (mtime kept)."""
    before = path.stat()
    text = path.read_text(encoding="utf-8").splitlines()
    random.Random(7).shuffle(text)
    tmp = path.with_name("." + path.name + ".tmp")
    write(tmp, text)
    os.replace(tmp, path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert path.stat().st_size == before.st_size
    return text


def test_same_size_rewrite_of_a_partly_read_file_fails_by_default(spark: Any, tmp_path: Path) -> None:
    write(tmp_path / "in" / "a.txt", lines("a", 120))
    config = config_for(tmp_path)
    run_pipeline(config, spark, epochs=1)
    before = values(spark, tmp_path)
    assert 0 < len(before["a.txt"]) < 120
    shuffle_in_place(tmp_path / "in" / "a.txt")
    with pytest.raises(SourceError, match=r"split 'a.txt': file .*a.txt was rewritten .*new_version") as err:
        run_pipeline(config, spark)
    assert err.value.code == "SOURCE_ERROR"
    assert values(spark, tmp_path) == before  # nothing committed, no mix


def test_same_size_rewrite_under_append_fails_too(spark: Any, tmp_path: Path) -> None:
    write(tmp_path / "in" / "a.txt", lines("a", 120))
    config = config_for(tmp_path, policy="append")
    run_pipeline(config, spark, epochs=1)
    before = values(spark, tmp_path)
    shuffle_in_place(tmp_path / "in" / "a.txt")
    with pytest.raises(SourceError, match="source.on_file_change is append"):
        run_pipeline(config, spark)
    assert values(spark, tmp_path) == before


def test_same_size_rewrite_under_new_version_reads_the_new_file_as_a_new_split(
    spark: Any, tmp_path: Path
) -> None:
    original = lines("a", 120)
    write(tmp_path / "in" / "a.txt", original)
    write(tmp_path / "in" / "b.txt", lines("b", 30))
    config = config_for(tmp_path, policy="new_version")
    run_pipeline(config, spark, epochs=1)
    read_before = values(spark, tmp_path)["a.txt"]
    assert 0 < len(read_before) < 120
    shuffled = shuffle_in_place(tmp_path / "in" / "a.txt")
    summary = run_pipeline(config, spark)
    assert summary.finished
    got = values(spark, tmp_path)
    (version,) = [sid for sid in got if sid.startswith("a.txt#v")]
    assert got["a.txt"] == original[: len(read_before)]  # the old version ended where it stood
    assert got[version] == shuffled  # the new version, whole, in file order
    assert got["b.txt"] == lines("b", 30)
    decisions = Counter(r["decision"] for r in _audit(config) if r["split_id"] in ("a.txt", version))
    assert decisions["replaced"] == 1
    services.validate(config)  # the restart checks pass


def test_appends_to_a_finished_and_a_partly_read_file_under_append(spark: Any, tmp_path: Path) -> None:
    write(tmp_path / "in" / "small.txt", lines("s", 10))
    write(tmp_path / "in" / "big.txt", lines("b", 150))
    config = config_for(tmp_path, policy="append")
    run_pipeline(config, spark, epochs=1)
    got = values(spark, tmp_path)
    assert len(got["small.txt"]) == 10 and len(got["big.txt"]) < 150  # one finished, one partly read
    write(tmp_path / "in" / "small.txt", lines("s-late", 50), mode="a")
    write(tmp_path / "in" / "big.txt", lines("b-late", 100), mode="a")
    summary = run_pipeline(config, spark)
    assert summary.finished
    assert_sink_equals_source(spark, tmp_path / "sink", tmp_path / "in")
    assert {r["split_id"] for r in _audit(config) if r["decision"] == "extended"} == {"small.txt", "big.txt"}
    services.validate(config)


def test_a_last_line_without_its_newline_is_read_once_an_append_ends_it(spark: Any, tmp_path: Path) -> None:
    """Issue 36 item 9: under append, a last line without its newline was read as a record (a bad
    one: a dead letter), and the rest of it, appended later, fell before the new range's first
    line start: in neither table, found only by validate (offset_missing). It is read once ended."""
    from splitkeeper.sinks.delta.read import read_dead_letters, read_sink

    (tmp_path / "in").mkdir()
    path = tmp_path / "in" / "events.jsonl"
    path.write_bytes(b'{"id": 1, "name": "a"}\n{"id": 2, "name": "b"}\n{"id": 3, "name": "par')
    mapping = pipeline_mapping(tmp_path, "grow", tmp_path / "in", parallelism=1, epoch_records=40)
    mapping["source"]["on_file_change"] = "append"
    mapping["decode"] = {"kind": "json", "schema": "id BIGINT, name STRING"}
    mapping["errors"] = {
        "tolerance": "all",
        "dead_letter": {"path": str(tmp_path / "dead")},
        "max_bad_ratio": 1.0,
    }
    config = config_from_mapping(mapping)

    def rows() -> list[tuple[int, int, str]]:
        table = read_sink(tmp_path / "sink", ["offset", "id", "name"]).to_pylist()
        return sorted((r["offset"], r["id"], r["name"]) for r in table)

    assert run_pipeline(config, spark).finished
    assert rows() == [(0, 1, "a"), (23, 2, "b")]  # the unended line is not read yet
    with open(path, "ab") as f:
        f.write(b'tial"}\n{"id": 4}\n')
    assert run_pipeline(config, spark).finished
    assert rows() == [(0, 1, "a"), (23, 2, "b"), (46, 3, "partial"), (75, 4, None)]
    assert not os.path.exists(tmp_path / "dead") or read_dead_letters(tmp_path / "dead").num_rows == 0
    services.validate(config)  # no offset_missing: the offsets run on from 0 to the file's end


def test_an_append_to_a_finished_file_fails_by_default_asking_for_append(spark: Any, tmp_path: Path) -> None:
    write(tmp_path / "in" / "small.txt", lines("s", 10))
    config = config_for(tmp_path)
    assert run_pipeline(config, spark).finished
    before = values(spark, tmp_path)
    write(tmp_path / "in" / "small.txt", lines("s-late", 50), mode="a")
    with pytest.raises(SourceError, match=r"small.txt grew from \d+ to \d+ bytes.*on_file_change: append"):
        run_pipeline(config, spark)
    assert values(spark, tmp_path) == before


def test_a_finished_file_moved_into_a_subfolder_is_not_read_again(spark: Any, tmp_path: Path) -> None:
    write(tmp_path / "in" / "a.txt", lines("a", 40))
    write(tmp_path / "in" / "b.txt", lines("b", 40))
    config = config_for(tmp_path)
    assert run_pipeline(config, spark).finished
    (tmp_path / "in" / "archive").mkdir()
    os.rename(tmp_path / "in" / "a.txt", tmp_path / "in" / "archive" / "a.txt")
    summary = run_pipeline(config, spark)
    assert summary.committed_records == 0
    got = values(spark, tmp_path)
    assert got == {"a.txt": lines("a", 40), "b.txt": lines("b", 40)}  # no duplicate under the new path
    moved = [r for r in _audit(config) if r["decision"] == "moved"]
    assert [r["split_id"] for r in moved] == ["a.txt"] and "archive/a.txt" in moved[0]["detail"]
    services.validate(config)  # the checks stay exact: archive/a.txt's records begin at its end


def test_a_symlink_loop_a_dangling_link_and_a_fifo_beside_good_files(
    spark: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    inp = tmp_path / "in"
    for name in ("a", "b", "c"):
        write(inp / f"{name}.txt", lines(name, 30))
    os.symlink("loop.txt", inp / "loop.txt")  # a symlink to itself
    os.symlink("nowhere.txt", inp / "dangling.txt")
    os.mkfifo(inp / "pipe.txt")  # never opened: opening a FIFO blocks
    config = config_for(tmp_path, parallelism=2, on_split_failure="quarantine", quarantine_after=1)
    summary = run_pipeline(config, spark, epochs=4)
    got = values(spark, tmp_path)
    assert {k: got.get(k) for k in ("a.txt", "b.txt", "c.txt")} == {
        n: lines(n[0], 30) for n in ("a.txt", "b.txt", "c.txt")
    }
    assert set(got) == {"a.txt", "b.txt", "c.txt"}
    assert set(summary.quarantined) == {"loop.txt", "dangling.txt"}
    # the audit's detail is clipped to core.failures.MESSAGE_CHARS around its middle, so what survives
    # of a long tmp path depends on its length: the whole reason is in the region's failure log
    quarantined = {r["split_id"]: r["detail"] for r in _audit(config) if r["decision"] == "quarantined"}
    assert set(quarantined) == {"loop.txt", "dangling.txt"}
    assert all(d.startswith("reads failed") and "[SPLIT_READ_FAILED]" in d for d in quarantined.values())
    failed = [
        r.getMessage() for r in caplog.records if "region" in r.getMessage() and "failed:" in r.getMessage()
    ]
    loop = [m for m in failed if f"file {inp / 'loop.txt'} cannot be opened" in m]
    assert loop and all("Too many levels of symbolic links" in m and "[SOURCE_ERROR]" in m for m in loop)
    assert any(f"file {inp / 'dangling.txt'} does not exist any more" in m for m in failed)


def _audit(config: Any) -> list[dict[str, Any]]:
    from splitkeeper.delta.checkpoints import DeltaStateStore
    from splitkeeper.sources import build_source

    store = DeltaStateStore(
        config.state.path, config.name, build_source(config.source).fingerprint(), read_only=True
    )
    return store.history.tables.read("audit").to_pylist()


def test_the_restart_checks_compare_a_finished_files_committed_values_with_the_file(
    spark: Any, tmp_path: Path
) -> None:
    from deltalake import DeltaTable

    from splitkeeper.errors import InvariantViolation

    for name in ("a", "b"):
        write(tmp_path / "in" / f"{name}.txt", lines(name, 30))
    config = config_for(tmp_path)
    assert run_pipeline(config, spark).finished
    services.validate(config, content=True)
    # a mixed read as the issue saw it: every (split_id, offset) pair still unique, one value wrong
    DeltaTable(str(tmp_path / "sink")).update(
        predicate="split_id = 'b.txt' AND value = arrow_cast('b-0007 payload ', 'Binary')",
        updates={"value": "arrow_cast('b-0008 payload x', 'Binary')"},
    )
    services.validate(config)  # without --content the pairs are all the checks see: it passes
    with pytest.raises(InvariantViolation, match="content_mismatch") as err:
        services.validate(config, content=True)
    assert err.value.params["split_ids"] == ("b.txt",)


@pytest.mark.parametrize("discovery", ["full", "incremental"])
def test_an_append_to_a_finished_file_is_read_at_the_next_recheck_of_a_running_pipeline(
    spark: Any, tmp_path: Path, discovery: str
) -> None:
    """Issue 38 item 3: one running driver (no restart) checks finished files every
    source.recheck_finished_every epochs; new files are read at the next epoch meanwhile, and the
    append is read once, from where the file ended, when the recheck sees it."""
    write(tmp_path / "in" / "a.txt", lines("a", 10))
    mapping = pipeline_mapping(tmp_path, "recheck", tmp_path / "in", parallelism=1, epoch_records=1000)
    mapping["source"].update(on_file_change="append", recheck_finished_every=2, discovery=discovery)
    mapping["checkpoint"]["region_timeout_s"] = 300  # every epoch must complete: its records are counted
    config = config_from_mapping(mapping)
    with services.leased_pipeline(config, spark, metrics=False) as pipeline:
        pipeline.open()
        assert pipeline.run_epoch().committed_records == 10  # epoch 1 rechecks (the first after open)
        write(tmp_path / "in" / "a.txt", lines("a-late", 5), mode="a")
        write(tmp_path / "in" / "b.txt", lines("b", 3))
        assert pipeline.run_epoch().committed_records == 3  # epoch 2: the new file, not the append
        assert pipeline.run_epoch().committed_records == 5  # epoch 3 rechecks: the append
        assert pipeline.run_epoch().committed_records == 0
    assert_sink_equals_source(spark, tmp_path / "sink", tmp_path / "in")
    assert [r["split_id"] for r in _audit(config) if r["decision"] == "extended"] == ["a.txt"]
