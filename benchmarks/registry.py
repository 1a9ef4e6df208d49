"""Which benchmark scripts measure which method: one entry per row of the README's method
table (keyed by the start of the row's first cell), each a tuple of modules of this package,
run as ``python -m benchmarks.<name>``. ``tests/test_benchmarks.py`` checks that every script is
registered, that every registered script exists, and that the README's benchmark column names
exactly these scripts."""

from __future__ import annotations

SCRIPTS: dict[str, tuple[str, ...]] = {
    "FOAM": ("optim_foam_smet_memory", "optim_foam_smet_training"),
    "SMET": ("optim_foam_smet_memory", "optim_foam_smet_training"),
    "POET-X": ("kernels_poet", "optim_poet_x"),
    "Momentum DeltaNet": ("kernels_mdn", "kernels_mdn_gpu", "models_mdn", "models_mdn_mqar"),
    "Gated DeltaNet": ("kernels_mdn", "models_mdn"),
    "LatentMoE": ("models_latent_moe_dispatch", "models_latent_moe", "kernels_moe_gpu"),
    "Orthogonal growth": ("models_latent_moe",),
    "Pseudo-Mallows": ("samplers_pseudo_mallows", "samplers_pseudo_mallows_large_n"),
    "SOSMC": ("samplers_sosmc",),
    "mLSTM cell": ("kernels_mlstm",),
    "Llama teacher": ("models_distill",),
    "xLSTM students": ("models_xlstm_decode", "models_distill"),
    "Langevin MILP": ("samplers_milp",),
    "Image pieces": ("samplers_mclc",),
    "Normalized energy prior": ("samplers_energy",),
    "MCLC": ("samplers_mclc",),
}

#: scripts that measure the library's own machinery rather than a method
LIBRARY_SCRIPTS: tuple[str, ...] = ("runtime_train_step",)


def methods_of(script: str) -> list[str]:
    """The methods (registry keys) a script measures."""
    return [m for m, scripts in SCRIPTS.items() if script in scripts]
