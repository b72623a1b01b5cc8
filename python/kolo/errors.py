"""kolo's exceptions. Every failure of kolo raises one of these, with the
text kolo's engine gives (naming the tensor, the values and the ranks)."""


class KoloError(RuntimeError):
    """A kolo operation failed (the base of every kolo exception)."""


class MismatchError(KoloError):
    """The ranks submitted a tensor with conflicting arguments (shape, data
    type, op, root...). Every rank raises it alike; later operations work."""


class StalledError(KoloError):
    """Some ranks never submitted the tensor (the stall inspector gave up)."""


class OperationTimeoutError(KoloError, TimeoutError):
    """An operation did not complete within KOLO_TIMEOUT: kolo stopped on
    every rank it could reach. The message is the desync report: this
    rank's last completed and first pending operations, and which ranks
    are behind on which tensor."""


class ShutDownError(KoloError):
    """kolo shut down before the operation completed."""


class RankFailedError(KoloError):
    """A rank this one depended on failed."""


class InvalidArgumentError(KoloError, ValueError):
    """An argument cannot work: a data type kolo does not reduce, a
    non-contiguous or read-only tensor, a name already in flight..."""


class StartError(KoloError):
    """The engine cannot start (a malformed KOLO_* value, a launcher's
    variables that disagree, a rendezvous that cannot be reached)."""


class NotInitializedError(KoloError, ValueError):
    """A call before kolo.init() (or after kolo.shutdown())."""


class TimeoutError(KoloError, TimeoutError):  # noqa: A001 - kolo.TimeoutError is both
    """A wait's timeout passed; the operation goes on."""


__all__ = [
    "KoloError",
    "MismatchError",
    "StalledError",
    "OperationTimeoutError",
    "ShutDownError",
    "RankFailedError",
    "InvalidArgumentError",
    "StartError",
    "NotInitializedError",
    "TimeoutError",
]
