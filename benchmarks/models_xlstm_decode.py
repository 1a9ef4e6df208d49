"""Decode speed and memory of xLSTM students vs their Llama teacher at long context.

The claim checked (arXiv 2603.15590): a hybrid mLSTM + sliding-window student decodes with
constant memory and faster than its attention teacher at long context. Models: a Llama of the
SmolLM2-135M shape (30 layers, dim 576, 9 query / 3 key-value heads of 64, SwiGLU 1536,
vocabulary 49152; random weights: decode cost does not depend on their values), its hybrid
student (:func:`jaxlib_ext.models.xlstm.student_from_teacher`, every layer, window 512, 4 sinks)
and its pure-mLSTM student. For each context ``L`` the decode caches are set to hold ``L``
tokens (random keys, values and mLSTM states: the cost of a step does not depend on them, and no
prefill is timed), then one token per step is decoded, batch ``--batch``.

Reported per model and context: the decode cache's bytes
(``jaxlib_ext.core.memory.tree_bytes``), the compiled step's planned peak
(``jaxlib_ext.core.memory.compiled_memory``: parameters + cache + token + outputs + temporaries -
donated), the median step time over ``--steps`` steps after one warm-up
step (cache donated, ``block_until_ready``; the configurations take turns in rounds of 4 steps,
so a load that varies over time on a shared machine falls on all of them alike) and tokens/s =
batch / step time. The teacher's cache is allocated for the context plus the steps (the teacher
reads every slot of its buffer with a mask, so its step cost follows the buffer length).

    .venv/bin/python -m benchmarks.models_xlstm_decode [--contexts 512,2048,8192] [--steps 16]
"""

from __future__ import annotations

import argparse
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from benchmarks._harness import environment, summarize, timed
from jaxlib_ext.core.memory import compiled_memory, tree_bytes
from jaxlib_ext.models import KVCache, LanguageModel, LMCache, lm_config
from jaxlib_ext.models.xlstm import XLSTMCache, XLSTMConfig, student_from_teacher
from jaxlib_ext.pallas_kernels.mlstm import MLSTMState


def filled_cache(model, batch: int, context: int, max_len: int, seed: int = 0) -> LMCache:
    """``model``'s decode cache holding ``context`` tokens of random content."""
    empty = model.init_cache(batch, max_len)
    rng = np.random.default_rng(seed)

    def normal(like, scale=1.0):
        return jnp.asarray(scale * rng.standard_normal(like.shape), like.dtype)

    layers = []
    for c in empty.layers:
        length = jnp.asarray(context, jnp.int32)
        if isinstance(c, KVCache):
            layers.append(KVCache(normal(c.k), normal(c.v), length))
        elif isinstance(c, XLSTMCache):
            state = MLSTMState(normal(c.mlstm.C, 0.01), normal(c.mlstm.n, 0.1), c.mlstm.m)
            parts = [None if a is None else normal(a) for a in
                     (c.sink_k, c.sink_v, c.window_k, c.window_v)]
            layers.append(XLSTMCache(state, *parts, length))
        else:
            raise TypeError(f"unknown cache type {type(c).__name__}")
    return LMCache(tuple(layers), jnp.asarray(context, jnp.int32))


def decode_step(model):
    """A compiled ``(params, token [B, 1], cache) -> (logits, cache)`` with the cache donated."""
    graphdef, state = nnx.split(model)

    def step(state, token, cache):
        return nnx.merge(graphdef, state).decode_step(token, cache)

    return state, jax.jit(step, donate_argnums=(2,))


class Run:
    """One model at one context: its compiled step, parameters, cache and step times."""

    def __init__(self, model, batch: int, context: int, max_len: int, compiled_steps: dict):
        self.state, step = decode_step(model)
        self.cache = filled_cache(model, batch, context, max_len)
        self.token = jnp.zeros((batch, 1), jnp.int32)
        key = (id(model), str(jax.tree.map(lambda x: x.shape, self.cache)))
        if key not in compiled_steps:  # a student's cache has one shape at every context
            compiled_steps[key] = step.lower(self.state, self.token, self.cache).compile()
        self.step = compiled_steps[key]
        self.cache_bytes = tree_bytes(self.cache)
        self.peak_bytes = compiled_memory(self.step).get("peak")
        self.batch = batch
        self.times: list[float] = []
        self.advance(1, record=False)  # warm-up

    def advance(self, steps: int, *, record: bool = True) -> None:
        for _ in range(steps):
            (logits, self.cache), seconds = timed(self.step, self.state, self.token, self.cache)
            if record:
                self.times.append(seconds)
            self.token = jnp.argmax(logits[:, -1:], axis=-1).astype(jnp.int32)

    @property
    def step_s(self) -> float:
        return summarize(self.times).median


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--contexts", default="512,2048,8192")
    ap.add_argument("--steps", type=int, default=16, help="timed steps per configuration")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--sinks", type=int, default=4)
    ap.add_argument("--layers", type=int, default=30,
                    help="number of layers (30: the SmolLM2-135M shape)")
    a = ap.parse_args()
    contexts = [int(c) for c in a.contexts.split(",")]

    rounds = max(1, a.steps // 4)
    max_len = {c: c + 4 * rounds + 2 for c in contexts}  # the contexts, the steps, the warm-up
    cfg = lm_config(None, None, "smollm2-135m", n_layers=a.layers,
                    max_seq_len=max(max_len.values()))
    teacher = LanguageModel(cfg, rngs=nnx.Rngs(0))
    models = {
        "teacher (attention, KV cache)": teacher,
        f"hybrid student (mLSTM + SWA {a.window}, {a.sinks} sinks)": student_from_teacher(
            teacher, XLSTMConfig(window=a.window, n_sinks=a.sinks), rngs=nnx.Rngs(1)),
        "pure mLSTM student": student_from_teacher(
            teacher, XLSTMConfig(mode="mlstm"), rngs=nnx.Rngs(1)),
    }
    runs, compiled_steps = {}, {}
    for name, model in models.items():
        for context in contexts:
            print(f"... compiling {name}, context {context}", file=sys.stderr, flush=True)
            runs[name, context] = Run(model, a.batch, context, max_len[context], compiled_steps)
    # rounds of 4 steps per configuration in turn: a load that varies over time on a shared
    # machine falls on every configuration alike
    for r in range(rounds):
        print(f"... round {r + 1} of {rounds}", file=sys.stderr, flush=True)
        for run in runs.values():
            run.advance(4)

    print(
        f"decode, SmolLM2-135M shape ({a.layers} layers), batch {a.batch}, float32, "
        f"{environment()}, median of {4 * rounds} steps (rounds of 4 steps per "
        f"configuration in turn) after one warm-up step\n"
    )
    print("| model | context | cache (MiB) | step peak (MiB) | ms / step | tokens/s | "
          "tokens/s vs teacher |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    teacher_name = next(iter(models))
    for (name, context), run in runs.items():
        speedup = runs[teacher_name, context].step_s / run.step_s
        peak = run.peak_bytes
        peak_txt = "n/a" if peak is None else f"{peak / 2**20:.1f}"
        print(f"| {name} | {context} | {run.cache_bytes / 2**20:.2f} | {peak_txt} | "
              f"{run.step_s * 1e3:.1f} | {run.batch / run.step_s:.2f} | {speedup:.2f}x |")


if __name__ == "__main__":
    main()
