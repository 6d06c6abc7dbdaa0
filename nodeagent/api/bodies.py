"""What the API takes and gives, as pydantic models: they check a request before anything is
done and generate the OpenAPI document (docs/openapi.json). The Python client
(nodeagent/client.py) sends exactly these shapes."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field

NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Submit(Strict):
    """A job: `spec` is the document `nodeagentctl submit --spec FILE` takes (id, entrypoint,
    nproc_per_node, min_nodes, max_nodes, env, user, queue, priority, ...: docs/pool.md),
    checked by the same rules, with the same words."""

    spec: dict[str, Any]
    hold: Annotated[
        bool, Field(description="keep it from starting until released (submit --hold)")
    ] = False


class Allocate(Strict):
    """An allocation: `spec` holds the keys of its shape that `submit`'s spec takes (min_nodes,
    max_nodes, gpus_per_node, exclusive, queue, time_limit, selector, mem, ...: docs/pool.md);
    no entrypoint, its nodes hold it (docs/interactive.md)."""

    spec: dict[str, Any]


class Scale(Strict):
    target: str = Field(
        pattern=r"^[+-]?[0-9]{1,6}$", description="N nodes, or +N / -N from the current target"
    )


class Cordon(Strict):
    reason: Annotated[str, Field(max_length=256)] = ""
    job: Annotated[
        str | None, Field(pattern=NAME, description="a node inside this job instead")
    ] = None


class QueueNew(Strict):
    name: str = Field(pattern=NAME)
    quota: Annotated[
        int | None, Field(ge=0, description="the most nodes its jobs hold (null: no limit)")
    ] = None
    guaranteed: Annotated[int, Field(ge=0)] = 0
    max_priority: int | None = None
    gpu_quota: Annotated[
        int | None,
        Field(ge=0, description="the most GPUs its jobs hold, a whole node's all (null: none)"),
    ] = None
    gpu_guaranteed: Annotated[
        int, Field(ge=0, description="GPUs its jobs may take back from others")
    ] = 0


class QueueChange(Strict):
    """Only the fields given change (null: no limit)."""

    quota: Annotated[int | None, Field(ge=0)] = None
    guaranteed: Annotated[int | None, Field(ge=0)] = None
    max_priority: int | None = None
    gpu_quota: Annotated[int | None, Field(ge=0)] = None
    gpu_guaranteed: Annotated[int | None, Field(ge=0)] = None


class Done(BaseModel):
    """The pool leader's answer to a change: what it did, and whom it took the caller for."""

    message: str
    user: str


class Submitted(Done):
    job: str


class Listing(BaseModel):
    """A listing: {version, pool, and the rows under the listing's name}."""

    model_config = ConfigDict(extra="allow")

    version: int
    pool: str


class SignIn(Strict):
    code: Annotated[
        str,
        Field(
            min_length=16,
            max_length=128,
            pattern=r"^[A-Za-z0-9_-]+$",
            description="the one-time code of a `nodeagentctl ui` link",
        ),
    ]


class Session(BaseModel):
    """Who a browser's session is, and the value its changes carry in X-Nodeagent-CSRF."""

    user: str
    operator: bool
    expires: str | None
    csrf: str | None
