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


def pytest_collection_modifyitems(config, items):
    """Files holding a test marked ``slow`` run first, in their collected order: the two xdist workers
    of ``make test`` take whole files in this order, so the long ones start early and neither worker is
    left alone with one at the end."""
    slow_files = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_files)
