"""The engine's error hierarchy: one base, so callers can catch everything the engine raises."""


class BatchingError(Exception):
    """Base of every error raised by the `batching` package."""


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
    """The model could not be loaded."""


class LoraError(BatchingError):
    """A LoRA adapter could not be used: missing, not a safetensors file, too large, or not fitting the model.
    The message names the adapter."""
