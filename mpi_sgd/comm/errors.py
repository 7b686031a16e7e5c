"""The seam's exceptions, on their own so that every room of comm/ can raise them without a circle."""


class CommError(RuntimeError):
    """A communication call was given something it cannot send (wrong dtype, device, layout)."""


class CollectiveMismatchError(CommError):
    """Ranks entered the same collective with different shapes, dtypes, ops or roots."""
