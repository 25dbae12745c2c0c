"""Exceptions of a training run, importable without torch (the campaign layer and Train's controller
only need to recognise them)."""


class DivergenceError(RuntimeError):
    """The training loss became NaN or infinite."""

    def __init__(self, epoch: int, step: int, loss: float, which: str = ""):
        super().__init__(epoch, step, loss, which)  # args are the constructor's: the error pickles across processes
        self.epoch, self.step, self.loss, self.which = epoch, step, loss, which

    def __str__(self):
        of = f" ({self.which})" if self.which else ""
        return (f"training diverged: non-finite loss{of} {self.loss} at epoch {self.epoch} step {self.step} "
                f"(epoch 1-based; step = optimizer update within the epoch, 1-based)")


class SimulatedFailure(RuntimeError):
    """Raised by the qs_fail_after_epoch test knob after a checkpoint was reported."""


class CheckpointError(RuntimeError):
    """A checkpoint to resume from is missing or cannot be read; str() names the file."""
