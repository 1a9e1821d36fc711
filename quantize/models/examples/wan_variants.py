"""Example checkpoints of the Wan variants only ComfyUI runs (`models.wan_variants`): each as Comfy-Org's repackaged
release holds it, one safetensors file at the root in the original names, no config.json, with the layers
``comfy/ldm/wan/model.py`` builds at the widths it fixes whatever the checkpoint (S2V's 1024-channel audio encoder of
25 layers and 12 injectors; HuMo's ``audio_proj`` from 8 x 5 x 1280 features to 16 tokens of 1536; the camera
adapter's 24 x 64 Plücker channels; SCAIL-2's 28 mask channels), so that ComfyUI detects and loads them."""

from __future__ import annotations

from dataclasses import replace

from ..family import Family
from ..wan_variants import WAN_CAMERA, WAN_DANCER, WAN_HUMO, WAN_S2V, WAN_SCAIL
from .base import ExampleModel, Examples, LoraTensor, linear
from .wan import WAN_EXAMPLES, WanShape, wan_lora, wan_tensors

__all__ = [
    "S2V_EXAMPLES",
    "HUMO_EXAMPLES",
    "CAMERA_EXAMPLES",
    "SCAIL_EXAMPLES",
    "DANCER_EXAMPLES",
    "variant_tensors",
]

Tensors = list[tuple[str, tuple[int, ...]]]

#: the presets: Wan's at the widths ComfyUI detects (heads of 128: ``num_heads = dim // 128``), and the 14B's
_PRESETS = {name: WAN_EXAMPLES.presets[name] for name in ("tiny", "small", "14b")}

#: ComfyUI's fixed widths: S2V's audio encoder (wav2vec2 large's 1024 channels, 25 layers), its injectors (after
#: these blocks), the Fun camera adapter's input (Plücker 6 x 4 latent frames x 64 = 1536 after pixel unshuffle)
S2V_AUDIO_DIM, S2V_AUDIO_LAYERS, S2V_INJECTORS, S2V_COND_DIM = 1024, 25, 12, 16
HUMO_AUDIO_IN, HUMO_AUDIO_HIDDEN, HUMO_AUDIO_TOKENS, HUMO_AUDIO_DIM = 8 * 5 * 1280, 512, 16, 1536
CAMERA_IN = 24 * 64
SCAIL_MASK_IN = 28
#: WanDancer's music injectors, music encoder (2 layers, 256 wide, feed-forward 1024) and music features (35)
DANCER_INJECTORS, DANCER_MUSIC_DIM, DANCER_MUSIC_FFN, DANCER_MUSIC_FEATURES = 8, 256, 1024, 35


def _attention(name: str, dim: int, kv_dim: int | None = None) -> Tensors:
    """A Wan cross-attention's tensors (q, k, v, o with biases; q and k RMS norms), keys and values from `kv_dim`."""
    kv = kv_dim or dim
    t = linear(f"{name}.q", dim, dim) + linear(f"{name}.k", dim, kv) + linear(f"{name}.v", dim, kv)
    t += linear(f"{name}.o", dim, dim)
    return t + [(f"{name}.norm_q.weight", (dim,)), (f"{name}.norm_k.weight", (dim,))]


def _conv(name: str, out: int, inp: int, *kernel: int) -> Tensors:
    return [(f"{name}.weight", (out, inp, *kernel)), (f"{name}.bias", (out,))]


def s2v_tensors(s: WanShape) -> Tensors:
    """``WanModel_S2V``: Wan's T2V and S2V's audio encoder, injectors, cond encoder, frame packer, cond mask."""
    d, a = s.dim, "casual_audio_encoder"
    t = wan_tensors(s) + [("trainable_cond_mask.weight", (3, d))]
    t += [(f"{a}.weights", (1, S2V_AUDIO_LAYERS, 1, 1)), (f"{a}.encoder.padding_tokens", (1, 1, 1, d))]
    t += _conv(f"{a}.encoder.conv1_local.conv", d, S2V_AUDIO_DIM, 3)
    t += _conv(f"{a}.encoder.conv1_global.conv", d // 4, S2V_AUDIO_DIM, 3)
    t += _conv(f"{a}.encoder.conv2.conv", d // 2, d // 4, 3) + _conv(f"{a}.encoder.conv3.conv", d, d // 2, 3)
    t += linear(f"{a}.encoder.final_linear", d, d)
    t += _conv("cond_encoder", d, S2V_COND_DIM, 1, 2, 2)
    for i in range(S2V_INJECTORS):
        t += _attention(f"audio_injector.injector.{i}", d)
    for i in range(S2V_INJECTORS):
        t += linear(f"audio_injector.injector_adain_layers.{i}.linear", 2 * d, d)
    t += _conv("frame_packer.proj", d, 16, 1, 2, 2) + _conv("frame_packer.proj_2x", d, 16, 2, 4, 4)
    return t + _conv("frame_packer.proj_4x", d, 16, 4, 8, 8)


def humo_tensors(s: WanShape) -> Tensors:
    """``HumoWanModel``: Wan's T2V with an audio cross-attention in every block, and ``audio_proj``."""
    d, t = s.dim, []
    for name, shape in wan_tensors(s):
        t.append((name, shape))
        block = name.removesuffix(".modulation")
        if name.startswith("blocks.") and block != name:  # each block's own last tensor: its audio layers
            t += _attention(f"{block}.audio_cross_attn_wrapper.audio_cross_attn", d, HUMO_AUDIO_DIM)
            t += [(f"{block}.audio_cross_attn_wrapper.norm1_audio.{p}", (d,)) for p in ("weight", "bias")]
    p = "audio_proj.audio_proj_glob"
    t += linear(f"{p}_1.layer", HUMO_AUDIO_HIDDEN, HUMO_AUDIO_IN)
    t += linear(f"{p}_2.layer", HUMO_AUDIO_HIDDEN, HUMO_AUDIO_HIDDEN)
    t += linear(f"{p}_3.layer", HUMO_AUDIO_TOKENS * HUMO_AUDIO_DIM, HUMO_AUDIO_HIDDEN)
    return t + [(f"{p}_norm.layer.{n}", (HUMO_AUDIO_DIM,)) for n in ("weight", "bias")]


def camera_tensors(s: WanShape) -> Tensors:
    """``CameraWanModel``: Wan's (I2V for Wan2.1's, T2V-shaped for Wan2.2's) and ``control_adapter``."""
    d = s.dim
    t = wan_tensors(s) + _conv("control_adapter.conv", d, CAMERA_IN, 2, 2)
    for conv in ("conv1", "conv2"):  # one residual block (WanCamAdapter's num_residual_blocks=1)
        t += _conv(f"control_adapter.residual_blocks.0.{conv}", d, d, 3, 3)
    return t


def scail_tensors(s: WanShape, mask: bool) -> Tensors:
    """``SCAILWanModel`` (Wan's I2V and the pose patch embedding) and SCAIL-2's (with the mask one)."""
    t = wan_tensors(s) + _conv("patch_embedding_pose", s.dim, s.in_dim, 1, 2, 2)
    return t + (_conv("patch_embedding_mask", s.dim, SCAIL_MASK_IN, 1, 2, 2) if mask else [])


def dancer_tensors(s: WanShape) -> Tensors:
    """``WanDancerModel`` as released: Wan's I2V, the global patch embedding, reference image embedder and head,
    the music injectors, projection and encoder (its attention's q/k/v fused in ``in_proj``, as the release holds
    it: ComfyUI cuts it on loading)."""
    d, m = s.dim, DANCER_MUSIC_DIM
    t = wan_tensors(s) + _conv("patch_embedding_global", d, s.in_dim, 1, 2, 2)
    e = s.image_dim or 1280
    r = "img_emb_refimage.proj"
    t += [(f"{r}.0.weight", (e,)), (f"{r}.0.bias", (e,))] + linear(f"{r}.1", e, e) + linear(f"{r}.3", d, e)
    t += [(f"{r}.4.weight", (d,)), (f"{r}.4.bias", (d,))]
    t += [("head_global.modulation", (1, 2, d))] + linear("head_global.head", s.out_dim * 4, d)
    for i in range(DANCER_INJECTORS):
        t += _attention(f"music_injector.injector.{i}", d)
    t += linear("music_projection", m, DANCER_MUSIC_FEATURES)
    for i in range(2):
        a = f"music_encoder.{i}"
        t += [(f"{a}.self_attn.in_proj_weight", (3 * m, m)), (f"{a}.self_attn.in_proj_bias", (3 * m,))]
        t += linear(f"{a}.self_attn.out_proj", m, m)
        t += linear(f"{a}.linear1", DANCER_MUSIC_FFN, m) + linear(f"{a}.linear2", m, DANCER_MUSIC_FFN)
        t += [(f"{a}.{n}.{p}", (m,)) for n in ("norm1", "norm2") for p in ("weight", "bias")]
    return t


#: example layout -> (the variant's tensors of a Wan shape, the shape's changes, the release file's stem)
_LAYOUTS = {
    "s2v": (s2v_tensors, {}, "wan2.2_s2v_14B_bf16"),
    "humo": (humo_tensors, {}, "humo_17B_bf16"),
    "camera-2.1": (camera_tensors, {"in_dim": 32, "image_dim": 1280}, "wan2.1_fun_camera_v1.1_14B_bf16"),
    "camera-2.2": (camera_tensors, {"in_dim": 36}, "wan2.2_fun_camera_high_noise_14B_bf16"),
    "scail": (lambda s: scail_tensors(s, False), {"in_dim": 20, "image_dim": 1280}, "wan2.1_scail_14B_bf16"),
    "scail2": (lambda s: scail_tensors(s, True), {"in_dim": 20, "image_dim": 1280}, "wan2.1_scail2_14B_bf16"),
    "wandancer": (dancer_tensors, {"in_dim": 36, "image_dim": 1280}, "wan2.2_wandancer_14B_bf16"),
}


def variant_tensors(layout: str, shape: WanShape) -> Tensors:
    """The tensors of example layout `layout` (``s2v``, ``camera-2.1``, ...) at Wan shape `shape`."""
    tensors, changes, _ = _LAYOUTS[layout]
    return tensors(replace(shape, **changes))


class ComfyVariantExamples(Examples):
    """A variant's examples: ComfyUI's one file at the root, at Wan's presets."""

    presets = _PRESETS
    default_preset = "small"

    def __init__(self, family: Family, layouts: tuple[str, ...]) -> None:
        self.family, self.layouts = family, layouts

    def models(self, preset: str, layout: str) -> list[ExampleModel]:
        shape = self.shape(preset, layout)
        stem = _LAYOUTS[layout][2]
        return [ExampleModel(".", variant_tensors(layout, shape), None, stem, one_file=True)]

    def lora(self, preset: str, layout: str, rank: int) -> list[LoraTensor]:
        """Wan's LoRA (every block Linear of Wan's), as the Wan LoRAs users apply to these are written."""
        return wan_lora(replace(self.shape(preset, layout), **_LAYOUTS[layout][1]), rank)


S2V_EXAMPLES = ComfyVariantExamples(WAN_S2V, ("s2v",))
HUMO_EXAMPLES = ComfyVariantExamples(WAN_HUMO, ("humo",))
CAMERA_EXAMPLES = ComfyVariantExamples(WAN_CAMERA, ("camera-2.1", "camera-2.2"))
SCAIL_EXAMPLES = ComfyVariantExamples(WAN_SCAIL, ("scail", "scail2"))
DANCER_EXAMPLES = ComfyVariantExamples(WAN_DANCER, ("wandancer",))
