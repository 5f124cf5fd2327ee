"""Which executor runs a job's steps: on this machine, in the run's own process (the default: a drop's steps form
one chain, and a subprocess per step costs seconds of imports each) or Dagster's multiprocess executor (steps of
independent assets side by side, a process each); or the Celery executor that hands every step to workers on any
machine (the production profile, `production/`).

Chosen by `$PREP_ASSETS_EXECUTOR` when the definitions load: the run process and every worker load them with
the same environment, so both build the same plan. The broker and result backend come from
`$PREP_ASSETS_CELERY_BROKER` / `$PREP_ASSETS_CELERY_BACKEND` (the workers' `production/celery.yaml` reads
the same variables).
"""

from __future__ import annotations

import os

from dagster import ExecutorDefinition, in_process_executor, multiprocess_executor

from prep_assets.core.errors import PrepAssetsError

EXECUTOR_ENV = "PREP_ASSETS_EXECUTOR"
BROKER_ENV = "PREP_ASSETS_CELERY_BROKER"
BACKEND_ENV = "PREP_ASSETS_CELERY_BACKEND"
DEFAULT_BROKER = "redis://127.0.0.1:6379/0"
EXECUTORS = ("in_process", "multiprocess", "celery")


def executor_from_env() -> ExecutorDefinition:
    """The executor `$PREP_ASSETS_EXECUTOR` names (default `in_process`)."""
    name = os.environ.get(EXECUTOR_ENV) or "in_process"
    if name == "in_process":
        return in_process_executor
    if name == "multiprocess":
        return multiprocess_executor
    if name != "celery":
        raise PrepAssetsError(f"{EXECUTOR_ENV}={name!r}: expected one of {', '.join(EXECUTORS)}")
    try:
        from dagster_celery import celery_executor
    except ImportError as exc:
        raise PrepAssetsError(
            f"{EXECUTOR_ENV}=celery needs the production extra: pip install -e '.[production]'"
        ) from exc
    broker = os.environ.get(BROKER_ENV) or DEFAULT_BROKER
    return celery_executor.configured(
        {
            "broker": broker,
            "backend": os.environ.get(BACKEND_ENV) or broker,
            # a step whose worker process died is redelivered (a lost machine's after Redis' visibility timeout,
            # 1 h by default): every layer publishes atomically under its partition lock, so a redo is safe
            "config_source": {
                "task_acks_late": True,
                "task_reject_on_worker_lost": True,
                "broker_connection_retry_on_startup": True,
            },
        },
        name="celery",
    )
