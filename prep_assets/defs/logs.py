"""The console logger of every job: Dagster's own, less the code traceback under a failure that is the user's to fix
(a `dagster.Failure` from `metadata.user_errors`, a failed blocking check). Its message says what to fix; a trace
of Dagster's frames only buries it. Any other error keeps its traceback, and the run's event log (the UI) keeps
every error whole."""

import logging

from dagster import InitLoggerContext, colored_console_logger, logger

# A job's default run config naming this logger: Dagster builds a job's loggers only for the keys its run config
# names, and falls back to its own console logger otherwise (a job launched with no config of ours: a sensor's run,
# `dagster job execute`). The assets' implicit job (the UI's Materialize, automation's runs, asset backfills) and
# the retire job (its Launchpad config has a required key, so it takes no default) keep Dagster's.
JOB_CONFIG = {"loggers": {"console": {"config": {}}}}

# the error classes whose message is the whole report
USER_FAILURES = frozenset({"Failure", "DagsterAssetCheckFailedError"})
_STACK = "\nStack Trace:\n"  # where Dagster's rendering of an error (SerializableErrorInfo) starts its trace


class WithoutUserStacks(logging.Filter):
    """Cuts the traceback off a record whose Dagster event failed with one of `USER_FAILURES`."""

    def filter(self, record: logging.LogRecord) -> bool:
        meta = getattr(record, "dagster_meta", None)  # what Dagster attaches to each record it logs
        event = meta.get("dagster_event") if isinstance(meta, dict) else None
        error = getattr(getattr(event, "event_specific_data", None), "error", None)
        if getattr(error, "cls_name", None) in USER_FAILURES and isinstance(record.msg, str):
            record.msg = record.msg.split(_STACK, 1)[0].rstrip()
        return True


@logger(
    colored_console_logger.config_schema,
    description="Dagster's colored console logger, without a traceback under a user's error (README)",
)
def console_logger(init_context: InitLoggerContext) -> logging.Logger:
    log = colored_console_logger.logger_fn(init_context)
    log.addFilter(WithoutUserStacks())
    return log
