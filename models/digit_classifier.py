"""A small convolutional classifier of 28x28 digits, whose penultimate layer is the feature map
of a Fréchet distance between image sets (:func:`jaxlib_ext.samplers.inverse.frechet_distance`,
an FID in the spirit of Heusel et al., arXiv 1706.08500, with this network in place of
Inception).

Conventions:

* **Images** ``x [B, 28, 28, 1]``, channels-last, float, pixel values in ``[0, 1]``
  (``jaxlib_ext.core.images.load_mnist(split)`` as it loads them); **labels** ints ``[B]`` in
  ``0..9``.
* **Architecture** (:class:`DigitClassifier`): 3x3 convolution to 32 channels (``SAME``
  padding), ReLU, 2x2 max pooling (to 14x14); 3x3 convolution to 64 channels, ReLU, 2x2 max
  pooling (to 7x7); flatten (3,136 values); dense to 128, ReLU; dense to 10 logits.
* **Features** (:func:`features`): the 128 ReLU activations of the penultimate dense layer,
  ``[B, 128]``, non-negative; :func:`logits` maps them through the last dense layer.
* **Training** (:func:`train_digit_classifier`): softmax cross-entropy with the integer labels,
  Adam (Kingma & Ba, arXiv 1412.6980) at a learning rate that warms up linearly from 0 over
  ``min(50, steps // 10 + 1)`` steps and decays on a cosine to a tenth of its peak at the last
  step (:class:`~jaxlib_ext.core.schedule.WarmupCosine`); step ``i`` draws ``batch_size``
  digits uniformly with replacement from ``fold_in(key, i)``. It runs on the training-loop
  engine (:func:`jaxlib_ext.core.loop.run_loop`: a progress bar, metrics rows, a stop on a
  non-finite loss).
* **Checkpoints** (:func:`save`, :func:`load`): an Orbax checkpoint
  (:class:`~jaxlib_ext.core.checkpoint.Checkpointer`) of the parameters in a folder, with the
  training record as its JSON metadata; :func:`load_or_train` reuses the checkpoint of a folder
  when it records the same training run (recipe, key and data) and trains into the folder
  otherwise, so a benchmark can cache the classifier.
"""

from __future__ import annotations

import hashlib
import pathlib
import shutil
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from jaxlib_ext.core.schedule import WarmupCosine

__all__ = [
    "ARCHITECTURE",
    "DEFAULT_STEPS",
    "DEFAULT_BATCH_SIZE",
    "DEFAULT_LEARNING_RATE",
    "DigitClassifier",
    "features",
    "logits",
    "accuracy",
    "train_digit_classifier",
    "save",
    "load",
    "load_or_train",
]

IMAGE_SHAPE = (28, 28, 1)
NUM_CLASSES = 10
#: the layer widths of :class:`DigitClassifier`, recorded in every checkpoint.
ARCHITECTURE = {"conv_channels": [32, 64], "features": 128, "classes": NUM_CLASSES}
#: optimizer steps of :func:`train_digit_classifier` and :func:`load_or_train` by default.
DEFAULT_STEPS = 300
#: digits per optimizer step by default.
DEFAULT_BATCH_SIZE = 128
#: the peak learning rate of Adam by default.
DEFAULT_LEARNING_RATE = 2e-3


# --------------------------------------------------------------------------- network


class DigitClassifier(nnx.Module):
    """The CNN of the module docstring: two 3x3 convolutions (32, 64 channels) with ReLU and
    2x2 max pooling, a 128-wide ReLU dense layer (the features) and a 10-way linear head.

    Use it through :func:`features` and :func:`logits`, which check the input shape.

    Args:
      rngs: the parameter initialisation keys (Flax's default initialisers: LeCun normal
        kernels, zero biases).
    """

    def __init__(self, *, rngs: nnx.Rngs):
        c1, c2 = ARCHITECTURE["conv_channels"]
        width = ARCHITECTURE["features"]
        self.conv1 = nnx.Conv(IMAGE_SHAPE[-1], c1, (3, 3), padding="SAME", rngs=rngs)
        self.conv2 = nnx.Conv(c1, c2, (3, 3), padding="SAME", rngs=rngs)
        side = IMAGE_SHAPE[0] // 4
        self.hidden = nnx.Linear(side * side * c2, width, rngs=rngs)
        self.head = nnx.Linear(width, NUM_CLASSES, rngs=rngs)

    def embed(self, x: jax.Array) -> jax.Array:
        """The penultimate ReLU activations ``[B, 128]`` of images ``[B, 28, 28, 1]``."""
        h = _max_pool_2x2(jax.nn.relu(self.conv1(x)))
        h = _max_pool_2x2(jax.nn.relu(self.conv2(h)))
        return jax.nn.relu(self.hidden(h.reshape(h.shape[0], -1)))

    def __call__(self, x: jax.Array) -> jax.Array:
        """The logits ``[B, 10]`` of images ``[B, 28, 28, 1]``."""
        return self.head(self.embed(x))


def _max_pool_2x2(h: jax.Array) -> jax.Array:
    """2x2 max pooling with stride 2 of ``[B, H, W, C]`` (``H``, ``W`` even), as a reshape and a
    max (whose gradient XLA's CPU backend runs faster than that of a windowed reduction)."""
    b, height, width, c = h.shape
    return h.reshape(b, height // 2, 2, width // 2, 2, c).max(axis=(2, 4))


def _init(key: jax.Array) -> DigitClassifier:
    """A freshly initialised classifier, its parameters drawn in one compiled program (eager
    initialisation compiles one program per kernel shape)."""
    abstract = nnx.eval_shape(lambda: DigitClassifier(rngs=nnx.Rngs(0)))
    graphdef, _ = nnx.split(abstract)
    state = jax.jit(lambda k: nnx.split(DigitClassifier(rngs=nnx.Rngs(params=k)))[1])(key)
    return nnx.merge(graphdef, state)


# --------------------------------------------------------------------------- public functions


def _check_images(x, arg: str = "x") -> jax.Array:
    x = jnp.asarray(x)
    if x.ndim != 4 or tuple(x.shape[1:]) != IMAGE_SHAPE:
        raise ValueError(f"{arg}: expected images [B, 28, 28, 1], got shape {tuple(x.shape)}")
    if not jnp.issubdtype(x.dtype, jnp.floating):
        raise ValueError(f"{arg}: expected floating images in [0, 1], got dtype {x.dtype}")
    return x


def features(model: DigitClassifier, x: jax.Array) -> jax.Array:
    """The classifier's features of images: the 128 ReLU activations of its penultimate layer.

    Pure and jit-able (``nnx.jit(features)(model, x)``).

    Args:
      model: the classifier.
      x: ``[B, 28, 28, 1]`` float images in ``[0, 1]``.

    Returns:
      ``[B, 128]`` non-negative features.

    Raises:
      ValueError: if ``x`` is not ``[B, 28, 28, 1]`` floating.
    """
    return model.embed(_check_images(x))


def logits(model: DigitClassifier, x: jax.Array) -> jax.Array:
    """The classifier's class logits of images.

    Pure and jit-able (``nnx.jit(logits)(model, x)``).

    Args:
      model: the classifier.
      x: ``[B, 28, 28, 1]`` float images in ``[0, 1]``.

    Returns:
      ``[B, 10]`` logits (unnormalised log-probabilities of the digits 0..9).

    Raises:
      ValueError: if ``x`` is not ``[B, 28, 28, 1]`` floating.
    """
    return model(_check_images(x))


def _check_labels(labels, n: int) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.shape != (n,) or not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels: expected {n} integer labels [{n}], got shape "
                         f"{labels.shape} of {labels.dtype}")
    if n and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
        raise ValueError(f"labels: expected classes in 0..{NUM_CLASSES - 1}, got "
                         f"{labels.min()}..{labels.max()}")
    return labels.astype(np.int32)


@nnx.jit
def _predict(model: DigitClassifier, x: jax.Array) -> jax.Array:
    return jnp.argmax(model(x), axis=-1)


def accuracy(model: DigitClassifier, images, labels, *, batch_size: int = 500) -> float:
    """The fraction of ``images`` whose most likely class is their label.

    Args:
      model: the classifier.
      images: ``[N, 28, 28, 1]`` float images in ``[0, 1]``, ``N >= 1``.
      labels: ``[N]`` integer labels in ``0..9``.
      batch_size: images per forward pass, a positive int.

    Returns:
      The accuracy in ``[0, 1]``.

    Raises:
      ValueError: if ``images`` or ``labels`` has the wrong shape, ``labels`` a class outside
        ``0..9``, or ``batch_size`` is not a positive int.
    """
    images = np.asarray(_check_images(images, "images"))
    if images.shape[0] < 1:
        raise ValueError("images: expected at least one image, got 0")
    labels = _check_labels(labels, images.shape[0])
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected a positive int, got {batch_size!r}")
    correct = 0
    for i in range(0, len(images), batch_size):
        pred = _predict(model, jnp.asarray(images[i:i + batch_size]))
        correct += int(np.sum(np.asarray(pred) == labels[i:i + batch_size]))
    return correct / len(images)


# --------------------------------------------------------------------------- training


def _schedule(learning_rate: float, steps: int) -> WarmupCosine:
    warmup = min(50, steps // 10 + 1)
    # a one-step run has warmup == steps: its single step gets lr(0) = 0 on either curve
    return WarmupCosine(float(learning_rate), warmup, max(steps, warmup + 1),
                        0.1 * float(learning_rate))


def _fingerprint(images: np.ndarray, labels: np.ndarray) -> str:
    """A SHA-256 of the training digits and labels (what a cached classifier was fit to)."""
    h = hashlib.sha256()
    h.update(np.ascontiguousarray(images, np.float32).tobytes())
    h.update(np.ascontiguousarray(labels, np.int32).tobytes())
    return h.hexdigest()


def _check_positive_int(name: str, v) -> int:
    if isinstance(v, bool) or not isinstance(v, int | np.integer) or v < 1:
        raise ValueError(f"{name}: expected a positive int, got {v!r}")
    return int(v)


def train_digit_classifier(key: jax.Array, images, labels, *, steps: int = DEFAULT_STEPS,
                           batch_size: int = DEFAULT_BATCH_SIZE,
                           learning_rate: float = DEFAULT_LEARNING_RATE,
                           progress: bool = True, log_every: int = 50
                           ) -> tuple[DigitClassifier, dict]:
    """Initialise a :class:`DigitClassifier` and train it on labelled digits.

    The recipe of the module docstring: softmax cross-entropy, Adam with a linear warm-up and
    a cosine decay to ``learning_rate / 10``, ``batch_size`` digits drawn uniformly with
    replacement at each step, on :func:`jaxlib_ext.core.loop.run_loop` (a tqdm bar, metrics
    rows every ``log_every`` steps and at the last,
    :class:`~jaxlib_ext.core.loop.NonFiniteLossError` on a NaN or Inf loss). The run is a pure
    function of ``key`` and the data.

    Args:
      key: a PRNG key; its first split initialises the parameters, its second draws the
        batches.
      images: ``[N, 28, 28, 1]`` float training images in ``[0, 1]``, ``N >= 1``.
      labels: ``[N]`` integer labels in ``0..9``.
      steps: optimizer steps, a positive int.
      batch_size: digits per step, a positive int.
      learning_rate: Adam's peak learning rate, a finite number ``> 0``.
      progress: whether to show the progress bar.
      log_every: steps between metrics rows, a positive int.

    Returns:
      ``(model, info)``: ``info`` is the JSON-ready record of the run: ``architecture``,
      ``steps``, ``batch_size``, ``learning_rate``, ``key`` (the key's data as a list),
      ``train_images`` (``N``), ``data`` (a SHA-256 of the images and labels), ``seconds``
      (wall time of initialisation and training) and ``log`` (the metrics rows ``{"step",
      "loss", "accuracy", "images_per_s"}``, ``accuracy`` that of the step's batch).

    Raises:
      ValueError: if ``images`` or ``labels`` has the wrong shape, ``labels`` a class outside
        ``0..9``, or a count or ``learning_rate`` is out of range.
      NonFiniteLossError: on a NaN or Inf loss.
    """
    from jaxlib_ext.core import loop

    images = np.asarray(_check_images(images, "images"), np.float32)
    if images.shape[0] < 1:
        raise ValueError("images: expected at least one image, got 0")
    labels = _check_labels(labels, images.shape[0])
    steps = _check_positive_int("steps", steps)
    batch_size = _check_positive_int("batch_size", batch_size)
    log_every = _check_positive_int("log_every", log_every)
    if isinstance(learning_rate, bool) or not (
            isinstance(learning_rate, int | float | np.integer | np.floating)
            and np.isfinite(learning_rate)
            and learning_rate > 0):
        raise ValueError(f"learning_rate: expected a finite number > 0, got {learning_rate!r}")

    t0 = time.perf_counter()
    k_init, k_data = jax.random.split(key)
    model = _init(k_init)
    graphdef, params = nnx.split(model)
    schedule = _schedule(learning_rate, steps)
    opt = optax.adam(schedule.to_optax())
    pure = nnx.to_pure_dict(params)
    x_all, y_all = jnp.asarray(images), jnp.asarray(labels)

    @jax.jit
    def draw(x, y, k):
        idx = jax.random.randint(k, (batch_size,), 0, x.shape[0])
        return x[idx], y[idx]

    @jax.jit
    def step(state, batch):
        p, opt_state = state
        x, y = batch

        def loss_fn(p):
            out = nnx.merge(graphdef, p)(x)
            loss = optax.softmax_cross_entropy_with_integer_labels(out, y).mean()
            return loss, jnp.mean(jnp.argmax(out, -1) == y)

        (loss, acc), grads = jax.value_and_grad(loss_fn, has_aux=True)(p)
        updates, opt_state = opt.update(grads, opt_state, p)
        return (optax.apply_updates(p, updates), opt_state), {"loss": loss, "accuracy": acc}

    config = loop.LoopConfig(steps=steps, log_every=log_every, progress=progress,
                             desc="digit classifier", items_per_step=batch_size,
                             items_name="images", schedule=schedule)
    result = loop.run_loop(step, (pure, opt.init(pure)),
                           lambda i: draw(x_all, y_all, jax.random.fold_in(k_data, i)), config)
    nnx.replace_by_pure_dict(params, result.state[0])
    model = nnx.merge(graphdef, params)
    info = {"architecture": ARCHITECTURE, "steps": steps, "batch_size": batch_size,
            "learning_rate": float(learning_rate),
            "key": np.asarray(jax.random.key_data(key)).ravel().tolist(),
            "train_images": int(images.shape[0]), "data": _fingerprint(images, labels),
            "seconds": time.perf_counter() - t0, "log": result.history}
    return model, info


# --------------------------------------------------------------------------- checkpoints


def save(path: str | pathlib.Path, model: DigitClassifier, info: dict | None = None) -> None:
    """Writes the classifier's parameters and ``info`` as the checkpoint of folder ``path``.

    Step folders that an earlier save left in ``path`` are replaced.

    Args:
      path: the folder (created when missing).
      model: the classifier.
      info: a JSON-serialisable record saved beside it (:func:`train_digit_classifier`'s
        ``info``); ``architecture`` is added.
    """
    from jaxlib_ext.core.checkpoint import Checkpointer

    path = pathlib.Path(path)
    if path.is_dir():
        for stale in path.iterdir():
            if stale.is_dir() and stale.name.isdigit():
                shutil.rmtree(stale)
    meta = {**(info or {}), "architecture": ARCHITECTURE}
    with Checkpointer(path, max_to_keep=1, async_save=False) as ckpt:
        ckpt.save(int(meta.get("steps", 0)), nnx.to_pure_dict(nnx.state(model)), meta)


def load(path: str | pathlib.Path) -> tuple[DigitClassifier, dict]:
    """The classifier and ``info`` saved in folder ``path`` by :func:`save`.

    Args:
      path: the folder.

    Returns:
      ``(model, info)``.

    Raises:
      FileNotFoundError: if ``path`` is not a folder or holds no checkpoint.
      ValueError: if the checkpoint records another architecture.
    """
    from jaxlib_ext.core.checkpoint import Checkpointer

    path = pathlib.Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"path: no checkpoint folder at {path}")
    with Checkpointer(path, read_only=True) as ckpt:
        if ckpt.latest_step() is None:
            raise FileNotFoundError(f"path: no checkpoint in {path}")
        meta = ckpt.restore_meta()
        if meta.get("architecture") != ARCHITECTURE:
            raise ValueError(f"path: {path} holds another architecture "
                             f"({meta.get('architecture')}), not {ARCHITECTURE}")
        abstract = nnx.eval_shape(lambda: DigitClassifier(rngs=nnx.Rngs(0)))
        graphdef, state = nnx.split(abstract)
        device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
        target = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=device),
                              nnx.to_pure_dict(state))
        restored, meta = ckpt.restore(None, target)
    nnx.replace_by_pure_dict(state, restored)
    return nnx.merge(graphdef, state), meta


def load_or_train(path: str | pathlib.Path, images=None, labels=None, *, seed: int = 0,
                  steps: int = DEFAULT_STEPS, batch_size: int = DEFAULT_BATCH_SIZE,
                  learning_rate: float = DEFAULT_LEARNING_RATE, progress: bool = True
                  ) -> tuple[DigitClassifier, dict]:
    """The classifier cached in folder ``path``, training and saving it there first when needed.

    A checkpoint recording the same training run (``steps``, ``batch_size``,
    ``learning_rate``, the key of ``seed`` and the same data) is loaded as is; an empty or
    missing ``path`` is trained into (:func:`train_digit_classifier` with
    ``jax.random.key(seed)``, then :func:`save`).

    Args:
      path: the cache folder.
      images: ``[N, 28, 28, 1]`` training images in ``[0, 1]``; default the whole MNIST train
        split (``jaxlib_ext.core.images.load_mnist("train")``), with its labels.
      labels: ``[N]`` labels of ``images``; given exactly when ``images`` is.
      seed: the seed of the key.
      steps: optimizer steps.
      batch_size: digits per step.
      learning_rate: Adam's peak learning rate.
      progress: whether to show the progress bar when training.

    Returns:
      ``(model, info)`` as :func:`train_digit_classifier` (``info`` also has ``seed``).

    Raises:
      ValueError: if ``path`` holds a checkpoint of another run, only one of ``images`` and
        ``labels`` is given, or as :func:`train_digit_classifier`.
    """
    from jaxlib_ext.core.checkpoint import Checkpointer

    if (images is None) != (labels is None):
        raise ValueError("labels: give images and labels together, or neither")
    if images is None:
        from jaxlib_ext.core.images import load_mnist

        train = load_mnist("train")
        images, labels = train.images, train.labels
    key = jax.random.key(seed)
    want = {"steps": steps, "batch_size": batch_size, "learning_rate": float(learning_rate),
            "key": np.asarray(jax.random.key_data(key)).ravel().tolist(),
            "data": _fingerprint(np.asarray(images), np.asarray(labels)),
            "architecture": ARCHITECTURE}
    path = pathlib.Path(path)
    if path.is_dir():
        with Checkpointer(path, read_only=True) as ckpt:
            cached = ckpt.latest_step() is not None
        if cached:
            model, meta = load(path)
            got = {k: meta.get(k) for k in want}
            if got != want:
                differ = sorted(k for k in want if got[k] != want[k])
                raise ValueError(f"path: {path} holds a classifier of another run (it differs "
                                 f"in {', '.join(differ)}); pass another path")
            return model, meta
    model, info = train_digit_classifier(key, images, labels, steps=steps,
                                         batch_size=batch_size, learning_rate=learning_rate,
                                         progress=progress)
    info["seed"] = seed
    save(path, model, info)
    return model, info
