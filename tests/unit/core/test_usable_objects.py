"""usable_objects: the one rule the scene descriptor, the planners and the monitor apply to tracked
objects with unknown fields (issue 17: never lose an object whose position is known)."""

from __future__ import annotations

import math

import pytest

from luna_core.types import DEFAULT_FOOTPRINT, ObjectClass, TrackedObject, usable_objects


def obj(oid: str, x: float = 10.0, y: float = 0.0, heading: float = 0.0, vx: float = 1.0, vy: float = 0.0,
        length: float = 4.5, width: float = 1.9, cls: ObjectClass = ObjectClass.VEHICLE) -> TrackedObject:
    return TrackedObject(oid, cls, x, y, heading, vx, vy, length, width)


def test_clean_objects_pass_unchanged_and_nothing_is_reported():
    objs = [obj("a"), obj("b", x=20.0)]
    out = usable_objects(objs)
    assert out.objects == objs and out.objects[0] is objs[0]
    assert out.problems() == "" and out.total == 2


@pytest.mark.parametrize("cls", list(ObjectClass))
@pytest.mark.parametrize("length, width", [(math.nan, math.nan), (math.inf, 1.0), (0.0, 0.0), (-4.0, -2.0)])
def test_unknown_size_gets_the_class_default_footprint(cls, length, width):
    out = usable_objects([obj("u", length=length, width=width, cls=cls)])
    (u,) = out.objects
    expect_l = DEFAULT_FOOTPRINT[cls][0]
    expect_w = width if math.isfinite(width) and width > 0 else DEFAULT_FOOTPRINT[cls][1]
    assert (u.length, u.width) == (expect_l, expect_w)
    assert (u.x, u.y, u.vx) == (10.0, 0.0, 1.0), "position and velocity are kept"
    assert "u" in out.assumed and "size" in out.assumed["u"]
    assert "1 object(s) kept with assumed fields (u)" in out.problems()


def test_default_footprints_are_at_least_a_usual_member_of_the_class():
    assert DEFAULT_FOOTPRINT[ObjectClass.VEHICLE][0] >= 5.0 and DEFAULT_FOOTPRINT[ObjectClass.VEHICLE][1] >= 2.0
    assert min(DEFAULT_FOOTPRINT[ObjectClass.PEDESTRIAN]) >= 0.8


def test_unknown_heading_gets_a_square_covering_every_heading():
    (u,) = usable_objects([obj("h", heading=math.nan, length=4.0, width=3.0)]).objects
    assert (u.heading, u.length, u.width) == (0.0, 5.0, 5.0)


def test_unknown_velocity_stands_still_at_its_position():
    out = usable_objects([obj("v", vx=math.nan, vy=2.0)])
    (u,) = out.objects
    assert (u.vx, u.vy, u.x) == (0.0, 0.0, 10.0) and out.assumed == {"v": "standing still"}


@pytest.mark.parametrize("x, y", [(math.nan, 0.0), (0.0, math.inf)])
def test_unknown_position_is_left_out_and_reported(x, y):
    out = usable_objects([obj("p", x=x, y=y), obj("ok")])
    assert [o.id for o in out.objects] == ["ok"]
    assert out.dropped == {"p": "unknown position"}
    assert "1 object(s) without a usable position left out (p)" in out.problems()


def test_the_rule_is_idempotent():
    first = usable_objects([obj("a", length=math.nan, heading=math.nan, vx=math.inf)])
    again = usable_objects(first.objects)
    assert again.objects == first.objects and again.problems() == ""


def test_cap_keeps_the_nearest_in_input_order_and_names_the_count():
    objs = [obj(f"o{i}", x=float(x)) for i, x in enumerate([50, -3, 7, 100, 2, -60])]
    out = usable_objects(objs, origin=(0.0, 0.0), max_count=3)
    assert [o.id for o in out.objects] == ["o1", "o2", "o4"]
    assert out.beyond_cap == 3 and out.cap == 3
    assert "6 objects in one message: kept the 3 nearest, left out the 3 farthest" in out.problems()
    assert usable_objects(objs, origin=(0.0, 0.0), max_count=6).beyond_cap == 0
    without_origin = usable_objects(objs, max_count=2)
    assert [o.id for o in without_origin.objects] == ["o0", "o1"] and without_origin.beyond_cap == 4
    assert "kept the first 2 (no ego position yet), left out 4" in without_origin.problems()
