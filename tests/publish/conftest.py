"""The stand-in Hub (`tests.hub_server`) the publish tests run the real huggingface_hub client against."""

from __future__ import annotations

import pytest

from tests.hub_server import HubStandIn


@pytest.fixture
def hub():
    with HubStandIn() as server:
        yield server
        assert not server.errors


@pytest.fixture
def hub_env(hub, tmp_path) -> dict[str, str]:
    home = tmp_path / "hf-home"
    home.mkdir()
    return {
        "HF_ENDPOINT": hub.endpoint,
        "HF_TOKEN": hub.token,
        "HF_HUB_DISABLE_XET": "1",
        "HF_HOME": str(home),
        "HF_HUB_CACHE": str(home / "hub"),
        "HF_HUB_OFFLINE": "0",
        "HF_HUB_DISABLE_UPDATE_CHECK": "1",
        "HF_HUB_ETAG_TIMEOUT": "5",
    }
