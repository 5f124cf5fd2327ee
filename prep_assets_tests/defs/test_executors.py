import pytest
from dagster import in_process_executor, multiprocess_executor

from prep_assets.core.errors import PrepAssetsError
from prep_assets.definitions import build_definitions
from prep_assets.defs.executors import BROKER_ENV, EXECUTOR_ENV, executor_from_env
from prep_assets_tests.conftest import SAMPLE_DATA


def test_default_executor_runs_steps_in_the_run_process_and_multiprocess_is_a_choice(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(EXECUTOR_ENV, raising=False)
    assert executor_from_env() is in_process_executor
    assert build_definitions(SAMPLE_DATA).resolve_job_def("sample_text_drops").executor_def is in_process_executor
    monkeypatch.setenv(EXECUTOR_ENV, "multiprocess")
    assert executor_from_env() is multiprocess_executor


def test_celery_executor_takes_its_broker_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(EXECUTOR_ENV, "celery")
    monkeypatch.setenv(BROKER_ENV, "redis://broker.internal:6380/3")
    executor = executor_from_env()
    assert executor is not None and executor.name == "celery"
    config = executor.config_schema.resolve_config({}).value["config"]  # what the executor is configured with
    assert config["broker"] == config["backend"] == "redis://broker.internal:6380/3"


def test_unknown_executor_name_is_a_clear_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(EXECUTOR_ENV, "dask")
    with pytest.raises(PrepAssetsError, match="expected one of in_process, multiprocess, celery"):
        executor_from_env()
