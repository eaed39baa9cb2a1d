"""A pytest plugin (`-p helpers.always_draft`, run from tests/) for suites rerun with speculation
on: drafting never stops for cost. StepCost judges measured wall time, so on a loaded machine whether a step drafts
would vary from run to run, and with it the steps' token counts that some tests read."""

from localpaged.core.speculation import StepCost


def pytest_configure(config):
    StepCost.observe = lambda *args, **kwargs: None
    StepCost.observe_model = lambda *args, **kwargs: None
