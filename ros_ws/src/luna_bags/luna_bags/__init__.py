"""Field data: record and play rosbag2 bags (MCAP or sqlite3) without rosbag2_py, read damaged ones, write
the replay report, and turn bridge scenarios into bags. Commands: ``luna bag ...`` (``cli.register``; the
``luna`` command of luna_bringup adds them, and ``luna replay``, which runs the stack, from
``luna_bringup.replay``); docs/bags.md describes them. Imports luna_core, luna_msgs_py and, for
``from-scenario`` only, the bridge's scenario modules (never the simulator or the nodes)."""
