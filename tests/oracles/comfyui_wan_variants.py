"""ComfyUI's Wan variants (S2V, HuMo, Fun Camera, SCAIL), as siliconflow/ComfyUI at 187eda8e writes them:

- ``comfy/model_detection.py``, ``detect_unet_config``'s 'Wan 2.1' branch: the model type told by one tensor each,
  in its order (camera, by ``control_adapter.conv.weight``, ``camera`` with an image embedder else ``camera_2.2``;
  then s2v, humo, animate, scail2, scail, wandancer), and ``comfy/supported_models.py``'s classes for them (the
  camera ones also by ``in_dim``: 32 for ``WAN21_Camera``, 36 for ``WAN22_Camera``): `comfyui_variant`;
- ``comfy/ldm/wan/model.py``: the shapes of each variant's own layers, which its class fixes whatever the checkpoint
  (S2V's ``CausalAudioEncoder(dim=1024, num_layers=25)`` and 12 ``audio_inject_layers``, HuMo's
  ``AudioProjModel(seq_len=8, blocks=5, channels=1280, intermediate_dim=512, output_dim=1536, context_tokens=16)``,
  ``WanCamAdapter(in_dim_control_adapter=24 -> 24 * 8 * 8, ...)``, SCAIL-2's ``mask_in_dim=28``;
  ``comfy/ldm/wan/model_wandancer.py``'s ``WanDancerModel``: 8 music injectors, a 2-layer music encoder 256 wide,
  35 music features; its release's fused ``in_proj``, which ``WAN22_WanDancer.process_unet_state_dict`` cuts):
  `comfyui_variant_shapes`.
"""

from __future__ import annotations

#: (the tensor ComfyUI tells a type by, model_type), in the order it asks
_TELLS = (
    ("casual_audio_encoder.encoder.final_linear.weight", "s2v"),
    ("audio_proj.audio_proj_glob_1.layer.bias", "humo"),
    ("face_adapter.fuser_blocks.0.k_norm.weight", "animate"),
    ("patch_embedding_mask.weight", "scail2"),
    ("patch_embedding_pose.weight", "scail"),
    ("patch_embedding_global.weight", "wandancer"),
)
_CLASSES = {
    "s2v": "WAN22_S2V",
    "humo": "WAN21_HuMo",
    "scail": "WAN21_SCAIL",
    "scail2": "WAN21_SCAIL2",
    "wandancer": "WAN22_WanDancer",
}


def comfyui_variant(state: dict) -> str:
    """The ComfyUI model class (``comfy/supported_models.py``) of a Wan state dict (name -> shape)."""
    assert "head.modulation" in state, "ComfyUI tells Wan by head.modulation"
    in_dim = state["patch_embedding.weight"][1]
    if "control_adapter.conv.weight" in state:
        if "img_emb.proj.0.bias" in state:
            assert in_dim == 32, "WAN21_Camera's unet_config has in_dim 32"
            return "WAN21_Camera"
        assert in_dim == 36, "WAN22_Camera's unet_config has in_dim 36"
        return "WAN22_Camera"
    for tell, model_type in _TELLS:
        if tell in state:
            assert model_type != "wandancer" or in_dim == 36, "WAN22_WanDancer's unet_config has in_dim 36"
            return _CLASSES.get(model_type, model_type)
    return "WAN21_I2V" if "img_emb.proj.0.bias" in state else "WAN21_T2V"


def _linear(name: str, out: int, inp: int) -> dict[str, tuple[int, ...]]:
    return {f"{name}.weight": (out, inp), f"{name}.bias": (out,)}


def _attention(name: str, dim: int, kv: int) -> dict[str, tuple[int, ...]]:
    t = {**_linear(f"{name}.q", dim, dim), **_linear(f"{name}.k", dim, kv), **_linear(f"{name}.v", dim, kv)}
    return {
        **t,
        **_linear(f"{name}.o", dim, dim),
        f"{name}.norm_q.weight": (dim,),
        f"{name}.norm_k.weight": (dim,),
    }


def comfyui_variant_shapes(cls: str, dim: int, num_layers: int, in_dim: int) -> dict[str, tuple[int, ...]]:
    """What ComfyUI's class `cls` builds besides Wan's T2V / I2V layers: every shape of its own layers."""
    t: dict[str, tuple[int, ...]] = {}
    if cls == "WAN22_S2V":
        a = "casual_audio_encoder"
        t["trainable_cond_mask.weight"] = (3, dim)
        t |= {f"{a}.weights": (1, 25, 1, 1), f"{a}.encoder.padding_tokens": (1, 1, 1, dim)}
        for conv, out, inp in (("conv1_local", dim, 1024), ("conv1_global", dim // 4, 1024)):
            t |= {f"{a}.encoder.{conv}.conv.weight": (out, inp, 3), f"{a}.encoder.{conv}.conv.bias": (out,)}
        for conv, out, inp in (("conv2", dim // 2, dim // 4), ("conv3", dim, dim // 2)):
            t |= {f"{a}.encoder.{conv}.conv.weight": (out, inp, 3), f"{a}.encoder.{conv}.conv.bias": (out,)}
        t |= _linear(f"{a}.encoder.final_linear", dim, dim)
        t |= {"cond_encoder.weight": (dim, 16, 1, 2, 2), "cond_encoder.bias": (dim,)}
        for i in range(12):
            t |= _attention(f"audio_injector.injector.{i}", dim, dim)
            t |= _linear(f"audio_injector.injector_adain_layers.{i}.linear", 2 * dim, dim)
        for proj, k in (("proj", (1, 2, 2)), ("proj_2x", (2, 4, 4)), ("proj_4x", (4, 8, 8))):
            t |= {f"frame_packer.{proj}.weight": (dim, 16, *k), f"frame_packer.{proj}.bias": (dim,)}
    elif cls == "WAN21_HuMo":
        for i in range(num_layers):
            w = f"blocks.{i}.audio_cross_attn_wrapper"
            t |= _attention(f"{w}.audio_cross_attn", dim, 1536)
            t |= {f"{w}.norm1_audio.weight": (dim,), f"{w}.norm1_audio.bias": (dim,)}
        p = "audio_proj.audio_proj_glob"
        t |= _linear(f"{p}_1.layer", 512, 8 * 5 * 1280) | _linear(f"{p}_2.layer", 512, 512)
        t |= _linear(f"{p}_3.layer", 16 * 1536, 512)
        t |= {f"{p}_norm.layer.weight": (1536,), f"{p}_norm.layer.bias": (1536,)}
    elif cls in ("WAN21_Camera", "WAN22_Camera"):
        t |= {"control_adapter.conv.weight": (dim, 24 * 8 * 8, 2, 2), "control_adapter.conv.bias": (dim,)}
        for conv in ("conv1", "conv2"):
            r = f"control_adapter.residual_blocks.0.{conv}"
            t |= {f"{r}.weight": (dim, dim, 3, 3), f"{r}.bias": (dim,)}
    elif cls in ("WAN21_SCAIL", "WAN21_SCAIL2"):
        t |= {"patch_embedding_pose.weight": (dim, in_dim, 1, 2, 2), "patch_embedding_pose.bias": (dim,)}
        if cls == "WAN21_SCAIL2":
            t |= {"patch_embedding_mask.weight": (dim, 28, 1, 2, 2), "patch_embedding_mask.bias": (dim,)}
    elif cls == "WAN22_WanDancer":  # the release's names: the music encoder's q/k/v fused in in_proj
        t |= {"patch_embedding_global.weight": (dim, in_dim, 1, 2, 2), "patch_embedding_global.bias": (dim,)}
        r = "img_emb_refimage.proj"
        t |= {
            f"{r}.0.weight": (1280,),
            f"{r}.0.bias": (1280,),
            f"{r}.4.weight": (dim,),
            f"{r}.4.bias": (dim,),
        }
        t |= _linear(f"{r}.1", 1280, 1280) | _linear(f"{r}.3", dim, 1280)
        t |= {"head_global.modulation": (1, 2, dim)} | _linear("head_global.head", 16 * 4, dim)
        for i in range(8):  # audio_inject_layers=[0, 4, 8, 12, 16, 20, 24, 27]
            t |= _attention(f"music_injector.injector.{i}", dim, dim)
        t |= _linear("music_projection", 256, 35)
        for i in range(2):
            a = f"music_encoder.{i}"
            t |= {f"{a}.self_attn.in_proj_weight": (768, 256), f"{a}.self_attn.in_proj_bias": (768,)}
            t |= _linear(f"{a}.self_attn.out_proj", 256, 256)
            t |= _linear(f"{a}.linear1", 1024, 256) | _linear(f"{a}.linear2", 256, 1024)
            t |= {f"{a}.{n}.{p}": (256,) for n in ("norm1", "norm2") for p in ("weight", "bias")}
    return t
