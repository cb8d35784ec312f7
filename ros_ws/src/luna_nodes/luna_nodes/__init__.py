"""Thin rclpy nodes of the LUNA-AD stack."""
