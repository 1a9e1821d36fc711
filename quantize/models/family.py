"""A model family: what the tool knows of one family of video DiTs, as a few declared parts, each with one job.

- **names** (`names.BlockNames`): the diffusers <-> native table, read both ways; None where the release's names
  are diffusers' own.
- **detection** (`Detection`): the config classes a model is registered by and the tensor-name marks of each
  naming; a variant's own marks and the marks that make a model another family's.
- **folders** (`Folders`): the layouts a source folder may have (a key of `policies` each), and why.
- **policies** (`policy.Policy`, one per layout): what its bundled recipes quantize and keep, and why
  (`recipes.derive` makes one per format).
- **plan** (`PlanPolicy`): what a plan must know beyond the names: the formats it has no output in and why (by
  the formats' facts, `FormatFacts`), the 2-D weights that are plain parameters, the parts of a release carried
  as stored.
- **lora** (`LoraNames`): the key prefixes its LoRAs carry in the wild, its modulation tables' names.
- **card** (`CardWords`): what the model card says of it.
- **running it**: the diffusers class (`detection.diffusers_class`), a pass's inputs (`inputs`) and the class's
  config derived from an original one (`diffusers_config`), abstract, as `formats.base.Format`'s hooks are; the
  context-parallel plan where diffusers' class ships none (`cp_plan`, ``loaders.parallel``) and whether its
  attention's masks go on under it as the keys' (`cp_masks_on_keys`).

A family is a subclass that sets these parts and overrides the few hooks it truly needs: `HOOKS`, declared in one
block of `Family`, each abstract or with its default; everything else of the base is final (a subclass that
overrides it is refused when it is defined). The name tables are functions of the parts (`tables.name_table`,
`tables.runnable_names`). Its example checkpoints live apart, in `models.examples`. Converter, verify, forward, the
card and the loaders ask the family of a component (`models.family_of`) and spell none of its names.

No torch at import: recipes, detection and the card read families before torch is loaded.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ..errors import InputError
from ..read.files import config_class
from .names import BlockNames, Stack, renamed
from .policy import Policy

if TYPE_CHECKING:
    import torch

    from ..read.checkpoint import Component, TensorInfo

__all__ = [
    "SourceLayout",
    "ModelInputs",
    "Detection",
    "Folders",
    "Aliases",
    "Carried",
    "PlanPolicy",
    "GGUFCompanion",
    "Beside",
    "LoraNames",
    "CardWords",
    "Family",
    "FormatFacts",
    "HOOKS",
    "count_blocks",
    "lacking_in_blocks",
    "shape_reader",
]


class FormatFacts(Protocol):
    """What a family asks of a format (`formats.FormatInfo` answers): its name, the role of names it writes
    (``source``, ``native``, ``gguf``) and the library whose on-disk layout it is (``comfyui``). Families know formats
    by these facts, never by a list of names."""

    name: str
    names: str
    layout_library: str


@dataclass(frozen=True)
class SourceLayout:
    """One layout a source folder matches: its name (a key of the family's `default_recipes`) and why, in words."""

    name: str
    why: str  # e.g. "Wan2.2 A14B layout, original names, 2 experts"
    family: str = ""  # the family's registry name
    #: a pipeline's text encoder beside its transformer (``text_encoder/``): `convert --format` of a folder that
    #: holds both takes the transformer's recipe; the encoder's is named with ``--recipe``
    encoder: bool = False


@dataclass(frozen=True)
class ModelInputs:
    """What one forward pass of a family's diffusers class takes: the tensors a calibration file gives (`keys`,
    by the forward's argument names, from the config), the shapes each may have (`shapes`: a name -> the shape
    patterns it may take, ``None`` for a free dimension), random ones shaped from the config, and the call's
    keyword arguments."""

    keys: Callable[[dict], tuple[str, ...]]
    shapes: Callable[[dict], dict[str, tuple[tuple[int | None, ...], ...]]]
    random: Callable[[dict, torch.Generator], dict[str, torch.Tensor]]
    call: Callable[[dict, dict[str, torch.Tensor]], dict]  # (config, tensors) -> the forward's kwargs
    accepts: tuple[str, ...]  # every tensor a pass of this class may take, whatever the config
    #: the submodule a pass calls, its first output the one compared ("": the whole model): a multimodal text
    #: encoder's language model, whose last hidden state is what a pipeline reads, not its vision tower or head
    module: str = ""


def _starts(names: Sequence[str], marks: tuple[str, ...]) -> bool:
    return bool(marks) and any(n.startswith(marks) for n in names)


@dataclass(frozen=True)
class Detection:
    """How a model of the family is told: by the class its config.json names, else by its tensor names' marks.

    `own_marks`: a variant's own layers (VACE's control blocks): a model is the family's only with one of them,
    whatever its config names among `shared_classes` (the base family's classes a variant's release may name).
    `foreign_marks`: other families' own layers: a model with one is never this family's (Wan and its variants)."""

    #: the class that runs it: diffusers' (config ``_class_name`` of its diffusers checkpoints), or for a text
    #: encoder transformers' (config ``architectures``), as `library` says
    diffusers_class: str
    #: config ``_class_name`` of the original release (Wan's ``WanModel``); run as `diffusers_class`
    native_classes: tuple[str, ...] = ()
    #: tensor-name prefixes only its native / only its diffusers naming has (how a component's naming is told)
    native_marks: tuple[str, ...] = ()
    diffusers_marks: tuple[str, ...] = ()
    own_marks: tuple[str, ...] = ()
    foreign_marks: tuple[str, ...] = ()
    shared_classes: tuple[str, ...] = ()
    #: the library whose class `diffusers_class` is: ``diffusers``, or ``transformers`` (a text encoder); None: no
    #: library has one (a Wan variant only ComfyUI runs: `diffusers_class` names ComfyUI's model class, a forward
    #: pass refuses it naming its first layer diffusers lacks, and its PlanPolicy refuses the libraries' formats)
    library: str | None = "diffusers"

    def marks_naming(self, names: Sequence[str]) -> str | None:
        """Which naming `names` follow by the marks alone: ``native``, ``diffusers``, ``mixed`` or None."""
        native, diffusers = _starts(names, self.native_marks), _starts(names, self.diffusers_marks)
        return "mixed" if native and diffusers else "native" if native else "diffusers" if diffusers else None

    def naming(self, names: Iterable[str]) -> str | None:
        """`marks_naming`, of a model that is the family's by its marks (its own ones present, no foreign one)."""
        names = list(names)
        if _starts(names, self.foreign_marks) or (self.own_marks and not _starts(names, self.own_marks)):
            return None
        return self.marks_naming(names)

    def owns(self, config_class: str | None, names: Iterable[str]) -> bool:
        """Whether a model whose config names `config_class` (None: no config) and tensors `names` is one of its."""
        names = list(names)
        if _starts(names, self.foreign_marks):
            return False
        if config_class is None:
            return self.naming(names) is not None
        if config_class in self.shared_classes:
            return _starts(names, self.own_marks)
        return config_class == self.diffusers_class or config_class in self.native_classes


@dataclass(frozen=True)
class Folders:
    """The layouts a source folder of the family has, by default: a diffusers ``transformer/`` (or such a folder
    itself) is `diffusers` (None: no diffusers class runs the family, which has no such layout); one model at the
    root in the native names is `release` (None: no such layout), `release_why` saying what it is.
    `release_classes`: what a release's config.json may name (empty: anything); `release_config_keys`: config
    fields that make a root in the marks' native names a release though the family's own marks are absent
    (SkyReels-V2's T2V release, which has no fps layers)."""

    diffusers: str | None
    release: str | None = None
    release_why: str = ""
    release_classes: tuple[str | None, ...] = ()
    release_config_keys: tuple[str, ...] = ()
    #: a text encoder's folder in a pipeline (HunyuanVideo 1.5's byT5 is its ``text_encoder_2/``)
    encoder: str = "text_encoder"


@dataclass(frozen=True)
class Aliases:
    """Another naming a release of the family stores its tensors under (Wan's own T5 module names in its umT5
    ``.pth``): `marks`, name prefixes only that naming has; `names`, the family's names (the table's diffusers side)
    against those (its native side). A source in that naming is read under the family's names (`read.source`), so
    that everything after reading sees one of its usual layouts."""

    marks: tuple[str, ...]
    names: BlockNames
    #: what the naming is, in words (an error names it)
    what: str


@dataclass(frozen=True)
class Carried:
    """What a release holds beside the model, carried as stored and no part of the diffusers class: `parts`, name
    prefixes (LTX-2's VAE, vocoder, text connectors); `tensors`, patterns (`re.fullmatch`) of single tensors the
    class computes itself (Wan Animate's blur filters); `metadata`, keys of the file's ``__metadata__`` its
    runtimes read (LTX-2's ``config``), carried into the output files; `written`, (key, value) entries every output
    file carries whatever the source holds, where a runtime tells the model by them alone (Wan-Animate-2's
    ``config``, which ComfyUI builds ``WAN_Animate2`` from: its tensors are a Wan I2V's); a source's own wins."""

    parts: tuple[str, ...] = ()
    tensors: tuple[str, ...] = ()
    metadata: tuple[str, ...] = ()
    written: tuple[tuple[str, str], ...] = ()

    def __contains__(self, name: object) -> bool:
        if not isinstance(name, str):
            return False
        if self.parts and name.startswith(self.parts):
            return True
        return any(re.fullmatch(p, name) for p in self.tensors)


def shape_reader(
    tensors: Mapping[str, TensorInfo], where: Path, what: str, prefix: str = ""
) -> Callable[[str], tuple[int, ...]]:
    """A function giving the shape of tensor ``prefix + name`` of `tensors`, or `InputError` naming the model
    (`where`), the tensor and what a model lacking it is not (`what`: "a Wan DiT"): how a family reads its config
    off the shapes of a release that ships none."""

    def shape(name: str) -> tuple[int, ...]:
        if prefix + name not in tensors:
            raise InputError(f"{where}: no tensor {prefix + name!r}: not {what}")
        return tuple(tensors[prefix + name].shape)

    return shape


def lacking_in_blocks(tensors: Collection[str], prefix: str, blocks: int | None = None) -> str | None:
    """The first tensor ``<prefix><i>.<leaf>`` a numbered list of blocks lacks where its block 0 holds
    ``<prefix>0.<leaf>``, over the blocks the names hold or `blocks` of them (a config's count), whichever is more;
    None when every block is whole. A release's config is read off block 0's shapes, which say nothing of the
    others: a file without one of their tensors would convert to one its runtimes build with a random tensor."""
    first = [n.removeprefix(f"{prefix}0.") for n in tensors if n.startswith(f"{prefix}0.")]
    for i in range(1, max(blocks or 0, count_blocks(tensors, prefix))):
        lacking = next(
            (f"{prefix}{i}.{leaf}" for leaf in first if f"{prefix}{i}.{leaf}" not in tensors), None
        )
        if lacking is not None:
            return lacking
    return None


def count_blocks(tensors: Mapping[str, object], prefix: str) -> int:
    """How many blocks ``<prefix>0.``, ``<prefix>1.``, ... the tensor names hold, counting from 0 up to the first
    missing one."""
    n = 0
    while any(k.startswith(f"{prefix}{n}.") for k in tensors):
        n += 1
    return n


@dataclass(frozen=True)
class Tokenizer:
    """A text encoder's tokenizer as its runtimes read it from the model's file: ComfyUI's loaders as the tensor
    `tensor` (the tokenizer file's bytes, uint8; a single-file release holds it so already), ComfyUI-GGUF as
    ``tokenizer.ggml.*`` key-values of model `gguf_model` (what llama.cpp's converter writes). `files`: where it is
    looked for beside a model folder that does not hold it, relative to that folder, in order (a pipeline's
    ``../tokenizer/spiece.model``)."""

    tensor: str
    files: tuple[str, ...]
    gguf_model: str
    #: the source tensor whose rows are the vocabulary (a GGUF file's tokens are padded to them, as llama.cpp's)
    vocab_tensor: str
    #: what the bytes are: ``sentencepiece`` (a ``tokenizer.model``; a tokenizer.json is rebuilt into one) or
    #: ``json`` (tokenizers' ``tokenizer.json`` itself, which ComfyUI's Gemma 4 reads as ``tokenizer_json``)
    kind: str = "sentencepiece"


@dataclass(frozen=True)
class Beside:
    """A model a diffusers pipeline keeps in a folder of its own beside the family's, whose tensors the release's
    native file holds with the family's (LTX-2's text connectors: diffusers' ``connectors/``, in ComfyUI's file under
    the transformer's prefix): its `folder` beside the model's, the class its config.json names, and its names ->
    the release's (`names`, read native-wards). A native-named format writes a diffusers model with it, where the
    pipeline has it (`read.source`), as the release carries it."""

    folder: str
    diffusers_class: str
    names: BlockNames


@dataclass(frozen=True)
class GGUFCompanion:
    """A second GGUF file beside the model's, holding some of its tensors under an architecture of their own: a
    Qwen2-VL's vision tower as llama.cpp's ``mmproj`` file (``general.type`` ``mmproj``), which ComfyUI-GGUF's CLIP
    loader finds beside the text file by its name (a ``.gguf`` naming ``mmproj`` and the text file's stem). Its
    key-values beside the general ones are the family's (`Family.gguf_companion_key_values`)."""

    architecture: str
    #: the output names it holds, by prefix (llama.cpp's ``v.`` and ``mm.``)
    holds: tuple[str, ...]
    #: its ``general.type``, and its file's name: ``<type>-<the model file's name>`` (llama.cpp's ``mmproj-*.gguf``)
    type: str = "mmproj"


@dataclass(frozen=True)
class PlanPolicy:
    """What a plan of the family's models must know beyond its names."""

    #: GGUF ``general.architecture`` (what ComfyUI-GGUF and llama.cpp tools read); None: no GGUF output
    gguf_architecture: str | None = None
    #: why it has none, in words (the refusal at plan time says it): which reader lacks it
    no_gguf_why: str = "no GGUF reader this tool writes for knows it"
    #: why a model in diffusers' names has no output in the native names (ComfyUI's and GGUF's files, which the
    #: release converts to): what its runtimes need that diffusers' layout does not hold (None: it has)
    diffusers_not_native_why: str | None = None
    #: patterns (`re.match`: name prefixes, either naming) of 2-D weights the runtimes use as plain parameters,
    #: not as Linear layers (Wan Animate's motion encoder, SkyReels-V2's fps Embedding, umT5's relative attention
    #: biases): never quantized, kept as any non-Linear tensor
    plain_weights: tuple[str, ...] = ()
    carried: Carried = Carried()
    #: the names its GGUF files hold where a GGUF reader wants other names than the native ones (a text
    #: encoder's: llama.cpp's, which ComfyUI-GGUF's CLIP loader maps back): the table read native-wards
    gguf_names: BlockNames | None = None
    #: the second GGUF file some of its tensors go to (a vision tower's ``mmproj``), None: one file
    gguf_companion: GGUFCompanion | None = None
    #: the pipeline's model beside its diffusers model that its native files hold too (LTX-2's connectors)
    beside: Beside | None = None
    #: the tokenizer its runtimes read from the model's own file (a text encoder's), None: none
    tokenizer: Tokenizer | None = None
    #: the stem of a one-file output of a model converted at the root (``diffusion_model_comfy_fp8.safetensors``)
    root_stem: str = "diffusion_model"
    #: the stem a release with no config.json is written under by a format that keeps its names (with the config
    #: its family reads off it, `Family.release_config`), where that makes the output its library's own folder
    #: (Wan-Animate-2's ``wan_animate_2_bf16`` -> ``diffusion_pytorch_model``, which `from_pretrained` finds);
    #: None: the source's
    release_stem: str | None = None
    #: the libraries whose layouts (a format's `layout_library`: ``comfyui``) no runtime of the family reads as
    #: they are (ComfyUI's for byT5: its loader takes the quantization of the other file of the pair only),
    #: refused at plan time saying `unread_why`
    unread_by: tuple[str, ...] = ()
    unread_why: str = ""


@dataclass(frozen=True)
class LoraNames:
    """How its LoRAs are written in the wild."""

    #: prefixes its LoRA keys carry (stripped, any of them, in any order)
    prefixes: tuple[str, ...] = ()
    #: what a block's modulation table is called in its namings (a LoRA's ``diff_m`` adds to it)
    modulation: tuple[str, ...] = ()


@dataclass(frozen=True)
class CardWords:
    """What the model card says of it: the Hub pipeline tag, a note on two experts (None: it has none), what its
    weights are, what stays in high precision, and how ComfyUI and ComfyUI-GGUF load its files."""

    pipeline_tag: str | None = "text-to-video"
    experts_note: str | None = None
    weights: str = "transformer"
    kept: str = (
        "Embeddings, modulation, heads and the layers the recipe keeps stay in their original precision."
    )
    kept_tensors: str = "every bias, norm, modulation table, embedding and the patch-embedding convolution"
    comfyui: str = (
        "put the model file in `ComfyUI/models/diffusion_models/` and load it with the stock **Load Diffusion "
        "Model** node (weight_dtype `default`)"
    )
    comfyui_gguf: str = (
        "put the file in `ComfyUI/models/unet/` (or `diffusion_models/`) and load it with the **Unet Loader "
        "(GGUF)** node"
    )


class Family(abc.ABC):
    """What the tool knows of one model family: its parts (set by a subclass) and the hooks it may override."""

    #: registry name (``quantize example --family``, `SourceLayout.family`)
    name: str = ""
    #: how messages and the card call it
    title: str = ""
    names: BlockNames | None = None
    detection: Detection
    folders: Folders
    #: layout -> what its bundled recipes quantize and keep (`policy.Policy`; `recipes.derive` makes them)
    policies: Mapping[str, Policy] = {}
    #: format -> the thresholds its bundled recipes hold, where the family's differ from the format's own
    recipe_checks: Mapping[str, Mapping[str, float]] = {}
    plan: PlanPolicy = PlanPolicy()
    lora: LoraNames = LoraNames()
    card: CardWords = CardWords()
    #: (stored prefix, the class's prefix): where the class holds a stored tensor under another name, as
    #: transformers 5 renames Gemma 3's ``language_model.model.`` to ``model.language_model.`` on loading; a
    #: format that writes the source's names for the class's own loader (`from_pretrained`) writes these
    class_prefixes: tuple[tuple[str, str], ...] = ()
    #: another naming its releases store (`Aliases`), read under the family's own names; None: none
    aliases: Aliases | None = None
    #: the class's Linears whose weight is another tensor (tied: Gemma 3's ``lm_head``) -> that tensor, by the
    #: class's names: no checkpoint stores them, and the quantization config of an output in the class's names
    #: (one holding that tensor) names them as kept, so that transformers' quantizers leave them tied
    tied_linears: Mapping[str, str] = {}

    # --- hooks: the methods a family may override (`HOOKS`), each abstract or with its default -----------------

    @property
    @abc.abstractmethod
    def inputs(self) -> ModelInputs:
        """What one forward pass of the diffusers class takes."""

    @abc.abstractmethod
    def diffusers_config(self, config: dict, tensors: Mapping[str, TensorInfo], where: Path) -> dict:
        """The diffusers class's config for a native config.json (one of `native_classes`), or for a release
        that has none (`config` empty), what the config does not say read off the tensor shapes."""

    def build_model(self, config: dict):
        """The class that runs it (`Detection.diffusers_class`) built from `config`, its parameters where
        the caller's context puts them (the meta device, `models.meta.parameters_on_meta`). Default: the
        diffusers class's ``from_config``."""
        import diffusers

        return getattr(diffusers, self.diffusers_class).from_config(config)

    def release_config(self, tensors: Mapping[str, TensorInfo], where: Path) -> dict | None:
        """The config.json of a release that ships none (the diffusers class's, read off the tensor shapes): what
        a checkpoint converted from it is written with, so that it loads as that class. None: no such release."""
        return None

    def pipeline_tag(self, config: dict) -> str | None:
        """The Hub pipeline tag of a model with this config (text-to-video, image-to-video), or None."""
        return self.card.pipeline_tag

    def layouts(
        self, folder: Path, open_: Callable[[str], Component | None], registered: Collection[str] = ()
    ) -> list[SourceLayout]:
        """Every layout of this family that `folder` matches (`Folders`); `open_(rel)` opens a component folder
        (None where there is no readable one); `registered`: every config class a family is registered by
        (`models.registered_classes`)."""
        found, f = [], self.folders
        transformer = open_("transformer") if f.diffusers is not None else None
        if transformer is not None and self.is_diffusers(transformer, registered):
            why = f"{self.title}, diffusers layout ({self.diffusers_class} in transformer/)"
            found.append(self.layout(why, f.diffusers))
        root = open_(".")
        if root is not None:
            if f.release is not None and self.is_release(root):
                found.append(self.layout(f.release_why, f.release))
            elif f.diffusers is not None and config_class(root.config) == self.diffusers_class:
                why = f"{self.title}, a bare {self.diffusers_class} folder (diffusers names)"
                found.append(self.layout(why, f.diffusers))
        return found

    def diffusers_name(self, native_name: str) -> str | None:
        """The diffusers class's name of native tensor `native_name` (None: it has none). Default: the table's."""
        return None if self.names is None else self.names.diffusers(native_name)

    def gguf_key_values(
        self, config: dict, tensors: Mapping[str, TensorInfo]
    ) -> dict[str, str | int | float | tuple[int, ...]]:
        """The key-values a GGUF file of one of its models holds beside the general ones and the tokenizer's
        (llama.cpp's ``<architecture>.*`` hyperparameters of a text encoder; a tuple of ints is an int32 array),
        from its config and tensors.
        Default: none (ComfyUI-GGUF reads a DiT's off its tensors)."""
        return {}

    def beside_metadata(self, config: dict, beside_config: dict, where: Path) -> dict[str, str]:
        """The release's file metadata a native file of a diffusers model joined with its `PlanPolicy.beside`
        model carries (LTX-2's ``config``, which ComfyUI builds its model from), from the two configs.
        Default: none."""
        return {}

    def gguf_companion_key_values(
        self, config: dict, tensors: Mapping[str, TensorInfo], where: Path
    ) -> dict[str, str | int | float | bool | tuple[int | float, ...]]:
        """The key-values of its GGUF companion file (`PlanPolicy.gguf_companion`) beside the general ones,
        from the config and tensors of the model at `where` (which an `InputError` names). Default: none."""
        return {}

    def refuse_native(self, names: Sequence[str], where: str, fmt: str) -> None:
        """`InputError` for a diffusers-named model when the family has no native output of one
        (`PlanPolicy.diffusers_not_native_why`), naming the model and the format; not where it comes with what
        the release carries beside it (its `PlanPolicy.beside` model, joined as the release's: `read.source`)."""
        joined = self.plan.beside is not None and any(self.carried(n) for n in names)
        if (
            self.plan.diffusers_not_native_why is not None
            and self.naming(names) == "diffusers"
            and not joined
        ):
            raise InputError(
                f"{where}: {fmt} writes {self.title}'s native names, which ComfyUI reads, and this model has "
                f"diffusers' {self.diffusers_class} names: {self.plan.diffusers_not_native_why}"
            )

    def native_stacks(self, names: Sequence[str], where: str) -> dict[str, Stack]:
        """The native tensors a model's tensors stack into (a diffusers-named model's fused projections,
        `Blocks.stacked`), each with its `Stack`; `InputError` naming one a stack lacks. Default: from the
        table (`BlockNames.stacked_into`)."""
        if self.names is None or self.detection.marks_naming(list(names)) != "diffusers":
            return {}
        present, stacks = set(names), {}
        for name in names:
            native = self.names.stacked_into(name)
            if native is None or native in stacks:
                continue
            stack = self.names.native_stack(native)
            lacking = next((n for n, _, _ in stack if n not in present), None)
            if lacking is not None:
                raise InputError(
                    f"{where}: tensor {lacking!r} is missing: {self.title}'s native {native!r} stacks it with "
                    f"{name!r}"
                )
            stacks[native] = stack
        return stacks

    def cp_plan(self, config: dict) -> dict | None:
        """diffusers' context-parallel plan for the class (module name -> its ``ContextParallelInput``s or
        ``ContextParallelOutput``, as a class's ``_cp_plan``), where the class ships none; built when asked, so
        that importing a family imports nothing of diffusers. Default: None (the class's own, or none)."""
        return None

    def cp_masks_on_keys(self) -> bool:
        """Whether the class's attention builds a query-and-key mask ([B, 1, S, S]: a query sees a key where both
        are valid) from the tokens a rank holds, which Ulysses cannot gather (it gathers a mask along the keys):
        `loaders.parallel` then passes such a mask on as its keys' ([B, 1, 1, S]) under context parallelism, the
        same rows for every valid query. Default: False."""
        return False

    # --- final: what callers ask, made of the declared parts (a family overrides none of it) ---------------------

    def __init_subclass__(cls, **kwargs: object) -> None:
        """A family overrides its hooks only (`HOOKS`): anything else of the base is final, so that what a family
        changes is declared in one place."""
        super().__init_subclass__(**kwargs)
        final = [
            n
            for n, v in vars(cls).items()
            if n not in HOOKS
            and callable(getattr(Family, n, None))
            and not n.startswith("__")
            and v is not None
        ]
        if final:
            raise TypeError(
                f"{cls.__name__} overrides {', '.join(final)} of Family, which is final: a family overrides only "
                f"its hooks ({', '.join(sorted(HOOKS))}) and declares the rest as data"
            )

    def class_name(self, name: str) -> str:
        """The name the class's module holds tensor `name` under (`class_prefixes`: a stored name's prefix
        renamed), or `name` itself; a name already in the class's form (a transformers-side output's) is left as
        it is, though a stored prefix may begin it (Qwen2.5-VL's ``model.`` of ``model.language_model.``). The
        class's prefix may be empty (transformers 5's `CLIPTextModel` holds the stored ``text_model.`` at its root)."""
        if any(own and name.startswith(own) for _, own in self.class_prefixes):
            return name
        for stored, own in self.class_prefixes:
            if name.startswith(stored):
                return own + name[len(stored) :]
        return name

    def parameter_names(self, names: Iterable[str]) -> dict[str, str]:
        """Each of `names` (tensors of the class under the family's names, as its checkpoints store them) -> the
        parameter of the built class it fills (`class_name`)."""
        return {n: self.class_name(n) for n in names}

    # --- the parts, as callers ask for them --------------------------------------------------------

    @property
    def diffusers_class(self) -> str:
        return self.detection.diffusers_class

    @property
    def native_classes(self) -> tuple[str, ...]:
        return self.detection.native_classes

    def naming(self, names: Iterable[str]) -> str | None:
        """Which of its namings `names` follow: ``native``, ``diffusers``, ``mixed``, or None (neither)."""
        return self.detection.naming(names)

    def owns(self, config_class: str | None, names: Iterable[str]) -> bool:
        """Whether a model whose config names `config_class` (None: no config) and tensors `names` is one of its."""
        return self.detection.owns(config_class, names)

    def own_names(self, names: Sequence[str], where: str) -> dict[str, str] | None:
        """Each of `names` -> the family's own name, where they follow its `aliases` naming (its marks), else
        None; `InputError` naming a tensor that naming has and the family does not."""
        a = self.aliases
        if a is None or not _starts(names, a.marks):
            return None
        lacking = f"is in {a.what}, and {self.title} has no such tensor"
        return renamed(names, a.names.diffusers, where, lacking)

    def plain_weight(self, name: str) -> bool:
        """Whether tensor `name` is a 2-D weight its runtimes use as a plain parameter (`PlanPolicy.plain_weights`)."""
        return any(re.match(p, name) for p in self.plan.plain_weights)

    def carried(self, name: str) -> bool:
        """Whether tensor `name` is carried as stored and is no part of the diffusers class (`Carried`)."""
        return name in self.plan.carried

    def native_name(self, diffusers_name: str) -> str | None:
        return None if self.names is None else self.names.native(diffusers_name)

    def is_release(self, comp: Component) -> bool:
        """A model of the original release (`Folders`): in its native names, its config naming one of
        `release_classes` when they are given."""
        f, config = self.folders, comp.config or {}
        if f.release_classes and config_class(config) not in f.release_classes:
            return False
        if self.naming(comp.tensors) == "native":
            return True
        by_config = any(k in config for k in f.release_config_keys)
        return by_config and self.detection.marks_naming(list(comp.tensors)) == "native"

    def layout(self, why: str, name: str | None = None, *, encoder: bool = False) -> SourceLayout:
        return SourceLayout(name or self.name, why, self.name, encoder)

    def is_diffusers(self, comp: Component, registered: Collection[str] = ()) -> bool:
        """A diffusers model of this family: its config names the class, or names none and its tensors have this
        family's diffusers names. A config that names another class is never the family's, whether a family is
        registered by it (`registered`) or not (a newer model, Kandinsky 6's super-resolution transformer, may
        share a family's marks)."""
        cls = config_class(comp.config)
        if cls is not None:
            return cls == self.diffusers_class
        return self.naming(comp.tensors) == "diffusers"

    def why_no(self, fmt: FormatFacts, native_names: bool = False) -> str | None:
        """Why this family has no output in format `fmt` (which writes native names when `native_names`), in
        words (None: no such reason): a GGUF file without an architecture; a runtime library that reads none of
        its files (`PlanPolicy.unread_by`); a native-named format from diffusers' layout
        (`PlanPolicy.diffusers_not_native_why`)."""
        if fmt.names == "gguf" and self.plan.gguf_architecture is None:
            return f"{self.title} has no GGUF architecture ({self.plan.no_gguf_why})"
        if fmt.layout_library in self.plan.unread_by:
            return f"no runtime reads {self.title}'s {fmt.name} files: {self.plan.unread_why}"
        if self.plan.diffusers_not_native_why is not None and native_names:
            return (
                f"{self.title}'s {fmt.name} files are written from the original release only: "
                f"{self.plan.diffusers_not_native_why}"
            )
        return None


#: the methods a family may override (`Family.__init_subclass__` refuses any other)
HOOKS = frozenset(
    {
        "inputs",
        "diffusers_config",
        "build_model",
        "release_config",
        "pipeline_tag",
        "layouts",
        "diffusers_name",
        "gguf_key_values",
        "beside_metadata",
        "gguf_companion_key_values",
        "refuse_native",
        "native_stacks",
        "cp_plan",
        "cp_masks_on_keys",
    }
)
