"""diffusers' conversion scripts, where its installed single-file converters (``diffusers.loaders.single_file_utils``
of diffusers 0.42.1, called as they are) leave a name unmapped: the scripts ship in diffusers' repository, not its
package, so their tables are spelled here from diffusers 0.42.1's ``scripts/``:

- ``scripts/convert_hunyuan_video1_5_to_diffusers.py``: the names HunyuanVideo 1.5 adds to HunyuanVideo 1, whose
  names ``convert_hunyuan_video_transformer_to_diffusers`` maps (`HV15_SCRIPT`), and the release's separate q/k/v
  (`HV15_SCRIPT_QKV`); `hv15_to_diffusers` is the two together;
- ``scripts/convert_skyreelsv2_to_diffusers.py``: SkyReels-V2's fps layers, which ``convert_wan_transformer_to_
  diffusers`` leaves as they are (`SKYREELS_FPS`);
- ``scripts/convert_ltx2_to_diffusers.py``: what it renames for LTX-2.3 beyond 2.0's (its
  ``LTX_2_3_TRANSFORMER_KEYS_RENAME_DICT``; ``convert_ltx2_transformer_to_diffusers`` lacks these and leaves
  ``prompt_adaln_single`` as it is where the class has ``prompt_adaln``: `LTX23_RENAMES`), and the switches it
  converts LTX-2.3 with (its version "2.3" config: `LTX23_SCRIPT_SWITCHES`); `ltx2_diffusers_names` is the converter then
  the renames.
"""

from __future__ import annotations

import torch

#: the names HunyuanVideo 1.5 adds to HunyuanVideo 1 (release/native prefix -> diffusers)
HV15_SCRIPT = {
    "time_in.mlp.0.": "time_embed.timestep_embedder.linear_1.",
    "time_in.mlp.2.": "time_embed.timestep_embedder.linear_2.",
    "byt5_in.layernorm.": "context_embedder_2.norm.",
    "byt5_in.fc1.": "context_embedder_2.linear_1.",
    "byt5_in.fc2.": "context_embedder_2.linear_2.",
    "byt5_in.fc3.": "context_embedder_2.linear_3.",
    "vision_in.proj.0.": "image_embedder.norm_in.",
    "vision_in.proj.1.": "image_embedder.linear_1.",
    "vision_in.proj.3.": "image_embedder.linear_2.",
    "vision_in.proj.4.": "image_embedder.norm_out.",
    "cond_type_embedding.": "cond_type_embed.",
}
#: the release's separate q/k/v of a double block (its module -> diffusers' module)
HV15_SCRIPT_QKV = {
    "img_attn_q": "attn.to_q",
    "img_attn_k": "attn.to_k",
    "img_attn_v": "attn.to_v",
    "txt_attn_q": "attn.add_q_proj",
    "txt_attn_k": "attn.add_k_proj",
    "txt_attn_v": "attn.add_v_proj",
}


def hv15_to_diffusers(native: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A native (ComfyUI-named) HunyuanVideo 1.5 state dict through diffusers' own conversions: HunyuanVideo 1's
    converter for every name the two share, the 1.5 script's table for the rest."""
    from diffusers.loaders.single_file_utils import convert_hunyuan_video_transformer_to_diffusers

    own = {k: v for k, v in native.items() if k.startswith(tuple(HV15_SCRIPT))}
    out = convert_hunyuan_video_transformer_to_diffusers({k: v for k, v in native.items() if k not in own})
    for k, v in own.items():
        prefix = next(p for p in HV15_SCRIPT if k.startswith(p))
        out[HV15_SCRIPT[prefix] + k.removeprefix(prefix)] = v
    return out


#: SkyReels-V2's fps layers: the two entries convert_wan_transformer_to_diffusers lacks
SKYREELS_FPS = {"fps_projection.0": "fps_projection.net.0.proj", "fps_projection.2": "fps_projection.net.2"}

#: LTX-2.3's renames beyond 2.0's, in the script's order (str.replace)
LTX23_RENAMES = {"audio_prompt_adaln_single": "audio_prompt_adaln", "prompt_adaln_single": "prompt_adaln"}
#: LTX-2.3's switches as the script sets them (version "2.3")
LTX23_SCRIPT_SWITCHES = dict(
    gated_attn=True, cross_attn_mod=True, audio_gated_attn=True, audio_cross_attn_mod=True,
    use_prompt_embeddings=False, perturbed_attn=True,
)  # fmt: skip


def ltx2_diffusers_names(names) -> dict:
    """diffusers' name for each release name (by diffusers' single-file converter, then its 2.3 renames): old -> new."""
    from diffusers.loaders.single_file_utils import convert_ltx2_transformer_to_diffusers

    converted = {}
    for new, old in convert_ltx2_transformer_to_diffusers({n: n for n in names}).items():
        for a, b in LTX23_RENAMES.items():  # the script's str.replace, in its order
            new = new.replace(a, b)
        converted[old] = new
    return converted
