"""Declarative automation: what carries a new drop from bronze to the manifest without anyone clicking.

- silver, gold, packed shards: a partition is built when its upstream partition was updated and that
  upstream's blocking gates passed (a failed gate stops the drop where the data is bad); gold also waits for
  the pinned tokenizer (never racing its first materialization);
- the tokenizer: built when missing (and not after a failed attempt: fix the spec and materialize it);
A new drop's run of every layer is requested by the drop sensor (the drop job, run key = partition key), so
automation rebuilds what goes stale afterwards; manifest refreshes come from the manifest
sensor (`defs/sensors.py`: it compares event-log ids, so no shards update is ever lost between ticks). Evaluated
by one automation sensor, on by default, so `dagster dev` runs it out of the box.
"""

from dagster import (
    AssetKey,
    AssetSelection,
    AutomationCondition,
    AutomationConditionSensorDefinition,
    DefaultSensorStatus,
)

AUTOMATION_SENSOR = "prep_assets_automation"
AUTOMATION_SECONDS = 15


def layer_condition() -> AutomationCondition:
    return AutomationCondition.eager() & AutomationCondition.all_deps_blocking_checks_passed()


def gold_condition(tokenizer: AssetKey) -> AutomationCondition:
    not_ready = AutomationCondition.missing() | AutomationCondition.in_progress()
    return layer_condition() & ~AutomationCondition.any_deps_match(not_ready).allow(AssetSelection.assets(tokenizer))


def tokenizer_condition() -> AutomationCondition:
    return AutomationCondition.missing() & ~AutomationCondition.in_progress() & ~AutomationCondition.execution_failed()


def automation_sensor() -> AutomationConditionSensorDefinition:
    return AutomationConditionSensorDefinition(
        AUTOMATION_SENSOR,
        target=AssetSelection.all(),
        default_status=DefaultSensorStatus.RUNNING,
        minimum_interval_seconds=AUTOMATION_SECONDS,
        description="Evaluates the assets' automation conditions: carries new drops through every layer and "
        "refreshes each dataset's manifest.",
    )
