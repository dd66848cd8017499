"""The between-iterations cancellation check reads the flow run's state from Prefect's API."""

from __future__ import annotations


def test_cancel_requested_follows_the_flow_runs_state(prefect_quiet) -> None:
    from prefect import flow, get_client
    from prefect.context import FlowRunContext
    from prefect.states import Cancelling

    from flows.rl_experiment import cancel_requested

    seen: list[bool] = []

    @flow
    def probe() -> None:
        seen.append(cancel_requested())
        ctx = FlowRunContext.get()
        assert ctx is not None and ctx.flow_run is not None
        with get_client(sync_client=True) as client:  # what the UI's Cancel button does
            client.set_flow_run_state(ctx.flow_run.id, Cancelling(), force=True)
        seen.append(cancel_requested())

    probe(return_state=True)  # its final state stays CANCELLING: the server keeps the forced one
    assert seen == [False, True]
    assert cancel_requested() is False  # outside a flow run there is nothing to cancel
