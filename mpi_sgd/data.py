"""Datasets every rank can build on its own, and the partitioner that hands each rank its share.

A dataset here is two tensors held in memory, ``x`` (N samples of any shape) and ``y`` (class
indices for classification, floats of shape ``(N, 1)`` for regression). Each rank builds the
whole dataset itself: the synthetic ones from the seed alone, the real ones from a file every
host can read. Only sample *indices* are ever split, so no data travels over MPI.

Partitioning (:func:`global_batches`): every epoch, a permutation of ``range(N)`` seeded by
``(seed, epoch)`` (the same on every rank, different each epoch) is cut into ``N // (R*B)``
global batches of ``R*B`` indices; rank ``r`` takes positions ``[r*B, (r+1)*B)`` of each. All
ranks therefore take the same number of equal steps and stay in lockstep. The ``N mod (R*B)``
indices at the end of the permutation are left out of that epoch; since the permutation changes
every epoch, a different handful is left out each time and none is lost for good.

The same cut at ``(R, B)`` and at ``(1, R*B)`` yields the same global batches, which is what
makes synchronous SGD on R ranks comparable sample for sample with one process at batch R*B.

Held-out data (:func:`prepare`): before any of that, a fraction of the samples is set aside for
validation by a permutation seeded by ``seed`` alone, so every rank holds out the same samples,
every epoch. Regression targets are then standardised with the training part's mean and standard
deviation: a loss of 1.0 is what always predicting the mean scores, whatever the units of the
user's targets, and one default learning rate suits every task.

Why one module of over 300 lines: each format's loader knows what its checks must refuse in one line
(exit 2) before any rank communicates, so loading, checking and cutting batches stay together; and
they are one public API (``data.rank_batches``, ``data.Dataset``, ``data.load`` are what recipes and
the docs import): split, users would have to learn which half a name lives in.
"""

from __future__ import annotations

import os
import pickle
import zipfile
from dataclasses import dataclass

import numpy as np
import torch

from .datacache import digits_arrays

__all__ = [
    "BUILTIN",
    "Dataset",
    "blobs",
    "check_size",
    "digits",
    "from_file",
    "global_batches",
    "load",
    "prepare",
    "rank_batches",
    "split",
    "standardize_targets",
    "toy_regression",
]

BUILTIN = ("digits", "blobs", "toy")


@dataclass(frozen=True)
class Dataset:
    """Samples held in memory: ``x`` (N samples of any shape) and ``y``, named ``name``.

    Integer ``y`` of shape ``(N,)`` are class indices (classification, cross-entropy); floating
    ``y`` of shape ``(N, k)`` are regression targets (mean squared error). ``ds.x[idx]`` and
    ``ds.y[idx]`` with the indices of :func:`rank_batches` are one rank's batch.
    """

    x: torch.Tensor
    y: torch.Tensor
    name: str
    classes: int = 0  # classification: the classes of the whole set this was split from (0: read from y)

    @property
    def classification(self) -> bool:
        return not self.y.dtype.is_floating_point

    @property
    def num_outputs(self) -> int:
        if not self.classification:
            return self.y.shape[1]
        return self.classes or int(self.y.max()) + 1

    def __len__(self) -> int:
        return self.x.shape[0]

    def to(self, dtype: torch.dtype, device: torch.device | str = "cpu") -> Dataset:
        """Features (and regression targets) in ``dtype``; class indices stay integers."""
        y = self.y.to(device) if self.classification else self.y.to(device, dtype)
        return Dataset(self.x.to(device, dtype), y, self.name, self.classes)


def toy_regression(num_samples: int = 4096, input_size: int = 100, seed: int = 0) -> Dataset:
    """Regression onto a fixed random two-layer teacher plus noise: ``y = w2 . tanh(W1 x) + 0.1 e``.

    [DDP-scaling]'s toy data was pure noise (nothing to learn); a teacher gives the loss somewhere to
    fall. Everything is drawn from a generator seeded by ``seed``, so the set is a function of
    ``(seed, num_samples, input_size)`` alone and each rank makes the same one without any message.
    """
    g = torch.Generator().manual_seed(seed)
    w1 = torch.randn(input_size, 32, generator=g) / input_size**0.5  # the teacher first: the same
    w2 = torch.randn(32, 1, generator=g)  # function whatever num_samples is
    x = torch.randn(num_samples, input_size, generator=g)
    y = torch.tanh(x @ w1) @ w2 + 0.1 * torch.randn(num_samples, 1, generator=g)
    return Dataset(x, y, "toy")


def blobs(num_samples: int = 4096, input_size: int = 784, num_classes: int = 10, seed: int = 0) -> Dataset:
    """Synthetic classification: Gaussian clouds of unit variance around random class centres."""
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(num_classes, input_size, generator=g) * (4.0 / input_size**0.5)
    y = torch.randint(num_classes, (num_samples,), generator=g)
    x = centres[y] + torch.randn(num_samples, input_size, generator=g) * 0.5
    return Dataset(x, y, "blobs")


def digits() -> Dataset:
    """scikit-learn's 1,797 handwritten 8x8 digits (UCI), scaled to [0, 1]; ships inside the wheel.

    ``x`` is float32 of shape ``(1797, 1, 8, 8)`` (one channel, as LeNet takes it), ``y`` the
    int64 class indices 0..9; no download and no randomness, so every rank builds the same set.
    Needs scikit-learn (``pip install 'mpi-sgd[digits]'``): ImportError without it, where
    :func:`load` falls back to synthetic blobs of the same shape instead. Read from a cache file
    after the first load (:mod:`mpi_sgd.datacache`), so ranks do not each import scikit-learn.
    """
    images, labels = digits_arrays()
    x = torch.from_numpy(images.astype(np.float32) / 16.0).unsqueeze(1)  # (N, 1, 8, 8)
    return Dataset(x, torch.from_numpy(labels), "digits")


def from_file(path: str) -> Dataset:
    """A user's ``.npz`` (numpy) or ``.pt`` (a dict saved by torch) file holding arrays ``x`` and ``y``.

    Integer ``y`` means classification, floating ``y`` regression. ``.pt`` files are read with
    ``weights_only=True``: tensors and plain containers only, never arbitrary pickled code.
    """
    if not os.path.isfile(path):
        raise ValueError(f"data file {path!r} does not exist")
    try:
        if path.endswith(".npz"):
            with np.load(path, allow_pickle=False) as f:
                arrays = {k: _numeric(f[k], k, path) for k in ("x", "y") if k in f.files}
        elif path.endswith(".pt"):
            try:
                obj = torch.load(path, weights_only=True, map_location="cpu")  # saved from a GPU: here too
            except Exception as e:  # bytes that are no torch file fail in the unpickler, as anything at all
                raise ValueError(f"{type(e).__name__}: {e}") from None
            found = {k: obj[k] for k in ("x", "y") if k in obj} if isinstance(obj, dict) else {}
            # detached: data saved from a graph (requires_grad) would make every step backward into it
            arrays = {k: _numeric_tensor(torch.as_tensor(v).detach(), k, path) for k, v in found.items()}
        else:
            raise _Refused(f"data file {path!r} must end in .npz or .pt")
    except _Refused:
        raise
    except _UNREADABLE as e:
        # an empty or truncated file among them: one line, not a traceback per rank
        raise ValueError(f"cannot read data file {path!r} (empty, truncated or not this format): {e}") from None
    except MemoryError:  # a header that claims more than this machine has (numpy says _ArrayMemoryError)
        raise ValueError(f"cannot read data file {path!r}: its arrays would not fit in memory") from None
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing:
        raise ValueError(f"data file {path!r} has no array named {' or '.join(missing)}; it needs 'x' and 'y'")
    x, y = arrays["x"], arrays["y"]
    for name, t in (("x", x), ("y", y)):
        if t.ndim == 0:
            raise ValueError(f"data file {path!r}: {name} is a single number; it needs one entry per sample")
    if not len(x):
        raise ValueError(f"data file {path!r} holds no samples (x is empty)")
    if x.ndim == 1:  # one feature per sample
        x = x.reshape(-1, 1)
    if x.shape[0] != y.shape[0]:
        raise ValueError(f"data file {path!r}: x has {x.shape[0]} samples but y has {y.shape[0]}")
    if not x[0].numel():
        raise ValueError(f"data file {path!r}: x has no features (shape {tuple(x.shape)})")
    if y.dtype.is_floating_point and not y[0].numel():
        raise ValueError(f"data file {path!r}: y has no targets (shape {tuple(y.shape)})")
    if not y.dtype.is_floating_point:
        check_label_shape(y, path)
        if y.dtype == torch.uint64 and bool((y.view(torch.int64) < 0).any()):  # would wrap to negative
            raise ValueError(f"data file {path!r}: y holds a class index of 2**63 or more; y is class indices")
        y = y.long().reshape(-1)
        check_labels(y, path)
    _check_finite(x, y, path, "inf or nan")
    # Training is in float32 (or float64 from float32 values): a float64 value beyond float32's
    # range becomes inf in the conversion, which would reach the model unseen.
    x, y = x.float(), (y.reshape(len(y), -1).float() if y.dtype.is_floating_point else y)
    _check_finite(x, y, path, "values beyond float32's range (±3.4e38)")
    return Dataset(x, y, os.path.basename(path))


def _check_finite(x: torch.Tensor, y: torch.Tensor, path: str, what: str) -> None:
    for name, t in (("x", x), ("y", y)):
        if t.dtype.is_floating_point and not bool(torch.isfinite(t).all()):
            bad = (~torch.isfinite(t)).reshape(len(t), -1).any(1).nonzero().reshape(-1)
            raise ValueError(
                f"data file {path!r}: {name} holds {what} in {len(bad)} sample(s), the first at index {int(bad[0])}"
            )


_UNREADABLE = (
    OSError,
    ValueError,
    RuntimeError,
    TypeError,
    EOFError,
    KeyError,
    zipfile.BadZipFile,
    pickle.UnpicklingError,
)


class _Refused(ValueError):
    """A file read fine whose contents are refused: its own message, not "cannot read"."""


def _numeric(array: np.ndarray, name: str, path: str) -> torch.Tensor:
    """A numpy array as a tensor, refused in one line unless it holds numbers (bool, int or float)."""
    if array.dtype.kind not in "biuf":
        raise _Refused(f"data file {path!r}: {name} must be numbers, but its dtype is {array.dtype}")
    return torch.from_numpy(array)


def _numeric_tensor(t: torch.Tensor, name: str, path: str) -> torch.Tensor:
    """:func:`_numeric` for a tensor from a ``.pt`` file: complex values would lose their imaginary
    part when made float, so they are refused as numpy's are; so are the layouts and devices that
    the checks after this would fail on with a traceback (sparse, meta, float8)."""
    if t.is_complex() or t.is_quantized:
        raise _Refused(f"data file {path!r}: {name} must be real numbers, but its dtype is {t.dtype}")
    if t.dtype.is_floating_point and t.dtype.itemsize == 1:  # float8: storage only, no arithmetic in torch
        raise _Refused(f"data file {path!r}: {name} is {t.dtype}, a storage format; save it as float32")
    if t.layout != torch.strided:  # sparse: densify it yourself, knowingly (it may not fit)
        raise _Refused(f"data file {path!r}: {name} is a {t.layout} tensor; save it dense (.to_dense())")
    if t.device.type == "meta":  # shapes without values (a GPU's tensors are loaded to the CPU)
        raise _Refused(f"data file {path!r}: {name} is a meta tensor, a shape without values; save the data itself")
    return t


# More classes than this, or than half again the labels that occur, is a typo, not a task: one stray
# label of 100000 would silently build a 100001-way model, every step a hundred times slower.
MAX_CLASSES = 100_000


def check_label_shape(y: torch.Tensor, path: str) -> None:
    """Integer ``y`` holds one class index per sample: shape (N,) or (N, 1). Anything wider is
    refused, not flattened (that would make C labels per sample and pair them with the wrong x);
    one-hot rows are named as such, with the one-line conversion."""
    if y.ndim == 1 or (y.ndim == 2 and y.shape[1] == 1):
        return
    shape = "x".join(map(str, y.shape))
    if y.ndim == 2 and len(y) and bool(((y == 0) | (y == 1)).all()) and bool((y.sum(1) == 1).all()):
        raise ValueError(
            f"data file {path!r}: y is one-hot ({shape}); integer y must be one class index per sample: "
            "save y.argmax(1) instead"
        )
    raise ValueError(
        f"data file {path!r}: integer y must be one class index per sample, shape ({len(y)},), not {shape}; "
        "for several targets per sample save float y (regression)"
    )


def check_labels(y: torch.Tensor, path: str) -> None:
    """Class indices must be integers in [0, C), with C = max + 1 plausible: at most
    :data:`MAX_CLASSES`, and at least half of the classes 0 .. C-1 present in the data. A single
    class is refused too: its cross-entropy is 0 whatever the model says, so every gradient is 0 and
    a run would report accuracy 1.0 having learnt nothing (a wrong column saved as y, say)."""
    if not len(y):
        return
    low, high = int(y.min()), int(y.max())
    if low < 0:
        raise ValueError(f"data file {path!r}: integer y are class indices and must be >= 0, found {low}")
    if low == high:
        raise ValueError(
            f"data file {path!r}: every y is class {low} ({len(y)} samples): nothing to learn; classification "
            "needs two classes or more (float y means regression)"
        )
    present = int(torch.unique(y).numel())
    if high + 1 > MAX_CLASSES or present < (high + 1) / 2:
        raise ValueError(
            f"data file {path!r}: integer y are class indices 0 .. C-1, but the largest, {high}, would make "
            f"C = {high + 1} classes of which only {present} occur; renumber the labels 0 .. {present - 1}"
        )


def load(name: str, seed: int = 0) -> Dataset:
    """A built-in dataset by name, or a file by path (anything with a ``.npz``/``.pt`` suffix)."""
    if name == "digits":
        try:
            return digits()
        except ImportError:
            from .launch import placement

            # Only the demo's default depends on it; say plainly (once) what is used instead.
            if placement().rank == 0:
                print(
                    "scikit-learn is not installed (pip install 'mpi-sgd[digits]'); using the synthetic "
                    "'blobs' dataset in place of 'digits'"
                )
            return blobs(1797, 64, 10, seed)
    if name == "blobs":
        return blobs(seed=seed)
    if name == "toy":
        return toy_regression(seed=seed)
    if name.endswith((".npz", ".pt")):
        return from_file(name)
    raise ValueError(f"unknown dataset {name!r}; choose one of {', '.join(BUILTIN)} or give a .npz/.pt path")


def split(ds: Dataset, val_fraction: float, seed: int) -> tuple[Dataset, Dataset | None]:
    """``(train, val)``: ``round(val_fraction * N)`` samples (at least one) held out, or ``val`` None at 0.

    The held-out samples are drawn by a generator seeded by ``seed`` alone, so the split is the
    same on every rank and in every epoch, and differs from the epochs' permutations.
    """
    if val_fraction <= 0:
        return ds, None
    n_val = max(1, round(val_fraction * len(ds)))
    if n_val >= len(ds):
        raise ValueError(f"--val-fraction {val_fraction} leaves no training samples out of {len(ds)}")
    perm = torch.randperm(len(ds), generator=torch.Generator().manual_seed(2**40 + seed))
    train, val = perm[n_val:].sort().values, perm[:n_val].sort().values
    # The model's outputs count the whole set's classes: one found only among the held-out samples
    # would otherwise be a label past the model's last output, failing after a whole epoch.
    classes = ds.num_outputs if ds.classification else 0
    return Dataset(ds.x[train], ds.y[train], ds.name, classes), Dataset(ds.x[val], ds.y[val], ds.name, classes)


def standardize_targets(train: Dataset, val: Dataset | None) -> tuple[Dataset, Dataset | None]:
    """Regression targets minus the training mean, over the training standard deviation (per output).

    Targets in the user's units can be any size; squared errors of targets with a standard deviation
    of 7 are ~50 times larger than those of unit ones, and so are the gradients, which is enough to
    send SGD at a learning rate that suits unit targets to ``nan``. Classification is left alone.
    """
    if train.classification:
        return train, val
    mean, std = train.y.mean(0), train.y.std(0, correction=0).clamp_min(1e-12)

    def scaled(ds: Dataset) -> Dataset:
        return Dataset(ds.x, (ds.y - mean) / std, ds.name)

    return scaled(train), scaled(val) if val is not None else None


def prepare(name: str, seed: int = 0, val_fraction: float = 0.0) -> tuple[Dataset, Dataset | None]:
    """What the trainer is given: :func:`load`, then :func:`split`, then :func:`standardize_targets`."""
    train, val = split(load(name, seed), val_fraction, seed)
    return standardize_targets(train, val)


def check_size(n: int, world_size: int, batch_size: int) -> int:
    """Steps per epoch, ``N // (R*B)``; raises if the dataset cannot fill a single global batch."""
    need = world_size * batch_size
    if n < need:
        raise ValueError(
            f"the dataset has {n} samples but one step needs R*B = {world_size}*{batch_size} "
            f"= {need}; use a smaller --batch-size or fewer ranks"
        )
    return n // need


def global_batches(n: int, world_size: int, batch_size: int, epoch: int, seed: int, offset: int = 0) -> torch.Tensor:
    """Indices of shape ``(steps, R, B)``: step ``s`` of this epoch gives rank ``r`` row ``[s, r]``.

    The permutation depends on ``(n, epoch, seed)`` only, so an epoch cut short at one world size
    goes on at another from sample ``offset`` of the same permutation (a resume, which may leave
    fewer than one global batch: then no steps)."""
    steps = check_size(n, world_size, batch_size) if offset == 0 else max(0, n - offset) // (world_size * batch_size)
    g = torch.Generator().manual_seed(seed * 1_000_003 + epoch)
    perm = torch.randperm(n, generator=g)
    return perm[offset : offset + steps * world_size * batch_size].view(steps, world_size, batch_size)


def rank_batches(
    n: int, rank: int, world_size: int, batch_size: int, epoch: int, seed: int, offset: int = 0
) -> torch.Tensor:
    """This rank's share of the epoch: ``(steps, B)`` sample indices, ``steps = n // (R*B)``.

    Row ``s`` is the ``B`` indices rank ``r`` trains on in step ``s``. Every rank calling it with
    the same ``(n, R, B, epoch, seed)`` draws the same permutation of ``range(n)``, so the ranks'
    rows of one step are disjoint, take the same number of steps, and together are exactly the
    global batch one process would draw with ``rank_batches(n, 0, 1, R*B, epoch, seed)``.
    ValueError if ``n < R*B`` (see :func:`check_size`).
    """
    return global_batches(n, world_size, batch_size, epoch, seed, offset)[:, rank]
