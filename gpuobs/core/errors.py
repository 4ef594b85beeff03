"""The one error hierarchy and exit-code table of gpuobs.

Every error a user can cause or meet derives from :class:`GpuobsError` and carries the process exit
code the CLI returns for it (``gpuobs.cli.main`` maps them; nothing else prints exit codes):

====  =================  ===========================================================================
code  constant           meaning
====  =================  ===========================================================================
0     EXIT_OK            success: drill passed, compatible, PROMOTE, stack healthy
1     EXIT_FAILURE       failure: drill missed, incompatible, ROLLBACK, a component failed to start,
                         a backend that cannot be reached
2     EXIT_USAGE         usage or input error: a bad flag, file, selector, duration or payload
3     EXIT_INCONCLUSIVE  inconclusive: not enough evidence yet (HOLD, unknown GPU, aborted rollout)
4     EXIT_BACKEND       could not judge: backend error. The metrics backend a verdict needs
                         (Prometheus) is unreachable, answers 5xx after the retries, refuses the
                         credentials or answers garbage (``gpuobs canary analyze``), so no verdict
                         was reached; distinct from 1 (ROLLBACK) so a pipeline never rolls back, or
                         promotes, on an outage of its monitoring
130   EXIT_INTERRUPTED   interrupted by Ctrl-C
====  =================  ===========================================================================
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_INCONCLUSIVE = 3
EXIT_BACKEND = 4
EXIT_INTERRUPTED = 130


class GpuobsError(Exception):
    """Base of every gpuobs error; ``exit_code`` is what the CLI exits with."""

    exit_code = EXIT_FAILURE


class InputError(GpuobsError, ValueError):
    """The user's input is wrong (flag, file, payload); the message names the field and what is allowed."""

    exit_code = EXIT_USAGE


class ConfigError(InputError):
    """A bad value of one named field (a flag, a config key, a query parameter): ``field``, ``value``
    and what is ``accepted``; the message is ``<field>: <value> is not valid; expected <accepted>``."""

    def __init__(self, field_name: str, value: object, accepted: str):
        self.field, self.value, self.accepted = field_name, value, accepted
        super().__init__(f"{field_name}: {value!r} is not valid; expected {accepted}")


class Failure(GpuobsError, RuntimeError):
    """Something the user asked for failed (a component, a backend, a drill)."""

    exit_code = EXIT_FAILURE


class BackendError(Failure):
    """Could not judge: the backend a verdict needs is unreachable or failing (exit 4)."""

    exit_code = EXIT_BACKEND


class Inconclusive(GpuobsError):
    """Not enough evidence to decide."""

    exit_code = EXIT_INCONCLUSIVE


def yaml_problem(exc: Exception) -> str:
    """A PyYAML parse error in one line, ``line L, column C: problem`` (PyYAML's own text spans several
    lines, with a caret under the column), for the one error line of a bad config file."""
    mark, problem = getattr(exc, "problem_mark", None), getattr(exc, "problem", None)
    if mark is not None and problem:
        return f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    return " ".join(str(exc).split())
