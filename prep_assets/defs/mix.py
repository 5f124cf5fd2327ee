"""A `training_mix` asset per mix spec: plans the mix from its sources' manifests, publishes mix.json when every gate
passes the plan (else holds the plan apart and leaves the published mix as it was) and shows the plan per phase;
the mix's gates (`core.mix_gates`) are its blocking asset checks, judging the newest plan."""

import base64
from collections.abc import Iterator

from dagster import (
    AssetCheckExecutionContext,
    AssetCheckResult,
    AssetChecksDefinition,
    AssetCheckSpec,
    AssetExecutionContext,
    AssetKey,
    AssetsDefinition,
    DataVersion,
    MaterializeResult,
    MetadataValue,
    asset,
    multi_asset_check,
)

from prep_assets.core.lake import sha256_file
from prep_assets.core.mix import MIX_VERSION, MixSpec, mix_inputs_digest, mix_path, plan_mix
from prep_assets.core.mix_gates import MIX_GATES, MixSubject, publish_mix
from prep_assets.core.mix_plot import plot_caption, plot_mix
from prep_assets.defs.automation import layer_condition
from prep_assets.defs.checks import outcome_result
from prep_assets.defs.keys import DATASET_MANIFEST, mix_asset_key, mix_group
from prep_assets.defs.metadata import md_table, user_errors
from prep_assets.defs.resources import LakeResource

INPUTS_DIGEST = "inputs_digest"


def phase_tables(mix: dict) -> dict[str, MetadataValue]:
    """Per phase, a table of each bucket's share: planned (demanded) vs achieved tokens, rows, epochs."""
    tables = {}
    for phase in mix["phases"]:
        rows = [
            {
                "bucket": b,
                "share": round(f["share"], 4),
                "planned_tokens": f["demanded_tokens"],
                "achieved_tokens": f["row_tokens"],
                "achieved_share": round(
                    f["row_tokens"] / max(1, sum(x["row_tokens"] for x in phase["buckets"].values())), 4
                ),
                "rows": f["rows"],
                "shortfall_rows": f["shortfall_rows"],
                "content_tokens": f["tokens"],
                "loss_tokens": f["loss_tokens"],
                "epochs": ",".join(map(str, f["epochs"])),
            }
            for b, f in phase["buckets"].items()
        ]
        tables[f"phase_{phase['name']}"] = md_table(rows)
    return tables


def plot_markdown(mix: dict) -> MetadataValue:
    """The planned vs achieved chart (`core.mix_plot`) inline, as a data: URI image with its caption."""
    encoded = base64.b64encode(plot_mix(mix)).decode("ascii")
    return MetadataValue.md(f"![planned vs achieved tokens](data:image/png;base64,{encoded})\n\n{plot_caption(mix)}")


def mix_metadata(mix: dict, warnings: list[str]) -> dict[str, object]:
    buckets = mix["buckets"]
    return {
        **phase_tables(mix),
        "planned_vs_achieved": plot_markdown(mix),
        "buckets": md_table([{"bucket": b, **f} for b, f in buckets.items()]),
        "shortfalls": md_table(
            [{"bucket": b, "shortfall_rows": f["shortfall_rows"]} for b, f in buckets.items() if f["shortfall_rows"]]
        ),
        "epochs_used": MetadataValue.json({b: f["epochs_used"] for b, f in buckets.items()}),
        "warnings": MetadataValue.md("\n".join(f"- {w}" for w in warnings) or "_none_"),
        "num_rows": sum(f["rows"] for f in buckets.values()),
        "sources": MetadataValue.json({b: s["manifest_sha256"] for b, s in mix["sources"].items()}),
    }


def mix_asset(spec: MixSpec) -> AssetsDefinition:
    datasets = sorted({s.dataset for s in spec.sources.values()})

    @asset(
        key=mix_asset_key(spec.name),
        deps=[AssetKey([d, DATASET_MANIFEST]) for d in datasets],
        group_name=mix_group(spec.name),
        kinds={"json"},
        code_version=f"{MIX_VERSION}-{spec.fingerprint()[:12]}",
        description=(
            f"lake/_mixes/{spec.name}/mix.json: {spec.description or 'a training mix'} — buckets "
            + ", ".join(f"{b} ({s.dataset})" for b, s in spec.sources.items())
            + f" over {len(spec.phases)} phase(s); per phase and bucket the rows chosen, tokens demanded and "
            "achieved, epochs used and the exact row order (docs/mixes.md)."
        ),
        tags={"layer": "mix"},
        automation_condition=layer_condition(),  # a source manifest updated (a new drop): the mix is rebuilt
    )
    def training_mix(context: AssetExecutionContext, lake: LakeResource) -> MaterializeResult:
        root = lake.root / "lake"
        with user_errors():
            digest = mix_inputs_digest(spec, root)
            mix = plan_mix(spec, root)
            path, outcomes = publish_mix(spec, root, mix)
        failed = [o.name for o in outcomes if not o.passed]
        if failed:
            context.log.error(
                f"the plan fails {', '.join(failed)}: held at {path}, not published; "
                f"{mix_path(root, spec.name)} stays the last plan that passed (see the checks)"
            )
        inventory = next(o for o in outcomes if o.name == "training_mix_inventory")
        warnings = list(inventory.facts.get("warnings", []))
        for w in warnings:
            context.log.warning(w)
        return MaterializeResult(
            metadata={
                **mix_metadata(mix, warnings),
                INPUTS_DIGEST: digest,
                "published": not failed,
                "path": MetadataValue.path(str(path)),
            },
            data_version=DataVersion(sha256_file(path)),
        )

    return training_mix


def mix_checks(spec: MixSpec) -> AssetChecksDefinition:
    """The mix's gates as one step, each its own blocking check (as `defs/checks.py` does for a layer)."""
    key = mix_asset_key(spec.name)

    @multi_asset_check(
        name="__".join(key.path) + "_gates",
        specs=[AssetCheckSpec(g.name, asset=key, blocking=True, description=g.description) for g in MIX_GATES],
        can_subset=True,
        description="the blocking gates of the training mix",
    )
    def _checks(context: AssetCheckExecutionContext, lake: LakeResource) -> Iterator[AssetCheckResult]:
        selected = {k.name for k in context.selected_asset_check_keys}
        subject = MixSubject(spec, lake.root / "lake")
        for gate in MIX_GATES:
            if gate.name in selected:
                yield outcome_result(gate.evaluate(subject), key, gate.name)

    return _checks
