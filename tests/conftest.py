import pytest


@pytest.fixture
def ros_context():
    """An initialised rclpy context in this test process's private ROS domain."""
    import rclpy

    from tests.ros.helpers import apply_ros_env

    apply_ros_env()
    context = rclpy.Context()
    rclpy.init(context=context)
    yield context
    context.try_shutdown()
