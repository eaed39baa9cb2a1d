"""Fixtures of the API tests: a module's own engine over the tiny model (helpers.api_server's
make_engine) and a server for it on a free port; the tiny reasoning model's path (thinker)."""

import pytest
from helpers.api_server import make_engine, start_server, stop_server
from helpers.reasoning_models import build_thinker


@pytest.fixture(scope="module")
def engine(tiny_llama):
    eng = make_engine(tiny_llama)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="module")
def base_url(engine):
    url, server = start_server(engine)
    yield url
    stop_server(server)


@pytest.fixture(scope="session")
def thinker(tiny_root):
    """The tiny model that never closes its reasoning (helpers/reasoning_models.py)."""
    return build_thinker(tiny_root)
