"""The errors of the engine and of the rules it shares with the service: one hierarchy, torch-free.

A job's params are checked here (`core.params`) by the API, the worker and the engine alike, so
the error they raise lives here too, beside the errors the engine raises that its callers catch
(the worker, the command line, a Python user of `batching.DiffusionEngine`, which `batching` hands them to).
"""


class BatchingError(Exception):
    """Base of every error the engine (`batching`) and its shared rules (`core`) raise."""


class InvalidParamsError(BatchingError, ValueError):
    """A generation parameter is invalid; `field` names it, `value` is what was given."""

    def __init__(self, field: str, value: object, message: str) -> None:
        self.field = field
        self.value = value
        self.message = message
        shown = repr(value)
        if len(shown) > 80:
            shown = shown[:77] + "..."
        super().__init__(f"{field} {message} (got {shown})")


class JobFailedError(BatchingError):
    """A job failed inside the engine; the message says why."""


class JobCanceledError(BatchingError):
    """The job was canceled before it finished."""


class EngineShutdownError(BatchingError):
    """The engine was shut down before the job finished."""


class ModelLoadError(BatchingError):
    """The model could not be loaded (or a built-in model's name is unknown)."""


class LoraError(BatchingError):
    """A LoRA adapter could not be used: missing, not a safetensors file, too large, or not fitting the model.
    The message names the adapter."""


class LoraFileError(ValueError):
    """The bytes are not a usable LoRA adapter file (`core.lora_files`); the message says what is wrong (to follow
    'the file ...'). The API answers it for an upload; the engine wraps it in a `LoraError` naming the adapter."""


def describe(error: Exception, max_chars: int = 300) -> str:
    """A foreign error in a job's message: its first two lines, cut (PEFT lists every mismatching layer)."""
    lines = [line.strip() for line in f"{type(error).__name__}: {error}".splitlines() if line.strip()]
    text = " ".join(lines[:2])
    return text if len(text) <= max_chars and len(lines) <= 2 else f"{text[:max_chars]}..."
