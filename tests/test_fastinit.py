"""``_fastinit.fast_init``: the slot-setting ``__init__`` is equivalent to the dataclass's own."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from statebound import effects
from statebound._fastinit import fast_init
from statebound.events import Event
from statebound.host import store


@dataclasses.dataclass(frozen=True, slots=True)
class _Plain:
    a: int
    b: str = "x"
    c: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Base:
    stamp: int = 0


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Child(_Base):
    label: str
    value: object = None



def test_signature_defaults_and_factories_match_the_generated_init() -> None:
    before = inspect.signature(_Plain.__init__)
    fast = fast_init(_Plain)
    assert inspect.signature(fast.__init__) == before
    one, two = fast(1), fast(1)
    assert one == _Plain(1, "x", []) and one.c is not two.c   # a fresh list each time
    assert fast(a=2, c=[3]) == _Plain(2, "x", [3])
    with pytest.raises(TypeError):
        fast()                                     # a required field is still required
    with pytest.raises(dataclasses.FrozenInstanceError):
        one.a = 5                                  # type: ignore[misc]


def test_keyword_only_fields_and_inherited_slots() -> None:
    fast = fast_init(_Child)
    c = fast(label="l", stamp=3)
    assert (c.stamp, c.label, c.value) == (3, "l", None)
    with pytest.raises(TypeError):
        fast("l")                                  # keyword-only stays keyword-only
    with pytest.raises(TypeError):
        fast(stamp=1)                              # label has no default


def test_refuses_what_it_cannot_reproduce() -> None:
    @dataclasses.dataclass(frozen=True, slots=True)
    class Post:
        a: int

        def __post_init__(self) -> None:
            pass

    @dataclasses.dataclass(frozen=True, slots=True)
    class NoInit:
        a: int
        b: int = dataclasses.field(default=0, init=False)

    @dataclasses.dataclass(frozen=True)
    class NoSlots:
        a: int

    @dataclasses.dataclass(slots=True)
    class NotFrozen:
        a: int

    for cls in (Post, NoInit, NoSlots, NotFrozen, int):
        with pytest.raises(TypeError):
            fast_init(cls)


@pytest.mark.parametrize("cls", [Event, store.TimerRow, store.PositionWrite, store.Commit, store.PositionRecord,
                                 store.TimerCompletion, effects.Log, effects.Send, effects.SendDelayed])
def test_the_hot_classes_use_it_and_keep_their_fields(cls: type) -> None:
    assert cls.__init__.__qualname__ == f"{cls.__qualname__}.__init__"
    assert "_set_" in " ".join(cls.__init__.__code__.co_names)   # the slot setters, not object.__setattr__
    names = [f.name for f in dataclasses.fields(cls)]
    assert list(inspect.signature(cls.__init__).parameters)[1:] == [
        n for n in names if not next(f for f in dataclasses.fields(cls) if f.name == n).kw_only] + [
        n for n in names if next(f for f in dataclasses.fields(cls) if f.name == n).kw_only]
