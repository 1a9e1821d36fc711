"""ComfyUI's rules for the tests that check our native-named files against them: spelled in tests/oracles (each
module naming the upstream file and commit it copies), named here for the tests that import them from here."""

from __future__ import annotations

from tests.oracles.comfyui_wan import comfyui_wan_config

__all__ = ["comfyui_wan_config"]
