"""One dynamic partition per drop, per dataset."""

from __future__ import annotations

from dagster import DynamicPartitionsDefinition


def drops_partitions(dataset: str) -> DynamicPartitionsDefinition:
    return DynamicPartitionsDefinition(name=f"{dataset}_drops")
