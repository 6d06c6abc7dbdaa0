"""What a checkpoint of the tiers holds: `TrainState` (nodeagent.worker.checkpointer saves it)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

MODEL, OPTIM, OBJECTS, VALUES = "model", "optim", "objects", "values"


class Saveable(Protocol):
    """What `Checkpointer` saves and restores: a `TrainState`, or a framework's own stateful
    objects gathered as one (nodeagent.integrations.torchtitan). `state_dict()` is DCP's view
    (tensors its own, not copies: a load fills them in place); `load_state_dict` takes it back."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, loaded: dict[str, Any], /) -> None: ...


class TrainState:
    """What a checkpoint holds: a model, its optimizer(s), other objects with `state_dict()`
    and `load_state_dict()` (schedulers, samplers) and plain values (`state.epoch`). Model and
    optimizer go through torch.distributed.checkpoint.state_dict, so a sharded model saves its
    shards and loads at any world size."""

    def __init__(self, model: Any, optimizer: Any = None, **extra: Any) -> None:
        self.__dict__["_model"] = model
        optimizers = [] if optimizer is None else optimizer
        self.__dict__["_optimizers"] = (
            list(optimizers) if isinstance(optimizers, list | tuple) else [optimizers]
        )
        self.__dict__["_objects"] = {k: v for k, v in extra.items() if _stateful(v)}
        self.__dict__["_values"] = {k: v for k, v in extra.items() if not _stateful(v)}

    def __getattr__(self, name: str) -> Any:
        for place in ("_objects", "_values"):
            if name in self.__dict__[place]:
                return self.__dict__[place][name]
        raise AttributeError(name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in self.__dict__["_objects"]:
            raise AttributeError(f"{name} is an object of the state; load into it instead")
        self.__dict__["_values"][name] = value

    def state_dict(self) -> dict[str, Any]:
        """DCP's view: the model's and optimizers' state (their own tensors, not copies)."""
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model_sd, optim_sd = get_state_dict(self._model, self._optimizers)
        return {
            MODEL: model_sd,
            OPTIM: optim_sd,
            OBJECTS: {k: v.state_dict() for k, v in self._objects.items()},
            VALUES: dict(self._values),
        }

    def load_state_dict(self, loaded: Mapping[str, Any]) -> None:
        from torch.distributed.checkpoint.state_dict import set_state_dict

        set_state_dict(
            self._model,
            self._optimizers,
            model_state_dict=loaded[MODEL],
            optim_state_dict=loaded[OPTIM],
        )
        for name, obj in self._objects.items():
            obj.load_state_dict(loaded[OBJECTS][name])
        self.__dict__["_values"].update(loaded[VALUES])


def _stateful(value: Any) -> bool:
    return hasattr(value, "state_dict") and hasattr(value, "load_state_dict")
