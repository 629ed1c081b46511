"""Why a measurement produced no time. Records store the name ("LOWER_ERROR")."""

from __future__ import annotations

from enum import Enum


class ErrorCode(Enum):
    """The outcome of measuring one candidate.

    Example::

        ErrorCode["WRONG_ANSWER"] is ErrorCode.WRONG_ANSWER   # from a record's error_code
    """

    NO_ERROR = 0
    LOWER_ERROR = 1      # ScheduleError / LowerError replaying the steps or lowering
    COMPILE_ERROR = 2    # the backend refused the generated code
    COMPILE_TIMEOUT = 3  # the build took longer than build_timeout (worker killed)
    RUNTIME_ERROR = 4    # the module refused its arguments or a launch failed
    RUN_TIMEOUT = 5      # one call or one repeat took longer than run_timeout (worker killed)
    WRONG_ANSWER = 6     # output differs from the default schedule's beyond tolerance
    CRASH = 7            # the worker process died (e.g. a segfault in generated code)
    UNKNOWN = 8          # an unexpected exception in a worker (non-strict mode only)

    @classmethod
    def parse(cls, name: str) -> ErrorCode:
        try:
            return cls[name]
        except KeyError:
            raise ValueError(f"unknown error code {name!r}; known: {', '.join(cls.__members__)}")\
                from None
