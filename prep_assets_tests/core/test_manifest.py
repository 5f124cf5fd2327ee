"""The manifest's inclusion policy, a pure function of what the lake and the instance say about each drop."""

from prep_assets.core.manifest import manifest_partitions


def test_a_manifest_holds_registered_drops_whose_gates_passed_and_says_why_it_left_out_the_others():
    registered = ["a", "b", "c", "d"]
    unpassed = {"a": [], "b": ["raw_records_accounted: failed"], "c": [f"g{i}: never run" for i in range(5)], "d": []}
    included, excluded = manifest_partitions(registered, {"d": "d2", "old": "a"}, unpassed)
    assert included == ["a"]
    assert excluded == {
        "b": "raw_records_accounted: failed",
        "c": "g0: never run; g1: never run; g2: never run ...",
        "d": "superseded by d2",
        "old": "superseded by a",
    }


def test_a_drop_without_gate_results_is_included_only_when_nothing_is_said_against_it():
    included, excluded = manifest_partitions(["x"], {}, {})
    assert included == ["x"] and excluded == {}
