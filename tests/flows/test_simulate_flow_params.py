"""What a user starting the simulate flow from the Prefect UI sees of its parameters."""

from __future__ import annotations

import inspect


def test_every_parameter_has_a_description_in_the_ui() -> None:
    # The UI showed bare names: the docstring had no `Args:` section (until 2026-12-07).
    from prefect.utilities.callables import parameter_schema

    from flows.simulate_flow import simulate_flow

    schema = parameter_schema(simulate_flow.fn)
    names = list(inspect.signature(simulate_flow.fn).parameters)
    assert sorted(schema.properties) == sorted(names)
    assert all(schema.properties[name].get("description") for name in names), schema.properties
