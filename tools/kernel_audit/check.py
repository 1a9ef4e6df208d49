"""Correctness of the Pallas kernels against the recurrence, at any shape, on the device at hand.

``check_against_recurrent`` runs ``momentum_delta_rule_pallas`` (compiled on a GPU, interpreted
on CPU) and the sequential reference ``momentum_delta_rule(..., method="reference")`` from the
same random initial state and compares, by relative RMS error, the outputs, the final state
and, optionally, the gradients of all eight inputs (through a loss that weighs the outputs and
the final state by the reference's own values). Kernel options under test (a tuning candidate's
overrides) pass through to the Pallas op.
"""

import functools

import jax
import jax.numpy as jnp

from jaxlib_ext.pallas_kernels.mdn import momentum_delta_rule

from .mdn_probes import pallas_op

INPUT_NAMES = ("q", "k", "v", "p", "log_alpha", "log_mu", "beta", "eta")


class CheckFailed(Exception):
    """The Pallas op is further from the recurrence than the tolerance (or not finite)."""


def rel_rmse(a, b):
    """||a - b|| / ||b|| in float32 (``b`` the reference)."""
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    return float(jnp.linalg.norm((a - b).ravel()) / jnp.linalg.norm(b.ravel()))


def check_against_recurrent(inputs, K, chunk, interpret, tol, grads, **options):
    """Relative RMS errors of the Pallas op against the recurrence on ``inputs`` (the eight
    sequence inputs), printed on one line with PASS or FAIL; returns the errors
    ``{"o", "final_state"[, "dq", ..., "deta"]}`` or raises ``CheckFailed`` when the largest is
    not below ``tol``. ``options`` (a candidate's) go to ``mdn_probes.pallas_op``."""
    B, T, H, _ = inputs[0].shape
    V = inputs[2].shape[-1]
    s0 = 0.1 * jax.random.normal(jax.random.key(7), (2, B, H, K, V))
    kw = dict(scale=K**-0.5, initial_state=s0, output_final_state=True)
    pallas = functools.partial(
        pallas_op, **{"chunk_size": chunk, "interpret": interpret, **kw, **options}
    )
    ref = functools.partial(momentum_delta_rule, method="reference", **kw)
    with jax.default_matmul_precision("highest"):
        (o, fs), (o_r, fs_r) = pallas(*inputs), ref(*inputs)
        errs = {"o": rel_rmse(o, o_r), "final_state": rel_rmse(fs, fs_r)}
        if grads:
            loss = lambda f: lambda *a: jnp.sum(f(*a)[0].astype(jnp.float32) * o_r) + jnp.sum(
                f(*a)[1] * fs_r
            )
            argn = tuple(range(8))
            g = jax.grad(loss(pallas), argnums=argn)(*inputs)
            g_r = jax.grad(loss(ref), argnums=argn)(*inputs)
            errs.update({f"d{n}": rel_rmse(a, b) for n, a, b in zip(INPUT_NAMES, g, g_r)})
    worst = max(errs.values())
    status = "PASS" if worst < tol and all(e == e for e in errs.values()) else "FAIL"
    print(
        f"check B={B} T={T} H={H} K={K} V={V} {inputs[0].dtype}"
        + "".join(f" {k}={v}" for k, v in options.items())
        + f": {status} (tol {tol:g}) "
        + " ".join(f"{k}={v:.1e}" for k, v in errs.items()),
        flush=True,
    )
    if status != "PASS":
        raise CheckFailed(f"pallas vs recurrent check failed: {errs}")
    return errs
