"""Language models, their layers and the image models, in Flax NNX.

The token mixers include the Transformer baseline's attention, Momentum DeltaNet (MDN, arXiv
2605.05838) and Gated DeltaNet (GDN, arXiv 2412.06464). Every language model is a
:class:`LanguageModel` of blocks ``token mixer + feed-forward``; :func:`build_lm` composes
any mixer of :data:`MIXERS` (``"attention"``, ``"mdn"``, ``"gdn"``, ``"mlstm"``: xLSTM's mLSTM
layer, arXiv 2405.04517) with any FFN of :data:`FFNS` (``"swiglu"``, ``"moe"``,
``"latent_moe"``), e.g.
``build_lm("tiny", mixer="mdn", ffn="latent_moe", rngs=nnx.Rngs(0))``; the Transformer, MDN and
GDN builders are its ``+ swiglu`` presets. :mod:`~jaxlib_ext.models.registry` names the
parts. Submodules: :mod:`~jaxlib_ext.models.latent_moe`
(the LatentMoE layer, arXiv 2601.18089), :mod:`~jaxlib_ext.models.accounting` (parameters and
FLOPs per token), :mod:`~jaxlib_ext.models.growth` (orthogonal growth of MoE checkpoints, arXiv
2510.08008), :mod:`~jaxlib_ext.models.llama` (the Llama presets' GGUF loader),
:mod:`~jaxlib_ext.models.xlstm` (xLSTM students of a Llama teacher: mLSTM and sliding-window
attention mixers, arXiv 2603.15590), :mod:`~jaxlib_ext.models.distill` (the distillation
pipeline of those students), :mod:`~jaxlib_ext.models.generation` (decoding with the
cache), :mod:`~jaxlib_ext.models.unet` (:class:`UNet`),
:mod:`~jaxlib_ext.models.diffusion` (variance-preserving schedules, Tweedie's estimate, the DDIM
and ancestral steps, arXiv 2010.02502 and 2006.11239),
:mod:`~jaxlib_ext.models.latent_diffusion` (a latent diffusion model, arXiv 2112.10752) and
:mod:`~jaxlib_ext.models.digit_classifier` (:class:`DigitClassifier`, a small CNN of MNIST
digits trained by :func:`train_digit_classifier`, whose penultimate features feed the Fréchet
distance of :func:`jaxlib_ext.samplers.inverse.frechet_distance`; its ``features``, ``logits``,
``accuracy``, ``save``, ``load`` and ``load_or_train`` are used through the module).

Every model has a builder ``build_<model>(preset="tiny", *, vocab_size=None, rngs, **overrides)``
whose ``preset`` is a size name of that model's table (:data:`TRANSFORMER_PRESETS`:
``"tiny"``, ``"small"``, ``"125m"``, ``"400m"``; :data:`DELTANET_PRESETS`, shared by MDN and GDN:
``"tiny"``, ``"400m"``, ``"1.3b"``). :func:`preset_param_count` counts a preset's parameters
without allocating them, e.g. ``preset_param_count(build_mdn, "400m")``.
"""

from jaxlib_ext.models import digit_classifier
from jaxlib_ext.models._backbone import Block, LanguageModel, LMCache
from jaxlib_ext.models._delta_mixer import (
    DELTANET_PRESETS,
    DeltaNetConfig,
    LayerCache,
    l2_normalize,
)
from jaxlib_ext.models.attention import (
    TRANSFORMER_PRESETS,
    Attention,
    AttentionConfig,
    KVCache,
    TransformerConfig,
    attention,
    causal_attention,
)
from jaxlib_ext.models.digit_classifier import DigitClassifier, train_digit_classifier
from jaxlib_ext.models.gdn import GatedDeltaNet, GDNConfig, gdn_gates
from jaxlib_ext.models.generation import generate, generate_text
from jaxlib_ext.models.latent_moe import LatentMoE, LatentMoEConfig, router_bias_update
from jaxlib_ext.models.layers import (
    Embedding,
    LMHead,
    RMSNorm,
    SwiGLU,
    SwiGLUConfig,
    apply_rope,
    rms_norm,
    swiglu_hidden_size,
)
from jaxlib_ext.models.llama import default_teacher_path, load_gguf
from jaxlib_ext.models.lm import (
    LM_PRESETS,
    LMConfig,
    build_gdn,
    build_lm,
    build_mdn,
    build_transformer,
    lm_config,
)
from jaxlib_ext.models.mdn import (
    MDNConfig,
    MDNGates,
    MomentumDeltaNet,
    mdn_gates,
    momentum_eigenvalues,
    momentum_transition_matrix,
)
from jaxlib_ext.models.mlstm import MLSTMCache, MLSTMConfig, MLSTMLayer, MLSTMMixerConfig
from jaxlib_ext.models.presets import param_count, preset_param_count
from jaxlib_ext.models.registry import FFN_REGISTRY, FFNS, MIXER_REGISTRY, MIXERS
from jaxlib_ext.models.short_conv import ShortConvolution, causal_depthwise_conv
from jaxlib_ext.models.unet import UNet
from jaxlib_ext.models.xlstm import XLSTMConfig, XLSTMMixer, student_from_teacher

__all__ = [
    # builders, configs, presets
    "build_transformer",
    "build_mdn",
    "build_gdn",
    "build_lm",
    "lm_config",
    "LMConfig",
    "LM_PRESETS",
    "MIXERS",
    "FFNS",
    "MIXER_REGISTRY",
    "FFN_REGISTRY",
    "AttentionConfig",
    "MDNConfig",
    "GDNConfig",
    "MLSTMMixerConfig",
    "SwiGLUConfig",
    "LatentMoEConfig",
    "TransformerConfig",
    "DeltaNetConfig",
    "MLSTMConfig",
    "TRANSFORMER_PRESETS",
    "DELTANET_PRESETS",
    "param_count",
    "preset_param_count",
    # language models and their decode caches
    "generate",
    "generate_text",
    "load_gguf",
    "default_teacher_path",
    "XLSTMConfig",
    "XLSTMMixer",
    "student_from_teacher",
    "LanguageModel",
    "Block",
    "LayerCache",
    "LMCache",
    "KVCache",
    "MLSTMCache",
    # token mixers and their pure pieces
    "attention",
    "causal_attention",
    "Attention",
    "MomentumDeltaNet",
    "GatedDeltaNet",
    "MLSTMLayer",
    "MDNGates",
    "mdn_gates",
    "gdn_gates",
    "momentum_transition_matrix",
    "momentum_eigenvalues",
    "l2_normalize",
    # layers
    "LatentMoE",
    "router_bias_update",
    "Embedding",
    "LMHead",
    "RMSNorm",
    "SwiGLU",
    "ShortConvolution",
    "causal_depthwise_conv",
    "apply_rope",
    "rms_norm",
    "swiglu_hidden_size",
    # image models
    "UNet",
    "DigitClassifier",
    "train_digit_classifier",
    "digit_classifier",
]
