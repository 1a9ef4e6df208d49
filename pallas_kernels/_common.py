"""Helpers shared by the ops of ``pallas_kernels``.

Validation of public arguments, the compute dtype rule, time padding to a chunk multiple,
log-space segment sums for chunk-local decay matrices, the matmul-only unit-lower-triangular
inverse (the linear-recurrence ops); the varying-axes type of values an op creates inside
``jax.shard_map`` (:func:`like_varying`); and, for every op, the ``"auto"`` rule
(:func:`resolve_auto`), the kernel-config protocol (:class:`KernelConfig`), Triton block sizes
(:func:`pow2`) and lazy loading of the Pallas kernels.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import jax
import jax.numpy as jnp
import numpy as np

SUPPORTED_CHUNK_SIZES: tuple[int, ...] = (16, 32, 64, 128)

#: The ``method=`` vocabulary of every op (and of LatentMoE's dispatch): ``"reference"``, the
#: plain readable path that follows the paper's equations (a ``lax.scan`` recurrence, a loop over
#: groups, a dense matrix); ``"xla"``, the op's XLA fast path (an op with several XLA forms takes
#: the form as its own argument); ``"pallas"``, the Pallas kernels; ``"auto"``,
#: :func:`resolve_auto`. An op may offer a subset (its own ``METHODS``, checked by
#: :func:`check_method`).
METHODS: tuple[str, ...] = ("auto", "reference", "xla", "pallas")


# --------------------------------------------------------------------------- validation


def check_array(name: str, x, ndim: int, layout: str):
    """Require ``x`` to be an array of floating dtype with ``ndim`` dimensions.

    Raises ValueError naming ``name``, the expected ``layout`` and what was received.
    """
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise ValueError(f"{name} must be an array of shape {layout}, got {type(x).__name__}")
    if x.ndim != ndim:
        raise ValueError(
            f"{name} must have rank {ndim} ({layout}), got rank {x.ndim} with shape "
            f"{tuple(x.shape)}"
        )
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{name} must have a floating dtype, got {x.dtype}")


def check_shape(name: str, x, expected: Sequence[int], layout: str) -> None:
    """Require ``x.shape == expected``; the message spells out the named layout."""
    if tuple(x.shape) != tuple(expected):
        raise ValueError(
            f"{name} must have shape {layout} = {tuple(expected)}, got {tuple(x.shape)}"
        )


def check_token_layout(q, v, keys: dict, gates: dict, state=None, state_layout=None):
    """Checks the shared layout of the linear-attention ops; returns ``(B, T, H, K, V)``.

    ``q`` and every array in ``keys`` are ``[B, T, H, K]``, ``v`` is ``[B, T, H, V]``, every
    array in ``gates`` is ``[B, T, H]``; ``state`` (if given) has ``state_layout``, a tuple of
    axis names over ``{"2", "B", "H", "K", "V"}``.
    """
    check_array("q", q, 4, "[B, T, H, K]")
    B, T, H, K = q.shape
    for name, x in keys.items():
        check_array(name, x, 4, "[B, T, H, K]")
        check_shape(name, x, (B, T, H, K), "[B, T, H, K]")
    check_array("v", v, 4, "[B, T, H, V]")
    if tuple(v.shape[:3]) != (B, T, H):
        raise ValueError(
            f"v must have shape [B, T, H, V] with (B, T, H) = {(B, T, H)} from q, "
            f"got {tuple(v.shape)}"
        )
    V = v.shape[3]
    for name, x in gates.items():
        check_array(name, x, 3, "[B, T, H]")
        check_shape(name, x, (B, T, H), "[B, T, H]")
    if state is not None:
        sizes = {"2": 2, "B": B, "H": H, "K": K, "V": V}
        layout = "[" + ", ".join(state_layout) + "]"
        check_array("initial_state", state, len(state_layout), layout)
        check_shape("initial_state", state, tuple(sizes[a] for a in state_layout), layout)
    return B, T, H, K, V


def is_concrete(x) -> bool:
    """True when ``x`` holds values now (not a tracer inside jit/grad/vmap)."""
    return not isinstance(x, jax.core.Tracer)


def check_nonnegative(name: str, x) -> None:
    """Raise ValueError if a *concrete* ``x`` has negative entries; tracers pass unchecked."""
    if not is_concrete(x):
        return
    values = np.asarray(x)
    if values.size and bool(np.any(values < 0)):
        raise ValueError(f"{name} must be >= 0 everywhere, got minimum {float(values.min())}")


def check_chunk_size(chunk_size) -> int | None:
    """``chunk_size`` is ``None`` (the op's default, :func:`default_chunk_size`) or one of
    :data:`SUPPORTED_CHUNK_SIZES`."""
    if chunk_size is None:
        return None
    if isinstance(chunk_size, bool) or not isinstance(chunk_size, (int, np.integer)):
        raise ValueError(f"chunk_size must be one of {SUPPORTED_CHUNK_SIZES}, got {chunk_size!r}")
    if int(chunk_size) not in SUPPORTED_CHUNK_SIZES:
        raise ValueError(f"chunk_size must be one of {SUPPORTED_CHUNK_SIZES}, got {chunk_size}")
    return int(chunk_size)


def default_chunk_size(method: str, dtype, head_dim: int) -> int:
    """The chunk length an op uses when its caller gives none: 64, except 32 for the compiled
    Pallas kernels with float32 inputs and ``head_dim`` padded past 64, where the fused backward
    kernel would not fit a Hopper SM's shared memory at 64 (float32 dots run as 3xTF32 there)."""
    padded = 1 << max(head_dim - 1, 0).bit_length()
    compiled_pallas = method == "pallas" and jax.default_backend() != "cpu"
    if compiled_pallas and jnp.dtype(dtype) == jnp.float32 and padded > 64:
        return 32
    return 64


def check_method(method, offered: Sequence[str] = METHODS, *, op: str = "this op") -> str:
    """Require ``method`` to be one of ``offered``, a subset of :data:`METHODS`.

    Args:
      method: the op's ``method`` argument.
      offered: the methods the op offers, in the order of :data:`METHODS`.
      op: the op's name, for the message about a method of :data:`METHODS` it lacks.

    Returns:
      ``method``.

    Raises:
      ValueError: naming ``method``: a value outside :data:`METHODS`, or one the op lacks.
    """
    if isinstance(method, str) and method in METHODS and method not in offered:
        raise ValueError(
            f"method {method!r} is not offered by {op}; method must be one of {tuple(offered)}"
        )
    if not isinstance(method, str) or method not in offered:
        raise ValueError(f"method must be one of {tuple(offered)}, got {method!r}")
    return method


def check_form(name: str, form, forms: Sequence[str]) -> str:
    """Require the XLA form ``form`` (the argument ``name``, e.g. ``xla_form``) to be one of
    ``forms``; raises ValueError naming ``name`` otherwise."""
    if not isinstance(form, str) or form not in forms:
        raise ValueError(f"{name} must be one of {tuple(forms)}, got {form!r}")
    return form


def resolve_scale(scale, head_dim: int):
    """``scale`` defaults to ``head_dim ** -0.5``; a Python number must be finite."""
    if scale is None:
        return head_dim**-0.5
    if isinstance(scale, (int, float, np.number)) and not np.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    return scale


def compute_dtype(*arrays) -> jnp.dtype:
    """float64 when any floating input is float64 (x64 enabled), else float32."""
    for a in arrays:
        if a is not None and jnp.dtype(a.dtype) == jnp.float64:
            return jnp.dtype(jnp.float64)
    return jnp.dtype(jnp.float32)


# --------------------------------------------------------------------------- chunk helpers


def pad_time(x: jax.Array, multiple: int, axis: int = 1) -> jax.Array:
    """Zero-pad ``axis`` of ``x`` up to the next multiple of ``multiple``."""
    length = x.shape[axis]
    extra = (-length) % multiple
    if extra == 0:
        return x
    widths = [(0, 0)] * x.ndim
    widths[axis] = (0, extra)
    return jnp.pad(x, widths)


def to_chunks(x: jax.Array, chunk_size: int) -> jax.Array:
    """``[B, T, H, *rest]`` with ``T`` a multiple of ``chunk_size`` -> ``[N, B, H, C, *rest]``.

    Chunk axis first, so the per-chunk quantities are already in ``lax.scan`` layout.
    """
    B, T, H = x.shape[:3]
    x = x.reshape(B, T // chunk_size, chunk_size, H, *x.shape[3:])
    return jnp.transpose(x, (1, 0, 3, 2, *range(4, x.ndim)))


def chunk_inputs(dtype, chunk_size: int, *arrays):
    """Each ``[B, T, H, ...]`` array cast to ``dtype``, time-padded and put in chunk layout."""
    return tuple(
        to_chunks(pad_time(jnp.asarray(x).astype(dtype), chunk_size), chunk_size) for x in arrays
    )


def from_chunks(o: jax.Array, length: int) -> jax.Array:
    """Scan output ``[N, B, H, C, V]`` -> ``[B, length, H, V]`` (drops the time padding)."""
    N, B, H, C, V = o.shape
    return jnp.transpose(o, (1, 0, 3, 2, 4)).reshape(B, N * C, H, V)[:, :length]


def segsum(x: jax.Array) -> jax.Array:
    """Log-space segment sums of the last axis: ``out[..., i, j] = sum_{s=j+1}^{i} x[..., s]``.

    The diagonal is 0 (empty sum) and the strict upper triangle is ``-inf``, so ``exp(out)``
    is the lower-triangular decay matrix ``prod_{s=j+1}^{i} exp(x_s)``. The sums are built
    without subtracting prefix sums, so ``x = -inf`` entries (a gate of exactly 0) give
    exact zeros instead of ``-inf - (-inf) = nan``.
    """
    n = x.shape[-1]
    rows = jnp.arange(n)[:, None]
    cols = jnp.arange(n)[None, :]
    rep = jnp.broadcast_to(x[..., :, None], (*x.shape, n))  # rep[..., i, j] = x_i
    rep = jnp.where(rows > cols, rep, jnp.zeros((), x.dtype))
    out = jnp.cumsum(rep, axis=-2)
    return jnp.where(rows >= cols, out, jnp.asarray(-jnp.inf, x.dtype))


def unit_lower_inverse(L: jax.Array) -> jax.Array:
    """``(I + L)^{-1}`` for strictly lower-triangular ``L`` (``[..., C, C]``), by matmuls only.

    Recursive block inversion, bottom-up: with the inverses ``X11, X22`` of two neighbouring
    diagonal ``s``-blocks known, the inverse of the ``2s``-block ``[[I + L11, 0], [L21, I + L22]]``
    is ``[[X11, 0], [-X22 L21 X11, X22]]``. ``log2 C`` levels of batched ``s x s`` matmuls,
    about ``C^3 / 3`` multiply-adds in all, no ``triangular_solve`` (whose batched CPU lowering is
    erratically slow for wide right-hand sides) and plain matmul gradients. ``C`` is zero-padded
    to a power of two (an identity block is appended) when needed.
    """
    C = L.shape[-1]
    batch = L.shape[:-2]
    P = 1 << max(C - 1, 0).bit_length()
    if P != C:
        L = jnp.pad(L, [(0, 0)] * len(batch) + [(0, P - C), (0, P - C)])
    X = jnp.ones((*batch, P, 1, 1), L.dtype)  # inverses of the 1 x 1 diagonal blocks
    s = 1
    while s < P:
        n = P // (2 * s)
        blocks = L.reshape(*batch, n, 2 * s, n, 2 * s)
        blocks = jnp.moveaxis(jnp.diagonal(blocks, axis1=-4, axis2=-2), -1, -3)  # [.., n, 2s, 2s]
        L21 = blocks[..., s:, :s]
        X11, X22 = X[..., 0::2, :, :], X[..., 1::2, :, :]
        X21 = -(X22 @ L21 @ X11)
        top = jnp.concatenate([X11, jnp.zeros_like(X11)], axis=-1)
        bottom = jnp.concatenate([X21, X22], axis=-1)
        X = jnp.concatenate([top, bottom], axis=-2)  # [.., n, 2s, 2s]
        s *= 2
    return X[..., 0, :C, :C]


# --------------------------------------------------------------------------- shard_map types


def varying_axes(*refs) -> frozenset:
    """The manual mesh axes that some array leaf of ``refs`` varies over (``jax.shard_map``'s
    varying-axes type, ``jax.typeof(x).mat.varying``); empty outside ``shard_map``."""
    axes = frozenset()
    for leaf in jax.tree.leaves(refs):
        axes |= jax.typeof(leaf).mat.varying
    return axes


def like_varying(x, *refs):
    """``x`` typed as varying over every manual mesh axis that some leaf of ``refs`` varies over.

    Under ``jax.shard_map`` (``check_vma=True``) a value an op creates itself (a zero initial
    state, an output buffer, a replicated weight next to sharded activations) is invariant,
    while a ``lax.scan`` carry must keep its type through the body, a custom VJP's cotangents
    must have the types of its inputs and a ``pallas_call`` must be told the type of each output.
    Each array leaf of ``x`` gets the axes it lacks by ``jax.lax.pcast(..., to="varying")``,
    whose transpose sums the cotangent over them (the gradient of a replicated input); each
    ``jax.ShapeDtypeStruct`` leaf gets the union as its ``manual_axis_type``. Outside
    ``shard_map`` ``x`` comes back unchanged.

    Args:
      x: a pytree of arrays and ``jax.ShapeDtypeStruct`` s.
      refs: arrays (or pytrees of them; ``None`` leaves are skipped) whose axes ``x`` takes.

    Returns:
      ``x`` with the same values, shapes and dtypes.
    """
    mesh_axes = jax.sharding.get_abstract_mesh().manual_axes
    if not mesh_axes:
        return x
    axes = varying_axes(*refs)

    def cast(leaf):
        if isinstance(leaf, jax.ShapeDtypeStruct):
            own = leaf.manual_axis_type.varying if leaf.manual_axis_type is not None else ()
            return jax.ShapeDtypeStruct(
                leaf.shape, leaf.dtype, sharding=leaf.sharding, weak_type=leaf.weak_type,
                manual_axis_type=jax.sharding.ManualAxisType(varying=axes | frozenset(own)),
            )  # fmt: skip
        missing = axes - jax.typeof(leaf).mat.varying
        if not missing:
            return leaf
        return jax.lax.pcast(leaf, tuple(a for a in mesh_axes if a in missing), to="varying")

    return jax.tree.map(cast, x)


def run_interpreted(call, *args):
    """``call(*args)`` for a ``call`` that runs Pallas kernels in interpret mode, also inside
    ``jax.shard_map``.

    The Pallas interpreter (the HLO interpreter of JAX 0.12) cannot trace a kernel whose
    operands vary over manual mesh axes: it mixes their blocks with invariant grid indices,
    which ``check_vma=True`` rejects. So where some operand varies, every operand is gathered
    over those axes (``jax.lax.all_gather(..., to="invarying")``), ``call`` runs vmapped over
    the devices' operands and each device keeps its own slice (``jax.lax.axis_index``): the
    same values, with the work of every device on each, which is what an interpreter (a
    testing and debugging aid) may spend. Compiled kernels never take this path. Outside
    ``shard_map``, or with invariant operands, it is ``call(*args)``.

    Args:
      call: positional arrays in, a pytree of arrays out.
      args: the operands.

    Returns:
      ``call(*args)``, varying over the operands' manual axes.
    """
    axes = varying_axes(*args)
    if not axes:
        return call(*args)
    names = tuple(a for a in jax.sharding.get_abstract_mesh().manual_axes if a in axes)
    gathered = [
        jax.lax.all_gather(x, names, to="invarying") for x in like_varying(args, *args)
    ]
    out = jax.vmap(call)(*gathered)
    device = jax.lax.axis_index(names)
    return jax.tree.map(lambda y: jax.lax.dynamic_index_in_dim(y, device, keepdims=False), out)


# --------------------------------------------------------------------------- kernel configs


def pow2(n: int, minimum: int = 16) -> int:
    """The padded size of a block dimension: the next power of two of ``n``, at least
    ``minimum`` (Triton's block dimensions are powers of two of at least 16)."""
    return max(minimum, 1 << (int(n) - 1).bit_length())


def default_interpret() -> bool:
    """Whether a kernel config's ``interpret=None`` means the Pallas interpreter: where the
    default backend is not a GPU (the kernels are written for Pallas' GPU lowerings)."""
    return jax.default_backend() != "gpu"


@runtime_checkable
class KernelConfig(Protocol):
    """The tunables of an op's Pallas kernels (``MDNKernelConfig``, ``GMMKernelConfig``,
    ``PoetKernelConfig``), in the shape of the JAX Pallas ops' ``BlockSizes``.

    A frozen (hashable) dataclass, so it is a static argument of the kernels (one compile per
    distinct config). ``__post_init__`` validates every field it is given and raises
    ``ValueError`` naming the field. Fields that depend on the problem may be ``None``;
    :meth:`default` and :meth:`for_shape` fill them. No field changes the mathematics.

    Attributes:
      interpret: run the kernels in the Pallas interpreter (the way on a CPU); ``None``: where
        the default backend is not a GPU (:func:`default_interpret`), decided by
        :meth:`default` / :meth:`for_shape`.
    """

    interpret: bool | None

    @classmethod
    def default(cls, *shape, **fields) -> KernelConfig:
        """The config for a problem of these sizes (and dtype, where it matters), every field
        set; ``fields`` override the defaults."""
        ...

    def for_shape(self, *shape) -> KernelConfig:
        """This config with every ``None`` field set to its default for the problem."""
        ...


def check_positive_int(name: str, value) -> None:
    """Raise ValueError naming the config field ``name`` unless ``value`` is an int >= 1."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: expected a positive integer, got {value!r}")


def check_interpret(value) -> None:
    """Raise ValueError unless the config field ``interpret`` is a bool or ``None``."""
    if value is not None and not isinstance(value, bool):
        raise ValueError(f"interpret: expected a bool or None, got {value!r}")


# --------------------------------------------------------------------------- dispatch


def load_kernel(module: str, attr: str):
    """Import ``attr`` from ``module`` lazily; ``None`` when the module is not importable."""
    try:
        mod = importlib.import_module(module)
    except ImportError:
        return None
    return getattr(mod, attr, None)


def lazy_attributes(package: str, table: dict[str, str]):
    """A module ``__getattr__`` for ``package`` that imports ``table[name]`` (a module path) on
    the first use of ``name`` and returns its attribute ``name``: the Pallas modules load only
    when asked for."""

    def __getattr__(name):
        if name in table:
            return getattr(importlib.import_module(table[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def resolve_auto(
    method: str, *, kernel: tuple[str, str] | None = None, supported: bool = True
) -> str:
    """The path ``method="auto"`` takes, one rule for every op.

    ``"pallas"`` on a GPU backend when the op has Pallas kernels, ``kernel = (module, name)``
    imports, and the compiled kernels take these operands (``supported``, the op's own
    condition, e.g. no float64 on Triton); otherwise ``"xla"``, the op's XLA fast path.

    Args:
      method: the op's ``method`` argument; anything but ``"auto"`` comes back unchanged.
      kernel: ``(module, attribute)`` of the op's Pallas entry point; ``None`` for an op
        without Pallas kernels.
      supported: whether the compiled kernels run these operands.

    Returns:
      The method to run: ``method``, or for ``"auto"`` one of ``"pallas"`` and ``"xla"``.
    """
    if method != "auto":
        return method
    if (
        kernel is not None
        and supported
        and jax.default_backend() == "gpu"
        and load_kernel(*kernel) is not None
    ):
        return "pallas"
    return "xla"
