"""Datamodels: ``python`` (default) and ``null``. Values must be msgpack-serializable."""

from .base import AttrDict, Context, Datamodel, EventView, datamodel_for, pack_vars, unpack_vars

__all__ = ["AttrDict", "Context", "Datamodel", "EventView", "datamodel_for", "pack_vars", "unpack_vars"]
