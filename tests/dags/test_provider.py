"""splitkeeper as an Airflow provider: its metadata, the hook's connections, the operators' arguments
and the DAGs of a folder of pipeline files. No Spark here: the real runs through these operators
are tests/dags/test_dags.py's."""

from __future__ import annotations

import importlib
import json
import logging
import os
import subprocess
import sys

import pytest

from splitkeeper.errors import ConfigError, InvalidParameterError

pytestmark = [pytest.mark.airflow]

KAFKA_EXTRA = {
    "bootstrap.servers": "broker-1:9092,broker-2:9092",
    "group.id": "from-connection",
    "security.protocol": "SASL_SSL",
    "sasl.mechanisms": "PLAIN",
    "sasl.username": "ingest",
    "sasl.password": "s3cret-from-connection",
    "client.id": "from-connection",
}


def _class(dotted: str):
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


def test_provider_info_is_valid_for_airflow_and_names_what_exists():
    from airflow.providers_manager import _create_provider_info_schema_validator

    import splitkeeper
    from splitkeeper.airflow import get_provider_info
    from splitkeeper.airflow.hooks import SplitkeeperHook
    from splitkeeper.airflow.operators import (
        SplitkeeperIngestOperator,
        SplitkeeperMaintainOperator,
        SplitkeeperRecoverOperator,
        SplitkeeperReportOperator,
        SplitkeeperValidateOperator,
    )

    info = get_provider_info()
    _create_provider_info_schema_validator().validate(info)  # what the providers manager checks
    assert info["package-name"] == "splitkeeper" and info["versions"] == [splitkeeper.__version__]
    sections = ("hooks", "operators", "triggers")
    modules = {m for section in sections for e in info[section] for m in e["python-modules"]}
    assert modules == {
        "splitkeeper.airflow.hooks",
        "splitkeeper.airflow.operators",
        "splitkeeper.airflow.triggers",
    }
    triggers = importlib.import_module("splitkeeper.airflow.triggers")
    from airflow.triggers.base import BaseEventTrigger

    assert issubclass(triggers.SplitkeeperNewDataTrigger, BaseEventTrigger)  # an AssetWatcher takes it
    operators = importlib.import_module("splitkeeper.airflow.operators")
    exported = {getattr(operators, n) for n in dir(operators) if n.startswith("Splitkeeper")}
    assert exported == {
        SplitkeeperIngestOperator,
        SplitkeeperRecoverOperator,
        SplitkeeperValidateOperator,
        SplitkeeperReportOperator,
        SplitkeeperMaintainOperator,
    }
    for cls in exported:  # templated, documented
        assert "pipeline_config" in cls.template_fields and ":param pipeline_config:" in (cls.__doc__ or "")
        for field in cls.template_fields:
            assert f":param {field}:" in cls.__doc__ or field == "plan_only", (cls, field)
    assert SplitkeeperHook.default_conn_name == "spark_default"
    for link in info["extra-links"]:
        assert _class(link).name
    assert [_class(p["plugin-class"]).name for p in info["plugins"]] == ["splitkeeper"]


def _kafka_pipeline(tmp_path, source_extra: str = "") -> str:
    path = tmp_path / "orders.yaml"
    path.write_text(
        f"""
name: orders
source: {{kind: kafka, topics: [orders], connection: kafka_default{source_extra}}}
state: {{path: s3a://bucket/state, connection: aws_default}}
sink: {{path: s3a://bucket/sink, connection: aws_default}}
staging: {{path: staging}}
""",
        encoding="utf-8",
    )
    return str(path)


def test_the_hook_reads_the_connections_a_pipeline_file_names(tmp_path, monkeypatch):
    from splitkeeper.airflow.hooks import SplitkeeperHook
    from splitkeeper.config.settings import load_config

    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_DEFAULT", json.dumps({"conn_type": "kafka", "extra": KAFKA_EXTRA}))
    aws = {"endpoint_url": "http://object-store:9000", "region_name": "eu-west-1"}
    monkeypatch.setenv(
        "AIRFLOW_CONN_AWS_DEFAULT",
        json.dumps({"conn_type": "aws", "login": "AKIA-TEST", "password": "secret-key", "extra": aws}),
    )
    path = _kafka_pipeline(tmp_path)
    with pytest.raises(ConfigError) as err:  # outside Airflow the file alone has no servers
        load_config(path)
    assert "source.connection 'kafka_default' gives them only inside Airflow" in str(err.value)

    hook = SplitkeeperHook(path)
    config = hook.load_config()
    assert config.source.bootstrap_servers == "broker-1:9092,broker-2:9092"
    assert config.source.group_id == "from-connection"
    client = dict(config.source.client.items)
    assert client["security.protocol"] == "SASL_SSL" and client["sasl.password"] == "s3cret-from-connection"
    assert "s3cret" not in json.dumps(config.to_dict())  # the secret is redacted wherever it is shown
    assert config.store_connections == ("aws_default",)
    assert hook.environment(config) == {
        "AWS_ACCESS_KEY_ID": "AKIA-TEST",
        "AWS_SECRET_ACCESS_KEY": "secret-key",
        "AWS_ENDPOINT_URL": "http://object-store:9000",
        "AWS_REGION": "eu-west-1",
    }
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    hook.open()

    assert os.environ["AWS_ACCESS_KEY_ID"] == "AKIA-TEST"  # this task's process reaches the store

    # a job spark-submit starts runs outside Airflow: the task hands it what the connections
    # give through its environment (no secret on the command line), and the job's load_config
    # reads them without any Airflow connection defined
    job_env = hook.job_environment(config)
    assert {k: job_env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_REGION")} == {
        "AWS_ACCESS_KEY_ID": "AKIA-TEST",
        "AWS_REGION": "eu-west-1",
    }
    outside = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    read = (
        "import json, sys; from splitkeeper.config.settings import load_config\n"
        "c = load_config(sys.argv[1])\n"
        "print(json.dumps([c.source.bootstrap_servers, c.source.group_id,"
        " dict(c.source.client.items)['sasl.password']]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", read, str(path)], env={**outside, **job_env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        "broker-1:9092,broker-2:9092",
        "from-connection",
        "s3cret-from-connection",
    ]
    with pytest.raises(ConfigError, match=r"\$SPLITKEEPER_CONNECTIONS must be a JSON object") as err:
        load_config(path, env={"SPLITKEEPER_CONNECTIONS": '{"kafka_default": "s3cret"}'})
    assert "s3cret" not in str(err.value)

    # the file's own keys win over the connection's
    own = _kafka_pipeline(
        tmp_path, ", bootstrap_servers: 'mine:9093', group_id: own, client: {client.id: own}"
    )
    config = SplitkeeperHook(own).load_config()
    assert (config.source.bootstrap_servers, config.source.group_id) == ("mine:9093", "own")
    assert dict(config.source.client.items)["client.id"] == "own"


def test_the_event_topic_of_a_files_source_takes_its_servers_from_a_kafka_connection(tmp_path, monkeypatch):
    """``source.notifications.connection``: a ``kafka`` connection fills the event topic's servers
    and client settings inside Airflow (and in the job spark-submit starts, through its
    environment); outside Airflow the file alone is refused naming that key."""
    from splitkeeper.airflow.hooks import SplitkeeperHook
    from splitkeeper.config.settings import load_config

    monkeypatch.setenv("AIRFLOW_CONN_KAFKA_EVENTS", json.dumps({"conn_type": "kafka", "extra": KAFKA_EXTRA}))
    path = tmp_path / "drops.yaml"
    path.write_text(
        """
name: drops
source:
  kind: files
  path: s3://drops/in
  discovery: notifications
  notifications: {topic: drops-events, connection: kafka_events, client: {client.id: mine}}
state: {path: state}
sink: {path: sink}
""",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "source.notifications.bootstrap_servers" in str(err.value)
    assert "source.notifications.connection 'kafka_events' gives them only inside Airflow" in str(err.value)

    hook = SplitkeeperHook(str(path))
    config = hook.load_config()
    events = config.source.notifications
    assert events.servers == "broker-1:9092,broker-2:9092"
    settings = events.client_settings
    assert (
        settings["sasl.password"] == "s3cret-from-connection" and settings["security.protocol"] == "SASL_SSL"
    )
    assert settings["client.id"] == "mine"  # the file's own setting wins
    assert "group.id" not in settings  # the event topic is read by offsets, no group
    assert "s3cret" not in json.dumps(config.to_dict())

    job_env = hook.job_environment(config)
    outside = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW_CONN_")}
    read = (
        "import json, sys; from splitkeeper.config.settings import load_config\n"
        "n = load_config(sys.argv[1]).source.notifications\n"
        "print(json.dumps([n.servers, n.client_settings['sasl.username']]))"
    )
    done = subprocess.run(
        [sys.executable, "-c", read, str(path)], env={**outside, **job_env}, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == ["broker-1:9092,broker-2:9092", "ingest"]


def test_operators_turn_rendered_templates_into_their_arguments():
    from splitkeeper.airflow import tasks
    from splitkeeper.airflow.operators import (
        SplitkeeperIngestOperator,
        SplitkeeperMaintainOperator,
        SplitkeeperRecoverOperator,
        _flag,
        _json,
        _optional,
    )

    ingest = SplitkeeperIngestOperator(task_id="i", pipeline_config="p.yaml", faults='["fail:1@2"]')
    assert ingest.template_fields[0] == "pipeline_config"
    assert _json("faults", '["fail:1@2"]', list) == ["fail:1@2"] and _json("pipeline", "{}", dict) == {}
    assert (_flag("continuous", "False"), _flag("continuous", "True"), _optional("epochs", "5", int)) == (
        False,
        True,
        5,
    )
    assert _optional("history_hours", "None", float) is None  # a null Param renders as 'None'
    with pytest.raises(InvalidParameterError) as err:
        _flag("until_caught_up", "perhaps")
    assert "until_caught_up" in str(err.value) and "true or false" in str(err.value)
    with pytest.raises(InvalidParameterError):
        _optional("epochs", "three", int)
    assert SplitkeeperMaintainOperator(task_id="m", history_hours="12").history_hours == "12"

    recover = SplitkeeperRecoverOperator(
        task_id="r", checkpoint_id="4", rewind="True", reason="bad deploy", dry_run="False", release="[]"
    )
    params = recover.params_of_run()
    assert tasks.check_recovery_params(params) == {  # the recovery DAG's own check accepts them
        "checkpoint_id": 4,
        "mode": "auto",
        "parallelism": None,
        "dry_run": False,
        "redistribution": None,
        "release": [],
        "rewind": True,
        "confirm": False,
        "reason": "bad deploy",
        "reset_split": None,
        "reset_to": None,
        "readers": [],
        "reader_mode": None,
    }
    partial = SplitkeeperRecoverOperator(task_id="p", readers="[2, 5]").params_of_run()
    chosen = tasks.check_recovery_params(partial)
    assert (chosen["mode"], chosen["readers"]) == ("partial", [2, 5])  # auto with readers is partial
    with pytest.raises(InvalidParameterError, match="none with mode 'global'"):
        tasks.check_recovery_params({**partial, "mode": "global"})
    with pytest.raises(InvalidParameterError, match="one or more reader ids with mode 'partial'"):
        tasks.check_recovery_params({"mode": "partial"})
    with pytest.raises(InvalidParameterError) as err:  # reset_split without reset_to: named
        tasks.check_recovery_params(SplitkeeperRecoverOperator(task_id="x", reset_split="0").params_of_run())
    assert "reset_to" in str(err.value)


def test_on_kill_of_a_bounded_task_only_logs(caplog):
    from splitkeeper.airflow.operators import SplitkeeperIngestOperator, SplitkeeperValidateOperator

    with caplog.at_level(logging.INFO, logger="splitkeeper.airflow"):
        SplitkeeperValidateOperator(task_id="v", pipeline_config="/nowhere.yaml").on_kill()
        SplitkeeperIngestOperator(task_id="i", pipeline_config="/nowhere.yaml", continuous="False").on_kill()
    assert [r.getMessage() for r in caplog.records] == [
        "v cancelled: it holds the pipeline's lease only for its one call",
        "i cancelled: it holds the pipeline's lease only for its one call",
    ]


def _files_pipeline(folder, name: str, schedule: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{name}.yaml").write_text(
        f"""
name: {name}
source: {{kind: files, path: in}}
state: {{path: state}}
sink: {{path: sink}}
{schedule}
""",
        encoding="utf-8",
    )


def _exec_dag_file(path):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"dagfile_{path.stem}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_one_call_gives_every_pipeline_file_its_dags_with_its_schedule(tmp_path, monkeypatch):
    from splitkeeper.airflow.operators import SplitkeeperIngestOperator, SplitkeeperMaintainOperator

    monkeypatch.delenv("SPLITKEEPER_PIPELINE_CONFIG", raising=False)
    monkeypatch.delenv("SPLITKEEPER_SPARK_MASTER", raising=False)
    _files_pipeline(tmp_path / "pipelines", "hourly", "airflow: {schedule: '@hourly'}")
    _files_pipeline(tmp_path / "pipelines", "manual", "airflow: {schedule: null}")
    _files_pipeline(tmp_path / "pipelines", "default", "")
    dag_file = tmp_path / "my_dags.py"
    dag_file.write_text(
        'from splitkeeper.airflow import splitkeeper_dags\n\nsplitkeeper_dags("pipelines/*.yaml")\n'
    )
    module = _exec_dag_file(dag_file)  # as the DagBag imports it, from any working directory
    ids = sorted(k for k in vars(module) if k.startswith("splitkeeper_") and "__" in k)
    assert ids == sorted(
        f"splitkeeper_{kind}__{name}"
        for kind in ("ingest", "recover", "rescale", "maintain")
        for name in ("hourly", "manual", "default")
    )
    schedules = {
        n: getattr(module, f"splitkeeper_ingest__{n}").timetable.summary for n in ("hourly", "manual")
    }
    assert schedules == {"hourly": "0 * * * *", "manual": "None"}  # Airflow shows @hourly as its cron
    assert module.splitkeeper_ingest__default.timetable.summary == "*/30 * * * *"
    run = module.splitkeeper_ingest__hourly.get_task("run_epochs")
    assert type(run) is SplitkeeperIngestOperator and run.pool == "splitkeeper-hourly"
    assert run.pipeline_config == str(tmp_path / "pipelines" / "hourly.yaml")
    maintain = module.splitkeeper_maintain__manual.get_task("maintain")
    assert type(maintain) is SplitkeeperMaintainOperator
    assert maintain.pipeline_config == str(tmp_path / "pipelines" / "manual.yaml")
    assert module.splitkeeper_recover__manual.schedule is None

    dag_file.write_text(
        'from splitkeeper.airflow import splitkeeper_dags\n\nsplitkeeper_dags("nothing/*.yml")\n'
    )
    with pytest.raises(InvalidParameterError) as err:  # an import error the DAG list shows, naming it
        _exec_dag_file(dag_file)
    assert "nothing/*.yml" in str(err.value) and str(tmp_path) in str(err.value)


def test_on_new_data_schedules_the_ingest_on_an_asset_watched_by_the_new_data_trigger(tmp_path, monkeypatch):
    from airflow.serialization.serialized_objects import SerializedDAG
    from airflow.timetables.simple import AssetTriggeredTimetable

    from splitkeeper.airflow.triggers import SplitkeeperNewDataTrigger

    monkeypatch.delenv("SPLITKEEPER_PIPELINE_CONFIG", raising=False)
    monkeypatch.delenv("SPLITKEEPER_SPARK_MASTER", raising=False)
    _files_pipeline(tmp_path / "pipelines", "events", "airflow: {schedule: on_new_data, poll_interval_s: 5}")
    dag_file = tmp_path / "my_dags.py"
    dag_file.write_text(
        'from splitkeeper.airflow import splitkeeper_dags\n\nsplitkeeper_dags("pipelines/*.yaml")\n'
    )
    dag = _exec_dag_file(dag_file).splitkeeper_ingest
    assert isinstance(dag.timetable, AssetTriggeredTimetable)
    ((_key, asset),) = list(dag.timetable.asset_condition.iter_assets())
    assert asset.name == "splitkeeper-events-new-data" and asset.uri == "splitkeeper://events/new-data"
    (watcher,) = asset.watchers
    trigger = watcher.trigger
    assert isinstance(trigger, SplitkeeperNewDataTrigger)
    path = str(tmp_path / "pipelines" / "events.yaml")
    assert trigger.serialize() == (
        "splitkeeper.airflow.triggers.SplitkeeperNewDataTrigger",
        {"pipeline_config": path, "poll_interval": 5.0, "dag_id": "splitkeeper_ingest"},
    )
    # the scheduler stores the watcher as the triggerer will load it: by its class path
    serialized = json.dumps(SerializedDAG.to_dict(dag))
    assert "splitkeeper.airflow.triggers.SplitkeeperNewDataTrigger" in serialized and path in serialized

    _files_pipeline(tmp_path / "bad", "bad", "airflow: {schedule: on_new_dat}")
    with pytest.raises(ConfigError) as err:
        from splitkeeper.config.settings import load_config

        load_config(str(tmp_path / "bad" / "bad.yaml"))
    assert "airflow.schedule='on_new_dat' is not allowed" in str(err.value) and "on_new_data (when" in str(
        err.value
    )


def test_the_new_data_trigger_fires_only_when_a_run_would_read_and_starts_no_spark(tmp_path, monkeypatch):
    """A real trigger run: its async ``run()`` in an event loop, against a real files source and the
    pipeline's real Delta state. No Spark anywhere: the first run of the empty folder commits its
    global checkpoint with no region task (every region is idle: the driver acknowledges it)."""
    import asyncio

    from splitkeeper.airflow.triggers import SplitkeeperNewDataTrigger
    from splitkeeper.app import assembly, services, validate
    from splitkeeper.config.settings import load_config

    def no_spark() -> None:
        raise AssertionError("Spark was started")

    for module in (assembly, validate):  # every use case that could start Spark
        monkeypatch.setattr(module, "spark_session", no_spark)
    monkeypatch.chdir(tmp_path)
    _files_pipeline(
        tmp_path, "watched", "parallelism: 2\nairflow: {schedule: on_new_data, poll_interval_s: 1}"
    )
    (tmp_path / "in").mkdir()
    path = str(tmp_path / "watched.yaml")
    config = load_config(path)
    trigger = SplitkeeperNewDataTrigger(path, poll_interval=0.05)

    async def first_event(within_s: float):
        events = trigger.run()
        try:
            return await asyncio.wait_for(anext(events), within_s)
        except TimeoutError:
            return None
        finally:
            await events.aclose()

    never_ran = asyncio.run(first_event(30))  # no state yet: the first run checkpoints anyway
    assert (
        never_ran is not None
        and never_ran.payload["unsettled"]
        and never_ran.payload["checkpoint_id"] is None
    )
    result = services.run(config)  # nothing to read: one empty epoch, no region task
    assert result.finished and [e.kind for e in result.epochs] == ["global"]

    assert asyncio.run(first_event(1.5)) is None  # several looks, nothing new: no event

    (tmp_path / "in" / "a.txt").write_text("one\ntwo\n")

    async def events_of_one_watch() -> list:
        """One trigger run: it fires for a.txt, not again for it, and again once b.txt comes."""
        queue: asyncio.Queue = asyncio.Queue()

        async def watch() -> None:
            async for fired in trigger.run():
                queue.put_nowait(fired)

        watching = asyncio.create_task(watch())
        try:
            got = [await asyncio.wait_for(queue.get(), 30)]
            try:
                got.append(await asyncio.wait_for(queue.get(), 1.0))  # ~20 more looks: the same work
            except TimeoutError:
                (tmp_path / "in" / "b.txt").write_text("three\n")
                got.append(await asyncio.wait_for(queue.get(), 30))
            return got
        finally:
            watching.cancel()

    first, second = asyncio.run(events_of_one_watch())
    assert first.payload["splits"] == ["a.txt"] and second.payload["splits"] == ["a.txt", "b.txt"]
    (tmp_path / "in" / "b.txt").unlink()
    event = asyncio.run(first_event(30))
    assert event is not None
    assert event.payload == {
        "pipeline": "watched",
        "pipeline_config": path,
        "checkpoint_id": 1,
        "pending": True,
        "unsettled": False,
        "splits": ["a.txt"],
        "split_count": 1,
    }
