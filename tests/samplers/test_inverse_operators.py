"""samplers.inverse.operators: the degradations' adjoints, the Fourier-diagonal blurs against
direct convolution, shapes under jit/vmap, noise; operators given by their maps and the
dot-product test of an adjoint; bad input."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jaxlib_ext.samplers import inverse

SHAPE = (12, 10, 3)  # odd-ish, non-square, several channels


def _operators(shape=SHAPE):
    h, w, c = shape
    return {
        "box": inverse.box_inpainting(shape, 5),
        "box_corner": inverse.box_inpainting(shape, (3, 4), corner=(0, 6)),
        "random": inverse.random_inpainting(jax.random.key(0), shape, 0.4),
        "soft_mask": inverse.inpainting(np.linspace(0, 1, h * w * c).reshape(shape)),
        "gaussian": inverse.gaussian_blur(shape, 1.3),
        "gaussian_small_support": inverse.gaussian_blur(shape, 2.0, kernel_size=3),
        "motion": inverse.motion_blur(shape, 5.0, 0.6),
        "downsampling": inverse.downsampling(shape, 2),
    }


@pytest.mark.parametrize("name", list(_operators()))
def test_adjoint_identity_float64(name):
    with jax.enable_x64(True):
        op = _operators()[name]
        kx, ky = jax.random.split(jax.random.key(1))
        x = jax.random.normal(kx, (4, *op.shape_in), jnp.float64)
        y = jax.random.normal(ky, (4, *op.shape_out), jnp.float64)
        ax, aty = op.apply(x), op.adjoint(y)
        assert ax.dtype == jnp.float64 and aty.dtype == jnp.float64
        lhs, rhs = jnp.vdot(ax, y), jnp.vdot(x, aty)
        assert abs(lhs - rhs) <= 1e-12 * (abs(lhs) + 1.0)


@pytest.mark.parametrize("name", list(_operators()))
def test_adjoint_is_the_transpose_of_the_dense_matrix(name):
    with jax.enable_x64(True):
        op = _operators()[name]
        n_in, n_out = int(np.prod(op.shape_in)), int(np.prod(op.shape_out))
        a = jax.vmap(op.apply)(jnp.eye(n_in).reshape(n_in, *op.shape_in)).reshape(n_in, n_out)
        at = jax.vmap(op.adjoint)(jnp.eye(n_out).reshape(n_out, *op.shape_out))
        np.testing.assert_allclose(np.asarray(at).reshape(n_out, n_in), np.asarray(a).T,
                                   atol=1e-13)


def _periodic_convolution(x, kernel):
    """Direct sum_{p} k[p] x[i - p] with wrap-around, per channel, float64 numpy."""
    out = np.zeros_like(x)
    for p, q in zip(*np.nonzero(kernel)):
        out += kernel[p, q] * np.roll(x, (p, q), axis=(0, 1))
    return out


def _gaussian_kernel(h, w, sigma, size):
    off = lambda n: np.where(np.arange(n) <= n // 2, np.arange(n), np.arange(n) - n)
    di, dj = off(h)[:, None], off(w)[None, :]
    k = np.exp(-(di**2 + dj**2) / (2 * sigma**2)) * (
        (np.abs(di) <= size // 2) & (np.abs(dj) <= size // 2)
    )
    return k / k.sum()


@pytest.mark.parametrize("sigma, size", [(1.3, None), (2.0, 3), (0.7, 5)])
def test_gaussian_blur_matches_direct_convolution(sigma, size):
    h, w, c = SHAPE
    with jax.enable_x64(True):
        op = inverse.gaussian_blur(SHAPE, sigma, kernel_size=size)
        assert op.basis == "fourier" and op.diagonal.shape == (h, w)
        x = np.random.default_rng(0).normal(size=SHAPE)
        size = size or 2 * int(np.ceil(3 * sigma)) + 1
        ref = _periodic_convolution(x, _gaussian_kernel(h, w, sigma, size))
        np.testing.assert_allclose(np.asarray(op.apply(x)), ref, atol=1e-12)
        # symmetric kernel: real transfer function, self-adjoint, preserves the mean
        np.testing.assert_allclose(np.asarray(op.diagonal.imag), 0.0, atol=1e-12)
        np.testing.assert_allclose(np.asarray(op.apply(x)).mean(), x.mean(), atol=1e-12)


def test_motion_blur_is_a_normalised_symmetric_convolution():
    h, w, c = SHAPE
    with jax.enable_x64(True):
        op = inverse.motion_blur(SHAPE, 4.0, 0.0)
        kernel = np.asarray(op.apply(np.eye(1, h * w).reshape(h, w, 1).repeat(c, -1)))[..., 0]
        assert abs(kernel.sum() - 1) < 1e-12 and kernel.min() >= -1e-15
        # horizontal segment of length 4: support on row 0 only, columns within +-2
        rows, cols = np.nonzero(kernel > 1e-12)
        assert set(rows) == {0} and set(((cols + w // 2) % w) - w // 2) <= {-2, -1, 0, 1, 2}
        x = np.random.default_rng(1).normal(size=SHAPE)
        np.testing.assert_allclose(np.asarray(op.apply(x)), _periodic_convolution(x, kernel),
                                   atol=1e-12)
        np.testing.assert_allclose(np.asarray(op.diagonal.imag), 0.0, atol=1e-12)


def test_pixel_and_fourier_diagonals_act_in_their_basis():
    with jax.enable_x64(True):
        x = jax.random.normal(jax.random.key(2), SHAPE, jnp.float64)
        box = inverse.box_inpainting(SHAPE, 4)
        np.testing.assert_array_equal(box.apply(x), box.diagonal * x)
        assert box.diagonal.shape == SHAPE and float(box.diagonal.sum()) == (120 - 16) * 3
        blur = inverse.gaussian_blur(SHAPE, 1.0)
        u = inverse.fourier_transform(x)
        np.testing.assert_allclose(inverse.fourier_transform(blur.apply(x)),
                                   blur.diagonal[..., None] * u, atol=1e-12)
        # orthonormal transform: norms preserved, exact inverse
        np.testing.assert_allclose(jnp.linalg.norm(u), jnp.linalg.norm(x), rtol=1e-12)
        np.testing.assert_allclose(inverse.inverse_fourier_transform(u).real, x, atol=1e-12)
        # gram diagonal of A^T A
        np.testing.assert_allclose(
            inverse.fourier_transform(blur.adjoint(blur.apply(x))),
            blur.gram_diagonal()[..., None] * u, atol=1e-12)
        assert inverse.downsampling(SHAPE, 2).gram_diagonal() is None


def test_downsampling_averages_blocks_and_aat_is_scaled_identity():
    op = inverse.downsampling((4, 6, 1), 2)
    x = jnp.arange(24.0).reshape(4, 6, 1)
    y = op.apply(x)
    assert y.shape == (2, 3, 1)
    np.testing.assert_allclose(y[0, 0, 0], (0 + 1 + 6 + 7) / 4)
    z = jax.random.normal(jax.random.key(3), (2, 3, 1))
    np.testing.assert_allclose(op.apply(op.adjoint(z)), z / 4, atol=1e-6)


def test_batches_jit_vmap_grad_and_operator_as_argument():
    ops = _operators()
    x = jax.random.normal(jax.random.key(4), (2, 5, *SHAPE))  # two leading axes
    for op in ops.values():
        y = jax.jit(lambda o, v: o.apply(v))(op, x)  # the operator is a pytree
        assert y.shape == (2, 5, *op.shape_out) and y.dtype == jnp.float32
        np.testing.assert_allclose(jax.vmap(op.apply)(x[0]), op.apply(x[0]), atol=1e-5)
        # grad of 1/2 ||A x - y||^2 is A^T (A x - y)
        target = y[0, 0]
        g = jax.grad(lambda v, o=op, t=target: 0.5 * jnp.sum((o.apply(v) - t) ** 2))(x[0, 0])
        np.testing.assert_allclose(g, op.adjoint(op.apply(x[0, 0]) - target), atol=1e-5)


def test_measure_adds_gaussian_noise_of_the_stated_level():
    op = inverse.gaussian_blur((28, 28, 1), 1.0)
    x = jnp.zeros((64, 28, 28, 1))
    y = inverse.measure(jax.random.key(5), op, x, 0.1)
    assert y.shape == x.shape
    assert abs(float(jnp.std(y)) - 0.1) < 0.005
    np.testing.assert_array_equal(inverse.measure(jax.random.key(5), op, x + 1, 0.0),
                                  op.apply(x + 1))
    per_image = inverse.measure(jax.random.key(6), op, x[:2],
                                jnp.array([0.0, 1.0])[:, None, None, None])
    assert float(jnp.abs(per_image[0]).max()) < 1e-6 and float(jnp.std(per_image[1])) > 0.8
    jitted = jax.jit(inverse.measure, static_argnums=())(jax.random.key(5), op, x, 0.1)
    np.testing.assert_allclose(jitted, y, atol=1e-6)


def test_random_mask_fraction_and_channels():
    op = inverse.random_inpainting(jax.random.key(7), (64, 64, 3), 0.7)
    d = np.asarray(op.diagonal)
    assert set(np.unique(d)) == {0.0, 1.0}
    assert abs((d == 0).mean() - 0.7) < 0.03
    np.testing.assert_array_equal(d[..., 0], d[..., 2])  # a pixel is missing in every channel


def test_operator_of_maps_applies_them_and_passes_the_adjoint_test():
    a = jax.random.normal(jax.random.key(8), (3, 5))
    op = inverse.linear_operator(lambda x: a @ x, lambda u: a.T @ u, name="matrix")
    x, u = jax.random.normal(jax.random.key(9), (5,)), jax.random.normal(jax.random.key(10), (3,))
    assert op.basis == "none" and op.diagonal is None and op.gram_diagonal() is None
    np.testing.assert_array_equal(op.apply(x), a @ x)
    np.testing.assert_array_equal(op(x), a @ x)
    np.testing.assert_array_equal(op.adjoint(u), a.T @ u)
    inverse.check_adjoint(op, (5,))
    y = inverse.measure(jax.random.key(11), op, x, 0.0)
    np.testing.assert_array_equal(y, a @ x)
    # a jitted function closing over it, and one taking it as an argument (no array leaves)
    np.testing.assert_allclose(jax.jit(lambda v: op.apply(v))(x), a @ x, rtol=1e-6)
    np.testing.assert_allclose(jax.jit(lambda o, v: o.adjoint(v))(op, u), a.T @ u, rtol=1e-6)
    # with trailing shapes it checks its inputs
    checked = inverse.linear_operator(lambda x: a @ x, lambda u: a.T @ u, shape_in=(5,),
                                      shape_out=(3,))
    with pytest.raises(ValueError, match="x: expected shape"):
        checked.apply(jnp.zeros(4))
    with pytest.raises(ValueError, match="y: expected shape"):
        checked.adjoint(jnp.zeros(5))


def test_as_linear_operator_accepts_pairs_and_objects_with_maps():
    a = jax.random.normal(jax.random.key(12), (3, 5))
    blur = inverse.gaussian_blur(SHAPE, 1.0)
    assert inverse.as_linear_operator(blur) is blur

    class Matrix:
        def forward(self, x):
            return a @ x

        def adjoint(self, u):
            return a.T @ u

    x = jax.random.normal(jax.random.key(13), (5,))
    for form in ((lambda v: a @ v, lambda u: a.T @ u), Matrix()):
        op = inverse.as_linear_operator(form)
        assert isinstance(op, inverse.LinearOperator)
        np.testing.assert_array_equal(op.apply(x), a @ x)
    assert inverse.as_linear_operator(Matrix()).name == "Matrix"
    with pytest.raises(TypeError, match="operator"):
        inverse.as_linear_operator(a)
    with pytest.raises(TypeError, match="forward"):
        inverse.linear_operator(a, lambda u: u)


def test_check_adjoint_rejects_a_wrong_adjoint():
    a = jax.random.normal(jax.random.key(14), (3, 5))
    for op in _operators().values():
        inverse.check_adjoint(op, op.shape_in)
    with pytest.raises(ValueError, match="operator: the adjoint is inconsistent"):
        inverse.check_adjoint((lambda x: a @ x, lambda u: 2.0 * a.T @ u), (5,))
    with pytest.raises(ValueError, match="operator: adjoint maps"):
        inverse.check_adjoint((lambda x: a @ x, lambda u: u), (5,))


@pytest.mark.parametrize(
    "build, match",
    [
        (lambda: inverse.gaussian_blur(SHAPE, 0.0), "sigma"),
        (lambda: inverse.gaussian_blur(SHAPE, -1.0), "sigma"),
        (lambda: inverse.gaussian_blur(SHAPE, 1.0, kernel_size=4), "kernel_size"),
        (lambda: inverse.motion_blur(SHAPE, 0.0), "length"),
        (lambda: inverse.box_inpainting(SHAPE, 0), "box_size"),
        (lambda: inverse.box_inpainting(SHAPE, 13), "box_size"),
        (lambda: inverse.box_inpainting(SHAPE, 3, corner=(11, 0)), "corner"),
        (lambda: inverse.random_inpainting(jax.random.key(0), SHAPE, 1.0), "missing_fraction"),
        (lambda: inverse.downsampling(SHAPE, 0), "factor"),
        (lambda: inverse.downsampling(SHAPE, 4), "factor"),
        (lambda: inverse.inpainting(np.ones((12, 9)), SHAPE), "mask"),
        (lambda: inverse.inpainting(np.ones((12, 10, 2)), SHAPE), "mask"),
        (lambda: inverse.inpainting(np.ones(12)), "mask"),
        (lambda: inverse.gaussian_blur((12, 10), 1.0), "shape"),
        (lambda: inverse.measure(jax.random.key(0), inverse.gaussian_blur(SHAPE, 1.0),
                            jnp.zeros(SHAPE), -0.1), "noise_std"),
        (lambda: inverse.box_inpainting(SHAPE, 3).apply(jnp.zeros((2, 12, 10, 1))), "x"),
        (lambda: inverse.gaussian_blur(SHAPE, 1.0).apply(jnp.zeros((10, 12, 3))), "x"),
        (lambda: inverse.downsampling(SHAPE, 2).adjoint(jnp.zeros((12, 10, 3))), "y"),
        (lambda: inverse.linear_operator(lambda x: x, lambda y: y, shape_in=(0, 2)), "shape_in"),
        (lambda: inverse.linear_operator(lambda x: x, lambda y: y, shape_out=3), "shape_out"),
    ],
)
def test_bad_input_names_the_argument(build, match):
    with pytest.raises(ValueError, match=match):
        build()
