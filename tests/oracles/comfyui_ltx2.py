"""ComfyUI's LTX-2, as siliconflow/ComfyUI at 187eda8e reads and builds it:

- ``comfy/model_detection.py``: the checkpoint's unet prefix (``unet_prefix_from_state_dict``), then
  ``detect_unet_config``'s 'Lightricks ltxv' branch, with the file's metadata ``config`` it reads
  (`comfyui_detects`);
- ``comfy/ldm/lightricks/av_model.py`` ``LTXAVModel`` (its defaults: `COMFYUI_DEFAULTS`), ``model.py`` and
  ``embeddings_connector.py``: the state dict it builds from what it detects (`comfyui_state`), which its loader
  takes from the names under the prefix (`unet_part`).
"""

from __future__ import annotations

import json

#: where ComfyUI's checkpoint loader finds the unet's tensors
PREFIX = "model.diffusion_model."


def comfyui_detects(state: dict, metadata: dict | None) -> dict:
    """comfy/model_detection.py on a checkpoint's names and shapes (name -> shape) and its ``__metadata__``: the
    unet prefix (``unet_prefix_from_state_dict``), then the 'Lightricks ltxv' branch."""
    prefix = PREFIX
    assert sum(k.startswith(prefix) for k in state) > 5, (
        "ComfyUI's checkpoint loader finds the unet by this prefix"
    )
    assert f"{prefix}adaln_single.emb.timestep_embedder.linear_1.bias" in state, "ComfyUI tells LTX by it"
    config = {"image_model": "ltxav" if f"{prefix}audio_adaln_single.linear.weight" in state else "ltxv"}
    config["num_layers"] = next(
        n for n in range(10**4) if f"{prefix}transformer_blocks.{n}." not in {k[: len(f"{prefix}transformer_blocks.{n}.")] for k in state}
    )  # fmt: skip
    rows, cols = state[f"{prefix}transformer_blocks.0.attn2.to_k.weight"]
    config |= {"attention_head_dim": rows // 32, "cross_attention_dim": cols}
    if metadata is not None and "config" in metadata:
        config.update(json.loads(metadata["config"]).get("transformer", {}))
    config["use_keyframes_abs_pos_embedding"] = f"{prefix}keyframes_abs_pos_embedding" in state
    return config


#: LTXAVModel's defaults (comfy/ldm/lightricks/av_model.py) for what detection and metadata leave unsaid
COMFYUI_DEFAULTS = dict(
    in_channels=128, audio_in_channels=128, cross_attention_dim=4096, audio_cross_attention_dim=2048,
    attention_head_dim=128, audio_attention_head_dim=64, num_attention_heads=32, audio_num_attention_heads=32,
    caption_channels=3840, connector_attention_head_dim=128, connector_num_attention_heads=30, connector_num_layers=2,
)  # fmt: skip


def comfyui_state(detected: dict) -> dict:
    """name -> shape of ``LTXAVModel(**config)``'s state dict under ``model.diffusion_model.``, read off ComfyUI's
    source (comfy/ldm/lightricks/model.py, av_model.py, embeddings_connector.py), with the switches LTX-2.3's
    metadata names (all False by default: the LTX-2.0 structure, PixArt caption projections, 6 modulation rows):

    - ``cross_attention_adaln``: ``adaln_single`` / ``audio_adaln_single`` of 9 coefficients, not 6 (model.py:793,
      av_model.py:476), ``prompt_adaln_single`` / ``audio_prompt_adaln_single`` of 2 while ``use_prompt_adaln_single``
      (model.py:798-803, av_model.py:486-496), and in each block 9 rows of ``scale_shift_table`` and
      ``audio_scale_shift_table`` and the two ``prompt_scale_shift_table`` of 2 rows (av_model.py:189-197);
    - ``apply_gated_attention``: each of a block's six attentions has ``to_gate_logits`` = Linear(query width, its
      heads) (av_model.py:615 into BasicAVTransformerBlock, model.py:455-458);
    - ``caption_proj_before_connector``: the caption projections are a ``NormSingleLinearTextProjection`` (only
      ``linear_1``) when ``caption_projection_first_linear``, else nothing (model.py:805-823, av_model.py:533-551);
    - LTX-2.5's ``ff_bias`` / ``audio_ff_bias`` (False: no bias in a block's video / audio feed-forward,
      av_model.py:183-186, model.py:318-321; the connectors' keep theirs, LTXAVModel passing none) and
      ``use_keyframes_abs_pos_embedding`` (one row as wide as the video stream, model.py:788-789);
    - the connectors: ``audio_connector_*`` heads (default the video connector's, av_model.py:559-561), and
      ``to_gate_logits`` in their blocks' attn1 when ``connector_apply_gated_attention`` (av_model.py:554,
      embeddings_connector.py:60-70)."""
    c = COMFYUI_DEFAULTS | detected
    v, a = c["num_attention_heads"] * c["attention_head_dim"], c["audio_num_attention_heads"] * c["audio_attention_head_dim"]  # fmt: skip
    cross_adaln, gated = c.get("cross_attention_adaln", False), c.get("apply_gated_attention", False)
    modulations = 9 if cross_adaln else 6
    s = {}

    def linear(name, i, o, bias=True):
        s[f"{PREFIX}{name}.weight"] = (o, i)
        if bias:
            s[f"{PREFIX}{name}.bias"] = (o,)

    def adaln(
        name, dim, coefficient
    ):  # AdaLayerNormSingle: PixArt's timestep embedder (256 in) and its linear
        linear(f"{name}.emb.timestep_embedder.linear_1", 256, dim)
        linear(f"{name}.emb.timestep_embedder.linear_2", dim, dim)
        linear(f"{name}.linear", dim, coefficient * dim)

    def attention(
        name, query, context, heads, head, gate=False
    ):  # CrossAttention: q/k RMSNorm over all heads
        inner = heads * head
        s[f"{PREFIX}{name}.q_norm.weight"] = s[f"{PREFIX}{name}.k_norm.weight"] = (inner,)
        linear(f"{name}.to_q", query, inner)
        linear(f"{name}.to_k", context, inner)
        linear(f"{name}.to_v", context, inner)
        if gate:  # one logit a head, off the query's input
            linear(f"{name}.to_gate_logits", query, heads)
        linear(f"{name}.to_out.0", inner, query)

    def caption_projection(name, width):
        if not c.get("caption_proj_before_connector", False):
            linear(f"{name}.linear_1", c["caption_channels"], width)  # PixArtAlphaTextProjection
            linear(f"{name}.linear_2", width, width)
        elif c.get(
            "caption_projection_first_linear", True
        ):  # NormSingleLinearTextProjection: its RMSNorm has none
            linear(f"{name}.linear_1", c["caption_channels"], width)

    def feed_forward(name, dim, bias=True):  # GELU_approx(dim, 4 dim) then Linear(4 dim, dim), both of `bias`
        linear(f"{name}.net.0.proj", dim, 4 * dim, bias)
        linear(f"{name}.net.2", 4 * dim, dim, bias)

    linear("patchify_proj", c["in_channels"], v)
    if c.get("use_keyframes_abs_pos_embedding", False):  # model.py:788-789
        s[f"{PREFIX}keyframes_abs_pos_embedding"] = (1, v)
    adaln("adaln_single", v, modulations)
    if cross_adaln and c.get("use_prompt_adaln_single", True):
        adaln("prompt_adaln_single", v, 2)
    caption_projection("caption_projection", v)
    linear("audio_patchify_proj", c["audio_in_channels"], a)
    adaln("audio_adaln_single", a, modulations)
    if cross_adaln and c.get("use_prompt_adaln_single", True):
        adaln("audio_prompt_adaln_single", a, 2)
    adaln("av_ca_video_scale_shift_adaln_single", v, 4)
    adaln("av_ca_a2v_gate_adaln_single", v, 1)
    adaln("av_ca_audio_scale_shift_adaln_single", a, 4)
    adaln("av_ca_v2a_gate_adaln_single", a, 1)
    caption_projection("audio_caption_projection", a)
    heads, head = c["connector_num_attention_heads"], c["connector_attention_head_dim"]
    connectors = {
        "audio_embeddings_connector": (
            c.get("audio_connector_num_attention_heads", heads), c.get("audio_connector_attention_head_dim", head),
        ),
        "video_embeddings_connector": (heads, head),
    }  # fmt: skip
    connector_gate = c.get("connector_apply_gated_attention", False)
    for connector, (heads, head) in connectors.items():  # Embeddings1DConnector
        s[f"{PREFIX}{connector}.learnable_registers"] = (128, heads * head)
        for i in range(c["connector_num_layers"]):
            width = heads * head
            attention(
                f"{connector}.transformer_1d_blocks.{i}.attn1", width, width, heads, head, connector_gate
            )
            feed_forward(f"{connector}.transformer_1d_blocks.{i}.ff", width)
    vh, vd = c["num_attention_heads"], c["attention_head_dim"]
    ah, ad = c["audio_num_attention_heads"], c["audio_attention_head_dim"]
    for i in range(c["num_layers"]):  # BasicAVTransformerBlock
        b = f"transformer_blocks.{i}"
        attention(f"{b}.attn1", v, v, vh, vd, gated)
        attention(f"{b}.audio_attn1", a, a, ah, ad, gated)
        attention(f"{b}.attn2", v, c["cross_attention_dim"], vh, vd, gated)
        attention(f"{b}.audio_attn2", a, c["audio_cross_attention_dim"], ah, ad, gated)
        attention(f"{b}.audio_to_video_attn", v, a, ah, ad, gated)
        attention(f"{b}.video_to_audio_attn", a, v, ah, ad, gated)
        feed_forward(f"{b}.ff", v, c.get("ff_bias", True))
        feed_forward(f"{b}.audio_ff", a, c.get("audio_ff_bias", True))
        s[f"{PREFIX}{b}.scale_shift_table"] = (modulations, v)
        s[f"{PREFIX}{b}.audio_scale_shift_table"] = (modulations, a)
        if cross_adaln:
            s[f"{PREFIX}{b}.prompt_scale_shift_table"], s[f"{PREFIX}{b}.audio_prompt_scale_shift_table"] = (
                (2, v),
                (2, a),
            )
        s[f"{PREFIX}{b}.scale_shift_table_a2v_ca_audio"] = (5, a)
        s[f"{PREFIX}{b}.scale_shift_table_a2v_ca_video"] = (5, v)
    s[f"{PREFIX}scale_shift_table"], s[f"{PREFIX}audio_scale_shift_table"] = (2, v), (2, a)
    linear("proj_out", v, c["in_channels"])  # out_channels = in_channels in LTXVModel
    linear("audio_proj_out", a, c["audio_in_channels"])
    return s


def unet_part(state: dict) -> dict:
    """What ComfyUI's LTXAVModel loads of a checkpoint: the names under its prefix."""
    return {k: v for k, v in state.items() if k.startswith(PREFIX)}
