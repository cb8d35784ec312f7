# LUNA-AD on a full ROS 2 kilted install: the workspace built with colcon, `ros2 launch` available.
# Not built on the development machines (no Docker engine there); the pip-only path is what CI runs.
#   docker build -t luna-ad .
#   docker run --rm -it luna-ad ros2 launch luna_bringup luna.launch.py
#   docker run --rm -it luna-ad ros2 run luna_bringup luna demo      # the main job
#   docker run --rm -it luna-ad python3 -m pytest tests               # the test suite
FROM ros:kilted-ros-base

RUN apt-get update && apt-get install -y --no-install-recommends \
        python3-pip python3-venv python3-colcon-common-extensions ros-kilted-diagnostic-msgs \
        ros-kilted-visualization-msgs ros-kilted-nav-msgs && \
    rm -rf /var/lib/apt/lists/*

WORKDIR /opt/luna
COPY requirements/ requirements/
# The Python dependencies that ROS does not provide (torch CPU build; use a CUDA base image and the
# matching torch on a vehicle). ROS packages come from apt, so the ros-kilted-* wheels are skipped.
RUN grep -v -E '^(ros-|rosbags|catkin)' requirements/lock.txt > /tmp/req.txt && \
    pip3 install --break-system-packages --no-cache-dir \
        --extra-index-url https://download.pytorch.org/whl/cpu -r /tmp/req.txt && \
    pip3 install --break-system-packages --no-cache-dir --no-deps -r requirements/no-deps.txt && \
    pip3 install --break-system-packages --no-cache-dir rosbags==0.11.9

COPY . .
RUN . /opt/ros/kilted/setup.sh && \
    colcon build --base-paths ros_ws/src --metas colcon.meta && \
    . install/setup.sh && \
    pip3 install --break-system-packages --no-deps -e offline -e bridge && \
    python3 -m luna_core.model_cache prepare

RUN echo 'source /opt/ros/kilted/setup.bash && source /opt/luna/install/setup.bash' >> /root/.bashrc
ENTRYPOINT ["/bin/bash", "-c", "source /opt/ros/kilted/setup.bash && source /opt/luna/install/setup.bash && exec \"$@\"", "--"]
CMD ["ros2", "launch", "luna_bringup", "luna.launch.py"]
