"""Field data: record and play rosbag2 bags (MCAP or sqlite3) without rosbag2_py, replay a bag through the
stack with a report, and turn bridge scenarios into bags. Commands: ``luna bag ...`` and ``luna replay``
(see ``cli.register``); docs/bags.md describes them."""
