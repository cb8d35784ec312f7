"""Damaged and unusual bags: a clear report of what is wrong, and everything readable is still read.

Bags are written with the project's BagWriter (rosbags MCAP, the format ``luna bag record`` writes);
each ``flush()`` closes an MCAP chunk, so the tests control where chunks begin and end.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from rclpy.node import Node
from rclpy.serialization import serialize_message
from std_msgs.msg import String

from luna_bags.msgtypes import MessageTypes
from luna_bags.play import Player, _time_msg
from luna_bags.reader import BagError, BagReader
from luna_bags.writer import BagExistsError, BagWriter, resolve_output
from luna_msgs_py import convert as C
from tests import samples

T0 = 1_700_000_000 * 10**9
CHUNKS = 3
PER_CHUNK = 40


def _odometry(i: int) -> bytes:
    ego = samples.ego()
    ego.stamp = T0 / 1e9 + 0.1 * i
    ego.x += i
    return bytes(serialize_message(C.ego_to_odometry(ego)))


def _objects(i: int) -> bytes:
    objs = samples.objects()
    objs.stamp = T0 / 1e9 + 0.1 * i
    objs.objects[0].id = f"veh-{i}"
    return bytes(serialize_message(C.objects_to_msg(objs)))


def write_chunked_bag(path: Path) -> list[tuple[str, int, bytes]]:
    """CHUNKS chunks of PER_CHUNK messages (odometry and luna_msgs objects alternating); returns them."""
    written = []
    with BagWriter(path) as bag:
        bag.add_topic("/odom", "nav_msgs/msg/Odometry")
        bag.add_topic("/objects", "luna_msgs/msg/TrackedObjects")
        for i in range(CHUNKS * PER_CHUNK):
            topic, data = ("/odom", _odometry(i)) if i % 2 == 0 else ("/objects", _objects(i))
            bag.write(topic, T0 + i * 100_000_000, data)
            written.append((topic, T0 + i * 100_000_000, data))
            if (i + 1) % PER_CHUNK == 0:
                bag.flush()
    return written


def _read(path: Path) -> tuple[BagReader, list[tuple[str, int, bytes]]]:
    reader = BagReader(path)
    return reader, [(m.topic, m.timestamp, m.data) for m in reader.messages()]


def _chunk_offsets(mcap: bytes) -> list[int]:
    """File offsets of the chunk records (opcode 0x06) in the data section, by walking the records."""
    offsets, pos = [], 8
    while pos < len(mcap):
        op, length = mcap[pos], int.from_bytes(mcap[pos + 1:pos + 9], "little")
        if op in (0x02, 0x0F):
            break
        if op == 0x06:
            offsets.append(pos)
        pos += 9 + length
    return offsets


@pytest.fixture
def bag(tmp_path: Path) -> tuple[Path, list[tuple[str, int, bytes]]]:
    path = tmp_path / "good"
    return path, write_chunked_bag(path)


def test_intact_bag_reads_back_exactly(bag):
    path, written = bag
    reader, read = _read(path)
    assert read == written
    assert reader.issues == []
    assert reader.topics["/objects"].msgdef.data.startswith("std_msgs/Header header")
    assert reader.time_range() == (written[0][1], written[-1][1])


def test_truncated_bag_reads_every_message_before_the_cut(bag, tmp_path):
    path, written = bag
    mcap = (path / "good.mcap").read_bytes()
    cut_dir = tmp_path / "cut"
    cut_dir.mkdir()
    # Cut inside the third chunk: the recorder died while writing it (no summary, no metadata.yaml).
    third = _chunk_offsets(mcap)[2]
    (cut_dir / "cut.mcap").write_bytes(mcap[:third + 2000])
    reader, read = _read(cut_dir)
    kinds = {i.kind for i in reader.issues}
    assert kinds == {"metadata", "truncated"}
    assert "not finalised" in str(next(i for i in reader.issues if i.kind == "truncated"))
    # The first two chunks entirely, then the complete records of the partial third chunk.
    assert 2 * PER_CHUNK < len(read) < 3 * PER_CHUNK
    assert read == written[:len(read)]


def test_corrupt_chunk_is_skipped_after_its_last_good_record_and_reading_continues(bag, tmp_path):
    path, written = bag
    mcap = bytearray((path / "good.mcap").read_bytes())
    second = _chunk_offsets(bytes(mcap))[1]
    # Overwrite bytes in the middle of the second chunk's records (record headers included).
    middle = second + 9 + 40 + 3000
    mcap[middle:middle + 400] = b"\xff" * 400
    bad = tmp_path / "bad"
    shutil.copytree(path, bad)
    (bad / "good.mcap").write_bytes(bytes(mcap))
    reader, read = _read(bad)
    corrupt = [i for i in reader.issues if i.kind == "corrupt_chunk"]
    assert len(corrupt) == 1 and "the rest of the chunk is skipped" in corrupt[0].detail
    assert read[:PER_CHUNK] == written[:PER_CHUNK]  # first chunk whole
    assert read[-PER_CHUNK:] == written[-PER_CHUNK:]  # third chunk whole
    lost = len(written) - len(read)
    assert 0 < lost < PER_CHUNK
    # What survived of chunk 2 is its prefix, except possibly its last record whose payload was hit.
    survivors = read[PER_CHUNK:-PER_CHUNK]
    assert survivors[:-1] == written[PER_CHUNK:PER_CHUNK + len(survivors) - 1]


def test_damaged_chunk_header_skips_that_chunk_and_resumes_at_the_next(bag, tmp_path):
    path, written = bag
    mcap = bytearray((path / "good.mcap").read_bytes())
    second = _chunk_offsets(bytes(mcap))[1]
    mcap[second:second + 9] = b"\x42" + b"\xff" * 8  # opcode and length of chunk 2 destroyed
    bad = tmp_path / "bad_header"
    shutil.copytree(path, bad)
    (bad / "good.mcap").write_bytes(bytes(mcap))
    reader, read = _read(bad)
    issue = next(i for i in reader.issues if i.kind == "corrupt_chunk")
    assert "reading resumed at the next chunk" in issue.detail and f"byte {second}" in issue.where
    assert read == written[:PER_CHUNK] + written[2 * PER_CHUNK:]  # chunks 1 and 3, exactly


def _record(op: int, body: bytes) -> bytes:
    return bytes([op]) + len(body).to_bytes(8, "little") + body


def _s(text: str | bytes) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return len(data).to_bytes(4, "little") + data


_FULL_QOS = ("- history: keep_last\n  depth: 5\n  reliability: reliable\n  durability: volatile\n"
             "  deadline: {sec: 9223372036, nsec: 854775807}\n  lifespan: {sec: 9223372036, nsec: 854775807}\n"
             "  liveliness: automatic\n  liveliness_lease_duration: {sec: 9223372036, nsec: 854775807}\n"
             "  avoid_ros_namespace_conventions: false\n")


def _foreign_mcap(qos: str) -> tuple[bytes, list[tuple[int, bytes]]]:
    """Schemas and channels outside chunks, a zstd and an lz4 chunk with CRCs, message indexes, no
    summary: the layout the MCAP reference writers (and rosbag2's storage plugin) produce, by hand."""
    import struct
    import zlib

    import lz4.frame
    from backports import zstd

    definition = MessageTypes().definition("nav_msgs/msg/Odometry")[0]
    out = bytearray(b"\x89MCAP0\r\n") + _record(0x01, _s("ros2") + _s("rosbag2"))
    out += _record(0x03, struct.pack("<H", 1) + _s("nav_msgs/msg/Odometry") + _s("ros2msg") + _s(definition))
    meta = _s("offered_qos_profiles") + _s(qos)
    out += _record(0x04, struct.pack("<HH", 7, 1) + _s("/odom") + _s("cdr") + _s(meta))
    messages = [(T0 + i * 10**8, _odometry(i)) for i in range(12)]
    for compression, compress, part in (("zstd", zstd.compress, messages[:6]),
                                        ("lz4", lz4.frame.compress, messages[6:])):
        records = b"".join(_record(0x05, struct.pack("<HIQQ", 7, i, t, t) + data) for i, (t, data) in enumerate(part))
        packed = compress(records)
        body = struct.pack("<QQQI", part[0][0], part[-1][0], len(records), zlib.crc32(records))
        out += _record(0x06, body + _s(compression) + len(packed).to_bytes(8, "little") + packed)
        out += _record(0x07, struct.pack("<HI", 7, 16) + struct.pack("<QQ", part[0][0], 0))  # message index
    out += _record(0x0F, struct.pack("<I", 0)) + _record(0x02, bytes(20)) + b"\x89MCAP0\r\n"
    return bytes(out), messages


def test_reads_the_mcap_layout_of_other_writers_compressed_chunks_with_crc(tmp_path):
    data, messages = _foreign_mcap(_FULL_QOS)
    (tmp_path / "foreign.mcap").write_bytes(data)
    reader, read = _read(tmp_path / "foreign.mcap")
    assert reader.issues == []
    assert [(t, d) for _, t, d in read] == messages
    topic = reader.topics["/odom"]
    assert topic.msgtype == "nav_msgs/msg/Odometry" and topic.count == 12
    assert topic.offered_qos[0].depth == 5 and topic.offered_qos[0].reliability.name == "RELIABLE"


def test_unreadable_qos_profiles_are_reported_and_the_messages_still_read(tmp_path):
    data, messages = _foreign_mcap(_FULL_QOS.replace("avoid_ros_namespace_conventions", "something_else"))
    (tmp_path / "odd_qos.mcap").write_bytes(data)
    reader, read = _read(tmp_path / "odd_qos.mcap")
    assert [i.kind for i in reader.issues] == ["metadata"]
    assert "QoS profiles unreadable" in reader.issues[0].detail
    assert [(t, d) for _, t, d in read] == messages and reader.topics["/odom"].offered_qos == []


def test_out_of_order_receive_times_are_reported_and_read_in_time_order(tmp_path):
    path = tmp_path / "shuffled"
    order = [0, 1, 2, 5, 3, 4, 9, 6, 7, 8]
    with BagWriter(path) as bag:
        bag.add_topic("/chatter", "std_msgs/msg/String")
        for i in order:
            bag.write("/chatter", T0 + i * 10**8, bytes(serialize_message(String(data=f"m{i}"))))
    reader, read = _read(path)
    assert [t for _, t, _ in read] == sorted(T0 + i * 10**8 for i in order)
    issue = next(i for i in reader.issues if i.kind == "non_monotonic")
    assert "5 messages are stored out of receive-time order" in issue.detail  # 3, 4 after 5; 6, 7, 8 after 9
    assert "0.300 s" in issue.detail  # largest step back: 9 -> 6


def test_not_a_bag_and_missing_bag_raise_clear_errors(tmp_path):
    with pytest.raises(BagError, match="no such bag"):
        BagReader(tmp_path / "nothing")
    (tmp_path / "empty").mkdir()
    with pytest.raises(BagError, match="no .mcap or .db3"):
        BagReader(tmp_path / "empty")
    junk = tmp_path / "junk.mcap"
    junk.write_bytes(b"definitely not an mcap file")
    with pytest.raises(BagError, match="bad magic"):
        BagReader(junk)


def test_bags_are_never_overwritten(bag):
    path, _ = bag
    with pytest.raises(BagExistsError):
        resolve_output(str(path), None)
    assert resolve_output(str(path.parent / "new.db3"), None) == (path.parent / "new", "sqlite3")
    with pytest.raises(ValueError, match="names sqlite3 storage"):
        resolve_output(str(path.parent / "x.db3"), "mcap")


def test_player_skips_unknown_type_and_undecodable_messages_and_counts_stamps_stepping_back(tmp_path,
                                                                                           ros_context):
    path = tmp_path / "mixed"
    widget_def = "string name\nfloat64 size\n"
    with BagWriter(path) as bag:
        bag.add_topic("/odom", "nav_msgs/msg/Odometry")
        bag.add_topic("/chatter", "std_msgs/msg/String")
        # A type from a package nobody has installed here: the bag embeds its definition.
        bag.add_topic("/widget", "acme_msgs/msg/Widget", type_hash="RIHS01_" + "1" * 64, definition=widget_def)
        for i in range(10):
            t = T0 + i * 10**7
            # Header stamps step back twice (at i = 4 and i = 7): a clock jump on the vehicle.
            stamp_index = i - 3 if i in (4, 7) else i
            bag.write("/odom", t, _odometry(stamp_index))
            bag.write("/chatter", t, bytes(serialize_message(String(data=f"m{i}"))))
            bag.write("/widget", t, b"\x00\x01\x00\x00" + b"\x00" * 16)
        bag.write("/chatter", T0 + 10**8, b"\x00\x01\x00\x00\xff\xff\xff\x7f")  # string length 2^31: garbage
    node = Node("bag_player_test", context=ros_context)
    try:
        with BagReader(path) as reader:
            player = Player(node, reader, MessageTypes(), rate=50.0)
            assert set(player.prepare()) == {"/odom", "/chatter"}
            report = player.play(progress=False)
    finally:
        node.destroy_node()
    assert "acme_msgs/msg/Widget is not installed here (its definition is in the bag)" in report.skipped_topics["/widget"]
    assert report.published == {"/odom": 10, "/chatter": 10}
    assert report.undecodable == {"/chatter": 1}
    assert report.header_steps_back == {"/odom": 2}
    text = "\n".join(report.lines())
    assert "skipped topic /widget" in text and "skipped 1 undecodable messages on /chatter" in text


def test_start_offset_still_delivers_the_latched_map_first(tmp_path, ros_context):
    """--start skips the first seconds but not the transient-local map published at the beginning."""
    from luna_bags.qos import to_bag_qos
    from luna_msgs_py import qos as Q

    path = tmp_path / "latched"
    with BagWriter(path) as bag:
        bag.add_topic("/map/lane_graph", "luna_msgs/msg/LaneGraph", [to_bag_qos(Q.LATCHED)])
        bag.add_topic("/odom", "nav_msgs/msg/Odometry")
        bag.write("/map/lane_graph", T0, bytes(serialize_message(C.lane_graph_to_msg(samples.lane_graph()))))
        for i in range(20):
            bag.write("/odom", T0 + i * 10**8, _odometry(i))
    node = Node("bag_player_start_test", context=ros_context)
    try:
        with BagReader(path) as reader:
            player = Player(node, reader, rate=20.0, start_offset=1.0)
            player.prepare()
            report = player.play(progress=False)
    finally:
        node.destroy_node()
    assert report.published == {"/map/lane_graph": 1, "/odom": 10}
    assert np.isclose(player.start_ns, T0 + 10**9)


def test_loop_plays_the_bag_again_until_stopped(tmp_path, ros_context):
    import threading

    from tests.ros.helpers import wait_for

    path = tmp_path / "loop"
    with BagWriter(path) as bag:
        bag.add_topic("/odom", "nav_msgs/msg/Odometry")
        for i in range(5):
            bag.write("/odom", T0 + i * 10**8, _odometry(i))
    node = Node("bag_loop_test", context=ros_context)
    stop = threading.Event()
    try:
        with BagReader(path) as reader:
            player = Player(node, reader, rate=20.0, loop=True)
            player.prepare()
            worker = threading.Thread(target=player.play, kwargs={"stop": stop, "progress": False})
            worker.start()
            wait_for(lambda: player.report.loops >= 3, 30.0, "three loops")
            stop.set()
            worker.join(timeout=10)
    finally:
        stop.set()
        node.destroy_node()
    assert not worker.is_alive()
    assert player.report.published["/odom"] >= 3 * 5
    assert player.report.clock_source == "generate"


class _RecordingHold:
    """A Hold that records, at each instant, what the player had published (and sleeps a little)."""

    period_ns = 5 * 10**8  # 0.5 s

    def __init__(self, player_box: list) -> None:
        self.player_box = player_box
        self.seen: list[tuple[int, int, int]] = []  # (instant, /odom published, last clock)

    def wait(self, instant_ns, stop) -> None:
        player = self.player_box[0]
        self.seen.append((instant_ns, player.report.published["/odom"], player._last_clock))
        stop.wait(0.3)


@pytest.mark.parametrize("with_clock", [False, True], ids=["generated-clock", "bag-clock"])
def test_hold_stops_bag_time_at_each_instant_after_everything_up_to_it(tmp_path, ros_context, with_clock):
    """luna replay's lock step: the player holds at every multiple of the period, with every message up
    to the instant and a /clock tick at it out, and shifts the rest of the schedule by the hold."""
    import time

    from rosgraph_msgs.msg import Clock

    path = tmp_path / "hold"
    with BagWriter(path) as bag:
        bag.add_topic("/odom", "nav_msgs/msg/Odometry")
        if with_clock:
            bag.add_topic("/clock", "rosgraph_msgs/msg/Clock")
        for i in range(16):  # 0 .. 1.5 s at 0.1 s
            t = T0 + i * 10**8
            if with_clock and i % 3 == 0:  # a coarse bag clock: no tick at 0.5 s
                bag.write("/clock", t, bytes(serialize_message(Clock(clock=_time_msg(t)))))
            bag.write("/odom", t, _odometry(i))
    node = Node("bag_hold_test", context=ros_context)
    box: list = []
    hold = _RecordingHold(box)
    try:
        with BagReader(path) as reader:
            player = Player(node, reader, rate=4.0, hold=hold)
            box.append(player)
            player.prepare()
            started = time.monotonic()
            player.play(progress=False)
            took = time.monotonic() - started
    finally:
        node.destroy_node()
    # Instants 0, 0.5, 1.0 s (1.5 s is the last message: nothing after it to hold back).
    assert [(t - T0) / 1e9 for t, _, _ in hold.seen] == [0.0, 0.5, 1.0]
    assert [n for _, n, _ in hold.seen] == [1, 6, 11], "every message up to the instant, none after it"
    assert [c for _, _, c in hold.seen] == [t for t, _, _ in hold.seen], "a /clock tick at each instant"
    assert took >= 1.5 / 4.0 + 3 * 0.3, "the schedule after a hold is shifted by the hold"


def test_generated_clock_never_runs_past_the_next_message_when_reading_the_time_is_late(
        tmp_path, ros_context, monkeypatch):
    """Under load the player reads the time again for a /clock tick, later than when it decided to tick:
    the tick must still not pass the next message's stamp (nor, in lock step, a hold's instant; a fresh
    clone's make test once saw 0.506 s at the 0.5 s hold). A monotonic clock that jumps 30 ms at every
    read makes that lateness certain."""
    import luna_bags.play as play

    path = tmp_path / "late"
    with BagWriter(path) as bag:
        bag.add_topic("/odom", "nav_msgs/msg/Odometry")
        for i in range(8):
            bag.write("/odom", T0 + i * 10**8, _odometry(i))
    fake = {"t": 1000.0}

    def late_monotonic() -> float:
        fake["t"] += 0.03
        return fake["t"]

    monkeypatch.setattr(play.time, "monotonic", late_monotonic)
    node = Node("bag_late_clock_test", context=ros_context)
    events: list[tuple[str, int]] = []
    try:
        with BagReader(path) as reader:
            player = Player(node, reader, rate=1.0)
            tick, publish = player._tick, player._publish
            player._tick = lambda ns: (events.append(("tick", ns)), tick(ns))[-1]
            player._publish = lambda msg: (events.append(("msg", msg.timestamp)), publish(msg))[-1]
            player.prepare()
            player.play(progress=False)
    finally:
        node.destroy_node()
    assert player.report.clock_source == "generate" and player.report.published["/odom"] == 8
    ticks = [(i, ns) for i, (kind, ns) in enumerate(events) if kind == "tick"]
    assert len(ticks) > 8, "the clock also ticked between messages"
    for i, ns in ticks:
        following = next((t for kind, t in events[i + 1:] if kind == "msg"), None)
        assert following is None or ns <= following, f"a /clock tick at {ns} before the message at {following}"
