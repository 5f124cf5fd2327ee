import pytest

from prep_assets.core.errors import PrepAssetsError
from prep_assets.defs.executors import BROKER_ENV, EXECUTOR_ENV, executor_from_env


def test_default_executor_is_dagsters_multiprocess_one(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(EXECUTOR_ENV, raising=False)
    assert executor_from_env() is None


def test_celery_executor_takes_its_broker_from_the_environment(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(EXECUTOR_ENV, "celery")
    monkeypatch.setenv(BROKER_ENV, "redis://broker.internal:6380/3")
    executor = executor_from_env()
    assert executor is not None and executor.name == "celery"
    config = executor.config_schema.resolve_config({}).value["config"]  # what the executor is configured with
    assert config["broker"] == config["backend"] == "redis://broker.internal:6380/3"


def test_unknown_executor_name_is_a_clear_error(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv(EXECUTOR_ENV, "dask")
    with pytest.raises(PrepAssetsError, match="expected one of multiprocess, celery"):
        executor_from_env()
