"""LUNA-AD core algorithms: pure Python, no rclpy and no message types."""

__version__ = "0.1.0"
